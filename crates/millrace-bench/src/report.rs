//! Results for people (a table like the vendors' and a PNG plot) and for scripts (JSON).

use crate::labels::{by_workload, columns, fmt};
pub use crate::labels::{jobs, size};
use crate::Point;

#[cfg(feature = "plot")]
pub use crate::plot::plot;

/// The results for scripts: `{"results": [...]}`, one object per point.
pub fn json(points: &[Point]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "results": points }))
        .expect("points serialise")
}

/// One block per workload: a row for the raw drives and one per state, a column per job count,
/// each cell the value and its ratio to the raw drives.
pub fn table(points: &[Point]) -> String {
    let mut out = String::new();
    for ((w, bs), pts) in by_workload(points) {
        let unit = pts[0].unit.as_str();
        let cols = columns(&pts);
        let deep = cols.iter().any(|c| c.1 > 1);
        out += &format!(
            "\n{} {} {}, {} drives, {} (raw row by {})\n",
            pts[0].level,
            w,
            size(bs),
            pts[0].drives,
            unit,
            pts[0].raw_by
        );
        out += &format!("{:<12}", if deep { "jobs x qd" } else { "numjobs" });
        for &(j, q) in &cols {
            out += &format!("{:>18}", jobs(j, q));
        }
        out += "\n";
        out += &format!("{:<12}", "raw drives");
        for &(j, q) in &cols {
            let v = pts
                .iter()
                .find(|p| p.jobs == j && p.iodepth == q)
                .map(|p| p.raw_value)
                .unwrap_or(0.0);
            out += &format!("{:>18}", fmt(v, unit));
        }
        out += "\n";
        let mut states: Vec<&str> = Vec::new();
        for p in &pts {
            if !states.contains(&p.state.as_str()) {
                states.push(&p.state);
            }
        }
        for s in states {
            out += &format!("{s:<12}");
            for &(j, q) in &cols {
                match pts
                    .iter()
                    .find(|p| p.jobs == j && p.iodepth == q && p.state == s)
                {
                    Some(p) if p.raw_value > 0.0 => {
                        out += &format!(
                            "{:>18}",
                            format!("{} ({:.0}%)", fmt(p.value, unit), p.ratio * 100.0)
                        )
                    }
                    Some(p) => out += &format!("{:>18}", fmt(p.value, unit)),
                    None => out += &format!("{:>18}", "-"),
                }
            }
            out += "\n";
        }
        if let Some(p) = pts.iter().find(|p| p.ideal_ratio < 1.0) {
            out += &format!(
                "(a write can reach at most {:.0}% of raw: the data share of each stripe)\n",
                p.ideal_ratio * 100.0
            );
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Workload;

    pub(crate) fn point(state: &str, jobs: usize, iodepth: usize, value: f64) -> Point {
        Point {
            level: "raid6".into(),
            drives: 6,
            state: state.into(),
            workload: Workload::RandRead,
            bs_bytes: 4096,
            jobs,
            iodepth,
            value,
            unit: "IOPS".into(),
            raw_value: 2.0 * value,
            ratio: 0.5,
            ideal_ratio: 1.0,
            cpu_seconds_per_gb: 0.1,
            raw_cpu_seconds_per_gb: 0.1,
            raw_by: "millrace".into(),
        }
    }

    #[test]
    fn depths_make_columns_sorted_by_requests_in_flight() {
        let pts = vec![
            point("healthy", 4, 16, 3e5),
            point("healthy", 1, 1, 1e4),
            point("1 failed", 4, 16, 2e5),
            point("healthy", 4, 1, 4e4),
        ];
        let t = table(&pts);
        let lines: Vec<&str> = t.trim().lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["jobs", "x", "qd", "1", "4", "4x16"]
        );
        assert!(lines[3].starts_with("healthy") && lines[3].contains("300.0k (50%)"));
        assert!(lines[4].starts_with("1 failed") && lines[4].contains('-'));
    }
}
