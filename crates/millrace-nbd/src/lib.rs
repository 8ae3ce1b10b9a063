//! Millrace's NBD server: exports volumes (anything that implements
//! [`millrace_block::BlockDevice`]) to the Linux kernel client (`nbd-client`), libnbd tools
//! (`nbdinfo`, `nbdcopy`, `nbdsh`), qemu and fio, over TCP and Unix sockets.
//!
//! It speaks fixed newstyle negotiation (NBD_OPT_GO, INFO, LIST, EXPORT_NAME, ABORT,
//! STRUCTURED_REPLY; anything else is answered NBD_REP_ERR_UNSUP) and serves READ, WRITE, FLUSH,
//! TRIM, WRITE_ZEROES and CACHE with FUA. Requests on one connection run concurrently and may
//! complete out of order, with a bounded number and a bounded number of bytes in flight.
//! Several connections to one export are safe (NBD_FLAG_CAN_MULTI_CONN): FLUSH and FUA call
//! [`BlockDevice::flush`], which makes every completed write on the device durable, whichever
//! connection it came from.
//!
//! Access: a Unix socket reaches every export (its file permissions are the gate); a TCP client
//! reaches only the exports whose `allowed` list holds its address, and a TCP client that no
//! export allows is closed at once, with a log line, before a byte is exchanged.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use millrace_block::MemBlockDevice;
//! use millrace_nbd::{Export, NbdServer};
//! let server = NbdServer::new();
//! server
//!     .add_export(Export {
//!         name: "vol0".into(),
//!         description: "a RAM disk".into(),
//!         dev: Arc::new(MemBlockDevice::new(64 << 20)),
//!         read_only: false,
//!         allowed: vec!["127.0.0.0/8".parse().unwrap()],
//!     })
//!     .unwrap();
//! let l = tokio::net::TcpListener::bind("127.0.0.1:10809").await?;
//! server.serve_tcp(l).await
//! # }
//! ```

mod conn;
mod datapath;
mod error;
mod handshake;
pub mod meta;
pub mod proto;
mod request;

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use millrace_block::BlockDevice;
use millrace_io::admission::{AcceptBackoff, Admission, Place, RateLimit};
use millrace_io::{BufPool, CoreTask, Cores, PoolUsage};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tracing::{info, warn};

pub use datapath::DataPath;
pub use error::Error;
pub use ipnet::IpNet;

/// One export: a named block device and who may reach it.
#[derive(Clone)]
pub struct Export {
    /// The name clients ask for (`nbd://host/NAME`, `nbd-client -N NAME`).
    pub name: String,
    /// Shown to clients that ask (NBD_INFO_DESCRIPTION); may be empty.
    pub description: String,
    pub dev: Arc<dyn BlockDevice>,
    /// Refuse writes, trims and zeroing with EPERM, and say so in the transmission flags.
    pub read_only: bool,
    /// TCP clients allowed to use this export, as addresses or networks. Empty: only clients
    /// on the Unix socket.
    pub allowed: Vec<IpNet>,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("size_bytes", &self.dev.size_bytes())
            .field("read_only", &self.read_only)
            .field("allowed", &self.allowed)
            .finish()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Limits that keep one client from exhausting the server. The defaults suit a data server;
/// tests shrink them.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once, over all listeners; more are closed at once with a log line.
    pub max_connections: usize,
    /// Connections open at once from one TCP address (local-socket clients count only in the
    /// total), so one client cannot take every place.
    pub max_connections_per_address: usize,
    /// Requests being served at once on one connection.
    pub max_in_flight: usize,
    /// Payload bytes (read buffers and write data) held at once for one connection. Never
    /// less than the largest request, so that one maximal request always fits.
    pub max_in_flight_bytes: usize,
    /// Payload bytes held at once by one client: all connections from one TCP address, or all
    /// local-socket clients of one user (uid). None: a quarter of the buffer pool. Never less
    /// than the largest request. The pool itself bounds all clients together.
    pub max_client_bytes: Option<usize>,
    /// Time a client has to finish option haggling.
    pub handshake_timeout: Duration,
    /// Time a write's payload has to arrive once the server has given it a buffer, and a
    /// reply has to be taken by the client; past it the connection is closed and its buffers
    /// go back to the pool (a stalled client holds no memory longer than this).
    pub payload_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_address: 256,
            max_in_flight: 64,
            max_in_flight_bytes: 128 << 20,
            max_client_bytes: None,
            handshake_timeout: Duration::from_secs(60),
            payload_timeout: Duration::from_secs(30),
        }
    }
}

