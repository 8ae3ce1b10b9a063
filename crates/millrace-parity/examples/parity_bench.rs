//! One-core throughput of our parity kernels against ISA-L's on the same buffers, in one run.
//! cargo run --release -p millrace-parity --example parity_bench [-- --json FILE]

use std::time::Instant;

type Gen = unsafe extern "C" fn(i32, i32, *mut *mut u8) -> i32;

fn buffers(n: usize, len: usize) -> Vec<&'static mut [u8]> {
    (0..n)
        .map(|i| {
            let layout = std::alloc::Layout::from_size_align(len, 64).unwrap();
            // SAFETY: non-zero size; the buffers live for the whole run.
            let b =
                unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc_zeroed(layout), len) };
            for (j, x) in b.iter_mut().enumerate() {
                *x = (j.wrapping_mul(31) ^ i.wrapping_mul(131)) as u8;
            }
            b
        })
        .collect()
}

fn rate(bytes: usize, f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    let mut n = 0usize;
    while t.elapsed().as_secs_f64() < 0.1 {
        f();
        n += 1;
    }
    (n * bytes) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// Median GB/s of data in for each of two kernels, timed in alternation so that noise from the
/// rest of the machine falls on both alike.
fn measure_pair(bytes: usize, mut ours: impl FnMut(), mut theirs: impl FnMut()) -> (f64, f64) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        a.push(rate(bytes, &mut ours));
        b.push(rate(bytes, &mut theirs));
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        v[v.len() / 2]
    };
    (med(&mut a), med(&mut b))
}

fn main() {
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    // One core: the comparison is per core, and the other core stays out of it.
    // SAFETY: a plain cpu_set_t for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let lib = unsafe { libloading::Library::new("libisal.so.2") }.expect(
        "ISA-L (libisal.so.2) is needed for the comparison: install the Debian package libisal2",
    );
    let pq_gen: libloading::Symbol<Gen> = unsafe { lib.get(b"pq_gen\0") }.unwrap();
    let xor_gen: libloading::Symbol<Gen> = unsafe { lib.get(b"xor_gen\0") }.unwrap();
    println!("kernel: {} (one core)", millrace_parity::active_kernel());
    println!(
        "{:<10} {:>4} {:>8} {:>10} {:>10} {:>7}",
        "op", "k", "strip", "ours GB/s", "ISA-L GB/s", "ratio"
    );
    let mut rows = Vec::new();
    for &(k, strip) in &[
        (6usize, 16usize << 10),
        (6, 64 << 10),
        (14, 64 << 10),
        (6, 256 << 10),
        (14, 256 << 10),
    ] {
        let mut bufs = buffers(k + 2, strip);
        let mut ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let mut theirs = buffers(k + 2, strip);
        let mut tptrs: Vec<*mut u8> = theirs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        for (t, b) in tptrs.iter().zip(&ptrs).take(k) {
            // SAFETY: both buffers are `strip` bytes long.
            unsafe { std::ptr::copy_nonoverlapping(*b, *t, strip) };
        }
        let _ = &mut ptrs;
        let (data, par) = bufs.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
        let (p, q) = par.split_at_mut(1);
        let (ours, isal) = measure_pair(
            k * strip,
            || millrace_parity::gen_pq(&data, p[0], q[0]),
            || unsafe {
                pq_gen((k + 2) as i32, strip as i32, tptrs.as_mut_ptr());
            },
        );
        println!(
            "{:<10} {:>4} {:>7}K {:>10.2} {:>10.2} {:>7.3}",
            "gen_pq",
            k,
            strip >> 10,
            ours,
            isal,
            ours / isal
        );
        rows.push(format!(r#"{{"op":"gen_pq","k":{k},"strip_bytes":{strip},"ours_gbps":{ours:.3},"isal_gbps":{isal:.3},"ratio":{:.3}}}"#, ours / isal));

        let mut xb = buffers(k + 1, strip);
        let mut xt = buffers(k + 1, strip);
        let mut xp: Vec<*mut u8> = xt.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let (d, p) = xb.split_at_mut(k);
        let d: Vec<&[u8]> = d.iter().map(|b| &b[..]).collect();
        let (ours, isal) = measure_pair(
            k * strip,
            || millrace_parity::gen_p(&d, p[0]),
            || unsafe {
                xor_gen((k + 1) as i32, strip as i32, xp.as_mut_ptr());
            },
        );
        println!(
            "{:<10} {:>4} {:>7}K {:>10.2} {:>10.2} {:>7.3}",
            "gen_p",
            k,
            strip >> 10,
            ours,
            isal,
            ours / isal
        );
        rows.push(format!(r#"{{"op":"gen_p","k":{k},"strip_bytes":{strip},"ours_gbps":{ours:.3},"isal_gbps":{isal:.3},"ratio":{:.3}}}"#, ours / isal));
    }
    let src = buffers(1, 256 << 10);
    let mut dst = buffers(1, 256 << 10);
    let mx = rate(256 << 10, &mut || {
        millrace_parity::mul_xor_into(0x8e, src[0], dst[0])
    });
    println!("mul_xor_into 256K: {mx:.2} GB/s");
    if let Some(path) = json {
        std::fs::write(
            &path,
            format!(
                "{{\"kernel\":\"{}\",\"results\":[{}],\"mul_xor_gbps\":{mx:.3}}}\n",
                millrace_parity::active_kernel(),
                rows.join(",")
            ),
        )
        .unwrap();
    }
}
