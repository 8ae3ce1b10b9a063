//! Randomized crash schedules through io_uring (issue #21): the same promise as `crash_kill`,
//! but the members are drive files behind descriptors (`common/crash_file.rs`) and the client
//! writes from a core of `millrace_io::Cores`, many in flight at once, so the engine takes the
//! paths production takes: partial-row writes merged in flight and planned on the core's ring
//! while the pool is whole, whole-row writes straight from the request's buffer, and the
//! blocking engine's batches (the partial-parity log, rebuild) on io_uring.
//!
//! Each schedule starts with the pool whole and merged writes in flight; then either members
//! fail amid them (on the core, as a drive error would take them out) and writes go on degraded
//! through the log, or failed members are replaced and rebuilt on a thread while the core
//! writes beside it (merging again once the rebuild is done). The process is killed at a random
//! member flush or client request (every write submitted after it is lost), then power is cut
//! (each 4 KiB sector written since the last flush kept or lost) and the pool imported again.
//! Afterwards:
//! - every write acknowledged before a flush that completed reads back exactly; every sector
//!   written since holds its old content or one it was given since;
//! - parity verifies: lost members are replaced and rebuilt, a scrub finds no mismatch, and the
//!   data reads the same.
//!
//! Client writes carry no FUA (a write made durable by RWF_DSYNC on the ring passes no flush
//! the drive could record). Thread and ring timing varies, so a seed names a schedule's choices,
//! not its exact interleaving. CRASH_SCHEDULES (default 50 per test) and CRASH_FROM as in
//! `crash_kill`: `CRASH_SCHEDULES=1000 cargo test -p millrace-array --release --test it
//! crash_ring::` is the long run (4,000 schedules).

use std::collections::HashMap;

use crate::crash_model::Model;
use std::path::PathBuf;
use std::sync::Arc;

use crate::crash_file::{CrashFile, Power};
use millrace_array::drive::Drive;
use millrace_array::superblock::MemberState;
use millrace_array::{Array, CreateOptions, Level, Pool};
use millrace_block::BlockDevice;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STRIP: u64 = 4096;
const ROWS: u64 = 24;
const DATA_OFFSET: u64 = 1 << 20;
const SIZE: u64 = DATA_OFFSET + STRIP * ROWS;

/// The drive files of one schedule.
struct World {
    dir: tempfile::TempDir,
    power: Arc<Power>,
    drives: Vec<(PathBuf, Arc<CrashFile>)>,
    fresh: usize,
}

impl World {
    fn drive(&mut self) -> (PathBuf, Arc<CrashFile>) {
        self.fresh += 1;
        let p = self.dir.path().join(format!("d{}", self.fresh));
        let d = CrashFile::create(&p, SIZE, &self.power);
        (p, d)
    }

    fn create(level: Level, n: usize) -> (World, Pool) {
        let mut w = World {
            dir: tempfile::tempdir().unwrap(),
            power: Power::new(),
            drives: Vec::new(),
            fresh: 0,
        };
        w.drives = (0..n).map(|_| w.drive()).collect();
        let opts = CreateOptions {
            name: "r".into(),
            level,
            strip: STRIP,
            group: None,
            data_offset: Some(DATA_OFFSET),
            create_size: None,
            force: false,
        };
        let names: Vec<PathBuf> = w.drives.iter().map(|d| d.0.clone()).collect();
        let dyns: Vec<Arc<dyn Drive>> = w.drives.iter().map(|d| d.1.clone() as _).collect();
        let pool = Pool::create_on(&opts, &names, dyns, true).unwrap();
        (w, pool)
    }

    /// After the kill: cuts the power, then opens the files again as a restarted process would.
    fn restart(&mut self, rng: &mut StdRng) -> Pool {
        for (_, d) in &self.drives {
            d.power_cut(|| rng.random_bool(0.5));
        }
        self.power = Power::new();
        let power = self.power.clone();
        for (p, d) in self.drives.iter_mut() {
            *d = CrashFile::open(p, &power);
        }
        let ds: Vec<(PathBuf, Arc<dyn Drive>)> = self
            .drives
            .iter()
            .map(|(p, d)| (p.clone(), d.clone() as _))
            .collect();
        let (mut pools, notes) = Pool::import_drives(ds, false).unwrap();
        assert_eq!(pools.len(), 1, "{notes:?}");
        pools.remove(0)
    }

    /// Replaces every member out of service with a fresh drive file; returns their slots.
    fn replace_lost(&mut self, pool: &Pool) -> Vec<usize> {
        let out: Vec<usize> = (0..self.drives.len())
            .filter(|&m| pool.array().member_state(m) == MemberState::Faulty)
            .collect();
        for &m in &out {
            let (name, d) = self.drive();
            pool.replace_with(&self.drives[m].0, &name, d.clone())
                .unwrap();
            self.drives[m] = (name, d);
        }
        out
    }
}

