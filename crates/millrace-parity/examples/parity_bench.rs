//! One-core throughput of our parity kernels against ISA-L's, on the same buffers in one run.
//!
//! cargo run --release -p millrace-parity --example parity_bench -- [--json FILE] [--cpu N]
//!     [--reps N]
//!
//! GB/s counts data read (k strips), as ISA-L's own benchmarks do. Each sample runs one kernel
//! for about 20 ms; the kernels take turns sample by sample, so that load from the rest of the
//! machine falls on all of them alike, and the median of the samples is reported with their
//! spread. Buffers are page-aligned, one allocation per strip, as O_DIRECT I/O buffers are.

use std::time::Instant;

type Gen = unsafe extern "C" fn(i32, i32, *mut *mut u8) -> i32;
type VectMulInit = unsafe extern "C" fn(u8, *mut u8);
type VectMul = unsafe extern "C" fn(i32, *mut u8, *mut u8, *mut u8) -> i32;
type InitTables = unsafe extern "C" fn(i32, i32, *mut u8, *mut u8);
type VectMad = unsafe extern "C" fn(i32, i32, i32, *mut u8, *mut u8, *mut u8);

struct Isal {
    pq_gen: Gen,
    pq_gen_avx2: Gen,
    xor_gen: Gen,
    mul_init: VectMulInit,
    vect_mul: VectMul,
    init_tables: InitTables,
    vect_mad: VectMad,
    _lib: libloading::Library,
}

fn load_isal() -> Isal {
    // SAFETY: a plain C library; the signatures are ISA-L's (raid.h, gf_vect_mul.h,
    // erasure_code.h).
    unsafe {
        let lib = libloading::Library::new("libisal.so.2").unwrap_or_else(|e| {
            eprintln!("ISA-L (libisal.so.2) cannot be loaded ({e}). The comparison needs it: install the Debian package libisal2.");
            std::process::exit(2)
        });
        Isal {
            pq_gen: *lib.get(b"pq_gen\0").unwrap(),
            pq_gen_avx2: *lib.get(b"pq_gen_avx2\0").unwrap(),
            xor_gen: *lib.get(b"xor_gen\0").unwrap(),
            mul_init: *lib.get(b"gf_vect_mul_init\0").unwrap(),
            vect_mul: *lib.get(b"gf_vect_mul\0").unwrap(),
            init_tables: *lib.get(b"ec_init_tables\0").unwrap(),
            vect_mad: *lib.get(b"gf_vect_mad\0").unwrap(),
            _lib: lib,
        }
    }
}

/// `n` page-aligned buffers of `len` bytes, filled with a pattern (never freed: one run).
fn buffers(n: usize, len: usize) -> Vec<&'static mut [u8]> {
    (0..n)
        .map(|i| {
            let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
            // SAFETY: non-zero size; the memory is leaked, so 'static holds.
            let b = unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc(layout), len) };
            for (j, x) in b.iter_mut().enumerate() {
                *x = (j.wrapping_mul(31) ^ (j >> 8) ^ i.wrapping_mul(131)) as u8;
            }
            b
        })
        .collect()
}

/// GB/s of one ~20 ms sample of `f`, which reads `bytes` per call.
fn sample(bytes: usize, f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let n = ((0.02 / once) as usize).max(1);
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    (n * bytes) as f64 / t.elapsed().as_secs_f64() / 1e9
}

struct Stat {
    median: f64,
    /// (max - min) / median
    spread: f64,
}

