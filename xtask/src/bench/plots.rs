// SPDX-License-Identifier: Apache-2.0
//! PNG line plots of benchmark results against the service count N, both axes on a log
//! scale, one panel per quantity, one line per mode (the median) with a bar over the
//! range of its reps. A mode has the same colour in every figure. Ticks sit at 1-2-5
//! values chosen here (plotters' own log ticks start at the first power of ten inside the
//! range, so a range within one decade got a single tick). Text is drawn with the system's
//! DejaVu Sans (Debian's fonts-dejavu-core, installed by `cargo xtask setup`).

use std::{path::Path, sync::OnceLock};

use anyhow::{Context as _, anyhow, bail};
use plotters::{
    coord::{Shift, combinators::WithKeyPoints},
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
    /// (N, median).
    pub points: Vec<(f64, f64)>,
    /// (N, lowest rep, highest rep): drawn as a bar where the reps differ.
    pub spread: Vec<(f64, f64, f64)>,
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

/// A tick label without needless digits: 100k, 2k, 500, 2.5, 0.05.
pub fn tick_label(v: f64) -> String {
    let trimmed = |v: f64| {
        let text = format!("{v:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    match v.abs() {
        a if a >= 1e6 => format!("{}M", trimmed(v / 1e6)),
        a if a >= 1e3 => format!("{}k", trimmed(v / 1e3)),
        _ => trimmed(v),
    }
}

/// Tick values between `low` and `high` (both > 0) for a log axis: 1-2-5 in each decade,
/// thinned to powers of ten when that gives too many and filled in with every integer
/// multiple when a narrow range would get fewer than three.
pub fn log_ticks(low: f64, high: f64) -> Vec<f64> {
    const MOST: usize = 8;
    let within = |mantissas: &[f64]| -> Vec<f64> {
        if !(low > 0.0 && high > low && low.is_finite() && high.is_finite()) {
            return Vec::new();
        }
        let mut ticks = Vec::new();
        let mut decade = 10f64.powf(low.log10().floor());
        while decade <= high {
            for m in mantissas {
                // Rounded so that 0.1 * 3 prints as 0.3, not 0.30000000000000004.
                let v = round_sig(decade * m);
                if v >= low && v <= high {
                    ticks.push(v);
                }
            }
            decade *= 10.0;
        }
        ticks
    };
    let one_two_five = within(&[1.0, 2.0, 5.0]);
    if one_two_five.len() > MOST {
        let decades = within(&[1.0]);
        if decades.len() > MOST {
            return decades.into_iter().step_by(2).collect();
        }
        return decades;
    }
    if one_two_five.len() < 3 {
        return within(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    }
    one_two_five
}

fn round_sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powf(6.0 - v.abs().log10().floor());
    (v * scale).round() / scale
}

type LogAxis = WithKeyPoints<LogCoord<f64>>;
type LogGrid = Cartesian2d<LogAxis, LogAxis>;

/// Each mode's colour, the same in every figure: the proxy's own modes in cool colours,
/// the baselines in warm ones, `direct` in black and `direct-ct` in dark grey.
const MODE_COLORS: [(&str, RGBColor); 12] = [
    ("direct", RGBColor(0, 0, 0)),
    // The dataplane suite's noise floor (conntrack and NAT hooks on, both routes direct).
    ("direct-ct", RGBColor(64, 64, 64)),
    ("ebpf", RGBColor(31, 119, 180)),
    ("iptables", RGBColor(44, 160, 44)),
    // The iptables proxier over iptables-legacy, as the latency and memory suites name it.
    ("iptables-legacy", RGBColor(44, 160, 44)),
    ("ipvs-fallback", RGBColor(23, 190, 207)),
    ("nftables", RGBColor(148, 103, 189)),
    ("kube-proxy-iptables", RGBColor(214, 39, 40)),
    ("kube-proxy-iptables@random", RGBColor(255, 127, 14)),
    ("kube-proxy-nft", RGBColor(140, 86, 75)),
    ("clusterip", RGBColor(31, 119, 180)),
    ("kube-proxy-nft@random", RGBColor(227, 119, 194)),
];

/// Modes outside the table: a grey picked by the name, so it too stays the same between
/// figures.
const OTHER_COLORS: [RGBColor; 3] = [
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(90, 90, 90),
];

pub fn mode_color(mode: &str) -> RGBColor {
    MODE_COLORS
        .iter()
        .find(|(name, _)| *name == mode)
        .map(|(_, color)| *color)
        .unwrap_or_else(|| {
            let hash = mode.bytes().fold(0usize, |h, b| {
                h.wrapping_mul(31).wrapping_add(usize::from(b))
            });
            OTHER_COLORS[hash % OTHER_COLORS.len()]
        })
}

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
    let points = panel.series.iter().flat_map(|s| {
        s.points.iter().copied().chain(
            s.spread
                .iter()
                .flat_map(|&(x, low, high)| [(x, low), (x, high)]),
        )
    });
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
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
    let (x_low, x_high) = ((x0 / 2.0).max(0.5), x1 * 2.0);
    // Wide enough for a tick or two beyond the data, and for a range within one decade
    // to still span several ticks.
    let (y_low, y_high) = (y0 / 1.6, y1 * 1.6);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&panel.title, ("sans-serif", 16))
        .margin(12)
        .margin_right(24)
        .x_label_area_size(36)
        .y_label_area_size(64);
    let mut chart = builder
        .build_cartesian_2d(
            (x_low..x_high)
                .log_scale()
                .with_key_points(log_ticks(x_low, x_high)),
            (y_low..y_high)
                .log_scale()
                .with_key_points(log_ticks(y_low, y_high)),
        )
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("services (N)")
        .y_desc(&panel.y_label)
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .label_style(("sans-serif", 13))
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    draw_series(&mut chart, panel)
}

