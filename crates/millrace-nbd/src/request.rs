//! One request of the transmission phase, on its connection's core: the checks that keep what
//! must not reach the device away from it, the device call through the completion-based face
//! (`BlockDevice::*_async`, no thread per request), and the reply. A read's reply is the header
//! and the pool buffer the device filled, sent with one vectored write: the data is never
//! copied behind a header.

use std::cell::{Cell, RefCell};
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use millrace_block::BlockDevice;
use millrace_io::IoBuf;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Mutex};
use tracing::{debug, info, warn};

use crate::handshake::Session;
use crate::meta::*;
use crate::proto::*;
use crate::{Counters, ExportEntry, Inner};

/// What a connection's request tasks share (behind an `Rc`: they all run on its core).
pub(crate) struct Shared<W> {
    pub w: Mutex<W>,
    pub inner: Arc<Inner>,
    pub entry: Arc<ExportEntry>,
    pub structured: bool,
    /// Raised when a reply cannot be written: the client is gone or stalled, so stop reading
    /// requests and send nothing more.
    pub broken: watch::Sender<bool>,
    /// How long the client has to take one reply.
    pub timeout: Duration,
    pub peer: crate::Peer,
    /// Replies of requests run in the reader while more requests wait in its buffer, sent
    /// together (`flush`) before the reader next waits for the socket: one send and one wake-up
    /// of the client per batch instead of per reply.
    pub batch: RefCell<Vec<u8>>,
    /// Whether replies go to `batch` now (set by the reader around each request it runs).
    pub corked: Cell<bool>,
}

/// Replies at most this large join a batch; larger ones are sent on their own.
const BATCH_REPLY_MAX: usize = 16 << 10;
/// A batch this large is sent before the reader runs the next request.
pub(crate) const BATCH_MAX: usize = 256 << 10;

