// SPDX-License-Identifier: Apache-2.0
//! PNG line plots of benchmark results against the service count N, both axes on a log
//! scale, one panel per quantity, one line per mode. Text is drawn with the system's DejaVu Sans
//! (Debian's fonts-dejavu-core, installed by `cargo xtask setup`).

use std::{path::Path, sync::OnceLock};

use anyhow::{Context as _, anyhow, bail};
use plotters::{
    coord::Shift,
    prelude::*,
    style::{FontStyle, register_font},
};

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// One line: a mode's values at each N.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

fn ensure_font() -> anyhow::Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let bytes = FONT_PATHS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                format!(
                    "no DejaVu Sans font ({}): install fonts-dejavu-core (cargo xtask setup)",
                    FONT_PATHS.join(", ")
                )
            })?;
        // plotters keeps registered fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| "DejaVu Sans could not be parsed".to_string())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// A tick label without needless decimals: 1000, 2.5, 0.25.
fn short(v: f64) -> String {
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

type LogGrid = Cartesian2d<LogCoord<f64>, LogCoord<f64>>;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draws `panels` side by side (two per row) into a PNG at `path`.
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> anyhow::Result<()> {
    if panels.is_empty() {
        bail!("nothing to plot for {}", path.display());
    }
    ensure_font()?;
    let columns = panels.len().min(2);
    let rows = panels.len().div_ceil(columns);
    let size = (560 * columns as u32, 60 + 420 * rows as u32);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| anyhow!("{e}"))?;
    let areas = root.split_evenly((rows, columns));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        draw_panel(area, panel).with_context(|| format!("plotting {}", panel.title))?;
    }
    root.present()
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

fn bounds(panel: &Panel) -> Option<((f64, f64), (f64, f64))> {
    let points = panel.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        if !(x.is_finite() && y.is_finite()) || y <= 0.0 || x <= 0.0 {
            continue;
        }
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    (x0 <= x1).then_some(((x0, x1), (y0, y1)))
}

fn draw_panel(area: &DrawingArea<BitMapBackend<'_>, Shift>, panel: &Panel) -> anyhow::Result<()> {
    let Some(((x0, x1), (y0, y1))) = bounds(panel) else {
        bail!("no finite values");
    };
    let x_range = (x0 / 2.0).max(0.5)..(x1 * 2.0);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&panel.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64);
    let y_range = (y0 / 2.0)..(y1 * 2.0);
    let mut chart = builder
        .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("services (N)")
        .y_desc(&panel.y_label)
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| short(*v))
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    draw_series(&mut chart, panel)
}

fn draw_series<'b: 'a, 'a>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, LogGrid>,
    panel: &Panel,
) -> anyhow::Result<()> {
    for (i, s) in panel.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0)
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png_with_log_and_linear_panels() {
        if FONT_PATHS.iter().all(|p| !Path::new(p).exists()) {
            eprintln!("SKIP plot test: no DejaVu Sans (cargo xtask setup installs it)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.png");
        let series = |label: &str, k: f64| Series {
            label: label.into(),
            points: vec![(1000.0, k), (10_000.0, 10.0 * k), (50_000.0, 50.0 * k)],
        };
        let panels = [
            Panel {
                title: "full sync".into(),
                y_label: "ms".into(),
                series: vec![series("ebpf", 1.0), series("iptables", 5.0)],
            },
            Panel {
                title: "connect p99".into(),
                y_label: "us".into(),
                series: vec![series("direct", 2.0)],
            },
        ];
        draw(&path, "test", &panels).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5_000);
        assert!(draw(&path, "empty", &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
