// SPDX-License-Identifier: Apache-2.0
//! The targets of issue 8 (and issue 17's for the nftables mode), judged against the
//! latest run of each suite (pure): the measured value, whether it holds, and by how much
//! it misses.

use super::{
    docs::Row,
    stats::{SuiteRows, ratio, rows_of, value},
};

/// One target of issue 8.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub what: &'static str,
    pub limit: &'static str,
    pub measured: String,
    /// None: not measured in the latest runs.
    pub holds: Option<bool>,
    /// By how much it misses (empty when it holds).
    pub miss: String,
}

pub fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn at_least(what: &'static str, limit_text: &'static str, v: Option<f64>, min: f64) -> Target {
    at(
        what,
        limit_text,
        v,
        |v| v >= min,
        |v| format!("{:.1}% below", (min - v) / min * 100.0),
    )
}

fn at_most(what: &'static str, limit_text: &'static str, v: Option<f64>, max: f64) -> Target {
    at(
        what,
        limit_text,
        v,
        |v| v <= max,
        |v| format!("{}× the limit", num(v / max)),
    )
}

fn at(
    what: &'static str,
    limit: &'static str,
    v: Option<f64>,
    ok: impl Fn(f64) -> bool,
    miss: impl Fn(f64) -> String,
) -> Target {
    Target {
        what,
        limit,
        measured: v.map(num).unwrap_or_else(|| "not measured".into()),
        holds: v.map(&ok),
        miss: v.filter(|v| !ok(*v)).map(miss).unwrap_or_default(),
    }
}

