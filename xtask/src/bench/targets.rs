// SPDX-License-Identifier: Apache-2.0
//! The targets of issues 8, 17 and 20, judged against the latest run of each suite
//! (pure): the measured value (a median), the spread of the per-rep values behind it,
//! whether it holds, and by how much it misses.

use super::{
    docs::Row,
    stats::{
        Spread, SuiteRows, bench_rows, paired_ratios, ratio, ratio_spread, rep_ratios, rep_values,
        rows_of, spread, value, value_spread,
    },
};

/// One target.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub what: &'static str,
    pub limit: &'static str,
    pub measured: String,
    /// The per-rep range behind `measured` ("–" when the rows hold no reps).
    pub spread: String,
    /// None: not measured in the latest runs.
    pub holds: Option<bool>,
    /// By how much it misses (empty when it holds).
    pub miss: String,
    /// Why it misses, as far as is known (shown with a miss only).
    pub why: &'static str,
}

impl Target {
    /// The known cause, should the target miss.
    fn because(mut self, why: &'static str) -> Self {
        self.why = why;
        self
    }

    /// "by how much: why" for a miss; empty when it holds or was not measured.
    pub fn miss_and_why(&self) -> String {
        match (self.holds, self.why) {
            (Some(false), "") => self.miss.clone(),
            (Some(false), why) => format!("{}: {why}", self.miss),
            _ => String::new(),
        }
    }

    /// The same target with the range of the per-rep values behind its median.
    fn with_spread(mut self, range: Option<Spread>) -> Self {
        self.spread = spread_text(range);
        self
    }
}

/// "min–max (k reps)", or "–" without reps.
pub fn spread_text(range: Option<Spread>) -> String {
    match range {
        Some(Spread { min, max, reps: 1 }) if min == max => format!("{} (1 rep)", num(min)),
        Some(Spread { min, max, reps: 0 }) => format!("{}–{}", num(min), num(max)),
        Some(Spread { min, max, reps }) => format!("{}–{} ({reps} reps)", num(min), num(max)),
        None => "–".into(),
    }
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
        spread: "–".into(),
        holds: v.map(&ok),
        miss: v.filter(|v| !ok(*v)).map(miss).unwrap_or_default(),
        why: "",
    }
}

/// The Ns the dataplane connection-rate target covers.
pub const CONN_RATE_NS: [u32; 5] = [1, 1_000, 10_000, 50_000, 100_000];

/// One N of the connection-rate target: the median per-rep ratio and the per-rep spread.
struct AtN {
    n: u32,
    ratio: Option<f64>,
    spread: Option<Spread>,
}

/// "ebpf ClusterIP connection rate ≥ 0.95× direct at every N up to 100k": judged on the
/// worst N's median per-rep ratio (not judged while an N is missing, unless a measured
/// one already misses); the measured text gives that N and the lowest per-rep ratio of
/// any N (the lower bound), the spread column the per-rep spread at that N.
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
        .filter_map(|at| at.spread.map(|s| s.min))
        .reduce(f64::min);
    let mut target = at_least(what, limit, Some(worst_ratio), 0.95).with_spread(worst_spread);
    let bound = lower.map_or(String::new(), |l| format!("; lower bound {l:.3}"));
    target.measured = format!("{worst_ratio:.3} (worst N = {worst_n}{bound})");
    if !missing.is_empty() {
        target.measured += &format!("; not measured at N = {}", missing.join(", "));
        // A measured N that misses already decides "at every N".
        if target.holds == Some(true) {
            target.holds = None;
        }
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
    let range = value_spread(bpf, "attached", n, metric);
    let mut target = at_most(what, "≤ 1.05", v, 1.05).with_spread(range);
    if let (Some(v), Some(range)) = (v, range) {
        target.measured = format!("{v:.3} (lower bound {:.3})", range.min);
    }
    target
}

