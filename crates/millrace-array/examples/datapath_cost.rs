//! Costs per request of the engine's two faces that do not depend on machine load: heap
//! allocations, minor page faults and io_uring_enter calls per I/O (and, run under callgrind by
//! scripts/datapath-cost.sh, instructions per I/O). Members are files in /dev/shm (or $DIR).
//!
//! cargo run --release -p millrace-array --example datapath_cost -- MODE LEVEL SIZE OPS
//!   MODE: sync-read | sync-write | async-read | async-write; LEVEL: raid0 | raid6;
//!   SIZE: bytes per request (4096, 131072, ...); OPS: requests (one at a time).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use millrace_array::drive::{Drive, FileDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry, Level};
use millrace_block::BlockDevice;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};

#[path = "../tests/common/counting.rs"]
mod counting;

fn minflt() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_minflt as u64
}

fn array(dir: &std::path::Path, level: Level) -> Arc<Array> {
    let n = if level == Level::Raid6 { 6 } else { 4 };
    let strip = 64 << 10;
    let data = 256u64 << 20;
    let drives: Vec<Arc<dyn Drive>> = (0..n)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(data + (1 << 20))
                .unwrap();
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

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (mode, level, size, ops) = (
        a[1].as_str(),
        a[2].parse::<Level>().unwrap(),
        a[3].parse::<usize>().unwrap(),
        a[4].parse::<u64>().unwrap(),
    );
    let base = std::env::var("DIR").unwrap_or_else(|_| "/dev/shm".into());
    let dir = tempfile::tempdir_in(base).unwrap();
    let arr = array(dir.path(), level);
    let span = arr.size_bytes() / size as u64;
    let at = move |i: u64| (i * 7919 % span) * size as u64;
    let pool = BufPool::new(&PoolConfig {
        bytes: 64 << 20,
        slices: 1,
        max_buf: 8 << 20,
        populate: true,
    })
    .unwrap();
    let cores = Cores::start(CoresConfig {
        cores: 1,
        pool: Some(pool.clone()),
        ..Default::default()
    })
    .unwrap();
    let mut buf = vec![0x5au8; size];
    let mut run = |n: u64| match mode {
        "sync-read" => (0..n).for_each(|i| arr.read_at(at(i), &mut buf).unwrap()),
        "sync-write" => (0..n).for_each(|i| arr.write_at(at(i), &buf).unwrap()),
        _ => {
            let (arr, pool, write) = (arr.clone(), pool.clone(), mode == "async-write");
            cores
                .spawn_on(0, move || async move {
                    let mut b = pool.get(size).await.unwrap();
                    for i in 0..n {
                        let (r, back) = if write {
                            arr.write_async(at(i), b, false).await
                        } else {
                            arr.read_async(at(i), b).await
                        };
                        r.unwrap();
                        b = back;
                    }
                })
                .wait()
                .unwrap()
        }
    };
    run(ops.min(64)); // warm up: buffers, rings, the bitmap's first marks
    let (a0, f0, s0) = (
        counting::allocations(),
        minflt(),
        cores.ring_stats(0).submits.load(Ordering::Relaxed),
    );
    let t0 = std::time::Instant::now();
    run(ops);
    let wall = t0.elapsed();
    let per = |x: u64| x as f64 / ops as f64;
    println!(
        "{mode} {level} {size}: {:.2} allocations, {:.3} minor faults, {:.2} io_uring_enter per I/O ({:.1} us wall per I/O on this machine: not a measurement)",
        per(counting::allocations() - a0),
        per(minflt() - f0),
        per(cores.ring_stats(0).submits.load(Ordering::Relaxed) - s0),
        wall.as_secs_f64() * 1e6 / ops as f64,
    );
}
