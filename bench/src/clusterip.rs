// SPDX-License-Identifier: Apache-2.0
//! The ClusterIP benchmark: builds the namespaces ([`net`]), starts the
//! echo server and the agent, then, rep after rep, for each service count (ascending in
//! even reps, descending in odd ones) loads the maps, waits until the agent has synced them
//! and the service map holds exactly that many frontends, and runs the client, which
//! alternates in short slices between connecting straight to the backend and through the
//! ClusterIP. Everything is removed afterwards, also on error or signal.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use ::tests::scenario::readiness::Change;

use super::{
    agent::BenchAgent,
    client::{MAX_ERROR_SHARE, run_json},
    error::{Error, Result},
    load::{ClientReport, allowed_cpus},
    manifests::{self, BACKEND_PORT, SERVICE_IP, SERVICE_PORT},
    net::{self, BenchNet, SERVER_IP},
    results::{BenchResults, Environment, Route, Sample, summarize},
    signals,
};

/// The longest the reverse-NAT fill may take (it ends early once it made its connections).
const FILL_TIME_LIMIT: Duration = Duration::from_secs(120);

/// How long one client run measures, and how many connections it makes at most.
struct ClientLimits {
    /// Measured time per route.
    duration: Duration,
    warmup: Duration,
    /// Per route.
    max_connections: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub agent_binary: PathBuf,
    /// The `loadgen` binary (its `serve` and `client` modes run in the namespaces).
    pub loadgen_binary: PathBuf,
    pub reps: u32,
    pub rep_duration: Duration,
    pub warmup: Duration,
    /// Services in the maps, one phase each (the measured one included; sorted here).
    pub service_counts: Vec<u32>,
    /// `None`: the first two CPUs this process may use, when there are two.
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// How long the agent may take for one sync (10,000 services included).
    pub sync_timeout: Duration,
    /// Before the first phase, make enough ClusterIP connections to fill the socket
    /// reverse-NAT LRU map, so that every phase runs with it full, as on a node in steady
    /// state. (Every translated connect() writes an entry; once the map is full each write
    /// evicts, which shows in the connect() p99. Without the fill, the first phase would run
    /// with an empty map and later phases with a full one.)
    pub fill_sock_rev_nat: bool,
    /// Progress lines go to stderr.
    pub verbose: bool,
}

impl BenchOptions {
    /// The full benchmark: 5 reps of 3 s per route, with 1 and 10,000 services.
    /// (A rep measures both routes, alternating, so it lasts twice `rep_duration`.)
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        BenchOptions {
            agent_binary,
            loadgen_binary,
            reps: 5,
            rep_duration: Duration::from_secs(3),
            warmup: Duration::from_millis(500),
            service_counts: vec![1, 10_000],
            client_cpu: None,
            server_cpu: None,
            sync_timeout: Duration::from_secs(180),
            fill_sock_rev_nat: true,
            verbose: true,
        }
    }

    /// The slice the test suite runs: 1 rep of 1 s, with 1 and 100 services.
    pub fn quick(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        BenchOptions {
            reps: 1,
            rep_duration: Duration::from_secs(1),
            warmup: Duration::from_millis(200),
            service_counts: vec![1, 100],
            sync_timeout: Duration::from_secs(60),
            fill_sock_rev_nat: false,
            ..Self::full(agent_binary, loadgen_binary)
        }
    }

    /// The CPUs for client and server: as given, else the first two allowed ones.
    fn cpus(&self) -> (Option<usize>, Option<usize>) {
        if self.client_cpu.is_some() || self.server_cpu.is_some() {
            return (self.client_cpu, self.server_cpu);
        }
        match allowed_cpus().as_slice() {
            [first, second, ..] => (Some(*first), Some(*second)),
            _ => (None, None),
        }
    }
}

fn progress(opts: &BenchOptions, line: &str) {
    if opts.verbose {
        eprintln!("==> {line}");
    }
}

