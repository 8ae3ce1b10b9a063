//! Rebuild: the generic loops that bring members in state Rebuilding up to date, row by row or a
//! window of rows at a time (three windows in flight, `rebuild_pipelined`), under the rows' locks;
//! the strategy rebuilds each group.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};

use super::layout::Window;
use super::{Array, ArrayError, Result};
use crate::aligned::AlignedBuf;
use crate::io::Op;
use crate::superblock::MemberState;

/// The nice value of the rebuild pipeline's reader and writer threads, below the default. They
/// mostly wait on drives and hand work on, so they take little CPU; but when one wakes while
/// the computation and other work hold every core, the scheduler let it wait for a time slice
/// (about 5 ms, in 100 of 240 windows of an idle rebuild on two cores) and the drives idled
/// meanwhile: at -10 the simulated 16-drive rebuild went from 0.81-0.82 to 0.89 of the new
/// drive's rate (docs/PERFORMANCE.md).
const IO_THREAD_NICE: i32 = -10;

/// Gives this thread [`IO_THREAD_NICE`] where the process may (CAP_SYS_NICE or RLIMIT_NICE);
/// elsewhere it keeps the default priority, as before.
fn favour_this_thread() {
    // SAFETY: setpriority takes plain values; on Linux PRIO_PROCESS with 0 names the calling
    // thread alone.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, IO_THREAD_NICE) };
}

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

    /// Waits for what this thread gave the members (see `Drive::settle`).
    fn settle_members(&self) {
        for d in self.drives.load().iter() {
            d.settle();
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

    /// Rows per rebuild batch: about 1 MiB of each member, large sequential I/O for every drive
    /// (unless set with `set_rebuild_batch_rows`).
    pub fn rebuild_batch_rows(&self) -> u64 {
        match self.rebuild_batch.load(Ordering::Relaxed) {
            0 => ((1 << 20) / self.geo.strip).max(1),
            n => n,
        }
    }

    /// (smallest, first, largest) rows per batch of an adaptive rebuild: from an eighth of the
    /// default batch under client load to four times it idle; exactly the rows set with
    /// `set_rebuild_batch_rows`.
    pub fn rebuild_batch_bounds(&self) -> (u64, u64, u64) {
        let n = self.rebuild_batch_rows();
        if self.rebuild_batch.load(Ordering::Relaxed) != 0 {
            return (n, n, n);
        }
        ((n / 8).max(1), n, n * 4)
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

    /// Rebuilds from row `start` as a pipeline of three batches: while one batch is written to
    /// its targets (on a writer thread), the next one's strips are computed here and the one
    /// after is read (on a reader thread with its own ring), so the surviving drives, the CPU and
    /// the new drive all stay busy; with two stages the computation and the write took turns and
    /// the new drive idled half the time. `between` runs after each batch is written with the
    /// row reached (everything before it rebuilt) and returns the next batch's rows (0: stop).
    /// Returns the row reached.
    pub fn rebuild_pipelined(
        &self,
        start: u64,
        first_count: u64,
        mut between: impl FnMut(u64) -> u64,
    ) -> Result<u64> {
        // Three windows in flight lock disjoint shards (see `locks`), so no stage ever waits
        // on a window another stage holds.
        let cap = (super::locks::SHARDS / 3) as u64;
        let rows = self.geo.rows();
        let mut at = start.min(rows);
        let mut count = first_count.clamp(1, cap).min(rows - at);
        if count == 0 {
            return Ok(at);
        }
        std::thread::scope(|s| {
            let (ask, asked) = std::sync::mpsc::channel::<(u64, u64)>();
            let (give, given) = std::sync::mpsc::channel::<Loaded>();
            // Written windows' buffers go back to the reader, whose `scratch` reuses them
            // instead of allocating and zeroing a batch of buffers every window.
            let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<AlignedBuf>>();
            s.spawn(move || self.read_ahead(asked, give, spent_rx));
            let (write, to_write) = std::sync::mpsc::channel::<Computed>();
            let (wrote, written) = std::sync::mpsc::channel::<Result<u64>>();
            s.spawn(move || self.write_behind(to_write, wrote, spent_tx));
            ask.send((at, count))
                .expect("the reader lives as long as the scope");
            let mut size = count;
            // The row reached by the last window written, and whether one is being written.
            let mut reached = at;
            let mut writing = false;
            let wait_write = |writing: &mut bool| match std::mem::take(writing) {
                true => written.recv().expect("the writer answers").map(Some),
                false => Ok(None),
            };
            loop {
                let cur = given.recv().expect("the reader answers every request");
                let next_at = at + count;
                let next = size.min(cap).min(rows - next_at);
                if next > 0 {
                    ask.send((next_at, next)).expect("the reader lives");
                }
                // A window to go row by row (or an error) waits for the one before to be
                // written, so checkpoints move in order; any other is computed meanwhile.
                let in_order = cur.guard.is_none() || cur.error.is_some();
                let (computed, after) = match in_order {
                    true => (None, Some(cur)),
                    false => (self.compute_window(cur)?, None),
                };
                if let Some(r) = wait_write(&mut writing)? {
                    reached = r;
                }
                if let Some(l) = after {
                    self.compute_window(l)?;
                }
                match computed {
                    Some(c) => {
                        write.send(c).expect("the writer lives");
                        writing = true;
                    }
                    None => reached = next_at,
                }
                let wanted = between(reached);
                if next == 0 || wanted == 0 {
                    // A window read ahead but not wanted is dropped with its locks, unwritten;
                    // the one being written is told, so the checkpoint saved is where the
                    // members are.
                    if let Some(r) = wait_write(&mut writing)? {
                        reached = r;
                        between(reached);
                    }
                    return Ok(reached);
                }
                (at, count, size) = (next_at, next, wanted);
            }
        })
    }

    /// The pipeline's reader: loads each window asked for, reusing the buffers of windows
    /// written since.
    fn read_ahead<'a>(
        &'a self,
        asked: Receiver<(u64, u64)>,
        give: Sender<Loaded<'a>>,
        spent: Receiver<Vec<AlignedBuf>>,
    ) {
        favour_this_thread();
        for (first, count) in asked {
            crate::aligned::recycle(spent.try_iter().flatten());
            let loaded = self.load_window(first, count);
            self.settle_members();
            if give.send(loaded).is_err() {
                break;
            }
        }
    }

    /// The pipeline's writer: writes each computed window, answers with the row reached, and
    /// hands its buffers back to the reader.
    fn write_behind(
        &self,
        to_write: Receiver<Computed>,
        wrote: Sender<Result<u64>>,
        spent_to: Sender<Vec<AlignedBuf>>,
    ) {
        favour_this_thread();
        for c in to_write {
            let end = c.first + c.count;
            let mut spent = Vec::new();
            let r = self.write_window(c, &mut spent).map(|()| end);
            let _ = spent_to.send(spent);
            if wrote.send(r).is_err() {
                break;
            }
        }
    }

    /// Locks and reads a window (see `rebuild_rows`), or says to go row by row.
    fn load_window(&self, first: u64, count: u64) -> Loaded<'_> {
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
                return l;
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
                    return l;
                }
            }
        }
        l
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
    fn compute_window<'a>(&self, l: Loaded<'a>) -> Result<Option<Computed<'a>>> {
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
        self.advance_rebuilt(&c.targets, c.first + c.count);
        self.offline_or_ok()
    }
}

/// One group's part of a loaded window: (group, its members, the sources, a buffer per member).
type GroupRead = (usize, Vec<usize>, Vec<usize>, Vec<AlignedBuf>);

/// A rebuild window read under its rows' locks, waiting for its parity and writes; without a
/// guard it is rebuilt row by row.
struct Loaded<'a> {
    first: u64,
    count: u64,
    targets: Vec<usize>,
    guard: Option<super::locks::RowGuard<'a>>,
    groups: Vec<GroupRead>,
    error: Option<ArrayError>,
}

/// A window whose targets are computed, waiting to be written under its rows' locks.
struct Computed<'a> {
    first: u64,
    count: u64,
    targets: Vec<usize>,
    guard: super::locks::RowGuard<'a>,
    /// Each group's members and a buffer per member (the targets' ones rebuilt).
    groups: Vec<(Vec<usize>, Vec<AlignedBuf>)>,
}
