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
    stats::{Stat, SuiteRows, bench_rows, ratio_spread, rows_of, stat, value, value_spread},
    targets::{SCALE_N, num, scale_rows, spread_text, steady_metric, targets, verdict},
};

pub const BEGIN: &str = "<!-- BEGIN generated: report -->";
pub const END: &str = "<!-- END generated: report -->";

/// The suites of the report, in the order they run (as bench::suites::REPORT_SUITES).
pub const SUITES: [&str; 5] = ["dataplane", "sync", "latency", "bpf", "memory"];

/// docs/bench: the published CSVs and the plots.
pub fn docs_bench_dir(docs: &Path) -> PathBuf {
    docs.parent()
        .map_or_else(|| PathBuf::from("bench"), |d| d.join("bench"))
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

/// A table of `metric` like [`metric_table`], each ratio with its spread over the reps:
/// "value (median ratio× [min–max])".
fn spread_table(out: &mut String, rows: &[Row], metric: &str, title: &str) {
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
            .map(|n| {
                let spread = ratio_spread(rows, mode, *n, metric);
                match (stat(rows, mode, *n, metric), spread) {
                    (
                        Some(Stat {
                            value: Some(v),
                            ratio: Some(r),
                        }),
                        Some(range),
                    ) => format!("{} ({r:.3}× [{:.3}–{:.3}])", num(v), range.min, range.max),
                    (Some(Stat { value: Some(v), .. }), _) => num(v),
                    _ => "–".into(),
                }
            })
            .collect();
        let _ = writeln!(out, "| {mode} | {} |", cells.join(" | "));
    }
}

/// The dataplane section's introduction.
const DATAPLANE_INTRO: &str = "\n### Dataplane\n\nEach rep is one client process (4 threads, 4 backends) alternating in 100 ms slices (ABBA) between the mode's route (the ClusterIP) and the direct route to the same backends from the same pod through the same node namespace. Medians over the accepted reps (reps with too much CPU steal or load are rejected: see the `rejected`, `steal` and `load` rows); in brackets the median per-rep ratio to the direct route and, in square brackets, its smallest and largest value over the reps. The direct route shares what the node runs for every packet — in ebpf mode the socket programs (no service at a backend's address) and `tc_pod_ingress` on the pod devices, in the netfilter modes conntrack and the NAT chains — so a ratio is the cost of the service translation; `direct-ct` (conntrack and NAT hooks on, nothing matching, both routes direct) shows the method's noise floor and, by its absolute values, what a netfilter node costs every connection. `@random`: the measured service at a random place in the rules, otherwise last.\n\n![connect() latency against N](bench/connect.png)";

/// The dataplane section's note when its rows predate the ABBA client (they hold no
/// `direct_<metric>` rows).
const DATAPLANE_BEFORE_ABBA: &str = "The published run predates this method: each mode and `direct` (a mode of its own) ran as separate client runs in each rep, and a ratio is to `direct` of the same rep; its spreads take in every rep.";

/// The bpf section's note when its rows predate the connect() comparison (no `attached`
/// rows).
const BPF_BEFORE_CONNECT: &str = "The published run predates the connect() comparison and the test runs: it holds the run-time statistics (without their overhead measured), the map updates and the Maglev tables.";

/// Where a suite's rows come from: its run, or each run with the modes it measured (a
/// slice of a suite run on its own replaces only its modes' rows in the published CSV).
fn run_line(out: &mut String, s: &SuiteRows) {
    let mut runs: Vec<(&Row, Vec<&str>)> = Vec::new();
    for r in &s.rows {
        match runs.iter_mut().find(|(first, _)| first.run == r.run) {
            Some((_, modes)) => {
                if !modes.contains(&r.mode.as_str()) {
                    modes.push(&r.mode);
                }
            }
            None => runs.push((r, vec![r.mode.as_str()])),
        }
    }
    let described: Vec<String> = match runs.as_slice() {
        [] => return,
        [(r, _)] => vec![format!("Run {} on {} (kernel {})", r.run, r.cpu, r.kernel)],
        _ => runs
            .iter()
            .map(|(r, modes)| {
                format!(
                    "Run {} on {} (kernel {}): {}",
                    r.run,
                    r.cpu,
                    r.kernel,
                    modes.join(", ")
                )
            })
            .collect(),
    };
    let _ = writeln!(
        out,
        "\n{}; rows: [docs/bench/{}.csv](bench/{}.csv).",
        described.join("; "),
        s.suite,
        s.suite
    );
}

