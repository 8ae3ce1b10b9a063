//! Portable kernels: eight bytes at a time in a u64 where the operation allows it.

const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Multiplies each of eight packed bytes by 2 in GF(2^8).
#[inline(always)]
fn mul2(v: u64) -> u64 {
    let hi = (v & HIGH) >> 7;
    ((v & LOW7) << 1) ^ (hi * 0x1d)
}

#[inline(always)]
fn load(s: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(s[i..i + 8].try_into().unwrap())
}

pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    let k = data.len();
    let body = len / 8 * 8;
    let mut i = 0;
    while i < body {
        let mut pv = load(data[k - 1], i);
        let mut qv = pv;
        for d in data[..k - 1].iter().rev() {
            let v = load(d, i);
            pv ^= v;
            qv = mul2(qv) ^ v;
        }
        p[i..i + 8].copy_from_slice(&pv.to_ne_bytes());
        q[i..i + 8].copy_from_slice(&qv.to_ne_bytes());
        i += 8;
    }
    tail_pq(data, p, q, body);
}

/// The bytes from `from` on, one at a time.
pub fn tail_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8], from: usize) {
    let k = data.len();
    for i in from..p.len() {
        let mut pv = data[k - 1][i];
        let mut qv = pv;
        for d in data[..k - 1].iter().rev() {
            pv ^= d[i];
            qv = crate::gf::mul(qv, 2) ^ d[i];
        }
        p[i] = pv;
        q[i] = qv;
    }
}

pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    p.copy_from_slice(data[0]);
    for d in &data[1..] {
        xor_into(p, d);
    }
}

pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    // Plain loops over fixed chunks: the compiler vectorises these with the baseline SIMD.
    let mut dc = dst.chunks_exact_mut(64);
    let mut sc = src.chunks_exact(64);
    for (d, s) in (&mut dc).zip(&mut sc) {
        for (a, b) in d.iter_mut().zip(s) {
            *a ^= *b;
        }
    }
    for (a, b) in dc.into_remainder().iter_mut().zip(sc.remainder()) {
        *a ^= *b;
    }
}

pub fn mul_xor_into(c: u8, src: &[u8], dst: &mut [u8]) {
    let row = crate::gf::mul_row(c);
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= row[*s as usize];
    }
}

pub fn mul_into(c: u8, src: &[u8], dst: &mut [u8]) {
    let row = crate::gf::mul_row(c);
    for (d, s) in dst.iter_mut().zip(src) {
        *d = row[*s as usize];
    }
}
