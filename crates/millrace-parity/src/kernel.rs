//! The kernels, written once over a vector type (`Lanes`) and instantiated per instruction set
//! (x86.rs) and for a portable u64 (scalar.rs). Every function here is `inline(always)` so that
//! it is compiled inside its caller's `#[target_feature]` function with that caller's
//! instructions; called anywhere else it would fall back to one intrinsic call per operation.
//!
//! Buffers travel as raw pointers with one length: the recovery code passes strips that are
//! both read and written in one call (P' computed into the strip being rebuilt), which slices
//! cannot express. Every column of vectors is loaded in full before any of it is stored, so an
//! output may be one of the inputs.
//!
//! SAFETY (every function): each pointer is valid for `len` bytes of reads (inputs) or writes
//! (outputs), and the CPU has the instructions `V` uses.

use crate::gf;

/// One SIMD register's worth of bytes and the field operations on it.
pub(crate) trait Lanes: Copy {
    /// Bytes per vector.
    const N: usize;
    /// What `mul` needs to multiply by one constant, prepared once per call.
    type Table: Copy;
    unsafe fn load(p: *const u8) -> Self;
    unsafe fn store(p: *mut u8, v: Self);
    unsafe fn xor(a: Self, b: Self) -> Self;
    /// Every byte times 2 (= g).
    unsafe fn mul2(a: Self) -> Self;
    /// mul2(a) ^ d, for instruction sets that fuse the two.
    #[inline(always)]
    unsafe fn mul2_xor(a: Self, d: Self) -> Self {
        Self::xor(Self::mul2(a), d)
    }
    unsafe fn table(c: u8) -> Self::Table;
    unsafe fn mul(t: &Self::Table, v: Self) -> Self;
}

/// P and Q by Horner's scheme, Q = ((D[t]*g + D[t-1])*g + ...)*g + D[0], over columns of W
/// vectors: W independent chains hide the latency of each chain's serial multiply-by-2, and
/// every strip is read once. A null source is a strip of zeros (it still takes its place in
/// the syndrome's order); a null `p` asks for Q alone.
#[inline(always)]
pub(crate) unsafe fn gen_pq<V: Lanes, const W: usize>(
    src: &[*const u8],
    p: *mut u8,
    q: *mut u8,
    len: usize,
) {
    let Some(top) = src.iter().rposition(|s| !s.is_null()) else {
        if !p.is_null() {
            p.write_bytes(0, len);
        }
        q.write_bytes(0, len);
        return;
    };
    let lower = &src[..top];
    let mut i = pq_columns::<V, W>(src[top], lower, p, q, 0, len);
    i = pq_columns::<V, 1>(src[top], lower, p, q, i, len);
    while i < len {
        let mut pv = *src[top].add(i);
        let mut qv = pv;
        for &s in lower.iter().rev() {
            let d = if s.is_null() { 0 } else { *s.add(i) };
            pv ^= d;
            qv = gf::mul(qv, 2) ^ d;
        }
        if !p.is_null() {
            *p.add(i) = pv;
        }
        *q.add(i) = qv;
        i += 1;
    }
}

/// Whole columns of W vectors from byte `i`; returns where it stopped.
#[inline(always)]
unsafe fn pq_columns<V: Lanes, const W: usize>(
    first: *const u8,
    lower: &[*const u8],
    p: *mut u8,
    q: *mut u8,
    mut i: usize,
    len: usize,
) -> usize {
    let step = W * V::N;
    while i + step <= len {
        let f = first.add(i);
        let mut pv = [V::load(f); W];
        for (w, v) in pv.iter_mut().enumerate().skip(1) {
            *v = V::load(f.add(w * V::N));
        }
        let mut qv = pv;
        for &s in lower.iter().rev() {
            if s.is_null() {
                for v in qv.iter_mut() {
                    *v = V::mul2(*v);
                }
                continue;
            }
            let s = s.add(i);
            for w in 0..W {
                let d = V::load(s.add(w * V::N));
                qv[w] = V::mul2_xor(qv[w], d);
                pv[w] = V::xor(pv[w], d);
            }
        }
        if !p.is_null() {
            for (w, v) in pv.iter().enumerate() {
                V::store(p.add(i + w * V::N), *v);
            }
        }
        for (w, v) in qv.iter().enumerate() {
            V::store(q.add(i + w * V::N), *v);
        }
        i += step;
    }
    i
}

