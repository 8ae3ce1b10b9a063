//! Bench runs as jobs, for the API and for `millrace bench` with no server running: a
//! simulated pool, or a pool's workloads. A served pool runs its reads only (its writes would
//! overwrite what the server serves); with no server, a pool's writes and its rebuild run when
//! asked for. A job's result holds the same `results` list `millrace bench --json` writes, and
//! the table the CLI prints.

use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::Level;
use millrace_bench::{sim::SimSpec, Options, Setup, Workload};

use crate::error::ApiError;
use crate::model::BenchRequest;
use crate::state::State;

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad_request(m)
}

impl State {
    /// Starts a bench job; returns its id and what it leaves out, said before it runs.
    pub fn start_bench(self: &Arc<Self>, r: BenchRequest) -> Result<(u64, Vec<String>), ApiError> {
        if let Some(id) = self.jobs.running_id_of_kind("bench") {
            return Err(ApiError::conflict(format!(
                "a bench is already running (job {id}); wait for it: two would measure each other"
            )));
        }
        if self.serving && r.rebuild {
            return Err(bad(
                "a rebuild is benched only with no server running (millrace bench --rebuild): it rewrites a member and runs as long as the drive takes to fill",
            ));
        }
        let mut workloads =
            millrace_bench::suite(r.suite.as_deref().unwrap_or("all")).map_err(bad)?;
        let mut notes = Vec::new();
        let (label, setup) =
            match (&r.pool, &r.sim) {
                (Some(name), None) => (
                    name.clone(),
                    self.pool_bench_setup(name, &r, &mut workloads, &mut notes)?,
                ),
                (None, Some(spec)) => (format!("sim {spec}"), sim_bench_setup(spec, &r)?),
                _ => return Err(bad(
                    "name a pool (\"pool\") or a simulated one (\"sim\": \"16x400M\"), not both",
                )),
            };
        let opts = bench_options(&r, workloads);
        opts.check().map_err(bad)?;
        // With no server, the bench is the command the user asked for, as long as it takes.
        if self.serving {
            self.check_bench_budget(&opts, &setup)?;
        }
        notes.extend(setup_notes(&opts, &setup));
        let id = self.jobs.spawn(&label, "bench", move |job| {
            let points = millrace_bench::run_suite(&setup, &opts, &mut |_, done, total| {
                job.progress(done as u64, total as u64)
            })?;
            let mut result: serde_json::Value =
                serde_json::from_str(&millrace_bench::report::json(&points))
                    .map_err(|e| e.to_string())?;
            result["table"] = serde_json::Value::String(millrace_bench::report::table(&points));
            job.set_result(result);
            Ok(format!("{} points measured", points.len()))
        });
        Ok((id, notes))
    }

    /// A pool's drives and the workloads that may run on it: its writes (and a rebuild, which
    /// rewrites a member) only when asked for and only while nothing serves it.
    fn pool_bench_setup(
        &self,
        name: &str,
        r: &BenchRequest,
        workloads: &mut Vec<Workload>,
        notes: &mut Vec<String>,
    ) -> Result<Setup, ApiError> {
        let e = self.entry(name)?;
        if self.serving && r.write {
            return Err(bad(format!(
                "pool {name} is served by `millrace serve`: write workloads would overwrite what it serves; stop the server to run them, or bench a simulated pool"
            )));
        }
        if r.rebuild && !r.write {
            return Err(bad(
                "a rebuild rewrites a member of the pool; ask for the write workloads too (--write) to allow it",
            ));
        }
        if !r.write && workloads.iter().any(|w| w.writes()) {
            workloads.retain(|w| !w.writes());
            notes.push(if self.serving {
                format!("the server benches pool {name}'s read workloads; writes are left out while it serves")
            } else {
                format!("write workloads skipped: they would overwrite pool '{name}'; pass --write to run them")
            });
        }
        if workloads.is_empty() {
            return Err(bad(format!(
                "nothing to run: the suite has only write workloads, and they would overwrite pool {name}; bench its reads, or a simulated pool{}",
                if self.serving { "" } else { ", or pass --write" }
            )));
        }
        let info = e.pool.info();
        let files: Vec<PathBuf> = e.pool.member_paths().into_iter().flatten().collect();
        Ok(Setup {
            geo: *e.pool.array().geometry(),
            data_offset: info.data_offset_bytes,
            drives: e.pool.array().drives().to_vec(),
            files: (files.len() == info.members.len()).then_some(files),
            simulated: false,
        })
    }

