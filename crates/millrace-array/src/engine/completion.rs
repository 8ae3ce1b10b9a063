//! The completion-based face of the engine (`BlockDevice::read_async` and friends).
//!
//! On a core of `millrace_io::Cores` with every member online and behind a file descriptor, a
//! request's member I/O goes to the core's io_uring as one batch, straight from and into the
//! request's own buffer, and the request's task is woken on the same core when the last member
//! operation completes: no thread waits. Reads of a healthy pool take no lock (as the blocking
//! path); writes take their rows' locks asynchronously (see `locks`). Full-stripe parity writes
//! compute parity as the batch is built, from the request's buffer.
//!
//! A partial-row parity write joins its row's pending set and is written together with the
//! other writes in flight to the same row (`merge`); one spanning rows is planned alone (the
//! cheaper of read-modify-write and reconstruct-write), its reads and then its writes one batch
//! each.
//!
//! Everything else (a degraded pool, an unaligned range, a member
//! failing mid-request, a thread with no ring) runs the blocking engine inline; on a core the
//! rows are locked asynchronously first, so a core never blocks on a lock that a task of its
//! own holds across an await.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use millrace_block::{BufResult, IoBuf};
use millrace_io::{Batch, SharedBuf};

use super::layout::ReadFrom;
use super::parity_ring::RingWrite;
use super::ring::{Drives, Sent, SentList};
use super::unlogged::Ticket;
use super::write::sector_span;
use super::{Array, Result};

impl Array {
    /// `read_at` over an owned buffer, completion-based where it can be.
    pub(super) async fn read_owned(&self, offset: u64, mut buf: IoBuf) -> BufResult {
        let len = buf.len();
        if let Err(e) = self.check_range(offset, len as u64) {
            return (Err(e.into()), buf);
        }
        if len == 0 {
            return (Ok(()), buf);
        }
        self.stats.read_ops.fetch_add(1, Ordering::Relaxed);
        self.stats
            .read_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        if let Some(drives) = self.ring_drives(offset, len) {
            let sb = SharedBuf::new(buf);
            let done = self.read_on_ring(&drives, offset, &sb).await;
            buf = sb
                .try_unwrap()
                .expect("every member operation has completed");
            if done {
                return (Ok(()), buf);
            }
        }
        let r = self.read_inline(offset, &mut buf).await;
        (r.map_err(Into::into), buf)
    }

    /// Reads every piece straight into the buffer. Returns whether all went well.
    async fn read_on_ring(&self, drives: &Drives, offset: u64, sb: &SharedBuf) -> bool {
        let pieces = self.pieces(offset, sb.len());
        let mut batch = Batch::with_capacity(pieces.len());
        let mut sent = SentList::with_capacity(pieces.len());
        for p in &pieces {
            let Ok(ReadFrom::Member(m)) = self.layout.read_from(self, p) else {
                return false;
            };
            let at = self.member_offset(p.row, p.s);
            batch.read(Self::member_fd(drives, m), at, sb, p.at..p.at + p.len);
            sent.push(Sent {
                member: m,
                len: p.len,
                write: false,
            });
        }
        let results = batch.run().await;
        self.account(drives, &sent, results)
    }

    /// The blocking read path, inline; on a core its rows are locked asynchronously first.
    async fn read_inline(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if !millrace_io::on_ring() {
            return self.read_counted(offset, buf, false);
        }
        let (a0, a1) = sector_span(offset, buf.len());
        let _g = self.locks.lock_async(self.row_shards(a0, a1 - a0)).await;
        self.read_counted(offset, buf, true)
    }

