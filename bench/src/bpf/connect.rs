// SPDX-License-Identifier: Apache-2.0
//! What the socket programs add to connect(), without run-time statistics: one client
//! process alternates in 100 ms slices (ABBA) between connecting to the ClusterIP from the
//! node's cgroup, where the agent attached its programs (`attached`: connect4 finds the
//! service, picks the backend, rewrites the address and records the reverse translation),
//! and connecting to the backend's own address from a sibling cgroup where no program is
//! attached (`detached`). The client moves itself between the two cgroups at each slice
//! (sockets belong to the cgroup they were created in); the move is outside the timed
//! connect(). Both routes end at the same backend through the same namespaces.
//!
//! Per rep: connect() p50, p99 and mean and the connection rate of both, `attached` rows
//! with the ratio to the `detached` value of the same rep. Across service counts, the
//! `connect_p99_vs_1` rows compare rep i at N with rep i at 1 service, each normalised by
//! its own detached p99 (so a drift of the machine between the two phases cancels):
//! (attached/detached at N) / (attached/detached at 1).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use ::tests::scenario::netns;

use crate::{
    client::{MAX_ERROR_SHARE, run_json},
    error::{Error, Result},
    load::ClientReport,
    manifests::{BACKEND_PORT, SERVICE_IP, SERVICE_PORT},
    net::{BenchNet, SERVER_IP},
    rows::Row,
};

use super::BENCH;

pub const MODE_ATTACHED: &str = "attached";
pub const MODE_DETACHED: &str = "detached";
pub const METRIC_P99_VS_1: &str = "connect_p99_vs_1";

/// A cgroup beside the node's with no program attached; removed on drop.
#[derive(Debug)]
pub struct BareCgroup {
    pub path: PathBuf,
}

impl BareCgroup {
    /// `<cgroup2 root>/<id>-bare` (named after the run, so a crashed run's is found and
    /// removed by [`cleanup_stale`](crate::net::cleanup_stale)).
    pub fn create(id: &str) -> Result<Self> {
        let path = netns::cgroup2_root()?.join(format!("{id}-bare"));
        netns::create_cgroup(&path)?;
        Ok(BareCgroup { path })
    }
}

impl Drop for BareCgroup {
    fn drop(&mut self) {
        if let Err(err) = netns::remove_cgroup(&self.path) {
            eprintln!("cleanup: {err}");
        }
    }
}

/// One rep's two reports.
#[derive(Debug, Clone)]
pub struct ConnectRep {
    pub services: u32,
    pub rep: u32,
    pub attached: ClientReport,
    pub detached: ClientReport,
}

/// One client run alternating between the two routes for `duration` each (the route of
/// the first slice alternates with the rep).
pub fn measure(
    bench_net: &BenchNet,
    loadgen: &Path,
    bare: &Path,
    (client_cpu, watched): (Option<usize>, &[usize]),
    duration: Duration,
    (services, rep): (u32, u32),
) -> Result<ConnectRep> {
    let attached = (
        SocketAddr::from((SERVICE_IP, SERVICE_PORT)),
        bench_net.cgroup.clone(),
    );
    let detached = (
        SocketAddr::from((SERVER_IP, BACKEND_PORT)),
        bare.to_path_buf(),
    );
    let attached_first = rep.is_multiple_of(2);
    let order = if attached_first {
        [&attached, &detached]
    } else {
        [&detached, &attached]
    };
    let mut args = vec!["client".to_string()];
    for (target, cgroup) in order {
        args.extend(["--target".into(), target.to_string()]);
        args.extend(["--target-cgroup".into(), cgroup.display().to_string()]);
    }
    let warmup = Duration::from_millis(300);
    args.extend([
        "--seconds".into(),
        duration.as_secs_f64().to_string(),
        "--warmup-ms".into(),
        warmup.as_millis().to_string(),
    ]);
    if let Some(cpu) = client_cpu {
        args.extend(["--cpu".into(), cpu.to_string()]);
    }
    let limit = 2 * duration + warmup + Duration::from_secs(20);
    let (mut reports, _): (Vec<ClientReport>, _) =
        run_json(&bench_net.client_place(), loadgen, &args, limit, watched)?;
    if reports.len() != 2 {
        return Err(Error::Load(format!(
            "the client reported {} targets, not 2",
            reports.len()
        )));
    }
    for report in &reports {
        let attempts = report.connections + report.errors;
        if report.connections == 0 || report.errors as f64 > MAX_ERROR_SHARE * attempts as f64 {
            return Err(Error::Load(format!(
                "connect() cost, {}: {} of {attempts} connections failed (first: {})",
                report.target,
                report.errors,
                report.first_error.as_deref().unwrap_or("none"),
            )));
        }
    }
    let second = reports.remove(1);
    let first = reports.remove(0);
    let (attached, detached) = if attached_first {
        (first, second)
    } else {
        (second, first)
    };
    Ok(ConnectRep {
        services,
        rep,
        attached,
        detached,
    })
}

