//! Issue #15's memory-bound test: thousands of concurrent 4 KiB (and some 1 MiB) I/Os over
//! NVMe/TCP, several connections at a high queue depth, against a RAID5 array on files,
//! served on the cores with a 4 MiB buffer pool. Every byte read back is checked; the pool
//! must really have pushed back (`waits > 0`), never held more than its capacity, hold nothing
//! once the hosts are gone, and the process's resident memory must not grow past a small
//! bound (the pool is faulted in before the load starts).

use millrace_array::{CreateOptions, Level, Pool};
use millrace_block::BlockDevice;
#[path = "common/drained.rs"]
mod drained;
use drained::wait_drained;
use millrace_io::{BufPool, Cores, CoresConfig, PoolConfig};
use millrace_nvmf::initiator::{HostController, HostOptions, HostQueue};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

const NQN: &str = "nqn.2024-01.io.millrace:bound";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000b0b0";
const QUEUES: u16 = 4;
const QUEUE_SIZE: u16 = 128;
/// 4 KiB blocks written and read back, each once per round.
const SMALL: u64 = 3000;
/// 1 MiB transfers (256 blocks) after the small blocks.
const BIG: u64 = 24;
const BLOCK: usize = 4096;

/// Context switches (voluntary, involuntary) of the core threads so far, and how many threads
/// of tokio's blocking pool exist (none should: no device call leaves its core).
fn core_switches() -> (u64, u64, usize) {
    let (mut v, mut n, mut blocking) = (0, 0, 0);
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.starts_with("tokio-runtime-w") || comm.starts_with("tokio-blocking") {
            blocking += 1;
        }
        if !comm.starts_with("millrace-core") {
            continue;
        }
        let st = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        for l in st.lines() {
            let num = |l: &str| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
            if l.starts_with("voluntary_ctxt_switches") {
                v += num(l);
            } else if l.starts_with("nonvoluntary_ctxt_switches") {
                n += num(l);
            }
        }
    }
    (v, n, blocking)
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The bytes of block `lba` in round `round`: different for every block and round.
fn block(lba: u64, round: u64) -> Vec<u8> {
    let seed = lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round.wrapping_mul(0xd1b5_4a32_d192_ed03);
    (0..BLOCK as u64)
        .map(|i| (seed.wrapping_add(i.wrapping_mul(0x2545_f491)) >> 29) as u8)
        .collect()
}

fn blocks(first: u64, n: u64, round: u64) -> Vec<u8> {
    (first..first + n).flat_map(|l| block(l, round)).collect()
}

/// One I/O of the load: `n` blocks at `lba`.
#[derive(Clone, Copy)]
struct Io {
    lba: u64,
    n: u64,
}

fn load() -> Vec<Io> {
    let mut v: Vec<Io> = (0..SMALL).map(|lba| Io { lba, n: 1 }).collect();
    for i in 0..BIG {
        v.push(Io {
            lba: SMALL + i * 256,
            n: 256,
        });
    }
    // Interleave big and small so both are in flight together.
    let mut out = Vec::with_capacity(v.len());
    let (small, big) = v.split_at(SMALL as usize);
    let every = small.len() / big.len().max(1);
    for (i, s) in small.iter().enumerate() {
        out.push(*s);
        if i % every == 0 {
            if let Some(b) = big.get(i / every) {
                out.push(*b);
            }
        }
    }
    out
}

