// SPDX-License-Identifier: Apache-2.0
//! The dataplane benchmark (`loadgen bench-dataplane`): what a connection costs through
//! each way of implementing N ClusterIP services, against the same client connecting
//! straight to the backend.
//!
//! Modes ([`DpMode`]): `direct` (the baseline: nothing loaded), `ebpf`, `iptables` and
//! `nftables` (our agent; iptables mode runs the `iptables-legacy*` commands, because the
//! nft backend of iptables 1.8.9 cannot restore 10,000+ services in reasonable time;
//! nftables mode runs `nft` and is measured up to 50,000 services), `kube-proxy-iptables`
//! (upstream-shaped rules from [`shaped`](super::shaped) loaded with
//! `iptables-legacy-restore`, the measured service last in `KUBE-SERVICES`: the worst
//! case), `kube-proxy-iptables@random` (the same at a seeded random position) and
//! `kube-proxy-nft` (upstream-shaped nftables rules loaded with `nft -f`). The N services
//! are the measured one (two ports, one real backend) and N-1 fillers of 4 endpoints.
//!
//! Every (mode, N) is loaded once into namespaces built for it alone and removed
//! afterwards ([`BenchNet`]): legacy iptables tables, once created, stay in a namespace for
//! its lifetime (and make conntrack track every flow), so only a fresh node namespace is
//! clean. `direct` runs in one more set of namespaces where nothing is ever loaded; each
//! rep of a mode is paired with a direct run right before it (even reps) or after it (odd
//! reps), so the ratio compares the two under the same machine conditions. Modes whose
//! load takes minutes at the largest N are capped ([`DataplaneOptions::caps`]).
//!
//! Metrics per (mode, N, rep) ([`results`]): connection rate (connect, 1-byte request and
//! reply, close) and connect() p50/p99 from `loadgen client`; request/response p50/p99 on
//! one established connection and one-stream throughput from [`stream`]; the time the
//! mode took to load N services. Client and server are pinned to separate CPUs.

pub mod cli;
pub mod modes;
pub mod results;
mod setup;
pub mod stream;

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use ::tests::scenario::netns::Place;

use super::{
    client::{connection_run, run_json},
    error::{Error, Result},
    load::{ClientReport, allowed_cpus},
    manifests::{BACKEND_PORT, SERVICE_IP, SERVICE_PORT},
    net::{self, BenchNet, SERVER_IP},
    results::Environment,
    signals,
};

use self::modes::{STREAM_BACKEND_PORT, STREAM_SERVICE_PORT};
pub use self::{
    modes::DpMode,
    results::{DataplaneResults, Sample},
    stream::StreamReport,
};

#[derive(Debug, Clone)]
pub struct DataplaneOptions {
    pub agent_binary: PathBuf,
    pub loadgen_binary: PathBuf,
    pub reps: u32,
    /// Measured time of each metric's client run.
    pub duration: Duration,
    pub warmup: Duration,
    pub service_counts: Vec<u32>,
    /// Measured besides `direct` (which always runs).
    pub modes: Vec<DpMode>,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// How long a mode may take to load the largest N.
    pub setup_timeout: Duration,
    /// Modes measured only up to this N: loading more takes minutes (see
    /// [`DataplaneOptions::full`]).
    pub caps: Vec<(DpMode, u32)>,
    pub verbose: bool,
}

impl DataplaneOptions {
    /// The full suite: 3 reps of 0.8 s per metric, N = 1, 1,000, 10,000, 50,000.
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        DataplaneOptions {
            agent_binary,
            loadgen_binary,
            reps: 3,
            duration: Duration::from_millis(800),
            warmup: Duration::from_millis(300),
            service_counts: vec![1, 1_000, 10_000, 50_000],
            modes: DpMode::ALL[1..].to_vec(),
            client_cpu: None,
            server_cpu: None,
            setup_timeout: Duration::from_secs(300),
            // On this kernel our iptables mode takes ~4 minutes to program 50,000 services
            // with iptables-legacy, and upstream's nftables shape several minutes in
            // 1,000-service transactions (the kernel allocates each anonymous set's name by
            // scanning every set of the table): beyond the suite's time budget.
            caps: vec![(DpMode::Iptables, 10_000), (DpMode::KubeProxyNft, 10_000)],
            verbose: true,
        }
    }

    /// The largest N `mode` is measured at, if capped.
    pub fn max_services(&self, mode: DpMode) -> Option<u32> {
        self.caps.iter().find(|(m, _)| *m == mode).map(|(_, n)| *n)
    }

    /// The slice the test suite runs: 1 rep of 0.5 s, N = 1 and 1,000, no random placement.
    pub fn quick(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        DataplaneOptions {
            reps: 1,
            duration: Duration::from_millis(500),
            warmup: Duration::from_millis(100),
            service_counts: vec![1, 1_000],
            modes: vec![
                DpMode::Ebpf,
                DpMode::Iptables,
                DpMode::Nftables,
                DpMode::KubeProxyIptables,
                DpMode::KubeProxyNft,
            ],
            setup_timeout: Duration::from_secs(120),
            ..Self::full(agent_binary, loadgen_binary)
        }
    }

    fn cpus(&self) -> (Option<usize>, Option<usize>) {
        if self.client_cpu.is_some() || self.server_cpu.is_some() {
            return (self.client_cpu, self.server_cpu);
        }
        match allowed_cpus().as_slice() {
            [first, second, ..] => (Some(*first), Some(*second)),
            _ => (None, None),
        }
    }

    fn progress(&self, line: &str) {
        if self.verbose {
            eprintln!("==> {line}");
        }
    }
}

