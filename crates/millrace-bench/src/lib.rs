//! `millrace bench`: the vendors' tables, measured side by side with the raw drives.
//!
//! Each point runs a workload on the array in one state (healthy, or with members failed) and
//! on the raw drives under it in the same run, and reports the ratio. Failed members are failed
//! in a private copy of the array (no failure hook), so benchmarking never changes a pool.

// Functions stay under 100 lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod fio;
mod labels;
#[cfg(feature = "plot")]
mod plot;
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
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Point {
    pub level: String,
    pub drives: usize,
    pub state: String,
    pub workload: Workload,
    pub bs_bytes: u64,
    pub jobs: usize,
    pub iodepth: usize,
    pub value: f64,
    pub unit: String,
    pub raw_value: f64,
    pub ratio: f64,
    /// What the ratio can be at best: the data share of each stripe for writes, 1 for reads.
    pub ideal_ratio: f64,
    pub cpu_seconds_per_gb: f64,
    pub raw_cpu_seconds_per_gb: f64,
    /// "fio" or "millrace" (the bench's own reader), for the raw row.
    pub raw_by: String,
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
    /// Requests in flight per job. The engine's API is synchronous, so a job at depth Q is Q
    /// threads with one request each: J jobs at depth Q keep J x Q requests in flight, as fio's
    /// numjobs=J iodepth=Q does.
    pub iodepth: Vec<usize>,
    /// Request sizes; empty: 1 MiB sequential (whole full stripes), 4 KiB random. Sequential
    /// writes round up to whole full stripes.
    pub bs: Vec<u64>,
    pub degraded: Vec<usize>,
    pub seconds: f64,
    /// Also measure a rebuild: its rate idle and under load, and the workloads while it runs.
    pub rebuild: bool,
}

