//! x86-64 kernels. gen_pq uses Horner's scheme with multiply-by-2 done as a shift and a
//! conditional xor of 0x1d (no tables), so it needs only SSE2 or AVX2; multiply by an arbitrary
//! constant uses two 16-entry nibble tables and pshufb (SSSE3 or AVX2).

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

/// SAFETY (all functions here): the caller checked the CPU feature named in `target_feature`,
/// and every slice of one call has the length of `p`/`dst`.
/// Columns of 128 bytes: four vectors of P and Q in flight keep the load and ALU ports busy
/// while Horner's chain for each vector stays serial.
#[target_feature(enable = "avx2")]
pub unsafe fn gen_pq_avx2(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    const W: usize = 4;
    let len = p.len();
    let k = data.len();
    let poly = _mm256_set1_epi8(0x1d);
    let zero = _mm256_setzero_si256();
    let body = len / (32 * W) * (32 * W);
    let ptrs: Vec<*const u8> = data.iter().map(|d| d.as_ptr()).collect();
    let mut i = 0;
    while i < body {
        let last = ptrs[k - 1].add(i);
        let mut pv = [zero; W];
        for (w, v) in pv.iter_mut().enumerate() {
            *v = _mm256_loadu_si256(last.add(32 * w) as *const __m256i);
        }
        let mut qv = pv;
        for &d in ptrs[..k - 1].iter().rev() {
            let s = d.add(i);
            for w in 0..W {
                let dv = _mm256_loadu_si256(s.add(32 * w) as *const __m256i);
                // q = 2q: bytes with the top bit set wrap around through the polynomial.
                let m = _mm256_cmpgt_epi8(zero, qv[w]);
                let dbl = _mm256_add_epi8(qv[w], qv[w]);
                qv[w] = _mm256_xor_si256(_mm256_xor_si256(dbl, _mm256_and_si256(m, poly)), dv);
                pv[w] = _mm256_xor_si256(pv[w], dv);
            }
        }
        let pp = p.as_mut_ptr().add(i);
        let qq = q.as_mut_ptr().add(i);
        for w in 0..W {
            _mm256_storeu_si256(pp.add(32 * w) as *mut __m256i, pv[w]);
            _mm256_storeu_si256(qq.add(32 * w) as *mut __m256i, qv[w]);
        }
        i += 32 * W;
    }
    crate::scalar::tail_pq(data, p, q, body);
}

/// P in one pass over the data (not one pass per strip), 128 bytes per column.
#[target_feature(enable = "avx2")]
pub unsafe fn gen_p_avx2(data: &[&[u8]], p: &mut [u8]) {
    const W: usize = 4;
    let len = p.len();
    let body = len / (32 * W) * (32 * W);
    let ptrs: Vec<*const u8> = data.iter().map(|d| d.as_ptr()).collect();
    let mut i = 0;
    while i < body {
        let mut pv = [_mm256_setzero_si256(); W];
        for &d in &ptrs {
            let s = d.add(i);
            for (w, v) in pv.iter_mut().enumerate() {
                *v = _mm256_xor_si256(*v, _mm256_loadu_si256(s.add(32 * w) as *const __m256i));
            }
        }
        let pp = p.as_mut_ptr().add(i);
        for (w, v) in pv.iter().enumerate() {
            _mm256_storeu_si256(pp.add(32 * w) as *mut __m256i, *v);
        }
        i += 32 * W;
    }
    for (j, b) in p.iter_mut().enumerate().skip(body) {
        *b = data.iter().fold(0, |acc, d| acc ^ d[j]);
    }
}

