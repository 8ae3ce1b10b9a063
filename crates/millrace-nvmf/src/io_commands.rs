//! The NVM command set against a namespace: Read, Write, Flush, Write Zeroes and Dataset
//! Management, whatever transport carried the command. The transport hands over the command
//! with its data (a write's, already fetched into a pool buffer) and gets back a status, or a
//! read's data in a pool buffer to send from. On a core (docs/DATAPATH.md) every device call is
//! the device's completion-based `*_async` method, awaited in the command's task (NVMe/TCP and
//! NVMe/RDMA queues run on the cores). Elsewhere (a target given no cores: tests and tools) the
//! synchronous call runs on the blocking pool, because a device may wait on drives and must
//! not stall a shared runtime's worker.

use crate::cmd::{self, io, Sqe, Status};
use crate::model::{Ns, Subsystem};
use crate::reservation::Access;
use millrace_block::BlockDevice;
use millrace_io::share::{Held, Share};
use millrace_io::{BufPool, IoBuf};
use std::io::Result as IoResult;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How an I/O command ended.
pub enum IoDone {
    Status(Status),
    /// Success with data for the host: in a buffer of the pool, with the bytes of the host's
    /// share it holds (keep them until the buffer is dropped).
    Read {
        data: IoBuf,
        held: Option<Held>,
    },
}

/// What every I/O command of a queue reaches besides its namespace, behind one reference: a
/// command took one of each (and one of the controller) before, about 1% of a core at 4K on
/// NVMe/TCP (docs/PERFORMANCE.md).
pub(crate) struct IoQueue {
    pub subsys: Arc<Subsystem>,
    pub pool: BufPool,
    /// The host's share of the pool, which its data buffers count against.
    pub share: Share,
    /// The host (its identifier and NQN), as reservations know it.
    pub host: crate::resv_commands::Host,
    /// Where reservations that persist through power loss are recorded.
    pub store: Option<crate::reservation::ReservationStore>,
}

/// One admitted I/O command, ready to run in a task of its own.
pub struct IoCommand {
    /// The queue's subsystem, pool and host's share (taken before the pool's buffer).
    pub(crate) q: Arc<IoQueue>,
    pub(crate) ns: Arc<Ns>,
    pub(crate) sqe: Sqe,
    pub(crate) data: Option<IoBuf>,
    pub(crate) c2h_len: usize,
    pub(crate) max_transfer: usize,
}

fn on_core() -> bool {
    millrace_io::current_core().is_some()
}

fn unfinished(e: tokio::task::JoinError) -> std::io::Error {
    std::io::Error::other(format!("the device call did not finish: {e}"))
}

/// Reads into `buf` (its whole length).
async fn dev_read(dev: &Arc<dyn BlockDevice>, off: u64, mut buf: IoBuf) -> (IoResult<()>, IoBuf) {
    if on_core() {
        return dev.read_async(off, buf).await;
    }
    let d = dev.clone();
    let j = tokio::task::spawn_blocking(move || (d.read_at(off, &mut buf), buf)).await;
    j.unwrap_or_else(|e| (Err(unfinished(e)), IoBuf::standalone(0)))
}

/// Writes `buf`; with `fua` the data is durable when this returns.
async fn dev_write(dev: &Arc<dyn BlockDevice>, off: u64, buf: IoBuf, fua: bool) -> IoResult<()> {
    if on_core() {
        return dev.write_async(off, buf, fua).await.0;
    }
    let d = dev.clone();
    let j = tokio::task::spawn_blocking(move || {
        d.write_at(off, &buf)?;
        if fua {
            d.flush()?;
        }
        Ok(())
    });
    j.await.unwrap_or_else(|e| Err(unfinished(e)))
}

fn fua(s: &Sqe) -> bool {
    s.cdw(12) & (1 << 30) != 0
}

