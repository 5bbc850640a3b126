// SPDX-License-Identifier: Apache-2.0
//! What a latency run sets up around the agent (root): its settings and environment, the
//! fail-fast route, the prober process, and the agent's sync counters.

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};

use ::tests::scenario::{
    agent::{METRICS_BIND, get_in},
    netns::{ip_in, sysctl_in, sysctl_in_ignoring_unknown},
};

use super::{
    objects::CLUSTER_RANGE,
    options::{LatencyMode, LatencyOptions},
    prober::{Report, parse_report},
    results::SyncCounts,
};
use crate::{
    client::LineChild,
    error::{Error, Result},
    metrics::metric_sum,
    net::BenchNet,
};

/// The agent's settings: no periodic resync within the run, maps with room for the
/// fillers and every change, and the minSyncPeriod asked for (ebpf mode reads the
/// `iptables` section's periods, as upstream's "every other mode").
pub(super) fn agent_fragment(opts: &LatencyOptions) -> Map<String, Value> {
    let room = (u64::from(opts.services) * 8 + opts.total_changes() * 4 + 1024)
        .next_power_of_two()
        .max(65_536);
    let mut fragment = Map::new();
    fragment.insert(
        "iptables".into(),
        json!({
            "syncPeriod": "1h",
            "minSyncPeriod": format!("{}ms", opts.min_sync_period.as_millis()),
        }),
    );
    fragment.insert(
        "ebpf".into(),
        json!({"mapSizes": {"services": room, "backends": room, "revNat": room}}),
    );
    fragment
}

/// A PATH whose iptables and ip6tables commands are the legacy ones, then the usual PATH.
pub(super) fn legacy_path(run_dir: &Path) -> Result<OsString> {
    let dir = run_dir.join("legacy-bin");
    fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let target = PathBuf::from(format!("/usr/sbin/{family}-legacy{suffix}"));
            if !target.exists() {
                return Err(Error::Setup(format!("{} is missing", target.display())));
            }
            let link = dir.join(format!("{family}{suffix}"));
            std::os::unix::fs::symlink(&target, &link)
                .map_err(Error::io(format!("linking {}", link.display())))?;
        }
    }
    let mut path = dir.into_os_string();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()));
    Ok(path)
}

/// Routes the ClusterIP range nowhere where an untranslated connect is first routed.
pub(super) fn fail_fast_route(opts: &LatencyOptions, bench_net: &BenchNet) -> Result<()> {
    let ns = match opts.mode {
        LatencyMode::Ebpf => &bench_net.client_ns,
        LatencyMode::IptablesLegacy => {
            // The node answers each unroutable SYN with an ICMP error: no rate limit.
            sysctl_in(&bench_net.node_ns, &[("net.ipv4.icmp_ratelimit", "0")])?;
            sysctl_in_ignoring_unknown(
                &bench_net.node_ns,
                &[
                    ("net.ipv4.icmp_msgs_per_sec", "1000000"),
                    ("net.ipv4.icmp_msgs_burst", "100000"),
                ],
            )?;
            &bench_net.node_ns
        }
    };
    ip_in(ns, &["route", "add", "unreachable", CLUSTER_RANGE])?;
    Ok(())
}

/// The prober process and the lines it printed; killed on drop.
pub(super) struct ProberProcess {
    process: LineChild,
}

impl ProberProcess {
    pub(super) fn start(opts: &LatencyOptions, bench_net: &BenchNet) -> Result<Self> {
        let args = [
            "bench-latency".to_string(),
            "--prober".into(),
            "--give-up-ms".into(),
            opts.give_up.as_millis().to_string(),
            "--probe-budget".into(),
            opts.probe_budget.to_string(),
        ];
        let process = LineChild::start(
            "prober",
            &bench_net.client_place(),
            &opts.loadgen_binary,
            &args,
            bench_net.run_dir.join("prober.log"),
            Duration::from_secs(10),
        )?;
        Ok(ProberProcess { process })
    }

    /// What it reported so far, a line at a time.
    pub(super) fn lines(&self) -> &Receiver<String> {
        &self.process.lines
    }

    pub(super) fn send(&mut self, line: &str) -> Result<()> {
        self.process.send(line)
    }

    /// Closes its input and waits for its `end` line.
    pub(super) fn finish(&mut self, timeout: Duration) -> Result<(u64, u64, u64)> {
        self.process.close_input();
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.process.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(Report::End {
                        control_attempts,
                        control_successes,
                        longest_interval_us,
                    }) = parse_report(&line)
                    {
                        return Ok((control_attempts, control_successes, longest_interval_us));
                    }
                }
                Err(_) => return Err(Error::Load("the prober did not finish".into())),
            }
        }
    }
}

pub(super) fn sync_counts(node_ns: &str) -> SyncCounts {
    let url = format!("http://{METRICS_BIND}/metrics");
    let text = get_in(node_ns, &url, Duration::from_millis(500))
        .map(|r| r.body)
        .unwrap_or_default();
    let value = |kind: &str, part: &str| {
        let name = format!("kubeproxy_sync_{kind}_proxy_rules_duration_seconds_{part}");
        metric_sum(&text, &name).unwrap_or(0.0)
    };
    SyncCounts {
        // Counts are small whole numbers.
        full: value("full", "count") as u64,
        partial: value("partial", "count") as u64,
        full_seconds: value("full", "sum"),
        partial_seconds: value("partial", "sum"),
    }
}
