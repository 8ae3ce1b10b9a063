//! The write path: checks, row locks and the write-intent bitmap, unaligned edges, and the
//! cut of a degraded parity write into pieces whose log records fit a slot; the strategy plans and issues
//! each attempt.

use super::{Array, ArrayError, Result};
use crate::aligned::AlignedBuf;
use crate::geometry::SECTOR;

/// The whole sectors [a0, a1) that [offset, offset + len) touches.
pub(super) fn sector_span(offset: u64, len: usize) -> (u64, u64) {
    let a0 = offset / SECTOR * SECTOR;
    let a1 = (offset + len as u64).div_ceil(SECTOR) * SECTOR;
    (a0, a1)
}

impl Array {
    /// Writes `data` at any offset.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.stats.wrote(data.len() as u64);
        // Planned and acknowledged only once every member failure so far is recorded (see
        // `unlogged`). A core cannot wait here (its writes in flight hold the record back): its
        // writes wait in `write_owned`.
        let off_core = !millrace_io::on_ring();
        if off_core {
            self.unlogged.wait_recorded();
        }
        let (a0, a1) = sector_span(offset, data.len());
        let guards = self.lock_rows(a0, a1 - a0);
        let r = self.write_locked(offset, data);
        drop(guards);
        if off_core {
            self.unlogged.wait_recorded();
        }
        r
    }

    /// `write_at` once its range is checked and counted and its rows are locked.
    pub(super) fn write_locked(&self, offset: u64, data: &[u8]) -> Result<()> {
        let (a0, a1) = sector_span(offset, data.len());
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

    /// Writes whole sectors; the caller holds the rows' locks. While a parity pool is degraded
    /// its writes are logged, so they are cut at row boundaries into pieces whose records fit a
    /// log slot.
    fn write_sectors(&self, offset: u64, data: &[u8]) -> Result<()> {
        if let Some(area) = self.log.area.filter(|_| !self.all_online()) {
            let row = crate::ppl::row_bytes(self.geo.group_data(), self.geo.strip);
            let rows = area.slot_bytes.saturating_sub(3 * 4096) / row;
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
            let pieces = self.pieces(offset, data.len());
            if self.layout.write(self, &pieces, data)? {
                return Ok(());
            }
        }
        Err(self.offline_group().unwrap_or(ArrayError::Offline {
            group: 0,
            lost: self.geo.members,
            tolerance: self.geo.tolerance_per_group(),
        }))
    }
}
