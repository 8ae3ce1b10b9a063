//! Scrub and resync: the generic loops over a row's groups (under the row's lock), and the
//! reading and repairing every strategy's scrub shares.

use super::{Array, Result};
use crate::aligned::AlignedBuf;
use crate::io::Op;

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

/// Reads one row's strip from each of `members`; None (counted as skipped) when one is out of
/// service or a read fails.
pub(super) fn read_group(
    a: &Array,
    row: u64,
    members: &[usize],
    rep: &mut ScrubReport,
) -> Option<Vec<AlignedBuf>> {
    if members.iter().any(|&m| !a.readable(m, row)) {
        rep.skipped_degraded += 1;
        return None;
    }
    let off = a.member_offset(row, 0);
    let strip = a.geo.strip as usize;
    let mut bufs: Vec<AlignedBuf> = members.iter().map(|_| AlignedBuf::zeroed(strip)).collect();
    let mut ops: Vec<Op> = bufs
        .iter_mut()
        .zip(members)
        .map(|(b, &m)| Op::read(m, off, b))
        .collect();
    if !a.run(&mut ops) {
        rep.skipped_degraded += 1;
        return None;
    }
    drop(ops);
    Some(bufs)
}

/// Rewrites the strips at positions `fix` of `members` with their corrected contents.
pub(super) fn write_fixes(
    a: &Array,
    row: u64,
    members: &[usize],
    bufs: &[AlignedBuf],
    fix: &[usize],
    rep: &mut ScrubReport,
) {
    if fix.is_empty() {
        return;
    }
    let off = a.member_offset(row, 0);
    let mut ops: Vec<Op> = fix
        .iter()
        .map(|&i| Op::write(members[i], off, &bufs[i]))
        .collect();
    if a.run(&mut ops) {
        rep.repaired += 1;
    }
}

impl Array {
    /// Checks one row's redundancy against its data; with `repair`, makes it right. On RAID6 a
    /// single silently corrupted strip is located from the P and Q syndromes and rewritten.
    pub fn scrub_row(&self, row: u64, repair: bool) -> Result<ScrubReport> {
        let fs = self.geo.full_stripe_bytes();
        let _g = self.lock_rows(row * fs, fs);
        let mut rep = ScrubReport {
            rows_checked: 1,
            ..Default::default()
        };
        for group in 0..self.geo.groups() {
            self.layout.scrub_group(self, row, group, repair, &mut rep);
        }
        Ok(rep)
    }

    /// Recomputes the redundancy of one row from its data: parity for parity levels, the first
    /// readable copy onto the others for mirrors. Initialisation and resync use it.
    pub fn resync_row(&self, row: u64) -> Result<()> {
        let fs = self.geo.full_stripe_bytes();
        let _g = self.lock_rows(row * fs, fs);
        for group in 0..self.geo.groups() {
            self.layout.resync_group(self, row, group);
        }
        match self.offline_group() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
