//! One connection, on the core it was placed on: the handshake, then the transmission phase.
//! The reader loop parses requests; each takes one buffer from the server's pool (the global
//! bound on payload memory), a write's payload is received straight into it, and the request
//! then runs in the reader as far as it can without waiting, and as a task of its own on this
//! core (`spawn_local`) if it must wait, so many are in flight at once and replies leave in
//! completion order. What one connection and one client may hold is
//! bounded (requests in flight, payload bytes), and a payload or a reply that stalls is timed
//! out, which closes the connection and gives its buffers back.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;

use millrace_io::share::charge;
use millrace_io::{BufPool, IoBuf, Share};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{watch, Mutex, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use crate::datapath::client_key;
use crate::handshake::{negotiate, Session};
use crate::proto::*;
use crate::request::{check, flush, run, send_error, Shared, BATCH_MAX};
use crate::{Admitted, Counters, Inner, Peer};

/// Releases the connection's place in the open-connection counts when it ends, however it ends.
struct OpenGuard<'a>(&'a Counters);
impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection; `only` is the one export its listener serves (an export's own
/// socket or port), None for the shared listeners that serve every export.
pub(crate) async fn serve<R, W>(
    inner: Arc<Inner>,
    pool: BufPool,
    r: R,
    mut w: W,
    admitted: Admitted,
    peer: Peer,
    only: Option<Arc<str>>,
) where
    R: AsyncRead + Unpin + 'static,
    W: AsyncWrite + Unpin + 'static,
{
    // The connection's place in the server's counts and limits, until it ends.
    let _admitted = admitted;
    // Buffered so that small headers (and 4K payloads) cost no syscall each; a payload larger
    // than this goes from the socket straight into its pool buffer once the buffered bytes
    // are taken.
    let mut r = BufReader::with_capacity(64 << 10, r);
    let limit = inner.limits.handshake_timeout;
    let max_payload = (pool.max_buf() as u64).min(MAX_PAYLOAD as u64) as u32;
    let haggle = negotiate(&inner, &mut r, &mut w, &peer, only.as_deref(), max_payload);
    let session = match tokio::time::timeout(limit, haggle).await {
        Err(_) => {
            info!(
                "NBD: closing the connection from {peer}: it did not choose an export within {} s",
                limit.as_secs()
            );
            return;
        }
        Ok(Err(e)) => {
            // Hanging up during the greeting is what port scanners and health checks do.
            if e.kind() == io::ErrorKind::UnexpectedEof {
                debug!("NBD: {peer} hung up during negotiation");
            } else {
                warn!("NBD: closing the connection from {peer} during negotiation: {e}");
            }
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Ok(Some(s))) => s,
    };
    let ec = &session.entry.counters;
    Counters::add(&ec.connections_open, 1);
    Counters::add(&ec.connections_total, 1);
    let _export_open = OpenGuard(ec);
    let _client = session.entry.connect(&peer);
    info!(
        export = %session.entry.export.name,
        structured = session.structured,
        "NBD: {peer} connected"
    );
    let sh = Rc::new(Shared {
        w: Mutex::new(w),
        inner: inner.clone(),
        entry: session.entry.clone(),
        structured: session.structured,
        broken: watch::channel(false).0,
        timeout: inner.limits.payload_timeout,
        peer,
        batch: RefCell::new(Vec::new()),
        corked: Cell::new(false),
    });
    transmit(r, &sh, &session, &pool, max_payload).await;
    info!(export = %session.entry.export.name, "NBD: {peer} disconnected");
}

/// What one request holds until it is answered: its place among the connection's requests in
/// flight, and its bytes of the connection's and the client's shares of the pool.
struct Held {
    _slot: OwnedSemaphorePermit,
    _conn: OwnedSemaphorePermit,
    _client: OwnedSemaphorePermit,
}

/// The connection's bounds: requests in flight, and payload bytes for it and for its client.
struct Bounds {
    slots: Arc<Semaphore>,
    max_slots: u32,
    conn: Arc<Semaphore>,
    client: Share,
}

impl Bounds {
    fn new(inner: &Inner, peer: &Peer, pool: &BufPool, max_payload: u32) -> Bounds {
        let l = &inner.limits;
        let max = charge(max_payload as usize) as usize;
        let quarter = pool.usage().capacity_bytes as usize / 4;
        let client = l.max_client_bytes.unwrap_or(quarter).max(max);
        let max_slots = l
            .max_in_flight
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Bounds {
            slots: Arc::new(Semaphore::new(max_slots)),
            max_slots: max_slots as u32,
            conn: Arc::new(Semaphore::new(l.max_in_flight_bytes.max(max))),
            client: inner.shares.of(client_key(peer), client),
        }
    }

    /// Waits for room for one more request of `bytes` payload bytes. The shares are taken
    /// before the pool's buffer, so a client over its share waits on its own semaphore, not in
    /// the pool's line ahead of other clients.
    async fn hold(&self, bytes: u32) -> Held {
        let closed = "the connection's semaphores are never closed";
        let slot = self.slots.clone().acquire_owned().await.expect(closed);
        let conn = self
            .conn
            .clone()
            .acquire_many_owned(bytes)
            .await
            .expect(closed);
        let client = self.client.take_bytes(bytes).await;
        Held {
            _slot: slot,
            _conn: conn,
            _client: client,
        }
    }
}

/// Why the reader loop stopped.
enum Stop {
    /// Finish what is in flight, then close.
    Drain,
}

async fn transmit<R, W>(
    mut r: BufReader<R>,
    sh: &Rc<Shared<W>>,
    s: &Session,
    pool: &BufPool,
    max_payload: u32,
) where
    R: AsyncRead + Unpin + 'static,
    W: AsyncWrite + Unpin + 'static,
{
    let inner = &sh.inner;
    let bounds = Bounds::new(inner, &sh.peer, pool, max_payload);
    let mut removed = s.entry.removed.subscribe();
    let mut stop = inner.shutdown.subscribe();
    let mut broken = sh.broken.subscribe();
    let dev = s.entry.export.dev.clone();
    let name = &s.entry.export.name;
    let peer = sh.peer;

    loop {
        // Batched replies leave before the reader waits for the client, which may be waiting
        // for them.
        if r.buffer().len() < REQUEST_LEN && flush(sh).await.is_err() {
            break;
        }
        let mut hb = [0u8; REQUEST_LEN];
        // Reading a header is not cancel-safe, but every other branch ends the connection.
        let got = tokio::select! {
            biased;
            _ = crate::raised(&mut removed) => {
                info!(export = %name, "NBD: closing the connection from {peer}: the export was removed");
                break;
            }
            _ = crate::raised(&mut stop) => {
                info!("NBD: closing the connection from {peer}: the server is shutting down");
                break;
            }
            _ = crate::raised(&mut broken) => break,
            g = r.read_exact(&mut hb) => g,
        };
        if let Err(e) = got {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                debug!("NBD: {peer} closed the connection without NBD_CMD_DISC");
            } else {
                info!("NBD: reading from {peer} failed: {e}");
            }
            break;
        }
        let req = match parse_request(&hb) {
            Ok(q) => q,
            Err(magic) => {
                // Nothing after a bad header can be trusted to be a header: hang up.
                warn!(
                    "NBD: closing the connection from {peer}: a request starts with {magic:#010x}, not the request magic"
                );
                break;
            }
        };
        if req.kind == CMD_DISC {
            debug!("NBD: {peer} sent NBD_CMD_DISC");
            break;
        }
        match next(&mut r, sh, s, &req, &bounds, pool, max_payload).await {
            Ok(None) => continue,
            Ok(Some((held, buf))) => {
                let (shared, dev) = (sh.clone(), dev.clone());
                let mut task = Box::pin(async move {
                    run(&shared, dev.as_ref(), req, buf).await;
                    // Its reply could not go (the client hung up, or a reply before it
                    // failed): the request is counted as abandoned.
                    if *shared.broken.borrow() {
                        Counters::add(&shared.inner.counters.abandoned, 1);
                    }
                    drop(held);
                });
                // Its first step runs here: on members in memory most requests end in it, and a
                // task each cost a scheduling round per request. One that must wait goes on in a
                // task of this core, which its device completion or the socket wakes (a waker it
                // left for this reader is replaced at the task's first poll).
                sh.corked.set(true);
                let first = std::future::poll_fn(|cx| Poll::Ready(task.as_mut().poll(cx))).await;
                sh.corked.set(false);
                if first.is_pending() {
                    tokio::task::spawn_local(task);
                }
                if sh.batch.borrow().len() >= BATCH_MAX && flush(sh).await.is_err() {
                    break;
                }
            }
            Err(Stop::Drain) => break,
        }
    }
    // The protocol asks us to finish what is in flight before closing.
    let _ = flush(sh).await;

    let _all = bounds.slots.acquire_many(bounds.max_slots).await;
    let _ = sh.w.lock().await.shutdown().await;
}