/// Counters, server-wide or for one export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections open now (for an export: in transmission on it).
    pub connections_open: u64,
    /// Connections accepted since start (for an export: that reached transmission on it).
    pub connections_total: u64,
    /// TCP connections closed at once because no export allows the client, or over the limit,
    /// plus negotiations refused for policy (an export the client may not use).
    pub connections_refused: u64,
    /// Requests served (all commands), and those of them that failed.
    pub ops: u64,
    pub errors: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests whose reply could not be sent (their client hung up, or its connection failed
    /// first): they finished on the volume and their buffers came back.
    pub abandoned: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub ops: AtomicU64,
    pub errors: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub zeroes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub abandoned: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    fn snapshot(&self) -> Stats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            connections_open: g(&self.connections_open),
            connections_total: g(&self.connections_total),
            connections_refused: g(&self.connections_refused),
            ops: g(&self.ops),
            errors: g(&self.errors),
            reads: g(&self.reads),
            writes: g(&self.writes),
            flushes: g(&self.flushes),
            trims: g(&self.trims),
            zeroes: g(&self.zeroes),
            bytes_read: g(&self.bytes_read),
            bytes_written: g(&self.bytes_written),
            abandoned: g(&self.abandoned),
        }
    }
}

/// An export as the server holds it: the export, a signal raised when it is removed (its
/// connections then finish what is in flight and close), and its counters.
pub(crate) struct ExportEntry {
    pub export: Export,
    pub removed: watch::Sender<bool>,
    pub counters: Counters,
    /// The clients in transmission on it now: (connection number, who).
    pub clients: std::sync::Mutex<Vec<(u64, String)>>,
}

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

/// Takes a client off its export's list when its connection ends, however it ends.
pub(crate) struct ClientGuard<'a> {
    entry: &'a ExportEntry,
    id: u64,
}

impl Drop for ClientGuard<'_> {
    fn drop(&mut self) {
        let mut c = self.entry.clients.lock().unwrap_or_else(|e| e.into_inner());
        c.retain(|(id, _)| *id != self.id);
    }
}

impl ExportEntry {
    /// Puts a client on the export's list for as long as the guard lives.
    pub fn connect(&self, peer: &Peer) -> ClientGuard<'_> {
        let id = NEXT_CLIENT.fetch_add(1, Ordering::Relaxed);
        let who = match peer {
            Peer::Unix(_) => "local socket".to_string(),
            Peer::Tcp(a) => a.to_string(),
        };
        let mut c = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        c.push((id, who));
        ClientGuard { entry: self, id }
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// A local-socket client, with its uid where the socket says it.
    Unix(Option<u32>),
    Tcp(std::net::SocketAddr),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Unix(Some(uid)) => write!(f, "a unix-socket client (uid {uid})"),
            Peer::Unix(None) => write!(f, "a unix-socket client"),
            Peer::Tcp(a) => write!(f, "{a}"),
        }
    }
}

impl Peer {
    /// Whether this peer may use `e`: anyone on the Unix socket, a TCP client only if its
    /// address is in the export's list.
    pub fn may_use(&self, e: &Export) -> bool {
        match self {
            Peer::Unix(_) => true,
            Peer::Tcp(a) => {
                // A dual-stack listener reports IPv4 clients as ::ffff:a.b.c.d; compare the
                // address the admin would write.
                let ip: IpAddr = a.ip().to_canonical();
                e.allowed.iter().any(|n| n.contains(&ip))
            }
        }
    }
}

/// A connection's place under the server's limits (in all and per TCP address), held by the
/// connection until it ends, however it ends. The server-wide open count is read from the
/// admission itself, so it cannot drift from the places actually held.
pub(crate) type Admitted = Place<IpAddr>;

/// Gives back the place `admit` counted for a connection that could not start, and says why.
fn release(admitted: Admitted, peer: &Peer, why: impl std::fmt::Display) {
    warn!("NBD: dropping the connection from {peer}: {why}");
    drop(admitted);
}