/// Samples each function `reps` times, in turns.
fn measure(reps: usize, bytes: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<Stat> {
    let mut s: Vec<Vec<f64>> = vec![Vec::new(); fs.len()];
    for f in fs.iter_mut() {
        f(); // warm the caches and the page tables
    }
    for _ in 0..reps {
        for (f, v) in fs.iter_mut().zip(&mut s) {
            v.push(sample(bytes, *f));
        }
    }
    s.into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.total_cmp(b));
            let median = v[v.len() / 2];
            Stat {
                median,
                spread: (v[v.len() - 1] - v[0]) / median,
            }
        })
        .collect()
}

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if !ok {
        eprintln!("Could not pin to CPU {cpu}; the numbers are unpinned.");
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

struct Row {
    op: &'static str,
    k: usize,
    strip: usize,
    ours: Stat,
    isal: Stat,
    /// Same instruction set on both sides: our AVX2 kernel against ISA-L's pq_gen_avx2.
    avx2: Option<(Stat, Stat)>,
}

/// The kernel cases: data strips, and the bytes of each.
const CASES: [(usize, usize); 5] = [
    (6, 16 << 10),
    (6, 64 << 10),
    (14, 64 << 10),
    (6, 256 << 10),
    (14, 256 << 10),
];

fn main() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu: usize = arg("--cpu").map_or(cpus - 1, |c| c.parse().expect("--cpu N"));
    let reps: usize = arg("--reps").map_or(11, |c| c.parse().expect("--reps N"));
    pin(cpu);
    let isal = load_isal();
    let ours_name = millrace_parity::active_kernel();
    let have_avx2 = millrace_parity::Kernel::Avx2.is_available();
    print_header(cpu, ours_name, reps);
    let mut rows: Vec<Row> = Vec::new();
    let mut keep = |r: Row| {
        print_row(&r);
        rows.push(r);
    };
    for &(k, strip) in &CASES {
        keep(bench_gen_pq(&isal, reps, k, strip, have_avx2));
    }
    for &(k, strip) in &CASES {
        keep(bench_gen_p(&isal, reps, k, strip));
    }
    // Multiply by a constant: what rebuilds of data strips do (against gf_vect_mad and
    // gf_vect_mul, ISA-L's single-source multiply-accumulate and multiply).
    for &strip in &[64usize << 10, 256 << 10] {
        let [mad, mul] = bench_mul(&isal, reps, strip);
        keep(mad);
        keep(mul);
    }
    // Rebuilds (ours only: ISA-L has no call for md's layout short of a decode matrix). GB/s
    // counts the k strips read to rebuild.
    let mut rebuilds: Vec<(String, Stat)> = Vec::new();
    for &(k, strip) in &[(6usize, 64usize << 10), (14, 64 << 10), (14, 256 << 10)] {
        rebuilds.extend(bench_rebuilds(reps, k, strip));
    }
    println!("± is half the spread (max - min) of the samples, as a share of the median.");
    if let Some(path) = arg("--json") {
        let json = json_report(cpu, ours_name, reps, &rows, &rebuilds);
        std::fs::write(&path, json).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        println!("wrote {path}");
    }
}

fn print_header(cpu: usize, ours_name: &str, reps: usize) {
    println!(
        "CPU: {} (pinned to cpu {cpu}); our kernel: {ours_name}; ISA-L: libisal.so.2 (its own dispatch); {reps} samples each, median",
        cpu_model()
    );
    println!(
        "{:<8} {:>3} {:>6} {:>9} | {:>12} {:>12} {:>6} | {:>12} {:>12} {:>6}",
        "op",
        "k",
        "strip",
        "working set",
        "ours GB/s",
        "ISA-L GB/s",
        "ratio",
        "avx2 ours",
        "ISA-L avx2",
        "ratio"
    );
}

fn print_row(r: &Row) {
    let ws = (r.k + if r.op == "gen_pq" { 2 } else { 1 }) * r.strip;
    let f = |s: &Stat| format!("{:6.2} ±{:3.0}%", s.median, s.spread * 50.0);
    let same = r.avx2.as_ref().map_or(String::new(), |(a, b)| {
        format!("{:>12} {:>12} {:6.3}", f(a), f(b), a.median / b.median)
    });
    println!(
        "{:<8} {:>3} {:>5}K {:>8}K | {:>12} {:>12} {:6.3} | {same}",
        r.op,
        r.k,
        r.strip >> 10,
        ws >> 10,
        f(&r.ours),
        f(&r.isal),
        r.ours.median / r.isal.median,
    );
}

