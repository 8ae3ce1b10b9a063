//! The RAID engine: turns byte-addressed reads and writes of a pool into member I/O.
//!
//! Writes are planned per (row, group): a full stripe computes parity from new data alone; a
//! partial one reads either the old data and parity (read-modify-write) or the rest of the stripe
//! (reconstruct-write), whichever reads less; a group with a member it cannot read rebuilds the
//! span from what it can read, then writes. All reads of one request go out as one batch, then
//! all writes as another, so every drive works at once. Rows touched by a write are locked, so
//! concurrent writes to one stripe never leave its parity wrong.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::aligned::{is_aligned, AlignedBuf};
use crate::drive::Drive;
use crate::geometry::{Geometry, SECTOR};
use crate::io::{execute, Op};
use crate::superblock::MemberState;
use millrace_block::{BufResult, IoBuf, IoFuture};

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("the range {offset}+{len} bytes lies past the end of the pool ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("the pool is offline: group {group} has lost {lost} of its drives but survives the loss of only {tolerance}; bring drives back (`millrace pool import`) before using it")]
    Offline {
        group: usize,
        lost: usize,
        tolerance: usize,
    },
}

impl From<ArrayError> for io::Error {
    fn from(e: ArrayError) -> io::Error {
        let kind = match e {
            ArrayError::OutOfRange { .. } => io::ErrorKind::InvalidInput,
            ArrayError::Offline { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, ArrayError>;

/// Counters a dashboard or bench reads.
#[derive(Default, Debug)]
pub struct Stats {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    pub full_stripe_writes: AtomicU64,
    pub rmw_writes: AtomicU64,
    pub rcw_writes: AtomicU64,
    pub degraded_writes: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub member_errors: AtomicU64,
}

/// What one member slot moved, counted where member I/O completes (a replacement drive in the
/// slot continues the slot's counts).
#[derive(Default, Debug)]
pub struct MemberStats {
    pub read_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_ops: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
}

/// A member slot with no drive behind it (lost, or never found at import).
pub struct MissingDrive(pub String);

impl Drive for MissingDrive {
    fn describe(&self) -> String {
        self.0.clone()
    }
    fn size_bytes(&self) -> u64 {
        0
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is missing", self.0),
        ))
    }
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is missing", self.0),
        ))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

type FailureHook = Box<dyn Fn(usize, &io::Error) + Send + Sync>;

const LOCK_SHARDS: usize = 1024;

pub struct Array {
    geo: Geometry,
    data_offset: u64,
    /// Swapped whole when a spare or replacement takes a slot; I/O works on a snapshot.
    drives: ArcSwap<Vec<Arc<dyn Drive>>>,
    /// Any member needs aligned buffers (O_DIRECT).
    direct: std::sync::atomic::AtomicBool,
    states: Vec<AtomicU8>,
    /// Rows below this are valid on a member being rebuilt (per member).
    rebuilt_rows: Vec<AtomicU64>,
    locks: Vec<Mutex<()>>,
    on_failure: RwLock<Option<FailureHook>>,
    /// The write-intent bitmap, where the metadata area has room for one.
    bitmap: Option<crate::bitmap::Bitmap>,
    /// Serialises journaled (degraded) writes; holds the next record's sequence number and
    /// the drives that may hold a record not yet retired.
    journal: Mutex<JournalState>,
    /// Some drive may hold a record not yet retired (a cheap check for the healthy write path).
    journal_pending: AtomicBool,
    pub stats: Stats,
    /// Per member slot, in member order.
    pub member_stats: Vec<MemberStats>,
}

/// Where the degraded-write journal stands.
struct JournalState {
    /// The next record's sequence number.
    seq: u64,
    /// The drives holding the last record, not yet retired (see `Array::journaled_write`).
    pending: Vec<Arc<dyn Drive>>,
}

fn state_code(s: MemberState) -> u8 {
    match s {
        MemberState::Online => 1,
        MemberState::Faulty => 2,
        MemberState::Spare => 3,
        MemberState::Rebuilding => 4,
        MemberState::Missing => 5,
    }
}

fn state_from(c: u8) -> MemberState {
    match c {
        1 => MemberState::Online,
        2 => MemberState::Faulty,
        3 => MemberState::Spare,
        4 => MemberState::Rebuilding,
        _ => MemberState::Missing,
    }
}

/// One piece of a request that falls inside one strip.
struct Piece {
    row: u64,
    col: usize,
    /// Offset inside the strip.
    s: u64,
    /// Offset inside the request buffer.
    at: usize,
    len: usize,
}

enum Plan {
    Full,
    Rmw,
    Rcw,
    Rebuild,
}

/// The writes of one request that land in one group of one row.
struct Unit {
    row: u64,
    group: usize,
    /// Members in syndrome order: data 0..k, then P (and Q).
    layout: Vec<usize>,
    /// (data index, offset in strip, offset in request, length)
    writes: Vec<(usize, u64, usize, usize)>,
    lo: u64,
    hi: u64,
    plan: Plan,
    /// Span [lo, hi) buffers per layout position, as the plan needs them.
    span: Vec<Option<AlignedBuf>>,
    /// Old contents of each write (read-modify-write).
    old: Vec<AlignedBuf>,
    /// Layout positions this attempt could not read (fixed at planning time).
    missing: Vec<usize>,
}

impl Array {
    pub fn new(
        geo: Geometry,
        data_offset: u64,
        drives: Vec<Arc<dyn Drive>>,
        states: &[MemberState],
    ) -> Array {
        assert_eq!(drives.len(), geo.members);
        assert_eq!(states.len(), geo.members);
        let direct = drives.iter().any(|d| d.direct());
        Array {
            geo,
            data_offset,
            drives: ArcSwap::from_pointee(drives),
            direct: direct.into(),
            states: states
                .iter()
                .map(|s| AtomicU8::new(state_code(*s)))
                .collect(),
            rebuilt_rows: (0..geo.members).map(|_| AtomicU64::new(0)).collect(),
            locks: (0..LOCK_SHARDS).map(|_| Mutex::new(())).collect(),
            on_failure: RwLock::new(None),
            bitmap: crate::bitmap::region_rows(geo.rows(), geo.strip, data_offset)
                .filter(|_| geo.tolerance_per_group() > 0)
                .map(|rr| crate::bitmap::Bitmap::new(geo.rows(), rr)),
            journal: Mutex::new(JournalState {
                seq: 1,
                pending: Vec::new(),
            }),
            journal_pending: AtomicBool::new(false),
            stats: Stats::default(),
            member_stats: (0..geo.members).map(|_| MemberStats::default()).collect(),
        }
    }

