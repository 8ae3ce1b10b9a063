//! The kernels, written once over a vector type (`Lanes`) and instantiated per instruction set
//! (x86.rs) and for a portable u64 (scalar.rs). Every function here is `inline(always)` so that
//! it is compiled inside its caller's `#[target_feature]` function with that caller's
//! instructions; called anywhere else it would fall back to one intrinsic call per operation.
//!
//! Buffers travel as raw pointers with one length: recovery reads some strips of a stripe and
//! writes others in one call, which slices of one `&mut [&mut [u8]]` cannot express. Every
//! column of vectors is loaded in full before any of it is stored, so an output may also be one
//! of the inputs (xor_into is gen_p with dst among the sources).
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
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const u8) -> Self;
    unsafe fn store(p: *mut u8, v: Self);
    /// Stores past the caches where the instruction set can and `p` is aligned to a vector, else
    /// as `store`: for an output written once and not read again soon (parity straight into a
    /// member's pages), whose lines then need not be read in first. The caller fences the
    /// streamed stores (`crate::fence_streams`) before the output counts as written.
    #[inline(always)]
    unsafe fn stream(p: *mut u8, v: Self) {
        Self::store(p, v)
    }
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

/// P' and Q' of the sources by Horner's scheme, Q' = ((D[t]*g + D[t-1])*g + ...)*g + D[0], over
/// columns of W vectors: W independent chains hide the latency of each chain's serial
/// multiply-by-2, and every strip is read once. A null source is a strip of zeros (it still
/// takes its place in the syndrome's order). Each column of P' and Q' goes to `sink`, which
/// stores them (gen_pq) or finishes a rebuild with them, so that a rebuild reads every strip
/// once too.
#[inline(always)]
pub(crate) unsafe fn syndromes<V: Lanes, const W: usize, S: Sink<V>>(
    src: &[*const u8],
    sink: &S,
    len: usize,
) {
    let top = src.iter().rposition(|s| !s.is_null());
    let (first, lower) = match top {
        Some(t) => (src[t], &src[..t]),
        None => (std::ptr::null(), &src[..0]),
    };
    // Strips of zeros only come from recovery; the usual loop does not test for them.
    let mut i = if first.is_null() || lower.iter().any(|s| s.is_null()) {
        let i = columns::<V, W, true, S>(first, lower, sink, 0, len);
        columns::<V, 1, true, S>(first, lower, sink, i, len)
    } else {
        let i = columns::<V, W, false, S>(first, lower, sink, 0, len);
        columns::<V, 1, false, S>(first, lower, sink, i, len)
    };
    while i < len {
        let mut pv = if first.is_null() { 0 } else { *first.add(i) };
        let mut qv = pv;
        for &s in lower.iter().rev() {
            let d = if s.is_null() { 0 } else { *s.add(i) };
            pv ^= d;
            qv = gf::mul(qv, 2) ^ d;
        }
        sink.byte(i, pv, qv);
        i += 1;
    }
}

