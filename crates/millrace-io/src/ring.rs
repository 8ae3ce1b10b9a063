//! The per-core ring: one io_uring per core thread for member I/O, with an in-flight table that
//! owns whatever the kernel may touch until its completion arrives.
//!
//! Soundness (HOUSES §1, monoio's rent model and TigerBeetle's completions): a future can be
//! dropped or leaked at any await, but the kernel keeps writing into the buffers of operations
//! already submitted. So an operation never borrows: its buffer is a [`SharedBuf`] (an owned
//! `IoBuf` behind an `Arc`), and the ring's in-flight table holds one clone per submitted entry
//! until that entry's completion is reaped. A request gets its `IoBuf` back only when every clone
//! is gone, which `Arc` checks; a dropped request's buffer returns to the pool when its last
//! completion arrives. At thread exit the ring waits for every entry before anything is freed.
//!
//! Batching: entries are queued in the submission ring without a syscall; one `io_uring_enter`
//! submits them all, from the ring's driver task. Pushing the first entry of a round wakes the
//! driver, and tokio's current-thread scheduler runs tasks in arrival order, so the driver runs
//! after every task that was ready in this round has queued its entries: a busy core that never
//! parks still submits once per round, an idle one before it parks. A full submission ring is
//! submitted at once. Completions are reaped on the same core: the ring signals an eventfd
//! registered with tokio's reactor (AsyncFd), and the driver drains the completion ring, records
//! each result in its batch and wakes the batch's task once, when its last entry completes.
//!
//! Where no ring runs (the CLI, tests, bench and maintenance threads), a batch runs synchronously
//! on the calling thread with pread/pwrite/fdatasync, so the same API works everywhere. Every member
//! kind (block devices and files, O_DIRECT wherever the filesystem takes it) takes this one path:
//! no member is mapped or served by copies outside the ring.

use std::cell::{RefCell, UnsafeCell};
use std::future::Future;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use atomic_waker::AtomicWaker;
use io_uring::{opcode, squeue, types, IoUring};
use slab::Slab;
use tokio::io::unix::AsyncFd;

use crate::buf::IoBuf;
use crate::BufPool;
use smallvec::SmallVec;

struct BufCell(UnsafeCell<IoBuf>);
// The cell is only read or written through `SharedBuf::get_mut` (which proves it is the only
// handle) or by the kernel between submission and completion, when no Rust reference exists.
unsafe impl Sync for BufCell {}

/// An owned buffer lent to the kernel by several member operations of one request at once.
/// Take it back with [`SharedBuf::try_unwrap`] once the batch has completed.
#[derive(Clone)]
pub struct SharedBuf(Arc<BufCell>);

impl std::fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (_, len) = self.raw();
        write!(
            f,
            "SharedBuf({len} bytes, {} handles)",
            Arc::strong_count(&self.0)
        )
    }
}

impl SharedBuf {
    pub fn new(b: IoBuf) -> SharedBuf {
        SharedBuf(Arc::new(BufCell(UnsafeCell::new(b))))
    }

    /// The buffer, if no operation holds it any more.
    pub fn get_mut(&mut self) -> Option<&mut IoBuf> {
        // SAFETY: get_mut proves this is the only handle, so no entry is in flight.
        Arc::get_mut(&mut self.0).map(|c| unsafe { &mut *c.0.get() })
    }

    /// The buffer back, if no operation holds it any more.
    pub fn try_unwrap(self) -> Result<IoBuf, SharedBuf> {
        Arc::try_unwrap(self.0)
            .map(|c| c.0.into_inner())
            .map_err(SharedBuf)
    }

    /// The buffer's length.
    pub fn len(&self) -> usize {
        self.raw().1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn raw(&self) -> (*mut u8, usize) {
        // SAFETY: a shared reference to the IoBuf handle (never to its bytes, which the kernel
        // may be writing); no &mut to it exists while other handles do (see get_mut).
        let b = unsafe { &*self.0 .0.get() };
        (b.raw_ptr(), b.len())
    }
}

/// What a member operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    /// A write; `fua`: durable when it completes (RWF_DSYNC, the drive's FUA where it has one).
    Write {
        fua: bool,
    },
    /// fdatasync: every completed write to the file is durable.
    Fsync,
}