/// p = XOR of every source (at least one), in one pass over the sources per column rather than
/// one pass over p per source.
#[inline(always)]
pub(crate) unsafe fn gen_p<V: Lanes, const W: usize>(src: &[*const u8], p: *mut u8, len: usize) {
    let Some((&first, rest)) = src.split_first() else {
        p.write_bytes(0, len);
        return;
    };
    let mut i = p_columns::<V, W>(first, rest, p, 0, len);
    i = p_columns::<V, 1>(first, rest, p, i, len);
    while i < len {
        let mut v = *first.add(i);
        for &s in rest {
            v ^= *s.add(i);
        }
        *p.add(i) = v;
        i += 1;
    }
}

#[inline(always)]
unsafe fn p_columns<V: Lanes, const W: usize>(
    first: *const u8,
    rest: &[*const u8],
    p: *mut u8,
    mut i: usize,
    len: usize,
) -> usize {
    let step = W * V::N;
    while i + step <= len {
        let f = first.add(i);
        let mut pv = [V::load(f); W];
        for (w, v) in pv.iter_mut().enumerate().skip(1) {
            *v = V::load(f.add(w * V::N));
        }
        for &s in rest {
            let s = s.add(i);
            for (w, v) in pv.iter_mut().enumerate() {
                *v = V::xor(*v, V::load(s.add(w * V::N)));
            }
        }
        for (w, v) in pv.iter().enumerate() {
            V::store(p.add(i + w * V::N), *v);
        }
        i += step;
    }
    i
}

/// dst = c * (a ^ b), or with `ACC` dst ^= c * (a ^ b). A null `b` reads as zeros, which makes
/// this the plain multiply by a constant.
#[inline(always)]
pub(crate) unsafe fn mul<V: Lanes, const W: usize, const ACC: bool>(
    c: u8,
    a: *const u8,
    b: *const u8,
    dst: *mut u8,
    len: usize,
) {
    let t = V::table(c);
    let step = W * V::N;
    let mut i = 0;
    while i + step <= len {
        for w in 0..W {
            let o = i + w * V::N;
            let mut x = V::load(a.add(o));
            if !b.is_null() {
                x = V::xor(x, V::load(b.add(o)));
            }
            let mut r = V::mul(&t, x);
            if ACC {
                r = V::xor(r, V::load(dst.add(o)));
            }
            V::store(dst.add(o), r);
        }
        i += step;
    }
    let row = gf::mul_row(c);
    while i < len {
        let x = *a.add(i) ^ if b.is_null() { 0 } else { *b.add(i) };
        let r = row[x as usize];
        *dst.add(i) = if ACC { *dst.add(i) ^ r } else { r };
        i += 1;
    }
}

/// The last step of rebuilding two data strips x and y: from Pxy = P ^ P' and Qxy = Q ^ Q'
/// (P', Q' the syndromes with both strips left out, found in `px` and `qy`),
/// Dx = A*Pxy ^ B*Qxy and Dy = Pxy ^ Dx, stored over `px` and `qy`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn two_data<V: Lanes, const W: usize>(
    a: u8,
    b: u8,
    p: *const u8,
    q: *const u8,
    px: *mut u8,
    qy: *mut u8,
    len: usize,
) {
    let (ta, tb) = (V::table(a), V::table(b));
    let step = W * V::N;
    let mut i = 0;
    while i + step <= len {
        for w in 0..W {
            let o = i + w * V::N;
            let pxy = V::xor(V::load(p.add(o)), V::load(px.add(o)));
            let qxy = V::xor(V::load(q.add(o)), V::load(qy.add(o)));
            let dx = V::xor(V::mul(&ta, pxy), V::mul(&tb, qxy));
            V::store(px.add(o), dx);
            V::store(qy.add(o), V::xor(pxy, dx));
        }
        i += step;
    }
    let (ra, rb) = (gf::mul_row(a), gf::mul_row(b));
    while i < len {
        let pxy = *p.add(i) ^ *px.add(i);
        let qxy = *q.add(i) ^ *qy.add(i);
        let dx = ra[pxy as usize] ^ rb[qxy as usize];
        *px.add(i) = dx;
        *qy.add(i) = pxy ^ dx;
        i += 1;
    }
}
