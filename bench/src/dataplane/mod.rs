// SPDX-License-Identifier: Apache-2.0
//! The dataplane benchmark (`loadgen bench-dataplane`): what a connection costs through
//! each way of implementing N ClusterIP services, against the same client connecting
//! straight to the backends at the same moments.
//!
//! Modes ([`DpMode`]): `ebpf`, `iptables` and `nftables` (our agent; iptables mode runs the
//! `iptables-legacy*` commands, because the nft backend of iptables 1.8.9 cannot restore
//! 10,000+ services in reasonable time), `kube-proxy-iptables` (upstream-shaped rules from
//! [`shaped`](super::shaped) loaded with `iptables-legacy-restore`, the measured service
//! last in `KUBE-SERVICES`: the worst case), `kube-proxy-iptables@random` (the same at a
//! seeded random position; not in the full suite), `kube-proxy-nft` (upstream-shaped
//! nftables rules loaded with `nft -f`), and `direct-ct` (nothing for the services,
//! conntrack and NAT hooks on: the A-against-A baseline). The N services are the measured
//! one (two ports, 4 real backends) and N-1 fillers of 4 endpoints.
//!
//! Every (mode, N) is loaded once into namespaces built for it alone and removed
//! afterwards ([`BenchNet`]): legacy iptables tables, once created, stay in a namespace for
//! its lifetime (and make conntrack track every flow), so only a fresh node namespace is
//! clean. In each rep one client process in the client pod alternates in 100 ms slices
//! (ABBA, [`abba`]) between the mode's route (the ClusterIP) and the direct route (the
//! backends' addresses, same pod, same node namespace): the per-rep ratio compares the two
//! under the same machine conditions. What the direct route shares with the mode's is
//! whatever the node runs for every packet: in ebpf mode the socket programs (which find
//! no service at a backend's address) and `tc_pod_ingress` on the pod devices (a
//! conntrack lookup per packet); in the netfilter modes conntrack and the NAT chains (the
//! `KUBE-SERVICES` scan included). Those costs are in both routes, so a ratio is the cost
//! of the service translation; the absolute values against `direct-ct` show the rest.
//!
//! Reps whose CPU steal or load was above a limit are rejected (kept in the CSV, marked,
//! left out of medians and spreads) and replaced, a bounded number of times. Modes whose
//! load takes minutes at the largest N are capped ([`DataplaneOptions::caps`]).
//!
//! Metrics per (mode, N, rep) ([`results`]): connection rate (4 client threads, connect,
//! 1-byte request and reply, close) and connect() p50/p99; request/response p50/p99 on one
//! established connection and one-stream throughput ([`abba::run_stream_pair`]); the
//! time the mode took to load N services. Client and server are pinned to separate CPUs.

pub mod abba;
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

use super::{
    client::run_json,
    error::{Error, Result},
    load::allowed_cpus,
    manifests::{BACKEND_PORT, SERVICE_IP, SERVICE_PORT},
    net::{self, BenchNet, SERVER_IP},
    results::Environment,
    signals,
};

use self::modes::{STREAM_BACKEND_PORT, STREAM_SERVICE_PORT, backend_ips};
pub use self::{
    abba::AbbaReport,
    modes::DpMode,
    results::{DataplaneResults, Sample},
    stream::StreamReport,
};

/// How a mode is measured: reps and measured time per route.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepPlan {
    pub reps: u32,
    /// Connection-rate time per route (the rep's client run lasts twice this).
    pub duration: Duration,
}

#[derive(Debug, Clone)]
pub struct DataplaneOptions {
    pub agent_binary: PathBuf,
    pub loadgen_binary: PathBuf,
    /// The plan of the modes in [`DataplaneOptions::focus`].
    pub focus_plan: RepPlan,
    /// The modes the targets are about (and the baseline): measured with `focus_plan`.
    pub focus: Vec<DpMode>,
    /// The plan of the other modes.
    pub other_plan: RepPlan,
    /// Request/response and stream time per route.
    pub stream_duration: Duration,
    pub warmup: Duration,
    /// Length of one ABBA slice.
    pub slice: Duration,
    /// Client threads (each one connection at a time).
    pub threads: usize,
    pub service_counts: Vec<u32>,
    pub modes: Vec<DpMode>,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// How long a mode may take to load the largest N.
    pub setup_timeout: Duration,
    /// Modes measured only up to this N: loading more takes minutes (see
    /// [`DataplaneOptions::full`]).
    pub caps: Vec<(DpMode, u32)>,
    /// A rep with more CPU steal (percent of the watched CPUs' time) is rejected.
    pub max_steal_percent: f64,
    /// A rep ending with a higher 1-minute load average is rejected.
    pub max_load: f64,
    /// Rejected reps are replaced, at most this many times per (mode, N).
    pub max_replacements: u32,
    pub verbose: bool,
}