/// Refuses what must not reach the device: unknown commands and flags, payloads larger than
/// the pool's largest buffer, ranges past the end, writes to a read-only export. Errors follow
/// the protocol's advice.
pub(crate) fn check(
    req: &Request,
    dev: &dyn BlockDevice,
    s: &Session,
    max_payload: u32,
) -> Option<(u32, String)> {
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
    if matches!(req.kind, CMD_READ | CMD_WRITE) && req.len > max_payload {
        return Some((
            EINVAL,
            format!(
                "a {name} of {} bytes exceeds the maximum block size of {max_payload} bytes; split it into smaller requests",
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

fn counters<W>(sh: &Shared<W>) -> [&Counters; 2] {
    [&sh.inner.counters, &sh.entry.counters]
}

/// Serves one checked request and sends its reply. `data` is None for commands without data.
pub(crate) async fn run<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    dev: &dyn BlockDevice,
    req: Request,
    data: Option<IoBuf>,
) {
    for c in counters(sh) {
        Counters::add(&c.ops, 1);
    }
    match (req.kind, data) {
        (CMD_READ, Some(data)) => read(sh, dev, req, data).await,
        (CMD_BLOCK_STATUS, _) => block_status(sh, dev, req).await,
        (kind, data) => {
            let res = change(dev, &req, data).await;
            match res {
                Ok(()) => {
                    done(sh, kind, req.len as u64);
                    let mut b = [0u8; SIMPLE_REPLY_LEN];
                    put_simple_reply(&mut b, 0, req.handle);
                    let _ = send(sh, &b, &[]).await;
                }
                Err(Refusal::Slow) => {
                    let msg = "this zeroing cannot be done fast: it covers part of a full stripe that holds data, or the pool is degraded";
                    let _ = send_error(sh, &req, ENOTSUP, msg).await;
                }
                Err(Refusal::Failed(e)) => fail(sh, &req, command_name(kind), e).await,
            }
        }
    }
}

fn command_name(kind: u16) -> &'static str {
    match kind {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_WRITE_ZEROES => "write-zeroes",
        CMD_BLOCK_STATUS => "block-status",
        _ => "cache",
    }
}

fn done<W>(sh: &Shared<W>, kind: u16, len: u64) {
    for c in counters(sh) {
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
}

enum Refusal {
    /// A fast zero that would not be fast.
    Slow,
    Failed(io::Error),
}

impl From<io::Error> for Refusal {
    fn from(e: io::Error) -> Self {
        Refusal::Failed(e)
    }
}

/// The commands that change the device (and cache, which changes nothing).
async fn change(dev: &dyn BlockDevice, req: &Request, buf: Option<IoBuf>) -> Result<(), Refusal> {
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let (off, len) = (req.offset, req.len as u64);
    match req.kind {
        CMD_WRITE => {
            let buf = buf.unwrap_or_else(|| IoBuf::standalone(0));
            let (r, buf) = dev.write_async(off, buf, fua).await;
            // Back to the pool before the reply waits on the socket.
            drop(buf);
            return r.map_err(Refusal::from);
        }
        CMD_FLUSH => return dev.flush_async().await.map_err(Refusal::from),
        // A trim only needs to forget the data; the contract's discard does (and zeroes).
        CMD_TRIM if len > 0 => dev.discard_async(off, len).await?,
        CMD_WRITE_ZEROES if len > 0 => {
            // Fast means "by deallocation, writing no data"; else the client zeroes its own
            // way. Asking is a look at the allocation map, cheap enough to do inline.
            if req.flags & CMD_FLAG_FAST_ZERO != 0 && !dev.zeroes_fast(off, len) {
                return Err(Refusal::Slow);
            }
            // NO_HOLE asks that the range stay allocated: write the zeroes. Without it the
            // client allows a hole, and discard reads back as zeroes by the block contract.
            if req.flags & CMD_FLAG_NO_HOLE != 0 {
                dev.write_zeroes_async(off, len).await?
            } else {
                dev.discard_async(off, len).await?
            }
        }
        // NBD_CMD_CACHE is a prefetch hint; volumes have no cache for us to warm.
        _ => return Ok(()),
    }
    if fua {
        dev.flush_async().await?;
    }
    Ok(())
}

/// A read: sent behind its header from the pool buffer the device fills.
async fn read<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    dev: &dyn BlockDevice,
    req: Request,
    buf: IoBuf,
) {
    let (off, len) = (req.offset, req.len);
    let (res, data) = dev.read_async(off, buf).await;
    if let Err(e) = res {
        drop(data);
        return fail(sh, &req, "read", e).await;
    }
    for c in counters(sh) {
        Counters::add(&c.reads, 1);
        Counters::add(&c.bytes_read, len as u64);
    }
    let mut head = [0u8; STRUCTURED_HEADER_LEN + 8];
    let head = if !sh.structured {
        put_simple_reply(&mut head, 0, req.handle);
        &head[..SIMPLE_REPLY_LEN]
    } else if len == 0 {
        put_structured_header(&mut head, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.handle, 0);
        &head[..STRUCTURED_HEADER_LEN]
    } else {
        let l = 8 + len;
        put_structured_header(
            &mut head,
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            req.handle,
            l,
        );
        head[STRUCTURED_HEADER_LEN..].copy_from_slice(&off.to_be_bytes());
        &head[..]
    };
    let _ = send(sh, head, &data).await;
}

/// Answers NBD_CMD_BLOCK_STATUS for `base:allocation` from the device's allocation map (in
/// memory: asked inline on the core).
async fn block_status<W: AsyncWrite + Unpin>(sh: &Shared<W>, dev: &dyn BlockDevice, req: Request) {
    match dev.allocation(req.offset, req.len as u64) {
        Ok(extents) => {
            let one = req.flags & CMD_FLAG_REQ_ONE != 0;
            let _ = send(sh, &block_status_chunk(req.handle, &extents, one), &[]).await;
        }
        Err(e) => fail(sh, &req, "block-status", e).await,
    }
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
pub(crate) async fn send_error<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    req: &Request,
    errno: u32,
    msg: &str,
) -> io::Result<()> {
    if sh.structured {
        send(sh, &structured_error(req.handle, errno, msg), &[]).await
    } else {
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        put_simple_reply(&mut b, errno, req.handle);
        send(sh, &b, &[]).await
    }
}

/// Sends one reply, `head` then `data`, whole, within the connection's timeout. Replies leave
/// one at a time (in completion order); once one fails, the connection is marked broken and
/// nothing more is sent.
pub(crate) async fn send<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    head: &[u8],
    data: &[u8],
) -> io::Result<()> {
    send_parts(sh, head, &[data]).await
}

/// `send` of data in pieces, in order.
async fn send_parts<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    head: &[u8],
    data: &[&[u8]],
) -> io::Result<()> {
    let closing = || io::Error::new(io::ErrorKind::BrokenPipe, "the connection is closing");
    if *sh.broken.borrow() {
        return Err(closing());
    }
    let total = head.len() + data.iter().map(|d| d.len()).sum::<usize>();
    if sh.corked.get() && total <= BATCH_REPLY_MAX {
        let mut b = sh.batch.borrow_mut();
        b.extend_from_slice(head);
        for d in data {
            b.extend_from_slice(d);
        }
        return Ok(());
    }
    let mut w = sh.w.lock().await;
    if *sh.broken.borrow() {
        return Err(closing());
    }
    write_timed(sh, &mut *w, head, data).await
}

/// Sends the batched replies, if any (see `Shared::batch`).
pub(crate) async fn flush<W: AsyncWrite + Unpin>(sh: &Shared<W>) -> io::Result<()> {
    if sh.batch.borrow().is_empty() {
        return Ok(());
    }
    let mut w = sh.w.lock().await;
    let out = std::mem::take(&mut *sh.batch.borrow_mut());
    if *sh.broken.borrow() {
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the connection is closing",
        ));
    }
    let r = write_timed(sh, &mut *w, &out, &[]).await;
    // The batch's memory is kept for the next one.
    let mut b = sh.batch.borrow_mut();
    if b.is_empty() {
        *b = out;
        b.clear();
    }
    r
}

