//! The NVM command set against a namespace: Read, Write, Flush, Write Zeroes and Dataset
//! Management, whatever transport carried the command. The transport hands over the command
//! with its data (a write's, already fetched) and gets back a status, or a read's data to place
//! in the host's memory. Device calls run on the blocking pool: a device may wait on drives.

use crate::cmd::{self, io, Sqe, Status};
use crate::model::{Ns, Subsystem, BUF_UNIT};
use millrace_io::{BufPool, IoBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Where a read's data buffer comes from.
#[derive(Clone)]
pub(crate) enum ReadBuffers {
    /// A buffer of its own, counted against the target's buffer budget (NVMe/TCP copies the
    /// data into its socket anyway).
    Accounted(Arc<Semaphore>),
    /// A buffer of the data path's pool, which the transport reaches without a copy (NVMe/RDMA
    /// registered the pool with the device).
    Pool(BufPool),
}

/// How an I/O command ended.
pub enum IoDone {
    Status(Status),
    /// Success with data for the host; the permit (if any) holds its place in the budget until
    /// the data is sent.
    Read {
        data: IoBuf,
        permit: Option<OwnedSemaphorePermit>,
    },
}

/// One admitted I/O command, ready to run in a task of its own.
pub struct IoCommand {
    pub(crate) subsys: Arc<Subsystem>,
    pub(crate) ns: Arc<Ns>,
    pub(crate) sqe: Sqe,
    pub(crate) data: Option<IoBuf>,
    pub(crate) c2h_len: usize,
    pub(crate) max_transfer: usize,
    pub(crate) bufs: ReadBuffers,
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

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn millrace_block::BlockDevice) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let dev = self.ns.dev.clone();
        match tokio::task::spawn_blocking(move || f(dev.as_ref())).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(format!(
                "the device call did not finish: {e}"
            ))),
        }
    }

    async fn go(&self, data: Option<IoBuf>) -> Result<IoDone, Status> {
        let s = &self.sqe;
        match s.opcode() {
            io::READ => self.read().await,
            io::WRITE => {
                let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
                let data = data.unwrap_or_else(|| IoBuf::standalone(0));
                if data.len() as u64 != len {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                let fua = s.cdw(12) & (1 << 30) != 0;
                self.blocking(move |d| {
                    d.write_at(off, &data)?;
                    if fua {
                        d.flush()?;
                    }
                    Ok(())
                })
                .await
                .map_err(|e| {
                    tracing::warn!("a write of {len} bytes at {off} failed: {e}");
                    status_of(&e, false)
                })?;
                let io_ctr = &self.subsys.io;
                io_ctr.write_commands.fetch_add(1, Ordering::Relaxed);
                io_ctr.bytes_written.fetch_add(len, Ordering::Relaxed);
                Ok(IoDone::Status(Status::SUCCESS))
            }
            io::FLUSH => self.flush().await,
            io::WRITE_ZEROES => {
                let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
                // DEAC: the host allows deallocation, which reads back as zeroes too.
                let deac = s.cdw(12) & (1 << 25) != 0;
                self.blocking(move |d| {
                    if deac {
                        d.discard(off, len)
                    } else {
                        d.write_zeroes(off, len)
                    }
                })
                .await
                .map_err(|e| status_of(&e, false))?;
                Ok(IoDone::Status(Status::SUCCESS))
            }
            io::DATASET_MANAGEMENT => self.dataset_management(data).await,
            _ => Err(Status::INVALID_OPCODE),
        }
    }

    async fn read(&self) -> Result<IoDone, Status> {
        let s = &self.sqe;
        let (off, len) = self.range(s.slba(), s.nlb() as u64)?;
        if len as usize > self.max_transfer {
            return Err(Status::INVALID_FIELD);
        }
        if len as usize != self.c2h_len {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        let (mut buf, permit) = match &self.bufs {
            ReadBuffers::Accounted(sem) => {
                let units = len.div_ceil(BUF_UNIT) as u32;
                let permit = (sem.clone().acquire_many_owned(units).await)
                    .map_err(|_| Status::INTERNAL_ERROR)?;
                (IoBuf::standalone(len as usize), Some(permit))
            }
            ReadBuffers::Pool(pool) => {
                let mut b = pool.get(len as usize).await.map_err(|e| {
                    tracing::warn!("no buffer for a read of {len} bytes: {e}");
                    Status::INTERNAL_ERROR
                })?;
                b.set_len(len as usize)
                    .map_err(|_| Status::INTERNAL_ERROR)?;
                (b, None)
            }
        };
        let (r, buf) = {
            let dev = self.ns.dev.clone();
            let j = tokio::task::spawn_blocking(move || {
                let r = dev.read_at(off, &mut buf);
                (r, buf)
            });
            j.await.map_err(|e| {
                tracing::warn!("a read of {len} bytes at {off} did not finish: {e}");
                Status::INTERNAL_ERROR
            })?
        };
        r.map_err(|e| {
            tracing::warn!("a read of {len} bytes at {off} failed: {e}");
            status_of(&e, true)
        })?;
        let io_ctr = &self.subsys.io;
        io_ctr.read_commands.fetch_add(1, Ordering::Relaxed);
        io_ctr.bytes_read.fetch_add(len, Ordering::Relaxed);
        Ok(IoDone::Read { data: buf, permit })
    }

    async fn flush(&self) -> Result<IoDone, Status> {
        let all: Vec<_> = if self.sqe.nsid() == u32::MAX {
            (self.subsys.namespaces.load().iter())
                .map(|n| n.dev.clone())
                .collect()
        } else {
            vec![self.ns.dev.clone()]
        };
        for dev in all {
            let r = tokio::task::spawn_blocking(move || dev.flush()).await;
            if !matches!(r, Ok(Ok(()))) {
                return Err(Status::WRITE_FAULT);
            }
        }
        Ok(IoDone::Status(Status::SUCCESS))
    }

    async fn dataset_management(&self, data: Option<IoBuf>) -> Result<IoDone, Status> {
        let s = &self.sqe;
        let nr = (s.cdw(10) & 0xff) as usize + 1;
        let data = data.unwrap_or_else(|| IoBuf::standalone(0));
        if data.len() < nr * cmd::DsmRange::LEN {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
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
        self.blocking(move |d| {
            for (off, len) in ranges {
                d.discard(off, len)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| status_of(&e, false))?;
        Ok(IoDone::Status(Status::SUCCESS))
    }
}
