//! Property tests of the async engine (`BlockDevice::read_async`, `write_async`, `flush_async`)
//! on drive files through each core's io_uring, against the same simple model the synchronous
//! engine is checked with: rounds of concurrent reads and writes spread over two cores (aligned
//! full stripes that take the completion path, partial and unaligned ones that take the inline
//! path, several touching one stripe at once), flushes, and members failing between rounds.
//! Afterwards the pool reads back as the model, the drives hold md's layout, and (while no
//! member failed) every row's redundancy verifies with the independent reference.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{file_rig, memory_rig, pattern, start_cores};
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
        /// Offered first to `write_now` from the test's own bytes (not FUA); `write_async` when
        /// the pool declines it.
        now: bool,
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
        5 => (0.0..1.0f64, 1..max_len, any::<u64>(), any::<bool>(), prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(at, len, seed, whole, fua, now)| Op::Write { at, len, seed, whole, fua, now }),
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

/// `r` widened to whole 4 KiB sectors, within the pool's `size` bytes.
fn in_sectors(r: (usize, usize), size: usize) -> (usize, usize) {
    let off = r.0 / 4096 * 4096;
    (
        off,
        ((r.0 + r.1 - off).div_ceil(4096) * 4096).min(size - off),
    )
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
                    Op::Write { seed, fua, now, .. } => {
                        let data = pattern(seed, len);
                        if now && !fua {
                            if let Some(r) = a.write_now(off, &data) {
                                r.unwrap();
                                return None;
                            }
                        }
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

/// Where the drive files live: on this machine's disk (member I/O through io_uring) or in
/// memory (/dev/shm: inline copies through the files' mappings).
#[derive(Clone, Copy, PartialEq)]
enum Files {
    Disk,
    Memory,
}

fn run(
    level: Level,
    n: usize,
    group: Option<usize>,
    rounds: &[Round],
    files: Files,
) -> Result<(), TestCaseError> {
    let rig = match files {
        Files::Disk => file_rig(level, n, group, 4096, 16),
        Files::Memory => match memory_rig(level, n, group, 4096, 16) {
            Some(r) => r,
            None => return Ok(()),
        },
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
                Op::Write {
                    at,
                    len,
                    whole,
                    now: false,
                    ..
                } => range(size, fs, at, len, whole),
                // In whole sectors, which a pool may write now (the cores' path's rule).
                Op::Write { at, len, whole, .. } => {
                    in_sectors(range(size, fs, at, len, whole), size)
                }
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
    let mapped: u64 = (0..2)
        .map(|i| cores.ring_stats(i).mapped.load(Ordering::Relaxed))
        .sum();
    if files == Files::Memory && failed.is_empty() {
        // The whole-pool read of a healthy pool takes the cores' path (degraded reads and
        // partial writes copy through the same mappings on the engine's own path, not counted).
        prop_assert!(
            mapped > 0,
            "member I/O on files in memory went through their mappings"
        );
    }
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
    // RAID0 and RAID10 on files in memory: writes within one strip are copied in without a
    // batch (`write_in_one_strip`), the rest in one.
    #[test]
    fn raid0_in_memory(rounds in prop::collection::vec(round(30_000, 3), 1..12)) { run(Level::Raid0, 3, None, &rounds, Files::Memory)?; }
    #[test]
    fn raid10_in_memory(rounds in prop::collection::vec(round(30_000, 4), 1..12)) { run(Level::Raid10, 4, None, &rounds, Files::Memory)?; }
    #[test]
    fn raid5_in_memory(rounds in prop::collection::vec(round(40_000, 4), 1..12)) { run(Level::Raid5, 4, None, &rounds, Files::Memory)?; }
    #[test]
    fn raid6_in_memory(rounds in prop::collection::vec(round(50_000, 6), 1..12)) { run(Level::Raid6, 6, None, &rounds, Files::Memory)?; }
}

/// A drive file in memory truncated behind the pool's back (a drive that lies about its size):
/// the copy through its mapping faults, which must not kill the process; the member's reads
/// then fail as pread's would, the member is taken out of service, and parity serves its data.
#[test]
fn a_member_file_truncated_under_its_mapping_fails_the_member_not_the_process() {
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

/// A drive file in memory truncated behind the pool's back under bytes the pool lent for a
/// send: the kernel's copy of them fails with EFAULT (no fault is raised in the process, so
/// nothing else finds out), and `lent_send_failed`, which the exports call on a failed send,
/// breaks that member's mapping. The pool then lends nothing more from it, which it would go on
/// doing otherwise, each such read ending its connection again; the next read of the range goes
/// by pread, takes the member out of service and is served by parity.
#[test]
fn a_send_that_faults_on_a_truncated_member_stops_its_lending() {
    let Some(rig) = memory_rig(Level::Raid5, 4, None, 4096, 16) else {
        return;
    };
    let (pool, cores) = start_cores(1, 8 << 20);
    let size = rig.array.size_bytes() as usize;
    let data = pattern(5, size);
    run_round(&cores, &pool, &rig.array, &[whole_write(5, size)]);
    let strips = size / 4096;
    let a = rig.array.clone();
    let lend_all = move |a: Arc<Array>| async move {
        let lent: Vec<_> = (0..strips as u64).map(|s| a.lend(s * 4096, 4096)).collect();
        (lent, a)
    };
    let (lent, a) = cores.spawn_on(0, move || lend_all(a)).wait().unwrap();
    assert!(
        lent.iter().all(Option::is_some),
        "a healthy pool lends every strip"
    );
    shrink(&rig.files[1]);
    let mut pipe = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let mut faulted = Vec::new();
    for (s, l) in lent.iter().enumerate() {
        let b = &l.as_ref().unwrap()[0];
        // SAFETY: lent bytes stay mapped while the buffer lives; the kernel checks the pages.
        let r = unsafe { libc::write(pipe[1], b.raw_ptr().cast(), b.len()) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
            assert_eq!(millrace_io::lent_send_failed(&e, [b]), 1);
            faulted.push(s);
        } else {
            // Drained, so the pipe never fills.
            let mut sink = vec![0u8; b.len()];
            // SAFETY: reads into a buffer of that length.
            unsafe { libc::read(pipe[0], sink.as_mut_ptr().cast(), sink.len()) };
            assert_eq!(sink, data[s * 4096..(s + 1) * 4096], "strip {s}");
        }
    }
    // SAFETY: both descriptors are ours.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    // Four members, one of each row's strips on the truncated one (parity or data).
    assert!(
        faulted.len() >= strips / 4,
        "sends from the truncated member fault ({faulted:?})"
    );
    assert!(lent
        .iter()
        .enumerate()
        .all(|(s, l)| { l.as_ref().unwrap()[0].lent_intact() != faulted.contains(&s) }));
    drop(lent);
    let b = a.clone();
    let again = cores
        .spawn_on(0, move || async move {
            let lent: Vec<_> = faulted
                .iter()
                .map(|&s| b.lend(s as u64 * 4096, 4096))
                .collect();
            lent.iter().all(Option::is_none)
        })
        .wait()
        .unwrap();
    assert!(again, "nothing more is lent from the truncated member");
    let got = read_whole(&cores, &pool, &a, size);
    assert!(got.as_deref() == Some(&data[..]), "the pool reads back");
    assert!(
        a.member_state(1) == millrace_array::superblock::MemberState::Faulty,
        "the truncated member is out of service"
    );
    drop(cores);
}

/// Whole-row writes on drive files in memory compute their parity straight into the parity
/// members' pages (`millrace_io::place_repaired`), counted with the repaired writes. A parity
/// member truncated behind the pool's back faults under that computation: the process lives,
/// and the member, whose file lost data, is taken out of service instead of being grown back
/// by pwrite (which left holes that read as zeroes where no write reached again); the pool
/// reads back the second write from the others.
#[test]
fn parity_computed_in_a_truncated_members_pages_fails_the_member() {
    let Some(rig) = memory_rig(Level::Raid6, 4, None, 4096, 16) else {
        return;
    };
    let (pool, cores) = start_cores(2, 8 << 20);
    let size = rig.array.size_bytes() as usize;
    run_round(&cores, &pool, &rig.array, &[whole_write(7, size)]);
    let placed = repaired(&cores);
    // 16 rows, two parities each.
    assert!(placed >= 32, "parity went into the mappings ({placed})");
    rig.check_redundancy().unwrap();
    shrink(&rig.files[1]);
    run_round(&cores, &pool, &rig.array, &[whole_write(8, size)]);
    assert!(
        rig.array.member_state(1) == millrace_array::superblock::MemberState::Faulty,
        "the truncated member is out of service"
    );
    assert_eq!(
        std::fs::metadata(&rig.files[1]).unwrap().len(),
        4096,
        "the truncated file was not grown back"
    );
    let got = read_whole(&cores, &pool, &rig.array, size);
    assert!(got.as_deref() == Some(&pattern(8, size)[..]));
    drop(cores);
}

/// A member file in memory truncated behind the pool's back, then a write to the rows it lost:
/// the write's copy into the mapping faults, and the member must fail then. Before, the write
/// went on by pwrite, which grew the file back with holes in place of what it lost; the member
/// stayed in service and a read of the pool returned those holes' zeroes as data, silently
/// (11 of 48 strips here).
#[test]
fn a_write_after_a_member_file_shrank_fails_the_member_instead_of_growing_it_back() {
    let Some(rig) = memory_rig(Level::Raid5, 4, None, 4096, 16) else {
        return;
    };
    let (pool, cores) = start_cores(1, 8 << 20);
    let size = rig.array.size_bytes() as usize;
    let mut data = pattern(7, size);
    run_round(&cores, &pool, &rig.array, &[whole_write(7, size)]);
    shrink(&rig.files[1]);
    // The last row's three data strips: every member, the truncated one included, is written.
    let row = 3 * 4096;
    let last = Op::Write {
        at: 0.0,
        len: row,
        seed: 9,
        whole: false,
        fua: false,
        now: false,
    };
    run_round(&cores, &pool, &rig.array, &[(last, (size - row, row))]);
    data[size - row..].copy_from_slice(&pattern(9, row));
    assert!(
        rig.array.member_state(1) == millrace_array::superblock::MemberState::Faulty,
        "the truncated member is out of service"
    );
    assert_eq!(std::fs::metadata(&rig.files[1]).unwrap().len(), 4096);
    let got = read_whole(&cores, &pool, &rig.array, size);
    let got = got.expect("the read is done");
    let bad = (0..size / 4096)
        .filter(|&s| got[s * 4096..(s + 1) * 4096] != data[s * 4096..(s + 1) * 4096])
        .count();
    assert_eq!(bad, 0, "strips that read back wrong");
    drop(cores);
}

/// `BlockDevice::lend` on a healthy pool in memory: a range is lent piece by piece, one per
/// member strip it covers, and the pieces hold the pool's bytes in order; a range of part of a
/// sector, or any range once a member is out of service, is not (the read path serves those).
/// A lent piece keeps its member's mapping: the bytes stay readable after the member leaves.
#[test]
fn healthy_ranges_are_lent_piece_by_piece_with_the_pools_bytes() {
    for (level, n) in [(Level::Raid0, 3), (Level::Raid5, 4)] {
        let Some(rig) = memory_rig(level, n, None, 4096, 16) else {
            return;
        };
        let (pool, cores) = start_cores(1, 8 << 20);
        let size = rig.array.size_bytes() as usize;
        let data = pattern(11, size);
        run_round(&cores, &pool, &rig.array, &[whole_write(11, size)]);
        let a = rig.array.clone();
        let lent = cores
            .spawn_on(0, move || async move {
                let one = a.lend(3 * 4096, 4096);
                let two = a.lend(4096, 8192);
                let odd = a.lend(3 * 4096 + 512, 512);
                (one, two, odd.is_none(), a)
            })
            .wait()
            .unwrap();
        let (one, two, refused, a) = lent;
        let one = one.expect("a healthy range on one member is lent");
        assert_eq!(one.len(), 1);
        assert_eq!(&one[0][..], &data[3 * 4096..4 * 4096]);
        let two = two.expect("a healthy range over two members is lent");
        let lens: Vec<usize> = two.iter().map(|b| b.len()).collect();
        assert_eq!(lens, [4096, 4096], "one piece per strip");
        assert!(two.iter().all(|b| b.is_lent()));
        let joined: Vec<u8> = two.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(joined, &data[4096..3 * 4096]);
        assert!(refused, "part of a sector: not lent");
        assert!(
            a.lend(0, 4096).is_none(),
            "off the cores there is no ring: not lent"
        );
        if level == Level::Raid0 {
            continue;
        }
        a.fail_member(1, &std::io::Error::other("test"));
        let b = a.clone();
        let after = cores
            .spawn_on(0, move || async move {
                (0..16).all(|s| b.lend(s * 4096, 4096).is_none())
            })
            .wait()
            .unwrap();
        assert!(after, "a pool with a member out of service lends nothing");
        let got = read_whole(&cores, &pool, &a, size);
        assert!(got.as_deref() == Some(&data[..]), "it still reads back");
        assert_eq!(&one[0][..], &data[3 * 4096..4 * 4096], "still mapped");
        drop(cores);
    }
}

/// Concurrent partial writes that together fill every stripe: whatever order they land in,
/// parity ends right (checked with the independent reference, as a scrub would). On disk, and
/// in memory, where parity is copied into the files' mappings.
#[test]
fn concurrent_partial_writes_filling_stripes_keep_parity_right() {
    let cases = [(Level::Raid5, 4), (Level::Raid6, 6)]
        .into_iter()
        .flat_map(|c| [(c, Files::Disk), (c, Files::Memory)]);
    for ((level, n), files) in cases {
        let rig = match files {
            Files::Disk => file_rig(level, n, None, 4096, 16),
            Files::Memory => match memory_rig(level, n, None, 4096, 16) {
                Some(r) => r,
                None => continue,
            },
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
                    now: false,
                };
                (op, (s * 4096, 4096))
            })
            .collect();
        run_round(&cores, &pool, &rig.array, &ops);
        let entries: u64 = member_ops(&cores);
        // At least one member write per request: writes in flight to one stripe may be merged
        // into full-stripe writes (no reads), see tests/merge.rs.
        assert!(
            entries >= ops.len() as u64,
            "{level}: partial writes went through the rings ({entries} entries)"
        );
        let repaired = repaired(&cores);
        if files == Files::Memory {
            assert!(repaired > 0, "{level}: parity was copied into the mappings");
        } else {
            assert_eq!(
                repaired, 0,
                "{level}: a pool without a write-intent bitmap writes its parity by pwrite"
            );
        }
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

/// Parity on drive files in memory is copied into their mappings, a copy that a killed process
/// can leave half done inside a sector. What makes that safe: every row such a write touches is
/// marked in the on-disk write-intent bitmap before the copy, and the next import resyncs the
/// marked rows. Here a parity sector of a row written through the cores is torn by hand, as a
/// kill in the middle of the copy would leave it: the reference check finds the tear, the row
/// is among those the bitmap marks, and resyncing the marked rows repairs it.
#[test]
fn parity_torn_in_a_mapping_lies_in_a_marked_row_and_resync_repairs_it() {
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
                now: false,
            };
            (op, at)
        };
        // Two whole rows in one request, and a part of a third (a read-modify-write).
        let ops = [write(1, (4 * fs, 2 * fs)), write(2, (9 * fs + 4096, 4096))];
        run_round(&cores, &pool, &rig.array, &ops);
        let repaired = repaired(&cores);
        assert!(repaired > 0, "{level}: parity was copied into the mappings");
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
        now: false,
    };
    (op, (0, size))
}

/// Parity writes the cores copied into member files' mappings (`Batch::write_repaired`).
fn repaired(cores: &Cores) -> u64 {
    (0..2)
        .map(|i| cores.ring_stats(i).repaired.load(Ordering::Relaxed))
        .sum()
}

/// Member operations the cores ran: entries on their rings, plus those on drive files in memory
/// (a tmpfs TMPDIR) that a core runs inline instead.
fn member_ops(cores: &Cores) -> u64 {
    (0..2)
        .map(|i| {
            let st = cores.ring_stats(i);
            st.entries.load(Ordering::Relaxed) + st.inline.load(Ordering::Relaxed)
        })
        .sum()
}

/// Writes that each land in one strip, many at once on two cores, on levels without parity
/// over files in memory: each is copied into its member (both copies on RAID10) without a
/// batch, half of them offered first from the caller's own bytes (`write_now`). The pool reads back what was written, the drives hold md's layout, RAID10's copies
/// agree, and the members' counters saw every write.
#[test]
fn writes_within_one_strip_land_on_every_copy() {
    for (level, n) in [(Level::Raid0, 3), (Level::Raid10, 4)] {
        let Some(rig) = memory_rig(level, n, None, 16384, 8) else {
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
                    now: i % 2 == 1,
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
        // Offered ones whose rows no other write held were done from the test's own bytes.
        let offered = (1..writes.len()).step_by(2).filter(|i| i % 5 != 0).count() as u64;
        let borrowed = st.borrowed_writes.load(Ordering::Relaxed);
        assert!(
            borrowed > 0 && borrowed <= offered,
            "{level:?}: {borrowed} of {offered} offered writes done from the caller's bytes"
        );
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
