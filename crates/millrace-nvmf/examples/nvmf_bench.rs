//! What the NVMe/TCP target costs: a RAID6 pool over drive files, exported by the target on
//! 127.0.0.1 and read by the crate's initiator over several I/O queues, against the same volume
//! read in-process with `BlockDevice::read_at` at the same concurrency. 4 KiB random reads at
//! several queue depths (IOPS) and 128 KiB sequential reads (GB/s).
//!
//! cargo run --release -p millrace-nvmf --example nvmf_bench -- --seconds 3 --json nvmf.json

use clap::Parser;
use millrace_array::{CreateOptions, Level, Pool};
use millrace_block::{BlockDevice, MemBlockDevice};
use millrace_nvmf::initiator::{HostController, HostOptions, HostQueue};
use millrace_nvmf::{Namespace, SubsystemConfig, Target, TargetConfig};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.millrace:bench";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000be4c";
const BLOCK: u64 = 4096;
const SEQ: u64 = 128 << 10;

#[derive(Parser)]
struct Args {
    /// Folder for the drive files (a fresh one under the system temp folder by default).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 8)]
    drives: usize,
    /// Size of each drive file in MiB.
    #[arg(long, default_value_t = 160)]
    drive_mib: u64,
    /// A RAM block device instead of the pool (the target alone, without the array).
    #[arg(long)]
    mem: bool,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// I/O queues (connections) the initiator opens.
    #[arg(long, default_value_t = 4)]
    queues: u16,
    /// Queue depths of the 4 KiB random reads, spread over the queues.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    depths: Vec<usize>,
    /// Requests in flight for the 128 KiB sequential reads.
    #[arg(long, default_value_t = 16)]
    seq_depth: usize,
    /// Worker threads of the target's runtime and of the initiator's (each).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also write the results here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy)]
enum Work {
    Rand4k,
    Seq128k,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Rand4k => "4 KiB random read",
            Work::Seq128k => "128 KiB sequential read",
        }
    }
    fn bytes(self) -> u64 {
        match self {
            Work::Rand4k => BLOCK,
            Work::Seq128k => SEQ,
        }
    }
}

/// What one stream of requests (one of `depth`) reads next.
struct Cursor {
    work: Work,
    rng: u64,
    next: u64,
    start: u64,
    end: u64,
}

impl Cursor {
    fn new(work: Work, i: usize, depth: usize, size: u64) -> Cursor {
        // Sequential streams each own an equal slice, so together they sweep the volume.
        let slice = size / depth as u64 / SEQ * SEQ;
        let start = slice * i as u64;
        Cursor {
            work,
            rng: 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9),
            next: start,
            start,
            end: start + slice.max(SEQ),
        }
    }
    fn offset(&mut self, size: u64) -> u64 {
        match self.work {
            Work::Rand4k => {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                self.rng % (size / BLOCK) * BLOCK
            }
            Work::Seq128k => {
                if self.next + SEQ > self.end {
                    self.next = self.start;
                }
                let o = self.next;
                self.next += SEQ;
                o
            }
        }
    }
}

/// CPU seconds this process has used (all threads: initiator, target and device together).
fn cpu_secs() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// CPU seconds used so far by the threads named `name` (the runtimes name theirs, blocking
/// pools included), from /proc; zero where that is not readable.
fn cpu_secs_of(name: &str) -> f64 {
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut total = 0.0;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ...": utime and stime are the 12th and 13th fields after comm.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != name {
            continue;
        }
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        total += (ticks(11) + ticks(12)) / tick;
    }
    total
}

struct Result {
    ops: u64,
    secs: f64,
    /// CPU seconds the process used during the run; on a shared machine this, per I/O, is
    /// steadier than the rates.
    cpu: f64,
    /// Of that, the target's threads and the initiator's.
    split: Option<(f64, f64)>,
    lat_us: Vec<u32>,
    bytes: u64,
}

