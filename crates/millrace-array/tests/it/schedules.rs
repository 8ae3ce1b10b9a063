//! Randomized schedules for every level against a model: I/O, flushes, drive failures (errors
//! from the drive, and the admin's), replacement and rebuild, scrubs, power cuts that drop or
//! tear any unflushed write at 4 KiB granularity, clean and unclean restarts, and a drive failing
//! right after a restart. After a power cut: every write completed before a completed flush reads back
//! exactly; every sector written since reads back its old content or one it was given since;
//! parity is consistent after the automatic resync.
//!
//! SCHEDULES (default 300) sets the number of schedules per level; SCHEDULE_FROM the first seed.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::drive::Drive;
use millrace_array::fault::FaultyDrive;
use millrace_array::superblock::MemberState;
use millrace_array::{CreateOptions, Level, Pool};
use rand::{Rng, SeedableRng};

const STRIP: u64 = 4096;
const ROWS: u64 = 8;
const DATA_OFFSET: u64 = 1 << 20;

fn h(b: &[u8]) -> u64 {
    let mut s = DefaultHasher::new();
    b.hash(&mut s);
    s.finish()
}

struct World {
    level: Level,
    group: Option<usize>,
    drives: Vec<(PathBuf, Arc<FaultyDrive>)>,
    spare_no: usize,
}

impl World {
    fn new(level: Level, n: usize, group: Option<usize>) -> (World, Pool) {
        let drives: Vec<(PathBuf, Arc<FaultyDrive>)> = (0..n)
            .map(|i| {
                (
                    PathBuf::from(format!("d{i}")),
                    Arc::new(FaultyDrive::new(
                        format!("d{i}"),
                        DATA_OFFSET + STRIP * ROWS,
                    )),
                )
            })
            .collect();
        let opts = CreateOptions {
            name: "t".into(),
            level,
            strip: STRIP,
            group,
            data_offset: Some(DATA_OFFSET),
            create_size: None,
            force: false,
        };
        let names: Vec<PathBuf> = drives.iter().map(|d| d.0.clone()).collect();
        let dyns: Vec<Arc<dyn Drive>> = drives
            .iter()
            .map(|d| d.1.clone() as Arc<dyn Drive>)
            .collect();
        let pool = Pool::create_on(&opts, &names, dyns, true).unwrap();
        (
            World {
                level,
                group,
                drives,
                spare_no: 0,
            },
            pool,
        )
    }

    fn restart(&self) -> Pool {
        self.try_restart().unwrap()
    }

    fn try_restart(&self) -> Result<Pool, String> {
        let ds: Vec<(PathBuf, Arc<dyn Drive>)> = self
            .drives
            .iter()
            .map(|(p, d)| (p.clone(), d.clone() as Arc<dyn Drive>))
            .collect();
        let (mut pools, notes) = Pool::import_drives(ds, false).map_err(|e| e.to_string())?;
        assert_eq!(pools.len(), 1, "{notes:?}");
        Ok(pools.remove(0))
    }
}

/// Members of the pool that could be lost now without losing data.
fn can_lose(pool: &Pool) -> Vec<usize> {
    let a = pool.array();
    let g = *a.geometry();
    (0..g.members)
        .filter(|&m| {
            a.member_state(m) == MemberState::Online && {
                let grp = m / g.group;
                let out = g
                    .group_members(grp)
                    .filter(|&i| a.member_state(i) != MemberState::Online)
                    .count();
                out < g.tolerance_per_group()
            }
        })
        .collect()
}