impl DataplaneOptions {
    /// The full suite, about 13 minutes on a 2-core machine: N = 1, 1,000, 10,000, 50,000,
    /// 100,000; ebpf and direct-ct 5 reps of 3 s per route, the others 3 reps of 2 s;
    /// 4 client threads, 100 ms slices.
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        let cpus = allowed_cpus().len().max(1) as f64;
        DataplaneOptions {
            agent_binary,
            loadgen_binary,
            focus_plan: RepPlan {
                reps: 5,
                duration: Duration::from_secs(3),
            },
            focus: vec![DpMode::Ebpf, DpMode::DirectCt],
            other_plan: RepPlan {
                reps: 3,
                duration: Duration::from_secs(2),
            },
            stream_duration: Duration::from_millis(500),
            warmup: Duration::from_millis(300),
            slice: Duration::from_millis(100),
            threads: 4,
            service_counts: vec![1, 1_000, 10_000, 50_000, 100_000],
            modes: vec![
                DpMode::Ebpf,
                DpMode::DirectCt,
                DpMode::Iptables,
                DpMode::Nftables,
                DpMode::KubeProxyIptables,
                DpMode::KubeProxyNft,
            ],
            client_cpu: None,
            server_cpu: None,
            setup_timeout: Duration::from_secs(300),
            // On this kernel our iptables mode takes ~4 minutes to program 50,000 services
            // with iptables-legacy, and upstream's nftables shape several minutes in
            // 1,000-service transactions (the kernel allocates each anonymous set's name by
            // scanning every set of the table): beyond the suite's time budget. The shaped
            // iptables restore takes ~50 s at 50,000 and grows faster than N; direct-ct
            // loads nothing that depends on N.
            caps: vec![
                (DpMode::Iptables, 10_000),
                (DpMode::KubeProxyNft, 10_000),
                (DpMode::KubeProxyIptables, 50_000),
                (DpMode::KubeProxyIptablesRandom, 50_000),
                (DpMode::DirectCt, 1),
            ],
            // Our own client and server keep about 2 runnable; more than 3 per CPU means
            // someone else is competing for the CPUs.
            max_steal_percent: 5.0,
            max_load: 3.0 * cpus,
            max_replacements: 2,
            verbose: true,
        }
    }

    /// The largest N `mode` is measured at, if capped.
    pub fn max_services(&self, mode: DpMode) -> Option<u32> {
        self.caps.iter().find(|(m, _)| *m == mode).map(|(_, n)| *n)
    }

    /// The slice the test suite runs: 1 rep of 0.2 s per route; every mode at N = 1, ebpf
    /// at 1,000 too.
    pub fn quick(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        let plan = RepPlan {
            reps: 1,
            duration: Duration::from_millis(200),
        };
        let full = Self::full(agent_binary, loadgen_binary);
        let caps = full
            .modes
            .iter()
            .filter(|m| **m != DpMode::Ebpf)
            .map(|m| (*m, 1))
            .collect();
        DataplaneOptions {
            focus_plan: plan,
            other_plan: plan,
            stream_duration: Duration::from_millis(100),
            warmup: Duration::from_millis(50),
            service_counts: vec![1, 1_000],
            caps,
            setup_timeout: Duration::from_secs(120),
            // Its numbers mean nothing: no rep is rejected or replaced.
            max_steal_percent: f64::INFINITY,
            max_load: f64::INFINITY,
            max_replacements: 0,
            ..full
        }
    }

    /// Reps and time per route of `mode`.
    pub fn plan(&self, mode: DpMode) -> RepPlan {
        if self.focus.contains(&mode) {
            self.focus_plan
        } else {
            self.other_plan
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
    let counts = net::service_counts(&opts.service_counts, opts.focus_plan.reps)?;
    for line in net::cleanup_stale()? {
        opts.progress(&format!("removed stale {line}"));
    }
    let env = Environment::detect();
    let cpus = opts.cpus();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut run_ids = Vec::new();
    let mut failures = Vec::new();
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
            match measure_modes(opts, cpus, &id, &group, n) {
                Ok(measured) => samples.extend(measured),
                // A mode that cannot hold N services (or fails there) leaves a gap in the
                // tables, not the whole run: the others' rows still count.
                Err(err @ (Error::Setup(_) | Error::Agent(_))) => {
                    let names: Vec<&str> = group.iter().map(|m| m.name()).collect();
                    let line = format!("N={n} {}: not measured: {err}", names.join(", "));
                    opts.progress(&line);
                    failures.push(line);
                }
                Err(err) => return Err(err),
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    opts.progress(&format!("the dataplane suite took {seconds:.0} s"));
    Ok(DataplaneResults {
        run_ids,
        env,
        client_cpu: cpus.0,
        server_cpu: cpus.1,
        seconds,
        samples,
        failures,
    })
}

/// Fresh namespaces with the measured service's backends running in the server pod: on
/// each backend address a connection server and a stream server.
fn build_with_servers(opts: &DataplaneOptions, id: &str, cpu: Option<usize>) -> Result<BenchNet> {
    let mut bench_net = BenchNet::build(id)?;
    bench_net.add_server_addresses(&backend_ips())?;
    for ip in backend_ips() {
        for (port, role) in [
            (BACKEND_PORT, "serve"),
            (STREAM_BACKEND_PORT, "serve-stream"),
        ] {
            let listen = SocketAddr::from((ip, port));
            let mut args = match role {
                "serve" => vec!["serve".to_string()],
                _ => vec!["bench-dataplane".to_string(), role.to_string()],
            };
            args.extend(["--listen".into(), listen.to_string()]);
            if let Some(cpu) = cpu {
                args.extend(["--cpu".into(), cpu.to_string()]);
            }
            let place = bench_net.server_place();
            bench_net.spawn_ready(&format!("{role}-{ip}"), &place, &opts.loadgen_binary, &args)?;
        }
    }
    Ok(bench_net)
}

/// Loads `n` services the way of each mode of `group` in turn into fresh namespaces (the
/// first loads, the others change what it loaded), measures each mode's reps there, and
/// removes the namespaces (also on error).
fn measure_modes(
    opts: &DataplaneOptions,
    (client_cpu, server_cpu): (Option<usize>, Option<usize>),
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
        let watched: Vec<usize> = client_cpu.into_iter().chain(server_cpu).collect();
        samples.extend(measure_reps(
            opts,
            (client_cpu, &watched),
            &bench_net,
            (mode, n, position, setup_seconds),
        )?);
    }
    drop(agent);
    bench_net.cleanup();
    Ok(samples)
}

/// The two routes of `mode`: (connection route, stream target) of the mode, and of the
/// direct route. `direct-ct` has no service: both of its routes are the direct one.
pub fn routes(mode: DpMode) -> [(Vec<SocketAddr>, SocketAddr); 2] {
    let direct = (
        backend_ips()
            .into_iter()
            .map(|ip| SocketAddr::from((ip, BACKEND_PORT)))
            .collect(),
        SocketAddr::from((SERVER_IP, STREAM_BACKEND_PORT)),
    );
    let service = match mode {
        DpMode::Direct | DpMode::DirectCt => direct.clone(),
        _ => (
            vec![SocketAddr::from((SERVICE_IP, SERVICE_PORT))],
            SocketAddr::from((SERVICE_IP, STREAM_SERVICE_PORT)),
        ),
    };
    [service, direct]
}

/// The 1-minute load average.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The reps of one mode, each one client run alternating between its route and the direct
/// one; rejected reps are replaced while replacements are left.
fn measure_reps(
    opts: &DataplaneOptions,
    (client_cpu, watched_cpus): (Option<usize>, &[usize]),
    bench_net: &BenchNet,
    (mode, n, position, setup_seconds): (DpMode, u32, Option<usize>, f64),
) -> Result<Vec<Sample>> {
    let plan = opts.plan(mode);
    let [service, direct] = routes(mode);
    let mut samples: Vec<Sample> = Vec::new();
    let mut accepted = 0;
    let mut rep = 0;
    while accepted < plan.reps && rep < plan.reps + opts.max_replacements {
        signals::check()?;
        // Which route takes the first slice alternates between reps too.
        let service_first = rep.is_multiple_of(2);
        let order = if service_first {
            [&service, &direct]
        } else {
            [&direct, &service]
        };
        let (report, steal_percent) =
            abba_run(opts, bench_net, client_cpu, watched_cpus, plan, order)?;
        let load = load_average();
        let (s, d) = if service_first { (0, 1) } else { (1, 0) };
        let sample = Sample {
            mode,
            services: n,
            rep,
            position,
            setup_seconds,
            conn: report.conn[s].clone(),
            stream: report.stream[s].clone(),
            direct_conn: report.conn[d].clone(),
            direct_stream: report.stream[d].clone(),
            steal_percent,
            load,
            rejected: steal_percent.is_some_and(|p| p > opts.max_steal_percent)
                || load.is_some_and(|l| l > opts.max_load),
        };
        check_errors(&sample)?;
        if !sample.rejected {
            accepted += 1;
        }
        opts.progress(&format!(
            "N={n} rep {rep} {:<20} {:>7.0} conn/s ({:.3}), connect p99 {:>6.1} us ({:.2}), rr p50 {:>5.1} us ({:.2}), {:>6.0} MB/s ({:.2}); steal {:.1}%, load {:.1}{}",
            mode.name(),
            sample.conn.rate,
            sample.conn.rate / sample.direct_conn.rate.max(f64::MIN_POSITIVE),
            sample.conn.connect_p99_us,
            sample.conn.connect_p99_us / sample.direct_conn.connect_p99_us.max(f64::MIN_POSITIVE),
            sample.stream.rr_p50_us,
            sample.stream.rr_p50_us / sample.direct_stream.rr_p50_us.max(f64::MIN_POSITIVE),
            sample.stream.throughput_mb_s,
            sample.stream.throughput_mb_s / sample.direct_stream.throughput_mb_s.max(f64::MIN_POSITIVE),
            steal_percent.unwrap_or(0.0),
            load.unwrap_or(0.0),
            if sample.rejected { " REJECTED" } else { "" },
        ));
        samples.push(sample);
        rep += 1;
    }
    Ok(samples)
}

/// Fails a rep with no connection on a route, or more than a few failed ones.
fn check_errors(s: &Sample) -> Result<()> {
    for report in [&s.conn, &s.direct_conn] {
        let attempts = report.connections + report.errors;
        if report.connections == 0
            || report.errors as f64 > super::client::MAX_ERROR_SHARE * attempts as f64
        {
            return Err(Error::Load(format!(
                "{} N={} to {}: {} of {attempts} connections failed (first: {})",
                s.mode.name(),
                s.services,
                report.target,
                report.errors,
                report.first_error.as_deref().unwrap_or("none"),
            )));
        }
    }
    Ok(())
}

/// One `bench-dataplane abba-client` run in the client pod over the two routes in `order`;
/// its report (in that order) and the CPU steal while it ran.
fn abba_run(
    opts: &DataplaneOptions,
    bench_net: &BenchNet,
    cpu: Option<usize>,
    watched_cpus: &[usize],
    plan: RepPlan,
    order: [&(Vec<SocketAddr>, SocketAddr); 2],
) -> Result<(AbbaReport, Option<f64>)> {
    let mut args = vec!["bench-dataplane".to_string(), "abba-client".into()];
    for (conn, stream) in order {
        let list: Vec<String> = conn.iter().map(SocketAddr::to_string).collect();
        args.extend(["--route".into(), list.join(",")]);
        args.extend(["--stream-target".into(), stream.to_string()]);
    }
    args.extend([
        "--seconds".into(),
        plan.duration.as_secs_f64().to_string(),
        "--stream-seconds".into(),
        opts.stream_duration.as_secs_f64().to_string(),
        "--slice-ms".into(),
        opts.slice.as_millis().to_string(),
        "--warmup-ms".into(),
        opts.warmup.as_millis().to_string(),
        "--threads".into(),
        opts.threads.to_string(),
    ]);
    if let Some(cpu) = cpu {
        args.extend(["--cpu".into(), cpu.to_string()]);
    }
    let limit =
        2 * plan.duration + 4 * opts.stream_duration + 4 * opts.warmup + Duration::from_secs(30);
    let (report, steal): (AbbaReport, _) = run_json(
        &bench_net.client_place(),
        &opts.loadgen_binary,
        &args,
        limit,
        watched_cpus,
    )?;
    if report.conn.len() != 2 || report.stream.len() != 2 {
        return Err(Error::Load(format!(
            "the client reported {} connection and {} stream routes, not 2",
            report.conn.len(),
            report.stream.len()
        )));
    }
    Ok((report, steal))
}

#[cfg(test)]
mod tests;
