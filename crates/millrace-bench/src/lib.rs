//! `millrace bench`: the vendors' tables, measured side by side with the raw drives.
//!
//! Each point runs a workload on the array in one state (healthy, or with members failed) and
//! on the raw drives under it in the same run, and reports the ratio. Failed members are failed
//! in a private copy of the array (no failure hook), so benchmarking never changes a pool.

pub mod fio;
pub mod report;
pub mod run;
pub mod sim;

use std::path::PathBuf;
use std::sync::Arc;

use millrace_array::drive::Drive;
use millrace_array::superblock::MemberState;
use millrace_array::{Array, Geometry};

pub use run::Workload;

/// One row of the results, the names scripts rely on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    pub level: String,
    pub drives: usize,
    pub state: String,
    pub workload: Workload,
    pub bs_bytes: u64,
    pub jobs: usize,
    pub iodepth: usize,
    pub value: f64,
    pub unit: &'static str,
    pub raw_value: f64,
    pub ratio: f64,
    /// What the ratio can be at best: the data share of each stripe for writes, 1 for reads.
    pub ideal_ratio: f64,
    pub cpu_seconds_per_gb: f64,
    pub raw_cpu_seconds_per_gb: f64,
    /// "fio" or "millrace" (the bench's own reader), for the raw row.
    pub raw_by: &'static str,
}

pub struct Setup {
    pub geo: Geometry,
    pub data_offset: u64,
    pub drives: Vec<Arc<dyn Drive>>,
    /// Member files, where fio can measure the raw row.
    pub files: Option<Vec<PathBuf>>,
    pub simulated: bool,
}

pub struct Options {
    pub workloads: Vec<Workload>,
    pub jobs: Vec<usize>,
    /// Request size; None: 1 MiB sequential (whole full stripes for sequential writes), 4 KiB random.
    pub bs: Option<u64>,
    pub degraded: Vec<usize>,
    pub seconds: f64,
    /// Also measure a rebuild: its rate idle and under load, and the workloads while it runs.
    pub rebuild: bool,
}

fn bs_for(setup: &Setup, opts: &Options, w: Workload) -> u64 {
    let fs = setup.geo.full_stripe_bytes();
    match (w, opts.bs) {
        // Sequential writes go in whole full stripes, as aligned clients send them.
        (Workload::SeqWrite, b) => b.unwrap_or(1 << 20).div_ceil(fs) * fs,
        (_, Some(b)) => b,
        // Sequential reads too, by default: the size the pool reports as its preferred I/O.
        (w, None) if w.sequential() => (1u64 << 20).div_ceil(fs) * fs,
        _ => 4096,
    }
}

/// States to measure: `failed` members out, spread over groups the way failures that the pool
/// survives can be (at most the tolerance per group).
fn failed_set(geo: &Geometry, failed: usize) -> Option<Vec<usize>> {
    let tol = geo.tolerance_per_group();
    if failed > tol * geo.groups() {
        return None;
    }
    let mut out = Vec::new();
    'outer: for k in 0..tol {
        for g in 0..geo.groups() {
            if out.len() == failed {
                break 'outer;
            }
            out.push(g * geo.group + k);
        }
    }
    (out.len() == failed).then_some(out)
}

pub fn state_name(failed: usize) -> String {
    match failed {
        0 => "healthy".into(),
        1 => "1 failed".into(),
        n => format!("{n} failed"),
    }
}

