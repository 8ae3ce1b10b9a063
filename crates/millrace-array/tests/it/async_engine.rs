//! Property tests of the async engine (`BlockDevice::read_async`, `write_async`, `flush_async`)
//! on members through each core's io_uring (loop devices with direct I/O, as NVMe drives are
//! used, 512-byte and 4Kn; drive files on disk; drive files on tmpfs), against the same simple model the synchronous
//! engine is checked with: rounds of concurrent reads and writes spread over two cores (aligned
//! full stripes that take the completion path, partial and unaligned ones that take the blocking
//! path, several touching one stripe at once), flushes, and members failing between rounds.
//! Afterwards the pool reads back as the model, the drives hold md's layout, and (while no
//! member failed) every row's redundancy verifies with the independent reference.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{file_rig, loop_rig, memory_rig, pattern, start_cores, Rig};
use millrace_array::{Array, Level};
use millrace_block::BlockDevice;
use millrace_io::{BufPool, Cores};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Write {
        at: f64,
        len: usize,
        seed: u64,
        whole: bool,
        fua: bool,
    },
    Read {
        at: f64,
        len: usize,
    },
    Flush,
}

#[derive(Debug, Clone)]
struct Round {
    ops: Vec<Op>,
    /// Take this member out of service after the round (if the pool survives it).
    fail: Option<usize>,
}

fn op(max_len: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0.0..1.0f64, 1..max_len, any::<u64>(), any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(at, len, seed, whole, fua)| Op::Write { at, len, seed, whole, fua }),
        3 => (0.0..1.0f64, 1..max_len).prop_map(|(at, len)| Op::Read { at, len }),
        1 => Just(Op::Flush),
    ]
}

fn round(max_len: usize, n: usize) -> impl Strategy<Value = Round> {
    (
        prop::collection::vec(op(max_len), 1..8),
        prop::option::weighted(0.15, 0..n),
    )
        .prop_map(|(ops, fail)| Round { ops, fail })
}

/// Where an op lands: a byte range, whole rows when `whole`.
fn range(size: usize, fs: usize, at: f64, len: usize, whole: bool) -> (usize, usize) {
    if whole {
        let rows = size / fs;
        let r = ((at * rows as f64) as usize).min(rows - 1);
        let n = len.div_ceil(fs).min(rows - r).max(1);
        (r * fs, n * fs)
    } else {
        let off = ((at * size as f64) as usize).min(size - 1);
        (off, len.min(size - off))
    }
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// Runs one round's ops at once, alternating cores; returns each read's bytes.
/// The pool's first `size` bytes, read in one request on core 0 (None: the read failed).
fn read_whole(cores: &Cores, pool: &BufPool, array: &Arc<Array>, size: usize) -> Option<Vec<u8>> {
    let read = (Op::Read { at: 0.0, len: size }, (0, size));
    run_round(cores, pool, array, &[read]).pop().flatten()
}

fn run_round(
    cores: &Cores,
    pool: &BufPool,
    array: &Arc<Array>,
    ops: &[(Op, (usize, usize))],
) -> Vec<Option<Vec<u8>>> {
    let tasks: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(i, (op, (off, len)))| {
            let (a, p, op, off, len) = (array.clone(), pool.clone(), op.clone(), *off as u64, *len);
            cores.spawn_on(i, move || async move {
                match op {
                    Op::Write { seed, fua, .. } => {
                        let data = pattern(seed, len);
                        let mut b = p.get(len).await.unwrap();
                        b.copy_from_slice(&data);
                        let (r, _) = a.write_async(off, b, fua).await;
                        r.unwrap();
                        None
                    }
                    Op::Read { .. } => {
                        let (r, b) = a.read_async(off, p.get(len).await.unwrap()).await;
                        r.unwrap();
                        Some(b.to_vec())
                    }
                    Op::Flush => {
                        a.flush_async().await.unwrap();
                        None
                    }
                }
            })
        })
        .collect();
    tasks.into_iter().map(|t| t.wait().unwrap()).collect()
}

/// What the members are: files on this machine's disk, files in memory (/dev/shm: buffered,
/// tmpfs refuses O_DIRECT) or loop devices with direct I/O and logical blocks of the given
/// bytes (block devices, as NVMe drives are used). All take the same io_uring path.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Files {
    Disk,
    Memory,
    Loop(usize),
}

/// A rig of `files` members; None where this machine cannot make them (said by `cannot_run`).
fn rig_of(
    files: Files,
    level: Level,
    n: usize,
    group: Option<usize>,
    strip: usize,
    rows: usize,
) -> Option<Rig> {
    match files {
        Files::Disk => Some(file_rig(level, n, group, strip, rows)),
        Files::Memory => memory_rig(level, n, group, strip, rows),
        Files::Loop(sector) => loop_rig(level, n, group, strip, rows, sector),
    }
}