    /// A run through the API may take at most `bench_memory` bytes of buffers and an hour:
    /// a request asking for more is refused before anything is allocated or started.
    fn check_bench_budget(&self, opts: &Options, setup: &Setup) -> Result<(), ApiError> {
        let need = opts.memory_bytes(setup);
        if need.is_none_or(|n| n > self.bench_memory) {
            return Err(bad(format!(
                "this run would hold up to {} of buffers (jobs x iodepth requests in flight, each with its own buffer and the engine's), and a bench here may use at most {} (serve --bench-memory-mib); ask for fewer jobs, a lower iodepth or a smaller bs",
                need.map_or("more than 2^64 bytes".to_string(), |n| format!("{n} bytes")),
                self.bench_memory
            )));
        }
        // Each point runs `seconds`, and its raw-drive row as long again.
        let secs = opts.points() as f64 * opts.seconds * 2.0;
        if secs > MAX_BENCH_SECONDS {
            return Err(bad(format!(
                "this run would take about {secs:.0} s ({} points of {} s, each with its raw row); a bench through the API runs at most {MAX_BENCH_SECONDS:.0} s: ask for fewer values or fewer seconds",
                opts.points(),
                opts.seconds
            )));
        }
        Ok(())
    }
}

/// The longest a bench run through the API may take.
const MAX_BENCH_SECONDS: f64 = 3600.0;

/// The run a request asks for, with the API's defaults where it is silent (not yet checked).
pub fn bench_options(r: &BenchRequest, workloads: Vec<Workload>) -> Options {
    Options {
        workloads,
        jobs: r.jobs.clone().unwrap_or_else(|| vec![1, 4, 16]),
        iodepth: r.iodepth.clone().unwrap_or_else(|| vec![1]),
        bs: r.bs.clone(),
        degraded: r.degraded.clone().unwrap_or_else(|| vec![0, 1, 2]),
        seconds: r.seconds.unwrap_or(2.0),
        rebuild: r.rebuild,
    }
}

/// A simulated pool of RAM drives paced to the rate the spec gives.
pub fn sim_bench_setup(spec: &str, r: &BenchRequest) -> Result<Setup, ApiError> {
    let spec: SimSpec = spec.parse().map_err(bad)?;
    let level: Level = (r.level.as_deref().unwrap_or("raid6"))
        .parse()
        .map_err(|e: String| bad(e))?;
    millrace_bench::sim_setup(&spec, level, r.group, r.strip_bytes.unwrap_or(64 << 10)).map_err(bad)
}

/// What the run will leave out, said before it starts.
fn setup_notes(opts: &Options, setup: &Setup) -> Vec<String> {
    let mut notes = Vec::new();
    if setup.files.is_some() && !millrace_bench::fio::available() {
        notes.push("fio is not installed, so the raw drives are measured by Millrace's own reader (apt-get install fio)".to_string());
    }
    let geo = &setup.geo;
    if opts.rebuild && geo.tolerance_per_group() == 0 {
        notes.push(format!(
            "a {} pool survives no drive failure, so there is no rebuild to measure",
            geo.level
        ));
    }
    let most = geo.tolerance_per_group() * geo.groups();
    let skipped: Vec<usize> = (opts.degraded.iter().copied())
        .filter(|&f| f > most)
        .collect();
    if !skipped.is_empty() {
        notes.push(format!(
            "states with {skipped:?} failed drives skipped: a {} pool of {} drives does not survive them",
            geo.level, geo.members
        ));
    }
    notes
}