/// Takes one parsed request as far as it can be run: refused ones are answered here (their
/// payload skipped); a runnable one gets its bounds and its pool buffer, and a write's payload
/// is received into that buffer within the payload timeout.
async fn next<R, W>(
    r: &mut BufReader<R>,
    sh: &Shared<W>,
    s: &Session,
    req: &Request,
    bounds: &Bounds,
    pool: &BufPool,
    max_payload: u32,
) -> Result<Option<(Held, Option<IoBuf>)>, Stop>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (inner, peer) = (&sh.inner, sh.peer);
    let payload = if req.kind == CMD_WRITE { req.len } else { 0 };
    if let Some((errno, msg)) = check(req, s.entry.export.dev.as_ref(), s, max_payload) {
        // The payload must be consumed to find the next header; skipping it holds no memory.
        if payload > 0 {
            let mut take = (&mut *r).take(payload as u64);
            match tokio::io::copy(&mut take, &mut tokio::io::sink()).await {
                Ok(n) if n == payload as u64 => {}
                _ => return Err(Stop::Drain),
            }
        }
        Counters::add(&inner.counters.ops, 1);
        Counters::add(&inner.counters.errors, 1);
        Counters::add(&s.entry.counters.ops, 1);
        Counters::add(&s.entry.counters.errors, 1);
        debug!("NBD: refused request {req:?} from {peer}: {msg}");
        if send_error(sh, req, errno, &msg).await.is_err() {
            return Err(Stop::Drain);
        }
        return Ok(None);
    }
    let data = matches!(req.kind, CMD_READ | CMD_WRITE);
    let held = bounds
        .hold(if data { charge(req.len as usize) } else { 0 })
        .await;
    if !data {
        return Ok(Some((held, None)));
    }
    let mut buf = match pool.get(req.len as usize).await {
        Ok(b) => b,
        Err(e) => {
            // Checked against the pool's largest buffer above; a sentence all the same.
            let _ = send_error(sh, req, EINVAL, &e.to_string()).await;
            return Ok(None);
        }
    };
    if payload > 0 {
        if r.buffer().len() < payload as usize && flush(sh).await.is_err() {
            return Err(Stop::Drain);
        }
        let limit = sh.timeout;
        match tokio::time::timeout(limit, r.read_exact(&mut buf[..])).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                info!("NBD: {peer} closed the connection inside a write's data: {e}");
                return Err(Stop::Drain);
            }
            Err(_) => {
                warn!(
                    "NBD: closing the connection from {peer}: the {payload}-byte payload of a write did not arrive within {} s",
                    limit.as_secs_f64()
                );
                return Err(Stop::Drain);
            }
        }
    }
    Ok(Some((held, Some(buf))))
}
