//! The mirror strategy (RAID1, RAID10): every member of a group holds the same strips. Reads
//! rotate over the copies by row; writes go to every copy in service; a rebuild copies a
//! readable copy; a scrub compares the copies and the majority wins.

use std::sync::atomic::Ordering;

use super::layout::{Layout, ReadFrom, Window};
use super::scrub::{read_group, write_fixes};
use super::{Array, ArrayError, Piece, Result, ScrubReport};
use crate::aligned::AlignedBuf;
use crate::io::Op;

pub(super) struct Mirror;

/// The copy of `p` to read: the group's members in turn by row, the first readable one.
pub(super) fn pick_copy(a: &Array, p: &Piece) -> Result<ReadFrom> {
    let geo = &a.geo;
    let loc = geo.locate(p.row, p.col);
    let members: smallvec::SmallVec<[usize; 4]> = geo.group_members(loc.group).collect();
    let start = (p.row % members.len() as u64) as usize;
    (0..members.len())
        .map(|k| members[(start + k) % members.len()])
        .find(|&m| a.readable(m, p.row))
        .map(ReadFrom::Member)
        .ok_or(ArrayError::Offline {
            group: loc.group,
            lost: members.len(),
            tolerance: geo.tolerance_per_group(),
        })
}

/// Writes every piece to every copy in service.
pub(super) fn write_copies(a: &Array, pieces: &[Piece], data: &[u8]) -> Result<bool> {
    let geo = &a.geo;
    let mut ops: Vec<Op> = Vec::new();
    for p in pieces {
        let loc = geo.locate(p.row, p.col);
        let mut any = false;
        for m in geo.group_members(loc.group) {
            if a.writable(m) {
                any = true;
                ops.push(Op::write(
                    m,
                    a.member_offset(p.row, p.s),
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
    a.stats
        .full_stripe_writes
        .fetch_add(pieces.len() as u64, Ordering::Relaxed);
    a.run(&mut ops);
    match a.offline_group() {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// Copies a readable copy of one row onto `targets`.
pub(super) fn copy_row(a: &Array, row: u64, group: usize, targets: &[usize]) -> Result<bool> {
    let geo = &a.geo;
    let members: Vec<usize> = geo.group_members(group).collect();
    let Some(&src) = members.iter().find(|&&m| a.readable(m, row)) else {
        return Err(ArrayError::Offline {
            group,
            lost: members.len(),
            tolerance: geo.tolerance_per_group(),
        });
    };
    let off = a.member_offset(row, 0);
    let mut buf = AlignedBuf::zeroed(geo.strip as usize);
    if !a.run(&mut [Op::read(src, off, &mut buf)]) {
        return Ok(false);
    }
    let mut ops: Vec<Op> = targets.iter().map(|&m| Op::write(m, off, &buf)).collect();
    a.run(&mut ops);
    Ok(true)
}

impl Layout for Mirror {
    fn read_from(&self, a: &Array, p: &Piece) -> Result<ReadFrom> {
        pick_copy(a, p)
    }

    fn write(&self, a: &Array, pieces: &[Piece], data: &[u8]) -> Result<bool> {
        write_copies(a, pieces, data)
    }

    fn rebuild_group(&self, a: &Array, row: u64, group: usize, targets: &[usize]) -> Result<bool> {
        copy_row(a, row, group, targets)
    }

    fn window_readers(&self, w: &Window) -> Vec<usize> {
        vec![w.sources[0]]
    }

    fn rebuild_window(&self, _: &Array, w: &Window, bufs: &mut [AlignedBuf]) {
        let src = w.members.iter().position(|&m| m == w.sources[0]).unwrap();
        let copy = bufs[src].to_vec();
        for (b, m) in bufs.iter_mut().zip(w.members) {
            if w.targets.contains(m) {
                b.copy_from_slice(&copy);
            }
        }
    }

    fn scrub_group(&self, a: &Array, row: u64, group: usize, repair: bool, rep: &mut ScrubReport) {
        let members: Vec<usize> = a.geo.group_members(group).collect();
        let Some(mut bufs) = read_group(a, row, &members, rep) else {
            return;
        };
        let bad: Vec<usize> = (1..bufs.len())
            .filter(|&i| bufs[i][..] != bufs[0][..])
            .collect();
        if bad.is_empty() {
            return;
        }
        rep.mismatches += 1;
        // With three or more copies the majority is right; with two, the first.
        let best = (0..bufs.len())
            .max_by_key(|&i| bufs.iter().filter(|b| b[..] == bufs[i][..]).count())
            .unwrap_or(0);
        let good = bufs[best].to_vec();
        let mut fix = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            if b[..] != good[..] {
                b.copy_from_slice(&good);
                fix.push(i);
            }
        }
        if repair {
            write_fixes(a, row, &members, &bufs, &fix, rep);
        }
    }

    fn resync_group(&self, a: &Array, row: u64, group: usize) {
        let members: Vec<usize> = a.geo.group_members(group).collect();
        let Some(&src) = members.iter().find(|&&m| a.readable(m, row)) else {
            return;
        };
        let off = a.member_offset(row, 0);
        let mut buf = AlignedBuf::zeroed(a.geo.strip as usize);
        if !a.run(&mut [Op::read(src, off, &mut buf)]) {
            return;
        }
        let mut ops: Vec<Op> = members
            .iter()
            .filter(|&&m| m != src && a.writable(m))
            .map(|&m| Op::write(m, off, &buf))
            .collect();
        a.run(&mut ops);
    }
}
