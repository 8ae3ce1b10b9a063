//! One connection: the handshake, then the transmission phase. A reader loop parses requests
//! and hands each to its own task; tasks run the blocking device call on tokio's blocking pool
//! and write their reply under a lock on the write half, so replies leave in completion order.
//! Two semaphores bound what one connection holds: requests in flight and payload bytes.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use millrace_block::BlockDevice;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{watch, Mutex, Semaphore};
use tracing::{debug, info, warn};

use crate::handshake::{negotiate, Session};
use crate::meta::*;
use crate::proto::*;
use crate::{Counters, ExportEntry, Inner, Peer};

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
    r: R,
    mut w: W,
    peer: Peer,
    only: Option<Arc<str>>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let _open = OpenGuard(&inner.counters);
    // Buffered so that small headers cost no syscall each; large write payloads bypass it.
    let mut r = BufReader::with_capacity(256 << 10, r);
    let limit = inner.limits.handshake_timeout;
    let haggle = negotiate(&inner, &mut r, &mut w, &peer, only.as_deref());
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
    transmit(&inner, r, w, &session, &peer).await;
    info!(export = %session.entry.export.name, "NBD: {peer} disconnected");
}

/// Everything a request task needs, shared by the connection's tasks.
struct Shared<W> {
    w: Mutex<W>,
    inner: Arc<Inner>,
    entry: Arc<ExportEntry>,
    structured: bool,
    /// Raised when a reply cannot be written: the client is gone, so stop reading requests.
    broken: watch::Sender<bool>,
}

async fn transmit<R, W>(inner: &Arc<Inner>, mut r: BufReader<R>, w: W, s: &Session, peer: &Peer)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let sh = Arc::new(Shared {
        w: Mutex::new(w),
        inner: inner.clone(),
        entry: s.entry.clone(),
        structured: s.structured,
        broken: watch::channel(false).0,
    });
    let max_slots = inner.limits.max_in_flight;
    let slots = Arc::new(Semaphore::new(max_slots));
    let budget = Arc::new(Semaphore::new(inner.limits.max_in_flight_bytes));
    let mut removed = s.entry.removed.subscribe();
    let mut stop = inner.shutdown.subscribe();
    let mut broken = sh.broken.subscribe();
    let dev = s.entry.export.dev.clone();
    let name = &s.entry.export.name;

    loop {
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
        let payload = if req.kind == CMD_WRITE { req.len } else { 0 };
        if let Some((errno, msg)) = check(&req, dev.as_ref(), s) {
            // The payload must be consumed to find the next header; skipping it holds no memory.
            if payload > 0 {
                let mut take = (&mut r).take(payload as u64);
                match tokio::io::copy(&mut take, &mut tokio::io::sink()).await {
                    Ok(n) if n == payload as u64 => {}
                    _ => break,
                }
            }
            Counters::add(&inner.counters.ops, 1);
            Counters::add(&inner.counters.errors, 1);
            Counters::add(&s.entry.counters.ops, 1);
            Counters::add(&s.entry.counters.errors, 1);
            debug!("NBD: refused request {req:?} from {peer}: {msg}");
            if send_error(&sh, &req, errno, &msg).await.is_err() {
                break;
            }
            continue;
        }
        // Hold a slot and the payload's bytes before allocating them.
        let bytes = match req.kind {
            CMD_READ | CMD_WRITE => req.len,
            _ => 0,
        };
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let held = budget
            .clone()
            .acquire_many_owned(bytes)
            .await
            .expect("never closed");
        let data = if payload > 0 {
            let mut v = vec![0u8; payload as usize];
            if let Err(e) = r.read_exact(&mut v).await {
                info!("NBD: {peer} closed the connection inside a write's data: {e}");
                break;
            }
            Some(v)
        } else {
            None
        };
        let sh = sh.clone();
        let dev = dev.clone();
        tokio::spawn(async move {
            run(&sh, dev, req, data).await;
            drop(held);
            drop(slot);
        });
    }
    // The protocol asks us to finish what is in flight before closing.
    let _all = slots.acquire_many(max_slots as u32).await;
    let _ = sh.w.lock().await.shutdown().await;
}

