//! One strategy per RAID layout, in the manner of SPDK's raid module table (`struct
//! raid_bdev_module`): the generic engine owns state, locks, the log and failure handling,
//! and asks the strategy of its level what to read, what to write, and how to rebuild, scrub or
//! resync one group of one row. Strategies are stateless; they never lock.

use super::{Array, Piece, Result, ScrubReport};
use crate::aligned::AlignedBuf;

/// Where a piece of a read comes from.
pub(super) enum ReadFrom {
    /// Straight from this member into the caller's buffer.
    Member(usize),
    /// Rebuilt from the rest of its group (a parity group missing the piece's member).
    Reconstruct,
}

/// A rebuild window: rows `first..first + count` of one group, read once per source member.
pub(super) struct Window<'a> {
    pub first: u64,
    pub count: u64,
    pub group: usize,
    /// The group's members, in member order; `bufs[i]` belongs to `members[i]`.
    pub members: &'a [usize],
    /// Members read (all in service across the window).
    pub sources: &'a [usize],
    /// Members being rebuilt.
    pub targets: &'a [usize],
}

pub(super) trait Layout: Sync {
    /// Where to read `p` from (Err: the group cannot serve it).
    fn read_from(&self, a: &Array, p: &Piece) -> Result<ReadFrom>;
    /// One attempt at writing whole sectors; the caller holds the rows' locks.
    /// Ok(false): a read failed and members were marked faulty: plan again.
    fn write(&self, a: &Array, pieces: &[Piece], data: &[u8]) -> Result<bool>;
    /// Rebuilds one row of one group onto `targets`. Ok(false): a read failed: plan again.
    fn rebuild_group(&self, a: &Array, row: u64, group: usize, targets: &[usize]) -> Result<bool>;
    /// Which of a window's sources are read.
    fn window_readers(&self, w: &Window) -> Vec<usize>;
    /// Fills the targets' buffers of a window from the readers' buffers.
    fn rebuild_window(&self, a: &Array, w: &Window, bufs: &mut [AlignedBuf]);
    /// Checks (and with `repair` fixes) one group of one row; all its members are readable.
    fn scrub_group(&self, a: &Array, row: u64, group: usize, repair: bool, rep: &mut ScrubReport);
    /// Recomputes one group's redundancy in one row from its data.
    fn resync_group(&self, a: &Array, row: u64, group: usize);
}