    pub fn bitmap(&self) -> Option<&crate::bitmap::Bitmap> {
        self.bitmap.as_ref()
    }

    fn live_drives(&self) -> Vec<Arc<dyn Drive>> {
        let d = self.drives.load();
        (0..self.geo.members)
            .filter(|&m| self.writable(m))
            .map(|m| d[m].clone())
            .collect()
    }

    /// Row ranges the on-disk bitmaps mark as possibly inconsistent (after a crash).
    pub fn dirty_rows(&self) -> Vec<std::ops::Range<u64>> {
        match &self.bitmap {
            Some(b) => {
                let rows = self.geo.rows();
                b.read_dirty(&self.live_drives())
                    .into_iter()
                    .map(|r| r.start..r.end.min(rows))
                    .collect()
            }
            None => std::iter::once(0..self.geo.rows()).collect(),
        }
    }

    /// Flushes, then clears the write-intent bitmap: everything written so far is consistent.
    pub fn settle(&self) -> Result<()> {
        self.flush()?;
        self.retire_journal();
        if let Some(b) = &self.bitmap {
            b.clear(&self.live_drives());
        }
        Ok(())
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn size_bytes(&self) -> u64 {
        self.geo.size_bytes()
    }

    /// A snapshot of the member drives in layout order.
    pub fn drives(&self) -> Arc<Vec<Arc<dyn Drive>>> {
        self.drives.load_full()
    }

    /// Puts a new drive in slot `m` (a spare or a replacement) in state Rebuilding, with nothing
    /// rebuilt yet: reads of the slot come from redundancy until rebuild has passed them.
    pub fn install_member(&self, m: usize, drive: Arc<dyn Drive>, rebuilt_rows: u64) {
        if drive.direct() {
            self.direct.store(true, Ordering::Release);
        }
        if let Some(b) = &self.bitmap {
            b.copy_to(&drive);
        }
        let mut v: Vec<Arc<dyn Drive>> = self.drives.load().as_ref().clone();
        v[m] = drive;
        self.rebuilt_rows[m].store(rebuilt_rows, Ordering::Release);
        self.states[m].store(state_code(MemberState::Rebuilding), Ordering::Release);
        self.drives.store(Arc::new(v));
    }

    /// Rows below `rows` hold valid data on rebuilding member `m` (a resumed rebuild).
    pub fn set_rebuilt_rows(&self, m: usize, rows: u64) {
        self.rebuilt_rows[m].store(rows, Ordering::Release);
    }

    /// The lowest checkpoint among members being rebuilt, if any.
    pub fn rebuild_progress(&self) -> Option<u64> {
        (0..self.geo.members)
            .filter(|&m| self.member_state(m) == MemberState::Rebuilding)
            .map(|m| self.rebuilt_rows[m].load(Ordering::Acquire))
            .min()
    }

    pub fn set_member_state(&self, m: usize, s: MemberState) {
        self.states[m].store(state_code(s), Ordering::Release);
    }

    pub fn member_state(&self, m: usize) -> MemberState {
        state_from(self.states[m].load(Ordering::Acquire))
    }

    pub fn member_states(&self) -> Vec<MemberState> {
        (0..self.geo.members)
            .map(|m| self.member_state(m))
            .collect()
    }

    /// Called (from the I/O path) whenever a member is marked faulty, so the pool can record it.
    pub fn set_failure_hook(&self, hook: FailureHook) {
        *self.on_failure.write() = Some(hook);
    }

    /// Takes a member out of service. Returns false if it was not in service.
    pub fn fail_member(&self, m: usize, why: &io::Error) -> bool {
        let cur = self.states[m].load(Ordering::Acquire);
        if cur != state_code(MemberState::Online) && cur != state_code(MemberState::Rebuilding) {
            return false;
        }
        if self.states[m]
            .compare_exchange(
                cur,
                state_code(MemberState::Faulty),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
        tracing::warn!(
            "member {m} ({}) marked faulty: {why}",
            self.drives.load()[m].describe()
        );
        if let Some(h) = self.on_failure.read().as_ref() {
            h(m, why);
        }
        true
    }

    fn readable(&self, m: usize, row: u64) -> bool {
        match self.member_state(m) {
            MemberState::Online => true,
            MemberState::Rebuilding => row < self.rebuilt_rows[m].load(Ordering::Acquire),
            _ => false,
        }
    }

    fn writable(&self, m: usize) -> bool {
        matches!(
            self.member_state(m),
            MemberState::Online | MemberState::Rebuilding
        )
    }

    fn all_online(&self) -> bool {
        (0..self.geo.members).all(|m| self.member_state(m) == MemberState::Online)
    }

    /// Whether each group can still serve: the pool's health at a glance.
    pub fn offline_group(&self) -> Option<ArrayError> {
        let tol = self.geo.tolerance_per_group();
        for g in 0..self.geo.groups() {
            let lost = self
                .geo
                .group_members(g)
                .filter(|&m| !self.readable(m, 0) && !self.writable(m))
                .count();
            if lost > tol {
                return Some(ArrayError::Offline {
                    group: g,
                    lost,
                    tolerance: tol,
                });
            }
        }
        None
    }

    fn member_offset(&self, row: u64, s: u64) -> u64 {
        self.data_offset + row * self.geo.strip + s
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if !self.all_online() {
            // A pool that lost more than it survives serves nothing, not even the strips it
            // still has: half an answer is how wrong data reaches a client.
            if let Some(e) = self.offline_group() {
                return Err(e);
            }
        }
        let size = self.size_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(ArrayError::OutOfRange { offset, len, size }),
        }
    }

    fn pieces(&self, offset: u64, len: usize) -> Vec<Piece> {
        let strip = self.geo.strip;
        let cols = self.geo.data_cols() as u64;
        let mut v = Vec::new();
        let mut pos = offset;
        let end = offset + len as u64;
        while pos < end {
            let k = pos / strip;
            let s = pos % strip;
            let n = (strip - s).min(end - pos);
            v.push(Piece {
                row: k / cols,
                col: (k % cols) as usize,
                s,
                at: (pos - offset) as usize,
                len: n as usize,
            });
            pos += n;
        }
        v
    }

    /// Locks the rows of [offset, offset+len) in shard order, so two requests never wait on
    /// each other in a cycle.
    fn lock_rows(&self, offset: u64, len: u64) -> Vec<MutexGuard<'_, ()>> {
        if len == 0 {
            return Vec::new();
        }
        let fs = self.geo.full_stripe_bytes();
        let (r0, r1) = (offset / fs, (offset + len - 1) / fs);
        let mut shards: Vec<usize> = if r1 - r0 + 1 >= LOCK_SHARDS as u64 {
            (0..LOCK_SHARDS).collect()
        } else {
            (r0..=r1)
                .map(|r| (r % LOCK_SHARDS as u64) as usize)
                .collect()
        };
        shards.sort_unstable();
        shards.dedup();
        shards.into_iter().map(|i| self.locks[i].lock()).collect()
    }

