//! Degraded parity writes through the journal (the format is in `crate::journal`): while a
//! parity pool is degraded, a write's member I/O is recorded whole on enough members, durably,
//! before it goes in place; after a crash the last record is written in place again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Array, ArrayError, JournalState, Result};
use crate::aligned::AlignedBuf;
use crate::drive::Drive;
use crate::io::Op;

impl Array {
    /// Writes a degraded pool's ops through the journal (see journal.rs): the record on enough
    /// members, durable; then in place, durable.
    ///
    /// At most one record is whole on the drives at any time, so a replay can only pick the
    /// right one. The last record is not retired when its write is done but together with the
    /// next record's write: the previous holders' headers are zeroed in the same batch that
    /// writes the new record, and both are flushed before the new record goes in place. Until
    /// then the previous record is either overwritten or still whole and already in place
    /// (replaying it changes nothing). Before any write that bypasses the journal, and at a
    /// clean stop, the last record is retired on its own (`retire_journal`). Compared with
    /// retiring each record after its write this saves a round of writes and flushes per
    /// degraded write; the holders rotate so the journal's load spreads over the members.
    pub(super) fn journaled_write(&self, ops: &mut [Op]) -> Result<()> {
        let cap = crate::journal::capacity(self.data_offset);
        let mut j = self.journal.lock();
        let entries: Vec<crate::journal::Entry> = ops
            .iter()
            .map(|o| crate::journal::Entry {
                member: o.member,
                offset: o.offset,
                data: match &o.buf {
                    crate::io::OpBuf::Write(b) => b,
                    crate::io::OpBuf::Read(_) | crate::io::OpBuf::Flush => &[],
                },
            })
            .collect();
        let Some(rec) = crate::journal::encode(j.seq, &entries, cap) else {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!("a degraded write is larger than the journal ({cap} bytes per member); it is written without journaling, so a crash during it is not protected")
            });
            self.retire_pending(&mut j);
            self.run(ops);
            return Ok(());
        };
        let seq = j.seq;
        j.seq += 1;
        // Copies enough to outlive every further failure the pool still survives: one more
        // than its remaining redundancy, on members taken in turn so the load spreads.
        let live = self.live_drives();
        let lost = (0..self.geo.members).filter(|&m| !self.writable(m)).count();
        let copies = (self.geo.tolerance_per_group().saturating_sub(lost) + 1).min(live.len());
        let first = (seq as usize) % live.len().max(1);
        let holders: Vec<Arc<dyn Drive>> = (0..copies)
            .map(|i| live[(first + i) % live.len()].clone())
            .collect();
        let stale: Vec<Arc<dyn Drive>> = j
            .pending
            .iter()
            .filter(|p| !holders.iter().any(|h| Arc::ptr_eq(h, p)))
            .cloned()
            .collect();
        let zero = crate::journal::blank_header();
        let targets: Vec<Arc<dyn Drive>> = holders.iter().chain(&stale).cloned().collect();
        let bufs: Vec<&[u8]> = (0..targets.len())
            .map(|i| {
                if i < holders.len() {
                    &rec[..]
                } else {
                    &zero[..]
                }
            })
            .collect();
        let put = crate::journal::put(&targets, &bufs);
        j.pending = holders;
        self.journal_pending.store(true, Ordering::Release);
        let durable = put.iter().take(copies).any(|&ok| ok);
        if !durable {
            return Err(self.offline_group().unwrap_or(ArrayError::Offline {
                group: 0,
                lost: self.geo.members,
                tolerance: self.geo.tolerance_per_group(),
            }));
        }
        self.run(ops);
        let mut members: Vec<usize> = ops.iter().map(|o| o.member).collect();
        members.sort_unstable();
        members.dedup();
        members.retain(|&m| self.writable(m));
        self.flush_members(&self.drives.load_full(), &members);
        Ok(())
    }

    /// Retires, durably, the last record.
    fn retire_pending(&self, j: &mut JournalState) {
        crate::journal::retire(&j.pending);
        j.pending.clear();
        self.journal_pending.store(false, Ordering::Release);
    }

    /// Retires the last journal record, durably, if one is left: before a write that does not
    /// go through the journal could be undone by replaying it, and at a clean stop.
    pub fn retire_journal(&self) {
        if self.journal_pending.load(Ordering::Acquire) {
            let mut j = self.journal.lock();
            self.retire_pending(&mut j);
        }
    }

    /// At the start of a pool that was stopped cleanly: every write of the last run is in place,
    /// so a journal record still found there is stale and must never be replayed later.
    /// Retires it; returns whether there was one.
    pub fn discard_journal(&self) -> bool {
        let cap = crate::journal::capacity(self.data_offset);
        let live = self.live_drives();
        let found = live
            .iter()
            .any(|d| crate::journal::read(d.as_ref(), cap, self.geo.members).is_some());
        if found {
            crate::journal::retire(&live);
        }
        found
    }

    /// After a crash: writes the newest whole journal record in place again, then retires it.
    /// Returns whether one was replayed.
    pub fn replay_journal(&self) -> bool {
        let cap = crate::journal::capacity(self.data_offset);
        let live = self.live_drives();
        let newest = live
            .iter()
            .filter_map(|d| crate::journal::read(d.as_ref(), cap, self.geo.members))
            .max_by_key(|r| r.0);
        let Some((seq, entries)) = newest else {
            return false;
        };
        let mut bufs: Vec<(usize, u64, AlignedBuf)> = entries
            .into_iter()
            .filter(|(m, _, _)| self.writable(*m))
            .map(|(m, off, b)| (m, off, AlignedBuf::from_slice(&b)))
            .collect();
        let mut ops: Vec<Op> = bufs
            .iter_mut()
            .map(|(m, off, b)| Op::write(*m, *off, b))
            .collect();
        self.run(&mut ops);
        let _ = self.flush();
        crate::journal::retire(&live);
        let mut j = self.journal.lock();
        j.seq = seq + 1;
        j.pending.clear();
        self.journal_pending.store(false, Ordering::Release);
        true
    }
}
