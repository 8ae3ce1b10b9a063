//! RAID5/6 parity: P is the XOR of the data strips; Q is the Reed-Solomon syndrome
//! sum(g^j * D_j) over GF(2^8) with polynomial 0x11d and generator 2, the math of Linux md and
//! ISA-L, with j the strip's index in syndrome order.
//!
//! Why hand-written: no well-kept Rust crate computes md's P+Q syndrome with SIMD
//! (reed-solomon-erasure and reed-solomon-simd implement other codes and matrices, so their
//! parity would not match md's or ISA-L's on disk), and ISA-L is a C library we do not want as
//! a hard build or run-time dependency. ISA-L is the reference instead: the tests compare every
//! kernel with it byte for byte, and the benchmark runs both on the same buffers
//! (`cargo run --release -p millrace-parity --example parity_bench`).
//!
//! The kernel is picked once, at first use, from the CPU's features: AVX-512 with GFNI, AVX-512,
//! AVX2 with GFNI, AVX2, SSSE3, SSE2, or portable u64 code (`active_kernel` names it).
//! `MILLRACE_PARITY_KERNEL=<name>` forces an available one (for comparisons and bug hunts).
//! GFNI matters most: multiplying by a constant is linear over GF(2), so GF2P8AFFINEQB does it
//! for any constant of our field in one instruction (x86.rs), where shift-and-reduce takes four
//! per doubling and nibble tables five per multiply. Those kernels need Rust 1.89's intrinsics;
//! build.rs leaves them out on older compilers.
//!
//! Every buffer of one call must have the same length, and any length works. Unequal lengths
//! are a caller's bug: debug builds panic on them; release builds process the common prefix
//! (never memory outside a buffer), except `raid6_recover`, which returns an error.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