const SYNC_STEPS: [(&str, &str); 4] = [
    ("full_sync", "cold full sync"),
    ("add_service", "add one service"),
    ("remove_endpoint", "remove one endpoint"),
    ("scale_4_to_40", "scale one service 4 → 40 endpoints"),
];

/// The steady-state change steps of the sync suite (per rep, the median of at least 50
/// consecutive changes), by their first change's name.
const STEADY_STEPS: [(&str, &str); 3] = [
    (
        "add_service",
        "add one service, steady state (median of ≥ 50 consecutive changes)",
    ),
    (
        "remove_endpoint",
        "remove one endpoint, steady state (median of ≥ 50 consecutive changes)",
    ),
    (
        "scale_4_to_40",
        "scale one service 4 → 40 endpoints, steady state (median of ≥ 50 consecutive changes)",
    ),
];

/// The scale test (100,000 services × 10 endpoints, ebpf): its four measurements, or
/// that it has not run.
fn scale_section(out: &mut String, all: &[SuiteRows]) {
    let rows = scale_rows(all);
    let _ = writeln!(out, "\n### Scale: 100,000 services × 10 endpoints (ebpf)\n");
    if rows.is_empty() {
        let _ = writeln!(
            out,
            "Not measured: no published CSV holds rows of bench `scale` (written by the memory suite's scale run)."
        );
        return;
    }
    let _ = writeln!(out, "| measurement | median | spread (per rep) |");
    let _ = writeln!(out, "|---|---|---|");
    for (metric, title, unit) in [
        ("cold_sync_ms", "cold sync", "ms"),
        (
            "failed_probes",
            "failed probes during the cold sync",
            "count",
        ),
        ("agent_rss", "agent RSS after the sync", "MiB"),
        ("bpf_map_memory", "BPF map memory", "MiB"),
    ] {
        let median = value(&rows, "ebpf", SCALE_N, metric);
        let _ = writeln!(
            out,
            "| {title} ({unit}) | {} | {} |",
            median.map_or_else(|| "not measured".into(), num),
            spread_text(value_spread(&rows, "ebpf", SCALE_N, metric))
        );
    }
}