/// Runs the benchmark and returns its samples and ratios. Needs root.
pub fn run_clusterip(opts: &BenchOptions) -> Result<BenchResults> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Setup(
            "the benchmark needs root (namespaces, cgroups, eBPF)".into(),
        ));
    }
    net::check_built(&[&opts.agent_binary, &opts.loadgen_binary])?;
    let counts = net::service_counts(&opts.service_counts, opts.reps)?;
    for line in net::cleanup_stale()? {
        progress(opts, &format!("removed stale {line}"));
    }
    let env = Environment::detect();
    let (client_cpu, server_cpu) = opts.cpus();

    let id = net::new_run_id();
    progress(opts, &format!("building namespaces {id}-{{node,cli,srv}}"));
    let mut bench_net = BenchNet::build(&id)?;
    let manifests_dir = bench_net.measured_manifests()?;
    bench_net.start_backend(&opts.loadgen_binary, server_cpu)?;

    progress(opts, "starting the agent (ebpf mode)");
    let bpffs = net::bpffs_root(&id);
    let started = SystemTime::now();
    // Declared after the namespaces, so it stops (and unpins) before they go.
    let mut agent = BenchAgent::start(
        &opts.agent_binary,
        bench_net.node_place(),
        &bench_net.run_dir,
        &manifests_dir,
        &bpffs,
    )?;
    agent.wait_initial_sync(started, opts.sync_timeout)?;

    let runner = Runner {
        opts,
        net: &bench_net,
        client_cpu,
        watched_cpus: client_cpu.into_iter().chain(server_cpu).collect(),
    };
    let mut samples = Vec::new();
    let mut loaded = 1u32;
    let mut fill: Option<u64> = None;
    let mut client_runs = 0u32;
    for rep in 0..opts.reps {
        for (slot, services) in phase_order(&counts, rep).into_iter().enumerate() {
            signals::check()?;
            if services != loaded || rep == 0 && slot == 0 {
                load_services(opts, &mut agent, &manifests_dir, &bpffs, services)?;
                loaded = services;
            }
            if opts.fill_sock_rev_nat && fill.is_none() {
                fill = Some(fill_sock_rev_nat(opts, &runner)?);
            }
            let order = Route::order(client_runs);
            client_runs += 1;
            let (reports, steal_percent) = runner.run(
                &order,
                &ClientLimits {
                    duration: opts.rep_duration,
                    warmup: opts.warmup,
                    max_connections: None,
                },
            )?;
            for (route, report) in order.into_iter().zip(reports) {
                progress(
                    opts,
                    &format!(
                        "N={services} rep {rep} {:<9}: {:>8.0} conn/s, connect p50 {:.1} us, p99 {:.1} us",
                        route.as_str(),
                        report.rate,
                        report.connect_p50_us,
                        report.connect_p99_us
                    ),
                );
                samples.push(Sample {
                    route,
                    services,
                    rep,
                    report,
                    steal_percent,
                });
            }
        }
    }
    drop(agent);
    bench_net.cleanup();
    Ok(BenchResults {
        sock_rev_nat_fill: fill,
        run_id: id,
        env,
        rep_seconds: opts.rep_duration.as_secs_f64(),
        client_cpu,
        server_cpu,
        summary: summarize(&samples),
        samples,
    })
}

/// The service counts of rep `rep`: ascending in even reps, descending in odd ones, so the
/// counts are measured next to each other in time (ABBA) and a drift of the machine
/// between the start and the end of the run falls on all of them alike.
pub fn phase_order(counts: &[u32], rep: u32) -> Vec<u32> {
    let mut order = counts.to_vec();
    order.sort_unstable();
    if !rep.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// Makes the maps hold `services` services (the measured one and `services - 1` fillers)
/// and waits until the agent has synced them and the service map shows exactly that many.
fn load_services(
    opts: &BenchOptions,
    agent: &mut BenchAgent,
    manifests_dir: &Path,
    bpffs: &Path,
    services: u32,
) -> Result<()> {
    let fillers = manifests_dir.join("fillers.json");
    let changed_at = SystemTime::now();
    let started = Instant::now();
    let changed = if services > 1 {
        net::write_atomically(&fillers, &manifests::filler_services(services - 1))?;
        true
    } else if fillers.exists() {
        fs::remove_file(&fillers).map_err(Error::io(format!("removing {}", fillers.display())))?;
        true
    } else {
        false
    };
    if changed {
        agent.wait_synced(
            Change {
                started: changed_at,
                at: SystemTime::now(),
                initial: false,
            },
            opts.sync_timeout,
        )?;
    }
    super::maps::wait_frontends(agent, bpffs, services, opts.sync_timeout)?;
    progress(
        opts,
        &format!(
            "{services} services in the service map (synced in {:.1} s)",
            started.elapsed().as_secs_f64()
        ),
    );
    Ok(())
}

/// Makes enough ClusterIP connections to fill the socket reverse-NAT map; returns how
/// many were made.
fn fill_sock_rev_nat(opts: &BenchOptions, runner: &Runner<'_>) -> Result<u64> {
    let entries = u64::from(proxy_agent::config::MapSizes::default().sock_rev_nat);
    let wanted = entries + entries / 10;
    progress(
        opts,
        &format!("filling the socket reverse-NAT map: {wanted} connections through the ClusterIP"),
    );
    let (reports, _) = runner.run(
        &[Route::ClusterIp],
        &ClientLimits {
            duration: FILL_TIME_LIMIT,
            warmup: Duration::ZERO,
            max_connections: Some(wanted),
        },
    )?;
    let made = reports.first().map_or(0, |r| r.connections);
    progress(opts, &format!("made {made} connections"));
    Ok(made)
}

struct Runner<'a> {
    opts: &'a BenchOptions,
    net: &'a BenchNet,
    client_cpu: Option<usize>,
    /// Whose steal time is recorded (empty: all CPUs).
    watched_cpus: Vec<usize>,
}

