// SPDX-License-Identifier: Apache-2.0
//! The benchmark report of `cargo xtask bench` (pure but for reading and writing files):
//! the latest run of each suite (dataplane, sync, latency, bpf, memory) is published as
//! docs/bench/<suite>.csv, and docs/benchmarks.md gets the targets with their measured
//! ratios and verdicts, a table per suite, and two plots — all regenerated from those CSVs.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use super::{
    docs::Row,
    plots::{Panel, Series},
    targets::{num, targets, verdict},
};

pub const BEGIN: &str = "<!-- BEGIN generated: report -->";
pub const END: &str = "<!-- END generated: report -->";

/// The suites of the report, in the order they run (as bench::suites::REPORT_SUITES).
pub const SUITES: [&str; 5] = ["dataplane", "sync", "latency", "bpf", "memory"];

/// The rows of one suite's latest run.
#[derive(Debug, Clone, Default)]
pub struct SuiteRows {
    pub suite: &'static str,
    pub rows: Vec<Row>,
}

/// docs/bench: the published CSVs and the plots.
pub fn docs_bench_dir(docs: &Path) -> PathBuf {
    docs.parent()
        .map_or_else(|| PathBuf::from("bench"), |d| d.join("bench"))
}

fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// A (mode, N, metric)'s value and ratio: the suite's own `median` row when it wrote one,
/// else the medians over its reps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub value: Option<f64>,
    pub ratio: Option<f64>,
}