/// The modes of rep `rep`, in the given order in even reps and reversed in odd ones.
pub fn mode_order(modes: &[DpMode], rep: u32) -> Vec<DpMode> {
    let mut order: Vec<DpMode> = modes
        .iter()
        .copied()
        .filter(|m| *m != DpMode::Direct)
        .collect();
    if !rep.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// The modes in `order` as groups measured in one set of namespaces: the random placement
/// of the upstream-shaped iptables rules follows the last-placement one when both are
/// asked for (it reorders `KUBE-SERVICES` with a partial restore instead of loading
/// everything again, which takes minutes at 50,000 services).
pub fn mode_groups(order: &[DpMode]) -> Vec<Vec<DpMode>> {
    let both = order.contains(&DpMode::KubeProxyIptables)
        && order.contains(&DpMode::KubeProxyIptablesRandom);
    let mut groups: Vec<Vec<DpMode>> = Vec::new();
    for mode in order.iter().copied() {
        let shaped = matches!(
            mode,
            DpMode::KubeProxyIptables | DpMode::KubeProxyIptablesRandom
        );
        if both && shaped {
            let pair = vec![DpMode::KubeProxyIptables, DpMode::KubeProxyIptablesRandom];
            if !groups.contains(&pair) {
                groups.push(pair);
            }
        } else {
            groups.push(vec![mode]);
        }
    }
    groups
}

/// Runs the suite. Needs root, the agent and loadgen binaries, the eBPF object (ebpf
/// mode), `iptables-legacy*` and `nft`.
pub fn run_dataplane(opts: &DataplaneOptions) -> Result<DataplaneResults> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Setup(
            "the benchmark needs root (namespaces, cgroups, eBPF)".into(),
        ));
    }
    net::check_built(&[&opts.agent_binary, &opts.loadgen_binary])?;
    let counts = net::service_counts(&opts.service_counts, opts.reps)?;
    for line in net::cleanup_stale()? {
        opts.progress(&format!("removed stale {line}"));
    }
    let env = Environment::detect();
    let cpus = opts.cpus();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut run_ids = Vec::new();
    // The baseline's namespaces: nothing is ever loaded there, so they stay clean.
    let direct_id = net::new_run_id();
    run_ids.push(direct_id.clone());
    opts.progress(&format!("building the direct namespaces {direct_id}"));
    let mut direct_net = build_with_servers(opts, &direct_id, cpus.1)?;
    for (index, n) in counts.iter().copied().enumerate() {
        for group in mode_groups(&mode_order(&opts.modes, index as u32)) {
            let group: Vec<DpMode> = group
                .into_iter()
                .filter(|mode| {
                    let capped = opts.max_services(*mode).is_some_and(|max| n > max);
                    if capped {
                        opts.progress(&format!("N={n} {}: skipped (above its cap)", mode.name()));
                    }
                    !capped
                })
                .collect();
            if group.is_empty() {
                continue;
            }
            let id = net::new_run_id();
            run_ids.push(id.clone());
            samples.extend(measure_modes(opts, cpus, &direct_net, &id, &group, n)?);
        }
    }
    direct_net.cleanup();
    Ok(DataplaneResults {
        run_ids,
        env,
        client_cpu: cpus.0,
        server_cpu: cpus.1,
        seconds: started.elapsed().as_secs_f64(),
        samples,
    })
}

/// Fresh namespaces with the two servers running in the server pod.
fn build_with_servers(opts: &DataplaneOptions, id: &str, cpu: Option<usize>) -> Result<BenchNet> {
    let mut bench_net = BenchNet::build(id)?;
    for (listen, role) in [
        (SocketAddr::from((SERVER_IP, BACKEND_PORT)), "serve"),
        (
            SocketAddr::from((SERVER_IP, STREAM_BACKEND_PORT)),
            "serve-stream",
        ),
    ] {
        let mut args = match role {
            "serve" => vec!["serve".to_string()],
            _ => vec!["bench-dataplane".to_string(), role.to_string()],
        };
        args.extend(["--listen".into(), listen.to_string()]);
        if let Some(cpu) = cpu {
            args.extend(["--cpu".into(), cpu.to_string()]);
        }
        let place = bench_net.server_place();
        bench_net.spawn_ready(role, &place, &opts.loadgen_binary, &args)?;
    }
    Ok(bench_net)
}

