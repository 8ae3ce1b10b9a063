//! The stripe strategy (RAID0): one copy of everything, no redundancy. Reads and writes go
//! straight to the member holding the strip; there is nothing to rebuild, scrub or resync.

use super::layout::{Layout, ReadFrom, Window};
use super::mirror::{copy_row, pick_copy, write_copies};
use super::{Array, Piece, Result, ScrubReport};
use crate::aligned::AlignedBuf;

pub(super) struct Stripe;

impl Layout for Stripe {
    fn read_from(&self, a: &Array, p: &Piece) -> Result<ReadFrom> {
        // A group of one copy: the copy, or the pool is offline.
        pick_copy(a, p)
    }

    fn write(&self, a: &Array, pieces: &[Piece], data: &[u8]) -> Result<bool> {
        write_copies(a, pieces, data)
    }

    fn rebuild_group(&self, a: &Array, row: u64, group: usize, targets: &[usize]) -> Result<bool> {
        // Nothing survives to copy from: this reports the group offline.
        copy_row(a, row, group, targets)
    }

    fn window_readers(&self, w: &Window) -> Vec<usize> {
        w.sources.to_vec()
    }

    fn rebuild_window(&self, _: &Array, _: &Window, _: &mut [AlignedBuf]) {}

    fn scrub_group(&self, _: &Array, _: u64, _: usize, _: bool, _: &mut ScrubReport) {}

    fn resync_group(&self, _: &Array, _: u64, _: usize) {}
}
