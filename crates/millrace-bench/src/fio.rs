//! The raw drives measured by fio, the usual peer, when it is installed: one fio run per point,
//! all member files in one job group (round robin), O_DIRECT, io_uring, at each member's data area.

use std::path::PathBuf;
use std::process::Command;

use crate::run::{Measured, Workload};

pub fn available() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[allow(clippy::too_many_arguments)]
pub fn raw(
    files: &[PathBuf],
    data_offset: u64,
    member_bytes: u64,
    workload: Workload,
    bs: u64,
    jobs: usize,
    iodepth: usize,
    secs: f64,
) -> Result<Measured, String> {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    if names.iter().any(|n| n.contains(':')) {
        return Err("fio cannot take file names with ':' in them".into());
    }
    let rw = match workload {
        Workload::SeqRead => "read",
        Workload::SeqWrite | Workload::Rebuild => "write",
        Workload::RandRead => "randread",
        Workload::RandWrite => "randwrite",
        Workload::Mixed => "randrw",
    };
    let cpu0 = children_cpu();
    let out = Command::new("fio")
        .args([
            "--output-format=json",
            "--name=raw",
            &format!("--filename={}", names.join(":")),
            "--file_service_type=roundrobin",
            &format!("--offset={data_offset}"),
            &format!("--size={}", member_bytes / bs * bs),
            &format!("--rw={rw}"),
            "--rwmixread=70",
            &format!("--bs={bs}"),
            "--direct=1",
            "--ioengine=io_uring",
            &format!("--iodepth={iodepth}"),
            &format!("--numjobs={jobs}"),
            "--group_reporting",
            "--time_based",
            &format!("--runtime={}ms", (secs * 1000.0) as u64),
        ])
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    let cpu = children_cpu() - cpu0;
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("fio's JSON output could not be read ({e})"))?;
    let job = &v["jobs"][0];
    let get = |dir: &str, k: &str| job[dir][k].as_f64().unwrap_or(0.0);
    let bytes = get("read", "io_bytes") + get("write", "io_bytes");
    let ops = get("read", "total_ios") + get("write", "total_ios");
    let ms = job["job_runtime"]
        .as_f64()
        .or_else(|| job["read"]["runtime"].as_f64())
        .unwrap_or(secs * 1000.0);
    // With group_reporting, job_runtime adds up every job's runtime.
    let seconds = (ms / 1000.0 / jobs as f64).max(1e-3);
    Ok(Measured {
        bytes: bytes as u64,
        ops: ops as u64,
        seconds,
        cpu_seconds: cpu,
    })
}