/// Loads `n` services the way of each mode of `group` in turn into fresh namespaces (the
/// first loads, the others change what it loaded), then, rep after rep, measures the mode
/// there and `direct` in the clean namespaces next to it (direct first in even reps,
/// second in odd ones), and removes the namespaces (also on error).
fn measure_modes(
    opts: &DataplaneOptions,
    (client_cpu, server_cpu): (Option<usize>, Option<usize>),
    direct_net: &BenchNet,
    id: &str,
    group: &[DpMode],
    n: u32,
) -> Result<Vec<Sample>> {
    let mut bench_net = build_with_servers(opts, id, server_cpu)?;
    let mut samples = Vec::new();
    // Declared after the namespaces: it stops (and cleans up) before they go.
    let mut agent = None;
    for (index, mode) in group.iter().copied().enumerate() {
        let setup_started = Instant::now();
        let position = if index == 0 {
            let (started, position) = setup::load(opts, &bench_net, mode, n)?;
            agent = started;
            position
        } else {
            setup::reorder(opts, &bench_net, group[index - 1], mode, n)?
        };
        let setup_seconds = setup_started.elapsed().as_secs_f64();
        opts.progress(&format!(
            "N={n} {}: loaded in {setup_seconds:.1} s",
            mode.name()
        ));
        samples.extend(measure_reps(
            opts,
            client_cpu,
            direct_net,
            &bench_net,
            (mode, n, position, setup_seconds),
        )?);
    }
    drop(agent);
    bench_net.cleanup();
    Ok(samples)
}

/// The reps of one mode, each paired with a direct run.
fn measure_reps(
    opts: &DataplaneOptions,
    client_cpu: Option<usize>,
    direct_net: &BenchNet,
    bench_net: &BenchNet,
    (mode, n, position, setup_seconds): (DpMode, u32, Option<usize>, f64),
) -> Result<Vec<Sample>> {
    let direct = (
        SocketAddr::from((SERVER_IP, BACKEND_PORT)),
        SocketAddr::from((SERVER_IP, STREAM_BACKEND_PORT)),
    );
    let service = (
        SocketAddr::from((SERVICE_IP, SERVICE_PORT)),
        SocketAddr::from((SERVICE_IP, STREAM_SERVICE_PORT)),
    );
    let mut samples = Vec::new();
    for rep in 0..opts.reps {
        signals::check()?;
        let mode_place = bench_net.client_place();
        let direct_place = direct_net.client_place();
        let run = |place: &Place, (conn, stream): (SocketAddr, SocketAddr)| -> Result<_> {
            Ok((
                conn_run(opts, place, conn, client_cpu)?,
                stream_run(opts, place, stream, client_cpu)?,
            ))
        };
        let (base, measured) = if rep.is_multiple_of(2) {
            let base = run(&direct_place, direct)?;
            (base, run(&mode_place, service)?)
        } else {
            let measured = run(&mode_place, service)?;
            (run(&direct_place, direct)?, measured)
        };
        let sample = Sample {
            mode,
            services: n,
            rep,
            position,
            setup_seconds,
            conn: measured.0,
            stream: measured.1,
            direct_conn: base.0,
            direct_stream: base.1,
        };
        opts.progress(&format!(
            "N={n} rep {rep} {:<26} {:>7.0} conn/s ({:.2}), connect p99 {:>6.1} us ({:.2}), rr p50 {:>5.1} us ({:.2}), {:>6.0} MB/s ({:.2})",
            mode.name(),
            sample.conn.rate,
            sample.conn.rate / sample.direct_conn.rate.max(f64::MIN_POSITIVE),
            sample.conn.connect_p99_us,
            sample.conn.connect_p99_us / sample.direct_conn.connect_p99_us.max(f64::MIN_POSITIVE),
            sample.stream.rr_p50_us,
            sample.stream.rr_p50_us / sample.direct_stream.rr_p50_us.max(f64::MIN_POSITIVE),
            sample.stream.throughput_mb_s,
            sample.stream.throughput_mb_s / sample.direct_stream.throughput_mb_s.max(f64::MIN_POSITIVE),
        ));
        samples.push(sample);
    }
    Ok(samples)
}

fn conn_run(
    opts: &DataplaneOptions,
    client: &Place,
    target: SocketAddr,
    cpu: Option<usize>,
) -> Result<ClientReport> {
    connection_run(
        client,
        &opts.loadgen_binary,
        target,
        opts.duration,
        opts.warmup,
        cpu,
    )
}

fn stream_run(
    opts: &DataplaneOptions,
    client: &Place,
    target: SocketAddr,
    cpu: Option<usize>,
) -> Result<StreamReport> {
    let mut args = vec![
        "bench-dataplane".to_string(),
        "stream-client".into(),
        "--target".into(),
        target.to_string(),
        "--seconds".into(),
        opts.duration.as_secs_f64().to_string(),
        "--warmup-ms".into(),
        opts.warmup.as_millis().to_string(),
    ];
    if let Some(cpu) = cpu {
        args.extend(["--cpu".into(), cpu.to_string()]);
    }
    let limit = 2 * opts.duration + 2 * opts.warmup + Duration::from_secs(20);
    let (report, _) = run_json(client, &opts.loadgen_binary, &args, limit, &[])?;
    Ok(report)
}

#[cfg(test)]
mod tests;