struct MemberOp {
    fd: RawFd,
    offset: u64,
    kind: OpKind,
    buf: Option<(SharedBuf, Range<usize>)>,
}

/// A batch's operations: most requests make one to four.
type Ops = SmallVec<[MemberOp; 4]>;

/// A batch's results, one per operation in the order they were added: bytes moved, or the
/// error.
pub type Results = SmallVec<[io::Result<usize>; 4]>;

/// Member operations that go to the kernel together; their results come back together.
#[derive(Default)]
pub struct Batch {
    ops: Ops,
}

impl Batch {
    pub fn with_capacity(n: usize) -> Batch {
        Batch {
            ops: Ops::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn io(&mut self, fd: RawFd, offset: u64, kind: OpKind, buf: &SharedBuf, r: Range<usize>) {
        let (_, len) = buf.raw();
        assert!(
            r.start <= r.end && r.end <= len,
            "a member operation's range {r:?} lies outside its {len}-byte buffer"
        );
        self.ops.push(MemberOp {
            fd,
            offset,
            kind,
            buf: Some((buf.clone(), r)),
        });
    }

    /// Reads `buf[range]` from `fd` at `offset`.
    pub fn read(&mut self, fd: RawFd, offset: u64, buf: &SharedBuf, range: Range<usize>) {
        self.io(fd, offset, OpKind::Read, buf, range);
    }

    /// Writes `buf[range]` to `fd` at `offset`.
    pub fn write(
        &mut self,
        fd: RawFd,
        offset: u64,
        buf: &SharedBuf,
        range: Range<usize>,
        fua: bool,
    ) {
        self.io(fd, offset, OpKind::Write { fua }, buf, range);
    }

    /// Makes `fd`'s completed writes durable. A batch gives no order between its entries, so a
    /// flush that must follow writes goes in a later batch.
    pub fn fsync(&mut self, fd: RawFd) {
        self.ops.push(MemberOp {
            fd,
            offset: 0,
            kind: OpKind::Fsync,
            buf: None,
        });
    }

    /// Runs the batch: on this core's ring where one runs, else synchronously. Resolves to one
    /// result per operation, in the order they were added: bytes moved, or the error.
    pub fn run(self) -> BatchFuture {
        BatchFuture {
            ops: Some(self.ops),
            state: None,
        }
    }
}

struct BatchState {
    remaining: AtomicUsize,
    /// Per operation: bytes moved, or a negated errno (inline for most batches: one
    /// allocation per batch, the state's own).
    results: SmallVec<[AtomicI64; 4]>,
    waker: AtomicWaker,
}

impl BatchState {
    fn new(n: usize) -> Arc<BatchState> {
        Arc::new(BatchState {
            remaining: AtomicUsize::new(n),
            results: (0..n).map(|_| AtomicI64::new(0)).collect(),
            waker: AtomicWaker::new(),
        })
    }
}

/// One operation's result from what the kernel (or `run_sync`) returned.
fn outcome(v: i64) -> io::Result<usize> {
    if v < 0 {
        Err(io::Error::from_raw_os_error(-v as i32))
    } else {
        Ok(v as usize)
    }
}

/// The future of a running [`Batch`]. Send: it holds only its batch's shared state; the ring's
/// in-flight table holds the buffers.
pub struct BatchFuture {
    ops: Option<Ops>,
    /// Made when the batch goes to the ring, whose completions fill it. A batch run
    /// synchronously (no ring on this thread) has its results at once and needs none.
    state: Option<Arc<BatchState>>,
}

impl BatchFuture {
    fn results(state: &BatchState) -> Results {
        state
            .results
            .iter()
            .map(|r| outcome(r.load(Ordering::Acquire)))
            .collect()
    }
}

impl Future for BatchFuture {
    type Output = Results;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(ops) = self.ops.take() {
            if ops.is_empty() {
                return Poll::Ready(Results::new());
            }
            let state = BatchState::new(ops.len());
            state.waker.register(cx.waker());
            match submit(ops, &state) {
                None => self.state = Some(state),
                Some(ops) => {
                    return Poll::Ready(ops.iter().map(|op| outcome(run_sync(op))).collect())
                }
            }
        }
        let state = self
            .state
            .as_ref()
            .expect("a member batch polled after it completed");
        if state.remaining.load(Ordering::Acquire) == 0 {
            return Poll::Ready(Self::results(state));
        }
        state.waker.register(cx.waker());
        if state.remaining.load(Ordering::Acquire) == 0 {
            return Poll::Ready(Self::results(state));
        }
        Poll::Pending
    }
}

fn run_sync(op: &MemberOp) -> i64 {
    let r = match (&op.buf, op.kind) {
        (_, OpKind::Fsync) => {
            // SAFETY: fdatasync on a descriptor the caller keeps open.
            unsafe { libc::fdatasync(op.fd) as isize }
        }
        (Some((b, r)), kind) => {
            let (p, _) = b.raw();
            // SAFETY: the range was checked against the buffer, which this op keeps alive, and
            // nothing else touches it while the batch runs.
            let p = unsafe { p.add(r.start) };
            let len = r.end - r.start;
            return sync_rw(op.fd, p, len, op.offset, kind);
        }
        (None, _) => 0,
    };
    if r < 0 {
        -(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO) as i64)
    } else {
        0
    }
}

