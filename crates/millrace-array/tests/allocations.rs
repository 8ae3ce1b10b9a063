//! Heap allocations per request on the async face (issue #15: nothing allocated per request on
//! the data path beyond what cannot be pooled). A request on a core allocates its shared buffer
//! handle, its future's box and its batch's state (which the ring's completions fill, so it
//! outlives a dropped future); its pieces, member operations, results, accounts and lock
//! shards are inline. This file is its own test binary, so its counting allocator sees only
//! this test (one test: the harness runs tests of a binary in parallel threads).

use millrace_array::Level;
use millrace_block::BlockDevice;

mod common;
#[path = "common/counting.rs"]
mod counting;

#[test]
fn requests_on_a_core_allocate_only_their_buffer_handle_future_and_batch_state() {
    // RAID0 over four member files on disk (O_DIRECT, through the core's io_uring), 64 KiB
    // strips, 16 MiB each.
    let rig = common::file_rig(Level::Raid0, 4, None, 64 << 10, 256);
    let arr = rig.array.clone();
    let (pool, cores) = common::start_cores(1, 8 << 20);
    // Per row: request size, whether it writes, the most allocations a request may make.
    for (size, write, most) in [
        (4096, false, 3),
        (4096, true, 3),
        (128 << 10, false, 3),
        (128 << 10, true, 3),
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
                // Warm up: the ring, its in-flight table, the thread's scratch.
                b = run(b, 300).await;
                let a0 = counting::allocations();
                run(b, 1000).await;
                (counting::allocations() - a0) as f64 / 1000.0
            })
            .wait()
            .unwrap();
        let what = if write { "write" } else { "read" };
        assert!(
            per_request <= most as f64,
            "a {size}-byte {what} made {per_request:.2} allocations, more than {most}"
        );
        assert!(
            cores
                .ring_stats(0)
                .entries
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0,
            "the member I/O did not go to the core's ring: this test measures nothing"
        );
    }
}