/// The sock_connect4 cost per call: the larger of 1, 50,000 and 100,000 services, net of
/// the run-time statistics' own measured cost when the run measured it, with the spread
/// of the N it comes from.
fn sock_connect4(bpf: &[Row]) -> (Option<f64>, Option<Spread>) {
    [1, 50_000, 100_000]
        .into_iter()
        .filter_map(|n| {
            ["sock_connect4_ns_per_call_net", "sock_connect4_ns_per_call"]
                .into_iter()
                .find_map(|metric| {
                    let v = value(bpf, "ebpf", n, metric)?;
                    Some((v, value_spread(bpf, "ebpf", n, metric)))
                })
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map_or((None, None), |(v, range)| (Some(v), range))
}

/// The one-change steps of the sync suite: the first change after the cold full sync
/// (`<step>_wall`, per rep) and the steady state (`<step>_steady_ms`: per rep, the median
/// of at least 50 consecutive changes).
const CHANGE_STEPS: [(&str, [&str; 3]); 3] = [
    (
        "add_service",
        [
            "ebpf add one service, first change after the cold sync, 50,000 services (ms)",
            "ebpf add one service, steady state: t(50,000) / t(1,000)",
            "ebpf add one service, steady state at 50,000 services (ms)",
        ],
    ),
    (
        "remove_endpoint",
        [
            "ebpf remove one endpoint, first change after the cold sync, 50,000 services (ms)",
            "ebpf remove one endpoint, steady state: t(50,000) / t(1,000)",
            "ebpf remove one endpoint, steady state at 50,000 services (ms)",
        ],
    ),
    (
        "scale_4_to_40",
        [
            "ebpf scale one service 4 → 40 endpoints, first change after the cold sync, 50,000 services (ms)",
            "ebpf scale one service 4 → 40 endpoints, steady state: t(50,000) / t(1,000)",
            "ebpf scale one service 4 → 40 endpoints, steady state at 50,000 services (ms)",
        ],
    ),
];

/// The values of one (mode, N, metric) of `rows`: median and per-rep spread.
fn measured(rows: &[Row], mode: &str, n: u32, metric: &str) -> (Option<f64>, Option<Spread>) {
    let reps = rep_values(rows, mode, n, metric);
    (
        value(rows, mode, n, metric),
        spread(reps.iter().map(|(_, v)| *v)),
    )
}

/// The ratios to the baseline of one (mode, N, metric): median and per-rep spread.
fn measured_ratio(rows: &[Row], mode: &str, n: u32, metric: &str) -> (Option<f64>, Option<Spread>) {
    let reps = rep_ratios(rows, mode, n, metric);
    (
        ratio(rows, mode, n, metric),
        spread(reps.iter().map(|(_, v)| *v)),
    )
}

/// t(large) / t(small) of one metric: the ratio of the medians, and the spread of the
/// per-rep ratios (each rep's two sizes measured in the same pass).
fn scaling(rows: &[Row], metric: &str, small: u32, large: u32) -> (Option<f64>, Option<Spread>) {
    let median = match (
        value(rows, "ebpf", large, metric),
        value(rows, "ebpf", small, metric),
    ) {
        (Some(big), Some(little)) if little > 0.0 => Some(big / little),
        _ => None,
    };
    let per_rep = paired_ratios(
        &rep_values(rows, "ebpf", large, metric),
        &rep_values(rows, "ebpf", small, metric),
    );
    (median, spread(per_rep))
}

/// The scale test's rows (bench `scale`: 100,000 services × 10 endpoints, ebpf), which
/// the memory suite writes next to its own (its scale run).
pub fn scale_rows(all: &[SuiteRows]) -> Vec<Row> {
    all.iter()
        .flat_map(|s| s.rows.iter())
        .filter(|r| r.bench == "scale")
        .cloned()
        .collect()
}

/// The N of the scale test.
pub const SCALE_N: u32 = 100_000;

/// The targets of issues 8, 17 and 20 against the latest runs.
pub fn targets(all: &[SuiteRows]) -> Vec<Target> {
    let dp = rows_of(all, "dataplane");
    let sync = rows_of(all, "sync");
    let lat = rows_of(all, "latency");
    let bpf = rows_of(all, "bpf");
    // Its 4-endpoint rows: the scale run's (10 endpoints) may share a service count.
    let mem = &bench_rows(rows_of(all, "memory"), "memory");
    let scale = scale_rows(all);
    let rr = ratio(dp, "ebpf", 1, "rr_p50");
    let (rr_spread, (connect4, connect4_spread)) =
        (ratio_spread(dp, "ebpf", 1, "rr_p50"), sock_connect4(bpf));
    let mut out = vec![
        conn_rate_target(dp),
        connect_p99_target(bpf),
        at(
            "ebpf established request/response p50 / direct route (1 service; tc_pod_ingress sees both routes' packets)",
            "within ±3% (0.97–1.03)",
            rr,
            |v| (0.97..=1.03).contains(&v),
            |v| format!("{:+.1}%", (v - 1.0) * 100.0),
        )
        .with_spread(rr_spread),
    ];
    for (step, [first, steady_scaling, steady_large]) in CHANGE_STEPS {
        let (first_ms, first_spread) = measured(sync, "ebpf", 50_000, &format!("{step}_wall"));
        out.push(at_most(first, "≤ 5 ms", first_ms, 5.0).with_spread(first_spread));
        let steady = steady_metric(sync, step);
        let (ratio_50k, ratio_spread) = scaling(sync, &steady, 1_000, 50_000);
        out.push(
            at_most(
                steady_scaling,
                "≤ 1.5 (medians of ≥ 50 consecutive changes)",
                ratio_50k,
                1.5,
            )
            .with_spread(ratio_spread)
            .because(STEADY_SCALING_WHY),
        );
        let (steady_ms, steady_spread) = measured(sync, "ebpf", 50_000, &steady);
        out.push(
            at_most(
                steady_large,
                "≤ 1 ms (median of ≥ 50 consecutive changes)",
                steady_ms,
                1.0,
            )
            .with_spread(steady_spread),
        );
    }
    let (ebpf_cold, ebpf_cold_spread) = measured_ratio(sync, "ebpf", 10_000, "full_sync_wall");
    let (nft_cold, nft_cold_spread) = measured_ratio(sync, "nftables", 10_000, "full_sync_wall");
    let (nft_large, nft_large_spread) = measured(sync, "nftables", 50_000, "full_sync_wall");
    let (scale_cold, scale_cold_spread) = measured(&scale, "ebpf", SCALE_N, "cold_sync_ms");
    let failed_probes = rep_values(&scale, "ebpf", SCALE_N, "failed_probes");
    let worst_failed = failed_probes
        .iter()
        .map(|(_, v)| *v)
        .reduce(f64::max)
        .or_else(|| value(&scale, "ebpf", SCALE_N, "failed_probes"));
    let (programming, programming_spread) = measured(lat, "ebpf", 10_000, "programming_p99");
    let (rss, rss_spread) = measured(mem, "ebpf", 50_000, "agent_rss");
    out.extend([
        at_most(
            "ebpf cold load of 10,000 × 4 / raw iptables-restore of kube-proxy-shaped rules",
            "≤ 0.3",
            ebpf_cold,
            0.3,
        )
        .with_spread(ebpf_cold_spread),
        at_most(
            "nftables cold load of 10,000 × 4 / raw nft -f of kube-proxy-shaped nftables rules (issue 17)",
            "≤ 0.1",
            nft_cold,
            0.1,
        )
        .with_spread(nft_cold_spread),
        at(
            "nftables cold load of 50,000 × 4 (agent wall time, ms; issue 17)",
            "< 10,000 ms",
            nft_large,
            |v| v < 10_000.0,
            |v| format!("{}× the limit", num(v / 10_000.0)),
        )
        .with_spread(nft_large_spread),
        at_most(
            "ebpf cold sync of 100,000 services × 10 endpoints (ms)",
            "≤ 3,000 ms",
            scale_cold,
            3_000.0,
        )
        .with_spread(scale_cold_spread)
        .because(
            "about two thirds is the agent's own sync (`cold_sync_agent_ms` in the memory CSV); the rest is the directory source reading and scanning the 100 MB manifest (each in two halves at once), decoding its 200,000 objects on both cores and converting each one for the model where it was decoded, and the model filing what it gets (Services and slices at once, on two threads) and applying it on one. In the sync, what each service should have is worked out on both cores; then the services are admitted in turn on one while the other core grows the maps (allocating them, the verifier: started as soon as the estimate of the peak is known) and writes the backend and reverse-NAT entries of the services admitted so far, what it has left when admission ends going in two halves at once; after the plan, the kernel takes the service entries in two halves at once. Between runs of the same build the cold sync moves by 0.2-0.5 s on this machine, about the margin of the run that met the limit",
        ),
        Target {
            // A count: no decimals.
            measured: worst_failed.map_or_else(|| "not measured".into(), |v| format!("{v:.0}")),
            ..at(
                "ebpf failed probes during the cold sync of 100,000 × 10 (the worst rep)",
                "0",
                worst_failed,
                |v| v == 0.0,
                |v| format!("{v:.0} failed"),
            )
        }
        .with_spread(spread(failed_probes.iter().map(|(_, v)| *v))),
        at_most(
            "programming latency p99, ebpf, 10,000 services (ms)",
            "≤ 50 ms",
            programming,
            50.0,
        )
        .with_spread(programming_spread),
        at_most(
            "sock_connect4 cost per call (ns, run-time statistics less their measured overhead; the larger of 1 and 100,000 services)",
            "≤ 150 ns",
            connect4,
            150.0,
        )
        .with_spread(connect4_spread)
        .because(
            "not profiled yet; the candidates are the socket-local record each translated connect() creates and the program's hash lookups. The reported figure, connect() p99 attached / detached at 100,000 against 1 service, holds",
        ),
        at_most(
            "agent RSS at 50,000 services × 4 endpoints, ebpf (MiB)",
            "≤ 150 MiB",
            rss,
            150.0,
        )
        .with_spread(rss_spread)
        .because(
            "within a few MiB of the limit, and most of it live heap: the model's service ports and endpoints and the ebpf apply state's id allocators and per-service records, in hash tables sized to powers of two; the next steps are a smaller per-service record in the apply state and the slice cache's per-service tables",
        ),
    ]);
    out
}

/// Why a steady-state change may cost more at 50,000 services than at 1,000.
const STEADY_SCALING_WHY: &str = "a profile of a partial sync shows no work that grows with the number of services, only cache misses in the larger hash tables of the agent and of the kernel's maps; the ratio moves from run to run (see the spread), and work cut from a change at both ends (one id lookup per backend instead of several) raises it, as the time at 1,000 services falls by as much as at 50,000";

/// The sync suite's steady-state metric of a step in `rows` (`scale_4_to_40` is `scale`
/// there): `<step>_steady_ms`, or `<step>_steady` (the unit is in its own column) when
/// the rows use that name.
pub fn steady_metric(rows: &[Row], step: &str) -> String {
    let short = match step {
        "scale_4_to_40" => "scale",
        other => other,
    };
    let with_unit = format!("{short}_steady_ms");
    let bare = format!("{short}_steady");
    if !rows.iter().any(|r| r.metric == with_unit) && rows.iter().any(|r| r.metric == bare) {
        return bare;
    }
    with_unit
}

pub fn verdict(holds: Option<bool>) -> &'static str {
    match holds {
        Some(true) => "holds",
        Some(false) => "**does not hold**",
        None => "not measured",
    }
}
