use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use millrace_array::{Cache, Level, Pool};
use millrace_bench::{sim::SimSpec, Options, Setup};
use millrace_server::model::BenchRequest;

use crate::format::parse_bytes;
use crate::service::{follow_job, Service};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  millrace bench tank\n  millrace bench --sim 16x400M --level raid6 --strip 64k\n  millrace bench tank --suite seq --jobs 1,4,8,16,32 --bs 1M --degraded 0,1,2 --json out.json --plot out.png"
)]
pub struct BenchArgs {
    /// An existing pool (read workloads only, unless --write).
    pub pool: Option<String>,
    /// A simulated pool instead: DRIVESxRATE[:IOPS], e.g. 16x400M (RAM drives capped at 400 MB/s).
    #[arg(long, conflicts_with = "pool")]
    sim: Option<SimSpec>,
    /// Level of the simulated pool.
    #[arg(long, default_value = "raid6")]
    level: Level,
    /// Strip of the simulated pool.
    #[arg(long, default_value = "64k", value_parser = parse_bytes)]
    strip: u64,
    /// Group size of the simulated pool (raid10/50/60).
    #[arg(long)]
    group: Option<usize>,
    /// seq, rand, mixed or all.
    #[arg(long, default_value = "all")]
    suite: String,
    /// Job counts (threads), comma separated.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    jobs: Vec<usize>,
    /// Requests in flight per job, comma separated (each is a thread: the engine is synchronous).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    iodepth: Vec<usize>,
    /// Request sizes, comma separated, like 128k,1M,4M (default: 1M rounded up to whole full
    /// stripes sequential, 4K random; sequential writes always round up to whole full stripes).
    #[arg(long, value_parser = parse_bytes, value_delimiter = ',')]
    bs: Vec<u64>,
    /// Numbers of failed drives to measure, comma separated.
    #[arg(long, default_value = "0,1,2", value_delimiter = ',')]
    degraded: Vec<usize>,
    /// Seconds per point.
    #[arg(long, default_value = "2")]
    seconds: f64,
    /// Allow write workloads on an existing pool: they overwrite its data.
    #[arg(long)]
    write: bool,
    /// Also measure a rebuild of one member: its rate idle and under a read load, against the
    /// drive's raw write rate (on an existing pool only with --write: it rewrites a member).
    #[arg(long)]
    rebuild: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the results as a PNG here.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// What `--json` writes of a served pool's bench: the job's `results`.
#[derive(serde::Serialize)]
struct BenchResults<'a> {
    results: &'a serde_json::Value,
}

/// A served pool is benched by the server (it holds the drives): its read workloads only.
pub fn run_served(svc: &dyn Service, a: BenchArgs) -> Result<()> {
    let Some(pool) = &a.pool else {
        bail!("name a pool to benchmark, or simulate one with --sim 16x400M");
    };
    if a.write || a.rebuild {
        bail!("pool {pool} is served by `millrace serve`: write and rebuild workloads would overwrite what it serves; stop the server to run them, or bench a simulated pool with --sim");
    }
    if a.plot.is_some() {
        eprintln!("note: a served pool's bench draws no plot here; write --json and plot it from the results, or stop the server");
    }
    let req = BenchRequest {
        pool: Some(pool.clone()),
        suite: Some(a.suite.clone()),
        jobs: Some(a.jobs.clone()),
        iodepth: Some(a.iodepth.clone()),
        bs: a.bs.clone(),
        degraded: Some(a.degraded.clone()),
        seconds: Some(a.seconds),
        ..Default::default()
    };
    let id = svc.bench(req)?.job;
    eprintln!("note: the server benches pool {pool}'s read workloads (job {id}); writes are left out while it serves");
    let result = follow_job(svc, id, "benchmarking")?
        .result
        .unwrap_or_default();
    print!("{}", result["table"].as_str().unwrap_or(""));
    if let Some(f) = &a.json {
        let results = BenchResults {
            results: &result["results"],
        };
        std::fs::write(f, serde_json::to_string_pretty(&results)?)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", f.display()))?;
        eprintln!("results written to {}", f.display());
    }
    Ok(())
}

