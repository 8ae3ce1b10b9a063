//! Bench runs through the API: a simulated pool, or the read workloads of a served pool (its
//! writes would overwrite what the server serves). A run is a job; its result holds the same
//! `results` list `millrace bench --json` writes, and the table the CLI prints.

use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::Level;
use millrace_bench::{sim::SimSpec, Options, Setup};

use crate::error::ApiError;
use crate::model::BenchRequest;
use crate::state::State;

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad_request(m)
}

impl State {
    pub fn start_bench(self: &Arc<Self>, r: BenchRequest) -> Result<u64, ApiError> {
        if let Some(id) = self.jobs.running_id_of_kind("bench") {
            return Err(ApiError::conflict(format!(
                "a bench is already running (job {id}); wait for it: two would measure each other"
            )));
        }
        let mut workloads =
            millrace_bench::suite(r.suite.as_deref().unwrap_or("all")).map_err(bad)?;
        let (label, setup) = match (&r.pool, &r.sim) {
            (Some(name), None) => {
                let e = self.entry(name)?;
                workloads.retain(|w| !w.writes());
                if workloads.is_empty() {
                    return Err(bad(format!(
                        "the suite has only write workloads, and they would overwrite what pool {name} serves; bench its reads, or a simulated pool"
                    )));
                }
                let info = e.pool.info();
                let files: Vec<PathBuf> = e.pool.member_paths().into_iter().flatten().collect();
                let setup = Setup {
                    geo: *e.pool.array().geometry(),
                    data_offset: info.data_offset_bytes,
                    drives: e.pool.array().drives().to_vec(),
                    files: (files.len() == info.members.len()).then_some(files),
                    simulated: false,
                };
                (name.clone(), setup)
            }
            (None, Some(spec)) => {
                let spec: SimSpec = spec.parse().map_err(bad)?;
                let level: Level = r
                    .level
                    .as_deref()
                    .unwrap_or("raid6")
                    .parse()
                    .map_err(|e: String| bad(e))?;
                let setup = millrace_bench::sim_setup(
                    &spec,
                    level,
                    r.group,
                    r.strip_bytes.unwrap_or(64 << 10),
                )
                .map_err(bad)?;
                (format!("sim {}", r.sim.as_deref().unwrap_or("")), setup)
            }
            _ => return Err(bad(
                "name a served pool (\"pool\") or a simulated one (\"sim\": \"16x400M\"), not both",
            )),
        };
        let opts = Options {
            workloads,
            jobs: r.jobs.unwrap_or_else(|| vec![1, 4, 16]),
            iodepth: r.iodepth.unwrap_or_else(|| vec![1]),
            bs: r.bs,
            degraded: r.degraded.unwrap_or_else(|| vec![0, 1, 2]),
            seconds: r.seconds.unwrap_or(2.0),
            rebuild: false,
        };
        opts.check().map_err(bad)?;
        self.check_bench_budget(&opts, &setup)?;
        Ok(self.jobs.spawn(&label, "bench", move |job| {
            let points = millrace_bench::run_suite(&setup, &opts, &mut |_, done, total| {
                job.progress(done as u64, total as u64)
            })?;
            let mut result: serde_json::Value =
                serde_json::from_str(&millrace_bench::report::json(&points))
                    .map_err(|e| e.to_string())?;
            result["table"] = serde_json::Value::String(millrace_bench::report::table(&points));
            job.set_result(result);
            Ok(format!("{} points measured", points.len()))
        }))
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
