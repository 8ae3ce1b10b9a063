//! Runs a batch of member I/Os at once: all of a request's strips are in flight together, so a
//! full-stripe read keeps every drive busy. Each calling thread has its own io_uring, so many
//! requests from many threads proceed in parallel with no shared queue; without io_uring the
//! batch is spread over scoped threads, one per member.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use crate::drive::Drive;

pub enum OpBuf<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    /// A write durable when it completes (RWF_DSYNC: FUA where the drive has it).
    WriteFua(&'a [u8]),
    /// Makes the member's completed writes durable (fdatasync).
    Flush,
}

pub struct Op<'a> {
    pub member: usize,
    /// Absolute byte offset on the member.
    pub offset: u64,
    pub buf: OpBuf<'a>,
}

impl<'a> Op<'a> {
    pub fn read(member: usize, offset: u64, buf: &'a mut [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::Read(buf),
        }
    }
    pub fn write(member: usize, offset: u64, buf: &'a [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::Write(buf),
        }
    }
    /// A write that is durable when it completes, without flushing the member's other writes.
    pub fn write_fua(member: usize, offset: u64, buf: &'a [u8]) -> Op<'a> {
        Op {
            member,
            offset,
            buf: OpBuf::WriteFua(buf),
        }
    }
    /// A flush of the member: in one batch, every member's flush is in flight at once (a batch
    /// gives no order, so flushes go in a batch after the writes they cover).
    pub fn flush(member: usize) -> Op<'a> {
        Op {
            member,
            offset: 0,
            buf: OpBuf::Flush,
        }
    }
    pub fn is_write(&self) -> bool {
        matches!(self.buf, OpBuf::Write(_) | OpBuf::WriteFua(_))
    }
    /// Bytes the op moves.
    pub fn bytes(&self) -> u64 {
        self.len() as u64
    }
    fn len(&self) -> usize {
        match &self.buf {
            OpBuf::Read(b) => b.len(),
            OpBuf::Write(b) | OpBuf::WriteFua(b) => b.len(),
            OpBuf::Flush => 0,
        }
    }
}

const RING_ENTRIES: u32 = 256;
static URING_BROKEN: AtomicBool = AtomicBool::new(false);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Whether this process uses io_uring (false where the kernel or a sandbox refuses it).
pub fn uring_available() -> bool {
    if URING_BROKEN.load(Ordering::Relaxed) {
        return false;
    }
    RING.with(|r| ensure_ring(&mut r.borrow_mut()))
}

fn ensure_ring(slot: &mut Option<IoUring>) -> bool {
    if slot.is_some() {
        return true;
    }
    match IoUring::new(RING_ENTRIES) {
        Ok(r) => {
            *slot = Some(r);
            true
        }
        Err(e) => {
            if !URING_BROKEN.swap(true, Ordering::Relaxed) {
                tracing::warn!("io_uring is not available ({e}); member I/O uses threads instead");
            }
            false
        }
    }
}

fn sync_op(drive: &dyn Drive, op: &mut Op) -> io::Result<()> {
    match &mut op.buf {
        OpBuf::Read(b) => drive.read_at(b, op.offset),
        OpBuf::Write(b) => drive.write_at(b, op.offset),
        OpBuf::WriteFua(b) => drive.write_fua_at(b, op.offset),
        OpBuf::Flush => drive.flush(),
    }
}