pub fn stat(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<Stat> {
    let of: Vec<&Row> = rows
        .iter()
        .filter(|r| r.mode == mode && r.n == n && r.metric == metric)
        .collect();
    if let Some(m) = of.iter().find(|r| r.rep == "median") {
        return Some(Stat {
            value: m.value,
            ratio: m.ratio,
        });
    }
    let reps: Vec<&&Row> = of.iter().filter(|r| r.rep.parse::<u32>().is_ok()).collect();
    if reps.is_empty() {
        return None;
    }
    let mut values: Vec<f64> = reps.iter().filter_map(|r| r.value).collect();
    let mut ratios: Vec<f64> = reps.iter().filter_map(|r| r.ratio).collect();
    Some(Stat {
        value: median(&mut values),
        ratio: median(&mut ratios),
    })
}

pub(super) fn value(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<f64> {
    stat(rows, mode, n, metric).and_then(|s| s.value)
}

pub(super) fn ratio(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<f64> {
    stat(rows, mode, n, metric).and_then(|s| s.ratio)
}

/// Modes and Ns of `metric`, in the order they first appear.
fn modes_and_ns(rows: &[Row], metric: &str) -> (Vec<String>, Vec<u32>) {
    let mut modes: Vec<String> = Vec::new();
    let mut ns = BTreeSet::new();
    for r in rows.iter().filter(|r| r.metric == metric) {
        if !modes.contains(&r.mode) {
            modes.push(r.mode.clone());
        }
        ns.insert(r.n);
    }
    (modes, ns.into_iter().collect())
}

/// The rows of `suite` in `all` (none when it did not run).
pub(super) fn rows_of<'a>(all: &'a [SuiteRows], suite: &str) -> &'a [Row] {
    all.iter()
        .find(|s| s.suite == suite)
        .map_or(&[], |s| s.rows.as_slice())
}

/// A table of `metric`: a row per mode, a column per N, cells "value (ratio×)".
fn metric_table(out: &mut String, rows: &[Row], metric: &str, title: &str) {
    let (modes, ns) = modes_and_ns(rows, metric);
    if modes.is_empty() {
        return;
    }
    let unit = rows
        .iter()
        .find(|r| r.metric == metric && !r.unit.is_empty())
        .map_or(String::new(), |r| format!(" ({})", r.unit));
    let _ = writeln!(out, "\n**{title}**{unit}\n");
    let header: Vec<String> = ns.iter().map(|n| format!("N = {n}")).collect();
    let _ = writeln!(out, "| mode | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(ns.len()));
    for mode in &modes {
        let cells: Vec<String> = ns
            .iter()
            .map(|n| match stat(rows, mode, *n, metric) {
                Some(Stat {
                    value: Some(v),
                    ratio: Some(r),
                }) => format!("{} ({:.2}×)", num(v), r),
                Some(Stat { value: Some(v), .. }) => num(v),
                _ => "–".into(),
            })
            .collect();
        let _ = writeln!(out, "| {mode} | {} |", cells.join(" | "));
    }
}

fn run_line(out: &mut String, s: &SuiteRows) {
    if let Some(r) = s.rows.first() {
        let _ = writeln!(
            out,
            "\nRun {} on {} (kernel {}); rows: [docs/bench/{}.csv](bench/{}.csv).",
            r.run, r.cpu, r.kernel, s.suite, s.suite
        );
    }
}

const SYNC_STEPS: [(&str, &str); 4] = [
    ("full_sync", "cold full sync"),
    ("add_service", "add one service"),
    ("remove_endpoint", "remove one endpoint"),
    ("scale_4_to_40", "scale one service 4 → 40 endpoints"),
];

/// The generated section of docs/benchmarks.md.
pub fn render(all: &[SuiteRows]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{BEGIN}");
    let _ = writeln!(
        out,
        "<!-- generated by `cargo xtask bench` from docs/bench/*.csv; do not edit -->\n"
    );
    let _ = writeln!(out, "### Targets\n");
    let _ = writeln!(out, "| target | limit | measured | verdict | miss |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for t in targets(all) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            t.what,
            t.limit,
            t.measured,
            verdict(t.holds),
            t.miss
        );
    }
    for s in all {
        match s.suite {
            "dataplane" => {
                let _ = writeln!(
                    out,
                    "\n### Dataplane\n\nMedians over reps; in brackets the median of the paired ratios to `direct` (same rep). `@random`: the measured service at a random place in the rules, otherwise last.\n\n![connect() latency against N](bench/connect.png)"
                );
                for (metric, title) in [
                    ("conn_rate", "Connection rate"),
                    ("connect_p50", "connect() p50"),
                    ("connect_p99", "connect() p99"),
                    (
                        "rr_p50",
                        "Request/response on an established connection, p50",
                    ),
                    (
                        "rr_p99",
                        "Request/response on an established connection, p99",
                    ),
                    ("throughput", "One-stream throughput"),
                ] {
                    metric_table(&mut out, &s.rows, metric, title);
                }
            }
            "sync" => {
                let _ = writeln!(
                    out,
                    "\n### Sync\n\nMedian wall time; in brackets the median of the paired ratios to `kube-proxy-iptables` (raw `iptables-legacy-restore` of kube-proxy-shaped rules, same rep).\n\n![sync time against N](bench/sync.png)"
                );
                for (step, title) in SYNC_STEPS {
                    metric_table(&mut out, &s.rows, &format!("{step}_wall"), title);
                }
                metric_table(
                    &mut out,
                    &s.rows,
                    "full_sync_cpu",
                    "cold full sync, CPU (thread + child processes)",
                );
                metric_table(
                    &mut out,
                    &s.rows,
                    "full_sync_peak_rss",
                    "cold full sync, peak RSS (in-process: growth of the process; raw tools: their own)",
                );
            }
            "latency" => {
                let _ = writeln!(
                    out,
                    "\n### Programming latency\n\nFrom a Service's creation in the API server to the first connection through its ClusterIP (1 ms prober)."
                );
                for metric in [
                    "programming_p50",
                    "programming_p90",
                    "programming_p99",
                    "programming_max",
                    "changes",
                    "failed",
                ] {
                    metric_table(&mut out, &s.rows, metric, metric);
                }
            }
            "bpf" => {
                let _ = writeln!(
                    out,
                    "\n### BPF programs and map updates\n\nRun-time statistics (kernel BPF stats on for the run only) and the cost per element of one update per call against batched updates (ratio: batch / single)."
                );
                let mut metrics: Vec<String> = s
                    .rows
                    .iter()
                    .filter(|r| {
                        r.metric.ends_with("_ns_per_call") || r.metric.ends_with("_per_elem")
                    })
                    .map(|r| r.metric.clone())
                    .collect();
                metrics.dedup();
                let metrics: BTreeSet<String> = metrics.into_iter().collect();
                for metric in &metrics {
                    metric_table(&mut out, &s.rows, metric, metric);
                }
            }
            "memory" => {
                let _ = writeln!(out, "\n### Memory");
                for (metric, title) in [
                    ("agent_rss", "Agent RSS"),
                    ("agent_peak_rss", "Agent peak RSS"),
                    (
                        "bpf_map_memory",
                        "BPF map memory (bytes_memlock of the pinned maps)",
                    ),
                ] {
                    metric_table(&mut out, &s.rows, metric, title);
                }
            }
            _ => {}
        }
        run_line(&mut out, s);
    }
    let _ = writeln!(out, "\n{END}");
    out
}

fn series(rows: &[Row], metric: &str) -> Vec<Series> {
    let (modes, ns) = modes_and_ns(rows, metric);
    modes
        .into_iter()
        .map(|mode| Series {
            points: ns
                .iter()
                .filter_map(|n| value(rows, &mode, *n, metric).map(|v| (f64::from(*n), v)))
                .collect(),
            label: mode,
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

/// The plots: (file name, title, panels).
pub fn plots(all: &[SuiteRows]) -> Vec<(&'static str, &'static str, Vec<Panel>)> {
    let mut out = Vec::new();
    let sync = rows_of(all, "sync");
    let panels: Vec<Panel> = SYNC_STEPS
        .iter()
        .map(|(step, title)| Panel {
            title: (*title).to_string(),
            y_label: "wall time (ms)".into(),
            series: series(sync, &format!("{step}_wall")),
        })
        .filter(|p| !p.series.is_empty())
        .collect();
    if !panels.is_empty() {
        out.push((
            "sync.png",
            "Sync time against services (N × 4 endpoints)",
            panels,
        ));
    }
    let dp = rows_of(all, "dataplane");
    let panels: Vec<Panel> = [
        ("connect_p50", "connect() p50"),
        ("connect_p99", "connect() p99"),
    ]
    .iter()
    .map(|(metric, title)| Panel {
        title: (*title).to_string(),
        y_label: "µs".into(),
        series: series(dp, metric),
    })
    .filter(|p| !p.series.is_empty())
    .collect();
    if !panels.is_empty() {
        out.push(("connect.png", "connect() latency against services", panels));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::docs::parse_csv;

    const HEADER: &str = "bench,mode,N,rep,metric,value,unit,ratio_to_baseline,kernel,cpu,run";

    fn csv(lines: &[&str]) -> Vec<Row> {
        let text = format!("{HEADER}\n{}\n", lines.join("\n"));
        parse_csv(&text).unwrap()
    }

    #[test]
    fn stats_prefer_a_median_row_else_take_medians_of_reps() {
        let rows = csv(&[
            "x,ebpf,1,0,m,1,ms,0.5,k,c,r",
            "x,ebpf,1,1,m,3,ms,0.7,k,c,r",
            "x,ebpf,1,2,m,100,ms,0.9,k,c,r",
            "x,iptables,1,0,m,5,ms,,k,c,r",
            "x,iptables,1,median,m,6,ms,,k,c,r",
        ]);
        let s = stat(&rows, "ebpf", 1, "m").unwrap();
        assert_eq!((s.value, s.ratio), (Some(3.0), Some(0.7)));
        assert_eq!(stat(&rows, "iptables", 1, "m").unwrap().value, Some(6.0));
        assert!(stat(&rows, "ebpf", 2, "m").is_none());
    }

    #[test]
    fn targets_say_whether_they_hold_and_by_how_much() {
        let all = vec![
            SuiteRows {
                suite: "dataplane",
                rows: csv(&[
                    "dataplane,ebpf,1,0,conn_rate,100,conn/s,0.99,k,c,r",
                    "dataplane,ebpf,50000,0,conn_rate,90,conn/s,0.90,k,c,r",
                    "dataplane,ebpf,1,0,connect_p99,10,us,1.0,k,c,r",
                    "dataplane,ebpf,50000,0,connect_p99,10.2,us,1.0,k,c,r",
                ]),
            },
            SuiteRows {
                suite: "memory",
                rows: csv(&["memory,ebpf,50000,0,agent_rss,250,MiB,,k,c,r"]),
            },
        ];
        let t = targets(&all);
        assert_eq!(t[0].holds, Some(true));
        assert_eq!(t[1].holds, Some(false));
        assert_eq!(t[1].miss, "5.3% below");
        assert_eq!(t[2].holds, Some(true));
        assert_eq!(t[2].measured, "1.020");
        let rss = t.last().unwrap();
        assert_eq!(
            (rss.holds, rss.miss.as_str()),
            (Some(false), "2.500× the limit")
        );
        let latency = t
            .iter()
            .find(|t| t.what.starts_with("programming"))
            .unwrap();
        assert_eq!(latency.holds, None);
        let text = render(&all);
        assert!(text.starts_with(BEGIN) && text.trim_end().ends_with(END));
        assert!(text.contains("| dataplane") || text.contains("**Connection rate**"));
        assert!(
            text.contains("| ebpf | 100 (0.99×) | 90.0 (0.90×) |"),
            "{text}"
        );
        let plots = plots(&all);
        assert_eq!(plots.len(), 1);
        assert_eq!(plots[0].0, "connect.png");
    }
}