/// Request sizes of one workload, deduplicated in the order asked.
fn sizes_for(setup: &Setup, opts: &Options, w: Workload) -> Vec<u64> {
    let fs = setup.geo.full_stripe_bytes();
    let asked: Vec<Option<u64>> = if opts.bs.is_empty() {
        vec![None]
    } else {
        opts.bs.iter().map(|&b| Some(b)).collect()
    };
    let mut out: Vec<u64> = Vec::new();
    for b in asked {
        let size = match (w, b) {
            // Sequential writes go in whole full stripes, as aligned clients send them.
            (Workload::SeqWrite, b) => b.unwrap_or(1 << 20).div_ceil(fs) * fs,
            (_, Some(b)) => b,
            // Sequential reads too, by default: the size the pool reports as its preferred I/O.
            (w, None) if w.sequential() => (1u64 << 20).div_ceil(fs) * fs,
            _ => 4096,
        };
        if !out.contains(&size) {
            out.push(size);
        }
    }
    out
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

/// The workloads of a named suite: seq, rand, mixed or all.
pub fn suite(name: &str) -> Result<Vec<Workload>, String> {
    Ok(match name {
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
        other => {
            return Err(format!(
                "unknown suite '{other}': use seq, rand, mixed or all"
            ))
        }
    })
}

impl Options {
    /// Refuses what the bench cannot run on this machine, with a sentence for each case.
    pub fn check(&self) -> Result<(), String> {
        let (jobs, depth) = (&self.jobs, &self.iodepth);
        if jobs.is_empty() || jobs.contains(&0) || jobs.iter().any(|&j| j > 256) {
            return Err("jobs takes job counts from 1 to 256, like 1,4,16".into());
        }
        if depth.is_empty() || depth.contains(&0) || depth.iter().any(|&q| q > 256) {
            return Err("iodepth takes depths from 1 to 256, like 1,4,16,64".into());
        }
        let most = jobs.iter().max().unwrap() * depth.iter().max().unwrap();
        if most > 2048 {
            return Err(format!("jobs times iodepth asks for {most} requests in flight; each is a thread here, and 2048 is the most this bench runs"));
        }
        if self
            .bs
            .iter()
            .any(|&b| b == 0 || b % 512 != 0 || b > 1 << 30)
        {
            return Err(
                "bs takes sizes that are whole multiples of 512 bytes, up to 1G, like 128k,1M,4M"
                    .into(),
            );
        }
        if !(self.seconds > 0.0 && self.seconds <= 600.0) {
            return Err("seconds must be above 0 and at most 600".into());
        }
        if self.workloads.is_empty() {
            return Err("there is no workload to run".into());
        }
        let lists = [
            ("jobs", self.jobs.len()),
            ("iodepth", self.iodepth.len()),
            ("bs", self.bs.len()),
            ("degraded", self.degraded.len()),
        ];
        if let Some((name, n)) = lists.iter().find(|(_, n)| *n > MAX_LIST) {
            return Err(format!(
                "{name} lists {n} values; a run takes at most {MAX_LIST} of each"
            ));
        }
        if self.degraded.iter().any(|&d| d > 64) {
            return Err("degraded takes counts of failed drives from 0 to 64, like 0,1,2".into());
        }
        Ok(())
    }

    /// The points this run measures (each takes `seconds`, and its raw row as long again).
    pub fn points(&self) -> usize {
        self.workloads.len()
            * self.bs.len().max(1)
            * self.jobs.len()
            * self.iodepth.len()
            * (self.degraded.len() + 1)
    }

    /// The most memory the run's request buffers can hold at once: each request in flight
    /// has a buffer of its size, and the engine may hold as much again (parity, reconstructed
    /// strips), in whole full stripes. `None` when it does not even fit in 64 bits.
    pub fn memory_bytes(&self, setup: &Setup) -> Option<u64> {
        let fs = setup.geo.full_stripe_bytes().max(1);
        let in_flight =
            (*self.jobs.iter().max()? as u64).checked_mul(*self.iodepth.iter().max()? as u64)?;
        let largest = self
            .workloads
            .iter()
            .flat_map(|&w| sizes_for(setup, self, w))
            .max()?;
        let per = largest
            .checked_next_multiple_of(fs)?
            .checked_mul(2)?
            .checked_add(fs)?;
        in_flight.checked_mul(per)
    }
}

/// The most values each of a run's lists (jobs, iodepth, bs, degraded) may hold.
pub const MAX_LIST: usize = 16;

/// The setup of a simulated pool: RAM drives capped as `spec` says, with the metadata area a
/// real drive of that size would get (journal room included).
pub fn sim_setup(
    spec: &sim::SimSpec,
    level: millrace_array::Level,
    group: Option<usize>,
    strip: u64,
) -> Result<Setup, String> {
    let data_offset = 64 << 20;
    let geo = Geometry::new(level, spec.drives, group, strip, spec.size - data_offset)?;
    Ok(Setup {
        geo,
        data_offset,
        drives: sim_drives(spec),
        files: None,
        simulated: true,
    })
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
    let sizes: Vec<(Workload, u64)> = opts
        .workloads
        .iter()
        .flat_map(|&w| sizes_for(setup, opts, w).into_iter().map(move |b| (w, b)))
        .collect();
    let total = sizes.len() * opts.jobs.len() * opts.iodepth.len() * (states.len() + 1);
    let mut done = 0;
    let mut points = Vec::new();
    let raw_target = run::RawTarget {
        drives: setup.drives.clone(),
        data_offset: setup.data_offset,
        member_bytes: geo.member_data_bytes,
        simulated: setup.simulated,
    };
    let use_fio = setup.files.is_some() && fio::available();
    for &(w, bs) in &sizes {
        let unit = if w.sequential() { "GB/s" } else { "IOPS" };
        let value = |m: &run::Measured| if w.sequential() { m.gbps() } else { m.iops() };
        let ideal = if w.writes() && w.sequential() {
            geo.data_cols() as f64 / geo.members as f64
        } else {
            1.0
        };
        for &jobs in &opts.jobs {
            for &qd in &opts.iodepth {
                let label = format!(
                    "{} {} {}",
                    w.name(),
                    report::size(bs),
                    report::jobs(jobs, qd)
                );
                progress(format!("{label} raw drives"), done, total);
                let raw = raw_point(setup, &raw_target, use_fio, w, bs, jobs, qd, opts.seconds)?;
                let (raw, raw_by) = raw;
                done += 1;
                for (failed, set) in &states {
                    progress(format!("{label} {}", state_name(*failed)), done, total);
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
                        jobs * qd,
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
                        iodepth: qd,
                        value: v,
                        unit: unit.to_string(),
                        raw_value: rv,
                        ratio: if rv > 0.0 { v / rv } else { 0.0 },
                        ideal_ratio: ideal,
                        cpu_seconds_per_gb: m.cpu_per_gb(),
                        raw_cpu_seconds_per_gb: raw.cpu_per_gb(),
                        raw_by: raw_by.to_string(),
                    });
                    done += 1;
                }
            }
        }
    }
    if opts.rebuild {
        progress("rebuild rate, idle and under reads".into(), done, total);
        add_rebuild(setup, opts, &mut points)?;
    }
    Ok(points)
}

/// The rebuild's points; reads while rebuilding compare with the same drives' raw reads, as
/// the other states do.
fn add_rebuild(setup: &Setup, opts: &Options, points: &mut Vec<Point>) -> Result<(), String> {
    measure_rebuild(setup, opts, points)?;
    let raw = points
        .iter()
        .find(|p| p.workload == Workload::SeqRead && p.state != "rebuilding" && p.raw_value > 0.0)
        .map(|p| p.raw_value);
    if let (Some(raw), Some(p)) = (raw, points.iter_mut().find(|p| p.state == "rebuilding")) {
        p.raw_value = raw;
        p.ratio = p.value / raw;
    }
    Ok(())
}