    fn needs_bounce(&self, offset: u64, buf: &[u8]) -> bool {
        !offset.is_multiple_of(SECTOR)
            || !(buf.len() as u64).is_multiple_of(SECTOR)
            || (!is_aligned(buf) && self.direct.load(Ordering::Relaxed))
    }

    /// Reads `buf.len()` bytes at any offset.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.stats.read_ops.fetch_add(1, Ordering::Relaxed);
        self.stats
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        if !self.needs_bounce(offset, buf) {
            return self.read_sectors(offset, buf, false);
        }
        let a0 = offset / SECTOR * SECTOR;
        let a1 = (offset + buf.len() as u64).div_ceil(SECTOR) * SECTOR;
        let mut tmp = AlignedBuf::zeroed((a1 - a0) as usize);
        self.read_sectors(a0, &mut tmp, false)?;
        let from = (offset - a0) as usize;
        buf.copy_from_slice(&tmp[from..from + buf.len()]);
        Ok(())
    }

    /// Writes `data` at any offset.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.stats.write_ops.fetch_add(1, Ordering::Relaxed);
        self.stats
            .write_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let a0 = offset / SECTOR * SECTOR;
        let a1 = (offset + data.len() as u64).div_ceil(SECTOR) * SECTOR;
        let _guards = self.lock_rows(a0, a1 - a0);
        if let Some(b) = &self.bitmap {
            // The intent is durable before the first byte of the region changes, so a crash
            // anywhere in this write is found and resynced.
            let fs = self.geo.full_stripe_bytes();
            b.mark(a0 / fs, (a1 - 1) / fs, &self.live_drives());
        }
        if !self.needs_bounce(offset, data) {
            return self.write_sectors(offset, data);
        }
        // Unaligned edges: read the sectors they share with other data, under the same locks.
        let mut tmp = AlignedBuf::zeroed((a1 - a0) as usize);
        let end = offset + data.len() as u64;
        if offset != a0 {
            self.read_sectors(a0, &mut tmp[..SECTOR as usize], true)?;
        }
        if end != a1 && (a1 - SECTOR != a0 || offset == a0) {
            let at = (a1 - a0 - SECTOR) as usize;
            self.read_sectors(a1 - SECTOR, &mut tmp[at..], true)?;
        }
        let from = (offset - a0) as usize;
        tmp[from..from + data.len()].copy_from_slice(data);
        self.write_sectors(a0, &tmp)
    }

    /// Makes every completed write durable on every member in service.
    pub fn flush(&self) -> Result<()> {
        let live: Vec<usize> = (0..self.geo.members)
            .filter(|&m| self.writable(m))
            .collect();
        self.flush_members(&self.drives.load_full(), &live);
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Flushes these members all at once (with io_uring, one batch of fsyncs: no thread each);
    /// a member whose flush fails is marked faulty.
    fn flush_members(&self, drives: &Arc<Vec<Arc<dyn Drive>>>, members: &[usize]) {
        let mut ops: Vec<Op> = members.iter().map(|&m| Op::flush(m)).collect();
        let results = execute(drives, &mut ops);
        for (op, r) in ops.iter().zip(results) {
            if let Err(e) = r {
                self.member_stats[op.member]
                    .errors
                    .fetch_add(1, Ordering::Relaxed);
                self.stats.member_errors.fetch_add(1, Ordering::Relaxed);
                if Arc::ptr_eq(&drives[op.member], &self.drives.load()[op.member]) {
                    self.fail_member(op.member, &e);
                }
            }
        }
    }

    /// Runs a batch; marks the members whose I/O failed as faulty. Returns whether all succeeded.
    fn run(&self, ops: &mut [Op]) -> bool {
        let drives = self.drives.load_full();
        let results = execute(&drives, ops);
        let mut ok = true;
        for (op, r) in ops.iter().zip(results) {
            let ms = &self.member_stats[op.member];
            if r.is_ok() {
                let (n, b) = if op.is_write() {
                    (&ms.write_ops, &ms.write_bytes)
                } else {
                    (&ms.read_ops, &ms.read_bytes)
                };
                n.fetch_add(1, Ordering::Relaxed);
                b.fetch_add(op.bytes(), Ordering::Relaxed);
            }
            if let Err(e) = r {
                ok = false;
                ms.errors.fetch_add(1, Ordering::Relaxed);
                self.stats.member_errors.fetch_add(1, Ordering::Relaxed);
                // Only the drive that failed: by now a spare may hold its slot.
                if Arc::ptr_eq(&drives[op.member], &self.drives.load()[op.member]) {
                    self.fail_member(op.member, &e);
                }
            }
        }
        ok
    }

    /// Reads whole sectors. `locked`: the caller holds the rows' locks already.
    fn read_sectors(&self, offset: u64, buf: &mut [u8], locked: bool) -> Result<()> {
        // Each failed attempt takes at least one member out of service, so this ends.
        for _ in 0..=self.geo.members {
            let _guards = if !locked && !self.all_online() {
                self.lock_rows(offset, buf.len() as u64)
            } else {
                Vec::new()
            };
            if self.try_read(offset, buf)? {
                return Ok(());
            }
        }
        Err(self.offline_group().unwrap_or(ArrayError::Offline {
            group: 0,
            lost: self.geo.members,
            tolerance: self.geo.tolerance_per_group(),
        }))
    }

    fn try_read(&self, offset: u64, buf: &mut [u8]) -> Result<bool> {
        let pieces = self.pieces(offset, buf.len());
        let geo = &self.geo;
        // A (row, group) that lost a member some piece needs: every strip it still has is read
        // once over the span the request covers, the lost ones rebuilt, and every piece of the
        // request in that group served from the result.
        struct Degraded {
            row: u64,
            group: usize,
            layout: Vec<usize>,
            lo: u64,
            hi: u64,
            bufs: Vec<AlignedBuf>,
            missing: Vec<usize>,
        }
        let mut degraded: Vec<Degraded> = Vec::new();
        // (piece, member) read straight into the caller's buffer, or (piece, degraded unit).
        let mut direct: Vec<(usize, usize)> = Vec::new();
        let mut via: Vec<(usize, usize)> = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let loc = geo.locate(p.row, p.col);
            if !geo.level.is_parity() {
                let members: Vec<usize> = geo.group_members(loc.group).collect();
                let start = (p.row % members.len() as u64) as usize;
                let pick = (0..members.len())
                    .map(|k| members[(start + k) % members.len()])
                    .find(|&m| self.readable(m, p.row));
                match pick {
                    Some(m) => direct.push((i, m)),
                    None => {
                        return Err(ArrayError::Offline {
                            group: loc.group,
                            lost: members.len(),
                            tolerance: geo.tolerance_per_group(),
                        })
                    }
                }
                continue;
            }
            if let Some(u) = degraded
                .iter()
                .position(|d| d.row == p.row && d.group == loc.group)
            {
                let d = &mut degraded[u];
                d.lo = d.lo.min(p.s);
                d.hi = d.hi.max(p.s + p.len as u64);
                via.push((i, u));
            } else if self.readable(loc.member, p.row) {
                direct.push((i, loc.member));
            } else {
                let layout = geo.group_layout(p.row, loc.group);
                let missing: Vec<usize> = (0..layout.len())
                    .filter(|&k| !self.readable(layout[k], p.row))
                    .collect();
                if missing.len() > geo.level.parity() {
                    return Err(ArrayError::Offline {
                        group: loc.group,
                        lost: missing.len(),
                        tolerance: geo.level.parity(),
                    });
                }
                // Earlier pieces of this group that were to be read directly join the unit.
                let u = degraded.len();
                let (mut lo, mut hi) = (p.s, p.s + p.len as u64);
                direct.retain(|&(j, _)| {
                    let q = &pieces[j];
                    let same = q.row == p.row && geo.locate(q.row, q.col).group == loc.group;
                    if same {
                        lo = lo.min(q.s);
                        hi = hi.max(q.s + q.len as u64);
                        via.push((j, u));
                    }
                    !same
                });
                via.push((i, u));
                degraded.push(Degraded {
                    row: p.row,
                    group: loc.group,
                    layout,
                    lo,
                    hi,
                    bufs: Vec::new(),
                    missing,
                });
            }
        }
        if !degraded.is_empty() {
            self.stats
                .degraded_reads
                .fetch_add(degraded.len() as u64, Ordering::Relaxed);
        }
        for d in degraded.iter_mut() {
            d.bufs = (0..d.layout.len())
                .map(|_| crate::aligned::scratch((d.hi - d.lo) as usize))
                .collect();
        }
        direct.sort_unstable();
        let ok = {
            let mut ops: Vec<Op> = Vec::with_capacity(direct.len() + degraded.len() * 8);
            let mut rest: &mut [u8] = buf;
            let mut consumed = 0usize;
            for &(i, m) in &direct {
                let p = &pieces[i];
                let tail = std::mem::take(&mut rest);
                let (_, tail) = tail.split_at_mut(p.at - consumed);
                let (dst, tail) = tail.split_at_mut(p.len);
                rest = tail;
                consumed = p.at + p.len;
                ops.push(Op::read(m, self.member_offset(p.row, p.s), dst));
            }
            for d in degraded.iter_mut() {
                // One data strip lost and P at hand: P rebuilds it, so Q is not read (on a
                // 16-drive RAID6 that is 14 reads a row instead of 15).
                let k = d.layout.len() - geo.level.parity();
                let skip_q = geo.level.parity() == 2 && d.missing.len() == 1 && d.missing[0] < k;
                for (i, b) in d.bufs.iter_mut().enumerate() {
                    let lost = d.missing.contains(&i);
                    let unneeded_q = skip_q && i == k + 1;
                    let needed = !(lost || unneeded_q);
                    if needed {
                        ops.push(Op::read(d.layout[i], self.member_offset(d.row, d.lo), b));
                    }
                }
            }
            self.run(&mut ops)
        };
        if !ok {
            return Ok(false);
        }
        for d in degraded.iter_mut() {
            let mut strips: Vec<&mut [u8]> = d.bufs.iter_mut().map(|b| &mut b[..]).collect();
            recover(&mut strips, &d.missing, self.geo.level.parity());
        }
        for &(i, u) in &via {
            let p = &pieces[i];
            let d = &degraded[u];
            let idx = geo.locate(p.row, p.col).index;
            let from = (p.s - d.lo) as usize;
            buf[p.at..p.at + p.len].copy_from_slice(&d.bufs[idx][from..from + p.len]);
        }
        for d in degraded {
            crate::aligned::recycle(d.bufs);
        }
        Ok(true)
    }

    /// Writes whole sectors; the caller holds the rows' locks. While a parity pool is degraded
    /// every write goes through the journal, so it is cut at row boundaries into pieces whose
    /// records fit there.
    fn write_sectors(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.geo.level.is_parity() && !self.all_online() {
            let cap = crate::journal::capacity(self.data_offset);
            // Worst case per row: every member's strip, plus room for the header and table.
            let rows = cap.saturating_sub(64 << 10) / (self.geo.members as u64 * self.geo.strip);
            if rows > 0 {
                let fs = self.geo.full_stripe_bytes();
                let end = offset + data.len() as u64;
                let mut pos = offset;
                while pos < end {
                    let next = end.min((pos / fs + rows) * fs);
                    let piece = &data[(pos - offset) as usize..(next - offset) as usize];
                    self.write_sectors_once(pos, piece)?;
                    pos = next;
                }
                return Ok(());
            }
        }
        self.write_sectors_once(offset, data)
    }

    fn write_sectors_once(&self, offset: u64, data: &[u8]) -> Result<()> {
        for _ in 0..=self.geo.members {
            if self.try_write(offset, data)? {
                return Ok(());
            }
        }
        Err(self.offline_group().unwrap_or(ArrayError::Offline {
            group: 0,
            lost: self.geo.members,
            tolerance: self.geo.tolerance_per_group(),
        }))
    }

    /// One attempt at a write. Ok(false): a read failed, members were marked faulty, plan again.
    fn try_write(&self, offset: u64, data: &[u8]) -> Result<bool> {
        let geo = self.geo;
        let pieces = self.pieces(offset, data.len());
        if !geo.level.is_parity() {
            return self.write_mirrored(&pieces, data);
        }
        let mut units: Vec<Unit> = Vec::new();
        for p in &pieces {
            let loc = geo.locate(p.row, p.col);
            let same = units
                .last()
                .is_some_and(|u| u.row == p.row && u.group == loc.group);
            if !same {
                units.push(Unit {
                    row: p.row,
                    group: loc.group,
                    layout: geo.group_layout(p.row, loc.group),
                    writes: Vec::new(),
                    lo: p.s,
                    hi: p.s + p.len as u64,
                    plan: Plan::Full,
                    span: Vec::new(),
                    old: Vec::new(),
                    missing: Vec::new(),
                });
            }
            let u = units.last_mut().unwrap();
            u.writes.push((loc.index, p.s, p.at, p.len));
            u.lo = u.lo.min(p.s);
            u.hi = u.hi.max(p.s + p.len as u64);
        }
        let k = geo.group_data();
        let np = geo.level.parity();
        let strip = geo.strip;
        for u in units.iter_mut() {
            let span = (u.hi - u.lo) as usize;
            u.missing = (0..u.layout.len())
                .filter(|&i| !self.readable(u.layout[i], u.row))
                .collect();
            let missing = &u.missing;
            let full =
                u.writes.len() == k && u.writes.iter().all(|w| w.1 == 0 && w.3 as u64 == strip);
            u.plan = if full {
                Plan::Full
            } else if !missing.is_empty() {
                if missing.len() > np {
                    return Err(ArrayError::Offline {
                        group: u.group,
                        lost: missing.len(),
                        tolerance: np,
                    });
                }
                Plan::Rebuild
            } else {
                let rmw: usize = u.writes.iter().map(|w| w.3).sum::<usize>() + np * span;
                let covering = u
                    .writes
                    .iter()
                    .filter(|w| w.1 == u.lo && w.3 == span)
                    .count();
                let rcw = (k - covering) * span;
                if rmw <= rcw {
                    Plan::Rmw
                } else {
                    Plan::Rcw
                }
            };
            let n = u.layout.len();
            u.span = (0..n).map(|_| None).collect();
            match u.plan {
                Plan::Full => {
                    self.stats
                        .full_stripe_writes
                        .fetch_add(1, Ordering::Relaxed);
                    for i in k..n {
                        u.span[i] = Some(AlignedBuf::zeroed(span));
                    }
                }
                Plan::Rmw => {
                    self.stats.rmw_writes.fetch_add(1, Ordering::Relaxed);
                    for i in k..n {
                        u.span[i] = Some(AlignedBuf::zeroed(span));
                    }
                    u.old = u.writes.iter().map(|w| AlignedBuf::zeroed(w.3)).collect();
                }
                Plan::Rcw => {
                    self.stats.rcw_writes.fetch_add(1, Ordering::Relaxed);
                    for i in 0..n {
                        let covered = u
                            .writes
                            .iter()
                            .any(|w| w.0 == i && w.1 == u.lo && w.3 == span);
                        if !covered {
                            u.span[i] = Some(AlignedBuf::zeroed(span));
                        }
                    }
                }
                Plan::Rebuild => {
                    self.stats.degraded_writes.fetch_add(1, Ordering::Relaxed);
                    for i in 0..n {
                        u.span[i] = Some(AlignedBuf::zeroed(span));
                    }
                }
            }
        }

        // Read phase.
        let ok = {
            let mut ops: Vec<Op> = Vec::new();
            for u in units.iter_mut() {
                let (row, lo) = (u.row, u.lo);
                match u.plan {
                    Plan::Full => {}
                    Plan::Rmw => {
                        for (w, old) in u.writes.iter().zip(u.old.iter_mut()) {
                            let m = u.layout[w.0];
                            ops.push(Op::read(m, self.member_offset(row, w.1), old));
                        }
                        for (b, &m) in u.span[k..].iter_mut().zip(&u.layout[k..]) {
                            let b = b.as_mut().unwrap();
                            ops.push(Op::read(m, self.member_offset(row, lo), b));
                        }
                    }
                    Plan::Rcw => {
                        for (b, &m) in u.span[..k].iter_mut().zip(&u.layout[..k]) {
                            if let Some(b) = b.as_mut() {
                                ops.push(Op::read(m, self.member_offset(row, lo), b));
                            }
                        }
                    }
                    Plan::Rebuild => {
                        for (i, b) in u.span.iter_mut().enumerate() {
                            let m = u.layout[i];
                            if !u.missing.contains(&i) {
                                ops.push(Op::read(
                                    m,
                                    self.member_offset(row, lo),
                                    b.as_mut().unwrap(),
                                ));
                            }
                        }
                    }
                }
            }
            self.run(&mut ops)
        };
        if !ok {
            return Ok(false);
        }

        // Compute phase.
        for u in units.iter_mut() {
            let lo = u.lo;
            let span = (u.hi - u.lo) as usize;
            match u.plan {
                Plan::Full => {
                    let mut srcs: Vec<&[u8]> = vec![&[]; k];
                    for w in &u.writes {
                        srcs[w.0] = &data[w.2..w.2 + w.3];
                    }
                    gen_parity(&srcs, &mut u.span[k..], np);
                }
                Plan::Rmw => {
                    let (_, par) = u.span.split_at_mut(k);
                    for (w, old) in u.writes.iter().zip(u.old.iter_mut()) {
                        // old ^= new gives the delta that P and Q must absorb.
                        millrace_parity::xor_into(old, &data[w.2..w.2 + w.3]);
                        let at = (w.1 - lo) as usize;
                        let p = par[0].as_mut().unwrap();
                        millrace_parity::xor_into(&mut p[at..at + w.3], old);
                        if np == 2 {
                            let q = par[1].as_mut().unwrap();
                            millrace_parity::mul_xor_into(
                                millrace_parity::gf::exp(w.0),
                                old,
                                &mut q[at..at + w.3],
                            );
                        }
                    }
                }
                Plan::Rcw | Plan::Rebuild => {
                    if matches!(u.plan, Plan::Rebuild) {
                        let mut strips: Vec<&mut [u8]> = u
                            .span
                            .iter_mut()
                            .map(|b| &mut b.as_mut().unwrap()[..])
                            .collect();
                        recover(&mut strips, &u.missing, np);
                    }
                    for w in &u.writes {
                        if let Some(b) = u.span[w.0].as_mut() {
                            let at = (w.1 - lo) as usize;
                            b[at..at + w.3].copy_from_slice(&data[w.2..w.2 + w.3]);
                        }
                    }
                    let (dpart, ppart) = u.span.split_at_mut(k);
                    let mut srcs: Vec<&[u8]> = Vec::with_capacity(k);
                    for (i, b) in dpart.iter().enumerate() {
                        match b {
                            Some(b) => srcs.push(&b[..]),
                            None => {
                                let w = u.writes.iter().find(|w| w.0 == i).unwrap();
                                srcs.push(&data[w.2..w.2 + span]);
                            }
                        }
                    }
                    gen_parity(&srcs, ppart, np);
                }
            }
        }

        // Write phase.
        {
            let mut ops: Vec<Op> = Vec::new();
            let journaled = !self.all_online();
            for u in units.iter() {
                let (row, lo) = (u.row, u.lo);
                for w in &u.writes {
                    let m = u.layout[w.0];
                    if self.writable(m) {
                        ops.push(Op::write(
                            m,
                            self.member_offset(row, w.1),
                            &data[w.2..w.2 + w.3],
                        ));
                    }
                }
                for (i, &m) in u.layout.iter().enumerate() {
                    if !self.writable(m) {
                        continue;
                    }
                    if i >= k {
                        ops.push(Op::write(
                            m,
                            self.member_offset(row, lo),
                            u.span[i].as_ref().unwrap(),
                        ));
                    } else if matches!(u.plan, Plan::Rebuild) && u.missing.contains(&i) {
                        // A member being rebuilt gets the whole span it now has a value for.
                        ops.push(Op::write(
                            m,
                            self.member_offset(row, lo),
                            u.span[i].as_ref().unwrap(),
                        ));
                    }
                }
            }
            if journaled {
                self.journaled_write(&mut ops)?;
            } else {
                self.retire_journal();
                self.run(&mut ops);
            }
        }
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

    fn write_mirrored(&self, pieces: &[Piece], data: &[u8]) -> Result<bool> {
        let geo = &self.geo;
        let mut ops: Vec<Op> = Vec::new();
        for p in pieces {
            let loc = geo.locate(p.row, p.col);
            let mut any = false;
            for m in geo.group_members(loc.group) {
                if self.writable(m) {
                    any = true;
                    ops.push(Op::write(
                        m,
                        self.member_offset(p.row, p.s),
                        &data[p.at..p.at + p.len],
                    ));
                }
            }
            if !any {
                return Err(ArrayError::Offline {
                    group: loc.group,
                    lost: geo.group,
                    tolerance: geo.tolerance_per_group(),
                });
            }
        }
        self.stats
            .full_stripe_writes
            .fetch_add(pieces.len() as u64, Ordering::Relaxed);
        self.run(&mut ops);
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

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
    fn journaled_write(&self, ops: &mut [Op]) -> Result<()> {
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

    /// Reads one member's strip of a row, for tools that check the layout (scrub, tests).
    pub fn read_member_strip(&self, member: usize, row: u64, buf: &mut [u8]) -> io::Result<()> {
        self.drives.load()[member].read_at(buf, self.member_offset(row, 0))
    }
}

fn gen_parity(srcs: &[&[u8]], par: &mut [Option<AlignedBuf>], np: usize) {
    let (p, q) = par.split_at_mut(1);
    let p = p[0].as_mut().unwrap();
    if np == 2 {
        millrace_parity::gen_pq(srcs, p, q[0].as_mut().unwrap());
    } else {
        millrace_parity::gen_p(srcs, p);
    }
}

/// Rebuilds the missing strips (layout positions) of one group's span in place.
fn recover(strips: &mut [&mut [u8]], missing: &[usize], np: usize) {
    if missing.is_empty() {
        return;
    }
    if np == 1 {
        millrace_parity::raid5_recover(strips, missing[0]);
    } else {
        millrace_parity::raid6_recover(strips, missing)
            .expect("planning never asks for more than two missing strips");
    }
}

impl millrace_block::BlockDevice for Array {
    fn size_bytes(&self) -> u64 {
        Array::size_bytes(self)
    }
    fn preferred_io_bytes(&self) -> u64 {
        self.geo.full_stripe_bytes()
    }
    fn min_io_bytes(&self) -> u64 {
        self.geo.strip
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        Array::read_at(self, offset, buf).map_err(Into::into)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        Array::write_at(self, offset, data).map_err(Into::into)
    }
    fn flush(&self) -> io::Result<()> {
        Array::flush(self).map_err(Into::into)
    }
    // The async face runs the engine's current path inline for now (see docs/DATAPATH.md);
    // the completion-based engine replaces these bodies, not their signatures.
    fn read_async(&self, offset: u64, mut buf: IoBuf) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let r = Array::read_at(self, offset, &mut buf).map_err(Into::into);
            (r, buf)
        })
    }
    fn write_async(&self, offset: u64, buf: IoBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(async move {
            let mut r = Array::write_at(self, offset, &buf);
            if fua && r.is_ok() {
                r = Array::flush(self);
            }
            (r.map_err(Into::into), buf)
        })
    }
}

