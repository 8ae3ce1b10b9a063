//! Every kernel against an independent reference (bit-by-bit GF multiply, explicit sums of
//! g^j * D_j), every recovery case on every kernel, scrub location, and byte-for-byte equality
//! with ISA-L.

use millrace_parity::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// GF(2^8) multiply the slow way ("Russian peasant"): shares nothing with the crate's tables.
fn ref_mul(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    r
}

fn ref_pow2(j: usize) -> u8 {
    (0..j).fold(1u8, |g, _| ref_mul(g, 2))
}

/// P and Q as the definition says: Q = sum over j of g^j * D_j.
fn ref_pq(data: &[&[u8]], len: usize) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    for (j, d) in data.iter().enumerate() {
        let g = ref_pow2(j);
        for i in 0..len {
            p[i] ^= d[i];
            q[i] ^= ref_mul(g, d[i]);
        }
    }
    (p, q)
}

fn random(rng: &mut impl Rng, k: usize, len: usize) -> Vec<Vec<u8>> {
    (0..k)
        .map(|_| (0..len).map(|_| rng.random()).collect())
        .collect()
}

#[test]
fn field_matches_reference() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            assert_eq!(gf::mul(a, b), ref_mul(a, b), "{a} * {b}");
        }
        if a != 0 {
            assert_eq!(gf::mul(a, gf::inv(a)), 1, "inverse of {a}");
            assert_eq!(gf::exp(gf::log(a) as usize), a, "log of {a}");
        }
    }
    assert_eq!(gf::inv(0), 0);
    for i in 0..600 {
        assert_eq!(gf::exp(i), ref_pow2(i % 255), "g^{i}");
    }
}

#[test]
fn kernels_are_detected() {
    let avail = available_kernels();
    assert_eq!(avail[0], Kernel::Scalar);
    assert!(avail.iter().any(|k| k.name() == active_kernel()));
    eprintln!("available: {avail:?}; active: {}", active_kernel());
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        assert!(Kernel::Avx2.is_available());
    }
}

#[test]
fn every_kernel_matches_reference() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let lens = [
        1usize,
        7,
        31,
        32,
        33,
        63,
        64,
        65,
        255,
        256,
        257,
        1000,
        4096,
        65536 + 7,
    ];
    for &len in &lens {
        for k in 1..=32usize {
            // Offsets 0 and 3: the kernels must not rely on alignment.
            let off = (k % 2) * 3;
            let bufs = random(&mut rng, k, len + off);
            let data: Vec<&[u8]> = bufs.iter().map(|d| &d[off..]).collect();
            let (rp, rq) = ref_pq(&data, len);
            let c: u8 = rng.random();
            let src = data[k - 1];
            let want_mul: Vec<u8> = src.iter().map(|&x| ref_mul(c, x)).collect();
            let want_mul_xor: Vec<u8> = data[0].iter().zip(&want_mul).map(|(a, b)| a ^ b).collect();
            for &kern in available_kernels() {
                let what = format!("{kern:?} len {len} k {k}");
                let mut p = vec![0xaau8; len + off];
                let mut q = vec![0x55u8; len + off];
                gen_pq_with(kern, &data, &mut p[off..], &mut q[off..]);
                assert!(p[off..] == rp[..], "gen_pq P {what}");
                assert!(q[off..] == rq[..], "gen_pq Q {what}");

                let mut p = vec![0xaau8; len];
                gen_p_with(kern, &data, &mut p);
                assert!(p == rp, "gen_p {what}");

                // Streamed stores take only vector-aligned addresses: outputs aligned to 64
                // (off 0) and not (off 3), both ends ragged where len is.
                let mut p = vec![0xaau8; len + 64 + off];
                let mut q = vec![0x55u8; len + 64 + off];
                let (pa, qa) = (
                    p.as_ptr().align_offset(64) + off,
                    q.as_ptr().align_offset(64) + off,
                );
                gen_pq_streamed_with(kern, &data, &mut p[pa..pa + len], &mut q[qa..qa + len]);
                assert!(p[pa..pa + len] == rp[..], "gen_pq_streamed P {what}");
                assert!(q[qa..qa + len] == rq[..], "gen_pq_streamed Q {what}");
                assert!(
                    p[..pa].iter().chain(&p[pa + len..]).all(|&b| b == 0xaa),
                    "gen_pq_streamed stayed in P {what}"
                );
                assert!(
                    q[..qa].iter().chain(&q[qa + len..]).all(|&b| b == 0x55),
                    "gen_pq_streamed stayed in Q {what}"
                );
                let mut p = vec![0xaau8; len + 64 + off];
                let pa = p.as_ptr().align_offset(64) + off;
                gen_p_streamed_with(kern, &data, &mut p[pa..pa + len]);
                assert!(p[pa..pa + len] == rp[..], "gen_p_streamed {what}");

                let mut dst = vec![0x11u8; len];
                mul_into_with(kern, c, src, &mut dst);
                assert!(dst == want_mul, "mul_into by {c} {what}");

                let mut dst = data[0].to_vec();
                mul_xor_into_with(kern, c, src, &mut dst);
                assert!(dst == want_mul_xor, "mul_xor_into by {c} {what}");

                let mut dst = data[0].to_vec();
                xor_into_with(kern, &mut dst, src);
                let want: Vec<u8> = data[0].iter().zip(src).map(|(a, b)| a ^ b).collect();
                assert!(dst == want, "xor_into {what}");
            }
        }
    }
}