/// The raw drives' aggregate for one point: every drive busy (two jobs per drive at least, as
/// every drive of the array is busy), sequential requests of 1 MiB (or a strip, if larger; never
/// more than the array's request): what the drives can do, not what the engine happens to ask.
#[allow(clippy::too_many_arguments)]
fn raw_point(
    setup: &Setup,
    raw_target: &run::RawTarget,
    use_fio: bool,
    w: Workload,
    bs: u64,
    jobs: usize,
    qd: usize,
    seconds: f64,
) -> Result<(run::Measured, &'static str), String> {
    let geo = setup.geo;
    let raw_bs = if w.sequential() {
        bs.min(geo.strip.max(1 << 20))
    } else {
        bs
    };
    match (&setup.files, use_fio) {
        (Some(files), true) => Ok((
            fio::raw(
                files,
                setup.data_offset,
                geo.member_data_bytes,
                w,
                raw_bs,
                jobs.max(2 * geo.members),
                qd,
                seconds,
            )?,
            "fio",
        )),
        _ => Ok((
            run::run(
                raw_target,
                w,
                raw_bs,
                (jobs * qd).max(2 * geo.members),
                seconds,
            )
            .map_err(|e| e.to_string())?,
            "millrace",
        )),
    }
}

/// Rebuilds member 0 of a private array from row 0 for up to `secs` seconds (or until `stop`),
/// `batch` rows at a time; returns bytes written to the rebuilt member per second.
fn rebuild_rate(
    array: &Array,
    secs: f64,
    stop: &std::sync::atomic::AtomicBool,
    batch: u64,
) -> Result<f64, String> {
    let t0 = std::time::Instant::now();
    // The engine's pipelined rebuild (windows read, computed and written at once).
    let rows = array
        .rebuild_pipelined(0, batch, |_| {
            let more = t0.elapsed().as_secs_f64() < secs
                && !stop.load(std::sync::atomic::Ordering::Relaxed);
            if more {
                batch
            } else {
                0
            }
        })
        .map_err(|e| e.to_string())?;
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
    // Idle at the batch size `Pool::rebuild` grows to without clients, under load at the one
    // it starts from (it shrinks further while clients keep working).
    let idle_array = rebuilding_array(setup);
    let (_, first, idle_rows) = idle_array.rebuild_batch_bounds();
    let idle = rebuild_rate(&idle_array, opts.seconds, &never, idle_rows)?;
    let loaded_array = rebuilding_array(setup);
    let stop = AtomicBool::new(false);
    let jobs = opts.jobs.iter().copied().max().unwrap_or(4);
    let bs = (1u64 << 20).div_ceil(geo.full_stripe_bytes()) * geo.full_stripe_bytes();
    let (loaded, reads) = std::thread::scope(|s| {
        let h = s.spawn(|| rebuild_rate(&loaded_array, opts.seconds * 10.0, &stop, first));
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
            unit: "GB/s".into(),
            raw_value: raw_rate / 1e9,
            ratio: rate / raw_rate,
            ideal_ratio: 1.0,
            cpu_seconds_per_gb: 0.0,
            raw_cpu_seconds_per_gb: 0.0,
            raw_by: "millrace".into(),
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
        unit: "GB/s".into(),
        raw_value: 0.0,
        ratio: 0.0,
        ideal_ratio: 1.0,
        cpu_seconds_per_gb: reads.cpu_per_gb(),
        raw_cpu_seconds_per_gb: 0.0,
        raw_by: "millrace".into(),
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

    fn sim_setup(level: millrace_array::Level, spec: &str) -> Setup {
        let spec: sim::SimSpec = spec.parse().unwrap();
        let geo = Geometry::new(level, spec.drives, None, 65536, 1 << 30).unwrap();
        Setup {
            geo,
            data_offset: 1 << 20,
            drives: sim_drives(&spec),
            files: None,
            simulated: true,
        }
    }

    fn opts(workloads: Vec<Workload>, degraded: Vec<usize>, seconds: f64) -> Options {
        Options {
            workloads,
            jobs: vec![2],
            iodepth: vec![1],
            bs: Vec::new(),
            degraded,
            seconds,
            rebuild: false,
        }
    }

    const FIELDS: [&str; 11] = [
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
    ];

    #[test]
    fn a_two_point_run_is_quick_and_has_ratios() {
        let setup = sim_setup(millrace_array::Level::Raid6, "6x2G");
        let t = std::time::Instant::now();
        let pts = run_suite(
            &setup,
            &opts(vec![Workload::SeqRead], vec![0, 1], 0.05),
            &mut |_, _, _| {},
        )
        .unwrap();
        assert_eq!(pts.len(), 2);
        for p in &pts {
            assert!(p.value > 0.0 && p.raw_value > 0.0 && p.ratio > 0.0, "{p:?}");
            assert_eq!(p.raw_by, "millrace");
        }
        // Three runs of 0.05 s: generous, so a loaded machine does not fail it.
        assert!(t.elapsed().as_secs_f64() < 5.0);
    }

    #[test]
    fn json_has_the_fields_scripts_use() {
        let setup = sim_setup(millrace_array::Level::Raid5, "4x2G");
        let mut o = opts(vec![Workload::RandRead], vec![0], 0.03);
        o.iodepth = vec![1, 4];
        let pts = run_suite(&setup, &o, &mut |_, _, _| {}).unwrap();
        let v: serde_json::Value = serde_json::from_str(&report::json(&pts)).unwrap();
        let results = v["results"].as_array().expect("a list named results");
        assert_eq!(results.len(), 2);
        for r in results {
            for k in FIELDS {
                assert!(r.get(k).is_some(), "JSON lacks {k}: {r}");
            }
            assert_eq!(r["workload"], "rand_read");
            assert_eq!(r["unit"], "IOPS");
            assert_eq!(r["bs_bytes"], 4096);
        }
        assert_eq!(results[1]["iodepth"], 4);
    }

    #[test]
    fn the_table_has_a_raw_row_and_a_row_per_state() {
        let setup = sim_setup(millrace_array::Level::Raid6, "6x2G");
        let mut o = opts(
            vec![Workload::SeqRead, Workload::SeqWrite],
            vec![0, 2],
            0.03,
        );
        o.jobs = vec![1, 2];
        let pts = run_suite(&setup, &o, &mut |_, _, _| {}).unwrap();
        let t = report::table(&pts);
        // A block per workload: a title, the job counts, raw drives, healthy, 2 failed.
        let blocks: Vec<&str> = t.split("\n\n").collect();
        assert_eq!(blocks.len(), 2, "{t}");
        for b in blocks {
            let lines: Vec<&str> = b.trim().lines().collect();
            assert!(lines[0].starts_with("raid6 seq "), "{t}");
            assert!(lines[1].starts_with("numjobs") && lines[1].split_whitespace().count() == 3);
            assert!(lines[2].starts_with("raw drives"));
            assert!(lines[3].starts_with("healthy") && lines[3].contains('%'));
            assert!(lines[4].starts_with("2 failed"));
        }
        assert!(t.contains("at most 67% of raw"), "{t}");
    }

    #[test]
    fn sizes_round_sequential_writes_to_full_stripes() {
        let setup = sim_setup(millrace_array::Level::Raid6, "6x2G");
        let mut o = opts(vec![], vec![0], 0.1);
        assert_eq!(sizes_for(&setup, &o, Workload::SeqRead), vec![1 << 20]);
        assert_eq!(sizes_for(&setup, &o, Workload::RandRead), vec![4096]);
        o.bs = vec![128 << 10, 1 << 20, 4 << 20];
        assert_eq!(
            sizes_for(&setup, &o, Workload::SeqRead),
            vec![128 << 10, 1 << 20, 4 << 20]
        );
        // Full stripe: 4 data x 64 KiB.
        assert_eq!(
            sizes_for(&setup, &o, Workload::SeqWrite),
            vec![256 << 10, 1 << 20, 4 << 20]
        );
    }

    #[test]
    fn a_rebuild_is_measured_with_reads_beside_it() {
        let setup = sim_setup(millrace_array::Level::Raid6, "6x2G");
        let mut o = opts(vec![Workload::SeqRead], vec![0], 0.05);
        o.rebuild = true;
        let pts = run_suite(&setup, &o, &mut |_, _, _| {}).unwrap();
        // The healthy point, two rebuild rates and the read rate while rebuilding.
        assert_eq!(pts.len(), 4, "{pts:?}");
        for p in &pts {
            assert!(p.value > 0.0 && p.ratio > 0.0, "{p:?}");
        }
        assert!(pts.iter().any(|p| p.state == "rebuilding"));
    }

    #[test]
    fn failures_spread_within_tolerance() {
        let geo = Geometry::new(millrace_array::Level::Raid60, 8, Some(4), 65536, 1 << 20).unwrap();
        assert_eq!(failed_set(&geo, 2), Some(vec![0, 4]));
        assert_eq!(failed_set(&geo, 4), Some(vec![0, 4, 1, 5]));
        assert_eq!(failed_set(&geo, 5), None);
        let geo = Geometry::new(millrace_array::Level::Raid0, 4, None, 65536, 1 << 20).unwrap();
        assert_eq!(failed_set(&geo, 1), None);
    }
}