/// P and Q of `k` strips: ours against ISA-L's pq_gen, and with AVX2 both sides'
/// AVX2 kernels, after checking that both give the same answer.
fn bench_gen_pq(isal: &Isal, reps: usize, k: usize, strip: usize, have_avx2: bool) -> Row {
    let bufs = buffers(k + 2, strip);
    let mut ptrs: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr() as *mut u8).collect();
    let data: Vec<&[u8]> = (0..k)
        // SAFETY: the data strips are only read while these views live.
        .map(|i| unsafe { std::slice::from_raw_parts(ptrs[i], strip) })
        .collect();
    let pp = ptrs.as_mut_ptr();
    let vects = (k + 2) as i32;
    let (pq_p, pq_q) = (ptrs[k], ptrs[k + 1]);
    // SAFETY: P and Q are written by one kernel at a time, never read through `data`; each
    // closure makes its own short-lived views.
    let pq = || unsafe {
        (
            std::slice::from_raw_parts_mut(pq_p, strip),
            std::slice::from_raw_parts_mut(pq_q, strip),
        )
    };
    let mut ours = || {
        let (p, q) = pq();
        millrace_parity::gen_pq(&data, p, q)
    };
    let mut theirs = || unsafe {
        (isal.pq_gen)(vects, strip as i32, pp);
    };
    let mut stats = if have_avx2 {
        let mut ours2 = || {
            let (p, q) = pq();
            millrace_parity::gen_pq_with(millrace_parity::Kernel::Avx2, &data, p, q)
        };
        let mut theirs2 = || unsafe {
            (isal.pq_gen_avx2)(vects, strip as i32, pp);
        };
        measure(
            reps,
            k * strip,
            &mut [&mut ours, &mut theirs, &mut ours2, &mut theirs2],
        )
    } else {
        measure(reps, k * strip, &mut [&mut ours, &mut theirs])
    };
    // The same answer from both, or the comparison means nothing.
    let (mut p2, mut q2) = (vec![0u8; strip], vec![0u8; strip]);
    millrace_parity::gen_pq(&data, &mut p2, &mut q2);
    unsafe { (isal.pq_gen)(vects, strip as i32, pp) };
    let (p, q) = pq();
    assert!(p2 == p[..] && q2 == q[..], "ours and ISA-L differ");
    let avx2 = (stats.len() == 4).then(|| {
        let b = stats.pop().unwrap();
        (stats.pop().unwrap(), b)
    });
    let isal_s = stats.pop().unwrap();
    Row {
        op: "gen_pq",
        k,
        strip,
        ours: stats.pop().unwrap(),
        isal: isal_s,
        avx2,
    }
}

/// P alone (XOR) of `k` strips: ours against ISA-L's xor_gen.
fn bench_gen_p(isal: &Isal, reps: usize, k: usize, strip: usize) -> Row {
    let bufs = buffers(k + 1, strip);
    let mut ptrs: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr() as *mut u8).collect();
    let data: Vec<&[u8]> = (0..k)
        // SAFETY: as in bench_gen_pq.
        .map(|i| unsafe { std::slice::from_raw_parts(ptrs[i], strip) })
        .collect();
    let p = unsafe { std::slice::from_raw_parts_mut(ptrs[k], strip) };
    let pp = ptrs.as_mut_ptr();
    let mut ours = || millrace_parity::gen_p(&data, p);
    let mut theirs = || unsafe {
        (isal.xor_gen)((k + 1) as i32, strip as i32, pp);
    };
    let mut stats = measure(reps, k * strip, &mut [&mut ours, &mut theirs]);
    Row {
        op: "gen_p",
        k,
        strip,
        isal: stats.pop().unwrap(),
        ours: stats.pop().unwrap(),
        avx2: None,
    }
}

