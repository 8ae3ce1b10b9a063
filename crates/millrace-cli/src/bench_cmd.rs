use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use millrace_array::{Cache, Geometry, Level};
use millrace_bench::{sim::SimSpec, Options, Setup, Workload};

use crate::format::parse_bytes;

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

fn workloads(suite: &str) -> Result<Vec<Workload>> {
    Ok(match suite {
        "seq" => vec![Workload::SeqRead, Workload::SeqWrite],
        "rand" => vec![Workload::RandRead, Workload::RandWrite],
        "mixed" => vec![Workload::Mixed],
        "all" => vec![
            Workload::SeqRead,
            Workload::SeqWrite,
            Workload::RandRead,
            Workload::RandWrite,
            Workload::Mixed,
        ],
        other => bail!("unknown suite '{other}': use seq, rand, mixed or all"),
    })
}

pub fn run(home: &Path, a: BenchArgs) -> Result<()> {
    if a.jobs.is_empty() || a.jobs.contains(&0) || a.jobs.iter().any(|&j| j > 256) {
        bail!("--jobs takes job counts from 1 to 256, like 1,4,16");
    }
    if a.iodepth.is_empty() || a.iodepth.contains(&0) || a.iodepth.iter().any(|&q| q > 256) {
        bail!("--iodepth takes depths from 1 to 256, like 1,4,16,64");
    }
    let most = a.jobs.iter().max().unwrap() * a.iodepth.iter().max().unwrap();
    if most > 2048 {
        bail!("--jobs times --iodepth asks for {most} requests in flight; each is a thread here, and 2048 is the most this bench runs");
    }
    if a.bs.iter().any(|&b| b == 0 || b % 512 != 0 || b > 1 << 30) {
        bail!("--bs takes sizes that are whole multiples of 512 bytes, up to 1G, like 128k,1M,4M");
    }
    if !(a.seconds > 0.0 && a.seconds <= 600.0) {
        bail!("--seconds must be above 0 and at most 600");
    }
    let mut wl = workloads(&a.suite)?;
    let pool;
    let setup = match (&a.pool, &a.sim) {
        (Some(name), None) => {
            pool = Cache::load(home)?.open(name)?;
            if !a.write && wl.iter().any(|w| w.writes()) {
                wl.retain(|w| !w.writes());
                eprintln!("note: write workloads skipped: they would overwrite pool '{name}'; pass --write to run them");
            }
            if wl.is_empty() {
                bail!("nothing to run: the suite has only write workloads; pass --write to run them on pool '{name}'");
            }
            let info = pool.info();
            let files: Vec<PathBuf> = pool.member_paths().into_iter().flatten().collect();
            Setup {
                geo: *pool.array().geometry(),
                data_offset: info.data_offset_bytes,
                drives: pool.array().drives().to_vec(),
                files: (files.len() == info.members.len()).then_some(files),
                simulated: false,
            }
        }
        (None, Some(spec)) => {
            // The same metadata area a real drive of this size would get (journal room included).
            let data_offset = 64 << 20;
            let geo = Geometry::new(
                a.level,
                spec.drives,
                a.group,
                a.strip,
                spec.size - data_offset,
            )
            .map_err(anyhow::Error::msg)?;
            Setup {
                geo,
                data_offset,
                drives: millrace_bench::sim_drives(spec),
                files: None,
                simulated: true,
            }
        }
        _ => bail!("name a pool to benchmark, or simulate one with --sim 16x400M"),
    };
    if setup.files.is_some() && !millrace_bench::fio::available() {
        eprintln!("note: fio is not installed, so the raw drives are measured by Millrace's own reader (apt-get install fio)");
    }
    if a.rebuild && a.pool.is_some() && !a.write {
        bail!("--rebuild rewrites a member of the pool; pass --write too to allow it");
    }
    if a.rebuild && setup.geo.tolerance_per_group() == 0 {
        eprintln!(
            "note: a {} pool survives no drive failure, so there is no rebuild to measure",
            setup.geo.level
        );
    }
    let skipped: Vec<usize> = a
        .degraded
        .iter()
        .copied()
        .filter(|&f| f > setup.geo.tolerance_per_group() * setup.geo.groups())
        .collect();
    if !skipped.is_empty() {
        eprintln!(
            "note: states with {skipped:?} failed drives skipped: a {} pool of {} drives does not survive them",
            setup.geo.level, setup.geo.members
        );
    }
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