/// Writes all of `buf` to `fd` at `offset`, durable when it returns (RWF_DSYNC: FUA on an NVMe
/// drive under O_DIRECT), retried over short transfers and EINTR: what a ring FUA write does,
/// for callers off the ring.
pub fn write_all_durable(fd: RawFd, buf: &[u8], offset: u64) -> io::Result<()> {
    // pwritev2 only reads through the pointer; `sync_rw` takes *mut for its reads too.
    let n = sync_rw(
        fd,
        buf.as_ptr().cast_mut(),
        buf.len(),
        offset,
        OpKind::Write { fua: true },
    );
    if n < 0 {
        return Err(io::Error::from_raw_os_error(-n as i32));
    }
    if (n as usize) < buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("only {n} of {} bytes written at {offset}", buf.len()),
        ));
    }
    Ok(())
}

/// A whole pread/pwrite, retried over short transfers and EINTR; a transfer the file cannot
/// complete (past its end) reports the bytes it moved, which callers check, as with the ring.
fn sync_rw(fd: RawFd, p: *mut u8, len: usize, offset: u64, kind: OpKind) -> i64 {
    let mut done = 0usize;
    while done < len {
        // SAFETY: p..p+len is valid: a batch op's checked range (run_sync) or a caller's slice
        // (write_all_durable, which only writes from it).
        let r = unsafe {
            let at = p.add(done);
            let off = (offset + done as u64) as libc::off_t;
            match kind {
                OpKind::Read => libc::pread(fd, at.cast(), len - done, off),
                OpKind::Write { fua: false } => libc::pwrite(fd, at.cast(), len - done, off),
                OpKind::Write { fua: true } => {
                    let iov = libc::iovec {
                        iov_base: at.cast(),
                        iov_len: len - done,
                    };
                    libc::pwritev2(fd, &iov, 1, off, libc::RWF_DSYNC)
                }
                OpKind::Fsync => 0,
            }
        };
        if r < 0 {
            let e = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if e == libc::EINTR {
                continue;
            }
            return -(e as i64);
        }
        if r == 0 {
            break;
        }
        done += r as usize;
    }
    done as i64
}

struct InFlight {
    entry: squeue::Entry,
    state: Arc<BatchState>,
    index: usize,
    /// Keeps the buffer the kernel may touch alive until the completion is reaped.
    _keep: Option<SharedBuf>,
}

/// Counters of one ring, for the measurements in docs/PERFORMANCE.md. Only the ring's own core
/// writes them ([`RingStats::add`]); others only read.
#[derive(Default, Debug)]
pub struct RingStats {
    pub entries: AtomicU64,
    pub submits: AtomicU64,
    pub reaps: AtomicU64,
}