/// One strip multiplied by a constant and added in (against gf_vect_mad), then multiplied
/// alone (against gf_vect_mul).
fn bench_mul(isal: &Isal, reps: usize, strip: usize) -> [Row; 2] {
    let bufs = buffers(2, strip);
    let (src, dst) = (bufs[0].as_ptr() as *mut u8, bufs[1].as_ptr() as *mut u8);
    // SAFETY: two distinct buffers of `strip` bytes.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src, strip),
            std::slice::from_raw_parts_mut(dst, strip),
        )
    };
    let c = 0x8eu8;
    let mut mad_tbl = [0u8; 32];
    let mut mul_tbl = [0u8; 32];
    let mut coef = [c];
    // SAFETY: ISA-L table setup for one coefficient (32 bytes each).
    unsafe {
        (isal.init_tables)(1, 1, coef.as_mut_ptr(), mad_tbl.as_mut_ptr());
        (isal.mul_init)(c, mul_tbl.as_mut_ptr());
    }
    let (mt, ut) = (mad_tbl.as_mut_ptr(), mul_tbl.as_mut_ptr());
    let mut ours = || millrace_parity::mul_xor_into(c, s, d);
    let mut theirs = || unsafe { (isal.vect_mad)(strip as i32, 1, 0, mt, src, dst) };
    let mut st = measure(reps, strip, &mut [&mut ours, &mut theirs]);
    let mad = Row {
        op: "mul_xor",
        k: 1,
        strip,
        isal: st.pop().unwrap(),
        ours: st.pop().unwrap(),
        avx2: None,
    };
    let mut ours = || millrace_parity::mul_into(c, s, d);
    let mut theirs = || unsafe {
        (isal.vect_mul)(strip as i32, ut, src, dst);
    };
    let mut st = measure(reps, strip, &mut [&mut ours, &mut theirs]);
    let mul = Row {
        op: "mul",
        k: 1,
        strip,
        isal: st.pop().unwrap(),
        ours: st.pop().unwrap(),
        avx2: None,
    };
    [mad, mul]
}

/// Our RAID6 rebuilds of `k` strips for each kind of loss, printed as they are measured.
fn bench_rebuilds(reps: usize, k: usize, strip: usize) -> Vec<(String, Stat)> {
    let bufs = buffers(k + 2, strip);
    let ptrs: Vec<*mut u8> = bufs.iter().map(|b| b.as_ptr() as *mut u8).collect();
    // SAFETY: one set of views at a time, made inside each closure.
    let strips = || -> Vec<&mut [u8]> {
        ptrs.iter()
            .map(|&p| unsafe { std::slice::from_raw_parts_mut(p, strip) })
            .collect()
    };
    {
        let mut st = strips();
        let (d, pq) = st.split_at_mut(k);
        let (p, q) = pq.split_at_mut(1);
        let d: Vec<&[u8]> = d.iter().map(|s| &s[..]).collect();
        millrace_parity::gen_pq(&d, p[0], q[0]);
    }
    let mut out = Vec::new();
    for (what, lost) in [
        ("two data", vec![1, k - 2]),
        ("data + P", vec![1, k]),
        ("one data (from P)", vec![1]),
    ] {
        let mut f = || {
            millrace_parity::raid6_recover(&mut strips(), &lost).unwrap();
        };
        let st = measure(reps, k * strip, &mut [&mut f]).pop().unwrap();
        let name = format!(
            "raid6_recover {what:<17} k {k:>2} strip {:>3}K",
            strip >> 10
        );
        println!("{name}: {:6.2} GB/s ±{:3.0}%", st.median, st.spread * 50.0);
        out.push((name, st));
    }
    out
}

fn json_report(
    cpu: usize,
    ours_name: &str,
    reps: usize,
    rows: &[Row],
    rebuilds: &[(String, Stat)],
) -> String {
    let stat = |s: &Stat| {
        format!(
            r#"{{"median_gbps":{:.3},"spread":{:.3}}}"#,
            s.median, s.spread
        )
    };
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            let avx2 = r.avx2.as_ref().map_or("null".into(), |(a, b)| {
                format!(
                    r#"{{"ours":{},"isal":{},"ratio":{:.3}}}"#,
                    stat(a),
                    stat(b),
                    a.median / b.median
                )
            });
            format!(
                r#"{{"op":"{}","k":{},"strip_bytes":{},"ours":{},"isal":{},"ratio":{:.3},"avx2_vs_isal_avx2":{avx2}}}"#,
                r.op,
                r.k,
                r.strip,
                stat(&r.ours),
                stat(&r.isal),
                r.ours.median / r.isal.median
            )
        })
        .collect();
    format!(
        "{{\"cpu\":\"{}\",\"pinned_cpu\":{cpu},\"kernel\":\"{ours_name}\",\"samples\":{reps},\"unit\":\"GB/s of data read\",\"results\":[\n{}\n],\"rebuilds\":[\n{}\n]}}\n",
        cpu_model().replace('"', "'"),
        items.join(",\n"),
        rebuilds
            .iter()
            .map(|(n, s)| format!(r#"{{"case":"{n}","ours":{}}}"#, stat(s)))
            .collect::<Vec<_>>()
            .join(",\n")
    )
}