/// A write's status, counted.
fn written(q: &IoQueue, off: u64, len: u64, r: IoResult<()>) -> Status {
    if let Err(e) = r {
        tracing::warn!("a write of {len} bytes at {off} failed: {e}");
        return status_of(&e, false);
    }
    let io_ctr = &q.subsys.io;
    io_ctr.write_commands.fetch_add(1, Ordering::Relaxed);
    io_ctr.bytes_written.fetch_add(len, Ordering::Relaxed);
    Status::SUCCESS
}

/// The calls that move no data.
#[derive(Clone, Copy)]
enum Op {
    Flush,
    Discard(u64, u64),
    Zeroes(u64, u64),
}

async fn dev_op(dev: &Arc<dyn BlockDevice>, op: Op) -> IoResult<()> {
    if on_core() {
        return match op {
            Op::Flush => dev.flush_async().await,
            Op::Discard(o, l) => dev.discard_async(o, l).await,
            Op::Zeroes(o, l) => dev.write_zeroes_async(o, l).await,
        };
    }
    let d = dev.clone();
    let j = tokio::task::spawn_blocking(move || match op {
        Op::Flush => d.flush(),
        Op::Discard(o, l) => d.discard(o, l),
        Op::Zeroes(o, l) => d.write_zeroes(o, l),
    });
    j.await.unwrap_or_else(|e| Err(unfinished(e)))
}

fn status_of(e: &std::io::Error, read: bool) -> Status {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        Status::LBA_OUT_OF_RANGE
    } else if read {
        Status::UNRECOVERED_READ_ERROR
    } else {
        Status::WRITE_FAULT
    }
}

impl IoCommand {
    pub fn sqe(&self) -> &Sqe {
        &self.sqe
    }

    /// Runs the command to its end.
    pub async fn run(mut self) -> IoDone {
        let data = self.data.take();
        match self.go(data).await {
            Ok(d) => d,
            Err(st) => IoDone::Status(st),
        }
    }

    /// Byte range of an LBA range, or the status that refuses it.
    fn range(&self, slba: u64, blocks: u64) -> Result<(u64, u64), Status> {
        cmd::lba_range(slba, blocks, self.ns.blocks, self.ns.lba_shift)
    }

    async fn go(&self, data: Option<IoBuf>) -> Result<IoDone, Status> {
        let s = &self.sqe;
        if crate::resv_commands::is_reservation(s.opcode()) {
            return Ok(self.reservation(data).await);
        }
        // Counted while it runs (Preempt and Abort waits for it), and checked against the
        // reservation held.
        let _counted = self.ns.resv.enter();
        self.admit_reserved()?;
        match s.opcode() {
            io::READ => self.read().await,
            io::WRITE => self.write(data).await,
            io::FLUSH => self.flush().await,
            io::WRITE_ZEROES => {
                let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
                // DEAC: the host allows deallocation, which reads back as zeroes too.
                let op = match s.cdw(12) & (1 << 25) != 0 {
                    true => Op::Discard(off, len),
                    false => Op::Zeroes(off, len),
                };
                dev_op(&self.ns.dev, op)
                    .await
                    .map_err(|e| status_of(&e, false))?;
                Ok(IoDone::Status(Status::SUCCESS))
            }
            io::DATASET_MANAGEMENT => self.dataset_management(data).await,
            _ => Err(Status::INVALID_OPCODE),
        }
    }

    /// Reservation Conflict for a command the reservation held does not allow this host (a
    /// Flush of every namespace: on any of them).
    fn admit_reserved(&self) -> Result<(), Status> {
        let (h, op) = (&self.q.host.id, self.sqe.opcode());
        let access = Access::of(op);
        let conflict = match op == io::FLUSH && self.sqe.nsid() == u32::MAX {
            true => (self.q.subsys.namespaces.load().iter()).any(|n| n.resv.conflicts(h, access)),
            false => self.ns.resv.conflicts(h, access),
        };
        match conflict {
            true => Err(Status::RESERVATION_CONFLICT),
            false => Ok(()),
        }
    }