    /// `write_at` (and, with `fua`, a flush) over an owned buffer, completion-based where it
    /// can be; acknowledged once every member failure so far is recorded (see `unlogged`).
    pub(super) async fn write_owned(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult {
        let r = self.write_owned_now(offset, buf, fua).await;
        self.unlogged.recorded().await;
        r
    }

    async fn write_owned_now(&self, offset: u64, buf: IoBuf, fua: bool) -> BufResult {
        self.unlogged.recorded().await;
        let len = buf.len();
        if let Err(e) = self.check_range(offset, len as u64) {
            return (Err(e.into()), buf);
        }
        if len == 0 {
            return (Ok(()), buf);
        }
        self.stats.wrote(len as u64);
        // The parity-only branches' futures are boxed: inline they made every write's future
        // (RAID0's and mirrors' too) 3.9 KiB, which Box::pin in `write_async` copied per write.
        if self.merges(offset, len) {
            return Box::pin(self.write_merging(offset, buf, fua)).await;
        }
        let (a0, a1) = sector_span(offset, len);
        let _g = if millrace_io::on_ring() {
            self.locks.lock_async(self.row_shards(a0, a1 - a0)).await
        } else {
            self.lock_rows(a0, a1 - a0)
        };
        let fs = self.geo.full_stripe_bytes();
        let whole_rows = offset.is_multiple_of(fs) && (len as u64).is_multiple_of(fs);
        let drives = self.ring_drives(offset, len);
        let mut buf = buf;
        if let Some(d) = drives
            .as_ref()
            .filter(|_| self.geo.level.is_parity() && !whole_rows)
        {
            self.mark_intent(a0, a1);
            let r;
            (r, buf) = Box::pin(self.partial_on_ring(d, offset, buf, fua)).await;
            match r {
                Ok(true) => return (Ok(()), buf),
                Err(e) => return (Err(e.into()), buf),
                // A member failed: the blocking engine plans around it below.
                Ok(false) => {}
            }
        }
        let drives = drives.filter(|_| !self.geo.level.is_parity() || whole_rows);
        let Some(drives) = drives else {
            let r = self.write_alone_recorded(offset, &buf, fua).await;
            return (r, buf);
        };
        self.mark_intent(a0, a1);
        let ticket = if self.geo.level.is_parity() {
            self.retire_log();
            let Some(t) = self.begin_unlogged() else {
                // A member failed since the check: the blocking engine writes with the log.
                let r = self.write_alone_recorded(offset, &buf, fua).await;
                return (r, buf);
            };
            Some(t)
        } else {
            None
        };
        let parity = self
            .geo
            .level
            .is_parity()
            .then(|| self.full_stripe_parity(&buf));
        let sb = SharedBuf::new(buf);
        let r = self
            .write_on_ring(&drives, offset, &sb, parity.as_ref(), fua, ticket)
            .await;
        let r = match (r, self.offline_group()) {
            (Ok(()), Some(e)) => Err(e.into()),
            (r, _) => r,
        };
        (
            r,
            sb.try_unwrap()
                .expect("every member operation has completed"),
        )
    }

    /// A parity write of less than whole rows on this core's ring; Ok(false): a member failed.
    async fn partial_on_ring(
        &self,
        d: &Drives,
        offset: u64,
        buf: IoBuf,
        fua: bool,
    ) -> (Result<bool>, IoBuf) {
        let mut one = [RingWrite {
            offset,
            buf: SharedBuf::new(buf),
            fua,
        }];
        let r = super::parity_ring::write_on_ring(self, d, &mut one).await;
        let [one] = one;
        let buf = one
            .buf
            .try_unwrap()
            .expect("every member operation has completed");
        (r, buf)
    }

    /// `flush` as one batch of fdatasyncs on this core's ring where it can be.
    pub(super) async fn flush_owned(&self) -> io::Result<()> {
        let drives = self.drives.load_full();
        let live: Vec<usize> = (0..self.geo.members)
            .filter(|&m| self.writable(m))
            .collect();
        let on_ring = millrace_io::on_ring() && live.iter().all(|&m| drives[m].uring_flush());
        if !on_ring {
            return self.flush().map_err(Into::into);
        }
        let mut batch = Batch::with_capacity(live.len());
        let mut sent = SentList::with_capacity(live.len());
        for &m in &live {
            batch.fsync(Self::member_fd(&drives, m));
            sent.push(Sent {
                member: m,
                len: 0,
                write: false,
            });
        }
        let results = batch.run().await;
        for (s, r) in sent.iter().zip(results) {
            if let Err(e) = r {
                self.member_stats[s.member]
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
                self.stats.member_errors.fetch_add(1, Ordering::Relaxed);
                if Arc::ptr_eq(&drives[s.member], &self.drives.load()[s.member]) {
                    self.fail_member(s.member, &e);
                }
            }
        }
        match self.offline_group() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    pub(super) fn mark_intent(&self, a0: u64, a1: u64) {
        if let Some(b) = &self.bitmap {
            let fs = self.geo.full_stripe_bytes();
            b.mark(a0 / fs, (a1 - 1) / fs, &self.live_drives());
        }
    }

    /// Writes every piece to its members (and full-stripe parity, with the ticket of an
    /// unlogged parity write), one batch. A member that
    /// fails is taken out of service, as on the blocking path; the write stands while the pool
    /// survives.
    async fn write_on_ring(
        &self,
        drives: &Drives,
        offset: u64,
        sb: &SharedBuf,
        parity: Option<&StripeParity>,
        fua: bool,
        ticket: Option<Ticket>,
    ) -> io::Result<()> {
        let pieces = self.pieces(offset, sb.len());
        let mut batch = Batch::with_capacity(pieces.len() * 2);
        let mut sent = SentList::with_capacity(pieces.len() * 2);
        for p in &pieces {
            let loc = self.geo.locate(p.row, p.col);
            let copies: smallvec::SmallVec<[usize; 4]> = if self.geo.level.is_parity() {
                smallvec::smallvec![loc.member]
            } else {
                self.geo.group_members(loc.group).collect()
            };
            for m in copies {
                let at = self.member_offset(p.row, p.s);
                batch.write(Self::member_fd(drives, m), at, sb, p.at..p.at + p.len, fua);
                sent.push(Sent {
                    member: m,
                    len: p.len,
                    write: true,
                });
            }
        }
        match parity {
            Some(par) => self.parity_writes(drives, offset, par, &mut batch, &mut sent, fua),
            None => {
                self.stats
                    .full_stripe_writes
                    .fetch_add(pieces.len() as u64, Ordering::Relaxed);
            }
        }
        self.retire_log();
        let results = batch.run().await;
        // Given back before a failure among the results is recorded (see `unlogged`).
        drop(ticket);
        self.account(drives, &sent, results);
        match self.offline_group() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// P (and Q) of every group of every row of a whole-row write, computed from its data into
    /// a buffer from the core's pool slice, whose writes `parity_writes` adds to the batch.
    fn full_stripe_parity(&self, data: &[u8]) -> StripeParity {
        let geo = &self.geo;
        let (strip, k, np) = (geo.strip as usize, geo.group_data(), geo.level.parity());
        let fs = geo.full_stripe_bytes() as usize;
        let rows = data.len() / fs;
        let mut par = millrace_io::scratch(rows * geo.groups() * np * strip);
        for r in 0..rows {
            for g in 0..geo.groups() {
                let at = r * fs + g * k * strip;
                let srcs: Vec<&[u8]> = (0..k)
                    .map(|i| &data[at + i * strip..at + (i + 1) * strip])
                    .collect();
                let out = (r * geo.groups() + g) * np * strip;
                let (p, q) = par[out..out + np * strip].split_at_mut(strip);
                // Streamed past the caches: the parity goes to the drives by DMA (O_DIRECT)
                // and nothing here reads it again.
                if np == 2 {
                    millrace_parity::gen_pq_streamed(&srcs, p, q);
                } else {
                    millrace_parity::gen_p_streamed(&srcs, p);
                }
            }
        }
        self.stats
            .full_stripe_writes
            .fetch_add((rows * geo.groups()) as u64, Ordering::Relaxed);
        StripeParity {
            buf: SharedBuf::new(par),
            rows,
        }
    }

    /// Adds the writes of `par` (from `full_stripe_parity`) to the batch.
    fn parity_writes(
        &self,
        drives: &Drives,
        offset: u64,
        par: &StripeParity,
        batch: &mut Batch,
        sent: &mut SentList,
        fua: bool,
    ) {
        let geo = &self.geo;
        let (strip, k, np) = (geo.strip as usize, geo.group_data(), geo.level.parity());
        let fs = geo.full_stripe_bytes();
        let buf = &par.buf;
        for r in 0..par.rows {
            let row = offset / fs + r as u64;
            let at = self.member_offset(row, 0);
            for g in 0..geo.groups() {
                let layout = geo.group_layout(row, g);
                for (j, &m) in layout[k..].iter().enumerate() {
                    let out = ((r * geo.groups() + g) * np + j) * strip;
                    batch.write(Self::member_fd(drives, m), at, buf, out..out + strip, fua);
                    sent.push(Sent {
                        member: m,
                        len: strip,
                        write: true,
                    });
                }
            }
        }
    }
}

/// The parity of a whole-row write: every group's P (and Q) of its `rows` rows, in order.
pub(super) struct StripeParity {
    buf: SharedBuf,
    rows: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::{Drive, MemDrive};
    use crate::superblock::MemberState;

    /// `write_async` boxes a write's whole future and Box::pin copies it in: the parity-only
    /// branches (merging, partial rows) are boxed on their own so that they do not make every
    /// level's write carry their state (3.9 KiB inline, against 1.6 KiB without them).
    #[test]
    fn a_writes_future_does_not_carry_the_parity_branches_inline() {
        let mems: Vec<Arc<dyn Drive>> = (0..4)
            .map(|i| Arc::new(MemDrive::new(format!("m{i}"), 8192 + (1 << 20))) as Arc<dyn Drive>)
            .collect();
        let geo = crate::Geometry::new(crate::Level::Raid0, 4, None, 65536, 1 << 20).unwrap();
        let a = Array::new(geo, 8192, mems, &[MemberState::Online; 4]);
        let write = std::mem::size_of_val(&a.write_owned(0, IoBuf::standalone(4096), false));
        let merging = std::mem::size_of_val(&a.write_merging(0, IoBuf::standalone(4096), false));
        let partial = std::mem::size_of_val(&a.partial_on_ring(
            &Drives::default(),
            0,
            IoBuf::standalone(4096),
            false,
        ));
        assert!(
            write < merging && write < partial,
            "a write's future is {write} bytes, the branches' {merging} and {partial}"
        );
    }
}
