//! The RAID engine: turns byte-addressed reads and writes of a pool into member I/O.
//!
//! The generic part (this module and its read, write, log, rebuild and scrub modules) owns
//! member state, row locks, the write-intent bitmap, the degraded-write partial-parity log and failure
//! handling. What differs between RAID levels is one strategy per family behind the
//! [`layout::Layout`] trait, in the manner of SPDK's raid module table: [`stripe`] (RAID0),
//! [`mirror`] (RAID1, RAID10) and [`parity`] (RAID5, 6, 50, 60). A strategy plans reads and
//! writes and rebuilds, scrubs and resyncs one group of one row; it never takes a lock.
//!
//! Parity writes are planned per (row, group): a full stripe computes parity from new data
//! alone; a partial one reads either the old data and parity (read-modify-write) or the rest of
//! the stripe (reconstruct-write), whichever reads less; a group with a member it cannot read
//! rebuilds the span from what it can read, then writes. All reads of one request go out as one
//! batch, then all writes as another, so every drive works at once. Rows touched by a write are
//! locked, so concurrent writes to one stripe never leave its parity wrong.

mod codes;
mod completion;
mod discard;
mod journaled;
mod layout;
mod locks;
mod merge;
mod mirror;
mod parity;
mod parity_ring;
mod parity_write;
mod pipeline;
mod ppl_log;
mod ppl_recover;
mod read;
mod rebuild;
mod ring;
mod scrub;
mod stripe;
mod unlogged;
mod write;

pub use crate::error::ArrayError;
pub use scrub::ScrubReport;

use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::RwLock;

use crate::aligned::is_aligned;
use crate::drive::Drive;
use crate::geometry::{Geometry, SECTOR};
use crate::io::{execute, Op};
use crate::superblock::MemberState;
use layout::Layout;
use millrace_block::{BufResult, IoBuf, IoFuture};

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
    /// Requests written as part of another request's plan (writes in flight to one stripe,
    /// merged: see `merge`).
    pub merged_writes: AtomicU64,
    pub degraded_writes: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub member_errors: AtomicU64,
    /// Member flushes issued (each member's fdatasync counts one).
    pub member_flushes: AtomicU64,
    /// Partial-parity log records written, and their bytes (see `ppl_log`).
    pub log_records: AtomicU64,
    pub log_bytes: AtomicU64,
    /// Pool bytes given back to the drives by discard and write-zeroes (whole rows).
    pub deallocated_bytes: AtomicU64,
}

