//! Heap allocations per request on the async face (issue #15: nothing allocated per request on
//! the data path beyond what cannot be pooled). A request on a core allocates its shared buffer
//! handle and its future's box; its pieces, member operations, results, accounts and lock
//! shards are inline. This file is its own test binary, so its counting allocator sees only
//! this test (one test: the harness runs tests of a binary in parallel threads).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use millrace_array::drive::{Drive, FileDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry, Level};
use millrace_block::BlockDevice;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
// SAFETY: the system allocator does the work; this only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
#[global_allocator]
static A: Counting = Counting;

/// RAID0 over four member files in memory (the inline path the benchmarks run), 64 KiB strips.
fn raid0(dir: &std::path::Path) -> Arc<Array> {
    let data = 16u64 << 20;
    let drives: Vec<Arc<dyn Drive>> = (0..4)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(data + (1 << 20))
                .unwrap();
            Arc::new(FileDrive::open(&p).unwrap()) as Arc<dyn Drive>
        })
        .collect();
    let geo = Geometry::new(Level::Raid0, 4, None, 64 << 10, data).unwrap();
    Arc::new(Array::new(geo, 1 << 20, drives, &[MemberState::Online; 4]))
}

#[test]
fn requests_on_a_core_allocate_only_their_buffer_handle_and_future() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let arr = raid0(dir.path());
    let pool = BufPool::new(&PoolConfig {
        bytes: 8 << 20,
        slices: 1,
        max_buf: 1 << 20,
        populate: true,
    })
    .unwrap();
    let cores = Cores::start(CoresConfig {
        cores: 1,
        pool: Some(pool.clone()),
        ..Default::default()
    })
    .unwrap();
    // Per row: request size, whether it writes, the most allocations a request may make.
    for (size, write, most) in [
        (4096, false, 2),
        (4096, true, 2),
        (128 << 10, false, 2),
        (128 << 10, true, 2),
    ] {
        let (arr, pool) = (arr.clone(), pool.clone());
        let per_request = cores
            .spawn_on(0, move || async move {
                let span = arr.size_bytes() / size as u64;
                let at = |i: u64| (i * 7919 % span) * size as u64;
                let mut b = pool.get(size).await.unwrap();
                b.fill(0x5a);
                let run = |b0, n: u64| {
                    let arr = arr.clone();
                    async move {
                        let mut b = b0;
                        for i in 0..n {
                            let (r, back) = if write {
                                arr.write_async(at(i), b, false).await
                            } else {
                                arr.read_async(at(i), b).await
                            };
                            r.unwrap();
                            b = back;
                        }
                        b
                    }
                };
                // Warm up: the ring, the members' mappings, the chunks known to be filled.
                b = run(b, 300).await;
                let a0 = ALLOCS.load(Ordering::Relaxed);
                run(b, 1000).await;
                (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / 1000.0
            })
            .wait()
            .unwrap();
        let what = if write { "write" } else { "read" };
        assert!(
            per_request <= most as f64,
            "a {size}-byte {what} made {per_request:.2} allocations, more than {most}"
        );
        assert!(
            cores.ring_stats(0).inline.load(Ordering::Relaxed) > 0,
            "the members in memory were not run inline: this test measures nothing"
        );
    }
}
