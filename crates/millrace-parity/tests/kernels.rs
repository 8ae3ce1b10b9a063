//! Every kernel against an independent reference (bit-by-bit GF multiply, explicit sums), every
//! recovery case, scrub location, and byte-for-byte equality with ISA-L.

use millrace_parity::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

fn ref_mul(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        let c = a & 0x80 != 0;
        a <<= 1;
        if c {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    r
}

fn ref_pq(data: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let len = data[0].len();
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    let mut g = 1u8;
    for d in data {
        for i in 0..len {
            p[i] ^= d[i];
            q[i] ^= ref_mul(g, d[i]);
        }
        g = ref_mul(g, 2);
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
            assert_eq!(gf::mul(a, b), ref_mul(a, b));
        }
        if a != 0 {
            assert_eq!(gf::mul(a, gf::inv(a)), 1);
            assert_eq!(gf::exp(gf::log(a) as usize), a);
        }
    }
    assert_eq!(gf::inv(0), 0);
}

#[test]
fn every_kernel_matches_reference() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for &len in &[1usize, 31, 32, 33, 63, 64, 65, 4096, 65536 + 7] {
        for k in [1usize, 2, 3, 5, 8, 14, 32] {
            if len > 4096 && k > 8 {
                continue;
            }
            let data = random(&mut rng, k, len);
            let (rp, rq) = ref_pq(&data);
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            for kern in available_kernels() {
                let mut p = vec![0u8; len];
                let mut q = vec![0u8; len];
                gen_pq_with(kern, &refs, &mut p, &mut q);
                assert!(p == rp && q == rq, "{kern:?} len {len} k {k}");
                let c: u8 = rng.random();
                let mut dst = data[0].clone();
                mul_xor_into_with(kern, c, &data[k - 1], &mut dst);
                let want: Vec<u8> = (0..len)
                    .map(|i| data[0][i] ^ ref_mul(c, data[k - 1][i]))
                    .collect();
                assert!(dst == want, "mul_xor {kern:?} len {len}");
            }
            for kern in available_kernels() {
                let mut p = vec![0u8; len];
                gen_p_with(kern, &refs, &mut p);
                assert!(p == rp, "gen_p {kern:?} len {len} k {k}");
            }
        }
    }
}

proptest! {
    #[test]
    fn raid6_recovers_any_two(k in 2usize..10, len in 1usize..300, a in 0usize..12, b in 0usize..12, seed in any::<u64>()) {
        let n = k + 2;
        let (a, b) = (a % n, b % n);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let data = random(&mut rng, k, len);
        let (p, q) = ref_pq(&data);
        let mut all: Vec<Vec<u8>> = data.clone();
        all.push(p);
        all.push(q);
        let good = all.clone();
        for &i in &[a, b] {
            for x in all[i].iter_mut() { *x = x.wrapping_mul(31).wrapping_add(7); }
        }
        let mut strips: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
        raid6_recover(&mut strips, &[a, b]).unwrap();
        prop_assert!(all == good, "missing {} and {}", a, b);
        // RAID5 on the first k+1.
        let mut r5: Vec<Vec<u8>> = good[..=k].to_vec();
        r5[a % (k + 1)].fill(0xee);
        let mut st: Vec<&mut [u8]> = r5.iter_mut().map(|v| &mut v[..]).collect();
        raid5_recover(&mut st, a % (k + 1));
        prop_assert!(r5[..] == good[..=k]);
    }
}

#[test]
fn raid6_check_locates_one_bad_strip() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let k = 6;
    let data = random(&mut rng, k, 4096);
    let (p, q) = ref_pq(&data);
    let mut all = data.clone();
    all.push(p);
    all.push(q);
    let view = |a: &Vec<Vec<u8>>| -> Vec<Vec<u8>> { a.clone() };
    let check = |a: &Vec<Vec<u8>>| raid6_check(&a.iter().map(|v| &v[..]).collect::<Vec<_>>());
    assert_eq!(check(&all), Raid6Check::Clean);
    for victim in 0..k + 2 {
        let mut bad = view(&all);
        for x in &mut bad[victim][100..300] {
            *x ^= 0x33;
        }
        let want = if victim < k {
            Raid6Check::Data { index: victim }
        } else if victim == k {
            Raid6Check::POnly
        } else {
            Raid6Check::QOnly
        };
        assert_eq!(check(&bad), want, "victim {victim}");
    }
    let mut two = view(&all);
    two[1][10] ^= 1;
    two[4][10] ^= 2;
    assert_eq!(check(&two), Raid6Check::Unlocatable);
    assert!(raid5_check(
        &all[..=k].iter().map(|v| &v[..]).collect::<Vec<_>>()
    ));
}

/// ISA-L, loaded at run time: our kernels must equal its pq_gen and xor_gen byte for byte.
#[test]
fn equal_to_isa_l() {
    let lib = match unsafe { libloading::Library::new("libisal.so.2") } {
        Ok(l) => l,
        Err(e) => {
            if std::env::var_os("MILLRACE_ALLOW_NO_ISAL").is_some() {
                eprintln!("skipped: ISA-L is not installed ({e})");
                return;
            }
            panic!("ISA-L (libisal.so.2) cannot be loaded ({e}): install the Debian package libisal2, or set MILLRACE_ALLOW_NO_ISAL=1 to skip");
        }
    };
    type Gen = unsafe extern "C" fn(i32, i32, *mut *mut u8) -> i32;
    let pq_gen: libloading::Symbol<Gen> = unsafe { lib.get(b"pq_gen\0") }.unwrap();
    let xor_gen: libloading::Symbol<Gen> = unsafe { lib.get(b"xor_gen\0") }.unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for &(k, len) in &[
        (2usize, 32usize),
        (4, 4096),
        (6, 65536),
        (14, 8192),
        (30, 1024),
    ] {
        let mut bufs = aligned(k + 2, len);
        for b in bufs.iter_mut().take(k) {
            rng.fill(&mut b[..]);
        }
        let mut ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        assert_eq!(
            unsafe { pq_gen((k + 2) as i32, len as i32, ptrs.as_mut_ptr()) },
            0
        );
        let data: Vec<&[u8]> = bufs[..k].iter().map(|b| &b[..]).collect();
        for kern in available_kernels() {
            let mut p = vec![0u8; len];
            let mut q = vec![0u8; len];
            gen_pq_with(kern, &data, &mut p, &mut q);
            assert!(
                p[..] == bufs[k][..] && q[..] == bufs[k + 1][..],
                "{kern:?} k {k} len {len} differs from ISA-L pq_gen"
            );
        }
        let mut xb = aligned(k + 1, len);
        for (i, b) in xb.iter_mut().take(k).enumerate() {
            b.copy_from_slice(bufs[i]);
        }
        let mut xp: Vec<*mut u8> = xb.iter_mut().map(|b| b.as_mut_ptr()).collect();
        assert_eq!(
            unsafe { xor_gen((k + 1) as i32, len as i32, xp.as_mut_ptr()) },
            0
        );
        assert!(xb[k][..] == bufs[k][..], "xor_gen differs");
    }
}

/// 32-byte aligned buffers, as ISA-L's SIMD kernels want.
pub fn aligned(n: usize, len: usize) -> Vec<&'static mut [u8]> {
    (0..n)
        .map(|_| {
            let layout = std::alloc::Layout::from_size_align(len, 64).unwrap();
            // SAFETY: non-zero size; leaked on purpose (a test).
            unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc_zeroed(layout), len) }
        })
        .collect()
}