/// A kernel's entry points for vector type `$v`, compiled with the attribute given (the
/// `#[target_feature]` of its instruction set), and the `OPS` table of them. The numbers are
/// the vectors per column (unroll) of the syndromes, of gen_p and of the multiplies.
macro_rules! entry_points_body {
    ($v:ty, $w_pq:literal, $w_p:literal, $w_mul:literal $(, #[$attr:meta])?) => {
        use $crate::kernel::{self as k, DataAndParity, StorePq, TwoData};

        $(#[$attr])?
        unsafe fn gen_pq(src: &[*const u8], p: *mut u8, q: *mut u8, len: usize) {
            k::syndromes::<$v, $w_pq, _>(src, &StorePq::<false> { p, q }, len)
        }
        $(#[$attr])?
        unsafe fn gen_p(src: &[*const u8], p: *mut u8, len: usize) {
            k::gen_p::<$v, $w_p, false>(src, p, len)
        }
        $(#[$attr])?
        unsafe fn gen_pq_nt(src: &[*const u8], p: *mut u8, q: *mut u8, len: usize) {
            k::syndromes::<$v, $w_pq, _>(src, &StorePq::<true> { p, q }, len)
        }
        $(#[$attr])?
        unsafe fn gen_p_nt(src: &[*const u8], p: *mut u8, len: usize) {
            k::gen_p::<$v, $w_p, true>(src, p, len)
        }
        $(#[$attr])?
        unsafe fn mul(c: u8, a: *const u8, b: *const u8, dst: *mut u8, len: usize) {
            k::mul::<$v, $w_mul, false>(c, a, b, dst, len)
        }
        $(#[$attr])?
        unsafe fn mul_acc(c: u8, a: *const u8, b: *const u8, dst: *mut u8, len: usize) {
            k::mul::<$v, $w_mul, true>(c, a, b, dst, len)
        }
        $(#[$attr])?
        #[allow(clippy::too_many_arguments)]
        unsafe fn data_and_parity(
            src: &[*const u8],
            lost_q: bool,
            c: u8,
            par: *const u8,
            dx: *mut u8,
            out: *mut u8,
            len: usize,
        ) {
            if lost_q {
                let sink = DataAndParity::<$v, true>::new(c, par, dx, out);
                k::syndromes::<$v, $w_pq, _>(src, &sink, len)
            } else {
                let sink = DataAndParity::<$v, false>::new(c, par, dx, out);
                k::syndromes::<$v, $w_pq, _>(src, &sink, len)
            }
        }
        $(#[$attr])?
        #[allow(clippy::too_many_arguments)]
        unsafe fn two_data(
            src: &[*const u8],
            a: u8,
            b: u8,
            p: *const u8,
            q: *const u8,
            dx: *mut u8,
            dy: *mut u8,
            len: usize,
        ) {
            let sink = TwoData::<$v>::new(a, b, p, q, dx, dy);
            k::syndromes::<$v, $w_pq, _>(src, &sink, len)
        }

        pub(crate) const OPS: $crate::Ops = $crate::Ops {
            gen_pq,
            gen_p,
            gen_pq_nt,
            gen_p_nt,
            mul,
            mul_acc,
            data_and_parity,
            two_data,
        };
    };
}

mod error;
pub mod gf;
mod kernel;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

pub use error::ParityError;

/// A kernel's entry points (SAFETY for all: see kernel.rs; the CPU runs the kernel's ISA).
#[derive(Clone, Copy)]
pub(crate) struct Ops {
    gen_pq: unsafe fn(&[*const u8], *mut u8, *mut u8, usize),
    gen_p: unsafe fn(&[*const u8], *mut u8, usize),
    /// gen_pq and gen_p with their outputs streamed past the caches (kernel::Lanes::stream).
    gen_pq_nt: unsafe fn(&[*const u8], *mut u8, *mut u8, usize),
    gen_p_nt: unsafe fn(&[*const u8], *mut u8, usize),
    mul: unsafe fn(u8, *const u8, *const u8, *mut u8, usize),
    mul_acc: unsafe fn(u8, *const u8, *const u8, *mut u8, usize),
    /// Rebuilds data strip x and P (lost_q false) or Q (true): see kernel::DataAndParity.
    #[allow(clippy::type_complexity)]
    data_and_parity: unsafe fn(&[*const u8], bool, u8, *const u8, *mut u8, *mut u8, usize),
    /// Rebuilds data strips x and y: see kernel::TwoData.
    #[allow(clippy::type_complexity)]
    two_data: unsafe fn(&[*const u8], u8, u8, *const u8, *const u8, *mut u8, *mut u8, usize),
}

const SCALAR_OPS: Ops = scalar::OPS;

/// An implementation of the kernels. Public so that tests and the benchmark can run each one
/// this CPU has; the library itself always uses the one `active_kernel` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    Scalar,
    Sse2,
    Ssse3,
    Avx2,
    /// AVX2 registers with GF2P8AFFINEQB (Intel Ice Lake / Alder Lake and later, AMD Zen 4+).
    Avx2Gfni,
    /// AVX-512F and BW without GFNI (Intel Skylake-SP, Cascade Lake).
    Avx512,
    Avx512Gfni,
}

impl Kernel {
    const ALL: [Kernel; 7] = [
        Kernel::Scalar,
        Kernel::Sse2,
        Kernel::Ssse3,
        Kernel::Avx2,
        Kernel::Avx2Gfni,
        Kernel::Avx512,
        Kernel::Avx512Gfni,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Sse2 => "sse2",
            Kernel::Ssse3 => "ssse3",
            Kernel::Avx2 => "avx2",
            Kernel::Avx2Gfni => "avx2-gfni",
            Kernel::Avx512 => "avx512",
            Kernel::Avx512Gfni => "avx512-gfni",
        }
    }

    /// Whether this build has the kernel and this CPU can run it.
    pub fn is_available(self) -> bool {
        available_kernels().contains(&self)
    }

    fn detect(self) -> Option<Ops> {
        #[cfg(target_arch = "x86_64")]
        {
            let f = |name: &str| -> bool {
                match name {
                    "sse2" => is_x86_feature_detected!("sse2"),
                    "ssse3" => is_x86_feature_detected!("ssse3"),
                    "avx2" => is_x86_feature_detected!("avx2"),
                    #[cfg(millrace_avx512)]
                    "gfni" => is_x86_feature_detected!("gfni"),
                    #[cfg(millrace_avx512)]
                    "avx512" => {
                        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
                    }
                    _ => false,
                }
            };
            match self {
                Kernel::Scalar => Some(SCALAR_OPS),
                Kernel::Sse2 => f("sse2").then_some(x86::sse2::OPS),
                Kernel::Ssse3 => f("ssse3").then_some(x86::ssse3::OPS),
                Kernel::Avx2 => f("avx2").then_some(x86::avx2::OPS),
                #[cfg(millrace_avx512)]
                Kernel::Avx2Gfni => (f("avx2") && f("gfni")).then_some(x86::avx2_gfni::OPS),
                #[cfg(millrace_avx512)]
                Kernel::Avx512 => f("avx512").then_some(x86::avx512::OPS),
                #[cfg(millrace_avx512)]
                Kernel::Avx512Gfni => (f("avx512") && f("gfni")).then_some(x86::avx512_gfni::OPS),
                #[allow(unreachable_patterns)]
                _ => None,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            (self == Kernel::Scalar).then_some(SCALAR_OPS)
        }
    }

    fn ops(self) -> Ops {
        match self.detect() {
            Some(ops) => ops,
            None => panic!(
                "the {} parity kernel is not available on this CPU",
                self.name()
            ),
        }
    }
}

/// The kernels this build and CPU can run, slowest first.
pub fn available_kernels() -> &'static [Kernel] {
    static AVAILABLE: OnceLock<Vec<Kernel>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.detect().is_some())
            .collect()
    })
}

fn active() -> &'static (Kernel, Ops) {
    static ACTIVE: OnceLock<(Kernel, Ops)> = OnceLock::new();
    ACTIVE.get_or_init(|| {
        let avail = available_kernels();
        let forced = std::env::var("MILLRACE_PARITY_KERNEL").ok();
        let k = forced
            .and_then(|name| avail.iter().copied().find(|k| k.name() == name))
            .unwrap_or(avail[avail.len() - 1]);
        (k, k.ops())
    })
}

#[inline]
fn ops() -> &'static Ops {
    &active().1
}

/// The kernel chosen at run time: "avx512-gfni", "avx512", "avx2-gfni", "avx2", "ssse3",
/// "sse2" or "scalar".
pub fn active_kernel() -> &'static str {
    active().0.name()
}

/// Up to this many strips, pointer lists live on the stack (no allocation per call).
const STACK_STRIPS: usize = 40;

/// Runs `f` on the strips' pointers; the length is the shortest strip's (see the crate docs).
fn with_ptrs<R>(strips: &[&[u8]], mut len: usize, f: impl FnOnce(&[*const u8], usize) -> R) -> R {
    for s in strips {
        debug_assert_eq!(s.len(), len, "parity buffers differ in length");
        len = len.min(s.len());
    }
    if strips.len() <= STACK_STRIPS {
        let mut buf = [std::ptr::null::<u8>(); STACK_STRIPS];
        for (b, s) in buf.iter_mut().zip(strips) {
            *b = s.as_ptr();
        }
        f(&buf[..strips.len()], len)
    } else {
        f(&strips.iter().map(|s| s.as_ptr()).collect::<Vec<_>>(), len)
    }
}

/// dst ^= src
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    xor_into_ops(ops(), dst, src)
}