/// Refuses what must not reach the device: unknown commands and flags, oversized payloads,
/// ranges past the end, writes to a read-only export. Errors follow the protocol's advice.
fn check(req: &Request, dev: &dyn BlockDevice, s: &Session) -> Option<(u32, String)> {
    let (read_only, structured) = (s.entry.export.read_only, s.structured);
    let name = match req.kind {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_CACHE => "cache",
        CMD_WRITE_ZEROES => "write-zeroes",
        CMD_BLOCK_STATUS => "block-status",
        k => {
            return Some((
                EINVAL,
                format!("command {k} is not supported by this server"),
            ))
        }
    };
    let bad = req.flags & !allowed_flags(req.kind, structured);
    if bad != 0 {
        return Some((
            EINVAL,
            format!("flags {bad:#x} are not valid on a {name} request"),
        ));
    }
    if matches!(req.kind, CMD_READ | CMD_WRITE) && req.len > MAX_PAYLOAD {
        return Some((
            EINVAL,
            format!(
                "a {name} of {} bytes exceeds the maximum block size of {MAX_PAYLOAD} bytes",
                req.len
            ),
        ));
    }
    if read_only && matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) {
        return Some((
            EPERM,
            format!("the export is read-only; a {name} is refused"),
        ));
    }
    if req.kind == CMD_FLUSH {
        return None;
    }
    if req.kind == CMD_BLOCK_STATUS && !s.allocation {
        return Some((
            EINVAL,
            "block status needs the base:allocation context (NBD_OPT_SET_META_CONTEXT before NBD_OPT_GO)".into(),
        ));
    }
    if req.kind == CMD_BLOCK_STATUS && req.len == 0 {
        return Some((EINVAL, "a block-status request of 0 bytes".into()));
    }
    let size = dev.size_bytes();
    let fits = req
        .offset
        .checked_add(req.len as u64)
        .is_some_and(|end| end <= size);
    if !fits {
        // Reads and cache hints past the end are invalid; writes there find no space.
        let errno = if matches!(req.kind, CMD_READ | CMD_CACHE | CMD_BLOCK_STATUS) {
            EINVAL
        } else {
            ENOSPC
        };
        return Some((
            errno,
            format!(
                "a {name} of {} bytes at {} reaches past the end of the export ({size} bytes)",
                req.len, req.offset
            ),
        ));
    }
    None
}

/// Serves one checked request on the blocking pool and sends its reply.
async fn run<W: AsyncWrite + Unpin + Send + 'static>(
    sh: &Shared<W>,
    dev: Arc<dyn BlockDevice>,
    req: Request,
    data: Option<Vec<u8>>,
) {
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (off, len) = (req.offset, req.len as u64);
    let counters = [&sh.inner.counters, &sh.entry.counters];
    for c in counters {
        Counters::add(&c.ops, 1);
    }
    if req.kind == CMD_READ {
        // The reply header goes in front of the data so that the reply is one write.
        let hl = if sh.structured {
            STRUCTURED_HEADER_LEN + 8
        } else {
            SIMPLE_REPLY_LEN
        };
        let mut buf = vec![0u8; hl + len as usize];
        let res = blocking(move || {
            let r = dev.read_at(off, &mut buf[hl..]);
            r.map(|_| buf)
        })
        .await;
        match res {
            Ok(mut buf) => {
                if sh.structured {
                    if len == 0 {
                        buf = structured_none(req.handle);
                    } else {
                        let l = 8 + len as u32;
                        put_structured_header(
                            &mut buf,
                            REPLY_FLAG_DONE,
                            REPLY_TYPE_OFFSET_DATA,
                            req.handle,
                            l,
                        );
                        buf[STRUCTURED_HEADER_LEN..hl].copy_from_slice(&off.to_be_bytes());
                    }
                } else {
                    put_simple_reply(&mut buf, 0, req.handle);
                }
                for c in counters {
                    Counters::add(&c.reads, 1);
                    Counters::add(&c.bytes_read, len);
                }
                send(sh, &buf).await;
            }
            Err(e) => fail(sh, &req, "read", e).await,
        }
        return;
    }
    if req.kind == CMD_BLOCK_STATUS {
        return block_status(sh, dev, req).await;
    }
    if req.kind == CMD_WRITE_ZEROES && req.flags & CMD_FLAG_FAST_ZERO != 0 {
        // Fast means "by deallocation, writing no data"; else the client zeroes its own way.
        let d = dev.clone();
        if !blocking(move || Ok(d.zeroes_fast(off, len)))
            .await
            .unwrap_or(false)
        {
            let msg = "this zeroing cannot be done fast: it covers part of a full stripe that holds data, or the pool is degraded";
            let _ = send_error(sh, &req, ENOTSUP, msg).await;
            return;
        }
    }
    let kind = req.kind;
    let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
    let res = blocking(move || {
        match kind {
            CMD_WRITE => dev.write_at(off, data.as_deref().unwrap_or_default())?,
            CMD_FLUSH => return dev.flush(),
            // A trim only needs to forget the data; the contract's discard does (and zeroes).
            CMD_TRIM if len > 0 => dev.discard(off, len)?,
            // NO_HOLE asks that the range stay allocated: write the zeroes. Without it the
            // client allows a hole, and discard reads back as zeroes by the block contract.
            CMD_WRITE_ZEROES if len > 0 && no_hole => dev.write_zeroes(off, len)?,
            CMD_WRITE_ZEROES if len > 0 => dev.discard(off, len)?,
            // NBD_CMD_CACHE is a prefetch hint; volumes have no cache for us to warm.
            _ => {}
        }
        if fua && kind != CMD_CACHE {
            dev.flush()?;
        }
        Ok(())
    })
    .await;
    match res {
        Ok(()) => {
            for c in counters {
                match kind {
                    CMD_WRITE => {
                        Counters::add(&c.writes, 1);
                        Counters::add(&c.bytes_written, len);
                    }
                    CMD_FLUSH => Counters::add(&c.flushes, 1),
                    CMD_TRIM => Counters::add(&c.trims, 1),
                    CMD_WRITE_ZEROES => Counters::add(&c.zeroes, 1),
                    _ => {}
                }
            }
            let mut b = [0u8; SIMPLE_REPLY_LEN];
            put_simple_reply(&mut b, 0, req.handle);
            send(sh, &b).await;
        }
        Err(e) => {
            let what = match kind {
                CMD_WRITE => "write",
                CMD_FLUSH => "flush",
                CMD_TRIM => "trim",
                CMD_WRITE_ZEROES => "write-zeroes",
                _ => "cache",
            };
            fail(sh, &req, what, e).await
        }
    }
}

