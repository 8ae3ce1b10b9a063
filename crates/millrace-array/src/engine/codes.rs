//! The codes over a group's strips, shared by reads, writes, rebuild and the partial-parity
//! log's recovery: P (and Q) generation, recovery of missing strips, one strip's share of a
//! parity, and reading a row to recover it. Nothing here plans I/O for a request.

use super::Array;
use crate::aligned::AlignedBuf;
use crate::io::Op;

/// Computes P (and Q) of `srcs` into `par`.
pub(super) fn gen_parity<B: std::ops::DerefMut<Target = [u8]>>(
    srcs: &[&[u8]],
    par: &mut [Option<B>],
    np: usize,
) {
    let (p, q) = par.split_at_mut(1);
    let p = p[0].as_mut().unwrap();
    if np == 2 {
        millrace_parity::gen_pq(srcs, p, q[0].as_mut().unwrap());
    } else {
        millrace_parity::gen_p(srcs, p);
    }
}

/// Reads the readable strips of one row of a group (`layout`: its members in strip order) and
/// rebuilds the `missing` ones from them; None where a read failed (its member is then failed).
/// Rebuild and the partial-parity log's recovery both make a row whole this way.
pub(super) fn read_and_recover(
    a: &Array,
    layout: &[usize],
    row: u64,
    missing: &[usize],
) -> Option<Vec<AlignedBuf>> {
    let off = a.member_offset(row, 0);
    let strip = a.geo.strip as usize;
    let mut bufs: Vec<AlignedBuf> = layout.iter().map(|_| AlignedBuf::zeroed(strip)).collect();
    let mut ops: Vec<Op> = bufs
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| !missing.contains(i))
        .map(|(i, b)| Op::read(layout[i], off, b))
        .collect();
    if !a.run(&mut ops) {
        return None;
    }
    drop(ops);
    let mut strips: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    recover(&mut strips, missing, a.geo.level.parity());
    Some(bufs)
}

/// Rebuilds the missing strips (layout positions) of one group's span in place.
pub(super) fn recover(strips: &mut [&mut [u8]], missing: &[usize], np: usize) {
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

/// Adds parity `j`'s share of data strip `index` (`src`) into `dst`.
pub(super) fn add_share(j: usize, index: usize, src: &[u8], dst: &mut [u8]) {
    if j == 0 {
        millrace_parity::xor_into(dst, src);
    } else {
        millrace_parity::mul_xor_into(millrace_parity::gf::exp(index), src, dst);
    }
}
