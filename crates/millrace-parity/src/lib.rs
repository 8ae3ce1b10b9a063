//! RAID5/6 parity: P is the XOR of the data strips; Q is the Reed-Solomon syndrome
//! sum(g^j * D_j) over GF(2^8) with polynomial 0x11d and generator 2, the math of Linux md and
//! ISA-L, with j the strip's index in syndrome order.
//!
//! Why hand-written: no well-kept Rust crate computes md's P+Q syndrome with SIMD
//! (reed-solomon-erasure and reed-solomon-simd implement other codes and matrices), and ISA-L is
//! a C library we do not want as a hard build or run-time dependency. ISA-L is the reference:
//! tests compare every kernel with it byte for byte, and the benchmark runs both on the same
//! buffers (`cargo run --release -p millrace-parity --example parity_bench`).

pub mod gf;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    Sse,
    Avx2,
}

fn detect() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("MILLRACE_PARITY_SCALAR").is_some() {
            return Kernel::Scalar;
        }
        if is_x86_feature_detected!("avx2") {
            return Kernel::Avx2;
        }
        if is_x86_feature_detected!("ssse3") {
            return Kernel::Sse;
        }
    }
    Kernel::Scalar
}

fn kernel() -> Kernel {
    static K: OnceLock<Kernel> = OnceLock::new();
    *K.get_or_init(detect)
}

/// The kernels this CPU can run, best last (for tests that check every path).
pub fn available_kernels() -> Vec<Kernel> {
    let mut v = vec![Kernel::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("ssse3") {
            v.push(Kernel::Sse);
        }
        if is_x86_feature_detected!("avx2") {
            v.push(Kernel::Avx2);
        }
    }
    v
}

/// "avx2", "ssse3" or "scalar": the kernel chosen at run time.
pub fn active_kernel() -> &'static str {
    match kernel() {
        Kernel::Avx2 => "avx2",
        Kernel::Sse => "ssse3",
        Kernel::Scalar => "scalar",
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum ParityError {
    TooManyMissing,
    BadIndex,
    LengthMismatch,
}

impl std::fmt::Display for ParityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParityError::TooManyMissing => "more strips are missing than RAID6 can rebuild (two)",
            ParityError::BadIndex => "a missing strip's index lies outside the stripe",
            ParityError::LengthMismatch => "the strips of one stripe differ in length",
        })
    }
}

impl std::error::Error for ParityError {}

/// dst ^= src
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    scalar::xor_into(dst, src)
}

/// p = XOR of all data
pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    gen_p_with(kernel(), data, p)
}

/// gen_p on a chosen kernel.
pub fn gen_p_with(k: Kernel, data: &[&[u8]], p: &mut [u8]) {
    debug_assert!(data.iter().all(|d| d.len() == p.len()));
    if data.is_empty() {
        p.fill(0);
        return;
    }
    match k {
        // SAFETY: as in gen_pq_with.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::gen_p_avx2(data, p) },
        _ => scalar::gen_p(data, p),
    }
}

/// p = XOR of the data, q = sum g^j * data[j].
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_pq_with(kernel(), data, p, q)
}

/// gen_pq on a chosen kernel (tests and the benchmark compare them).
pub fn gen_pq_with(k: Kernel, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    debug_assert!(data.iter().all(|d| d.len() == p.len()) && q.len() == p.len());
    if data.is_empty() {
        p.fill(0);
        q.fill(0);
        return;
    }
    match k {
        // SAFETY: the kernel was chosen by feature detection (or by available_kernels()).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::gen_pq_avx2(data, p, q) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Sse => unsafe { x86::gen_pq_sse2(data, p, q) },
        _ => scalar::gen_pq(data, p, q),
    }
}

fn mul_with(k: Kernel, c: u8, src: &[u8], dst: &mut [u8], accumulate: bool) {
    debug_assert_eq!(src.len(), dst.len());
    match k {
        // SAFETY: as in gen_pq_with.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::mul_avx2(c, src, dst, accumulate) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Sse => unsafe { x86::mul_ssse3(c, src, dst, accumulate) },
        _ if accumulate => scalar::mul_xor_into(c, src, dst),
        _ => scalar::mul_into(c, src, dst),
    }
}

/// dst = c * src
pub fn mul_into(c: u8, src: &[u8], dst: &mut [u8]) {
    mul_with(kernel(), c, src, dst, false)
}

/// dst ^= c * src
pub fn mul_xor_into(c: u8, src: &[u8], dst: &mut [u8]) {
    mul_with(kernel(), c, src, dst, true)
}

/// mul_xor_into on a chosen kernel.
pub fn mul_xor_into_with(k: Kernel, c: u8, src: &[u8], dst: &mut [u8]) {
    mul_with(k, c, src, dst, true)
}

/// RAID5: rebuilds strips[missing] from the others (k data strips then P).
pub fn raid5_recover(strips: &mut [&mut [u8]], missing: usize) {
    let n = strips.len();
    if missing >= n {
        return;
    }
    let acc = std::mem::take(&mut strips[missing]);
    acc.fill(0);
    for (i, s) in strips.iter().enumerate() {
        if i != missing {
            xor_into(acc, s);
        }
    }
    strips[missing] = acc;
}

/// P and Q of the data strips of `strips` (the first k) into fresh buffers.
fn syndromes(strips: &[&mut [u8]], k: usize) -> (Vec<u8>, Vec<u8>) {
    let len = strips[0].len();
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    let data: Vec<&[u8]> = strips[..k].iter().map(|s| &s[..]).collect();
    gen_pq(&data, &mut p, &mut q);
    (p, q)
}

