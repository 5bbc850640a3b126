// SPDX-License-Identifier: Apache-2.0
//! The targets of issue 8 (and issue 17's for the nftables mode), judged against the
//! latest run of each suite (pure): the measured value, whether it holds, and by how much
//! it misses.

use super::stats::{SuiteRows, ratio, rows_of, value};

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

/// The targets of issues 8 and 17 against the latest runs.
pub fn targets(all: &[SuiteRows]) -> Vec<Target> {
    let dp = rows_of(all, "dataplane");
    let sync = rows_of(all, "sync");
    let lat = rows_of(all, "latency");
    let bpf = rows_of(all, "bpf");
    let mem = rows_of(all, "memory");
    let p99_scaling = match (
        value(dp, "ebpf", 50_000, "connect_p99"),
        value(dp, "ebpf", 1, "connect_p99"),
    ) {
        (Some(big), Some(one)) if one > 0.0 => Some(big / one),
        _ => None,
    };
    let rr = ratio(dp, "ebpf", 1, "rr_p50");
    let add_50k = value(sync, "ebpf", 50_000, "add_service_wall");
    let add_scaling = match (add_50k, value(sync, "ebpf", 1_000, "add_service_wall")) {
        (Some(big), Some(small)) if small > 0.0 => Some(big / small),
        _ => None,
    };
    let connect4 = [1, 50_000]
        .into_iter()
        .filter_map(|n| value(bpf, "ebpf", n, "sock_connect4_ns_per_call"))
        .reduce(f64::max);
    vec![
        at_least(
            "ebpf connection rate / direct, 1 service",
            "≥ 0.95",
            ratio(dp, "ebpf", 1, "conn_rate"),
            0.95,
        ),
        at_least(
            "ebpf connection rate / direct, 50,000 services",
            "≥ 0.95",
            ratio(dp, "ebpf", 50_000, "conn_rate"),
            0.95,
        ),
        at_most(
            "ebpf connect() p99 at 50,000 / at 1 service",
            "≤ 1.05",
            p99_scaling,
            1.05,
        ),
        at(
            "ebpf established request/response p50 / direct (1 service)",
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
            "sock_connect4 cost per call (ns; the larger of 1 and 50,000 services)",
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