fn draw_series<'b: 'a, 'a>(
    chart: &mut ChartContext<'a, BitMapBackend<'b>, LogGrid>,
    panel: &Panel,
) -> anyhow::Result<()> {
    for s in &panel.series {
        let color = mode_color(&s.label);
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
        let bars: Vec<(f64, f64, f64)> = s
            .spread
            .iter()
            .copied()
            .filter(|(x, low, high)| {
                [x, low, high].iter().all(|v| v.is_finite() && **v > 0.0) && high > low
            })
            .collect();
        let style = color.stroke_width(1);
        chart
            .draw_series(
                bars.iter()
                    .map(|&(x, low, high)| PathElement::new(vec![(x, low), (x, high)], style)),
            )
            .map_err(|e| anyhow!("{e}"))?;
        // Caps a few pixels wide at both ends (in pixels: the x axis is logarithmic).
        chart
            .draw_series(bars.iter().flat_map(|&(x, low, high)| {
                [low, high].map(|y| {
                    EmptyElement::at((x, y)) + PathElement::new(vec![(-4, 0), (4, 0)], style)
                })
            }))
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
    fn ticks_are_one_two_five_and_never_too_few_or_too_many() {
        assert_eq!(log_ticks(20.0, 180.0), vec![20.0, 50.0, 100.0]);
        assert_eq!(log_ticks(0.06, 9000.0), vec![0.1, 1.0, 10.0, 100.0, 1000.0]);
        // A narrow range gets the integer multiples.
        assert_eq!(log_ticks(25.0, 75.0), vec![30.0, 40.0, 50.0, 60.0, 70.0]);
        assert_eq!(log_ticks(0.1, 0.35), vec![0.1, 0.2, 0.3]);
        for (low, high) in [(0.01, 1e9), (1.0, 2.0), (33.0, 36.0), (0.5, 100_000.0)] {
            let ticks = log_ticks(low, high);
            assert!(ticks.len() <= 8, "{low}..{high}: {ticks:?}");
            assert!(ticks.iter().all(|t| *t >= low && *t <= high));
        }
        assert!(log_ticks(0.0, 1.0).is_empty());
        assert_eq!(tick_label(100_000.0), "100k");
        assert_eq!(tick_label(2_500.0), "2.5k");
        assert_eq!(tick_label(0.05), "0.05");
        assert_eq!(tick_label(500.0), "500");
    }

    #[test]
    fn a_mode_has_one_colour_everywhere() {
        assert_eq!(mode_color("ebpf"), mode_color("ebpf"));
        assert_ne!(mode_color("ebpf"), mode_color("kube-proxy-iptables"));
        assert_eq!(mode_color("unknown-mode"), mode_color("unknown-mode"));
    }

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
            spread: vec![(1000.0, 0.8 * k, 1.3 * k)],
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
