//! A write workload that kills itself mid-write (SIGKILL: no clean stop, no last flush), for
//! tests/guest/md-ppl.sh: it opens the pool on the drive files given, and four threads write
//! random pieces (single sectors, partial and whole stripes, spans across stripes, unaligned
//! bytes) until WRITES of them have been acknowledged; then the process kills itself while the
//! other threads' writes are in flight. On a degraded parity pool those writes go through the
//! partial-parity log, so the next open must recover from it.
//!
//! crash_writer SEED WRITES DRIVE...

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use millrace_array::Pool;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: crash_writer SEED WRITES DRIVE...");
        std::process::exit(2);
    }
    let seed: u64 = args[0].parse().expect("SEED is a number");
    let writes: u64 = args[1].parse().expect("WRITES is a number");
    let paths: Vec<PathBuf> = args[2..].iter().map(PathBuf::from).collect();
    let (mut pools, notes) = Pool::import(&paths).unwrap_or_else(|e| {
        eprintln!("crash_writer: cannot open the pool: {e}");
        std::process::exit(1)
    });
    if pools.len() != 1 {
        eprintln!(
            "crash_writer: expected one pool on those drives, found {} ({notes:?})",
            pools.len()
        );
        std::process::exit(1);
    }
    let pool = Arc::new(pools.remove(0));
    let size = pool.array().size_bytes();
    let fs = pool.array().geometry().full_stripe_bytes();
    println!(
        "crash_writer: pool '{}' is {}; {writes} writes acknowledged, then SIGKILL",
        pool.name(),
        pool.state()
    );
    let acked = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (pool, acked) = (pool.clone(), acked.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(t));
                loop {
                    let (off, len) = match rng.random_range(0..4) {
                        0 => (rng.random_range(0..size / 4096) * 4096, 4096),
                        1 => (rng.random_range(0..size / fs) * fs, fs),
                        2 => {
                            let off = rng.random_range(0..size / 4096) * 4096;
                            (off, (3 * fs).min(size - off))
                        }
                        _ => {
                            let off = rng.random_range(0..size - 1);
                            (off, rng.random_range(1..=(size - off).min(100_000)))
                        }
                    };
                    let mut data = vec![0u8; len as usize];
                    rng.fill(&mut data[..]);
                    if let Err(e) = pool.write_at(off, &data) {
                        eprintln!("crash_writer: a write failed: {e}");
                        std::process::exit(1);
                    }
                    if acked.fetch_add(1, Ordering::AcqRel) + 1 == writes {
                        // SAFETY: kill(2) on this process; nothing is shared with it.
                        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}