pub fn run_suite(
    setup: &Setup,
    opts: &Options,
    progress: &mut dyn FnMut(String, usize, usize),
) -> Result<Vec<Point>, String> {
    let geo = setup.geo;
    let states: Vec<(usize, Vec<usize>)> = opts
        .degraded
        .iter()
        .filter_map(|&f| failed_set(&geo, f).map(|s| (f, s)))
        .collect();
    let total = opts.workloads.len() * opts.jobs.len() * (states.len() + 1);
    let mut done = 0;
    let mut points = Vec::new();
    let raw_target = run::RawTarget {
        drives: setup.drives.clone(),
        data_offset: setup.data_offset,
        member_bytes: geo.member_data_bytes,
        simulated: setup.simulated,
    };
    let use_fio = setup.files.is_some() && fio::available();
    for &w in &opts.workloads {
        let bs = bs_for(setup, opts, w);
        let unit = if w.sequential() { "GB/s" } else { "IOPS" };
        let value = |m: &run::Measured| if w.sequential() { m.gbps() } else { m.iops() };
        let ideal = if w.writes() && w.sequential() {
            geo.data_cols() as f64 / geo.members as f64
        } else {
            1.0
        };
        for &jobs in &opts.jobs {
            progress(
                format!("{} {} x{jobs} raw drives", w.name(), report::size(bs)),
                done,
                total,
            );
            // The raw row is the drives' aggregate: two jobs per drive at least, so every drive is
            // busy (as every drive of the array is), with the array's per-drive request size.
            let raw_bs = if w.sequential() {
                bs.min(1 << 20).min(geo.strip.max(1 << 20))
            } else {
                bs
            };
            let raw_jobs = jobs.max(2 * geo.members);
            let (raw, raw_by) = match (&setup.files, use_fio) {
                (Some(files), true) => (
                    fio::raw(
                        files,
                        setup.data_offset,
                        geo.member_data_bytes,
                        w,
                        raw_bs,
                        raw_jobs,
                        opts.seconds,
                    )?,
                    "fio",
                ),
                _ => (
                    run::run(&raw_target, w, raw_bs, raw_jobs, opts.seconds)
                        .map_err(|e| e.to_string())?,
                    "millrace",
                ),
            };
            done += 1;
            for (failed, set) in &states {
                progress(
                    format!(
                        "{} {} x{jobs} {}",
                        w.name(),
                        report::size(bs),
                        state_name(*failed)
                    ),
                    done,
                    total,
                );
                let mut st = vec![MemberState::Online; geo.members];
                for &m in set {
                    st[m] = MemberState::Faulty;
                }
                let array = Array::new(geo, setup.data_offset, setup.drives.clone(), &st);
                let m = run::run(
                    &run::ArrayTarget {
                        array: &array,
                        simulated: setup.simulated,
                    },
                    w,
                    bs,
                    jobs,
                    opts.seconds,
                )
                .map_err(|e| e.to_string())?;
                let (v, rv) = (value(&m), value(&raw));
                points.push(Point {
                    level: geo.level.to_string(),
                    drives: geo.members,
                    state: state_name(*failed),
                    workload: w,
                    bs_bytes: bs,
                    jobs,
                    iodepth: 1,
                    value: v,
                    unit,
                    raw_value: rv,
                    ratio: if rv > 0.0 { v / rv } else { 0.0 },
                    ideal_ratio: ideal,
                    cpu_seconds_per_gb: m.cpu_seconds / (m.bytes as f64 / 1e9).max(1e-9),
                    raw_cpu_seconds_per_gb: raw.cpu_seconds / (raw.bytes as f64 / 1e9).max(1e-9),
                    raw_by,
                });
                done += 1;
            }
        }
    }
    if opts.rebuild {
        progress("rebuild rate, idle and under reads".into(), done, total);
        measure_rebuild(setup, opts, &mut points)?;
        // Reads while rebuilding compare with the same drives' raw reads, as the other states do.
        let raw = points
            .iter()
            .find(|p| {
                p.workload == Workload::SeqRead && p.state != "rebuilding" && p.raw_value > 0.0
            })
            .map(|p| p.raw_value);
        if let (Some(raw), Some(p)) = (raw, points.iter_mut().find(|p| p.state == "rebuilding")) {
            p.raw_value = raw;
            p.ratio = p.value / raw;
        }
    }
    Ok(points)
}

/// Rebuilds member 0 of a private array from row 0 for up to `secs` seconds (or until `stop`);
/// returns bytes written to the rebuilt member per second.
fn rebuild_rate(
    array: &Array,
    secs: f64,
    stop: &std::sync::atomic::AtomicBool,
    simulated: bool,
) -> Result<f64, String> {
    let t0 = std::time::Instant::now();
    let mut rows = 0u64;
    while t0.elapsed().as_secs_f64() < secs
        && !stop.load(std::sync::atomic::Ordering::Relaxed)
        && rows < array.geometry().rows()
    {
        array.rebuild_row(rows).map_err(|e| e.to_string())?;
        if simulated {
            sim::wait();
        }
        rows += 1;
    }
    Ok(rows as f64 * array.geometry().strip as f64 / t0.elapsed().as_secs_f64())
}

/// A private copy of the array with member 0 being rebuilt onto its own drive.
fn rebuilding_array(setup: &Setup) -> Array {
    let geo = setup.geo;
    let array = Array::new(
        geo,
        setup.data_offset,
        setup.drives.clone(),
        &vec![MemberState::Online; geo.members],
    );
    array.install_member(0, setup.drives[0].clone(), 0);
    array
}