fn run_schedule(level: Level, n: usize, group: Option<usize>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut w, mut pool) = World::new(level, n, group);
    let size = pool.array().size_bytes() as usize;
    let mut model = vec![0u8; size];
    // Sector -> hashes of contents it may hold after a power cut (beyond the flushed one).
    let mut since_flush: HashMap<usize, Vec<u64>> = HashMap::new();
    let mut durable = model.clone();
    let ctx = |step: usize, what: &str| format!("{level} seed {seed} step {step}: {what}");
    let debug = std::env::var_os("SCHEDULE_DEBUG").is_some();
    for step in 0..40 {
        let pick = rng.random_range(0..100);
        if debug {
            eprintln!(
                "step {step}: {pick} states {:?}",
                pool.array().member_states()
            );
        }
        match pick {
            0..=39 => {
                let off = rng.random_range(0..size);
                let len = rng.random_range(1..=(size - off).min(3 * STRIP as usize * n));
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                pool.write_at(off as u64, &data)
                    .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                model[off..off + len].copy_from_slice(&data);
                for s in off / 4096..(off + len).div_ceil(4096) {
                    since_flush
                        .entry(s)
                        .or_default()
                        .push(h(&model[s * 4096..(s + 1) * 4096]));
                }
            }
            40..=51 => {
                pool.array().flush().unwrap();
                durable = model.clone();
                since_flush.clear();
            }
            52..=66 => {
                let off = rng.random_range(0..size);
                let len = rng.random_range(1..=(size - off).min(40_000));
                let mut buf = vec![0u8; len];
                pool.read_at(off as u64, &mut buf)
                    .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                assert!(
                    buf == model[off..off + len],
                    "{}",
                    ctx(step, "read differs from the model")
                );
            }
            67..=74 => {
                let lose = can_lose(&pool);
                if let Some(&m) = lose.get(rng.random_range(0..lose.len().max(1))) {
                    if rng.random_bool(0.5) {
                        // The drive dies; the next I/O finds out.
                        w.drives[m].1.die();
                        let mut buf = vec![0u8; size];
                        pool.read_at(0, &mut buf)
                            .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                        // A read may not touch the dead drive (mirrors): then a write will.
                        let probe = model[..size].to_vec();
                        pool.write_at(0, &probe).unwrap();
                        assert!(
                            buf == model,
                            "{}",
                            ctx(step, "read with a dying drive differs")
                        );
                    } else {
                        pool.array().fail_member(m, &std::io::Error::other("test"));
                    }
                }
            }
            75..=82 => {
                let out: Vec<usize> = (0..n)
                    .filter(|&m| pool.array().member_state(m) == MemberState::Faulty)
                    .collect();
                if let Some(&m) = out.first() {
                    w.spare_no += 1;
                    let name = PathBuf::from(format!("n{}", w.spare_no));
                    let d = Arc::new(FaultyDrive::new(
                        name.display().to_string(),
                        DATA_OFFSET + STRIP * ROWS,
                    ));
                    let old = w.drives[m].0.clone();
                    pool.replace_with(&old, &name, d.clone())
                        .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                    w.drives[m] = (name, d);
                    pool.rebuild(None, |_, _| {})
                        .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                    let rep = pool.scrub(false, |_, _| {}).unwrap();
                    if rep.skipped_degraded == 0 {
                        assert_eq!(rep.mismatches, 0, "{}", ctx(step, "scrub after rebuild"));
                    }
                }
            }
            83..=87 => {
                let rep = pool.scrub(false, |_, _| {}).unwrap();
                assert_eq!(
                    rep.mismatches,
                    0,
                    "{}",
                    ctx(step, &format!("scrub found {rep:?}"))
                );
            }
            88..=91 => {
                // A clean stop and start (faults cleared, as after a reboot, like a power cut):
                // nothing may change.
                pool.close()
                    .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                drop(pool);
                for (_, d) in &w.drives {
                    d.heal();
                }
                pool = w.restart();
                durable = model.clone();
                since_flush.clear();
            }
            _ => {
                // Power cut: drop the pool without closing, tear unflushed writes, restart.
                let healthy = pool
                    .array()
                    .member_states()
                    .iter()
                    .all(|s| *s == MemberState::Online);
                drop(pool);
                for (_, d) in &w.drives {
                    d.power_cut(|| rng.random_bool(0.5));
                }
                // Sometimes a drive dies with the power. A pool that was healthy at the crash must
                // then refuse to assemble (it cannot know the torn stripes' missing strips),
                // unless nothing was being written; it assembles once the drive is back.
                if healthy && level.is_parity() && rng.random_bool(0.3) {
                    let victim = rng.random_range(0..n);
                    w.drives[victim].1.die();
                    match w.try_restart() {
                        Err(e) => assert!(e.contains("not shut down cleanly"), "{}", ctx(step, &e)),
                        Ok(p) => drop(p),
                    }
                    w.drives[victim].1.heal();
                }
                pool = w.restart();
                // Right after the restart a drive may fail too.
                if rng.random_bool(0.3) && std::env::var_os("NOFAILAFTER").is_none() {
                    let lose = can_lose(&pool);
                    if let Some(&m) = lose.first() {
                        pool.array()
                            .fail_member(m, &std::io::Error::other("failed after restart"));
                    }
                }
                if debug {
                    eprintln!(
                        "after restart: {:?} dirty {:?}",
                        pool.array().member_states(),
                        pool.superblock().clean
                    );
                    for (p, d) in &w.drives {
                        let s = d.snapshot();
                        eprintln!(
                            "  {} sector0 data hash {}",
                            p.display(),
                            h(&s[DATA_OFFSET as usize..DATA_OFFSET as usize + 4096])
                        );
                    }
                    eprintln!(
                        "  durable {} cands {:?}",
                        h(&durable[..4096]),
                        since_flush.get(&0)
                    );
                }
                let mut now = vec![0u8; size];
                pool.read_at(0, &mut now)
                    .unwrap_or_else(|e| panic!("{}", ctx(step, &e.to_string())));
                for s in 0..size / 4096 {
                    let got = &now[s * 4096..(s + 1) * 4096];
                    let ok = got == &durable[s * 4096..(s + 1) * 4096]
                        || since_flush.get(&s).is_some_and(|c| c.contains(&h(got)));
                    assert!(ok, "{}", ctx(step, &format!("after a power cut sector {s} holds neither its old nor any new content")));
                }
                model = now;
                durable = model.clone();
                since_flush.clear();
                let rep = pool.scrub(false, |_, _| {}).unwrap();
                assert_eq!(
                    rep.mismatches,
                    0,
                    "{}",
                    ctx(step, "parity inconsistent after the automatic resync")
                );
            }
        }
    }
    pool.close().unwrap();
    let pool = w.restart();
    let mut all = vec![0u8; size];
    pool.read_at(0, &mut all).unwrap();
    assert!(
        all == model,
        "{level} seed {seed}: data differs after a clean restart"
    );
    let _ = w.group;
    let _ = w.level;
}