/// Writes `head` then `data` within the connection's timeout; a failure marks it broken.
async fn write_timed<W: AsyncWrite + Unpin>(
    sh: &Shared<W>,
    w: &mut W,
    head: &[u8],
    data: &[&[u8]],
) -> io::Result<()> {
    let r = match tokio::time::timeout(sh.timeout, write_parts(w, head, data)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client did not take a reply of {} bytes within {} s",
                head.len() + data.iter().map(|d| d.len()).sum::<usize>(),
                sh.timeout.as_secs_f64()
            ),
        )),
    };
    if let Err(e) = &r {
        if e.kind() == io::ErrorKind::TimedOut {
            info!("NBD: closing the connection from {}: {e}", sh.peer);
        } else {
            debug!("NBD: a reply could not be sent: {e}");
        }
        sh.broken.send_replace(true);
    }
    r
}

/// Writes `head` then each of `data` with as few system calls as the socket allows: one
/// vectored write of all that is left each time. (tokio has no write_all_vectored.)
async fn write_parts<W: AsyncWrite + Unpin>(
    w: &mut W,
    head: &[u8],
    data: &[&[u8]],
) -> io::Result<()> {
    let mut all: smallvec::SmallVec<[IoSlice; 5]> = std::iter::once(head)
        .chain(data.iter().copied())
        .map(IoSlice::new)
        .collect();
    let mut left = &mut all[..];
    // Leading empty slices go, so a write that takes nothing means the socket is gone.
    IoSlice::advance_slices(&mut left, 0);
    while !left.is_empty() {
        // The kernel takes at most 1024 slices a call.
        let n = w.write_vectored(&left[..left.len().min(1024)]).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    w.flush().await
}
