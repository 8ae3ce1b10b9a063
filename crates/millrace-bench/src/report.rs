//! Results for people (a table like the vendors' and a PNG plot) and for scripts (JSON).

use std::path::Path;

use plotters::prelude::*;

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

/// The results for scripts: `{"results": [...]}`, one object per point.
pub fn json(points: &[Point]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "results": points }))
        .expect("points serialise")
}

/// Points grouped by (workload, request size), in the order they were measured.
fn by_workload(points: &[Point]) -> Vec<((String, u64), Vec<&Point>)> {
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
fn columns(pts: &[&Point]) -> Vec<(usize, usize)> {
    let mut cols: Vec<(usize, usize)> = pts.iter().map(|p| (p.jobs, p.iodepth)).collect();
    cols.sort_unstable_by_key(|&(j, q)| (j * q, j));
    cols.dedup();
    cols
}

fn fmt(v: f64, unit: &str) -> String {
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

/// One block per workload: a row for the raw drives and one per state, a column per job count,
/// each cell the value and its ratio to the raw drives.
pub fn table(points: &[Point]) -> String {
    let mut out = String::new();
    for ((w, bs), pts) in by_workload(points) {
        let unit = pts[0].unit;
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

/// DejaVu Sans cut down to ASCII (10 KiB; fonts/LICENSE): the plot's text needs no system font,
/// so plots work headless and in minimal containers alike.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans-ascii.ttf");

fn load_font() -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the plot's built-in font could not be loaded".to_string())
}

/// A PNG with one panel per workload: value against numjobs, one line per state and a dashed
/// one for the raw drives.
pub fn plot(points: &[Point], path: &Path) -> Result<(), String> {
    load_font()?;
    let by_w = by_workload(points);
    let n = by_w.len().max(1);
    let root = BitMapBackend::new(path, (640 * n.min(3) as u32, 420 * n.div_ceil(3) as u32))
        .into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((n.div_ceil(3), n.min(3)));
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
    ];
    for (((w, bs), pts), area) in by_w.iter().zip(panels.iter()) {
        let unit = pts[0].unit;
        let cols = columns(pts);
        let deep = cols.iter().any(|c| c.1 > 1);
        let ymax = pts
            .iter()
            .map(|p| p.value.max(p.raw_value))
            .fold(0.0, f64::max)
            * 1.15;
        let xs = |p: &Point| {
            cols.iter()
                .position(|c| *c == (p.jobs, p.iodepth))
                .unwrap_or(0) as f64
        };
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{} {} {} ({} drives)",
                    pts[0].level,
                    w,
                    size(*bs),
                    pts[0].drives
                ),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.3f64..(cols.len() as f64 - 0.7), 0f64..ymax.max(1e-9))
            .map_err(|e| e.to_string())?;
        let labels = cols.clone();
        chart
            .configure_mesh()
            .x_desc(if deep {
                "jobs x requests in flight per job"
            } else {
                "numjobs"
            })
            .y_desc(unit)
            .y_label_formatter(&|v| fmt(*v, unit))
            .x_labels(cols.len())
            .x_label_formatter(&|x| {
                labels
                    .get(x.round() as usize)
                    .map(|&(j, q)| jobs(j, q))
                    .unwrap_or_default()
            })
            .draw()
            .map_err(|e| e.to_string())?;
        let raw: Vec<(f64, f64)> = cols
            .iter()
            .filter_map(|c| {
                pts.iter()
                    .find(|p| (p.jobs, p.iodepth) == *c && p.raw_value > 0.0)
                    .map(|p| (xs(p), p.raw_value))
            })
            .collect();
        chart
            .draw_series(DashedLineSeries::new(
                raw.clone(),
                6,
                4,
                BLACK.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label("raw drives")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
        let mut states: Vec<&str> = Vec::new();
        for p in pts {
            if !states.contains(&p.state.as_str()) {
                states.push(&p.state);
            }
        }
        for (i, s) in states.iter().enumerate() {
            let c = colors[i % colors.len()];
            let mut line: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.state == *s)
                .map(|p| (xs(p), p.value))
                .collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(*s)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c));
            chart
                .draw_series(
                    line.iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, c.filled())),
                )
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Workload;

    fn point(state: &str, jobs: usize, iodepth: usize, value: f64) -> Point {
        Point {
            level: "raid6".into(),
            drives: 6,
            state: state.into(),
            workload: Workload::RandRead,
            bs_bytes: 4096,
            jobs,
            iodepth,
            value,
            unit: "IOPS",
            raw_value: 2.0 * value,
            ratio: 0.5,
            ideal_ratio: 1.0,
            cpu_seconds_per_gb: 0.1,
            raw_cpu_seconds_per_gb: 0.1,
            raw_by: "millrace",
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

    #[test]
    fn the_plot_is_a_png_with_text() {
        let pts = vec![point("healthy", 1, 1, 1e4), point("healthy", 4, 1, 4e4)];
        let dir = std::env::temp_dir().join(format!("millrace-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.png");
        plot(&pts, &f).unwrap();
        let bytes = std::fs::read(&f).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