fn schedules() -> u64 {
    std::env::var("SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

macro_rules! level_test {
    ($name:ident, $level:expr, $n:expr, $group:expr) => {
        #[test]
        fn $name() {
            // SCHEDULE_FROM=N starts at seed N (to rerun one that failed).
            let from: u64 = std::env::var("SCHEDULE_FROM")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            for seed in from..from + schedules() {
                run_schedule($level, $n, $group, seed);
            }
        }
    };
}

level_test!(raid0_schedules, Level::Raid0, 3, None);
level_test!(raid1_schedules, Level::Raid1, 3, None);
level_test!(raid10_schedules, Level::Raid10, 4, None);
level_test!(raid5_schedules, Level::Raid5, 4, None);
level_test!(raid6_schedules, Level::Raid6, 6, None);
level_test!(raid50_schedules, Level::Raid50, 6, Some(3));
level_test!(raid60_schedules, Level::Raid60, 8, Some(4));

/// The drive being rebuilt onto fails part way: the rebuild stops with a sentence saying so,
/// the pool stays degraded and readable, and a second replacement finishes the job.
#[test]
fn a_failing_rebuild_target_is_handled() {
    let (w, pool) = World::new(Level::Raid6, 6, None);
    let size = pool.array().size_bytes() as usize;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    pool.write_at(0, &data).unwrap();
    pool.array().fail_member(2, &std::io::Error::other("test"));
    let bad = Arc::new(FaultyDrive::new("bad", DATA_OFFSET + STRIP * ROWS));
    // Writes past the first rows of its data area fail.
    bad.fail_writes(Some(DATA_OFFSET + 3 * STRIP..u64::MAX));
    pool.replace_with(&w.drives[2].0, &PathBuf::from("bad"), bad)
        .unwrap();
    let e = pool.rebuild(None, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("failed while being rebuilt"), "{e}");
    assert_eq!(pool.state(), "degraded");
    let mut got = vec![0u8; size];
    pool.read_at(0, &mut got).unwrap();
    assert!(got == data, "data differs after a failed rebuild");
    let good = Arc::new(FaultyDrive::new("good", DATA_OFFSET + STRIP * ROWS));
    pool.replace_with(&PathBuf::from("bad"), &PathBuf::from("good"), good)
        .unwrap();
    assert!(pool.rebuild(None, |_, _| {}).unwrap());
    assert_eq!(pool.state(), "online");
    assert_eq!(pool.scrub(false, |_, _| {}).unwrap().mismatches, 0);
    pool.read_at(0, &mut got).unwrap();
    assert!(got == data);
}

/// A journal record left by degraded writes never comes back over newer data: degraded writes,
/// a clean stop and start, a rebuild, healthy writes over the same rows, then a power cut. The
/// healthy writes must read back, not the journaled ones.
#[test]
fn an_old_journal_record_is_never_replayed_over_newer_data() {
    let (mut w, pool) = World::new(Level::Raid6, 6, None);
    let size = pool.array().size_bytes() as usize;
    pool.write_at(0, &vec![0xaa; size]).unwrap();
    pool.array().fail_member(2, &std::io::Error::other("test"));
    pool.write_at(0, &vec![0xbb; size]).unwrap();
    pool.close().unwrap();
    drop(pool);
    let pool = w.restart();
    assert_eq!(pool.state(), "degraded");
    let d = Arc::new(FaultyDrive::new("n1", DATA_OFFSET + STRIP * ROWS));
    pool.replace_with(&w.drives[2].0, &PathBuf::from("n1"), d.clone())
        .unwrap();
    w.drives[2] = (PathBuf::from("n1"), d);
    assert!(pool.rebuild(None, |_, _| {}).unwrap());
    let newest = vec![0xcc; size];
    pool.write_at(0, &newest).unwrap();
    pool.array().flush().unwrap();
    drop(pool);
    for (_, d) in &w.drives {
        d.power_cut(|| true);
    }
    let pool = w.restart();
    let mut got = vec![0u8; size];
    pool.read_at(0, &mut got).unwrap();
    assert!(
        got == newest,
        "a stale journal record was replayed over newer data"
    );
    assert_eq!(pool.scrub(false, |_, _| {}).unwrap().mismatches, 0);
}