fn xor_into_ops(ops: &Ops, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len(), "parity buffers differ in length");
    let len = dst.len().min(src.len());
    let d = dst.as_mut_ptr();
    // SAFETY: both valid for len bytes; an output may be one of gen_p's inputs (kernel.rs).
    unsafe { (ops.gen_p)(&[d as *const u8, src.as_ptr()], d, len) }
}

/// p = XOR of all data (zeros for no data)
pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    gen_p_ops(ops(), data, p, false)
}

/// gen_p, its stores streamed past the caches (and fenced) with `streamed`.
fn gen_p_ops(ops: &Ops, data: &[&[u8]], p: &mut [u8], streamed: bool) {
    let f = if streamed { ops.gen_p_nt } else { ops.gen_p };
    with_ptrs(data, p.len(), |src, len| {
        // SAFETY: every buffer holds at least len bytes.
        unsafe { f(src, p.as_mut_ptr(), len) }
    });
    if streamed {
        fence_streams();
    }
}

/// p = XOR of the data, q = sum g^j * data[j] (md / ISA-L pq_gen order; zeros for no data).
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_pq_ops(ops(), data, p, q, false)
}

/// gen_pq, its stores streamed past the caches (and fenced) with `streamed`.
fn gen_pq_ops(ops: &Ops, data: &[&[u8]], p: &mut [u8], q: &mut [u8], streamed: bool) {
    debug_assert_eq!(p.len(), q.len(), "parity buffers differ in length");
    let f = if streamed { ops.gen_pq_nt } else { ops.gen_pq };
    with_ptrs(data, p.len().min(q.len()), |src, len| {
        // SAFETY: every buffer holds at least len bytes.
        unsafe { f(src, p.as_mut_ptr(), q.as_mut_ptr(), len) }
    });
    if streamed {
        fence_streams();
    }
}

