//! Serving the API's HTTP. Our own accept loop over hyper rather than `axum::serve`, because
//! that one arms no header timer (hyper's needs a timer it is not given), bounds no number of
//! connections, and the TLS path (axum-server) gives neither either: a client that opens
//! thousands of connections and sends half a request on each (slowloris) would hold them all.
//! Here every connection must finish its request headers (and, on TLS, its handshake) within
//! `header_timeout`, an idle keep-alive connection is closed after the same time, a request's
//! body must arrive whole within `body_timeout` of its headers (hyper has no body timer at all,
//! and tower-http's resets at every frame, so a body dribbled a byte at a time would hold its
//! connection for ever), at most `max_connections` are served at once (the next ones wait in
//! the kernel's backlog), and an accept error (EMFILE, ENFILE, ENOBUFS) is logged and waited
//! out, never the end of the loop.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, SizeHint};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

/// What the API's HTTP server bounds, and whom it answers.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// A connection must send its request headers (and finish its TLS handshake) within this
    /// time of being accepted or of its previous response; otherwise it is closed.
    pub header_timeout: Duration,
    /// A request's body must arrive whole within this time of its headers; otherwise the
    /// request is refused (400) and its connection closed. It bounds raw data writes too, so
    /// it leaves room for the largest one (64 MiB) over a slow link.
    pub body_timeout: Duration,
    /// The most connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// In-flight requests get this long to finish at shutdown before their connections close.
    pub drain_timeout: Duration,
    /// Host names (or addresses) the API answers besides loopback and its own address, for
    /// the DNS-rebinding check of `Host` and `Origin`.
    pub allowed_hosts: Vec<String>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            drain_timeout: Duration::from_secs(10),
            allowed_hosts: Vec::new(),
        }
    }
}

/// Where connections come from: a TCP listener, or in tests one that fails on purpose.
pub trait Acceptor: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, SocketAddr)>> + Send;
}

impl Acceptor for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        tokio::net::TcpListener::accept(self).await
    }
}

/// Logs at most once a second, so a flood of refusals cannot flood the log.
struct RateLimited {
    last: Option<Instant>,
    skipped: u64,
}

impl RateLimited {
    fn new() -> Self {
        RateLimited {
            last: None,
            skipped: 0,
        }
    }
    /// Whether to log now; the count of messages skipped since the last one logged.
    fn due(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.skipped += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.skipped))
    }
}

/// Serves `app` on connections from `acceptor` until `stop` resolves, then stops accepting,
/// lets in-flight requests finish (at most `drain_timeout`) and returns.
pub async fn serve<A: Acceptor>(
    mut acceptor: A,
    app: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: HttpLimits,
    stop: impl Future<Output = ()>,
) {
    let body_timeout = limits.body_timeout;
    let app = app.layer(axum::middleware::map_request(
        move |req: axum::extract::Request| async move {
            req.map(|b| axum::body::Body::new(Deadline::new(b, body_timeout)))
        },
    ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let (mut full_log, mut error_log) = (RateLimited::new(), RateLimited::new());
    tokio::pin!(stop);
    loop {
        if permits.available_permits() == 0 {
            if let Some(skipped) = full_log.due() {
                tracing::warn!(
                    most = limits.max_connections,
                    skipped,
                    "the API serves as many connections as it takes; new ones wait until one closes"
                );
            }
        }
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut stop => break,
        };
        let io = tokio::select! {
            r = acceptor.accept() => r,
            _ = &mut stop => break,
        };
        let (io, peer) = match io {
            Ok(c) => c,
            Err(e) => {
                if let Some(skipped) = error_log.due() {
                    tracing::error!(skipped, "the API cannot accept a connection: {e}; retrying");
                }
                // Out of descriptors or memory: give closing connections time to free some
                // rather than spin; a connection that died in the backlog needs no wait.
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let (app, watcher, tls, limits) =
            (app.clone(), graceful.watcher(), tls.clone(), limits.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => connection(io, app, watcher, &limits).await,
                Some(tls) => {
                    match tokio::time::timeout(limits.header_timeout, tls.accept(io)).await {
                        Ok(Ok(io)) => connection(io, app, watcher, &limits).await,
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(acceptor);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "API requests still running after {:?}; their connections are closed",
            limits.drain_timeout
        );
    }
}

/// One HTTP/1.1 connection, with hyper's header timer armed.
async fn connection<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: I,
    app: axum::Router,
    watcher: hyper_util::server::graceful::Watcher,
    limits: &HttpLimits,
) {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = b.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("an API connection ended: {e}");
    }
}

/// A request body that must arrive whole by a deadline set when its headers did (see the
/// module's comment for why hyper's and tower-http's timers do not do). Past the deadline it
/// fails: the extractor reading it refuses the request, and hyper closes the connection
/// rather than wait for the rest.
struct Deadline<B> {
    inner: B,
    limit: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<B> Deadline<B> {
    fn new(inner: B, limit: Duration) -> Self {
        Deadline {
            inner,
            limit,
            sleep: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the request body did not arrive within {} s of its headers; send the whole body without pausing",
                this.limit.as_secs_f64()
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener that first fails as a process out of descriptors does.
    struct Failing {
        errors: usize,
        inner: tokio::net::TcpListener,
    }

    impl Acceptor for Failing {
        type Io = tokio::net::TcpStream;
        async fn accept(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
            if self.errors > 0 {
                self.errors -= 1;
                return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
            }
            self.inner.accept().await
        }
    }

    #[tokio::test]
    async fn accept_errors_do_not_end_the_loop() {
        let inner = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "served" }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            Failing { errors: 20, inner },
            app,
            None,
            HttpLimits::default(),
            async {
                let _ = stop_rx.await;
            },
        ));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut out))
            .await
            .expect("answered after the errors")
            .unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("served"),
            "{out}"
        );
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(15), server)
            .await
            .expect("the loop stops when told")
            .unwrap();
    }
}
