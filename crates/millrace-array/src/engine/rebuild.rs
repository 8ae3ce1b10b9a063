//! Rebuild: the generic loops that bring members in state Rebuilding up to date, row by row or a
//! window of rows at a time (`rebuild_rows`; many windows at once in `pipeline`), under the
//! rows' locks; the strategy rebuilds each group.

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
    pub(super) fn advance_rebuilt(&self, targets: &[usize], rows: u64) {
        for &m in targets {
            if self.member_state(m) == MemberState::Rebuilding {
                self.rebuilt_rows[m].store(rows, Ordering::Release);
            }
        }
    }

    /// Waits for what this thread gave the members (see `Drive::settle`).
    pub(super) fn settle_members(&self) {
        for d in self.drives.load().iter() {
            d.settle();
        }
    }

    pub(super) fn offline_or_ok(&self) -> Result<()> {
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

    /// Rows per rebuild batch: about 1 MiB of each member, large sequential I/O for every drive
    /// (unless set with `set_rebuild_batch_rows`).
    pub fn rebuild_batch_rows(&self) -> u64 {
        match self.rebuild_batch.load(Ordering::Relaxed) {
            0 => ((1 << 20) / self.geo.strip).max(1),
            n => n,
        }
    }

    /// Sets the rows per rebuild batch (0: the default), for tests that want many batches.
    pub fn set_rebuild_batch_rows(&self, rows: u64) {
        self.rebuild_batch.store(rows, Ordering::Relaxed);
    }

    /// Rebuilds rows `first..first + count` as one batch: one contiguous read per surviving
    /// member and one contiguous write per target, instead of a strip-sized round trip per row,
    /// which left a rebuild waiting out every drive's latency twice per strip. Falls back to
    /// [`Array::rebuild_row`] row by row where the window is not uniform (a member part-way
    /// through its own rebuild inside it) or an I/O fails.
    pub fn rebuild_rows(&self, first: u64, count: u64) -> Result<()> {
        let count = count.min(self.geo.rows().saturating_sub(first));
        self.finish_window(self.load_window(first, count))
    }

    /// Locks and reads a window (see `rebuild_rows`), or says to go row by row.
    fn load_window(&self, first: u64, count: u64) -> Loaded<'_> {
        let mut l = self.lock_window(first, count);
        self.read_locked(&mut l);
        l
    }

    /// Plans a window and takes its rows' locks; without them (a window to go row by row) when
    /// it is not uniform.
    pub(super) fn lock_window(&self, first: u64, count: u64) -> Loaded<'_> {
        let geo = self.geo;
        let mut l = Loaded {
            first,
            count,
            targets: self.rebuild_targets(first),
            guard: None,
            groups: Vec::new(),
            error: None,
        };
        if count <= 1 || l.targets.is_empty() {
            return l;
        }
        // Every other member must be plainly in or out of service across the whole window.
        let uniform = (0..geo.members).all(|m| {
            l.targets.contains(&m) || self.readable(m, first) == self.readable(m, first + count - 1)
        });
        if !uniform {
            return l;
        }
        let fs = geo.full_stripe_bytes();
        l.guard = Some(self.lock_rows(first * fs, count * fs));
        l
    }

    /// Reads each group of a window `lock_window` locked, or says to go row by row.
    pub(super) fn read_locked(&self, l: &mut Loaded) {
        if l.guard.is_none() {
            return;
        }
        let (geo, first, count) = (self.geo, l.first, l.count);
        for group in 0..geo.groups() {
            let members: Vec<usize> = geo.group_members(group).collect();
            if !l.targets.iter().any(|t| members.contains(t)) {
                continue;
            }
            let sources: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&m| !l.targets.contains(&m) && self.readable(m, first))
                .collect();
            let lost = members.len() - sources.len();
            let tolerance = geo.tolerance_per_group();
            if sources.is_empty() || lost > tolerance {
                l.error = Some(ArrayError::Offline {
                    group,
                    lost,
                    tolerance,
                });
                return;
            }
            let w = Window {
                first,
                count,
                group,
                members: &members,
                sources: &sources,
                targets: &l.targets,
            };
            match self.read_window(&w) {
                Some(bufs) => l.groups.push((group, members, sources, bufs)),
                None => {
                    // A read failed: row by row, planning around the member that failed.
                    l.guard = None;
                    l.groups.clear();
                    return;
                }
            }
        }
    }

    /// One group's window: the strategy's readers, read. None: a read failed.
    fn read_window(&self, w: &Window) -> Option<Vec<AlignedBuf>> {
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
        let ok = self.run(&mut ops);
        drop(ops);
        if ok {
            Some(bufs)
        } else {
            crate::aligned::recycle(bufs);
            None
        }
    }

    /// Computes a loaded window's targets and writes them, then moves their checkpoint.
    fn finish_window(&self, l: Loaded) -> Result<()> {
        let Some(c) = self.compute_window(l)? else {
            return Ok(());
        };
        let mut spent = Vec::new();
        let r = self.write_window(c, &mut spent);
        crate::aligned::recycle(spent);
        r
    }

    /// Computes a loaded window's targets in its buffers; None when there is nothing to write
    /// (no targets, or a window that had to be rebuilt row by row, done here).
    pub(super) fn compute_window<'a>(&self, l: Loaded<'a>) -> Result<Option<Computed<'a>>> {
        if let Some(e) = l.error {
            return Err(e);
        }
        if l.targets.is_empty() || l.count == 0 {
            return Ok(None);
        }
        let Some(guard) = l.guard else {
            (l.first..l.first + l.count).try_for_each(|r| self.rebuild_row(r))?;
            return Ok(None);
        };
        let mut groups = Vec::with_capacity(l.groups.len());
        for (group, members, sources, mut bufs) in l.groups {
            let w = Window {
                first: l.first,
                count: l.count,
                group,
                members: &members,
                sources: &sources,
                targets: &l.targets,
            };
            self.layout.rebuild_window(self, &w, &mut bufs);
            groups.push((members, bufs));
        }
        Ok(Some(Computed {
            first: l.first,
            count: l.count,
            targets: l.targets,
            guard,
            groups,
        }))
    }

    /// Writes a computed window to its targets, then moves their checkpoint; its buffers go to
    /// `spent`.
    fn write_window(&self, c: Computed, spent: &mut Vec<AlignedBuf>) -> Result<()> {
        let (targets, end) = (c.targets.clone(), c.first + c.count);
        self.write_window_data(c, spent);
        self.advance_rebuilt(&targets, end);
        self.offline_or_ok()
    }

    /// Writes a computed window to its targets and releases its rows; its buffers go to
    /// `spent`. A write that fails takes its member out of service (see `run`), which the
    /// caller finds before it moves the checkpoint.
    pub(super) fn write_window_data(&self, c: Computed, spent: &mut Vec<AlignedBuf>) {
        let off = self.member_offset(c.first, 0);
        for (members, bufs) in c.groups {
            let mut ops: Vec<Op> = bufs
                .iter()
                .zip(&members)
                .filter(|(_, m)| c.targets.contains(m))
                .map(|(b, &m)| Op::write(m, off, b))
                .collect();
            self.run(&mut ops);
            drop(ops);
            spent.extend(bufs);
        }
        self.settle_members();
        drop(c.guard);
    }
}

/// One group's part of a loaded window: (group, its members, the sources, a buffer per member).
type GroupRead = (usize, Vec<usize>, Vec<usize>, Vec<AlignedBuf>);

/// A rebuild window read under its rows' locks, waiting for its parity and writes; without a
/// guard it is rebuilt row by row.
pub(super) struct Loaded<'a> {
    pub(super) first: u64,
    pub(super) count: u64,
    pub(super) targets: Vec<usize>,
    pub(super) guard: Option<super::locks::RowGuard<'a>>,
    groups: Vec<GroupRead>,
    pub(super) error: Option<ArrayError>,
}

/// A window whose targets are computed, waiting to be written under its rows' locks.
pub(super) struct Computed<'a> {
    first: u64,
    count: u64,
    targets: Vec<usize>,
    guard: super::locks::RowGuard<'a>,
    /// Each group's members and a buffer per member (the targets' ones rebuilt).
    groups: Vec<(Vec<usize>, Vec<AlignedBuf>)>,
}