/// gen_pq with P and Q stored past the caches: for parity computed straight into memory that
/// is written once and not read again soon (a member drive file's pages), whose lines then need
/// not be read in before they are overwritten. The stores are fenced before it returns.
pub fn gen_pq_streamed(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_pq_ops(ops(), data, p, q, true)
}

/// gen_p with P stored past the caches (see `gen_pq_streamed`).
pub fn gen_p_streamed(data: &[&[u8]], p: &mut [u8]) {
    gen_p_ops(ops(), data, p, true)
}

/// Orders streamed stores before every later store: they are weakly ordered, and the output
/// must be in memory before whoever reads it next (or a write-done report) may see it.
fn fence_streams() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE (every x86_64 CPU has it).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// gen_pq_streamed on a chosen kernel. Panics if `kernel` is not available.
pub fn gen_pq_streamed_with(kernel: Kernel, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_pq_ops(&kernel.ops(), data, p, q, true)
}

/// gen_p_streamed on a chosen kernel. Panics if `kernel` is not available.
pub fn gen_p_streamed_with(kernel: Kernel, data: &[&[u8]], p: &mut [u8]) {
    gen_p_ops(&kernel.ops(), data, p, true)
}

fn mul_ops(ops: &Ops, c: u8, src: &[u8], dst: &mut [u8], accumulate: bool) {
    debug_assert_eq!(src.len(), dst.len(), "parity buffers differ in length");
    let len = src.len().min(dst.len());
    let f = if accumulate { ops.mul_acc } else { ops.mul };
    // SAFETY: both valid for len bytes; a null second operand reads as zeros.
    unsafe { f(c, src.as_ptr(), std::ptr::null(), dst.as_mut_ptr(), len) }
}

/// dst = c * src
pub fn mul_into(c: u8, src: &[u8], dst: &mut [u8]) {
    mul_ops(ops(), c, src, dst, false)
}

/// dst ^= c * src
pub fn mul_xor_into(c: u8, src: &[u8], dst: &mut [u8]) {
    mul_ops(ops(), c, src, dst, true)
}

/// gen_pq on a chosen kernel. Panics if `kernel` is not available (see `available_kernels`).
pub fn gen_pq_with(kernel: Kernel, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_pq_ops(&kernel.ops(), data, p, q, false)
}

/// gen_p on a chosen kernel. Panics if `kernel` is not available.
pub fn gen_p_with(kernel: Kernel, data: &[&[u8]], p: &mut [u8]) {
    gen_p_ops(&kernel.ops(), data, p, false)
}

/// xor_into on a chosen kernel. Panics if `kernel` is not available.
pub fn xor_into_with(kernel: Kernel, dst: &mut [u8], src: &[u8]) {
    xor_into_ops(&kernel.ops(), dst, src)
}

/// mul_into on a chosen kernel. Panics if `kernel` is not available.
pub fn mul_into_with(kernel: Kernel, c: u8, src: &[u8], dst: &mut [u8]) {
    mul_ops(&kernel.ops(), c, src, dst, false)
}

/// mul_xor_into on a chosen kernel. Panics if `kernel` is not available.
pub fn mul_xor_into_with(kernel: Kernel, c: u8, src: &[u8], dst: &mut [u8]) {
    mul_ops(&kernel.ops(), c, src, dst, true)
}

/// RAID5: rebuilds strips[missing] as the XOR of the others (k data strips then P; any one of
/// them may be the missing one). An index outside the stripe changes nothing.
pub fn raid5_recover(strips: &mut [&mut [u8]], missing: usize) {
    raid5_recover_ops(ops(), strips, missing)
}

/// raid5_recover on a chosen kernel. Panics if `kernel` is not available.
pub fn raid5_recover_with(kernel: Kernel, strips: &mut [&mut [u8]], missing: usize) {
    raid5_recover_ops(&kernel.ops(), strips, missing)
}