/// Resolves once a flag is raised (or its sender is gone, which also means "stop"). Wrapped so
/// that the watch guard never lives in a future that must be Send.
pub(crate) async fn raised(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

pub(crate) struct Inner {
    pub exports: RwLock<HashMap<String, Arc<ExportEntry>>>,
    pub counters: Counters,
    pub shutdown: watch::Sender<bool>,
    pub limits: Limits,
    /// Each client's share of the buffer pool.
    pub shares: millrace_io::Shares<crate::datapath::ClientKey>,
    /// Connections open, in all and per TCP address.
    pub admission: Admission<IpAddr>,
    /// Refused connections and failed accepts are logged at most once a second each.
    pub refusal_log: RateLimit,
    pub accept_log: RateLimit,
}

impl Inner {
    /// The exports this peer may see, by name.
    pub fn visible(&self, peer: &Peer) -> Vec<Arc<ExportEntry>> {
        let mut v: Vec<_> = self
            .exports
            .read()
            .unwrap()
            .values()
            .filter(|e| peer.may_use(&e.export))
            .cloned()
            .collect();
        v.sort_by(|a, b| a.export.name.cmp(&b.export.name));
        v
    }
}

/// The NBD server. Cheap to clone: clones share exports, connections and counters.
#[derive(Clone)]
pub struct NbdServer {
    inner: Arc<Inner>,
    /// Where connections run. Held here, never by a connection: the cores must not be dropped
    /// (and joined) from one of their own threads.
    data: Arc<Mutex<Option<DataPath>>>,
}

impl Default for NbdServer {
    fn default() -> Self {
        Self::new()
    }
}

impl NbdServer {
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    /// A server with these limits; its connections run on one core of its own with a small
    /// pool, made when the first client connects, unless [`NbdServer::set_data_path`] gives it
    /// the process's cores and pool first.
    pub fn with_limits(mut limits: Limits) -> Self {
        limits.max_in_flight = limits.max_in_flight.max(1);
        let admission = Admission::new(limits.max_connections, limits.max_connections_per_address);
        Self {
            inner: Arc::new(Inner {
                exports: RwLock::new(HashMap::new()),
                counters: Counters::default(),
                shutdown: watch::channel(false).0,
                limits,
                shares: Default::default(),
                admission,
                refusal_log: RateLimit::default(),
                accept_log: RateLimit::default(),
            }),
            data: Default::default(),
        }
    }

    /// A server whose connections run on `cores`, their payloads in `pool`.
    pub fn with_data_path(limits: Limits, cores: Arc<Cores>, pool: BufPool) -> Self {
        let s = Self::with_limits(limits);
        *s.data.lock().unwrap_or_else(|e| e.into_inner()) = Some(DataPath { cores, pool });
        s
    }

    /// Gives the server the cores its connections run on and the pool their payloads use.
    /// Refused once it has made its own (a client already connected).
    pub fn set_data_path(&self, cores: Arc<Cores>, pool: BufPool) -> Result<()> {
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_some() {
            return Err(Error::DataPathSet);
        }
        *d = Some(DataPath { cores, pool });
        Ok(())
    }

    /// The pool's counters (None before the server has a pool).
    pub fn pool_usage(&self) -> Option<PoolUsage> {
        let d = self.data.lock().unwrap_or_else(|e| e.into_inner());
        d.as_ref().map(|d| d.pool.usage())
    }

    fn data_path(&self) -> io::Result<DataPath> {
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none() {
            *d = Some(DataPath::small()?);
        }
        Ok(d.clone().expect("just set"))
    }

    /// Runs one admitted connection on a core: `open` makes its halves there (registering the
    /// socket with that core's reactor). Its place in the open count is given back if it
    /// cannot start.
    fn spawn_conn<F, R, W>(
        &self,
        open: F,
        admitted: Admitted,
        peer: Peer,
        only: Option<Arc<str>>,
    ) -> Option<CoreTask<()>>
    where
        F: FnOnce() -> io::Result<(R, W)> + Send + 'static,
        R: AsyncRead + Unpin + 'static,
        W: AsyncWrite + Unpin + 'static,
    {
        let inner = self.inner.clone();
        let dp = match self.data_path() {
            Ok(d) => d,
            Err(e) => {
                release(
                    admitted,
                    &peer,
                    format_args!("the server has no cores to run it on: {e}"),
                );
                return None;
            }
        };
        let pool = dp.pool.clone();
        Some(dp.cores.spawn(move || async move {
            match open() {
                Ok((r, w)) => conn::serve(inner, pool, r, w, admitted, peer, only).await,
                Err(e) => release(admitted, &peer, e),
            }
        }))
    }

    /// Hands an admitted socket to a core, the step both accept loops share: `std` is the
    /// socket taken off this reactor (`into_std`), `open` registers it with the core's reactor
    /// there. A socket that could not be taken off gives its place back.
    fn to_core<S, R, W>(
        &self,
        std: io::Result<S>,
        open: fn(S) -> io::Result<(R, W)>,
        admitted: Admitted,
        peer: Peer,
        only: Option<Arc<str>>,
    ) where
        S: Send + 'static,
        R: AsyncRead + Unpin + 'static,
        W: AsyncWrite + Unpin + 'static,
    {
        match std {
            Ok(s) => {
                self.spawn_conn(move || open(s), admitted, peer, only);
            }
            Err(e) => release(admitted, &peer, e),
        }
    }

    /// Adds an export; new connections can use it at once.
    pub fn add_export(&self, e: Export) -> Result<()> {
        proto::parse_name(e.name.as_bytes()).map_err(|why| Error::BadName {
            name: e.name.clone(),
            why,
        })?;
        if e.name.is_empty() {
            return Err(Error::BadName {
                name: e.name,
                why: "it is empty (the empty name means \"the default export\" to clients)".into(),
            });
        }
        if e.description.len() > proto::MAX_STRING {
            return Err(Error::DescriptionTooLong(e.name));
        }
        let mut map = self.inner.exports.write().unwrap();
        if map.contains_key(&e.name) {
            return Err(Error::ExportExists(e.name));
        }
        info!(
            export = %e.name,
            size = e.dev.size_bytes(),
            read_only = e.read_only,
            allowed = ?e.allowed,
            "NBD export added"
        );
        map.insert(
            e.name.clone(),
            Arc::new(ExportEntry {
                export: e,
                removed: watch::channel(false).0,
                counters: Counters::default(),
                clients: std::sync::Mutex::new(Vec::new()),
            }),
        );
        Ok(())
    }

    /// Removes an export. New clients no longer see it; connections using it finish the
    /// requests in flight and are closed.
    pub fn remove_export(&self, name: &str) -> Result<()> {
        let entry = self
            .inner
            .exports
            .write()
            .unwrap()
            .remove(name)
            .ok_or_else(|| Error::NoSuchExport(name.to_string()))?;
        entry.removed.send_replace(true);
        info!(export = %name, "NBD export removed");
        Ok(())
    }

    /// The exports, sorted by name.
    pub fn exports(&self) -> Vec<Export> {
        self.inner
            .visible(&Peer::Unix(None))
            .into_iter()
            .map(|e| e.export.clone())
            .collect()
    }

    /// Server-wide counters.
    pub fn stats(&self) -> Stats {
        Stats {
            connections_open: self.inner.admission.open() as u64,
            ..self.inner.counters.snapshot()
        }
    }

    /// Counters of one export (reset if it is removed and added again).
    pub fn export_stats(&self, name: &str) -> Option<Stats> {
        let map = self.inner.exports.read().unwrap();
        map.get(name).map(|e| e.counters.snapshot())
    }

    /// Who is connected to an export now: each client's address, or "local socket", in the
    /// order they connected.
    pub fn export_clients(&self, name: &str) -> Option<Vec<String>> {
        let map = self.inner.exports.read().unwrap();
        map.get(name).map(|e| {
            let c = e.clients.lock().unwrap_or_else(|e| e.into_inner());
            c.iter().map(|(_, who)| who.clone()).collect()
        })
    }

    /// Stops the listeners and closes every connection after its requests in flight finish.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Serves NBD on a TCP listener until [`NbdServer::shutdown`]. Errors accepting one
    /// connection (out of file descriptors, say) are logged and do not stop the listener.
    pub async fn serve_tcp(&self, l: tokio::net::TcpListener) -> io::Result<()> {
        self.serve_tcp_scoped(l, None).await
    }

    /// Serves one export alone on a TCP listener of its own: NBD_OPT_LIST lists only it, and
    /// the empty name selects it.
    pub async fn serve_tcp_only(&self, l: tokio::net::TcpListener, export: &str) -> io::Result<()> {
        self.serve_tcp_scoped(l, Some(export.into())).await
    }

    async fn serve_tcp_scoped(
        &self,
        l: tokio::net::TcpListener,
        only: Option<Arc<str>>,
    ) -> io::Result<()> {
        let mut stop = self.inner.shutdown.subscribe();
        let mut backoff = AcceptBackoff::default();
        loop {
            let (stream, addr) = tokio::select! {
                _ = crate::raised(&mut stop) => return Ok(()),
                r = l.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        self.accept_failed("TCP", &e, backoff.wait()).await;
                        continue;
                    }
                },
            };
            backoff.reset();
            let peer = Peer::Tcp(addr);
            if !self
                .inner
                .exports
                .read()
                .unwrap()
                .values()
                .filter(|e| only.as_deref().is_none_or(|o| o == e.export.name))
                .any(|e| peer.may_use(&e.export))
            {
                Counters::add(&self.inner.counters.connections_refused, 1);
                if let Some(n) = self.inner.refusal_log.allow() {
                    warn!("NBD: refused a connection from {addr}: no export allows this address ({n} more refusals not logged)");
                }
                drop(stream);
                continue;
            }
            let Some(admitted) = self.admit(&peer) else {
                continue;
            };
            // Small replies (flush, write acks) must not wait for Nagle.
            let _ = stream.set_nodelay(true);
            let open = |s: std::net::TcpStream| -> io::Result<_> {
                s.set_nonblocking(true)?;
                Ok(tokio::net::TcpStream::from_std(s)?.into_split())
            };
            self.to_core(stream.into_std(), open, admitted, peer, only.clone());
        }
    }

    /// Serves NBD on a Unix-socket listener until [`NbdServer::shutdown`]; every export is
    /// reachable (the socket's file permissions decide who connects).
    pub async fn serve_unix(&self, l: tokio::net::UnixListener) -> io::Result<()> {
        self.serve_unix_scoped(l, None).await
    }

    /// Serves one export alone on a Unix socket of its own: NBD_OPT_LIST lists only it, and
    /// the empty name selects it.
    pub async fn serve_unix_only(
        &self,
        l: tokio::net::UnixListener,
        export: &str,
    ) -> io::Result<()> {
        self.serve_unix_scoped(l, Some(export.into())).await
    }

    async fn serve_unix_scoped(
        &self,
        l: tokio::net::UnixListener,
        only: Option<Arc<str>>,
    ) -> io::Result<()> {
        let mut stop = self.inner.shutdown.subscribe();
        let mut backoff = AcceptBackoff::default();
        loop {
            let stream = tokio::select! {
                _ = crate::raised(&mut stop) => return Ok(()),
                r = l.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        self.accept_failed("unix-socket", &e, backoff.wait()).await;
                        continue;
                    }
                },
            };
            backoff.reset();
            // Each local user has a share of the pool of its own, as each TCP address does.
            let peer = Peer::Unix(stream.peer_cred().ok().map(|c| c.uid()));
            let Some(admitted) = self.admit(&peer) else {
                continue;
            };
            let open = |s: std::os::unix::net::UnixStream| -> io::Result<_> {
                s.set_nonblocking(true)?;
                Ok(tokio::net::UnixStream::from_std(s)?.into_split())
            };
            self.to_core(stream.into_std(), open, admitted, peer, only.clone());
        }
    }

    /// Serves one already-connected stream from any transport (used by tests and the fuzz
    /// target, and by callers that accept connections themselves) on one of the server's
    /// cores, and returns when the connection ends. `tcp_peer` is the client's address for the
    /// access check, or None for a local (Unix-socket-like) client that may use every export.
    pub async fn serve_stream<S>(&self, s: S, tcp_peer: Option<std::net::SocketAddr>)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let peer = tcp_peer.map_or(Peer::Unix(None), Peer::Tcp);
        let Some(admitted) = self.admit(&peer) else {
            return;
        };
        if let Some(t) = self.spawn_conn(move || Ok(tokio::io::split(s)), admitted, peer, None) {
            let _ = t.await;
        }
    }

    /// A place for the connection under the limits (in all, and per TCP address), or None
    /// after counting and logging the refusal.
    fn admit(&self, peer: &Peer) -> Option<Admitted> {
        let client = match peer {
            Peer::Tcp(a) => Some(a.ip().to_canonical()),
            Peer::Unix(_) => None,
        };
        match self.inner.admission.take(client) {
            Ok(place) => {
                Counters::add(&self.inner.counters.connections_total, 1);
                Some(place)
            }
            Err(why) => {
                Counters::add(&self.inner.counters.connections_refused, 1);
                if let Some(n) = self.inner.refusal_log.allow() {
                    warn!("NBD: refused a connection from {peer}: {why} ({n} more refusals not logged)");
                }
                None
            }
        }
    }

    /// An accept failed (out of descriptors, say): log it (at most once a second) and wait
    /// before the next try; the connections already open go on being served.
    async fn accept_failed(&self, what: &str, e: &io::Error, wait: Duration) {
        if let Some(n) = self.inner.accept_log.allow() {
            warn!("NBD: accepting a {what} connection failed ({n} more not logged): {e}; retrying in {wait:?}");
        }
        tokio::time::sleep(wait).await;
    }
}
