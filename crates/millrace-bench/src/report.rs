//! Results for people (a table like the vendors' and a PNG plot) and for scripts (JSON).

use std::collections::BTreeMap;
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
    let mut by_w: BTreeMap<(String, u64), Vec<&Point>> = BTreeMap::new();
    for p in points {
        by_w.entry((p.workload.name().to_string(), p.bs_bytes))
            .or_default()
            .push(p);
    }
    for ((w, bs), pts) in by_w {
        let unit = pts[0].unit;
        let mut jobs: Vec<usize> = pts.iter().map(|p| p.jobs).collect();
        jobs.sort_unstable();
        jobs.dedup();
        out += &format!(
            "\n{} {} {}, {} drives, {} (raw row by {})\n",
            pts[0].level,
            w,
            size(bs),
            pts[0].drives,
            unit,
            pts[0].raw_by
        );
        out += &format!("{:<12}", "numjobs");
        for j in &jobs {
            out += &format!("{:>18}", j);
        }
        out += "\n";
        out += &format!("{:<12}", "raw drives");
        for j in &jobs {
            let v = pts
                .iter()
                .find(|p| p.jobs == *j)
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
            for j in &jobs {
                match pts.iter().find(|p| p.jobs == *j && p.state == s) {
                    Some(p) => {
                        out += &format!(
                            "{:>18}",
                            format!("{} ({:.0}%)", fmt(p.value, unit), p.ratio * 100.0)
                        )
                    }
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

fn load_font() -> Result<(), String> {
    // plotters draws text with a font we hand it; Debian's DejaVu (fonts-dejavu-core) is it.
    for p in [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ] {
        if let Ok(bytes) = std::fs::read(p) {
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
                .map_err(|_| format!("the font {p} could not be loaded"));
        }
    }
    Err(
        "no DejaVu font found for the plot's text: install the Debian package fonts-dejavu-core"
            .into(),
    )
}

/// A PNG with one panel per workload: value against numjobs, one line per state and a dashed
/// one for the raw drives.
pub fn plot(points: &[Point], path: &Path) -> Result<(), String> {
    load_font()?;
    let mut by_w: BTreeMap<(String, u64), Vec<&Point>> = BTreeMap::new();
    for p in points {
        by_w.entry((p.workload.name().to_string(), p.bs_bytes))
            .or_default()
            .push(p);
    }
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
        let mut jobs: Vec<usize> = pts.iter().map(|p| p.jobs).collect();
        jobs.sort_unstable();
        jobs.dedup();
        let ymax = pts
            .iter()
            .map(|p| p.value.max(p.raw_value))
            .fold(0.0, f64::max)
            * 1.15;
        let xs = |j: usize| jobs.iter().position(|x| *x == j).unwrap_or(0) as f64;
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
            .y_label_area_size(60)
            .build_cartesian_2d(-0.3f64..(jobs.len() as f64 - 0.7), 0f64..ymax.max(1e-9))
            .map_err(|e| e.to_string())?;
        let labels = jobs.clone();
        chart
            .configure_mesh()
            .x_desc("numjobs")
            .y_desc(unit)
            .x_labels(jobs.len())
            .x_label_formatter(&|x| {
                labels
                    .get(x.round() as usize)
                    .map(|j| j.to_string())
                    .unwrap_or_default()
            })
            .draw()
            .map_err(|e| e.to_string())?;
        let raw: Vec<(f64, f64)> = jobs
            .iter()
            .filter_map(|j| {
                pts.iter()
                    .find(|p| p.jobs == *j)
                    .map(|p| (xs(*j), p.raw_value))
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
            let line: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.state == *s)
                .map(|p| (xs(p.jobs), p.value))
                .collect();
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
