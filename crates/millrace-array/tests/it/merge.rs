//! Writes in flight to one stripe are merged (issue #15): partial-row writes submitted together
//! on a core are planned as one, so writes that together cover a row cost a full-stripe write
//! (no member read), and parity stays right (checked with the independent reference and by
//! the scrub). Overlapping writes in flight together are not merged: each lands whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{file_rig, pattern, start_cores, Rig};
use millrace_array::{Array, Level};
use millrace_block::BlockDevice;
use millrace_io::{BufPool, Cores};

fn cores(n: usize) -> (Cores, BufPool) {
    let (pool, cores) = start_cores(n, 32 << 20);
    (cores, pool)
}

/// Submits every write at once from one task on core `core` (so they are in flight together)
/// and waits for all; each (offset, seed, len, fua).
fn submit_together(
    cores: &Cores,
    core: usize,
    pool: &BufPool,
    a: &Arc<Array>,
    w: &[(u64, u64, usize, bool)],
) {
    let (a, p, w) = (a.clone(), pool.clone(), w.to_vec());
    cores
        .spawn_on(core, move || async move {
            let mut hs = Vec::new();
            for (off, seed, len, fua) in w {
                let mut b = p.get(len).await.unwrap();
                b.copy_from_slice(&pattern(seed, len));
                let a = a.clone();
                hs.push(tokio::task::spawn_local(async move {
                    let (r, _) = a.write_async(off, b, fua).await;
                    r.unwrap();
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
        })
        .wait()
        .unwrap();
}

fn member_bytes(a: &Array) -> (u64, u64) {
    let r = a
        .member_stats
        .iter()
        .map(|m| m.read_bytes.load(Ordering::Relaxed))
        .sum();
    let w = a
        .member_stats
        .iter()
        .map(|m| m.write_bytes.load(Ordering::Relaxed))
        .sum();
    (r, w)
}

fn check_parity(rig: &Rig, what: &str) {
    rig.check_redundancy()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for row in 0..rig.rows as u64 {
        let rep = rig.array.scrub_row(row, false).unwrap();
        assert_eq!(
            rep.mismatches, 0,
            "{what}: the scrub finds a mismatch in row {row}"
        );
    }
}

/// A queue of 128K writes on RAID6 with a 64K strip (6 drives: a 256K stripe), in halves of
/// rows, all in flight at once: every row is one full-stripe write, nothing is read.
#[test]
fn concurrent_half_row_writes_become_full_stripe_writes() {
    for (level, n) in [(Level::Raid6, 6), (Level::Raid5, 5)] {
        let rig = file_rig(level, n, None, 64 << 10, 16);
        let (cores, pool) = cores(1);
        let fs = rig.array.geometry().full_stripe_bytes();
        let rows = rig.array.geometry().rows();
        let half = (fs / 2) as usize;
        // Sequential order, as a client's queue would hold them (odd rows second half first).
        let mut w = Vec::new();
        for r in 0..rows {
            let (a, b) = (r * fs, r * fs + half as u64);
            let (x, y) = if r % 2 == 0 { (a, b) } else { (b, a) };
            w.push((x, x, half, r % 3 == 0));
            w.push((y, y, half, false));
        }
        submit_together(&cores, 0, &pool, &rig.array, &w);
        let s = &rig.array.stats;
        assert_eq!(
            s.full_stripe_writes.load(Ordering::Relaxed),
            rows,
            "{level}: full-stripe writes"
        );
        assert_eq!(
            s.rmw_writes.load(Ordering::Relaxed),
            0,
            "{level}: read-modify-writes"
        );
        assert_eq!(
            s.rcw_writes.load(Ordering::Relaxed),
            0,
            "{level}: reconstruct-writes"
        );
        assert_eq!(
            s.merged_writes.load(Ordering::Relaxed),
            rows,
            "{level}: merged requests"
        );
        let (read, written) = member_bytes(&rig.array);
        assert_eq!(read, 0, "{level}: a merged full stripe reads nothing");
        let np = rig.array.geometry().level.parity() as u64;
        let k = rig.array.geometry().group_data() as u64;
        assert_eq!(
            written,
            rows * fs / k * (k + np),
            "{level}: data and parity once each"
        );
        drop(cores);
        assert_eq!(
            pool.usage().in_use_bytes,
            0,
            "{level}: every buffer came back"
        );
        let mut want = vec![0u8; (rows * fs) as usize];
        for (off, seed, len, _) in &w {
            want[*off as usize..*off as usize + len].copy_from_slice(&pattern(*seed, *len));
        }
        assert!(rig.logical_from_drives() == want, "{level}: data differs");
        check_parity(&rig, &level.to_string());
    }
}

/// Small writes from two cores into the same rows, some covering a row between them and some
/// not: whatever merges, the data and parity end right and the counters add up.
#[test]
fn partial_writes_from_two_cores_merge_and_keep_parity_right() {
    let rig = file_rig(Level::Raid6, 6, None, 16 << 10, 16);
    let (cores, pool) = cores(2);
    let fs = rig.array.geometry().full_stripe_bytes() as usize;
    let rows = rig.rows;
    let mut model = vec![0u8; rows * fs];
    for round in 0..4u64 {
        // 8K writes at every other 8K of each row from core 0, the rest from core 1 on even
        // rounds (so those rows are covered), nothing more on odd rounds.
        let mut by_core: [Vec<(u64, u64, usize, bool)>; 2] = [Vec::new(), Vec::new()];
        for r in 0..rows {
            for (i, c) in (0..fs / 8192).map(|i| (i, i % 2)) {
                if c == 1 && round % 2 == 1 {
                    continue;
                }
                let off = (r * fs + i * 8192) as u64;
                by_core[c].push((off, off ^ round << 40, 8192, i == 0));
            }
        }
        std::thread::scope(|s| {
            for (c, w) in by_core.iter().enumerate() {
                let (cores, pool, a) = (&cores, &pool, &rig.array);
                s.spawn(move || submit_together(cores, c, pool, a, w));
            }
        });
        for (off, seed, len, _) in by_core.iter().flatten() {
            model[*off as usize..*off as usize + len].copy_from_slice(&pattern(*seed, *len));
        }
        let got = {
            let a = rig.array.clone();
            let p = pool.clone();
            cores
                .spawn_on(1, move || async move {
                    let (r, b) = a.read_async(0, p.get(rows * fs).await.unwrap()).await;
                    r.unwrap();
                    b.to_vec()
                })
                .wait()
                .unwrap()
        };
        assert!(
            got == model,
            "round {round}: the pool reads back differently"
        );
    }
    let s = &rig.array.stats;
    let merged = s.merged_writes.load(Ordering::Relaxed);
    assert!(merged > 0, "no write was merged");
    let planned = s.full_stripe_writes.load(Ordering::Relaxed)
        + s.rmw_writes.load(Ordering::Relaxed)
        + s.rcw_writes.load(Ordering::Relaxed);
    let requests = s.write_ops.load(Ordering::Relaxed);
    assert_eq!(
        planned + merged,
        requests,
        "every request is planned once, alone or merged"
    );
    drop(cores);
    assert_eq!(pool.usage().in_use_bytes, 0, "every buffer came back");
    assert!(
        rig.logical_from_drives() == model,
        "the drives differ from the model"
    );
    check_parity(&rig, "raid6");
}

/// Two overlapping writes in flight together are not merged: the later one waits for the
/// earlier, so the bytes they share are one write's whole, and parity is right.
#[test]
fn overlapping_writes_in_flight_are_not_merged() {
    let rig = file_rig(Level::Raid6, 6, None, 64 << 10, 4);
    let (cores, pool) = cores(1);
    let (a, b) = (
        (0u64, 1u64, 128 << 10, false),
        ((64 << 10) as u64, 2u64, 128 << 10, true),
    );
    submit_together(&cores, 0, &pool, &rig.array, &[a, b]);
    assert_eq!(rig.array.stats.merged_writes.load(Ordering::Relaxed), 0);
    drop(cores);
    let got = rig.logical_from_drives();
    let mut a_then_b = vec![0u8; got.len()];
    a_then_b[..128 << 10].copy_from_slice(&pattern(1, 128 << 10));
    let mut b_then_a = a_then_b.clone();
    a_then_b[64 << 10..192 << 10].copy_from_slice(&pattern(2, 128 << 10));
    b_then_a[64 << 10..192 << 10].copy_from_slice(&pattern(2, 128 << 10));
    b_then_a[..128 << 10].copy_from_slice(&pattern(1, 128 << 10));
    assert!(
        got == a_then_b || got == b_then_a,
        "the overlap holds a mix of both writes"
    );
    check_parity(&rig, "raid6");
}

/// A member fails on a core while merged writes are in flight there: the core does not wait
/// (the failure is recorded from a thread once the unlogged writes in flight have completed,
/// see engine/unlogged.rs), every write completes, the failure is recorded once, and the pool
/// reads back every write, degraded.
#[test]
fn a_member_failing_on_a_core_amid_merged_writes() {
    let rig = file_rig(Level::Raid6, 6, None, 64 << 10, 16);
    let (cores, pool) = cores(1);
    let recorded = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r2 = recorded.clone();
    rig.array.set_failure_hook(Box::new(move |m, _| {
        assert_eq!(m, 2);
        r2.fetch_add(1, Ordering::SeqCst);
    }));
    let fs = rig.array.geometry().full_stripe_bytes();
    let half = (fs / 2) as usize;
    let w: Vec<(u64, u64)> = (0..rig.rows as u64 * 2)
        .map(|i| (i * half as u64, i + 1))
        .collect();
    let (a, p, ws) = (rig.array.clone(), pool.clone(), w.clone());
    cores
        .spawn_on(0, move || async move {
            let mut hs = Vec::new();
            for (i, (off, seed)) in ws.into_iter().enumerate() {
                if i == 11 {
                    let a = a.clone();
                    hs.push(tokio::task::spawn_local(async move {
                        assert!(a.fail_member(2, &std::io::Error::other("test")));
                    }));
                }
                let mut b = p.get(half).await.unwrap();
                b.copy_from_slice(&pattern(seed, half));
                let a = a.clone();
                hs.push(tokio::task::spawn_local(async move {
                    let (r, _) = a.write_async(off, b, false).await;
                    r.unwrap();
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
        })
        .wait()
        .unwrap();
    let t0 = std::time::Instant::now();
    while recorded.load(Ordering::SeqCst) == 0 && t0.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(
        recorded.load(Ordering::SeqCst),
        1,
        "the failure is recorded once"
    );
    drop(cores);
    let mut want = vec![0u8; w.len() * half];
    for (off, seed) in &w {
        want[*off as usize..*off as usize + half].copy_from_slice(&pattern(*seed, half));
    }
    let mut got = vec![0u8; want.len()];
    rig.array.read_at(0, &mut got).unwrap();
    assert!(got == want, "the degraded pool reads back differently");
    assert_eq!(pool.usage().in_use_bytes, 0, "every buffer came back");
}
