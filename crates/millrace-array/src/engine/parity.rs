//! The parity strategy (RAID5, RAID6 and their striped forms RAID50, RAID60): each group of a
//! row holds k data strips, P and (RAID6) Q, rotated left-symmetrically as md does. A lost strip
//! is rebuilt from the rest of its group; a scrub checks P (and Q, which on RAID6 also locates a
//! single corrupted strip). Writes are planned in `parity_write`.

use super::codes::{gen_parity, read_and_recover, recover};
use super::layout::{Layout, ReadFrom, Window};
use super::scrub::{read_group, write_fixes};
use super::{Array, ArrayError, Piece, Result, ScrubReport};
use crate::aligned::AlignedBuf;
use crate::io::Op;

pub(super) struct Parity;

/// Layout positions of a group's strips that cannot be read in `row`; Err when more are lost
/// than parity covers.
pub(super) fn missing(a: &Array, row: u64, group: usize, layout: &[usize]) -> Result<Vec<usize>> {
    let np = a.geo.level.parity();
    let missing: Vec<usize> = (0..layout.len())
        .filter(|&i| !a.readable(layout[i], row))
        .collect();
    if missing.len() > np {
        return Err(ArrayError::Offline {
            group,
            lost: missing.len(),
            tolerance: np,
        });
    }
    Ok(missing)
}

/// Which strips a scrub rewrites (positions in the layout) after recomputing them in `bufs`.
fn check_and_fix(bufs: &mut [AlignedBuf], np: usize, rep: &mut ScrubReport) -> Vec<usize> {
    use millrace_parity::Raid6Check;
    let strips: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
    let redo: Vec<usize> = if np == 1 {
        let k = bufs.len() - 1;
        if millrace_parity::raid5_check(&strips) {
            vec![]
        } else {
            vec![k]
        }
    } else {
        let k = bufs.len() - 2;
        match millrace_parity::raid6_check(&strips) {
            Raid6Check::Clean => vec![],
            Raid6Check::POnly => vec![k],
            Raid6Check::QOnly => vec![k + 1],
            Raid6Check::Data { index } => {
                rep.located += 1;
                vec![index]
            }
            // Not one strip: as md does, trust the data and recompute P and Q.
            Raid6Check::Unlocatable => vec![k, k + 1],
        }
    };
    if !redo.is_empty() {
        rep.mismatches += 1;
        let mut st: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        recover(&mut st, &redo, np);
    }
    redo
}

impl Layout for Parity {
    fn read_from(&self, a: &Array, p: &Piece) -> Result<ReadFrom> {
        let loc = a.geo.locate(p.row, p.col);
        Ok(if a.readable(loc.member, p.row) {
            ReadFrom::Member(loc.member)
        } else {
            ReadFrom::Reconstruct
        })
    }

    fn write(&self, a: &Array, pieces: &[Piece], data: &[u8]) -> Result<bool> {
        super::parity_write::write(a, pieces, data)
    }

    fn rebuild_group(&self, a: &Array, row: u64, group: usize, targets: &[usize]) -> Result<bool> {
        let layout = a.geo.group_layout(row, group);
        let missing = missing(a, row, group, &layout)?;
        let off = a.member_offset(row, 0);
        let Some(bufs) = read_and_recover(a, &layout, row, &missing) else {
            return Ok(false);
        };
        let mut ops: Vec<Op> = layout
            .iter()
            .enumerate()
            .filter(|(_, m)| targets.contains(m))
            .map(|(i, &m)| Op::write(m, off, &bufs[i]))
            .collect();
        a.run(&mut ops);
        Ok(true)
    }

    fn window_readers(&self, w: &Window) -> Vec<usize> {
        w.sources.to_vec()
    }

    fn rebuild_window(&self, a: &Array, w: &Window, bufs: &mut [AlignedBuf]) {
        let strip = a.geo.strip as usize;
        for r in 0..w.count as usize {
            let layout = a.geo.group_layout(w.first + r as u64, w.group);
            let missing: Vec<usize> = (0..layout.len())
                .filter(|&i| !w.sources.contains(&layout[i]))
                .collect();
            let mut by_member: Vec<Option<&mut [u8]>> = bufs
                .iter_mut()
                .map(|b| Some(&mut b[r * strip..(r + 1) * strip]))
                .collect();
            let mut strips: Vec<&mut [u8]> = layout
                .iter()
                .map(|m| {
                    by_member[m - w.members[0]]
                        .take()
                        .expect("distinct members")
                })
                .collect();
            recover(&mut strips, &missing, a.geo.level.parity());
        }
    }

    fn scrub_group(&self, a: &Array, row: u64, group: usize, repair: bool, rep: &mut ScrubReport) {
        let members = a.geo.group_layout(row, group);
        let Some(mut bufs) = read_group(a, row, &members, rep) else {
            return;
        };
        let fix = check_and_fix(&mut bufs, a.geo.level.parity(), rep);
        if repair {
            write_fixes(a, row, &members, &bufs, &fix, rep);
        }
    }

    fn resync_group(&self, a: &Array, row: u64, group: usize) {
        let geo = &a.geo;
        let layout = geo.group_layout(row, group);
        let k = geo.group_data();
        let off = a.member_offset(row, 0);
        let strip = geo.strip as usize;
        let mut data: Vec<AlignedBuf> = (0..k).map(|_| AlignedBuf::zeroed(strip)).collect();
        let mut ops: Vec<Op> = data
            .iter_mut()
            .zip(&layout)
            .filter(|(_, &m)| a.readable(m, row))
            .map(|(b, &m)| Op::read(m, off, b))
            .collect();
        // Data strips missing: their content lives only in parity; keep it.
        if ops.len() < k || !a.run(&mut ops) {
            return;
        }
        drop(ops);
        let srcs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
        let mut par: Vec<Option<AlignedBuf>> = layout[k..]
            .iter()
            .map(|_| Some(AlignedBuf::zeroed(strip)))
            .collect();
        gen_parity(&srcs, &mut par, geo.level.parity());
        let mut ops: Vec<Op> = par
            .iter()
            .zip(&layout[k..])
            .filter(|(_, &m)| a.writable(m))
            .map(|(b, &m)| Op::write(m, off, b.as_ref().unwrap()))
            .collect();
        a.run(&mut ops);
    }
}