/// Runs every I/O of `ios` at once, spread over the queues, each queue at most `QUEUE_SIZE`
/// in flight; writes round `round`'s data, or reads and checks it.
async fn run(c: &HostController, ios: &[Io], round: u64, write: bool) {
    let limits: Vec<Arc<Semaphore>> = (0..c.io.len())
        .map(|_| Arc::new(Semaphore::new(QUEUE_SIZE as usize - 1)))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, io) in ios.iter().copied().enumerate() {
        let q: Arc<HostQueue> = c.io[i % c.io.len()].clone();
        let lim = limits[i % c.io.len()].clone();
        tasks.spawn(async move {
            let _slot = lim.acquire_owned().await.unwrap();
            if write {
                let d = blocks(io.lba, io.n, round);
                q.write(1, io.lba, d, BLOCK as u32).await.unwrap();
            } else {
                let got = q.read(1, io.lba, io.n as u32, BLOCK as u32).await.unwrap();
                assert!(
                    got == blocks(io.lba, io.n, round),
                    "blocks {}..{} read back wrong in round {round}",
                    io.lba,
                    io.lba + io.n
                );
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

fn array(dir: &std::path::Path) -> (Pool, Arc<dyn BlockDevice>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("d{i}.img"))).collect();
    let p = Pool::create(
        &CreateOptions {
            name: "bound".into(),
            level: match std::env::var("MB_LEVEL").as_deref() {
                Ok("raid0") => Level::Raid0,
                _ => Level::Raid5,
            },
            strip: 64 << 10,
            group: None,
            data_offset: None,
            create_size: Some(32 << 20),
            force: false,
        },
        &paths,
    )
    .unwrap();
    let dev: Arc<dyn BlockDevice> = p.array().clone();
    (p, dev)
}

#[test]
fn thousands_of_concurrent_ios_stay_within_a_small_pool() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvmf-memory-bound");
    let (_pool, dev) = array(&dir);
    assert!(dev.size_bytes() >= (SMALL + BIG * 256) * BLOCK as u64);
    let bufs = BufPool::new(&PoolConfig {
        bytes: 4 << 20,
        slices: 2,
        max_buf: 1 << 20,
        populate: true,
    })
    .unwrap();
    let cores = Cores::start(CoresConfig {
        cores: 2,
        cpus: None,
        ring_entries: 256,
        pool: Some(bufs.clone()),
    })
    .unwrap();
    // One host here: its share is the whole pool, so the pool's own bound is what pushes back
    // (tests/it/host_share.rs tests the shares).
    let t = Target::new(TargetConfig {
        max_host_buffer_bytes: Some(4 << 20),
        ..Default::default()
    });
    t.set_data_path(bufs.clone(), Some(Arc::new(cores)))
        .unwrap();
    t.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-BOUND".into(),
        model: "Millrace bound".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev,
            uuid: [3; 16],
            nguid: [3; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })
    .unwrap();
    // Named, so that any "tokio-runtime-worker" thread is a core's blocking pool.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("initiator")
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let t2 = t.clone();
        tokio::spawn(async move { t2.serve(l).await });
        let o = HostOptions {
            hostnqn: HOST.into(),
            queue_size: QUEUE_SIZE,
            ..Default::default()
        };
        let c = HostController::connect(addr, NQN, &o, QUEUES)
            .await
            .unwrap();
        assert_eq!(c.io.len(), QUEUES as usize);
        // MDTS is within the pool's largest buffer (1 MiB = 2^8 pages).
        assert_eq!(c.id_ctrl[77], 8);
        let ios = load();
        // Warm up (the initiator's and runtime's own allocations), then measure.
        run(&c, &ios[..64], 0, true).await;
        let rss0 = rss_bytes();
        let (v0, n0, _) = core_switches();
        let c0 = t.stats().commands;
        for round in 1..=2 {
            for write in [true, false] {
                let phase = run(&c, &ios, round, write);
                if tokio::time::timeout(Duration::from_secs(120), phase)
                    .await
                    .is_err()
                {
                    panic!(
                        "round {round} ({}) did not finish in 2 minutes; pool {:?}, target {:?}",
                        if write { "writes" } else { "reads" },
                        bufs.usage(),
                        t.stats()
                    );
                }
            }
        }
        let rss1 = rss_bytes();
        let (v1, n1, blocking) = core_switches();
        let cmds = (t.stats().commands - c0).max(1);
        eprintln!(
            "core threads: {:.3} voluntary and {:.3} involuntary context switches per command over {cmds} commands; {blocking} blocking-pool threads",
            (v1 - v0) as f64 / cmds as f64,
            (n1 - n0) as f64 / cmds as f64
        );
        let u = bufs.usage();
        eprintln!(
            "pool after the load: {u:?}; RSS {} -> {} MiB",
            rss0 >> 20,
            rss1 >> 20
        );
        assert!(u.waits > 0, "the pool never pushed back: {u:?}");
        assert!(u.peak_bytes <= u.capacity_bytes, "{u:?}");
        // Every read takes a pool buffer; writes do too, except in-capsule ones that arrive
        // while their queue's R2T transfers hold buffers (those get one of their own).
        assert!(u.gets >= 2 * ios.len() as u64, "{u:?}");
        // The load moved 2 x 2 x ~36 MiB. The in-process initiator holds each request's data
        // while it is in flight (up to 24 MiB of 1 MiB writes at once) and the allocator keeps
        // some of it: 16-29 MiB of growth measured; a target that held a buffer per request
        // outside the pool would add the whole ~36 MiB of a round.
        let grew = rss1.saturating_sub(rss0);
        assert!(grew < 64 << 20, "RSS grew by {} MiB", grew >> 20);
        c.shutdown().await.unwrap();
        for q in &c.io {
            q.disconnect().await.unwrap();
        }
        drop(c);
        wait_drained(&bufs, &t).await;
    });
    t.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