impl Result {
    fn iops(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    fn cpu_us_per_io(&self) -> f64 {
        self.cpu / self.ops.max(1) as f64 * 1e6
    }
    fn gbps(&self) -> f64 {
        (self.ops * self.bytes) as f64 / self.secs / 1e9
    }
    fn pct(&mut self, p: f64) -> u32 {
        if self.lat_us.is_empty() {
            return 0;
        }
        self.lat_us.sort_unstable();
        let i = ((self.lat_us.len() - 1) as f64 * p).round() as usize;
        self.lat_us[i]
    }
}

fn merge(parts: Vec<(u64, Vec<u32>)>, secs: f64, cpu: f64, work: Work) -> Result {
    let mut r = Result {
        ops: 0,
        secs,
        cpu,
        split: None,
        lat_us: Vec::new(),
        bytes: work.bytes(),
    };
    for (n, l) in parts {
        r.ops += n;
        r.lat_us.extend(l);
    }
    r
}

async fn over_nvmf(
    queues: &[Arc<HostQueue>],
    work: Work,
    depth: usize,
    size: u64,
    secs: f64,
) -> Result {
    let stop = Arc::new(AtomicBool::new(false));
    let (t0, c0) = (Instant::now(), cpu_secs());
    let (tc0, ic0) = (cpu_secs_of("target"), cpu_secs_of("initiator"));
    let mut tasks = Vec::new();
    for i in 0..depth {
        let q = queues[i % queues.len()].clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Cursor::new(work, i, depth, size);
            let (mut n, mut lat) = (0u64, Vec::new());
            let blocks = (work.bytes() / BLOCK) as u32;
            while !stop.load(Ordering::Relaxed) {
                let off = c.offset(size);
                let t = Instant::now();
                let d = q
                    .read(1, off / BLOCK, blocks, BLOCK as u32)
                    .await
                    .expect("a read over NVMe/TCP");
                debug_assert_eq!(d.len() as u64, work.bytes());
                lat.push(t.elapsed().as_micros() as u32);
                n += 1;
            }
            (n, lat)
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut parts = Vec::new();
    for t in tasks {
        parts.push(t.await.expect("a reader task"));
    }
    let mut r = merge(parts, t0.elapsed().as_secs_f64(), cpu_secs() - c0, work);
    r.split = Some((cpu_secs_of("target") - tc0, cpu_secs_of("initiator") - ic0));
    r
}

fn in_process(dev: &Arc<dyn BlockDevice>, work: Work, depth: usize, secs: f64) -> Result {
    let size = dev.size_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let (t0, c0) = (Instant::now(), cpu_secs());
    let threads: Vec<_> = (0..depth)
        .map(|i| {
            let dev = dev.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Cursor::new(work, i, depth, size);
                let mut buf = vec![0u8; work.bytes() as usize];
                let (mut n, mut lat) = (0u64, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let off = c.offset(size);
                    let t = Instant::now();
                    dev.read_at(off, &mut buf).expect("a read in-process");
                    lat.push(t.elapsed().as_micros() as u32);
                    n += 1;
                }
                (n, lat)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let parts = threads
        .into_iter()
        .map(|t| t.join().expect("a reader thread"))
        .collect();
    merge(parts, t0.elapsed().as_secs_f64(), cpu_secs() - c0, work)
}

/// Writes the whole volume once: reads of never-written parts of sparse drive files cost
/// nothing and would measure nothing.
fn fill(dev: &dyn BlockDevice, chunk: u64) -> std::io::Result<()> {
    let size = dev.size_bytes();
    let chunk = chunk.clamp(SEQ, 8 << 20) / SEQ * SEQ;
    let mut buf = vec![0u8; chunk as usize];
    let mut off = 0;
    while off < size {
        let n = chunk.min(size - off) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = ((off as usize + i) as u32)
                .wrapping_mul(2_654_435_761)
                .to_le_bytes()[1];
        }
        dev.write_at(off, &buf[..n])?;
        off += n as u64;
    }
    dev.flush()
}

type Error = Box<dyn std::error::Error>;

fn main() -> std::result::Result<(), Error> {
    let a = Args::parse();
    let tmp = (a.dir.is_none() && !a.mem)
        .then(|| std::env::temp_dir().join(format!("millrace-nvmf-bench-{}", std::process::id())));
    let Volume { dev, pool, what } = open_device(&a, tmp.clone())?;
    let size = dev.size_bytes() / SEQ * SEQ;
    let t = Instant::now();
    fill(dev.as_ref(), dev.preferred_io_bytes() * 4)?;
    eprintln!(
        "{what}: {} MiB written in {:.1} s",
        size >> 20,
        t.elapsed().as_secs_f64()
    );

    let target_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .thread_name("target")
        .enable_all()
        .build()?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .thread_name("initiator")
        .enable_all()
        .build()?;
    let (target, addr) = start_target(&target_rt, &dev)?;
    let opts = HostOptions {
        hostnqn: HOST.into(),
        queue_size: 128,
        ..Default::default()
    };
    let ctrl = client_rt.block_on(HostController::connect(addr, NQN, &opts, a.queues))?;
    // The same bytes both ways, or the comparison means nothing.
    let probe = 12345 % (size / BLOCK);
    let mut local = vec![0u8; 2 * BLOCK as usize];
    dev.read_at(probe * BLOCK, &mut local)?;
    let remote = client_rt.block_on(ctrl.io[0].read(1, probe, 2, BLOCK as u32))?;
    assert_eq!(remote, local, "NVMe/TCP and in-process reads disagree");

    let json = compare(&a, &client_rt, &ctrl, &dev, size, &what);
    if let Some(p) = &a.json {
        std::fs::write(
            p,
            format!(
                "{{\"device\":\"{what}\",\"queues\":{},\"seconds\":{},\"results\":[{}]}}\n",
                ctrl.io.len(),
                a.seconds,
                json.join(",")
            ),
        )?;
    }
    drop(ctrl);
    target.shutdown();
    drop(client_rt);
    drop(target_rt);
    if let Some(p) = pool {
        p.close()?;
        drop(p);
    }
    if let Some(dir) = tmp {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// The volume measured, the pool to close at the end, and a line that says what it is.
struct Volume {
    dev: Arc<dyn BlockDevice>,
    pool: Option<Pool>,
    what: String,
}

/// A RAID6 pool over drive files in `tmp` or `--dir`, or a RAM device.
fn open_device(a: &Args, tmp: Option<PathBuf>) -> std::result::Result<Volume, Error> {
    if a.mem {
        let dev = Arc::new(MemBlockDevice::new(
            (a.drive_mib * (a.drives as u64 - 2)) << 20,
        ));
        return Ok(Volume {
            dev,
            pool: None,
            what: "RAM block device".to_string(),
        });
    }
    let dir = a.dir.clone().or(tmp).expect("a folder");
    std::fs::create_dir_all(&dir)?;
    let paths: Vec<PathBuf> = (0..a.drives)
        .map(|i| dir.join(format!("d{i}.img")))
        .collect();
    let opts = CreateOptions {
        name: "nvmfbench".into(),
        level: Level::Raid6,
        strip: 64 << 10,
        group: None,
        data_offset: None,
        create_size: Some(a.drive_mib << 20),
        force: false,
    };
    let p = Pool::create(&opts, &paths)?;
    let array: Arc<dyn BlockDevice> = p.array().clone();
    let what = format!(
        "RAID6 pool, {} drive files of {} MiB, 64 KiB strips",
        a.drives, a.drive_mib
    );
    Ok(Volume {
        dev: array,
        pool: Some(p),
        what,
    })
}

/// A target exporting `dev` as namespace 1 of the bench's subsystem, serving on a free port
/// of 127.0.0.1 from `rt`.
fn start_target(
    rt: &tokio::runtime::Runtime,
    dev: &Arc<dyn BlockDevice>,
) -> std::result::Result<(Target, std::net::SocketAddr), Error> {
    let target = Target::new(TargetConfig::default());
    target.add_subsystem(SubsystemConfig {
        nqn: NQN.into(),
        serial: "MR-BENCH".into(),
        model: "Millrace bench".into(),
        namespaces: vec![Namespace {
            nsid: 1,
            dev: dev.clone(),
            uuid: [0xb1; 16],
            nguid: [0xb2; 16],
            ana_group: 0,
        }],
        allowed_hosts: vec![HOST.into()],
        allow_any_host: false,
    })?;
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let t = target.clone();
        tokio::spawn(async move { t.serve(l).await });
        std::io::Result::Ok(addr)
    })?;
    Ok((target, addr))
}

/// Runs each workload over NVMe/TCP and in-process, prints the table, and returns one JSON
/// object per row.
fn compare(
    a: &Args,
    client_rt: &tokio::runtime::Runtime,
    ctrl: &HostController,
    dev: &Arc<dyn BlockDevice>,
    size: u64,
    what: &str,
) -> Vec<String> {
    let mut runs: Vec<(Work, usize)> = a.depths.iter().map(|&d| (Work::Rand4k, d)).collect();
    runs.push((Work::Seq128k, a.seq_depth));
    println!(
        "\n{what}; {} I/O queues over 127.0.0.1, {} s per run\n",
        ctrl.io.len(),
        a.seconds
    );
    println!(
        "| workload | in flight | NVMe/TCP | in-process | ratio | p50 / p99 us NVMe/TCP | p50 / p99 us in-process | CPU us per I/O NVMe/TCP (target + initiator) | CPU us per I/O in-process |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for (work, depth) in runs {
        let n = client_rt.block_on(over_nvmf(&ctrl.io, work, depth, size, a.seconds));
        let l = in_process(dev, work, depth, a.seconds);
        json.push(row(work, depth, n, l));
    }
    json
}

/// Prints one row of the table and returns it as a JSON object.
fn row(work: Work, depth: usize, mut n: Result, mut l: Result) -> String {
    let (nv, lv, unit) = match work {
        Work::Rand4k => (n.iops(), l.iops(), "IOPS"),
        Work::Seq128k => (n.gbps(), l.gbps(), "GB/s"),
    };
    let fmt = |v: f64| match work {
        Work::Rand4k => format!("{:.0} {unit}", v),
        Work::Seq128k => format!("{:.2} {unit}", v),
    };
    let (n50, n99, l50, l99) = (n.pct(0.5), n.pct(0.99), l.pct(0.5), l.pct(0.99));
    let (ncpu, lcpu) = (n.cpu_us_per_io(), l.cpu_us_per_io());
    let (tcpu, icpu) = n
        .split
        .map(|(t, i)| (t / n.ops.max(1) as f64 * 1e6, i / n.ops.max(1) as f64 * 1e6))
        .unwrap_or_default();
    println!(
        "| {} | {depth} | {} | {} | {:.2} | {n50} / {n99} | {l50} / {l99} | {ncpu:.0} ({tcpu:.0} + {icpu:.0}) | {lcpu:.0} |",
        work.name(),
        fmt(nv),
        fmt(lv),
        nv / lv
    );
    format!(
        "{{\"workload\":\"{}\",\"in_flight\":{depth},\"unit\":\"{unit}\",\"nvmf\":{nv:.3},\"in_process\":{lv:.3},\"ratio\":{:.4},\"nvmf_p50_us\":{n50},\"nvmf_p99_us\":{n99},\"in_process_p50_us\":{l50},\"in_process_p99_us\":{l99},\"nvmf_cpu_us_per_io\":{ncpu:.1},\"target_cpu_us_per_io\":{tcpu:.1},\"initiator_cpu_us_per_io\":{icpu:.1},\"in_process_cpu_us_per_io\":{lcpu:.1}}}",
        work.name(),
        nv / lv
    )
}
