//! Randomized crash schedules for degraded parity pools: the process is killed at a random
//! member write (every later write and flush silently does nothing, see `fault::kill_budget`)
//! while the pool takes writes with one or two members out (RAID5, RAID6, RAID60), or while a
//! replacement is being rebuilt while clients write beside it; then power is cut (each unflushed 4 KiB
//! sector independently kept or lost) and the pool imported again, which recovers from the
//! partial-parity log. Afterwards:
//! - every write acknowledged before a flush that completed reads back exactly; every sector
//!   written since holds its old content or one it was given since (never anything else, also
//!   where it is rebuilt from parity because its member is out);
//! - parity verifies: the lost members are replaced and rebuilt, a scrub finds no mismatch,
//!   and the data still reads the same.
//!
//! CRASH_SCHEDULES (default 120 per test) sets the schedules per test, CRASH_FROM the first
//! seed; `CRASH_SCHEDULES=3000 cargo test -p millrace-array --release --test it crash_kill::`
//! is the long run (18,000 schedules; README, "Failures and crashes").

use std::collections::HashMap;

use crate::crash_model::Model;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use millrace_array::drive::Drive;
use millrace_array::fault::{kill_budget, FaultyDrive};
use millrace_array::superblock::MemberState;
use millrace_array::{CreateOptions, Level, Pool};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STRIP: u64 = 4096;
const ROWS: u64 = 24;
const DATA_OFFSET: u64 = 1 << 20;
const SIZE: u64 = DATA_OFFSET + STRIP * ROWS;

struct World {
    drives: Vec<(PathBuf, Arc<FaultyDrive>)>,
    budget: Arc<AtomicI64>,
    fresh: usize,
}

impl World {
    fn drive(&mut self, name: String) -> (PathBuf, Arc<FaultyDrive>) {
        let d = Arc::new(FaultyDrive::new(name.clone(), SIZE));
        d.share_kill(self.budget.clone());
        (PathBuf::from(name), d)
    }

    fn create(level: Level, n: usize) -> (World, Pool) {
        let mut w = World {
            drives: Vec::new(),
            budget: kill_budget(),
            fresh: 0,
        };
        w.drives = (0..n).map(|i| w.drive(format!("d{i}"))).collect();
        let opts = CreateOptions {
            name: "k".into(),
            level,
            strip: STRIP,
            // The striped levels: groups of half the members.
            group: matches!(level, Level::Raid50 | Level::Raid60).then_some(n / 2),
            data_offset: Some(DATA_OFFSET),
            create_size: None,
            force: false,
        };
        let names: Vec<PathBuf> = w.drives.iter().map(|d| d.0.clone()).collect();
        let dyns: Vec<Arc<dyn Drive>> = w.drives.iter().map(|d| d.1.clone() as _).collect();
        let pool = Pool::create_on(&opts, &names, dyns, true).unwrap();
        (w, pool)
    }

    fn import(&self) -> Pool {
        let ds: Vec<(PathBuf, Arc<dyn Drive>)> = self
            .drives
            .iter()
            .map(|(p, d)| (p.clone(), d.clone() as _))
            .collect();
        let (mut pools, notes) = Pool::import_drives(ds, false).unwrap();
        assert_eq!(pools.len(), 1, "{notes:?}");
        pools.remove(0)
    }

    /// Replaces every member out of service with a fresh drive; returns their slots.
    fn replace_lost(&mut self, pool: &Pool) -> Vec<usize> {
        let out: Vec<usize> = (0..self.drives.len())
            .filter(|&m| pool.array().member_state(m) == MemberState::Faulty)
            .collect();
        for &m in &out {
            self.fresh += 1;
            let (name, d) = self.drive(format!("n{}", self.fresh));
            pool.replace_with(&self.drives[m].0, &name, d.clone())
                .unwrap();
            self.drives[m] = (name, d);
        }
        out
    }
}

/// A random client write: partial strips, whole rows, or spans across rows.
fn client_write(rng: &mut StdRng, pool: &Pool, m: &mut Model, killed: impl Fn() -> bool) {
    let size = m.now.len();
    let fs = pool.array().geometry().full_stripe_bytes() as usize;
    let (off, len) = match rng.random_range(0..3) {
        0 => {
            let s = rng.random_range(0..size / 4096);
            (
                s * 4096,
                4096 * rng.random_range(1..=3usize).min(size / 4096 - s),
            )
        }
        1 => {
            let r = rng.random_range(0..size / fs);
            (r * fs, fs * rng.random_range(1..=2usize).min(size / fs - r))
        }
        _ => {
            let off = rng.random_range(0..size - 1);
            (off, rng.random_range(1..=(size - off).min(3 * fs)))
        }
    };
    let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    if std::env::var_os("CRASH_DEBUG").is_some() {
        eprintln!("write {off}+{len} killed before: {}", killed());
    }
    let r = pool.write_at(off as u64, &data);
    // A write cut by the kill is not acknowledged, but it may have reached the drives.
    assert!(r.is_ok() || killed(), "write failed: {r:?}");
    m.wrote(off, &data);
}