/// A random client write, 4 KiB aligned (the ring's and the merge's case) but for one in ten:
/// a sequential stream of 4-8 KiB pieces (a queue that merges into whole rows), single sectors,
/// whole rows and spans across rows. `cursor` is where the stream goes on.
fn pick_write(rng: &mut StdRng, size: usize, fs: usize, cursor: &mut usize) -> (usize, usize) {
    let sectors = size / 4096;
    match rng.random_range(0..10) {
        0..=3 => {
            if rng.random_bool(0.1) {
                *cursor = rng.random_range(0..size / fs) * fs;
            }
            let off = *cursor;
            let len = (4096 * rng.random_range(1..=2usize)).min(size - off);
            *cursor = (off + len) % size;
            (off, len)
        }
        4..=5 => {
            let s = rng.random_range(0..sectors);
            (
                s * 4096,
                4096 * rng.random_range(1..=3usize).min(sectors - s),
            )
        }
        6 => {
            let r = rng.random_range(0..size / fs);
            (r * fs, fs * rng.random_range(1..=2usize).min(size / fs - r))
        }
        7..=8 => {
            let s = rng.random_range(0..sectors - 1);
            let n = rng.random_range(2..=(3 * fs / 4096).min(sectors - s));
            (s * 4096, n * 4096)
        }
        _ => {
            let off = rng.random_range(0..size - 4096);
            (off, rng.random_range(1..=4096))
        }
    }
}

/// What the client on the core does in a schedule.
struct Plan {
    seed: u64,
    requests: usize,
    /// Fail these members just before this request (degraded schedules).
    fail: Option<(usize, Vec<usize>)>,
    /// Start the rebuild just before this request, with the kill at this many member flushes
    /// from then (rebuild schedules).
    rebuild: Option<(usize, i64, std::sync::mpsc::Sender<()>)>,
    kill_at: usize,
}

/// Drives the client on a core: writes in flight together (up to a queue depth), flushes with
/// nothing in flight (then the model's durable state is what the pool reads), members failing
/// amid the writes, and the kill. Returns the model.
async fn client(
    a: Arc<Array>,
    bufs: BufPool,
    power: Arc<Power>,
    plan: Plan,
    mut m: Model,
) -> Model {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0xc11e);
    let size = a.size_bytes() as usize;
    let fs = a.geometry().full_stripe_bytes() as usize;
    // Each write in flight with the sectors it touches.
    let mut inflight: Vec<(std::ops::Range<usize>, tokio::task::JoinHandle<()>)> = Vec::new();
    let qd = rng.random_range(1..=16usize);
    let mut cursor = 0;
    for i in 0..plan.requests {
        if power.killed() {
            break;
        }
        if let Some((at, ms)) = &plan.fail {
            if i == *at {
                for &v in ms {
                    a.fail_member(
                        v,
                        &std::io::Error::other("test: the drive stopped answering"),
                    );
                }
            }
        }
        if let Some((at, flushes, go)) = &plan.rebuild {
            if i == *at {
                power.kill_at_flush(*flushes);
                go.send(()).unwrap();
                // Let the rebuild start before the next writes.
                tokio::task::yield_now().await;
            }
        }
        if i == plan.kill_at {
            power.kill();
            break;
        }
        if rng.random_bool(0.08) {
            for (_, t) in inflight.drain(..) {
                t.await.unwrap();
            }
            let r = a.flush_async().await;
            if power.killed() {
                break;
            }
            r.unwrap();
            let (r, got) = a.read_async(0, bufs.get(size).await.unwrap()).await;
            r.unwrap();
            assert!(
                got[..] == m.now[..],
                "seed {}: the pool reads back differently at a flush",
                plan.seed
            );
            m.flushed();
            continue;
        }
        let (off, len) = pick_write(&mut rng, size, fs, &mut cursor);
        let sectors = off / 4096..(off + len).div_ceil(4096);
        let clash = inflight
            .iter()
            .any(|(r, _)| r.start < sectors.end && sectors.start < r.end);
        if clash || inflight.len() >= qd || rng.random_bool(0.1) {
            for (_, t) in inflight.drain(..) {
                t.await.unwrap();
            }
        }
        let mut b = bufs.get(len).await.unwrap();
        rng.fill(&mut b[..]);
        m.wrote(off, &b);
        let (a, power) = (a.clone(), power.clone());
        let t = tokio::task::spawn_local(async move {
            let (r, _) = a.write_async(off as u64, b, false).await;
            // A write cut by the kill is not acknowledged, but it may have reached the drives.
            assert!(r.is_ok() || power.killed(), "write failed: {r:?}");
        });
        inflight.push((sectors, t));
    }
    power.kill();
    for (_, t) in inflight {
        t.await.unwrap();
    }
    m
}

fn bufs_and_core() -> (Cores, BufPool) {
    let bufs = BufPool::new(&PoolConfig {
        bytes: 8 << 20,
        slices: 1,
        max_buf: 1 << 20,
        populate: false,
    })
    .unwrap();
    let cores = Cores::start(CoresConfig {
        cores: 1,
        pool: Some(bufs.clone()),
        ..Default::default()
    })
    .unwrap();
    (cores, bufs)
}