/// RAID6: strips = k data strips (syndrome order), P, Q. Rebuilds the one or two strips listed
/// in `missing`, whatever they hold now.
pub fn raid6_recover(strips: &mut [&mut [u8]], missing: &[usize]) -> Result<(), ParityError> {
    let n = strips.len();
    if n < 3 {
        return Err(ParityError::BadIndex);
    }
    let len = strips[0].len();
    if strips.iter().any(|s| s.len() != len) {
        return Err(ParityError::LengthMismatch);
    }
    let k = n - 2;
    let mut m: Vec<usize> = missing.to_vec();
    m.sort_unstable();
    m.dedup();
    if m.len() > 2 {
        return Err(ParityError::TooManyMissing);
    }
    if m.iter().any(|&i| i >= n) {
        return Err(ParityError::BadIndex);
    }
    let (pi, qi) = (k, k + 1);
    match m[..] {
        [] => {}
        // Only parity lost: recompute it.
        [a] | [a, _] if a >= k => {
            let (p, q) = syndromes(strips, k);
            strips[pi].copy_from_slice(&p);
            strips[qi].copy_from_slice(&q);
        }
        // One data strip (and maybe Q): from P.
        [a] | [a, _] if m.len() == 1 || m[1] == qi => {
            let mut acc = vec![0u8; len];
            for (i, s) in strips[..=k].iter().enumerate() {
                if i != a {
                    xor_into(&mut acc, s);
                }
            }
            strips[a].copy_from_slice(&acc);
            if m.len() == 2 {
                let (_, q) = syndromes(strips, k);
                strips[qi].copy_from_slice(&q);
            }
        }
        // One data strip and P: from Q. Q ^ Q(with D_a = 0) = g^a * D_a.
        [a, b] if b == pi => {
            strips[a].fill(0);
            let (_, q0) = syndromes(strips, k);
            let mut d = strips[qi].to_vec();
            xor_into(&mut d, &q0);
            mul_into(gf::inv(gf::exp(a)), &d, strips[a]);
            let (p, _) = syndromes(strips, k);
            strips[pi].copy_from_slice(&p);
        }
        // Two data strips: below.
        [_, _] => {}
        _ => unreachable!("at most two, checked above"),
    }
    if let [x, y] = m[..] {
        if y < k {
            // Two data strips: with Pxy = P ^ P', Qxy = Q ^ Q' (P', Q' with both zeroed),
            // Dx = A*Pxy ^ B*Qxy and Dy = Pxy ^ Dx, where A = g^(y-x)/(g^(y-x)+1) and
            // B = g^-x/(g^(y-x)+1).
            strips[x].fill(0);
            strips[y].fill(0);
            let (mut pxy, mut qxy) = syndromes(strips, k);
            xor_into(&mut pxy, strips[pi]);
            xor_into(&mut qxy, strips[qi]);
            let gyx = gf::exp(y - x);
            let denom = gf::inv(gyx ^ 1);
            let a = gf::mul(gyx, denom);
            let b = gf::mul(gf::inv(gf::exp(x)), denom);
            mul_into(a, &pxy, strips[x]);
            mul_xor_into(b, &qxy, strips[x]);
            strips[y].copy_from_slice(&pxy);
            let dx = strips[x].to_vec();
            xor_into(strips[y], &dx);
        }
    }
    Ok(())
}

/// What a RAID6 stripe's P and Q say about its data.
#[derive(Debug, PartialEq, Eq)]
pub enum Raid6Check {
    Clean,
    /// Only P disagrees: P is wrong.
    POnly,
    /// Only Q disagrees: Q is wrong.
    QOnly,
    /// Exactly one data strip explains both syndromes: it is the wrong one.
    Data {
        index: usize,
    },
    /// More than one strip is wrong; nothing can be located.
    Unlocatable,
}

/// Compares a stripe's P and Q with its data. Where exactly one data strip is wrong, the
/// syndromes Sp = P ^ P' and Sq = Q ^ Q' satisfy Sq = g^z * Sp at every byte it corrupts, for
/// the same z: that z names the strip (md can only count such mismatches).
pub fn raid6_check(strips: &[&[u8]]) -> Raid6Check {
    let n = strips.len();
    if n < 3 {
        return Raid6Check::Unlocatable;
    }
    let k = n - 2;
    let len = strips[0].len();
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    gen_pq(&strips[..k], &mut p, &mut q);
    xor_into(&mut p, strips[k]);
    xor_into(&mut q, strips[k + 1]);
    let p_bad = p.iter().any(|&b| b != 0);
    let q_bad = q.iter().any(|&b| b != 0);
    match (p_bad, q_bad) {
        (false, false) => return Raid6Check::Clean,
        (true, false) => return Raid6Check::POnly,
        (false, true) => return Raid6Check::QOnly,
        _ => {}
    }
    let mut z: Option<usize> = None;
    for (&sp, &sq) in p.iter().zip(&q) {
        if sp == 0 && sq == 0 {
            continue;
        }
        if sp == 0 || sq == 0 {
            return Raid6Check::Unlocatable;
        }
        let zz = (gf::log(sq) as usize + 255 - gf::log(sp) as usize) % 255;
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

/// Whether a RAID5 stripe's P agrees with its data.
pub fn raid5_check(strips: &[&[u8]]) -> bool {
    let len = strips[0].len();
    let mut acc = vec![0u8; len];
    for s in strips {
        xor_into(&mut acc, s);
    }
    acc.iter().all(|&b| b == 0)
}