/// Runs client I/O (and with `rebuild`, a rebuild with writes between its batches) until the
/// kill budget is spent, then cuts the power and imports the pool again.
fn run(level: Level, n: usize, lose: usize, rebuild: bool, seed: u64) {
    let ctx = format!("{level} lose {lose} rebuild {rebuild} seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut w, pool) = World::create(level, n);
    let size = pool.array().size_bytes() as usize;
    let init: Vec<u8> = (0..size).map(|_| rng.random()).collect();
    pool.write_at(0, &init).unwrap();
    pool.array().flush().unwrap();
    let mut m = Model {
        now: init.clone(),
        durable: init,
        since: HashMap::new(),
    };
    let mut out: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        out.swap(i, rng.random_range(0..=i));
    }
    for &v in &out[..lose] {
        pool.array().fail_member(v, &std::io::Error::other("test"));
    }
    let budget = w.budget.clone();
    let killed = move || budget.load(Ordering::Acquire) <= 0;
    // A few writes before the kill may start, then the kill somewhere in the next few dozen
    // member writes.
    for _ in 0..rng.random_range(0..3) {
        client_write(&mut rng, &pool, &mut m, &killed);
    }
    if rebuild {
        w.replace_lost(&pool);
        pool.array().set_rebuild_batch_rows(rng.random_range(1..6));
    }
    w.budget.store(rng.random_range(0..120), Ordering::Release);
    if rebuild {
        // Clients write (and flush) on a thread of their own while the rebuild runs.
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let (done, m, pool, killed) = (&done, &mut m, &pool, &killed);
            s.spawn(move || {
                let mut r2 = StdRng::seed_from_u64(seed ^ 0x5eed);
                while !done.load(Ordering::Acquire) && !killed() {
                    if r2.random_bool(0.2) {
                        if pool.array().flush().is_ok() && !killed() {
                            m.flushed();
                        }
                    } else {
                        client_write(&mut r2, pool, m, killed);
                    }
                }
            });
            let _ = pool.rebuild(None, |_, _| {});
            done.store(true, Ordering::Release);
        });
    }
    while !killed() {
        if rng.random_bool(0.15) {
            if pool.array().flush().is_ok() && !killed() {
                m.flushed();
            }
        } else {
            client_write(&mut rng, &pool, &mut m, &killed);
        }
    }
    if std::env::var_os("CRASH_DEBUG").is_some() {
        eprintln!(
            "lost {:?} states {:?}",
            &out[..lose],
            pool.array().member_states()
        );
    }
    drop(pool);
    w.budget.store(i64::MAX, Ordering::Release);
    for (_, d) in &w.drives {
        d.power_cut(|| rng.random_bool(0.5));
    }
    let pool = w.import();
    let mut got = vec![0u8; size];
    pool.read_at(0, &mut got).unwrap();
    m.check(&got, &ctx);
    // Parity verifies: whatever is out is rebuilt from it, and a scrub finds nothing wrong.
    w.replace_lost(&pool);
    pool.rebuild(None, |_, _| {}).unwrap();
    assert_eq!(pool.state(), "online", "{ctx}");
    let rep = pool.scrub(false, |_, _| {}).unwrap();
    assert_eq!(rep.mismatches, 0, "{ctx}: {rep:?}");
    let mut again = vec![0u8; size];
    pool.read_at(0, &mut again).unwrap();
    assert!(again == got, "{ctx}: data changed through the rebuild");
}

fn schedules() -> u64 {
    std::env::var("CRASH_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120)
}

fn each(f: impl Fn(u64)) {
    let from: u64 = std::env::var("CRASH_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for seed in from..from + schedules() {
        f(seed);
    }
}

#[test]
fn raid5_killed_during_degraded_writes() {
    each(|s| run(Level::Raid5, 5, 1, false, s));
}

#[test]
fn raid6_killed_during_writes_one_out() {
    each(|s| run(Level::Raid6, 6, 1, false, s));
}

#[test]
fn raid6_killed_during_writes_two_out() {
    each(|s| run(Level::Raid6, 6, 2, false, s));
}

#[test]
fn raid60_killed_during_writes_two_out() {
    each(|s| run(Level::Raid60, 8, 2, false, s));
}

#[test]
fn raid5_killed_during_rebuild() {
    each(|s| run(Level::Raid5, 5, 1, true, s));
}

#[test]
fn raid6_killed_during_rebuild() {
    each(|s| run(Level::Raid6, 6, 2, true, s));
}