fn run(
    level: Level,
    n: usize,
    group: Option<usize>,
    rounds: &[Round],
    files: Files,
) -> Result<(), TestCaseError> {
    let Some(rig) = rig_of(files, level, n, group, 4096, 16) else {
        return Ok(());
    };
    let (pool, cores) = start_cores(2, 16 << 20);
    let size = rig.array.size_bytes() as usize;
    let fs = rig.array.geometry().full_stripe_bytes() as usize;
    let tolerance = rig.array.geometry().tolerance_per_group();
    let mut model = vec![0u8; size];
    let mut failed: Vec<usize> = Vec::new();
    for round in rounds {
        // Ops of one round run at once: writes never overlap anything else in the round, so the
        // model's answer does not depend on their order (disjoint writes still share stripes).
        let mut placed: Vec<(Op, (usize, usize))> = Vec::new();
        for op in &round.ops {
            let r = match *op {
                Op::Write { at, len, whole, .. } => range(size, fs, at, len, whole),
                Op::Read { at, len } => range(size, fs, at, len, false),
                Op::Flush => (0, 0),
            };
            let is_write = matches!(op, Op::Write { .. });
            let clash = placed
                .iter()
                .any(|(o, q)| (is_write || matches!(o, Op::Write { .. })) && overlaps(r, *q));
            if !clash {
                placed.push((op.clone(), r));
            }
        }
        let reads = run_round(&cores, &pool, &rig.array, &placed);
        for ((op, (off, len)), got) in placed.iter().zip(reads) {
            match op {
                Op::Write { seed, .. } => {
                    model[*off..off + len].copy_from_slice(&pattern(*seed, *len))
                }
                Op::Read { .. } => prop_assert!(
                    got.unwrap() == model[*off..off + len],
                    "read {}+{} differs from the model",
                    off,
                    len
                ),
                Op::Flush => {}
            }
        }
        if let Some(m) = round.fail {
            // Within what the pool survives: at most `tolerance` members, one per group here.
            let g = rig.array.geometry().group;
            let same_group = failed.iter().filter(|&&f| f / g == m / g).count();
            if same_group < tolerance && !failed.contains(&m) {
                rig.array.fail_member(m, &std::io::Error::other("test"));
                failed.push(m);
            }
        }
    }
    let whole = read_whole(&cores, &pool, &rig.array, size);
    prop_assert!(
        whole.as_deref() == Some(&model[..]),
        "whole-pool read differs from the model"
    );
    let entries: u64 = member_ops(&cores);
    if failed.is_empty() {
        prop_assert!(entries > 0, "member I/O went through the cores' rings");
        prop_assert!(
            rig.logical_from_drives() == model,
            "the drives' layout differs from md's left-symmetric layout"
        );
        if let Err(e) = rig.check_redundancy() {
            return Err(TestCaseError::fail(e));
        }
    }
    Ok(())
}

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(24),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn raid0(rounds in prop::collection::vec(round(30_000, 3), 1..12)) { run(Level::Raid0, 3, None, &rounds, Files::Disk)?; }
    #[test]
    fn raid10(rounds in prop::collection::vec(round(30_000, 4), 1..12)) { run(Level::Raid10, 4, None, &rounds, Files::Disk)?; }
    #[test]
    fn raid5(rounds in prop::collection::vec(round(40_000, 4), 1..12)) { run(Level::Raid5, 4, None, &rounds, Files::Disk)?; }
    #[test]
    fn raid6(rounds in prop::collection::vec(round(50_000, 6), 1..12)) { run(Level::Raid6, 6, None, &rounds, Files::Disk)?; }
    #[test]
    fn raid60(rounds in prop::collection::vec(round(60_000, 8), 1..12)) { run(Level::Raid60, 8, Some(4), &rounds, Files::Disk)?; }
    // Files in memory (tmpfs: buffered I/O on the same rings).
    #[test]
    fn raid10_in_memory(rounds in prop::collection::vec(round(30_000, 4), 1..12)) { run(Level::Raid10, 4, None, &rounds, Files::Memory)?; }
    #[test]
    fn raid6_in_memory(rounds in prop::collection::vec(round(50_000, 6), 1..12)) { run(Level::Raid6, 6, None, &rounds, Files::Memory)?; }
    // Block devices: loop devices with direct I/O, 512-byte sectors and 4Kn.
    #[test]
    fn raid0_on_loop_devices(rounds in prop::collection::vec(round(30_000, 3), 1..12)) { run(Level::Raid0, 3, None, &rounds, Files::Loop(512))?; }
    #[test]
    fn raid10_on_loop_devices(rounds in prop::collection::vec(round(30_000, 4), 1..12)) { run(Level::Raid10, 4, None, &rounds, Files::Loop(512))?; }
    #[test]
    fn raid5_on_loop_devices(rounds in prop::collection::vec(round(40_000, 4), 1..12)) { run(Level::Raid5, 4, None, &rounds, Files::Loop(512))?; }
    #[test]
    fn raid6_on_loop_devices(rounds in prop::collection::vec(round(50_000, 6), 1..12)) { run(Level::Raid6, 6, None, &rounds, Files::Loop(512))?; }
    #[test]
    fn raid6_on_4kn_loop_devices(rounds in prop::collection::vec(round(50_000, 6), 1..12)) { run(Level::Raid6, 6, None, &rounds, Files::Loop(4096))?; }
    #[test]
    fn raid10_on_4kn_loop_devices(rounds in prop::collection::vec(round(30_000, 4), 1..12)) { run(Level::Raid10, 4, None, &rounds, Files::Loop(4096))?; }
}