fn raid5_recover_ops(ops: &Ops, strips: &mut [&mut [u8]], missing: usize) {
    if missing >= strips.len() {
        return;
    }
    let target = std::mem::take(&mut strips[missing]);
    {
        let others: Vec<&[u8]> = strips
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != missing)
            .map(|(_, s)| &s[..])
            .collect();
        gen_p_ops(ops, &others, target, false);
    }
    strips[missing] = target;
}

/// RAID6: strips = k data strips (syndrome order), P, Q. Rebuilds in place the one or two
/// strips listed in `missing` (any pair: two data, data and P, data and Q, P and Q), whatever
/// they hold now; the others must be intact. Repeated indices count once.
pub fn raid6_recover(strips: &mut [&mut [u8]], missing: &[usize]) -> Result<(), ParityError> {
    raid6_recover_ops(ops(), strips, missing)
}

/// raid6_recover on a chosen kernel. Panics if `kernel` is not available.
pub fn raid6_recover_with(
    kernel: Kernel,
    strips: &mut [&mut [u8]],
    missing: &[usize],
) -> Result<(), ParityError> {
    raid6_recover_ops(&kernel.ops(), strips, missing)
}

/// The distinct lost strips of a stripe of `n` (at most two), and how many there are.
fn distinct_missing(n: usize, missing: &[usize]) -> Result<([usize; 2], usize), ParityError> {
    let mut m = [usize::MAX; 2];
    let mut count = 0;
    for &i in missing {
        if i >= n {
            return Err(ParityError::BadIndex);
        }
        if m[..count].contains(&i) {
            continue;
        }
        if count == 2 {
            return Err(ParityError::TooManyMissing);
        }
        m[count] = i;
        count += 1;
    }
    Ok((m, count))
}

fn raid6_recover_ops(
    ops: &Ops,
    strips: &mut [&mut [u8]],
    missing: &[usize],
) -> Result<(), ParityError> {
    let n = strips.len();
    // g^j repeats after 255 strips: past that, Q no longer tells strips apart.
    if !(3..=257).contains(&n) {
        return Err(ParityError::BadIndex);
    }
    let len = strips[0].len();
    if strips.iter().any(|s| s.len() != len) {
        return Err(ParityError::LengthMismatch);
    }
    let (mut m, count) = distinct_missing(n, missing)?;
    let m = &mut m[..count];
    m.sort_unstable();
    let k = n - 2;
    let (pi, qi) = (k, k + 1);
    // From here on only raw pointers, one per strip: kernels read some strips of the stripe
    // while writing others.
    let ptr: Vec<*mut u8> = strips.iter_mut().map(|s| s.as_mut_ptr()).collect();
    let data_without = |skip: &[usize]| -> Vec<*const u8> {
        (0..k)
            .map(|j| {
                if skip.contains(&j) {
                    std::ptr::null()
                } else {
                    ptr[j] as *const u8
                }
            })
            .collect()
    };
    let all_but = |skip: usize| -> Vec<*const u8> {
        (0..=k)
            .filter(|&j| j != skip)
            .map(|j| ptr[j] as *const u8)
            .collect()
    };
    // SAFETY: every pointer is its strip's start, valid for len bytes, and no reference to a
    // strip is used while they are; no strip is both read and written (lost strips are null
    // among the sources).
    unsafe {
        match *m {
            [] => {}
            // Parity only: recompute what is missing.
            [a] if a == pi => (ops.gen_p)(&data_without(&[]), ptr[pi], len),
            [a] if a == qi => (ops.gen_pq)(&data_without(&[]), std::ptr::null_mut(), ptr[qi], len),
            [a, _] if a == pi => (ops.gen_pq)(&data_without(&[]), ptr[pi], ptr[qi], len),
            // One data strip: from P.
            [x] => (ops.gen_p)(&all_but(x), ptr[x], len),
            // A data strip and Q: Dx = P ^ P', Q = Q' ^ g^x * Dx, with P' and Q' the
            // syndromes without Dx: one pass over the stripe.
            [x, b] if b == qi => (ops.data_and_parity)(
                &data_without(&[x]),
                true,
                gf::exp(x),
                ptr[pi],
                ptr[x],
                ptr[qi],
                len,
            ),
            // A data strip and P: Q ^ Q' = g^x * Dx, so Dx = g^-x * (Q ^ Q'), and P = P' ^ Dx.
            [x, b] if b == pi => (ops.data_and_parity)(
                &data_without(&[x]),
                false,
                gf::inv(gf::exp(x)),
                ptr[qi],
                ptr[x],
                ptr[pi],
                len,
            ),
            // Two data strips: with P', Q' the syndromes without both, Pxy = P ^ P' and
            // Qxy = Q ^ Q', Dx = A*Pxy ^ B*Qxy with A = g^(y-x)/(g^(y-x)+1),
            // B = g^-x/(g^(y-x)+1), and Dy = Pxy ^ Dx.
            [x, y] => {
                let gyx = gf::exp(y - x);
                let denom = gf::inv(gyx ^ 1);
                let a = gf::mul(gyx, denom);
                let b = gf::mul(gf::inv(gf::exp(x)), denom);
                (ops.two_data)(
                    &data_without(&[x, y]),
                    a,
                    b,
                    ptr[pi],
                    ptr[qi],
                    ptr[x],
                    ptr[y],
                    len,
                );
            }
            _ => unreachable!("at most two distinct indices are kept"),
        }
    }
    Ok(())
}