/// The smallest and largest per-rep ratio of (mode, N, metric): the suite's `min` and
/// `max` rows when it wrote them, else over its numbered reps.
pub fn ratio_spread(rows: &[Row], mode: &str, n: u32, metric: &str) -> Option<(f64, f64)> {
    let of = |rep: &str| {
        rows.iter()
            .find(|r| r.mode == mode && r.n == n && r.metric == metric && r.rep == rep)
            .and_then(|r| r.ratio)
    };
    if let (Some(lo), Some(hi)) = (of("min"), of("max")) {
        return Some((lo, hi));
    }
    let ratios: Vec<f64> = rows
        .iter()
        .filter(|r| r.mode == mode && r.n == n && r.metric == metric)
        .filter(|r| r.rep.parse::<u32>().is_ok())
        .filter_map(|r| r.ratio)
        .collect();
    let lo = ratios.iter().copied().reduce(f64::min)?;
    let hi = ratios.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

/// The Ns the dataplane connection-rate target covers.
pub const CONN_RATE_NS: [u32; 5] = [1, 1_000, 10_000, 50_000, 100_000];

/// One N of the connection-rate target: the median per-rep ratio and the per-rep spread.
struct AtN {
    n: u32,
    ratio: Option<f64>,
    spread: Option<(f64, f64)>,
}

/// "ebpf ClusterIP connection rate ≥ 0.95× direct at every N up to 100k": judged on the
/// worst N's median per-rep ratio; the measured text gives that N, the per-rep spread
/// there and the lowest per-rep ratio of any N (the lower bound).
fn conn_rate_target(dp: &[Row]) -> Target {
    let what = "ebpf ClusterIP connection rate / direct route (same client run, ABBA) at every N up to 100,000";
    let limit = "≥ 0.95 at every N";
    let per_n: Vec<AtN> = CONN_RATE_NS
        .iter()
        .map(|n| AtN {
            n: *n,
            ratio: ratio(dp, "ebpf", *n, "conn_rate"),
            spread: ratio_spread(dp, "ebpf", *n, "conn_rate"),
        })
        .collect();
    let missing: Vec<String> = per_n
        .iter()
        .filter(|at| at.ratio.is_none())
        .map(|at| at.n.to_string())
        .collect();
    let worst = per_n
        .iter()
        .filter_map(|at| at.ratio.map(|r| (at.n, r, at.spread)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let Some((worst_n, worst_ratio, worst_spread)) = worst else {
        return at_least(what, limit, None, 0.95);
    };
    let lower = per_n
        .iter()
        .filter_map(|at| at.spread.map(|s| s.0))
        .reduce(f64::min);
    let mut target = at_least(what, limit, Some(worst_ratio), 0.95);
    let spread = worst_spread.map_or(String::new(), |(lo, hi)| {
        format!(", per-rep {lo:.3}–{hi:.3}")
    });
    let bound = lower.map_or(String::new(), |l| format!("; lower bound {l:.3}"));
    target.measured = format!("{worst_ratio:.3} (worst N = {worst_n}{spread}{bound})");
    if !missing.is_empty() {
        target.measured += &format!("; not measured at N = {}", missing.join(", "));
        target.holds = None;
    }
    target
}

/// "connect() p99 at 100k ≤ 1.05× at 1", from the bpf suite's ABBA comparison with the
/// socket programs detached (per rep, each N's p99 over its detached p99).
fn connect_p99_target(bpf: &[Row]) -> Target {
    let what =
        "ebpf connect() p99 at 100,000 / at 1 service (each over its own detached p99, ABBA)";
    let n = 100_000;
    let metric = "connect_p99_vs_1";
    let v = value(bpf, "attached", n, metric);
    let mut target = at_most(what, "≤ 1.05", v, 1.05);
    if let (Some(v), Some((lo, hi))) = (v, ratio_spread(bpf, "attached", n, metric)) {
        target.measured = format!("{v:.3} (per-rep {lo:.3}–{hi:.3}; lower bound {lo:.3})");
    }
    target
}

/// The targets of issues 8 and 17 against the latest runs.
pub fn targets(all: &[SuiteRows]) -> Vec<Target> {
    let dp = rows_of(all, "dataplane");
    let sync = rows_of(all, "sync");
    let lat = rows_of(all, "latency");
    let bpf = rows_of(all, "bpf");
    let mem = rows_of(all, "memory");
    let rr = ratio(dp, "ebpf", 1, "rr_p50");
    let add_50k = value(sync, "ebpf", 50_000, "add_service_wall");
    let add_scaling = match (add_50k, value(sync, "ebpf", 1_000, "add_service_wall")) {
        (Some(big), Some(small)) if small > 0.0 => Some(big / small),
        _ => None,
    };
    // Net of the statistics' own measured cost when the run measured it.
    let connect4 = [1, 50_000, 100_000]
        .into_iter()
        .filter_map(|n| {
            value(bpf, "ebpf", n, "sock_connect4_ns_per_call_net")
                .or_else(|| value(bpf, "ebpf", n, "sock_connect4_ns_per_call"))
        })
        .reduce(f64::max);
    vec![
        conn_rate_target(dp),
        connect_p99_target(bpf),
        at(
            "ebpf established request/response p50 / direct route (1 service; tc_pod_ingress sees both routes' packets)",
            "within ±3% (0.97–1.03)",
            rr,
            |v| (0.97..=1.03).contains(&v),
            |v| format!("{:+.1}%", (v - 1.0) * 100.0),
        ),
        at_most(
            "ebpf add one service at 50,000 services (agent wall time, ms)",
            "≤ 5 ms",
            add_50k,
            5.0,
        ),
        at_most(
            "ebpf add one service: t(50,000) / t(1,000)",
            "≤ 1.5",
            add_scaling,
            1.5,
        ),
        at_most(
            "ebpf cold load of 10,000 × 4 / raw iptables-restore of kube-proxy-shaped rules",
            "≤ 0.3",
            ratio(sync, "ebpf", 10_000, "full_sync_wall"),
            0.3,
        ),
        at_most(
            "nftables cold load of 10,000 × 4 / raw nft -f of kube-proxy-shaped nftables rules (issue 17)",
            "≤ 0.1",
            ratio(sync, "nftables", 10_000, "full_sync_wall"),
            0.1,
        ),
        at(
            "nftables cold load of 50,000 × 4 (agent wall time, ms; issue 17)",
            "< 10,000 ms",
            value(sync, "nftables", 50_000, "full_sync_wall"),
            |v| v < 10_000.0,
            |v| format!("{}× the limit", num(v / 10_000.0)),
        ),
        at_most(
            "programming latency p99, ebpf, 10,000 services (ms)",
            "≤ 50 ms",
            value(lat, "ebpf", 10_000, "programming_p99"),
            50.0,
        ),
        at_most(
            "sock_connect4 cost per call (ns, run-time statistics less their measured overhead; the larger of 1 and 100,000 services)",
            "≤ 150 ns",
            connect4,
            150.0,
        ),
        at_most(
            "agent RSS at 50,000 services × 4 endpoints, ebpf (MiB)",
            "≤ 100 MiB",
            value(mem, "ebpf", 50_000, "agent_rss"),
            100.0,
        ),
    ]
}

pub fn verdict(holds: Option<bool>) -> &'static str {
    match holds {
        Some(true) => "holds",
        Some(false) => "**does not hold**",
        None => "not measured",
    }
}
