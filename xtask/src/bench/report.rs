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
    stats::{Stat, SuiteRows, rows_of, stat, value},
    targets::{num, ratio_spread, targets, verdict},
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
                        Some((lo, hi)),
                    ) => format!("{} ({r:.3}× [{lo:.3}–{hi:.3}])", num(v)),
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
                let _ = writeln!(out, "{DATAPLANE_INTRO}");
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
        let mut dp = vec![
            "dataplane,ebpf,1,0,conn_rate,100,conn/s,0.99,k,c,r".to_string(),
            "dataplane,ebpf,1,1,conn_rate,100,conn/s,0.97,k,c,r".to_string(),
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
                rows: csv(&["memory,ebpf,50000,0,agent_rss,250,MiB,,k,c,r"]),
            },
        ];
        let t = targets(&all);
        assert_eq!(t[0].holds, Some(false));
        assert_eq!(t[0].miss, "2.1% below");
        assert_eq!(
            t[0].measured,
            "0.930 (worst N = 50000, per-rep 0.900–0.960; lower bound 0.900)"
        );
        assert_eq!(t[1].holds, Some(true));
        assert_eq!(
            t[1].measured,
            "1.020 (per-rep 1.010–1.030; lower bound 1.010)"
        );
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
        assert!(text.contains("**Connection rate**"));
        assert!(
            text.contains("| ebpf | 100 (0.980× [0.970–0.990]) | 90.0 (0.960× [0.960–0.960]) |"),
            "{text}"
        );
        assert!(text.contains("1.020 (1.020× [1.010–1.030])"), "{text}");
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