impl Runner<'_> {
    fn target(route: Route) -> SocketAddr {
        match route {
            Route::Direct => SocketAddr::from((SERVER_IP, BACKEND_PORT)),
            Route::ClusterIp => SocketAddr::from((SERVICE_IP, SERVICE_PORT)),
        }
    }

    /// One client run in the client pod, alternating between the routes in `order`, and
    /// the CPU steal while it ran. One report per route, in `order`.
    fn run(
        &self,
        order: &[Route],
        limits: &ClientLimits,
    ) -> Result<(Vec<ClientReport>, Option<f64>)> {
        signals::check()?;
        let mut args = vec!["client".to_string()];
        for route in order {
            args.extend(["--target".into(), Self::target(*route).to_string()]);
        }
        args.extend([
            "--seconds".into(),
            format!("{}", limits.duration.as_secs_f64()),
            "--warmup-ms".into(),
            limits.warmup.as_millis().to_string(),
        ]);
        if let Some(max) = limits.max_connections {
            args.extend(["--max-connections".into(), max.to_string()]);
        }
        if let Some(cpu) = self.client_cpu {
            args.extend(["--cpu".into(), cpu.to_string()]);
        }
        let routes = u32::try_from(order.len()).unwrap_or(u32::MAX);
        let limit = routes * limits.duration + limits.warmup + Duration::from_secs(20);
        let (reports, steal): (Vec<ClientReport>, _) = run_json(
            &self.net.client_place(),
            &self.opts.loadgen_binary,
            &args,
            limit,
            &self.watched_cpus,
        )?;
        if reports.len() != order.len() {
            return Err(Error::Load(format!(
                "the client reported {} targets, not {}",
                reports.len(),
                order.len()
            )));
        }
        for (route, report) in order.iter().zip(&reports) {
            let attempts = report.connections + report.errors;
            if report.connections == 0 || report.errors as f64 > MAX_ERROR_SHARE * attempts as f64 {
                return Err(Error::Load(format!(
                    "{} to {}: {} of {attempts} connections failed (first: {})",
                    route.as_str(),
                    report.target,
                    report.errors,
                    report.first_error.as_deref().unwrap_or("none"),
                )));
            }
        }
        Ok((reports, steal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_counts_alternate_abba() {
        assert_eq!(phase_order(&[10_000, 1], 0), [1, 10_000]);
        assert_eq!(phase_order(&[1, 10_000], 1), [10_000, 1]);
        assert_eq!(phase_order(&[1, 100, 10_000], 2), [1, 100, 10_000]);
    }

    /// The quick slice, as the test suite runs it: it must measure both routes at both
    /// service counts, see the maps hold the services, and leave nothing behind. Speed is
    /// not judged. Needs root, the eBPF object and the built binaries; without them it
    /// skips, unless PROXY_REQUIRE_EBPF=1 (as `cargo xtask test` sets) says they must be
    /// there.
    #[test]
    fn quick_bench_measures_both_routes_and_cleans_up() {
        let Some(crate::quick::Built { agent, loadgen }) = crate::quick::prerequisites("clusterip")
        else {
            return;
        };
        let mut opts = BenchOptions::quick(agent, loadgen);
        opts.verbose = false;
        let results = run_clusterip(&opts).expect("quick bench");

        assert_eq!(results.samples.len(), 4);
        for services in [1, 100] {
            for route in [Route::Direct, Route::ClusterIp] {
                let s = results
                    .samples
                    .iter()
                    .find(|s| s.services == services && s.route == route)
                    .expect("a sample per route and count");
                assert!(s.report.connections > 0, "{s:?}");
                assert_eq!(s.report.errors, 0, "{s:?}");
                assert_eq!(s.report.target, Runner::target(route));
            }
        }
        let phases: Vec<u32> = results.summary.phases.iter().map(|p| p.services).collect();
        assert_eq!(phases, [1, 100]);
        assert!(results.summary.scaling.is_some());
        let steal_rows = results
            .samples
            .iter()
            .filter(|s| s.steal_percent.is_some())
            .count();
        assert_eq!(results.csv_rows().len(), 4 * 4 + steal_rows + 2 * 6 + 3);
        assert_eq!(net::owner_pid(&results.run_id), Some(std::process::id()));
        let left = net::leftovers(&results.run_id).unwrap();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