/// A pool with no server running, opened here: its drives, and the workloads that may run on it.
fn pool_setup(
    home: &Path,
    name: &str,
    wl: &mut Vec<millrace_bench::Workload>,
    write: bool,
) -> Result<(Pool, Setup)> {
    let pool = Cache::load(home)?.open(name)?;
    if !write && wl.iter().any(|w| w.writes()) {
        wl.retain(|w| !w.writes());
        eprintln!("note: write workloads skipped: they would overwrite pool '{name}'; pass --write to run them");
    }
    if wl.is_empty() {
        bail!("nothing to run: the suite has only write workloads; pass --write to run them on pool '{name}'");
    }
    let info = pool.info();
    let files: Vec<PathBuf> = pool.member_paths().into_iter().flatten().collect();
    let setup = Setup {
        geo: *pool.array().geometry(),
        data_offset: info.data_offset_bytes,
        drives: pool.array().drives().to_vec(),
        files: (files.len() == info.members.len()).then_some(files),
        simulated: false,
    };
    Ok((pool, setup))
}

/// What the run will leave out, said before it starts.
fn notes(a: &BenchArgs, setup: &Setup) {
    if setup.files.is_some() && !millrace_bench::fio::available() {
        eprintln!("note: fio is not installed, so the raw drives are measured by Millrace's own reader (apt-get install fio)");
    }
    if a.rebuild && setup.geo.tolerance_per_group() == 0 {
        eprintln!(
            "note: a {} pool survives no drive failure, so there is no rebuild to measure",
            setup.geo.level
        );
    }
    let skipped: Vec<usize> = (a.degraded.iter().copied())
        .filter(|&f| f > setup.geo.tolerance_per_group() * setup.geo.groups())
        .collect();
    if !skipped.is_empty() {
        eprintln!(
            "note: states with {skipped:?} failed drives skipped: a {} pool of {} drives does not survive them",
            setup.geo.level, setup.geo.members
        );
    }
}

/// A simulated pool, or a pool with no server running, is benched here, outside the service
/// layer: its write and rebuild workloads overwrite the pool's data and rewrite a member, and
/// its plot is drawn here, none of which the service's bench (which serves alongside) allows.
pub fn run(home: &Path, a: BenchArgs) -> Result<()> {
    let mut wl = millrace_bench::suite(&a.suite).map_err(anyhow::Error::msg)?;
    Options {
        workloads: wl.clone(),
        jobs: a.jobs.clone(),
        iodepth: a.iodepth.clone(),
        bs: a.bs.clone(),
        degraded: a.degraded.clone(),
        seconds: a.seconds,
        rebuild: a.rebuild,
    }
    .check()
    .map_err(|e| anyhow::anyhow!("--{e}"))?;
    // Held open (its drives locked) while the bench runs.
    let _pool;
    let setup = match (&a.pool, &a.sim) {
        (Some(name), None) => {
            let (p, setup) = pool_setup(home, name, &mut wl, a.write)?;
            _pool = p;
            setup
        }
        (None, Some(spec)) => millrace_bench::sim_setup(spec, a.level, a.group, a.strip)
            .map_err(anyhow::Error::msg)?,
        _ => bail!("name a pool to benchmark, or simulate one with --sim 16x400M"),
    };
    if a.rebuild && a.pool.is_some() && !a.write {
        bail!("--rebuild rewrites a member of the pool; pass --write too to allow it");
    }
    notes(&a, &setup);
    let opts = Options {
        workloads: wl,
        jobs: a.jobs,
        iodepth: a.iodepth,
        bs: a.bs,
        degraded: a.degraded,
        seconds: a.seconds,
        rebuild: a.rebuild,
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap());
    let points = millrace_bench::run_suite(&setup, &opts, &mut |msg, done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(msg);
    })
    .map_err(anyhow::Error::msg)?;
    bar.finish_and_clear();
    print!("{}", millrace_bench::report::table(&points));
    if let Some(j) = &a.json {
        std::fs::write(j, millrace_bench::report::json(&points))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", j.display()))?;
        eprintln!("results written to {}", j.display());
    }
    if let Some(p) = &a.plot {
        millrace_bench::report::plot(&points, p).map_err(anyhow::Error::msg)?;
        eprintln!("plot written to {}", p.display());
    }
    Ok(())
}