/// One schedule: `lose` members fail amid the writes (`rebuild`: before them, replaced and
/// rebuilt while the client writes).
fn run(
    cores: &Cores,
    bufs: &BufPool,
    level: Level,
    n: usize,
    lose: usize,
    rebuild: bool,
    seed: u64,
) {
    let ctx = format!("{level} lose {lose} rebuild {rebuild} seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut w, pool) = World::create(level, n);
    let size = pool.array().size_bytes() as usize;
    let mut init = vec![0u8; size];
    rng.fill(&mut init[..]);
    pool.write_at(0, &init).unwrap();
    pool.array().flush().unwrap();
    let mut out: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        out.swap(i, rng.random_range(0..=i));
    }
    out.truncate(lose);
    let requests = rng.random_range(10..60);
    // Mostly the kill comes after the failure (or the rebuild's start), some time into what
    // follows.
    let at = rng.random_range(0..requests);
    let kill_at = if rng.random_bool(0.8) {
        rng.random_range(at + 1..requests + 10)
    } else {
        rng.random_range(1..requests + 10)
    };
    let mut plan = Plan {
        seed,
        requests,
        fail: None,
        rebuild: None,
        kill_at,
    };
    let (go, started) = std::sync::mpsc::channel();
    if rebuild {
        for &v in &out {
            pool.array().fail_member(v, &std::io::Error::other("test"));
        }
        w.replace_lost(&pool);
        pool.array().set_rebuild_batch_rows(rng.random_range(1..6));
        // The rebuild flushes each batch: most kills land in it.
        plan.rebuild = Some((at, rng.random_range(1..60), go));
    } else {
        drop(go);
        plan.fail = Some((at, out.clone()));
        w.power.kill_at_flush(rng.random_range(1..300));
    }
    let model = Model {
        now: init.clone(),
        durable: init,
        since: HashMap::new(),
    };
    let at_kill = Arc::new(parking_lot::Mutex::new(String::new()));
    {
        let (a, note) = (pool.array().clone(), at_kill.clone());
        w.power.on_kill(move || {
            *note.lock() = format!(
                "killed with {:?} rebuilt to {:?}",
                a.member_states(),
                a.rebuild_progress()
            )
        });
    }
    let m = std::thread::scope(|s| {
        let pool = &pool;
        // Started when the client says so; not at all if it was killed before.
        let rb = s.spawn(move || {
            if started.recv().is_ok() {
                let _ = pool.rebuild(None, |_, _| {});
            }
        });
        let (a, b, p) = (pool.array().clone(), bufs.clone(), w.power.clone());
        let m = cores
            .spawn_on(0, move || client(a, b, p, plan, model))
            .wait()
            .unwrap();
        rb.join().unwrap();
        m
    });
    if std::env::var_os("CRASH_DEBUG").is_some() {
        let st = &pool.array().stats;
        eprintln!(
            "{ctx}: merged {} full {} rmw {} rcw {} logged {} flushes {} {}",
            st.merged_writes.load(std::sync::atomic::Ordering::Relaxed),
            st.full_stripe_writes
                .load(std::sync::atomic::Ordering::Relaxed),
            st.rmw_writes.load(std::sync::atomic::Ordering::Relaxed),
            st.rcw_writes.load(std::sync::atomic::Ordering::Relaxed),
            st.log_records.load(std::sync::atomic::Ordering::Relaxed),
            st.member_flushes.load(std::sync::atomic::Ordering::Relaxed),
            at_kill.lock(),
        );
    }
    drop(pool);
    let pool = w.restart(&mut rng);
    let ctx = format!(
        "{ctx} ({}; opened again with {:?})",
        at_kill.lock(),
        pool.array().member_states()
    );
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

fn each(f: impl Fn(&Cores, &BufPool, u64)) {
    let n: u64 = std::env::var("CRASH_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let from: u64 = std::env::var("CRASH_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (cores, bufs) = bufs_and_core();
    for seed in from..from + n {
        f(&cores, &bufs, seed);
    }
}

#[test]
fn raid5_on_the_ring_killed_amid_degraded_writes() {
    each(|c, b, s| run(c, b, Level::Raid5, 5, 1, false, s));
}

#[test]
fn raid6_on_the_ring_killed_amid_degraded_writes() {
    each(|c, b, s| run(c, b, Level::Raid6, 6, 1 + (s % 2) as usize, false, s));
}

#[test]
fn raid5_on_the_ring_killed_during_rebuild() {
    each(|c, b, s| run(c, b, Level::Raid5, 5, 1, true, s));
}

#[test]
fn raid6_on_the_ring_killed_during_rebuild() {
    each(|c, b, s| run(c, b, Level::Raid6, 6, 2, true, s));
}