impl RingStats {
    /// Adds `n` to counter `c` of this core's ring. Its one writer needs no atomic
    /// read-modify-write (a locked instruction each); readers on
    /// other cores see whole values.
    fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

pub(crate) struct Ring {
    ring: IoUring,
    inflight: Slab<InFlight>,
    queued: usize,
    registered: Option<usize>,
    driver: Option<Waker>,
    kicked: bool,
    stats: Arc<RingStats>,
    /// Reused by `reap` (completions drained, entries to resubmit): no allocation per round.
    reaped: Vec<(u64, i32)>,
    again: Vec<squeue::Entry>,
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// io_uring's worker threads alive in this process now (tasks named `iou-wrk-*`). The kernel
/// starts one when an entry cannot be issued without blocking (a buffered read of a file not in
/// the page cache, a write that must wait for the filesystem) and hands the entry to it: a
/// wake-up and context switches per such I/O, on whatever core it lands. Members opened
/// O_DIRECT on block devices should need none; a count above zero while I/O runs says entries
/// are being punted (`/metrics`: `millrace_io_wq_workers`; the block-device benchmark samples it).
pub fn io_wq_workers() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("iou-wrk"))
        })
        .count()
}

/// Whether this thread runs a ring (a core of [`crate::Cores`]).
pub fn on_ring() -> bool {
    RING.with(|r| r.borrow().is_some())
}

/// Queues the operations on this thread's ring; gives them back where the thread runs none.
fn submit(ops: Ops, state: &Arc<BatchState>) -> Option<Ops> {
    RING.with(|cell| {
        let mut guard = cell.borrow_mut();
        let Some(ring) = guard.as_mut() else {
            return Some(ops);
        };
        for (index, op) in ops.into_iter().enumerate() {
            ring.push(op, state.clone(), index);
        }
        ring.kick();
        None
    })
}

impl Ring {
    fn entry(&self, op: &MemberOp) -> squeue::Entry {
        let fd = types::Fd(op.fd);
        let (b, r) = match (&op.buf, op.kind) {
            (_, OpKind::Fsync) | (None, _) => {
                return opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
            }
            (Some((b, r)), _) => (b, r),
        };
        let (p, _) = b.raw();
        // SAFETY: the range was checked against the buffer when the op was added.
        let p = unsafe { p.add(r.start) };
        let len = (r.end - r.start) as u32;
        // SAFETY: the pointer is only read for its address; a registered index is used only for
        // buffers of the pool this ring registered.
        let fixed = self
            .registered
            .and_then(|id| unsafe { &*b.0 .0.get() }.registered_index(id));
        match (op.kind, fixed) {
            (OpKind::Read, Some(i)) => opcode::ReadFixed::new(fd, p, len, i)
                .offset(op.offset)
                .build(),
            (OpKind::Read, None) => opcode::Read::new(fd, p, len).offset(op.offset).build(),
            (OpKind::Write { fua }, Some(i)) => opcode::WriteFixed::new(fd, p, len, i)
                .offset(op.offset)
                .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            (OpKind::Write { fua }, None) => opcode::Write::new(fd, p, len)
                .offset(op.offset)
                .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                .build(),
            (OpKind::Fsync, _) => unreachable!("handled above"),
        }
    }

    fn push(&mut self, op: MemberOp, state: Arc<BatchState>, index: usize) {
        let entry = self.entry(&op);
        let key = self.inflight.insert(InFlight {
            entry: entry.clone(),
            state,
            index,
            _keep: op.buf.map(|(b, _)| b),
        });
        self.push_entry(entry.user_data(key as u64));
    }