/// Whole columns of W vectors from byte `i`; returns where it stopped.
#[inline(always)]
unsafe fn columns<V: Lanes, const W: usize, const SKIP: bool, S: Sink<V>>(
    first: *const u8,
    lower: &[*const u8],
    sink: &S,
    mut i: usize,
    len: usize,
) -> usize {
    let step = W * V::N;
    while i + step <= len {
        let mut pv = [V::zero(); W];
        if !SKIP || !first.is_null() {
            let f = first.add(i);
            for (w, v) in pv.iter_mut().enumerate() {
                *v = V::load(f.add(w * V::N));
            }
        }
        let mut qv = pv;
        for &s in lower.iter().rev() {
            if SKIP && s.is_null() {
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
        sink.column(i, &pv, &qv);
        i += step;
    }
    i
}

/// Where syndromes() puts each column (vectors from byte i) and each tail byte.
pub(crate) trait Sink<V: Lanes> {
    unsafe fn column<const W: usize>(&self, i: usize, p: &[V; W], q: &[V; W]);
    unsafe fn byte(&self, i: usize, p: u8, q: u8);
}

/// gen_pq: stores P (unless null) and Q, streamed past the caches with `NT` (`Lanes::stream`).
pub(crate) struct StorePq<const NT: bool> {
    pub p: *mut u8,
    pub q: *mut u8,
}

impl<V: Lanes, const NT: bool> Sink<V> for StorePq<NT> {
    #[inline(always)]
    unsafe fn column<const W: usize>(&self, i: usize, p: &[V; W], q: &[V; W]) {
        let put = if NT { V::stream } else { V::store };
        if !self.p.is_null() {
            for (w, v) in p.iter().enumerate() {
                put(self.p.add(i + w * V::N), *v);
            }
        }
        for (w, v) in q.iter().enumerate() {
            put(self.q.add(i + w * V::N), *v);
        }
    }
    #[inline(always)]
    unsafe fn byte(&self, i: usize, p: u8, q: u8) {
        if !self.p.is_null() {
            *self.p.add(i) = p;
        }
        *self.q.add(i) = q;
    }
}

/// One data strip x and one parity lost; P', Q' are the syndromes without x.
/// With P lost: Dx = g^-x * (Q ^ Q') and P = P' ^ Dx (`c` = g^-x, `par` = Q).
/// With Q lost: Dx = P ^ P' and Q = Q' ^ g^x * Dx (`c` = g^x, `par` = P).
pub(crate) struct DataAndParity<V: Lanes, const LOST_Q: bool> {
    pub t: V::Table,
    pub row: &'static [u8; 256],
    pub par: *const u8,
    pub dx: *mut u8,
    pub out: *mut u8,
}

impl<V: Lanes, const LOST_Q: bool> DataAndParity<V, LOST_Q> {
    #[inline(always)]
    pub unsafe fn new(c: u8, par: *const u8, dx: *mut u8, out: *mut u8) -> Self {
        DataAndParity {
            t: V::table(c),
            row: gf::mul_row(c),
            par,
            dx,
            out,
        }
    }
}

impl<V: Lanes, const LOST_Q: bool> Sink<V> for DataAndParity<V, LOST_Q> {
    #[inline(always)]
    unsafe fn column<const W: usize>(&self, i: usize, p: &[V; W], q: &[V; W]) {
        for w in 0..W {
            let o = i + w * V::N;
            let par = V::load(self.par.add(o));
            let (dx, out) = if LOST_Q {
                let dx = V::xor(par, p[w]);
                (dx, V::xor(q[w], V::mul(&self.t, dx)))
            } else {
                let dx = V::mul(&self.t, V::xor(par, q[w]));
                (dx, V::xor(p[w], dx))
            };
            V::store(self.dx.add(o), dx);
            V::store(self.out.add(o), out);
        }
    }
    #[inline(always)]
    unsafe fn byte(&self, i: usize, p: u8, q: u8) {
        let par = *self.par.add(i);
        let (dx, out) = if LOST_Q {
            let dx = par ^ p;
            (dx, q ^ self.row[dx as usize])
        } else {
            let dx = self.row[(par ^ q) as usize];
            (dx, p ^ dx)
        };
        *self.dx.add(i) = dx;
        *self.out.add(i) = out;
    }
}

/// Two data strips x < y lost; P', Q' are the syndromes without both. With Pxy = P ^ P' and
/// Qxy = Q ^ Q': Dx = A*Pxy ^ B*Qxy and Dy = Pxy ^ Dx.
pub(crate) struct TwoData<V: Lanes> {
    pub ta: V::Table,
    pub tb: V::Table,
    pub ra: &'static [u8; 256],
    pub rb: &'static [u8; 256],
    pub p: *const u8,
    pub q: *const u8,
    pub dx: *mut u8,
    pub dy: *mut u8,
}

impl<V: Lanes> TwoData<V> {
    #[inline(always)]
    pub unsafe fn new(a: u8, b: u8, p: *const u8, q: *const u8, dx: *mut u8, dy: *mut u8) -> Self {
        TwoData {
            ta: V::table(a),
            tb: V::table(b),
            ra: gf::mul_row(a),
            rb: gf::mul_row(b),
            p,
            q,
            dx,
            dy,
        }
    }
}

impl<V: Lanes> Sink<V> for TwoData<V> {
    #[inline(always)]
    unsafe fn column<const W: usize>(&self, i: usize, p: &[V; W], q: &[V; W]) {
        for w in 0..W {
            let o = i + w * V::N;
            let pxy = V::xor(V::load(self.p.add(o)), p[w]);
            let qxy = V::xor(V::load(self.q.add(o)), q[w]);
            let dx = V::xor(V::mul(&self.ta, pxy), V::mul(&self.tb, qxy));
            V::store(self.dx.add(o), dx);
            V::store(self.dy.add(o), V::xor(pxy, dx));
        }
    }
    #[inline(always)]
    unsafe fn byte(&self, i: usize, p: u8, q: u8) {
        let pxy = *self.p.add(i) ^ p;
        let qxy = *self.q.add(i) ^ q;
        let dx = self.ra[pxy as usize] ^ self.rb[qxy as usize];
        *self.dx.add(i) = dx;
        *self.dy.add(i) = pxy ^ dx;
    }
}

/// p = XOR of every source (at least one), in one pass over the sources per column rather than
/// one pass over p per source; streamed past the caches with `NT` (`Lanes::stream`).
#[inline(always)]
pub(crate) unsafe fn gen_p<V: Lanes, const W: usize, const NT: bool>(
    src: &[*const u8],
    p: *mut u8,
    len: usize,
) {
    let Some((&first, rest)) = src.split_first() else {
        p.write_bytes(0, len);
        return;
    };
    let mut i = p_columns::<V, W, NT>(first, rest, p, 0, len);
    i = p_columns::<V, 1, NT>(first, rest, p, i, len);
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
unsafe fn p_columns<V: Lanes, const W: usize, const NT: bool>(
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
        let put = if NT { V::stream } else { V::store };
        for (w, v) in pv.iter().enumerate() {
            put(p.add(i + w * V::N), *v);
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