/// The generated section of docs/benchmarks.md.
pub fn render(all: &[SuiteRows]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{BEGIN}");
    let _ = writeln!(
        out,
        "<!-- generated by `cargo xtask bench` from docs/bench/*.csv; do not edit -->\n"
    );
    let _ = writeln!(out, "### Targets\n");
    let _ = writeln!(
        out,
        "Measured: the median over reps (of the paired ratios, for a ratio). Spread: the lowest and highest rep (for a ratio of two sizes, of each rep's own ratio). The verdict judges the median; a rep outside the limit shows in the spread.\n"
    );
    let _ = writeln!(
        out,
        "| target | limit | measured | spread (per rep) | verdict | miss, and why |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for t in targets(all) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            t.what,
            t.limit,
            t.measured,
            t.spread,
            verdict(t.holds),
            t.miss_and_why()
        );
    }
    scale_section(&mut out, all);
    for s in all {
        match s.suite {
            "dataplane" => {
                let _ = writeln!(out, "{DATAPLANE_INTRO}");
                if !s.rows.iter().any(|r| r.metric == "direct_conn_rate") {
                    let _ = writeln!(out, "\n{DATAPLANE_BEFORE_ABBA}");
                }
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
                    spread_table(&mut out, &s.rows, metric, title);
                }
            }
            "sync" => {
                let _ = writeln!(
                    out,
                    "\n### Sync\n\nMedian wall time; in brackets the median of the paired ratios to the side's baseline (same rep): `nftables` to `kube-proxy-nft` (raw `nft -f` of kube-proxy-shaped nftables rules, run once at 10,000 services and not at 50,000, where it takes minutes), the others to `kube-proxy-iptables` (raw `iptables-legacy-restore` of kube-proxy-shaped rules).\n\n![sync time against N](bench/sync.png)"
                );
                for (step, title) in SYNC_STEPS {
                    metric_table(&mut out, &s.rows, &format!("{step}_wall"), title);
                }
                for (step, title) in STEADY_STEPS {
                    metric_table(&mut out, &s.rows, &steady_metric(&s.rows, step), title);
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
                    "\n### BPF programs and map updates\n\nconnect() cost (the reported figure): one client alternating in 100 ms slices (ABBA) between connect() to the ClusterIP from the cgroup the socket programs are attached to (`attached`) and connect() to the backend from a sibling cgroup without them (`detached`); ratio attached / detached of the same rep, [min–max] over the reps. `connect_p99_vs_1`: per rep, (attached/detached p99 at N) / (the same at 1 service). `<program>_ns_per_packet` (N = conntrack flows in the map): `BPF_PROG_TEST_RUN` of the agent's live tc and XDP programs (the uplink ones on a veth uplink given to the node) on a pass-through TCP segment (conntrack and frontend lookups that miss), the kernel's time per run; `test-run+stats` the same with the run-time statistics on, `stats_overhead_ns_per_call` the difference (on tc_pod_ingress). Run-time statistics (kernel BPF stats on for the run only; a secondary view): ns per call as the kernel counts it, and `_net` less the measured statistics overhead. Map updates: the cost per element of one update per call against batched updates (ratio: batch / single). Maglev tables (N = backends): the agent's build of one table against writing it into a BPF array one update per entry, as the agent does (ratio: build / write)."
                );
                if !s.rows.iter().any(|r| r.mode == "attached") {
                    let _ = writeln!(out, "\n{BPF_BEFORE_CONNECT}");
                }
                for (metric, title) in [
                    (
                        "connect_p99",
                        "connect() p99, socket programs attached / detached",
                    ),
                    (
                        "connect_p50",
                        "connect() p50, socket programs attached / detached",
                    ),
                    (
                        "connect_p99_vs_1",
                        "connect() p99 at N / at 1 service (each / its detached p99)",
                    ),
                    (
                        "tc_pod_ingress_ns_per_packet",
                        "tc_pod_ingress per packet, BPF_PROG_TEST_RUN (N = conntrack flows)",
                    ),
                    (
                        "tc_uplink_ingress_ns_per_packet",
                        "tc_uplink_ingress per packet, BPF_PROG_TEST_RUN (N = conntrack flows)",
                    ),
                    (
                        "xdp_uplink_ns_per_packet",
                        "xdp_uplink per packet, BPF_PROG_TEST_RUN (N = conntrack flows)",
                    ),
                ] {
                    spread_table(&mut out, &s.rows, metric, title);
                }
                let mut metrics: Vec<String> = s
                    .rows
                    .iter()
                    .filter(|r| {
                        r.metric.ends_with("_ns_per_call")
                            || r.metric.ends_with("_ns_per_call_net")
                            || r.metric.ends_with("_per_elem")
                            || r.metric.starts_with("maglev_table_")
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
                // The scale run's rows have a section of their own.
                let rows = bench_rows(&s.rows, "memory");
                for (metric, title) in [
                    ("agent_rss", "Agent RSS"),
                    ("agent_peak_rss", "Agent peak RSS"),
                    (
                        "bpf_map_memory",
                        "BPF map memory (bytes_memlock of the pinned maps)",
                    ),
                ] {
                    metric_table(&mut out, &rows, metric, title);
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
            spread: ns
                .iter()
                .filter_map(|n| {
                    let range = value_spread(rows, &mode, *n, metric)?;
                    Some((f64::from(*n), range.min, range.max))
                })
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
        y_label: "connect() latency (µs)".into(),
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
    use crate::bench::{
        docs::parse_csv,
        stats::{Spread, rep_values},
    };

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
    fn spreads_prefer_min_and_max_rows_and_leave_out_rejected_reps() {
        let reps = [
            "dataplane,ebpf,1,0,conn_rate,100,conn/s,0.99,k,c,r",
            "dataplane,ebpf,1,0,rejected,0,bool,,k,c,r",
            "dataplane,ebpf,1,1,conn_rate,50,conn/s,0.50,k,c,r",
            "dataplane,ebpf,1,1,rejected,1,bool,,k,c,r",
            "dataplane,ebpf,1,2,conn_rate,110,conn/s,0.97,k,c,r",
        ];
        let summary = [
            "dataplane,ebpf,1,median,conn_rate,105,conn/s,0.98,k,c,r",
            "dataplane,ebpf,1,min,conn_rate,100,conn/s,0.97,k,c,r",
            "dataplane,ebpf,1,max,conn_rate,110,conn/s,0.99,k,c,r",
        ];
        let rows = csv(&[&reps[..], &summary[..]].concat());
        assert_eq!(
            rep_values(&rows, "ebpf", 1, "conn_rate"),
            vec![(0, 100.0), (2, 110.0)]
        );
        let two = |min, max| Some(Spread { min, max, reps: 2 });
        assert_eq!(
            value_spread(&rows, "ebpf", 1, "conn_rate"),
            two(100.0, 110.0)
        );
        assert_eq!(ratio_spread(&rows, "ebpf", 1, "conn_rate"), two(0.97, 0.99));
        assert_eq!(value(&rows, "ebpf", 1, "conn_rate"), Some(105.0));
        // Without the summary rows: over the accepted numbered reps.
        let rows = csv(&reps);
        assert_eq!(
            value_spread(&rows, "ebpf", 1, "conn_rate"),
            two(100.0, 110.0)
        );
        assert_eq!(ratio_spread(&rows, "ebpf", 1, "conn_rate"), two(0.97, 0.99));
        // Only the summary rows: the range without a rep count.
        let rows = csv(&summary);
        let range = value_spread(&rows, "ebpf", 1, "conn_rate");
        assert_eq!(range.map(|r| r.reps), Some(0));
        assert_eq!(spread_text(range), "100–110");
        // sock_connect4: the larger N's figure (net of the statistics' cost where the run
        // measured it) with that N's spread.
        let all = vec![SuiteRows {
            suite: "bpf",
            rows: csv(&[
                "bpf,ebpf,1,0,sock_connect4_ns_per_call,200,ns,,k,c,r",
                "bpf,ebpf,1,1,sock_connect4_ns_per_call,210,ns,,k,c,r",
                "bpf,ebpf,100000,0,sock_connect4_ns_per_call,300,ns,,k,c,r",
                "bpf,ebpf,100000,0,sock_connect4_ns_per_call_net,120,ns,,k,c,r",
                "bpf,ebpf,100000,1,sock_connect4_ns_per_call_net,160,ns,,k,c,r",
            ]),
        }];
        let t = targets(&all);
        let connect4 = t
            .iter()
            .find(|t| t.what.starts_with("sock_connect4"))
            .unwrap();
        assert_eq!(
            (
                connect4.measured.as_str(),
                connect4.spread.as_str(),
                connect4.holds
            ),
            ("205", "200–210 (2 reps)", Some(false))
        );
    }

    #[test]
    fn targets_say_whether_they_hold_and_by_how_much() {
        let mut dp = vec![
            "dataplane,ebpf,1,0,conn_rate,100,conn/s,0.99,k,c,r".to_string(),
            "dataplane,ebpf,1,1,conn_rate,100,conn/s,0.97,k,c,r".to_string(),
            "dataplane,ebpf,1,0,direct_conn_rate,101,conn/s,,k,c,r".to_string(),
        ];
        for n in [1_000, 10_000, 50_000, 100_000] {
            dp.push(format!(
                "dataplane,ebpf,{n},0,conn_rate,90,conn/s,0.96,k,c,r"
            ));
        }
        dp.push("dataplane,ebpf,50000,1,conn_rate,90,conn/s,0.90,k,c,r".into());
        dp.push("dataplane,ebpf,50000,median,conn_rate,90,conn/s,0.93,k,c,r".into());
        dp.push("dataplane,ebpf,50000,min,conn_rate,80,conn/s,0.90,k,c,r".into());
        dp.push("dataplane,ebpf,50000,max,conn_rate,95,conn/s,0.96,k,c,r".into());
        let dp: Vec<&str> = dp.iter().map(String::as_str).collect();
        let all = vec![
            SuiteRows {
                suite: "dataplane",
                rows: csv(&dp),
            },
            SuiteRows {
                suite: "bpf",
                rows: csv(&[
                    "bpf,attached,100000,0,connect_p99_vs_1,1.01,ratio,1.01,k,c,r",
                    "bpf,attached,100000,1,connect_p99_vs_1,1.03,ratio,1.03,k,c,r",
                    "bpf,attached,100000,median,connect_p99_vs_1,1.02,ratio,1.02,k,c,r",
                    "bpf,attached,100000,min,connect_p99_vs_1,1.01,ratio,1.01,k,c,r",
                    "bpf,attached,100000,max,connect_p99_vs_1,1.03,ratio,1.03,k,c,r",
                ]),
            },
            SuiteRows {
                suite: "memory",
                rows: csv(&[
                    "memory,ebpf,50000,0,agent_rss,250,MiB,,k,c,r",
                    "memory,ebpf,50000,1,agent_rss,140,MiB,,k,c,r",
                    "memory,ebpf,50000,2,agent_rss,260,MiB,,k,c,r",
                ]),
            },
        ];
        let t = targets(&all);
        assert_eq!(t[0].holds, Some(false));
        assert_eq!(t[0].miss, "2.1% below");
        // The per-rep spread at the worst N in the spread column (from the min and max
        // rows), the lower bound over every N in the measured text.
        assert_eq!(
            (t[0].measured.as_str(), t[0].spread.as_str()),
            (
                "0.930 (worst N = 50000; lower bound 0.900)",
                "0.900–0.960 (2 reps)"
            )
        );
        assert_eq!(t[1].holds, Some(true));
        assert_eq!(
            (t[1].measured.as_str(), t[1].spread.as_str()),
            ("1.020 (lower bound 1.010)", "1.010–1.030 (2 reps)")
        );
        let rss = t.last().unwrap();
        assert_eq!(
            (rss.holds, rss.miss.as_str(), rss.spread.as_str()),
            (Some(false), "1.667× the limit", "140–260 (3 reps)")
        );
        let latency = t
            .iter()
            .find(|t| t.what.starts_with("programming"))
            .unwrap();
        assert_eq!(latency.holds, None);
        let text = render(&all);
        assert!(text.starts_with(BEGIN) && text.trim_end().ends_with(END));
        assert!(text.contains("**Connection rate**"));
        assert!(
            text.contains("| ebpf | 100 (0.980× [0.970–0.990]) | 90.0 (0.960× [0.960–0.960]) |"),
            "{text}"
        );
        assert!(text.contains("1.020 (1.020× [1.010–1.030])"), "{text}");
        // Rows of the ABBA methods: no note that the run predates them.
        assert!(!text.contains(DATAPLANE_BEFORE_ABBA) && !text.contains(BPF_BEFORE_CONNECT));
        // A missing N leaves the connection-rate target unjudged.
        let partial = vec![SuiteRows {
            suite: "dataplane",
            rows: csv(&["dataplane,ebpf,1,0,conn_rate,100,conn/s,0.99,k,c,r"]),
        }];
        let t = targets(&partial);
        assert_eq!(t[0].holds, None);
        assert!(
            t[0].measured
                .contains("not measured at N = 1000, 10000, 50000, 100000")
        );
        // ... unless a measured N already misses.
        let missing_one = vec![SuiteRows {
            suite: "dataplane",
            rows: csv(&[
                "dataplane,ebpf,1,0,conn_rate,100,conn/s,0.99,k,c,r",
                "dataplane,ebpf,1000,0,conn_rate,100,conn/s,0.90,k,c,r",
            ]),
        }];
        let t = targets(&missing_one);
        assert_eq!(
            (t[0].holds, t[0].miss.as_str()),
            (Some(false), "5.3% below")
        );
        // Rows of a run before the ABBA client (no direct_<metric> rows) say so.
        assert!(render(&partial).contains(DATAPLANE_BEFORE_ABBA));
    }

    #[test]
    fn steady_state_and_scale_targets_judge_medians_and_show_the_per_rep_spread() {
        let all = vec![
            SuiteRows {
                suite: "sync",
                rows: csv(&[
                    "sync,ebpf,1000,0,add_service_wall,0.1,ms,,k,c,r",
                    "sync,ebpf,50000,0,add_service_wall,0.7,ms,,k,c,r",
                    "sync,ebpf,50000,1,add_service_wall,6.0,ms,,k,c,r",
                    "sync,ebpf,50000,2,add_service_wall,0.5,ms,,k,c,r",
                    "sync,ebpf,1000,0,add_service_steady_ms,0.10,ms,,k,c,r",
                    "sync,ebpf,1000,1,add_service_steady_ms,0.20,ms,,k,c,r",
                    "sync,ebpf,50000,0,add_service_steady_ms,0.12,ms,,k,c,r",
                    "sync,ebpf,50000,1,add_service_steady_ms,0.40,ms,,k,c,r",
                    "sync,ebpf,50000,0,remove_endpoint_steady,1.5,ms,,k,c,r",
                    "scale,ebpf,100000,0,cold_sync_ms,2500,ms,,k,c,r",
                    "scale,ebpf,100000,1,cold_sync_ms,3500,ms,,k,c,r",
                    "scale,ebpf,100000,2,cold_sync_ms,3400,ms,,k,c,r",
                    "scale,ebpf,100000,0,failed_probes,0,count,,k,c,r",
                    "scale,ebpf,100000,1,failed_probes,2,count,,k,c,r",
                ]),
            },
            SuiteRows {
                suite: "memory",
                rows: csv(&["scale,ebpf,100000,0,agent_rss,120,MiB,,k,c,r"]),
            },
        ];
        let t = targets(&all);
        let find = |prefix: &str| t.iter().find(|t| t.what.starts_with(prefix)).unwrap();
        let first = find("ebpf add one service, first change");
        assert_eq!(
            (first.measured.as_str(), first.holds, first.spread.as_str()),
            ("0.700", Some(true), "0.500–6.000 (3 reps)")
        );
        // Medians 0.26 ms over 0.15 ms: 1.733; per rep 1.2 and 2.0.
        let scaling = find("ebpf add one service, steady state: t(50,000)");
        assert_eq!(
            (
                scaling.measured.as_str(),
                scaling.holds,
                scaling.spread.as_str()
            ),
            ("1.733", Some(false), "1.200–2.000 (2 reps)")
        );
        assert_eq!(scaling.miss, "1.156× the limit");
        assert!(
            scaling
                .miss_and_why()
                .starts_with("1.156× the limit: a profile of a partial sync"),
            "a miss says why: {}",
            scaling.miss_and_why()
        );
        assert_eq!(
            find("ebpf add one service, steady state at").holds,
            Some(true)
        );
        // The suite's name without the unit is read too.
        let remove = find("ebpf remove one endpoint, steady state at");
        assert_eq!(
            (remove.holds, remove.miss.as_str()),
            (Some(false), "1.500× the limit")
        );
        let scale = find("ebpf scale one service 4 → 40 endpoints, steady state at");
        assert_eq!(scale.holds, None);
        let cold = find("ebpf cold sync of 100,000");
        assert_eq!((cold.measured.as_str(), cold.holds), ("3400", Some(false)));
        let probes = find("ebpf failed probes");
        assert_eq!(
            (probes.measured.as_str(), probes.miss.as_str()),
            ("2", "2 failed")
        );
        let text = render(&all);
        assert!(
            text.contains("| agent RSS after the sync (MiB) | 120 | 120 (1 rep) |"),
            "{text}"
        );
        assert!(
            text.contains("| BPF map memory (MiB) | not measured | – |"),
            "{text}"
        );
        assert!(text.contains(
            "**add one service, steady state (median of ≥ 50 consecutive changes)** (ms)"
        ));
        let none = render(&[]);
        assert!(none.contains("Not measured: no published CSV holds rows of bench `scale`"));
    }

    #[test]
    fn the_memory_section_and_its_target_leave_the_scale_rows_to_the_scale_section() {
        // A scale run at the memory suite's own N (10 endpoints, not 4).
        let all = vec![SuiteRows {
            suite: "memory",
            rows: csv(&[
                "memory,ebpf,50000,0,agent_rss,140,MiB,,k,c,r",
                "scale,ebpf,50000,0,agent_rss,520,MiB,,k,c,r",
                "scale,ebpf,100000,0,agent_rss,1000,MiB,,k,c,r",
                "scale,ebpf,100000,0,cold_sync_ms,2900,ms,,k,c,r",
            ]),
        }];
        let rss = targets(&all)
            .into_iter()
            .find(|t| t.what.starts_with("agent RSS at 50,000"))
            .unwrap();
        assert_eq!((rss.measured.as_str(), rss.holds), ("140", Some(true)));
        let text = render(&all);
        let memory = &text[text.find("### Memory").unwrap()..];
        assert!(memory.contains("| ebpf | 140 |"), "{memory}");
        assert!(
            !memory.contains("100000") && !memory.contains("520"),
            "{memory}"
        );
        assert!(
            text.contains("| agent RSS after the sync (MiB) | 1000 | 1000 (1 rep) |"),
            "{text}"
        );
    }

    #[test]
    fn nftables_targets_read_the_ratio_to_kube_proxy_nft_and_the_50k_time() {
        let all = vec![SuiteRows {
            suite: "sync",
            rows: csv(&[
                "sync,ebpf,10000,0,full_sync_wall,300,ms,0.25,k,c,r1",
                "sync,nftables,10000,0,full_sync_wall,5000,ms,0.0600,k,c,r2",
                "sync,nftables,10000,1,full_sync_wall,6000,ms,,k,c,r2",
                "sync,kube-proxy-nft,10000,0,full_sync_wall,83000,ms,,k,c,r2",
                "sync,nftables,50000,0,full_sync_wall,23000,ms,,k,c,r2",
            ]),
        }];
        let t = targets(&all);
        let ratio = t
            .iter()
            .find(|t| t.what.starts_with("nftables cold load of 10,000"))
            .unwrap();
        assert_eq!(
            (ratio.measured.as_str(), ratio.holds, ratio.limit),
            ("0.060", Some(true), "≤ 0.1")
        );
        let large = t
            .iter()
            .find(|t| t.what.starts_with("nftables cold load of 50,000"))
            .unwrap();
        assert_eq!(large.holds, Some(false));
        assert_eq!(large.measured, "23000");
        assert_eq!(large.miss, "2.300× the limit");
        let text = render(&all);
        assert!(
            text.contains("| nftables | 5500 (0.06×) | 23000 |"),
            "{text}"
        );
        assert!(
            text.contains("Run r1 on c (kernel k): ebpf; Run r2 on c (kernel k): nftables, kube-proxy-nft; rows: [docs/bench/sync.csv](bench/sync.csv)."),
            "{text}"
        );
        // Not measured: no verdict.
        let none = targets(&[]);
        assert!(
            none.iter()
                .filter(|t| t.what.starts_with("nftables"))
                .all(|t| t.holds.is_none() && t.measured == "not measured")
        );
    }
}
