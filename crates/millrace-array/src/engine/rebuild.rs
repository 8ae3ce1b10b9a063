//! Rebuild: the generic loops that bring members in state Rebuilding up to date, row by row or a
//! window of rows at a time, under the rows' locks; the strategy rebuilds each group.

use std::sync::atomic::Ordering;

use super::layout::Window;
use super::{Array, ArrayError, Result};
use crate::aligned::AlignedBuf;
use crate::io::Op;
use crate::superblock::MemberState;

impl Array {
    /// Members being rebuilt whose checkpoint has not passed `row`.
    fn rebuild_targets(&self, row: u64) -> Vec<usize> {
        (0..self.geo.members)
            .filter(|&m| {
                self.member_state(m) == MemberState::Rebuilding
                    && self.rebuilt_rows[m].load(Ordering::Acquire) <= row
            })
            .collect()
    }

    /// Moves the checkpoint of `targets` (still being rebuilt) to `rows`.
    fn advance_rebuilt(&self, targets: &[usize], rows: u64) {
        for &m in targets {
            if self.member_state(m) == MemberState::Rebuilding {
                self.rebuilt_rows[m].store(rows, Ordering::Release);
            }
        }
    }

    fn offline_or_ok(&self) -> Result<()> {
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Rebuilds row `row` onto the members in state Rebuilding that have not passed it yet,
    /// from the rest of their groups, and moves their checkpoint past it.
    pub fn rebuild_row(&self, row: u64) -> Result<()> {
        // Each failed attempt takes at least one member out of service, so this ends.
        for _ in 0..=self.geo.members {
            let targets = self.rebuild_targets(row);
            if targets.is_empty() {
                return Ok(());
            }
            if self.try_rebuild_row(row, &targets)? {
                self.advance_rebuilt(&targets, row + 1);
                return self.offline_or_ok();
            }
        }
        self.offline_or_ok()
    }

    fn try_rebuild_row(&self, row: u64, targets: &[usize]) -> Result<bool> {
        let fs = self.geo.full_stripe_bytes();
        let _g = self.lock_rows(row * fs, fs);
        for group in 0..self.geo.groups() {
            let tgt: Vec<usize> = targets
                .iter()
                .copied()
                .filter(|m| self.geo.group_members(group).contains(m))
                .collect();
            if !tgt.is_empty() && !self.layout.rebuild_group(self, row, group, &tgt)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Rows per rebuild batch: about 1 MiB of each member, large sequential I/O for every drive.
    pub fn rebuild_batch_rows(&self) -> u64 {
        ((1 << 20) / self.geo.strip).max(1)
    }

    /// Rebuilds rows `first..first + count` as one batch: one contiguous read per surviving
    /// member and one contiguous write per target, instead of a strip-sized round trip per row,
    /// which left a rebuild waiting out every drive's latency twice per strip. Falls back to
    /// [`Array::rebuild_row`] row by row where the window is not uniform (a member part-way
    /// through its own rebuild inside it) or an I/O fails.
    pub fn rebuild_rows(&self, first: u64, count: u64) -> Result<()> {
        let geo = self.geo;
        let count = count.min(geo.rows().saturating_sub(first));
        if count <= 1 {
            return if count == 1 {
                self.rebuild_row(first)
            } else {
                Ok(())
            };
        }
        let targets = self.rebuild_targets(first);
        if targets.is_empty() {
            return Ok(());
        }
        // Every other member must be plainly in or out of service across the whole window.
        let uniform = (0..geo.members).all(|m| {
            targets.contains(&m) || self.readable(m, first) == self.readable(m, first + count - 1)
        });
        let whole = uniform && {
            let fs = geo.full_stripe_bytes();
            let _g = self.lock_rows(first * fs, count * fs);
            self.rebuild_window_groups(first, count, &targets)?
        };
        if !whole {
            return (first..first + count).try_for_each(|r| self.rebuild_row(r));
        }
        self.advance_rebuilt(&targets, first + count);
        self.offline_or_ok()
    }

    /// Rebuilds a window in every group holding a target. Ok(false): a read failed.
    fn rebuild_window_groups(&self, first: u64, count: u64, targets: &[usize]) -> Result<bool> {
        let geo = self.geo;
        for group in 0..geo.groups() {
            let members: Vec<usize> = geo.group_members(group).collect();
            if !targets.iter().any(|t| members.contains(t)) {
                continue;
            }
            let sources: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&m| !targets.contains(&m) && self.readable(m, first))
                .collect();
            let lost = members.len() - sources.len();
            let tolerance = geo.tolerance_per_group();
            if sources.is_empty() || lost > tolerance {
                return Err(ArrayError::Offline {
                    group,
                    lost,
                    tolerance,
                });
            }
            let w = Window {
                first,
                count,
                group,
                members: &members,
                sources: &sources,
                targets,
            };
            if !self.rebuild_window(&w) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One group's window: read the strategy's readers, let it fill the targets, write them.
    fn rebuild_window(&self, w: &Window) -> bool {
        let span = self.geo.strip as usize * w.count as usize;
        let off = self.member_offset(w.first, 0);
        // One buffer per group member, indexed by position in `members`.
        let mut bufs: Vec<AlignedBuf> = w
            .members
            .iter()
            .map(|_| crate::aligned::scratch(span))
            .collect();
        let readers = self.layout.window_readers(w);
        let mut ops: Vec<Op> = bufs
            .iter_mut()
            .zip(w.members)
            .filter(|(_, m)| readers.contains(m))
            .map(|(b, &m)| Op::read(m, off, b))
            .collect();
        if !self.run(&mut ops) {
            return false;
        }
        drop(ops);
        self.layout.rebuild_window(self, w, &mut bufs);
        let mut ops: Vec<Op> = bufs
            .iter()
            .zip(w.members)
            .filter(|(_, m)| w.targets.contains(m))
            .map(|(b, &m)| Op::write(m, off, b))
            .collect();
        self.run(&mut ops);
        drop(ops);
        crate::aligned::recycle(bufs);
        true
    }
}
