//! How results are labelled and grouped, shared by the table (`report`) and the plot (`plot`).

use crate::Point;

pub fn size(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1024 && b.is_multiple_of(1024) {
        format!("{}K", b >> 10)
    } else {
        format!("{b}B")
    }
}

/// A column's name: the job count, and the depth per job where it is above 1 ("16x4").
pub fn jobs(jobs: usize, iodepth: usize) -> String {
    if iodepth > 1 {
        format!("{jobs}x{iodepth}")
    } else {
        jobs.to_string()
    }
}

/// Points grouped by (workload, request size), in the order they were measured.
pub(crate) fn by_workload(points: &[Point]) -> Vec<((String, u64), Vec<&Point>)> {
    let mut out: Vec<((String, u64), Vec<&Point>)> = Vec::new();
    for p in points {
        let key = (p.workload.name().to_string(), p.bs_bytes);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(p),
            None => out.push((key, vec![p])),
        }
    }
    out
}

/// Distinct (jobs, iodepth) columns, sorted by requests in flight.
pub(crate) fn columns(pts: &[&Point]) -> Vec<(usize, usize)> {
    let mut cols: Vec<(usize, usize)> = pts.iter().map(|p| (p.jobs, p.iodepth)).collect();
    cols.sort_unstable_by_key(|&(j, q)| (j * q, j));
    cols.dedup();
    cols
}

pub(crate) fn fmt(v: f64, unit: &str) -> String {
    if unit == "IOPS" {
        if v >= 1e6 {
            format!("{:.2}M", v / 1e6)
        } else {
            format!("{:.1}k", v / 1e3)
        }
    } else {
        format!("{v:.2}")
    }
}
