//! The PNG plot of a run (behind the `plot` feature: plotters and its font are only built where
//! a plot is drawn, so the server, which only tables and JSON, does without them).

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::labels::{by_workload, columns, fmt, jobs, size};
use crate::Point;

/// DejaVu Sans cut down to ASCII (10 KiB; fonts/LICENSE): the plot's text needs no system font,
/// so plots work headless and in minimal containers alike.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans-ascii.ttf");

fn load_font() -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the plot's built-in font could not be loaded".to_string())
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// One workload's panel: value against the columns (jobs, depth), a line per state and a
/// dashed one for the raw drives.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    w: &str,
    bs: u64,
    pts: &[&Point],
) -> Result<(), String> {
    let unit = pts[0].unit.as_str();
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
                size(bs),
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
    draw_states(&mut chart, pts, &xs)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One line per state (healthy, degraded...), in the order the points name them.
fn draw_states(
    chart: &mut Chart<'_, '_>,
    pts: &[&Point],
    xs: &dyn Fn(&Point) -> f64,
) -> Result<(), String> {
    let mut states: Vec<&str> = Vec::new();
    for p in pts {
        if !states.contains(&p.state.as_str()) {
            states.push(&p.state);
        }
    }
    for (i, s) in states.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
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
    Ok(())
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
    for (((w, bs), pts), area) in by_w.iter().zip(panels.iter()) {
        panel(area, w, *bs, pts)?;
    }
    root.present()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::point;

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