fn metrics(r: &ClientReport) -> [(&'static str, f64, &'static str); 4] {
    [
        ("connect_p50", r.connect_p50_us, "us"),
        ("connect_p99", r.connect_p99_us, "us"),
        ("connect_mean", r.connect_mean_us, "us"),
        ("conn_rate", r.rate, "conn/s"),
    ]
}

/// The rows of the reps: both routes' metrics, `attached` with its ratio to `detached`;
/// and, for every N above the smallest, each rep's p99 ratio against the smallest N's
/// same rep.
pub fn rows(reps: &[ConnectRep]) -> Vec<Row> {
    let row = |mode: &str, r: &ConnectRep, metric: &str, value: f64, unit, ratio| Row {
        bench: BENCH,
        mode: mode.into(),
        n: u64::from(r.services),
        rep: r.rep.to_string(),
        metric: metric.into(),
        value,
        unit,
        ratio,
    };
    let mut out = Vec::new();
    for r in reps {
        for ((metric, att, unit), (_, det, _)) in
            metrics(&r.attached).into_iter().zip(metrics(&r.detached))
        {
            let ratio = (det > 0.0).then(|| att / det);
            out.push(row(MODE_ATTACHED, r, metric, att, unit, ratio));
            out.push(row(MODE_DETACHED, r, metric, det, unit, None));
        }
    }
    let normalised = |r: &ConnectRep| {
        (r.detached.connect_p99_us > 0.0)
            .then(|| r.attached.connect_p99_us / r.detached.connect_p99_us)
    };
    let Some(smallest) = reps.iter().map(|r| r.services).min() else {
        return out;
    };
    for r in reps.iter().filter(|r| r.services != smallest) {
        let base = reps
            .iter()
            .find(|b| b.services == smallest && b.rep == r.rep)
            .and_then(normalised);
        if let (Some(at_n), Some(at_1)) = (normalised(r), base)
            && at_1 > 0.0
        {
            let v = at_n / at_1;
            out.push(row(MODE_ATTACHED, r, METRIC_P99_VS_1, v, "ratio", Some(v)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::summarize;

    fn report(p99_us: u32) -> ClientReport {
        let target: SocketAddr = "10.96.0.10:80".parse().unwrap();
        // 100 connect() times: 99 of 10 us and one of p99_us; p99 is the 99th.
        let mut lat = vec![10_000u32; 98];
        lat.extend([p99_us * 1000, p99_us * 1000]);
        summarize(target, lat, 0, None, 1.0)
    }

    #[test]
    fn attached_rows_carry_the_ratio_and_scaling_pairs_reps() {
        let rep = |services, rep, att, det| ConnectRep {
            services,
            rep,
            attached: report(att),
            detached: report(det),
        };
        let reps = [
            rep(1, 0, 40, 20),
            rep(1, 1, 30, 30),
            rep(100_000, 0, 44, 20),
            rep(100_000, 1, 30, 25),
        ];
        let rows = rows(&reps);
        let find = |mode: &str, n: u64, rep: &str, metric: &str| {
            rows.iter()
                .find(|r| r.mode == mode && r.n == n && r.rep == rep && r.metric == metric)
                .unwrap_or_else(|| panic!("no {mode} {n} {rep} {metric} in {rows:#?}"))
                .clone()
        };
        let att = find(MODE_ATTACHED, 1, "0", "connect_p99");
        assert_eq!((att.value, att.ratio), (40.0, Some(2.0)));
        assert_eq!(find(MODE_DETACHED, 1, "0", "connect_p99").ratio, None);
        // (44/20) / (40/20) = 1.1; (30/25) / (30/30) = 1.2.
        let s0 = find(MODE_ATTACHED, 100_000, "0", METRIC_P99_VS_1);
        assert!((s0.value - 1.1).abs() < 1e-9, "{s0:?}");
        let s1 = find(MODE_ATTACHED, 100_000, "1", METRIC_P99_VS_1);
        assert!((s1.value - 1.2).abs() < 1e-9, "{s1:?}");
        assert!(!rows.iter().any(|r| r.n == 1 && r.metric == METRIC_P99_VS_1));
    }
}