#[test]
fn no_data_gives_zero_parity() {
    for &kern in available_kernels() {
        let mut p = vec![1u8; 100];
        let mut q = vec![2u8; 100];
        gen_pq_with(kern, &[], &mut p, &mut q);
        assert!(p.iter().chain(&q).all(|&b| b == 0), "{kern:?}");
    }
}

/// A stripe of k random data strips with P and Q from the reference.
fn stripe(seed: u64, k: usize, len: usize) -> Vec<Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut all = random(&mut rng, k, len);
    let refs: Vec<&[u8]> = all.iter().map(|d| &d[..]).collect();
    let (p, q) = ref_pq(&refs, len);
    all.push(p);
    all.push(q);
    all
}

/// Overwrites the strips in `lost` with junk, recovers them on `kern`, and checks the result.
fn lose_and_recover(good: &[Vec<u8>], lost: &[usize], kern: Kernel) {
    let mut all = good.to_vec();
    for &i in lost {
        for (b, x) in all[i].iter_mut().enumerate() {
            *x ^= (b as u8).wrapping_mul(31) | 1;
        }
    }
    let mut strips: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
    raid6_recover_with(kern, &mut strips, lost).unwrap();
    for (i, (got, want)) in all.iter().zip(good).enumerate() {
        assert!(
            got == want,
            "{kern:?}: strip {i} wrong after losing {lost:?} of {} (len {})",
            good.len(),
            good[0].len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn raid6_recovers_every_one_and_two(k in 1usize..=12, len in 1usize..1100, seed in any::<u64>()) {
        let good = stripe(seed, k, len);
        let n = k + 2;
        for &kern in available_kernels() {
            for a in 0..n {
                lose_and_recover(&good, &[a], kern);
                for b in a + 1..n {
                    lose_and_recover(&good, &[a, b], kern);
                }
            }
        }
    }

    #[test]
    fn raid5_recovers_every_one(k in 1usize..=12, len in 1usize..1100, seed in any::<u64>()) {
        let good = stripe(seed, k, len);
        let good = &good[..=k];
        for &kern in available_kernels() {
            for a in 0..=k {
                let mut all = good.to_vec();
                all[a].fill(0xee);
                let mut strips: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
                raid5_recover_with(kern, &mut strips, a);
                prop_assert!(all[..] == good[..], "{:?} lost {}", kern, a);
            }
        }
        let refs: Vec<&[u8]> = good.iter().map(|v| &v[..]).collect();
        prop_assert!(raid5_check(&refs));
    }
}

/// Wide stripes and lengths past every kernel's unrolled column, on every kernel.
#[test]
fn raid6_recovers_wide_stripes() {
    for (k, len) in [(14usize, 65536 + 33), (30, 4096 + 5)] {
        let good = stripe(k as u64, k, len);
        for &kern in available_kernels() {
            for lost in [vec![0, 1], vec![3, k - 1], vec![k - 1, k], vec![2, k + 1]] {
                lose_and_recover(&good, &lost, kern);
            }
        }
    }
}

#[test]
fn raid6_recover_rejects_bad_requests() {
    let mut all = stripe(5, 4, 64);
    let mut strips: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
    assert_eq!(
        raid6_recover(&mut strips, &[0, 1, 2]),
        Err(ParityError::TooManyMissing)
    );
    assert_eq!(raid6_recover(&mut strips, &[6]), Err(ParityError::BadIndex));
    // Repeats count once.
    assert_eq!(raid6_recover(&mut strips, &[1, 1, 1]), Ok(()));
    let mut short = vec![0u8; 63];
    strips[2] = &mut short;
    assert_eq!(
        raid6_recover(&mut strips, &[0]),
        Err(ParityError::LengthMismatch)
    );
    for e in [
        ParityError::TooManyMissing,
        ParityError::BadIndex,
        ParityError::LengthMismatch,
    ] {
        let s = e.to_string();
        assert!(s.ends_with('.') && s.starts_with(char::is_uppercase), "{s}");
    }
}

fn check(all: &[Vec<u8>]) -> Raid6Check {
    raid6_check(&all.iter().map(|v| &v[..]).collect::<Vec<_>>())
}

#[test]
fn raid6_check_locates_one_bad_strip() {
    for k in [1usize, 6, 14] {
        let all = stripe(3, k, 4096 + 3);
        assert_eq!(check(&all), Raid6Check::Clean);
        for victim in 0..k + 2 {
            let want = if victim < k {
                Raid6Check::Data { index: victim }
            } else if victim == k {
                Raid6Check::POnly
            } else {
                Raid6Check::QOnly
            };
            // A run of bytes with varied errors, and a single flipped bit.
            let mut bad = all.clone();
            for (i, x) in bad[victim][100..300].iter_mut().enumerate() {
                *x ^= (i as u8) | 1;
            }
            assert_eq!(check(&bad), want, "k {k} victim {victim}");
            let mut bad = all.clone();
            bad[victim][4098] ^= 0x40;
            assert_eq!(check(&bad), want, "k {k} victim {victim}, one bit");
        }
        if k > 1 {
            // Two data strips wrong at one byte, and at different bytes.
            let mut two = all.clone();
            two[0][10] ^= 1;
            two[k - 1][10] ^= 2;
            assert_eq!(check(&two), Raid6Check::Unlocatable, "k {k}");
            let mut two = all.clone();
            two[0][10] ^= 1;
            two[k - 1][20] ^= 1;
            assert_eq!(check(&two), Raid6Check::Unlocatable, "k {k}");
        }
        // P and Q both wrong (the data is right): no data strip explains it.
        let mut pq = all.clone();
        pq[k][7] ^= 1;
        pq[k + 1][9] ^= 1;
        assert_eq!(check(&pq), Raid6Check::Unlocatable, "k {k}");
    }
    let all = stripe(4, 5, 100);
    let mut bad = all[..6].to_vec();
    assert!(raid5_check(&bad.iter().map(|v| &v[..]).collect::<Vec<_>>()));
    bad[2][50] ^= 4;
    assert!(!raid5_check(
        &bad.iter().map(|v| &v[..]).collect::<Vec<_>>()
    ));
    assert!(raid5_check(&[]));
}

/// 64-byte aligned buffers of a multiple of 32 bytes, as ISA-L's SIMD kernels want.
fn aligned(n: usize, len: usize) -> Vec<Vec<u8>> {
    // Over-allocate and let callers slice at the aligned offset.
    (0..n).map(|_| vec![0u8; len + 64]).collect()
}

fn align_off(v: &[u8]) -> usize {
    v.as_ptr().align_offset(64)
}

/// ISA-L, loaded at run time: our kernels must equal its pq_gen, xor_gen, gf_mul and
/// gf_vect_mul byte for byte.
#[test]
fn equal_to_isa_l() {
    // SAFETY: loading a plain C library; its initialisers have no preconditions.
    let lib = match unsafe { libloading::Library::new("libisal.so.2") } {
        Ok(l) => l,
        Err(e) => {
            if std::env::var("MILLRACE_ALLOW_NO_ISAL").as_deref() == Ok("1") {
                eprintln!("Skipped the comparison with ISA-L: libisal.so.2 cannot be loaded ({e}), and MILLRACE_ALLOW_NO_ISAL=1 allows that.");
                return;
            }
            panic!("ISA-L (libisal.so.2) cannot be loaded ({e}). Install the Debian package libisal2 (apt-get install libisal2), or set MILLRACE_ALLOW_NO_ISAL=1 to skip this comparison.");
        }
    };
    type Gen = unsafe extern "C" fn(i32, i32, *mut *mut u8) -> i32;
    type GfMul = unsafe extern "C" fn(u8, u8) -> u8;
    type VectMulInit = unsafe extern "C" fn(u8, *mut u8);
    type VectMul = unsafe extern "C" fn(i32, *mut u8, *mut u8, *mut u8) -> i32;
    // SAFETY: the signatures are ISA-L's (raid.h, gf_vect_mul.h, erasure_code.h).
    let (pq_gen, xor_gen, gf_mul, mul_init, vect_mul) = unsafe {
        (
            *lib.get::<Gen>(b"pq_gen\0").unwrap(),
            *lib.get::<Gen>(b"xor_gen\0").unwrap(),
            *lib.get::<GfMul>(b"gf_mul\0").unwrap(),
            *lib.get::<VectMulInit>(b"gf_vect_mul_init\0").unwrap(),
            *lib.get::<VectMul>(b"gf_vect_mul\0").unwrap(),
        )
    };
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            // SAFETY: pure function.
            assert_eq!(gf::mul(a, b), unsafe { gf_mul(a, b) }, "{a} * {b}");
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for &(k, len) in &[
        // ISA-L's pq_gen wants at least two data strips.
        (2usize, 32usize),
        (4, 4096),
        (6, 65536),
        (14, 8192),
        (30, 1024 + 32),
        (32, 96),
    ] {
        let mut bufs = aligned(k + 2, len);
        let offs: Vec<usize> = bufs.iter().map(|b| align_off(b)).collect();
        for (b, &o) in bufs.iter_mut().zip(&offs).take(k) {
            rng.fill(&mut b[o..o + len]);
        }
        let mut ptrs: Vec<*mut u8> = bufs
            .iter_mut()
            .zip(&offs)
            .map(|(b, &o)| b[o..].as_mut_ptr())
            .collect();
        // SAFETY: k + 2 buffers of len bytes, 64-byte aligned, len a multiple of 32.
        assert_eq!(
            unsafe { pq_gen((k + 2) as i32, len as i32, ptrs.as_mut_ptr()) },
            0
        );
        let view = |i: usize| &bufs[i][offs[i]..offs[i] + len];
        let data: Vec<&[u8]> = (0..k).map(view).collect();
        for &kern in available_kernels() {
            let mut p = vec![0u8; len];
            let mut q = vec![0u8; len];
            gen_pq_with(kern, &data, &mut p, &mut q);
            assert!(
                p == view(k),
                "{kern:?} k {k} len {len}: P differs from ISA-L pq_gen"
            );
            assert!(
                q == view(k + 1),
                "{kern:?} k {k} len {len}: Q differs from ISA-L pq_gen"
            );
        }
        let mut xb = aligned(k + 1, len);
        let xoffs: Vec<usize> = xb.iter().map(|b| align_off(b)).collect();
        for i in 0..k {
            xb[i][xoffs[i]..xoffs[i] + len].copy_from_slice(data[i]);
        }
        let mut xp: Vec<*mut u8> = xb
            .iter_mut()
            .zip(&xoffs)
            .map(|(b, &o)| b[o..].as_mut_ptr())
            .collect();
        // SAFETY: as for pq_gen, with k + 1 buffers.
        assert_eq!(
            unsafe { xor_gen((k + 1) as i32, len as i32, xp.as_mut_ptr()) },
            0
        );
        let isal_p = &xb[k][xoffs[k]..xoffs[k] + len];
        for &kern in available_kernels() {
            let mut p = vec![0u8; len];
            gen_p_with(kern, &data, &mut p);
            assert!(
                p == isal_p,
                "{kern:?} k {k} len {len}: P differs from ISA-L xor_gen"
            );
        }
        // Multiply by a constant, against gf_vect_mul.
        let c: u8 = rng.random();
        let mut tbl = [0u8; 32];
        let mut src = data[0].to_vec();
        let mut want = vec![0u8; len];
        // SAFETY: a 32-byte table; src and want hold len bytes (a multiple of 32).
        unsafe {
            mul_init(c, tbl.as_mut_ptr());
            assert_eq!(
                vect_mul(
                    len as i32,
                    tbl.as_mut_ptr(),
                    src.as_mut_ptr(),
                    want.as_mut_ptr()
                ),
                0
            );
        }
        for &kern in available_kernels() {
            let mut got = vec![0u8; len];
            mul_into_with(kern, c, &src, &mut got);
            assert!(
                got == want,
                "{kern:?} len {len}: mul by {c} differs from ISA-L gf_vect_mul"
            );
        }
    }
}
