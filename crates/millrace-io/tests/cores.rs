//! The per-core runtime end to end on a real file: pool buffers written and read back through
//! each core's io_uring, the same batches run synchronously off the cores, and a request dropped
//! while the kernel still works on its buffer neither corrupts memory nor loses the buffer.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use millrace_io::{Batch, BufPool, Cores, CoresConfig, PoolConfig, SharedBuf};

fn pool(slices: usize) -> BufPool {
    BufPool::new(&PoolConfig {
        bytes: slices * (4 << 20),
        slices,
        max_buf: 1 << 20,
        populate: true,
    })
    .unwrap()
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn batches_on_every_core_write_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("member");
    let f = Arc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap(),
    );
    f.set_len(8 << 20).unwrap();
    let p = pool(2);
    let cores = Cores::start(CoresConfig {
        cores: 2,
        pool: Some(p.clone()),
        ..Default::default()
    })
    .unwrap();
    let tasks: Vec<_> = (0..8u8)
        .map(|t| {
            let (f, p) = (f.clone(), p.clone());
            cores.spawn(move || async move {
                assert!(millrace_io::on_ring());
                let core = millrace_io::current_core().unwrap();
                let mut buf = p.get(256 << 10).await.unwrap();
                buf.copy_from_slice(&pattern(t, 256 << 10));
                let sb = SharedBuf::new(buf);
                let mut b = Batch::with_capacity(4);
                // Four 64K pieces of one buffer in flight at once, the last with FUA.
                for i in 0..4usize {
                    let off = (t as u64) * (1 << 20) + i as u64 * 65536;
                    b.write(f.as_raw_fd(), off, &sb, i * 65536..(i + 1) * 65536, i == 3);
                }
                for r in b.run().await {
                    assert_eq!(r.unwrap(), 65536);
                }
                let mut b = Batch::default();
                b.fsync(f.as_raw_fd());
                b.run().await.pop().unwrap().unwrap();
                let mut back = SharedBuf::new(p.get(256 << 10).await.unwrap());
                back.get_mut().unwrap().fill(0);
                let mut b = Batch::default();
                b.read(f.as_raw_fd(), t as u64 * (1 << 20), &back, 0..256 << 10);
                assert_eq!(b.run().await[0].as_ref().unwrap(), &(256 << 10));
                let back = back.try_unwrap().unwrap();
                assert!(
                    back[..] == pattern(t, 256 << 10)[..],
                    "task {t} read back wrong bytes"
                );
                core
            })
        })
        .collect();
    let mut used = [0usize; 2];
    for t in tasks {
        used[t.wait().unwrap()] += 1;
    }
    assert!(
        used[0] > 0 && used[1] > 0,
        "tasks spread over both cores: {used:?}"
    );
    let entries: u64 = (0..2)
        .map(|i| {
            cores
                .ring_stats(i)
                .entries
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    let submits: u64 = (0..2)
        .map(|i| {
            cores
                .ring_stats(i)
                .submits
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    assert_eq!(entries, 8 * 6);
    assert!(
        submits < entries,
        "entries are submitted in batches ({submits} submits)"
    );
    drop(cores);
    assert_eq!(p.usage().in_use_bytes, 0);
}

#[test]
fn off_the_cores_a_batch_runs_synchronously() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("member");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(1 << 20).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        assert!(!millrace_io::on_ring());
        let sb = SharedBuf::new(millrace_io::IoBuf::from_slice(&pattern(9, 8192)));
        let mut b = Batch::default();
        b.write(f.as_raw_fd(), 4096, &sb, 0..8192, false);
        b.fsync(f.as_raw_fd());
        let r = b.run().await;
        assert_eq!(*r[0].as_ref().unwrap(), 8192);
        r[1].as_ref().unwrap();
        // A read past the end of the file reports the bytes it could move.
        let back = SharedBuf::new(millrace_io::IoBuf::standalone(8192));
        let mut b = Batch::default();
        b.read(f.as_raw_fd(), (1 << 20) - 4096, &back, 0..8192);
        assert_eq!(*b.run().await[0].as_ref().unwrap(), 4096);
    });
}

#[test]
fn a_dropped_request_leaves_its_buffer_to_the_kernel_until_completion() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("member");
    let f = Arc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap(),
    );
    f.set_len(4 << 20).unwrap();
    let p = pool(1);
    let cores = Cores::start(CoresConfig {
        cores: 1,
        pool: Some(p.clone()),
        ..Default::default()
    })
    .unwrap();
    let (f2, p2) = (f.clone(), p.clone());
    cores
        .spawn_on(0, move || async move {
            for _ in 0..50 {
                let sb = SharedBuf::new(p2.get(1 << 20).await.unwrap());
                let mut b = Batch::default();
                b.read(f2.as_raw_fd(), 0, &sb, 0..1 << 20);
                let fut = b.run();
                drop(sb);
                // Polled once (submitted), then dropped with the read in flight.
                let _ = tokio::time::timeout(std::time::Duration::from_nanos(1), fut).await;
            }
            // Every buffer comes back once its completion is reaped.
            for _ in 0..1000 {
                if p2.usage().in_use_bytes == 0 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            panic!(
                "buffers of dropped requests never came back: {:?}",
                p2.usage()
            );
        })
        .wait()
        .unwrap();
    drop(cores);
    assert_eq!(p.usage().in_use_bytes, 0);
    assert_eq!(p.free_bytes(), vec![4 << 20]);
}