impl Stats {
    /// One write request of `bytes` taken by the pool.
    pub(super) fn wrote(&self, bytes: u64) {
        self.write_ops.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
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

impl MemberStats {
    /// One operation that moved all its `bytes`.
    pub(super) fn moved(&self, write: bool, bytes: u64) {
        let (ops, total) = if write {
            (&self.write_ops, &self.write_bytes)
        } else {
            (&self.read_ops, &self.read_bytes)
        };
        ops.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(bytes, Ordering::Relaxed);
    }
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
type SharedHook = Arc<dyn Fn(usize, &io::Error) + Send + Sync>;

pub struct Array {
    geo: Geometry,
    /// The strategy of this pool's level.
    layout: &'static dyn Layout,
    data_offset: u64,
    /// Swapped whole when a spare or replacement takes a slot; I/O works on a snapshot.
    drives: ArcSwap<Vec<Arc<dyn Drive>>>,
    /// Any member needs aligned buffers (O_DIRECT).
    direct: std::sync::atomic::AtomicBool,
    states: Vec<AtomicU8>,
    /// Rows below this are valid on a member being rebuilt (per member).
    rebuilt_rows: Vec<AtomicU64>,
    locks: locks::RowLocks,
    /// Partial-row writes waiting to be merged (`merge`).
    merge: merge::Pending,
    on_failure: RwLock<Option<SharedHook>>,
    /// Parity writes in flight without the log (`unlogged`).
    unlogged: Arc<unlogged::Unlogged>,
    /// The write-intent bitmap, where the metadata area has room for one.
    bitmap: Option<crate::bitmap::Bitmap>,
    /// The partial-parity log of degraded writes (`ppl_log`).
    log: ppl_log::Log,
    /// Rows per rebuild batch where set (0: the default).
    rebuild_batch: AtomicU64,
    /// Bytes of buffers a rebuild may hold at once (see `rebuild_batch_bounds`).
    rebuild_memory: AtomicU64,
    pub stats: Stats,
    /// Per member slot, in member order.
    pub member_stats: Vec<MemberStats>,
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

/// A request's pieces: one for most requests, a few for long ones.
type Pieces = smallvec::SmallVec<[Piece; 4]>;

/// One piece of a request that falls inside one strip.
struct Piece {
    row: u64,
    /// Data column of the row.
    col: usize,
    /// Offset inside the strip.
    s: u64,
    /// Offset inside the request buffer.
    at: usize,
    len: usize,
}

/// The partial-parity log's slots on each member, sized for the worst row of this geometry.
fn log_area(geo: &Geometry, data_offset: u64) -> Option<crate::ppl::Area> {
    let row = crate::ppl::row_bytes(geo.group_data(), geo.strip);
    crate::ppl::Area::new(data_offset, row + 3 * 4096)
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
            layout: layout_for(geo.level),
            data_offset,
            drives: ArcSwap::from_pointee(drives),
            direct: direct.into(),
            states: states
                .iter()
                .map(|s| AtomicU8::new(state_code(*s)))
                .collect(),
            rebuilt_rows: (0..geo.members).map(|_| AtomicU64::new(0)).collect(),
            locks: locks::RowLocks::new(),
            merge: merge::Pending::default(),
            on_failure: RwLock::new(None),
            unlogged: Arc::default(),
            bitmap: crate::bitmap::region_rows(geo.rows(), geo.strip, data_offset)
                .filter(|_| geo.tolerance_per_group() > 0)
                .map(|rr| crate::bitmap::Bitmap::new(geo.rows(), rr)),
            log: ppl_log::Log::new(
                geo.level
                    .is_parity()
                    .then(|| log_area(&geo, data_offset))
                    .flatten(),
                geo.members,
            ),
            rebuild_batch: AtomicU64::new(0),
            rebuild_memory: AtomicU64::new(pipeline::DEFAULT_REBUILD_MEMORY),
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
        self.retire_log();
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
        *self.on_failure.write() = Some(Arc::from(hook));
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
        self.record_failure(m, why);
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

    fn pieces(&self, offset: u64, len: usize) -> Pieces {
        let strip = self.geo.strip;
        let cols = self.geo.data_cols() as u64;
        let mut v = Pieces::new();
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
    fn lock_rows(&self, offset: u64, len: u64) -> locks::RowGuard<'_> {
        self.locks.lock(self.row_shards(offset, len))
    }

    /// The lock shards of the rows of [offset, offset+len), ascending.
    fn row_shards(&self, offset: u64, len: u64) -> locks::Shards {
        if len == 0 {
            return locks::Shards::new();
        }
        let fs = self.geo.full_stripe_bytes();
        locks::RowLocks::shards(offset / fs, (offset + len - 1) / fs)
    }

    fn needs_bounce(&self, offset: u64, buf: &[u8]) -> bool {
        !offset.is_multiple_of(SECTOR)
            || !(buf.len() as u64).is_multiple_of(SECTOR)
            || (!is_aligned(buf) && self.direct.load(Ordering::Relaxed))
    }

    /// Makes every completed write durable on every member in service.
    pub fn flush(&self) -> Result<()> {
        let live: Vec<usize> = (0..self.geo.members)
            .filter(|&m| self.writable(m))
            .collect();
        let g = self.log.begin_flush();
        self.flush_members(&self.drives.load_full(), &live);
        self.log.end_flush(g);
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Flushes these members all at once (with io_uring, one batch of fsyncs: no thread each);
    /// a member whose flush fails is marked faulty.
    fn flush_members(&self, drives: &Arc<Vec<Arc<dyn Drive>>>, members: &[usize]) {
        let mut ops: Vec<Op> = members.iter().map(|&m| Op::flush(m)).collect();
        self.stats
            .member_flushes
            .fetch_add(ops.len() as u64, Ordering::Relaxed);
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
        self.run_unlogged(ops, None)
    }

    /// `run` for an unlogged parity write: its ticket is given back once the member I/O has
    /// completed, before a failure it met is recorded (which waits for every ticket).
    fn run_unlogged(&self, ops: &mut [Op], ticket: Option<unlogged::Ticket>) -> bool {
        let drives = self.drives.load_full();
        let results = execute(&drives, ops);
        drop(ticket);
        let mut ok = true;
        for (op, r) in ops.iter().zip(results) {
            let ms = &self.member_stats[op.member];
            if r.is_ok() {
                ms.moved(op.is_write(), op.bytes());
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

    /// Reads one member's strip of a row, for tools that check the layout (scrub, tests).
    pub fn read_member_strip(&self, member: usize, row: u64, buf: &mut [u8]) -> io::Result<()> {
        self.drives.load()[member].read_at(buf, self.member_offset(row, 0))
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
    fn write_granule_bytes(&self) -> u64 {
        match self.geo.level.is_parity() {
            true => self.geo.full_stripe_bytes(),
            false => 0,
        }
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
    // Both deallocate whole rows and write zeroes over partial ones (discard.rs): a
    // deallocated row reads as zeroes, so a discard here promises what write-zeroes does.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        Array::discard(self, offset, len).map_err(Into::into)
    }
    fn zeroes_fast(&self, offset: u64, len: u64) -> bool {
        self.deallocates(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        Array::discard(self, offset, len).map_err(Into::into)
    }
    fn discard_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.discard_owned(offset, len))
    }
    fn write_zeroes_async(&self, offset: u64, len: u64) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.discard_owned(offset, len))
    }
    // Completion-based on a core's ring; the blocking engine inline elsewhere (completion.rs).
    fn read_async(&self, offset: u64, buf: IoBuf) -> IoFuture<'_, BufResult> {
        Box::pin(self.read_owned(offset, buf))
    }
    fn write_async(&self, offset: u64, buf: IoBuf, fua: bool) -> IoFuture<'_, BufResult> {
        Box::pin(self.write_owned(offset, buf, fua))
    }
    fn flush_async(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(self.flush_owned())
    }
}

/// The strategy of a level (here, not in `layout`, so that the trait's module does not depend
/// on its implementations).
fn layout_for(level: crate::geometry::Level) -> &'static dyn Layout {
    use crate::geometry::Level;
    match level {
        Level::Raid0 => &stripe::Stripe,
        Level::Raid1 | Level::Raid10 => &mirror::Mirror,
        Level::Raid5 | Level::Raid6 | Level::Raid50 | Level::Raid60 => &parity::Parity,
    }
}
