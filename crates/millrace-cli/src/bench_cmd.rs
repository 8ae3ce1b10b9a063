use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use millrace_array::Level;
use millrace_bench::{sim::SimSpec, Options, Point};
use millrace_service::model::BenchRequest;

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
    #[arg(long, conflicts_with = "pool", value_parser = sim_spec)]
    sim: Option<String>,
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

/// What `--json` writes: the job's `results`, as `millrace_bench::report::json` has them.
#[derive(serde::Serialize)]
struct BenchResults<'a> {
    results: &'a serde_json::Value,
}

/// Benches through the service: the server when it serves the pool (its reads only), else here.
/// The flags are checked first, so a mistake is named as the flag the user typed.
pub fn run(svc: &dyn Service, a: BenchArgs) -> Result<()> {
    if a.pool.is_none() == a.sim.is_none() {
        bail!("name a pool to benchmark, or simulate one with --sim 16x400M");
    }
    Options {
        workloads: millrace_bench::suite(&a.suite).map_err(anyhow::Error::msg)?,
        jobs: a.jobs.clone(),
        iodepth: a.iodepth.clone(),
        bs: a.bs.clone(),
        degraded: a.degraded.clone(),
        seconds: a.seconds,
        rebuild: a.rebuild,
    }
    .check()
    .map_err(|e| anyhow::anyhow!("--{e}"))?;
    let req = BenchRequest {
        pool: a.pool.clone(),
        sim: a.sim.clone(),
        level: Some(a.level.to_string()),
        strip_bytes: Some(a.strip),
        group: a.group,
        suite: Some(a.suite.clone()),
        jobs: Some(a.jobs.clone()),
        iodepth: Some(a.iodepth.clone()),
        bs: a.bs.clone(),
        degraded: Some(a.degraded.clone()),
        seconds: Some(a.seconds),
        write: a.write,
        rebuild: a.rebuild,
    };
    let started = svc.bench(req)?;
    for n in &started.notes {
        eprintln!("note: {n}");
    }
    let result = follow_job(svc, started.job, "benchmarking")?
        .result
        .unwrap_or_default();
    print!("{}", result["table"].as_str().unwrap_or(""));
    let results = &result["results"];
    if let Some(f) = &a.json {
        let text = serde_json::to_string_pretty(&BenchResults { results })?;
        std::fs::write(f, text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", f.display()))?;
        eprintln!("results written to {}", f.display());
    }
    if let Some(p) = &a.plot {
        let points: Vec<Point> = serde_json::from_value(results.clone()).map_err(|e| {
            anyhow::anyhow!("the bench's results cannot be read back to plot them: {e}")
        })?;
        millrace_bench::report::plot(&points, p).map_err(anyhow::Error::msg)?;
        eprintln!("plot written to {}", p.display());
    }
    Ok(())
}

/// A `--sim` spec, checked here and passed on as typed.
fn sim_spec(s: &str) -> Result<String, String> {
    s.parse::<SimSpec>().map(|_| s.to_string())
}