/// Runs every op; the result at index i belongs to ops[i]. Errors name the member's drive.
pub fn execute(drives: &[Arc<dyn Drive>], ops: &mut [Op]) -> Vec<io::Result<()>> {
    let mut results: Vec<io::Result<()>> = (0..ops.len()).map(|_| Ok(())).collect();
    if ops.is_empty() {
        return results;
    }
    let use_uring = !URING_BROKEN.load(Ordering::Relaxed)
        && ops.iter().all(|o| match o.buf {
            // Durability on the ring only where the drive lets the ring model it.
            OpBuf::Flush | OpBuf::WriteFua(_) => drives[o.member].uring_flush(),
            _ => drives[o.member].uring_fd().is_some(),
        });
    if use_uring && ops.len() > 1 {
        let done = RING.with(|r| {
            let mut r = r.borrow_mut();
            if !ensure_ring(&mut r) {
                return false;
            }
            run_uring(r.as_mut().unwrap(), drives, ops, &mut results);
            true
        });
        if done {
            return results;
        }
    }
    if ops.len() == 1 || !ops.iter().any(|o| drives[o.member].uring_fd().is_some()) {
        for (op, res) in ops.iter_mut().zip(results.iter_mut()) {
            *res = sync_op(drives[op.member].as_ref(), op);
        }
        // Whatever must be durable when this returns is: a drive that only booked it (the
        // bench's simulated drives, so that a batch's flushes wait together as on a ring, not
        // one after another) waits for it here.
        ops.iter()
            .filter(|o| matches!(o.buf, OpBuf::Flush | OpBuf::WriteFua(_)))
            .for_each(|o| drives[o.member].settle());
        return results;
    }
    // Without io_uring: one scoped thread per member, each running that member's ops in order.
    let mut by_member: Vec<Vec<(usize, &mut Op)>> = (0..drives.len()).map(|_| Vec::new()).collect();
    for (i, op) in ops.iter_mut().enumerate() {
        by_member[op.member].push((i, op));
    }
    let outs: Vec<Vec<(usize, io::Result<()>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = by_member
            .into_iter()
            .filter(|v| !v.is_empty())
            .map(|v| {
                s.spawn(move || {
                    v.into_iter()
                        .map(|(i, op)| {
                            let r = sync_op(drives[op.member].as_ref(), op);
                            (i, r)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, r) in outs.into_iter().flatten() {
        results[i] = r;
    }
    results
}

fn run_uring(
    ring: &mut IoUring,
    drives: &[Arc<dyn Drive>],
    ops: &mut [Op],
    results: &mut [io::Result<()>],
) {
    let mut next = 0usize;
    let mut inflight = 0usize;
    let mut short: Vec<(usize, usize)> = Vec::new();
    while next < ops.len() || inflight > 0 {
        {
            let mut sq = ring.submission();
            while next < ops.len() && !sq.is_full() {
                let op = &mut ops[next];
                let fd = types::Fd(drives[op.member].uring_fd().unwrap());
                let entry = match &mut op.buf {
                    OpBuf::Read(b) => opcode::Read::new(fd, b.as_mut_ptr(), b.len() as u32)
                        .offset(op.offset)
                        .build(),
                    OpBuf::Write(b) => opcode::Write::new(fd, b.as_ptr(), b.len() as u32)
                        .offset(op.offset)
                        .build(),
                    OpBuf::WriteFua(b) => opcode::Write::new(fd, b.as_ptr(), b.len() as u32)
                        .offset(op.offset)
                        .rw_flags(libc::RWF_DSYNC)
                        .build(),
                    OpBuf::Flush => opcode::Fsync::new(fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build(),
                }
                .user_data(next as u64);
                // SAFETY: the buffer behind each entry is borrowed by `ops` for this whole
                // function, which does not return until every submitted entry has completed.
                unsafe { sq.push(&entry).expect("submission queue has room") };
                next += 1;
                inflight += 1;
            }
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // The ring itself failed: finish whatever is in flight, then the rest synchronously.
            let _ = ring.submit_and_wait(inflight);
            for c in ring.completion() {
                let _ = c;
            }
            for i in next..ops.len() {
                results[i] = sync_op(drives[ops[i].member].as_ref(), &mut ops[i]);
            }
            for (i, res) in results.iter_mut().enumerate().take(next) {
                if res.is_ok() {
                    *res = sync_op(drives[ops[i].member].as_ref(), &mut ops[i]);
                }
            }
            return;
        }
        for c in ring.completion() {
            inflight -= 1;
            let i = c.user_data() as usize;
            let r = c.result();
            if r < 0 {
                results[i] = Err(io::Error::from_raw_os_error(-r));
            } else if (r as usize) < ops[i].len() {
                short.push((i, r as usize));
            }
        }
    }
    // A short transfer (a signal, a file shorter than expected) finishes synchronously, which
    // also turns a read past the end of a file into a clear error.
    for (i, done) in short {
        let op = &mut ops[i];
        let off = op.offset + done as u64;
        results[i] = match &mut op.buf {
            OpBuf::Read(b) => drives[op.member].read_at(&mut b[done..], off),
            OpBuf::Write(b) => drives[op.member].write_at(&b[done..], off),
            OpBuf::WriteFua(b) => drives[op.member].write_fua_at(&b[done..], off),
            OpBuf::Flush => drives[op.member].flush(),
        };
    }
}