/// What a RAID6 stripe's P and Q say about its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raid6Check {
    Clean,
    /// Only P disagrees with the data: P is wrong.
    POnly,
    /// Only Q disagrees: Q is wrong.
    QOnly,
    /// Exactly one data strip explains both syndromes: it is the wrong one.
    Data {
        index: usize,
    },
    /// Both disagree and no single data strip explains it: two or more strips are wrong.
    Unlocatable,
}

/// Compares a stripe's P and Q (strips = k data strips, P, Q) with its data. Where exactly one
/// data strip z is wrong, by an error e, the syndromes are Sp = P ^ P' = e and
/// Sq = Q ^ Q' = g^z * e at every byte it corrupts, so log(Sq) - log(Sp) is the same z at each
/// such byte and names the strip (md can only count such mismatches). A stripe of fewer than
/// three strips is Unlocatable.
pub fn raid6_check(strips: &[&[u8]]) -> Raid6Check {
    let n = strips.len();
    if n < 3 {
        return Raid6Check::Unlocatable;
    }
    let k = n - 2;
    let len = strips.iter().map(|s| s.len()).min().unwrap_or(0);
    let mut sp = vec![0u8; len];
    let mut sq = vec![0u8; len];
    gen_pq(&strips[..k], &mut sp, &mut sq);
    xor_into(&mut sp, &strips[k][..len]);
    xor_into(&mut sq, &strips[k + 1][..len]);
    let p_bad = sp.iter().any(|&b| b != 0);
    let q_bad = sq.iter().any(|&b| b != 0);
    match (p_bad, q_bad) {
        (false, false) => return Raid6Check::Clean,
        (true, false) => return Raid6Check::POnly,
        (false, true) => return Raid6Check::QOnly,
        (true, true) => {}
    }
    let mut z: Option<usize> = None;
    for (&p, &q) in sp.iter().zip(&sq) {
        match (p, q) {
            (0, 0) => continue,
            // One syndrome without the other: not a single data strip's error.
            (0, _) | (_, 0) => return Raid6Check::Unlocatable,
            _ => {}
        }
        let zz = (gf::log(q) as usize + 255 - gf::log(p) as usize) % 255;
        if zz >= k || z.is_some_and(|z| z != zz) {
            return Raid6Check::Unlocatable;
        }
        z = Some(zz);
    }
    match z {
        Some(index) => Raid6Check::Data { index },
        None => Raid6Check::Unlocatable,
    }
}

/// Whether a RAID5 stripe (k data strips then P) is consistent: the XOR of all its strips is
/// zero. An empty stripe is consistent.
pub fn raid5_check(strips: &[&[u8]]) -> bool {
    let len = strips.iter().map(|s| s.len()).min().unwrap_or(0);
    // In chunks, so that a large stripe needs no buffer its size.
    const CHUNK: usize = 16 << 10;
    let mut acc = vec![0u8; CHUNK.min(len)];
    let mut parts: Vec<&[u8]> = Vec::with_capacity(strips.len());
    let mut at = 0;
    while at < len {
        let end = (at + CHUNK).min(len);
        parts.clear();
        parts.extend(strips.iter().map(|s| &s[at..end]));
        let acc = &mut acc[..end - at];
        gen_p(&parts, acc);
        if acc.iter().any(|&b| b != 0) {
            return false;
        }
        at = end;
    }
    true
}