/// Answers NBD_CMD_BLOCK_STATUS for `base:allocation` from the device's allocation.
async fn block_status<W: AsyncWrite + Unpin + Send + 'static>(
    sh: &Shared<W>,
    dev: Arc<dyn BlockDevice>,
    req: Request,
) {
    let (off, len) = (req.offset, req.len as u64);
    match blocking(move || dev.allocation(off, len)).await {
        Ok(extents) => {
            let one = req.flags & CMD_FLAG_REQ_ONE != 0;
            send(sh, &block_status_chunk(req.handle, &extents, one)).await;
        }
        Err(e) => fail(sh, &req, "block-status", e).await,
    }
}

/// Runs a device call on the blocking pool; a panic in the device becomes an I/O error.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(format!("the device call panicked: {e}"))))
}

async fn fail<W: AsyncWrite + Unpin>(sh: &Shared<W>, req: &Request, what: &str, e: io::Error) {
    Counters::add(&sh.inner.counters.errors, 1);
    Counters::add(&sh.entry.counters.errors, 1);
    warn!(
        export = %sh.entry.export.name,
        "NBD: a {what} of {} bytes at {} failed: {e}", req.len, req.offset
    );
    let msg = format!("the {what} failed on the server: {e}");
    let _ = send_error(sh, req, errno_of(&e), &msg).await;
}

/// Sends an error reply: a structured error chunk (with a message a human can read) when
/// structured replies were negotiated, which the protocol requires for reads; else a simple
/// reply with the error and no payload.
async fn send_error<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    req: &Request,
    errno: u32,
    msg: &str,
) -> io::Result<()> {
    if sh.structured {
        write(sh, &structured_error(req.handle, errno, msg)).await
    } else {
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        put_simple_reply(&mut b, errno, req.handle);
        write(sh, &b).await
    }
}

async fn send<W: AsyncWrite + Unpin>(sh: &Shared<W>, b: &[u8]) {
    let _ = write(sh, b).await;
}

async fn write<W: AsyncWrite + Unpin>(sh: &Shared<W>, b: &[u8]) -> io::Result<()> {
    let mut w = sh.w.lock().await;
    let r = async {
        w.write_all(b).await?;
        w.flush().await
    }
    .await;
    if let Err(e) = &r {
        debug!("NBD: a reply could not be sent: {e}");
        sh.broken.send_replace(true);
    }
    r
}