/// A drive file truncated behind the pool's back (a drive that lies about its size): the
/// member's reads come back short, the member is taken out of service, and parity serves its
/// data.
#[test]
fn a_member_file_truncated_behind_the_pool_fails_the_member() {
    let Some(rig) = memory_rig(Level::Raid5, 4, None, 4096, 16) else {
        return;
    };
    let (pool, cores) = start_cores(1, 8 << 20);
    let size = rig.array.size_bytes() as usize;
    let data = pattern(7, size);
    run_round(&cores, &pool, &rig.array, &[whole_write(7, size)]);
    shrink(&rig.files[1]);
    let got = read_whole(&cores, &pool, &rig.array, size);
    assert!(
        got.as_deref() == Some(&data[..]),
        "the pool reads back what was written"
    );
    assert!(
        rig.array.member_state(1) == millrace_array::superblock::MemberState::Faulty,
        "the truncated member is out of service"
    );
    drop(cores);
}

/// Concurrent partial writes that together fill every stripe: whatever order they land in,
/// parity ends right (checked with the independent reference, as a scrub would). On files on
/// disk and in memory, and on 4Kn loop devices.
#[test]
fn concurrent_partial_writes_filling_stripes_keep_parity_right() {
    let cases = [(Level::Raid5, 4), (Level::Raid6, 6)]
        .into_iter()
        .flat_map(|c| [(c, Files::Disk), (c, Files::Memory), (c, Files::Loop(4096))]);
    for ((level, n), files) in cases {
        let Some(rig) = rig_of(files, level, n, None, 4096, 16) else {
            continue;
        };
        let (pool, cores) = start_cores(2, 8 << 20);
        let size = rig.array.size_bytes() as usize;
        let ops: Vec<(Op, (usize, usize))> = (0..size / 4096)
            .map(|s| {
                let op = Op::Write {
                    at: 0.0,
                    len: 4096,
                    seed: s as u64,
                    whole: false,
                    fua: false,
                };
                (op, (s * 4096, 4096))
            })
            .collect();
        run_round(&cores, &pool, &rig.array, &ops);
        let entries: u64 = member_ops(&cores);
        // At least one member write per request: writes in flight to one stripe may be merged
        // into full-stripe writes (no reads), see tests/it/merge.rs.
        assert!(
            entries >= ops.len() as u64,
            "{level}: partial writes went through the rings ({entries} entries)"
        );
        let mut want = vec![0u8; size];
        for s in 0..size / 4096 {
            want[s * 4096..(s + 1) * 4096].copy_from_slice(&pattern(s as u64, 4096));
        }
        drop(cores);
        assert!(rig.logical_from_drives() == want, "{level}: data differs");
        rig.check_redundancy()
            .unwrap_or_else(|e| panic!("{level}: {e}"));
        let rep = rig.array.scrub_row(3, false).unwrap();
        assert_eq!(rep.mismatches, 0, "{level}: scrub finds a mismatch");
    }
}