impl Array {
    /// Recomputes the redundancy of one row from its data: parity for parity levels, the first
    /// readable copy onto the others for mirrors. Initialisation and resync use it.
    pub fn resync_row(&self, row: u64) -> Result<()> {
        let geo = self.geo;
        let fs = geo.full_stripe_bytes();
        let _g = self.lock_rows(row * fs, fs);
        let strip = geo.strip as usize;
        let off = self.member_offset(row, 0);
        for group in 0..geo.groups() {
            let layout = geo.group_layout(row, group);
            let k = geo.group_data();
            let mut bufs: Vec<AlignedBuf> =
                layout.iter().map(|_| AlignedBuf::zeroed(strip)).collect();
            if geo.level.is_parity() {
                let ok = {
                    let mut ops: Vec<Op> = bufs[..k]
                        .iter_mut()
                        .zip(&layout)
                        .filter(|(_, &m)| self.readable(m, row))
                        .map(|(b, &m)| Op::read(m, off, b))
                        .collect();
                    if ops.len() < k {
                        // Data strips are missing: their content lives only in parity; keep it.
                        continue;
                    }
                    self.run(&mut ops)
                };
                if !ok {
                    continue;
                }
                let (d, p) = bufs.split_at_mut(k);
                let srcs: Vec<&[u8]> = d.iter().map(|b| &b[..]).collect();
                let mut par: Vec<Option<AlignedBuf>> = p
                    .iter_mut()
                    .map(|b| Some(std::mem::replace(b, AlignedBuf::zeroed(0))))
                    .collect();
                gen_parity(&srcs, &mut par, geo.level.parity());
                let mut ops: Vec<Op> = par
                    .iter()
                    .zip(&layout[k..])
                    .filter(|(_, &m)| self.writable(m))
                    .map(|(b, &m)| Op::write(m, off, b.as_ref().unwrap()))
                    .collect();
                self.run(&mut ops);
            } else {
                let members: Vec<usize> = geo.group_members(group).collect();
                let Some(&src) = members.iter().find(|&&m| self.readable(m, row)) else {
                    continue;
                };
                if !self.run(&mut [Op::read(src, off, &mut bufs[0])]) {
                    continue;
                }
                let mut ops: Vec<Op> = members
                    .iter()
                    .filter(|&&m| m != src && self.writable(m))
                    .map(|&m| Op::write(m, off, &bufs[0]))
                    .collect();
                self.run(&mut ops);
            }
        }
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What scrubbing one or more rows found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub rows_checked: u64,
    /// Groups whose redundancy disagreed with their data.
    pub mismatches: u64,
    /// RAID6 only: mismatches traced to one data strip by the P and Q syndromes.
    pub located: u64,
    pub repaired: u64,
    /// Groups not checked because a member was out of service.
    pub skipped_degraded: u64,
}

impl ScrubReport {
    pub fn add(&mut self, o: &ScrubReport) {
        self.rows_checked += o.rows_checked;
        self.mismatches += o.mismatches;
        self.located += o.located;
        self.repaired += o.repaired;
        self.skipped_degraded += o.skipped_degraded;
    }
}

impl Array {
    /// Rebuilds row `row` onto the members in state Rebuilding that have not passed it yet,
    /// from the rest of their groups, and moves their checkpoint past it.
    pub fn rebuild_row(&self, row: u64) -> Result<()> {
        let geo = self.geo;
        let targets: Vec<usize> = (0..geo.members)
            .filter(|&m| {
                self.member_state(m) == MemberState::Rebuilding
                    && self.rebuilt_rows[m].load(Ordering::Acquire) <= row
            })
            .collect();
        if targets.is_empty() {
            return Ok(());
        }
        let fs = geo.full_stripe_bytes();
        let _g = self.lock_rows(row * fs, fs);
        let strip = geo.strip as usize;
        let off = self.member_offset(row, 0);
        for group in 0..geo.groups() {
            let members: Vec<usize> = geo.group_members(group).collect();
            let tgt: Vec<usize> = targets
                .iter()
                .copied()
                .filter(|m| members.contains(m))
                .collect();
            if tgt.is_empty() {
                continue;
            }
            if geo.level.is_parity() {
                let layout = geo.group_layout(row, group);
                let missing: Vec<usize> = (0..layout.len())
                    .filter(|&i| !self.readable(layout[i], row))
                    .collect();
                if missing.len() > geo.level.parity() {
                    return Err(ArrayError::Offline {
                        group,
                        lost: missing.len(),
                        tolerance: geo.level.parity(),
                    });
                }
                let mut bufs: Vec<AlignedBuf> =
                    layout.iter().map(|_| AlignedBuf::zeroed(strip)).collect();
                let ok = {
                    let mut ops: Vec<Op> = bufs
                        .iter_mut()
                        .enumerate()
                        .filter(|(i, _)| !missing.contains(i))
                        .map(|(i, b)| Op::read(layout[i], off, b))
                        .collect();
                    self.run(&mut ops)
                };
                if !ok {
                    return self.rebuild_row(row);
                }
                {
                    let mut strips: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                    recover(&mut strips, &missing, geo.level.parity());
                }
                let mut ops: Vec<Op> = layout
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| tgt.contains(m))
                    .map(|(i, &m)| Op::write(m, off, &bufs[i]))
                    .collect();
                self.run(&mut ops);
            } else {
                let Some(&src) = members.iter().find(|&&m| self.readable(m, row)) else {
                    return Err(ArrayError::Offline {
                        group,
                        lost: members.len(),
                        tolerance: geo.tolerance_per_group(),
                    });
                };
                let mut buf = AlignedBuf::zeroed(strip);
                if !self.run(&mut [Op::read(src, off, &mut buf)]) {
                    return self.rebuild_row(row);
                }
                let mut ops: Vec<Op> = tgt.iter().map(|&m| Op::write(m, off, &buf)).collect();
                self.run(&mut ops);
            }
        }
        for &m in &targets {
            if self.member_state(m) == MemberState::Rebuilding {
                self.rebuilt_rows[m].store(row + 1, Ordering::Release);
            }
        }
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
        let targets: Vec<usize> = (0..geo.members)
            .filter(|&m| {
                self.member_state(m) == MemberState::Rebuilding
                    && self.rebuilt_rows[m].load(Ordering::Acquire) <= first
            })
            .collect();
        if targets.is_empty() {
            return Ok(());
        }
        // Every other member must be plainly in or out of service across the whole window.
        let uniform = (0..geo.members).all(|m| {
            targets.contains(&m) || self.readable(m, first) == self.readable(m, first + count - 1)
        });
        let by_row = || (first..first + count).try_for_each(|r| self.rebuild_row(r));
        if !uniform {
            return by_row();
        }
        let fs = geo.full_stripe_bytes();
        let strip = geo.strip as usize;
        let span = strip * count as usize;
        let off = self.member_offset(first, 0);
        {
            let _g = self.lock_rows(first * fs, count * fs);
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
                // One buffer per group member, indexed by position in `members`.
                let mut bufs: Vec<AlignedBuf> = members
                    .iter()
                    .map(|_| crate::aligned::scratch(span))
                    .collect();
                let readers: Vec<usize> = if geo.level.is_parity() {
                    sources.clone()
                } else {
                    vec![sources[0]]
                };
                let ok = {
                    let mut ops: Vec<Op> = bufs
                        .iter_mut()
                        .zip(&members)
                        .filter(|(_, m)| readers.contains(m))
                        .map(|(b, &m)| Op::read(m, off, b))
                        .collect();
                    self.run(&mut ops)
                };
                if !ok {
                    drop(_g);
                    return by_row();
                }
                if geo.level.is_parity() {
                    for r in 0..count as usize {
                        let layout = geo.group_layout(first + r as u64, group);
                        let missing: Vec<usize> = (0..layout.len())
                            .filter(|&i| !sources.contains(&layout[i]))
                            .collect();
                        let mut by_member: Vec<Option<&mut [u8]>> = bufs
                            .iter_mut()
                            .map(|b| Some(&mut b[r * strip..(r + 1) * strip]))
                            .collect();
                        let mut strips: Vec<&mut [u8]> = layout
                            .iter()
                            .map(|m| by_member[m - members[0]].take().expect("distinct members"))
                            .collect();
                        recover(&mut strips, &missing, geo.level.parity());
                    }
                } else {
                    let src = members.iter().position(|&m| m == readers[0]).unwrap();
                    let copy = bufs[src].to_vec();
                    for (b, m) in bufs.iter_mut().zip(&members) {
                        if targets.contains(m) {
                            b.copy_from_slice(&copy);
                        }
                    }
                }
                let mut ops: Vec<Op> = bufs
                    .iter()
                    .zip(&members)
                    .filter(|(_, m)| targets.contains(m))
                    .map(|(b, &m)| Op::write(m, off, b))
                    .collect();
                self.run(&mut ops);
                drop(ops);
                crate::aligned::recycle(bufs);
            }
            for &m in &targets {
                if self.member_state(m) == MemberState::Rebuilding {
                    self.rebuilt_rows[m].store(first + count, Ordering::Release);
                }
            }
        }
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Checks one row's redundancy against its data; with `repair`, makes it right. On RAID6 a
    /// single silently corrupted strip is located from the P and Q syndromes and rewritten.
    pub fn scrub_row(&self, row: u64, repair: bool) -> Result<ScrubReport> {
        let geo = self.geo;
        let fs = geo.full_stripe_bytes();
        let _g = self.lock_rows(row * fs, fs);
        let strip = geo.strip as usize;
        let off = self.member_offset(row, 0);
        let mut rep = ScrubReport {
            rows_checked: 1,
            ..Default::default()
        };
        for group in 0..geo.groups() {
            let layout = geo.group_layout(row, group);
            let members: Vec<usize> = if geo.level.is_parity() {
                layout.clone()
            } else {
                geo.group_members(group).collect()
            };
            if members.iter().any(|&m| !self.readable(m, row)) {
                rep.skipped_degraded += 1;
                continue;
            }
            let mut bufs: Vec<AlignedBuf> =
                members.iter().map(|_| AlignedBuf::zeroed(strip)).collect();
            let ok = {
                let mut ops: Vec<Op> = bufs
                    .iter_mut()
                    .zip(&members)
                    .map(|(b, &m)| Op::read(m, off, b))
                    .collect();
                self.run(&mut ops)
            };
            if !ok {
                rep.skipped_degraded += 1;
                continue;
            }
            // Which strips (positions in `members`) to rewrite, with what.
            let mut fix: Vec<usize> = Vec::new();
            match geo.level.parity() {
                0 => {
                    let bad: Vec<usize> = (1..bufs.len())
                        .filter(|&i| bufs[i][..] != bufs[0][..])
                        .collect();
                    if !bad.is_empty() {
                        rep.mismatches += 1;
                        // With three or more copies the majority is right; with two, the first.
                        let best = (0..bufs.len())
                            .max_by_key(|&i| bufs.iter().filter(|b| b[..] == bufs[i][..]).count())
                            .unwrap_or(0);
                        let good = bufs[best].to_vec();
                        for (i, b) in bufs.iter_mut().enumerate() {
                            if b[..] != good[..] {
                                b.copy_from_slice(&good);
                                fix.push(i);
                            }
                        }
                    }
                }
                1 => {
                    let strips: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
                    if !millrace_parity::raid5_check(&strips) {
                        rep.mismatches += 1;
                        let k = bufs.len() - 1;
                        let mut st: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                        millrace_parity::raid5_recover(&mut st, k);
                        fix.push(k);
                    }
                }
                _ => {
                    let k = bufs.len() - 2;
                    let strips: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
                    let verdict = millrace_parity::raid6_check(&strips);
                    let redo: Vec<usize> = match verdict {
                        millrace_parity::Raid6Check::Clean => vec![],
                        millrace_parity::Raid6Check::POnly => vec![k],
                        millrace_parity::Raid6Check::QOnly => vec![k + 1],
                        millrace_parity::Raid6Check::Data { index } => {
                            rep.located += 1;
                            vec![index]
                        }
                        // Not one strip: as md does, trust the data and recompute P and Q.
                        millrace_parity::Raid6Check::Unlocatable => vec![k, k + 1],
                    };
                    if !redo.is_empty() {
                        rep.mismatches += 1;
                        let mut st: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                        millrace_parity::raid6_recover(&mut st, &redo)
                            .expect("at most two strips are rebuilt");
                        fix = redo;
                    }
                }
            }
            if repair && !fix.is_empty() {
                let mut ops: Vec<Op> = fix
                    .iter()
                    .map(|&i| Op::write(members[i], off, &bufs[i]))
                    .collect();
                if self.run(&mut ops) {
                    rep.repaired += 1;
                }
            }
        }
        Ok(rep)
    }
}
