//! Discard and write-zeroes. The whole rows of a range are deallocated on every member in
//! service, parity included: a row whose data is all zeroes has all-zero P and Q, so parity
//! stays right without being computed, and the space goes back to the drives (a hole in a drive
//! file, an unmapped range of an SSD). The partial rows at either end are written as zeroes
//! through the ordinary write path, which keeps their parity right.
//!
//! Rows map to the same byte range on every member (`member_offset`), so a run of whole rows is
//! one contiguous deallocation per member. The write-intent bitmap is marked first, as for a
//! write: a crash half-way leaves some members deallocated and others not, and resync then
//! recomputes those rows' parity from whatever data they hold (the discard was not
//! acknowledged, so either content is allowed).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use millrace_block::IoBuf;

use super::{Array, Result};
use crate::aligned::AlignedBuf;

/// Member bytes deallocated under one hold of the rows' locks: writes to other rows of a large
/// discard are not held up for the whole of it.
const STEP_MEMBER_BYTES: u64 = 256 << 20;

/// The parts of a range: the partial row at its start, the whole rows, the partial row at its
/// end. Each partial part is (offset, len); the whole rows are (first row, count).
struct Split {
    head: (u64, u64),
    rows: (u64, u64),
    tail: (u64, u64),
}

impl Array {
    fn split_rows(&self, offset: u64, len: u64) -> Split {
        let fs = self.geo.full_stripe_bytes();
        let end = offset + len;
        let (r0, r1) = (offset.div_ceil(fs), end / fs);
        if r0 >= r1 {
            return Split {
                head: (offset, len),
                rows: (r0, 0),
                tail: (end, 0),
            };
        }
        Split {
            head: (offset, r0 * fs - offset),
            rows: (r0, r1 - r0),
            tail: (r1 * fs, end - r1 * fs),
        }
    }

    /// Whole rows per step of a large deallocation.
    fn step_rows(&self) -> u64 {
        (STEP_MEMBER_BYTES / self.geo.strip).max(1)
    }

    /// Whether a discard of `[offset, offset + len)` is only deallocation: whole rows of a
    /// pool with every member online.
    pub fn deallocates(&self, offset: u64, len: u64) -> bool {
        let fs = self.geo.full_stripe_bytes();
        offset.is_multiple_of(fs)
            && len.is_multiple_of(fs)
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.size_bytes())
            && self.all_online()
    }

    /// Makes `[offset, offset + len)` read as zeroes; its whole rows give their space back.
    /// Durable on the next flush, like a write.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        let s = self.split_rows(offset, len);
        self.zero_range(s.head.0, s.head.1)?;
        let (mut row, end) = (s.rows.0, s.rows.0 + s.rows.1);
        while row < end {
            let n = (end - row).min(self.step_rows());
            let fs = self.geo.full_stripe_bytes();
            let _g = self.lock_rows(row * fs, n * fs);
            self.deallocate_locked(row, n)?;
            row += n;
        }
        self.zero_range(s.tail.0, s.tail.1)
    }

    /// `discard` on the data path: on a core, the rows' locks are taken asynchronously and the
    /// partial rows go through the completion-based write; the deallocation itself is a
    /// `fallocate` per member, run inline (it changes no data, only the drives' maps).
    pub(super) async fn discard_owned(&self, offset: u64, len: u64) -> io::Result<()> {
        if !millrace_io::on_ring() {
            return self.discard(offset, len).map_err(Into::into);
        }
        self.check_range(offset, len)?;
        let s = self.split_rows(offset, len);
        self.zero_owned(s.head.0, s.head.1).await?;
        let fs = self.geo.full_stripe_bytes();
        let (mut row, end) = (s.rows.0, s.rows.0 + s.rows.1);
        while row < end {
            let n = (end - row).min(self.step_rows());
            let _g = self
                .locks
                .lock_async(self.row_shards(row * fs, n * fs))
                .await;
            self.deallocate_locked(row, n)?;
            row += n;
        }
        self.zero_owned(s.tail.0, s.tail.1).await
    }

    /// Writes zeroes over a partial row through the ordinary write path.
    fn zero_range(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let zeros = AlignedBuf::zeroed(len.min(1 << 20) as usize);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64);
            self.write_at(offset + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    async fn zero_owned(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut buf = IoBuf::standalone(len.min(1 << 20) as usize);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.capacity() as u64) as usize;
            buf.set_len(n)?;
            let (r, back) = self.write_owned(offset + done, buf, false).await;
            r?;
            buf = back;
            done += n as u64;
        }
        Ok(())
    }

    /// Deallocates rows `row..row + n` on every member in service; the caller holds their
    /// locks. A pool that is not whole writes zeroes instead, through the engine (and its
    /// partial-parity log): the rows of a missing member are rebuilt from the others, and a crash in a
    /// degraded pool must not leave a row half deallocated with no parity to repair it from.
    fn deallocate_locked(&self, row: u64, n: u64) -> Result<()> {
        let fs = self.geo.full_stripe_bytes();
        if !self.all_online() {
            let per = (1u64 << 20).div_ceil(fs) * fs;
            let zeros = AlignedBuf::zeroed(per.min(n * fs) as usize);
            let (mut at, end) = (row * fs, (row + n) * fs);
            while at < end {
                let len = (end - at).min(zeros.len() as u64) as usize;
                self.write_locked(at, &zeros[..len])?;
                at += len as u64;
            }
            return Ok(());
        }
        if let Some(b) = &self.bitmap {
            b.mark(row, row + n - 1, &self.live_drives());
        }
        // A partial-parity log record left by a degraded write must never be replayed over
        // these rows.
        self.retire_log();
        // Like a write without the log: a failure meanwhile is recorded only once this is
        // done (and flushed), so a crash never finds these rows torn in a degraded pool.
        let Some(ticket) = self.begin_unlogged() else {
            return self.deallocate_locked(row, n);
        };
        let drives = self.drives.load_full();
        let (at, bytes) = (self.member_offset(row, 0), n * self.geo.strip);
        let mut failed = Vec::new();
        for m in 0..self.geo.members {
            if !self.writable(m) {
                continue;
            }
            if let Err(e) = drives[m].deallocate(at, bytes) {
                self.member_stats[m].errors.fetch_add(1, Ordering::Relaxed);
                self.stats.member_errors.fetch_add(1, Ordering::Relaxed);
                failed.push((m, e));
            }
        }
        // Given back before a failure is recorded (which waits for every ticket).
        drop(ticket);
        for (m, e) in failed {
            if Arc::ptr_eq(&drives[m], &self.drives.load()[m]) {
                self.fail_member(m, &e);
            }
        }
        self.stats
            .deallocated_bytes
            .fetch_add(n * fs, Ordering::Relaxed);
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
