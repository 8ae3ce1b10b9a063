//! The read path: straight from the member holding each piece, or, where a parity group lost
//! that member, every strip it still has read once over the span the request covers and the lost
//! ones rebuilt. All of a request's member reads go out as one batch.

use std::sync::atomic::Ordering;

use super::codes::recover;
use super::layout::ReadFrom;
use super::parity::missing;
use super::{Array, ArrayError, Piece, Result};
use crate::aligned::AlignedBuf;
use crate::geometry::SECTOR;
use crate::io::Op;

/// A (row, group) that lost a member some piece needs: every strip it still has is read once
/// over [lo, hi) of the strip, the lost ones rebuilt, and each of the request's pieces in that
/// group served from the result.
struct Degraded {
    row: u64,
    group: usize,
    /// Members in syndrome order: data, then P (and Q).
    layout: Vec<usize>,
    lo: u64,
    hi: u64,
    bufs: Vec<AlignedBuf>,
    /// Layout positions that cannot be read.
    missing: Vec<usize>,
}

/// How a request is read: pieces straight from a member, pieces served from a degraded unit.
#[derive(Default)]
struct ReadPlan {
    /// (piece, member)
    direct: Vec<(usize, usize)>,
    /// (piece, index into `degraded`)
    via: Vec<(usize, usize)>,
    degraded: Vec<Degraded>,
}

impl Array {
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
        self.read_counted(offset, buf, false)
    }

    /// `read_at` once its range is checked and counted. `locked`: the caller holds the rows'
    /// locks already.
    pub(super) fn read_counted(&self, offset: u64, buf: &mut [u8], locked: bool) -> Result<()> {
        if !self.needs_bounce(offset, buf) {
            return self.read_sectors(offset, buf, locked);
        }
        let a0 = offset / SECTOR * SECTOR;
        let a1 = (offset + buf.len() as u64).div_ceil(SECTOR) * SECTOR;
        let mut tmp = AlignedBuf::zeroed((a1 - a0) as usize);
        self.read_sectors(a0, &mut tmp, locked)?;
        let from = (offset - a0) as usize;
        buf.copy_from_slice(&tmp[from..from + buf.len()]);
        Ok(())
    }

    /// Reads whole sectors. `locked`: the caller holds the rows' locks already.
    pub(super) fn read_sectors(&self, offset: u64, buf: &mut [u8], locked: bool) -> Result<()> {
        // Each failed attempt takes at least one member out of service, so this ends.
        for _ in 0..=self.geo.members {
            let _guards =
                (!locked && !self.all_online()).then(|| self.lock_rows(offset, buf.len() as u64));
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
        let mut plan = self.plan_read(&pieces)?;
        if !plan.degraded.is_empty() {
            self.stats
                .degraded_reads
                .fetch_add(plan.degraded.len() as u64, Ordering::Relaxed);
        }
        for d in plan.degraded.iter_mut() {
            d.bufs = (0..d.layout.len())
                .map(|_| crate::aligned::scratch((d.hi - d.lo) as usize))
                .collect();
        }
        plan.direct.sort_unstable();
        if !self.issue_reads(&pieces, buf, &mut plan) {
            return Ok(false);
        }
        self.serve_degraded(&pieces, buf, plan);
        Ok(true)
    }

    fn plan_read(&self, pieces: &[Piece]) -> Result<ReadPlan> {
        let geo = &self.geo;
        let mut plan = ReadPlan::default();
        for (i, p) in pieces.iter().enumerate() {
            let group = geo.locate(p.row, p.col).group;
            let (lo, hi) = (p.s, p.s + p.len as u64);
            if let Some(u) = plan
                .degraded
                .iter()
                .position(|d| d.row == p.row && d.group == group)
            {
                let d = &mut plan.degraded[u];
                d.lo = d.lo.min(lo);
                d.hi = d.hi.max(hi);
                plan.via.push((i, u));
                continue;
            }
            match self.layout.read_from(self, p)? {
                ReadFrom::Member(m) => plan.direct.push((i, m)),
                ReadFrom::Reconstruct => self.add_degraded(pieces, &mut plan, i, group)?,
            }
        }
        Ok(plan)
    }

    /// Starts a degraded unit for piece `i`; earlier pieces of its group that were to be read
    /// directly join it.
    fn add_degraded(
        &self,
        pieces: &[Piece],
        plan: &mut ReadPlan,
        i: usize,
        group: usize,
    ) -> Result<()> {
        let geo = &self.geo;
        let p = &pieces[i];
        let layout = geo.group_layout(p.row, group);
        let missing = missing(self, p.row, group, &layout)?;
        let u = plan.degraded.len();
        let (mut lo, mut hi) = (p.s, p.s + p.len as u64);
        let via = &mut plan.via;
        plan.direct.retain(|&(j, _)| {
            let q = &pieces[j];
            let same = q.row == p.row && geo.locate(q.row, q.col).group == group;
            if same {
                lo = lo.min(q.s);
                hi = hi.max(q.s + q.len as u64);
                via.push((j, u));
            }
            !same
        });
        via.push((i, u));
        plan.degraded.push(Degraded {
            row: p.row,
            group,
            layout,
            lo,
            hi,
            bufs: Vec::new(),
            missing,
        });
        Ok(())
    }

    /// Reads every direct piece into the caller's buffer and every degraded unit's surviving
    /// strips, as one batch. Returns whether all succeeded.
    fn issue_reads(&self, pieces: &[Piece], buf: &mut [u8], plan: &mut ReadPlan) -> bool {
        let np = self.geo.level.parity();
        let mut ops: Vec<Op> = Vec::with_capacity(plan.direct.len() + plan.degraded.len() * 8);
        let mut rest: &mut [u8] = buf;
        let mut consumed = 0usize;
        for &(i, m) in &plan.direct {
            let p = &pieces[i];
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut(p.at - consumed);
            let (dst, tail) = tail.split_at_mut(p.len);
            rest = tail;
            consumed = p.at + p.len;
            ops.push(Op::read(m, self.member_offset(p.row, p.s), dst));
        }
        for d in plan.degraded.iter_mut() {
            // One data strip lost and P at hand: P rebuilds it, so Q is not read (on a
            // 16-drive RAID6 that is 14 reads a row instead of 15).
            let k = d.layout.len() - np;
            let skip_q = np == 2 && d.missing.len() == 1 && d.missing[0] < k;
            let off = self.member_offset(d.row, d.lo);
            for (i, b) in d.bufs.iter_mut().enumerate() {
                let needed = !(d.missing.contains(&i) || (skip_q && i == k + 1));
                if needed {
                    ops.push(Op::read(d.layout[i], off, b));
                }
            }
        }
        self.run(&mut ops)
    }

    /// Rebuilds each degraded unit's lost strips and copies the pieces it serves.
    fn serve_degraded(&self, pieces: &[Piece], buf: &mut [u8], plan: ReadPlan) {
        let mut degraded = plan.degraded;
        for d in degraded.iter_mut() {
            let mut strips: Vec<&mut [u8]> = d.bufs.iter_mut().map(|b| &mut b[..]).collect();
            recover(&mut strips, &d.missing, self.geo.level.parity());
        }
        for &(i, u) in &plan.via {
            let p = &pieces[i];
            let d = &degraded[u];
            let idx = self.geo.locate(p.row, p.col).index;
            let from = (p.s - d.lo) as usize;
            buf[p.at..p.at + p.len].copy_from_slice(&d.bufs[idx][from..from + p.len]);
        }
        for d in degraded {
            crate::aligned::recycle(d.bufs);
        }
    }
}