    fn push_entry(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer the entry names is kept alive by its in-flight record until
            // its completion is reaped (see the module doc).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.queued += 1;
                RingStats::add(&self.stats.entries, 1);
                return;
            }
            // The submission ring is full: hand it to the kernel now.
            self.submit_now();
        }
    }

    fn kick(&mut self) {
        if !self.kicked {
            self.kicked = true;
            if let Some(w) = &self.driver {
                w.wake_by_ref();
            }
        }
    }

    fn submit_now(&mut self) {
        if self.queued == 0 {
            return;
        }
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // The completion side is full: make room, then try again.
                    self.reap();
                }
                Err(e) => {
                    tracing::error!("io_uring submission failed: {e}");
                    break;
                }
            }
        }
        self.queued = 0;
        RingStats::add(&self.stats.submits, 1);
    }

    /// Records every completion in its batch; wakes a batch when its last entry is done.
    fn reap(&mut self) -> usize {
        let mut n = 0;
        let mut again = std::mem::take(&mut self.again);
        let mut done = std::mem::take(&mut self.reaped);
        done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(key, res) in &done {
            n += 1;
            let key = key as usize;
            if res == -libc::EAGAIN || res == -libc::EINTR {
                again.push(self.inflight[key].entry.clone().user_data(key as u64));
                continue;
            }
            let f = self.inflight.remove(key);
            f.state.results[f.index].store(res as i64, Ordering::Release);
            drop(f._keep);
            if f.state.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                f.state.waker.wake();
            }
        }
        for e in again.drain(..) {
            self.push_entry(e);
        }
        done.clear();
        self.reaped = done;
        self.again = again;
        if n > 0 {
            RingStats::add(&self.stats.reaps, 1);
        }
        n
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Nothing the kernel may still touch is freed before its completion arrives.
        while !self.inflight.is_empty() {
            self.submit_now();
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                tracing::error!(
                    "io_uring failed while {} operations were in flight ({e}); their buffers are leaked rather than freed under the kernel",
                    self.inflight.len()
                );
                for f in self.inflight.drain() {
                    std::mem::forget(f);
                }
                return;
            }
            self.reap();
        }
    }
}

/// Creates this thread's ring (registering `pool`'s slices as fixed buffers where the kernel
/// allows it) and returns its driver, to be spawned on this thread's current-thread runtime.
/// Err: io_uring is not available; batches then run synchronously.
pub(crate) fn install(
    entries: u32,
    pool: Option<&BufPool>,
    stats: Arc<RingStats>,
) -> io::Result<impl Future<Output = ()>> {
    let ring = IoUring::new(entries)?;
    // SAFETY: eventfd returns a new descriptor or -1.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned here.
    let eventfd = unsafe { OwnedFd::from_raw_fd(efd) };
    ring.submitter().register_eventfd(efd)?;
    let mut registered = None;
    if let Some(p) = pool {
        let iov = p.iovecs();
        // SAFETY: the pool's region outlives the ring: every core holds a clone of the pool.
        match unsafe { ring.submitter().register_buffers(&iov) } {
            Ok(()) => registered = Some(p.id()),
            Err(e) => tracing::info!(
                "the buffer pool could not be registered with io_uring ({e}); member I/O uses unregistered buffers"
            ),
        }
    }
    // SAFETY: the AsyncFd owns the descriptor, so it is closed only after it is deregistered.
    let afd = unsafe { AsyncFd::register_with_interest(eventfd, tokio::io::Interest::READABLE)? };
    RING.with(|r| {
        *r.borrow_mut() = Some(Ring {
            ring,
            inflight: Slab::with_capacity(entries as usize * 4),
            queued: 0,
            registered,
            driver: None,
            kicked: false,
            stats,
            reaped: Vec::with_capacity(entries as usize * 2),
            again: Vec::new(),
        })
    });
    Ok(drive(afd))
}

/// Drops this thread's ring, waiting for everything in flight (call after the runtime is gone).
pub(crate) fn uninstall() {
    let r = RING.with(|r| r.borrow_mut().take());
    drop(r);
}

async fn drive(afd: AsyncFd<OwnedFd>) {
    std::future::poll_fn(|cx| {
        RING.with(|cell| {
            let mut guard = cell.borrow_mut();
            let Some(ring) = guard.as_mut() else {
                return Poll::Ready(());
            };
            loop {
                ring.driver = Some(cx.waker().clone());
                ring.kicked = false;
                ring.submit_now();
                ring.reap();
                match afd.poll_read_ready(cx) {
                    Poll::Ready(Ok(mut g)) => {
                        let mut v = 0u64;
                        // SAFETY: reading 8 bytes from our eventfd into a u64.
                        let _ = unsafe {
                            libc::read(afd.get_ref().as_raw_fd(), (&mut v as *mut u64).cast(), 8)
                        };
                        g.clear_ready();
                    }
                    Poll::Ready(Err(e)) => {
                        tracing::error!("the ring's eventfd failed: {e}");
                        return Poll::Ready(());
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
    })
    .await
}