/// The rebuild rate idle and under a sequential read load, against one drive's raw write rate.
fn measure_rebuild(setup: &Setup, opts: &Options, points: &mut Vec<Point>) -> Result<(), String> {
    use std::sync::atomic::AtomicBool;
    let geo = setup.geo;
    if geo.tolerance_per_group() == 0 {
        return Ok(());
    }
    let one = run::RawTarget {
        drives: vec![setup.drives[0].clone()],
        data_offset: setup.data_offset,
        member_bytes: geo.member_data_bytes,
        simulated: setup.simulated,
    };
    let raw = run::run(
        &one,
        Workload::SeqWrite,
        geo.strip.max(1 << 20),
        2,
        opts.seconds,
    )
    .map_err(|e| e.to_string())?;
    let raw_rate = raw.bytes as f64 / raw.seconds;
    let never = AtomicBool::new(false);
    let idle = rebuild_rate(
        &rebuilding_array(setup),
        opts.seconds,
        &never,
        setup.simulated,
    )?;
    let loaded_array = rebuilding_array(setup);
    let stop = AtomicBool::new(false);
    let jobs = opts.jobs.iter().copied().max().unwrap_or(4);
    let bs = (1u64 << 20).div_ceil(geo.full_stripe_bytes()) * geo.full_stripe_bytes();
    let (loaded, reads) = std::thread::scope(|s| {
        let h =
            s.spawn(|| rebuild_rate(&loaded_array, opts.seconds * 10.0, &stop, setup.simulated));
        let reads = run::run(
            &run::ArrayTarget {
                array: &loaded_array,
                simulated: setup.simulated,
            },
            Workload::SeqRead,
            bs,
            jobs,
            opts.seconds,
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (h.join().unwrap(), reads)
    });
    let (loaded, reads) = (loaded?, reads.map_err(|e| e.to_string())?);
    for (state, rate) in [("rebuild idle", idle), ("rebuild under reads", loaded)] {
        points.push(Point {
            level: geo.level.to_string(),
            drives: geo.members,
            state: state.into(),
            workload: Workload::Rebuild,
            bs_bytes: geo.strip,
            jobs: if state == "rebuild idle" { 1 } else { jobs },
            iodepth: 1,
            value: rate / 1e9,
            unit: "GB/s",
            raw_value: raw_rate / 1e9,
            ratio: rate / raw_rate,
            ideal_ratio: 1.0,
            cpu_seconds_per_gb: 0.0,
            raw_cpu_seconds_per_gb: 0.0,
            raw_by: "millrace",
        });
    }
    points.push(Point {
        level: geo.level.to_string(),
        drives: geo.members,
        state: "rebuilding".into(),
        workload: Workload::SeqRead,
        bs_bytes: bs,
        jobs,
        iodepth: 1,
        value: reads.gbps(),
        unit: "GB/s",
        raw_value: 0.0,
        ratio: 0.0,
        ideal_ratio: 1.0,
        cpu_seconds_per_gb: reads.cpu_seconds / (reads.bytes as f64 / 1e9).max(1e-9),
        raw_cpu_seconds_per_gb: 0.0,
        raw_by: "millrace",
    });
    Ok(())
}

/// Drives for a simulated pool.
pub fn sim_drives(spec: &sim::SimSpec) -> Vec<Arc<dyn Drive>> {
    (0..spec.drives)
        .map(|i| Arc::new(sim::SimDrive::new(format!("sim{i}"), spec)) as Arc<dyn Drive>)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_suite_yields_ratios() {
        let spec: sim::SimSpec = "6x2G".parse().unwrap();
        let geo = Geometry::new(millrace_array::Level::Raid6, 6, None, 65536, 1 << 30).unwrap();
        let setup = Setup {
            geo,
            data_offset: 1 << 20,
            drives: sim_drives(&spec),
            files: None,
            simulated: true,
        };
        let opts = Options {
            workloads: vec![Workload::SeqRead, Workload::RandWrite],
            jobs: vec![2],
            bs: None,
            degraded: vec![0, 1, 5],
            seconds: 0.2,
            rebuild: true,
        };
        let pts = run_suite(&setup, &opts, &mut |_, _, _| {}).unwrap();
        // 5 failures exceed raid6: that state is left out, not faked. Then two rebuild rates
        // and the read rate while rebuilding.
        assert_eq!(pts.len(), 7);
        for p in &pts {
            assert!(p.value > 0.0, "{p:?}");
            if p.state != "rebuilding" {
                assert!(p.raw_value > 0.0 && p.ratio > 0.0, "{p:?}");
            }
        }
        let v = serde_json::to_value(&pts[0]).unwrap();
        for k in [
            "level",
            "drives",
            "state",
            "workload",
            "bs_bytes",
            "jobs",
            "iodepth",
            "value",
            "unit",
            "raw_value",
            "ratio",
        ] {
            assert!(v.get(k).is_some(), "JSON lacks {k}");
        }
    }

    #[test]
    fn failures_spread_within_tolerance() {
        let geo = Geometry::new(millrace_array::Level::Raid60, 8, Some(4), 65536, 1 << 20).unwrap();
        assert_eq!(failed_set(&geo, 2), Some(vec![0, 4]));
        assert_eq!(failed_set(&geo, 4), Some(vec![0, 4, 1, 5]));
        assert_eq!(failed_set(&geo, 5), None);
    }
}
