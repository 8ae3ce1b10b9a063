//! What merging writes in flight to one stripe saves, in counts that do not depend on machine
//! load: member bytes read and written per client byte, and how the engine planned the rows
//! (full-stripe, read-modify-write, reconstruct-write), for a stream of sequential writes at a
//! queue depth, with merging off and then on, on the same pool in one run. Members are files in
//! /dev/shm (or $DIR); one core of `millrace_io::Cores` drives the queue.
//!
//! cargo run --release -p millrace-array --example merge_cost -- [LEVEL DRIVES STRIP SIZE QD MIB]
//!   defaults: raid6 6 65536 131072 16 64 (128K writes at QD16 on RAID6, 64K strip, 6 drives)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use millrace_array::drive::{Drive, FileDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry, Level};
use millrace_block::BlockDevice;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};

fn array(dir: &std::path::Path, level: Level, n: usize, strip: u64, data: u64) -> Arc<Array> {
    let drives: Vec<Arc<dyn Drive>> = (0..n)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            let f = std::fs::File::create(&p).unwrap();
            f.set_len(data + (1 << 20)).unwrap();
            Arc::new(FileDrive::open(&p).unwrap()) as Arc<dyn Drive>
        })
        .collect();
    let geo = Geometry::new(level, n, None, strip, data).unwrap();
    Arc::new(Array::new(
        geo,
        1 << 20,
        drives,
        &vec![MemberState::Online; n],
    ))
}

/// The counters this measure reads: member bytes read, written, and the plans.
fn counts(a: &Array) -> [u64; 5] {
    let sum = |f: fn(&millrace_array::MemberStats) -> &AtomicU64| -> u64 {
        a.member_stats
            .iter()
            .map(|m| f(m).load(Ordering::Relaxed))
            .sum()
    };
    let s = &a.stats;
    [
        sum(|m| &m.read_bytes),
        sum(|m| &m.write_bytes),
        s.full_stripe_writes.load(Ordering::Relaxed),
        s.rmw_writes.load(Ordering::Relaxed),
        s.rcw_writes.load(Ordering::Relaxed),
    ]
}

/// The bytes written at `off`: every 512-byte sector different, so a parity that left out
/// some request's data could not pass a check by chance.
fn fill(b: &mut [u8], off: u64) {
    for (i, c) in b.chunks_mut(512).enumerate() {
        let s = (off / 512 + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for (j, x) in c.iter_mut().enumerate() {
            *x = (s >> ((j % 8) * 8)) as u8 ^ j as u8;
        }
    }
}

/// Writes [0, total) in `size` pieces, in order, `qd` in flight at once from one core.
fn stream(cores: &Cores, pool: &BufPool, a: &Arc<Array>, size: usize, qd: usize, total: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let (a, pool) = (a.clone(), pool.clone());
    cores
        .spawn_on(0, move || async move {
            let mut hs = Vec::new();
            for _ in 0..qd {
                let (a, pool, next) = (a.clone(), pool.clone(), next.clone());
                hs.push(tokio::task::spawn_local(async move {
                    let mut b = pool.get(size).await.unwrap();
                    loop {
                        let off = next.fetch_add(size as u64, Ordering::Relaxed);
                        if off + size as u64 > total {
                            break;
                        }
                        fill(&mut b, off);
                        let (r, back) = a.write_async(off, b, false).await;
                        r.unwrap();
                        b = back;
                    }
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
        })
        .wait()
        .unwrap();
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let level: Level = arg(1, "raid6").parse().unwrap();
    let n: usize = arg(2, "6").parse().unwrap();
    let strip: u64 = arg(3, "65536").parse().unwrap();
    let size: usize = arg(4, "131072").parse().unwrap();
    let qd: usize = arg(5, "16").parse().unwrap();
    let total: u64 = arg(6, "64").parse::<u64>().unwrap() << 20;
    let base = std::env::var("DIR").unwrap_or_else(|_| "/dev/shm".into());
    let tmp = tempfile::tempdir_in(base).unwrap();
    // MERGE_COST_KEEP=DIR: the member files (data at 1 MiB) and `expected`, the bytes written,
    // stay there for Linux md to check (tests/guest/md-compat.sh).
    let keep = std::env::var_os("MERGE_COST_KEEP").map(std::path::PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let data = total.div_ceil(strip * (n as u64 - 2)) * strip + strip;
    let arr = array(&dir, level, n, strip, data);
    let pool = BufPool::new(&PoolConfig {
        bytes: (qd * size).next_power_of_two().max(1 << 20) * 2,
        slices: 1,
        max_buf: size.next_power_of_two(),
        populate: true,
    })
    .unwrap();
    let cores = Cores::start(CoresConfig {
        cores: 1,
        pool: Some(pool.clone()),
        ..Default::default()
    })
    .unwrap();
    println!(
        "{level}, {n} drives, {}K strip, {}K sequential writes at QD{qd}, {} MiB each run:",
        strip >> 10,
        size >> 10,
        total >> 20
    );
    for merging in [false, true] {
        arr.set_write_merging(merging);
        let c0 = counts(&arr);
        stream(&cores, &pool, &arr, size, qd, total);
        let c1 = counts(&arr);
        let d: Vec<u64> = c0.iter().zip(c1).map(|(x, y)| y - x).collect();
        println!(
            "  merging {:3}: member bytes read {:.3} and written {:.3} per client byte; rows planned full {} / read-modify-write {} / reconstruct-write {}",
            if merging { "on" } else { "off" },
            d[0] as f64 / total as f64,
            d[1] as f64 / total as f64,
            d[2],
            d[3],
            d[4],
        );
    }
    if let Some(k) = keep {
        drop(cores);
        arr.flush().unwrap();
        let mut want = vec![0u8; total as usize];
        for (i, c) in want.chunks_mut(size).enumerate() {
            fill(c, (i * size) as u64);
        }
        std::fs::write(k.join("expected"), want).unwrap();
    }
}