    async fn reservation(&self, data: Option<IoBuf>) -> IoDone {
        let q = &self.q;
        let r = crate::resv_commands::Req {
            subsys: &q.subsys,
            ns: &self.ns,
            host: &q.host,
            store: q.store.as_ref(),
            pool: &q.pool,
            share: &q.share,
        };
        match crate::resv_commands::run(r, &self.sqe, data.as_deref(), self.c2h_len).await {
            crate::resv_commands::Done::Status(st) => IoDone::Status(st),
            crate::resv_commands::Done::Data { data, held } => IoDone::Read { data, held },
        }
    }

    async fn write(&self, data: Option<IoBuf>) -> Result<IoDone, Status> {
        let s = &self.sqe;
        let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
        let Some(data) = data.filter(|d| d.len() as u64 == len) else {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        };
        let r = dev_write(&self.ns.dev, off, data, fua(s)).await;
        Ok(IoDone::Status(written(&self.q, off, len, r)))
    }

    /// Reads into a pool buffer of the command's length, which the transport sends from:
    /// first the host's share holds its bytes, then the pool gives the buffer (waiting in line
    /// for each when short: the back-pressure, the host's own before the pool's).
    async fn read(&self) -> Result<IoDone, Status> {
        let s = &self.sqe;
        let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
        if len as usize > self.max_transfer {
            return Err(Status::INVALID_FIELD);
        }
        if len as usize != self.c2h_len {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        let held = Some(self.q.share.take(len as usize).await);
        let buf = self.q.pool.get(len as usize).await.map_err(|e| {
            tracing::warn!("no buffer for a read of {len} bytes: {e}");
            Status::INVALID_FIELD
        })?;
        let (r, buf) = dev_read(&self.ns.dev, off, buf).await;
        r.map_err(|e| {
            tracing::warn!("a read of {len} bytes at {off} failed: {e}");
            status_of(&e, true)
        })?;
        self.count_read(len);
        Ok(IoDone::Read { data: buf, held })
    }

    fn count_read(&self, len: u64) {
        let io_ctr = &self.q.subsys.io;
        io_ctr.read_commands.fetch_add(1, Ordering::Relaxed);
        io_ctr.bytes_read.fetch_add(len, Ordering::Relaxed);
    }

    async fn flush(&self) -> Result<IoDone, Status> {
        if self.sqe.nsid() == u32::MAX {
            let all = self.q.subsys.namespaces.load_full();
            for n in all.iter() {
                dev_op(&n.dev, Op::Flush)
                    .await
                    .map_err(|_| Status::WRITE_FAULT)?;
            }
        } else {
            dev_op(&self.ns.dev, Op::Flush)
                .await
                .map_err(|_| Status::WRITE_FAULT)?;
        }
        Ok(IoDone::Status(Status::SUCCESS))
    }

    async fn dataset_management(&self, data: Option<IoBuf>) -> Result<IoDone, Status> {
        let s = &self.sqe;
        let nr = (s.cdw(10) & 0xff) as usize + 1;
        let Some(data) = data.filter(|d| d.len() >= nr * cmd::DsmRange::LEN) else {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        };
        let deallocate = s.cdw(11) & (1 << 2) != 0;
        if !deallocate {
            // Only hints (integral read/write): nothing to do.
            return Ok(IoDone::Status(Status::SUCCESS));
        }
        let mut ranges = Vec::with_capacity(nr);
        for i in 0..nr {
            let r = cmd::DsmRange::decode(&data[i * 16..i * 16 + 16]);
            if r.blocks == 0 {
                continue;
            }
            ranges.push(self.range(r.slba, r.blocks as u64)?);
        }
        drop(data);
        for (off, len) in ranges {
            dev_op(&self.ns.dev, Op::Discard(off, len))
                .await
                .map_err(|e| status_of(&e, false))?;
        }
        Ok(IoDone::Status(Status::SUCCESS))
    }
}