/// A crash can leave a parity sector part old and part new (a drive without atomic writes of
/// that size, a power cut). What makes that safe: every row a write touches is marked in the
/// on-disk write-intent bitmap before it is written, and the next import resyncs the marked
/// rows. Here a parity sector of a row written through the cores is torn by hand: the
/// reference check finds the tear, the row is among those the bitmap marks, and resyncing the
/// marked rows repairs it.
#[test]
fn torn_parity_lies_in_a_marked_row_and_resync_repairs_it() {
    use std::os::unix::fs::FileExt;
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6)] {
        let Some(rig) = memory_rig(level, n, None, 4096, 16) else {
            return;
        };
        let (pool, cores) = start_cores(2, 8 << 20);
        let geo = *rig.array.geometry();
        let fs = geo.full_stripe_bytes() as usize;
        let write = |seed, at: (usize, usize)| {
            let op = Op::Write {
                at: 0.0,
                len: at.1,
                seed,
                whole: false,
                fua: false,
            };
            (op, at)
        };
        // Two whole rows in one request, and a part of a third (a read-modify-write).
        let ops = [write(1, (4 * fs, 2 * fs)), write(2, (9 * fs + 4096, 4096))];
        run_round(&cores, &pool, &rig.array, &ops);
        drop(cores);
        rig.check_redundancy()
            .unwrap_or_else(|e| panic!("{level}: {e}"));
        let dirty = rig.array.dirty_rows();
        for row in [5u64, 9] {
            let layout = geo.group_layout(row, 0);
            let p = layout[layout.len() - geo.level.parity()];
            let at = (rig.data_offset + row as usize * 4096 + 1024) as u64;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&rig.files[p])
                .unwrap();
            f.write_all_at(&[0xEE; 1024], at).unwrap();
            assert!(
                rig.check_redundancy().is_err(),
                "{level}: the torn parity of row {row} is found"
            );
            assert!(
                dirty.iter().any(|r| r.contains(&row)),
                "{level}: row {row}, written through the cores, is marked in the bitmap ({dirty:?})"
            );
            for r in &dirty {
                for row in r.clone() {
                    rig.array.resync_row(row).unwrap();
                }
            }
            rig.check_redundancy()
                .unwrap_or_else(|e| panic!("{level}: after the resync, {e}"));
        }
    }
}

/// Truncates a member file behind the pool's back to one page (a drive that lies about its
/// size).
fn shrink(file: &std::path::Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(4096)
        .unwrap();
}

/// A write of the pool's first `size` bytes, pattern `seed`, in one request.
fn whole_write(seed: u64, size: usize) -> (Op, (usize, usize)) {
    let op = Op::Write {
        at: 0.0,
        len: size,
        seed,
        whole: true,
        fua: false,
    };
    (op, (0, size))
}

/// Member operations the cores ran: entries on their rings.
fn member_ops(cores: &Cores) -> u64 {
    (0..2)
        .map(|i| cores.ring_stats(i).entries.load(Ordering::Relaxed))
        .sum()
}

/// Writes that each land in one strip, many at once on two cores, on levels without parity
/// over loop devices with direct I/O: each reaches its member (both copies on RAID10). The pool
/// reads back what was written, the drives hold md's layout, RAID10's copies agree, and the
/// members' counters saw every write.
#[test]
fn writes_within_one_strip_land_on_every_copy() {
    for (level, n) in [(Level::Raid0, 3), (Level::Raid10, 4)] {
        let Some(rig) = loop_rig(level, n, None, 16384, 8, 512) else {
            return;
        };
        let (pool, cores) = start_cores(2, 8 << 20);
        let size = rig.array.size_bytes() as usize;
        let mut model = vec![0u8; size];
        // 4 KiB-aligned pieces of every strip (the cores' path takes whole 4 KiB sectors), one
        // to three sectors long, none overlapping.
        let writes: Vec<(Op, (usize, usize))> = (0..size / 16384)
            .map(|i| {
                let skip = (i % 4) * 4096;
                let len = (4096 * (1 + i % 3)).min(16384 - skip);
                let op = Op::Write {
                    at: 0.0,
                    len,
                    seed: i as u64 + 11,
                    whole: false,
                    fua: i % 5 == 0,
                };
                (op, (i * 16384 + skip, len))
            })
            .collect();
        let counted = |a: &Array| -> u64 {
            a.member_stats
                .iter()
                .map(|m| m.write_ops.load(Ordering::Relaxed))
                .sum()
        };
        let before = counted(&rig.array);
        let st = &rig.array.stats;
        run_round(&cores, &pool, &rig.array, &writes);
        assert_eq!(
            st.write_ops.load(Ordering::Relaxed),
            writes.len() as u64,
            "{level:?}: every write counted once"
        );
        for (op, (off, len)) in &writes {
            if let Op::Write { seed, .. } = op {
                model[*off..off + len].copy_from_slice(&pattern(*seed, *len));
            }
        }
        let whole = read_whole(&cores, &pool, &rig.array, size);
        assert!(
            whole.as_deref() == Some(&model[..]),
            "{level:?}: the pool reads back what was written"
        );
        assert!(
            rig.logical_from_drives() == model,
            "{level:?}: the drives hold md's layout"
        );
        rig.check_redundancy().unwrap();
        let copies = if level == Level::Raid10 { 2 } else { 1 };
        assert_eq!(
            counted(&rig.array) - before,
            (writes.len() * copies) as u64,
            "{level:?}: member writes counted"
        );
    }
}