#[target_feature(enable = "sse2")]
pub unsafe fn gen_pq_sse2(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    let k = data.len();
    let poly = _mm_set1_epi8(0x1d);
    let zero = _mm_setzero_si128();
    let body = len / 32 * 32;
    let mut i = 0;
    while i < body {
        let last = data[k - 1].as_ptr().add(i);
        let mut p0 = _mm_loadu_si128(last as *const __m128i);
        let mut p1 = _mm_loadu_si128(last.add(16) as *const __m128i);
        let mut q0 = p0;
        let mut q1 = p1;
        for d in data[..k - 1].iter().rev() {
            let s = d.as_ptr().add(i);
            let d0 = _mm_loadu_si128(s as *const __m128i);
            let d1 = _mm_loadu_si128(s.add(16) as *const __m128i);
            let m0 = _mm_cmpgt_epi8(zero, q0);
            let m1 = _mm_cmpgt_epi8(zero, q1);
            q0 = _mm_add_epi8(q0, q0);
            q1 = _mm_add_epi8(q1, q1);
            q0 = _mm_xor_si128(q0, _mm_and_si128(m0, poly));
            q1 = _mm_xor_si128(q1, _mm_and_si128(m1, poly));
            q0 = _mm_xor_si128(q0, d0);
            q1 = _mm_xor_si128(q1, d1);
            p0 = _mm_xor_si128(p0, d0);
            p1 = _mm_xor_si128(p1, d1);
        }
        let pp = p.as_mut_ptr().add(i);
        let qq = q.as_mut_ptr().add(i);
        _mm_storeu_si128(pp as *mut __m128i, p0);
        _mm_storeu_si128(pp.add(16) as *mut __m128i, p1);
        _mm_storeu_si128(qq as *mut __m128i, q0);
        _mm_storeu_si128(qq.add(16) as *mut __m128i, q1);
        i += 32;
    }
    crate::scalar::tail_pq(data, p, q, body);
}

fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let lo = core::array::from_fn(|x| crate::gf::mul(c, x as u8));
    let hi = core::array::from_fn(|x| crate::gf::mul(c, (x as u8) << 4));
    (lo, hi)
}

#[target_feature(enable = "avx2")]
pub unsafe fn mul_avx2(c: u8, src: &[u8], dst: &mut [u8], accumulate: bool) {
    let (lo, hi) = nibble_tables(c);
    let lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(lo.as_ptr() as *const __m128i));
    let hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(hi.as_ptr() as *const __m128i));
    let mask = _mm256_set1_epi8(0x0f);
    let len = dst.len();
    let body = len / 32 * 32;
    let mut i = 0;
    while i < body {
        let v = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
        let l = _mm256_shuffle_epi8(lo, _mm256_and_si256(v, mask));
        let h = _mm256_shuffle_epi8(hi, _mm256_and_si256(_mm256_srli_epi64(v, 4), mask));
        let mut r = _mm256_xor_si256(l, h);
        let dp = dst.as_mut_ptr().add(i) as *mut __m256i;
        if accumulate {
            r = _mm256_xor_si256(r, _mm256_loadu_si256(dp));
        }
        _mm256_storeu_si256(dp, r);
        i += 32;
    }
    tail_mul(c, &src[body..], &mut dst[body..], accumulate);
}

#[target_feature(enable = "ssse3")]
pub unsafe fn mul_ssse3(c: u8, src: &[u8], dst: &mut [u8], accumulate: bool) {
    let (lo, hi) = nibble_tables(c);
    let lo = _mm_loadu_si128(lo.as_ptr() as *const __m128i);
    let hi = _mm_loadu_si128(hi.as_ptr() as *const __m128i);
    let mask = _mm_set1_epi8(0x0f);
    let len = dst.len();
    let body = len / 16 * 16;
    let mut i = 0;
    while i < body {
        let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        let l = _mm_shuffle_epi8(lo, _mm_and_si128(v, mask));
        let h = _mm_shuffle_epi8(hi, _mm_and_si128(_mm_srli_epi64(v, 4), mask));
        let mut r = _mm_xor_si128(l, h);
        let dp = dst.as_mut_ptr().add(i) as *mut __m128i;
        if accumulate {
            r = _mm_xor_si128(r, _mm_loadu_si128(dp));
        }
        _mm_storeu_si128(dp, r);
        i += 16;
    }
    tail_mul(c, &src[body..], &mut dst[body..], accumulate);
}

fn tail_mul(c: u8, src: &[u8], dst: &mut [u8], accumulate: bool) {
    if accumulate {
        crate::scalar::mul_xor_into(c, src, dst)
    } else {
        crate::scalar::mul_into(c, src, dst)
    }
}
