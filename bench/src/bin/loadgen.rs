// SPDX-License-Identifier: Apache-2.0
//! `loadgen`: the benchmark load generator (`serve`, `client`, `udp-client`) and the
//! benchmarks that run them in network namespaces (`bench-clusterip`, `bench-nodeport`,
//! `bench-sync`; root only).
//!
//! ```text
//! loadgen serve --listen 10.244.1.2:8080 [--cpu 1]        # prints READY, answers forever
//! loadgen client --target 10.244.1.2:8080 --target 10.96.0.10:80 --seconds 3 [--cpu 0]
//! sudo loadgen bench-clusterip [--quick] [--csv FILE]     # see `cargo xtask bench clusterip`
//! loadgen udp-client --target 10.180.0.1:8080 --target 192.168.0.2:30081 --seconds 2
//! sudo loadgen bench-nodeport [--quick] [--csv FILE]     # see `cargo xtask bench nodeport`
//! sudo loadgen bench-sync --mode iptables [--quick]     # see `cargo xtask bench sync-iptables`
//! sudo loadgen bench-sync-modes [--quick] [--csv FILE]   # see `cargo xtask bench sync`
//! sudo loadgen bench-bpf [--quick] [--csv FILE]         # program cost, map updates, Maglev
//! sudo loadgen bench-memory [--quick] [--csv FILE]      # agent RSS, BPF map memory, scale
//!     [--scale-services 100000 --scale-endpoints 10 --scale-reps 1]
//! sudo loadgen bench-dataplane [--quick] [--csv FILE]  # direct/ebpf/iptables/kube-proxy-*
//! sudo loadgen bench-latency [--quick] [--mode ebpf --mode iptables-legacy] [--csv FILE]
//! sudo loadgen bench-report-suites --csv-dir target/bench --publish docs/bench [--quick]
//! sudo loadgen cleanup-stale                              # after a run was SIGKILLed
//! ```
#![forbid(unsafe_code)]

use std::{
    io::Write as _,
    net::{SocketAddr, TcpListener, UdpSocket},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use bench::{
    BenchOptions,
    bpf::{BpfOptions, run_bpf},
    latency::{self, LatencyMode, LatencyOptions, run_latency},
    load::{ClientOptions, pin_to_cpu, run_client, serve},
    memory::{self, MemMode, MemoryOptions, run_memory, scale::ScaleArgs},
    nodeport::{self, Attach, Backend, NodeportOptions, run_nodeport},
    report::run_reported,
    run_clusterip, signals,
    suites::{SuitesOptions, run_suites},
    sync::{
        IptablesCommands, SyncMode, SyncOptions, run_sync,
        suite::{SideKind, SuiteOptions, run_suite},
    },
    udp::{UdpOptions, run_udp_client, serve_udp},
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Connection-rate load generator and the ClusterIP benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer each connection's 1-byte request with the same byte, then close.
    Serve {
        #[arg(long)]
        listen: SocketAddr,
        /// Also echo UDP datagrams on the same address (a second thread).
        #[arg(long)]
        udp: bool,
        /// Pin to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Keep a window of small datagrams in flight to each target (alternating slices) and
    /// print answered datagrams per second and loss per target as one JSON array.
    UdpClient {
        #[arg(long = "target", required = true)]
        targets: Vec<SocketAddr>,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 100)]
        slice_ms: u64,
        #[arg(long, default_value_t = 300)]
        warmup_ms: u64,
        /// Datagrams in flight per target.
        #[arg(long, default_value_t = 16)]
        window: u32,
        /// Payload bytes per datagram.
        #[arg(long, default_value_t = 18)]
        payload: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Open connections one after another (connect, 1-byte request, 1-byte reply, close)
    /// and print the rate and connect() latency per target as one JSON array.
    Client {
        /// Repeatable: several targets are measured in alternating slices (ABBA).
        #[arg(long = "target", required = true)]
        targets: Vec<SocketAddr>,
        /// The measured time per target.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Length of one slice of the alternation.
        #[arg(long, default_value_t = 100)]
        slice_ms: u64,
        /// A target's measured time also ends after this many connections.
        #[arg(long)]
        max_connections: Option<u64>,
        /// Connections made before the measured time, not recorded.
        #[arg(long, default_value_t = 300)]
        warmup_ms: u64,
        /// Pin to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
        /// Repeatable, one per target in order ("-": stay): the cgroup v2 directory to
        /// move into before each of the target's slices.
        #[arg(long = "target-cgroup")]
        target_cgroups: Vec<String>,
    },
    /// The ClusterIP benchmark (root): namespaces, the agent in ebpf mode, the client
    /// through a ClusterIP and straight to the backend, with 1 and 10,000 services.
    BenchClusterip {
        /// The agent binary (default: proxy-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// 1 rep of 1 s with 1 and 100 services: proves the bench works, not the speed.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        reps: Option<u32>,
        /// Seconds per rep and route.
        #[arg(long)]
        seconds: Option<f64>,
        /// Service counts, comma-separated (default 1,10000; quick: 1,100).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        #[arg(long)]
        client_cpu: Option<usize>,
        #[arg(long)]
        server_cpu: Option<usize>,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// The NodePort benchmark (root): an external client through a NodePort (tc, XDP
    /// generic, XDP native) against the same client straight to the backend, UDP and TCP,
    /// local and remote backend.
    BenchNodeport {
        /// The agent binary (default: proxy-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// 1 rep of 0.5 s, tc and XDP generic: proves the bench works, not the speed.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        reps: Option<u32>,
        /// Seconds per route and client run.
        #[arg(long)]
        seconds: Option<f64>,
        /// Attachments, comma-separated (default tc,xdp-generic,xdp-native).
        #[arg(long, value_delimiter = ',')]
        attach: Vec<Attach>,
        /// Backends, comma-separated (default local,remote).
        #[arg(long, value_delimiter = ',')]
        backends: Vec<Backend>,
        /// UDP datagrams in flight.
        #[arg(long)]
        window: Option<u32>,
        #[arg(long)]
        client_cpu: Option<usize>,
        #[arg(long)]
        server_cpu: Option<usize>,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// The sync benchmark (root): full and one-service-change sync time of a proxier
    /// against the raw restore of the same rules, in fresh network namespaces.
    BenchSync {
        /// The proxier measured (iptables).
        #[arg(long, default_value = "iptables")]
        mode: SyncMode,
        /// 1 rep at 1,000 services with 2 changes: proves the bench works, not the speed.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        reps: Option<u32>,
        /// Service counts, comma-separated (default 1000,10000; quick: 1000).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        /// Endpoints per service (default 4).
        #[arg(long)]
        endpoints: Option<u8>,
        /// The iptables commands both sides run: `path` (PATH's `iptables*`, as the agent),
        /// `legacy` (`iptables-legacy*`) or `nft` (`iptables-nft*`).
        #[arg(long, default_value = "path")]
        iptables: IptablesCommands,
        /// One-service changes per rep (default 5).
        #[arg(long)]
        changes: Option<u32>,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// The BPF benchmark (root): ns per call of each of the agent's programs (run-time
    /// statistics) with 1 and 50,000 services, and single against batched map updates.
    BenchBpf {
        /// The agent binary (default: proxy-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// 1 rep of 1 s at 1 and 1,000 services, a 1,000-entry map.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        reps: Option<u32>,
        /// Seconds of client load per rep.
        #[arg(long)]
        seconds: Option<f64>,
        /// Service counts, comma-separated (default 1,100000); empty list: `--services 0`
        /// skips the program part.
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        /// Reps of the connect() comparison, socket programs attached against detached
        /// (default 5).
        #[arg(long)]
        connect_reps: Option<u32>,
        /// Seconds per route and rep of the connect() comparison (default 3).
        #[arg(long)]
        connect_seconds: Option<f64>,
        /// Conntrack flows of the test runs, comma-separated (default 0,1000000; `none`
        /// skips them).
        #[arg(long, value_delimiter = ',')]
        ct_flows: Vec<String>,
        /// Map entries, comma-separated (default 1000,10000,100000,1000000; 0 skips).
        #[arg(long, value_delimiter = ',')]
        entries: Vec<u32>,
        /// Elements per BPF_MAP_UPDATE_BATCH.
        #[arg(long)]
        batch: Option<usize>,
        /// Backend counts of the Maglev table build, comma-separated (default 1000; 0
        /// skips).
        #[arg(long, value_delimiter = ',')]
        maglev_backends: Vec<u32>,
        /// Maglev table sizes, comma-separated (default 16381,65521).
        #[arg(long, value_delimiter = ',')]
        maglev_sizes: Vec<u32>,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// The memory benchmark (root): agent RSS and BPF map memory with N services of 4
    /// endpoints, ebpf and iptables (legacy) mode; then the scale run (ebpf, default
    /// configuration): 100,000 services x 10 endpoints added at once while a prober
    /// connects to a service the agent already had.
    BenchMemory {
        /// The agent binary (default: proxy-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// 1,000 services only, and a scale run of 6,000 x 10.
        #[arg(long)]
        quick: bool,
        /// Service counts, comma-separated (default 1000,10000,50000).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        /// Leave out the iptables-legacy agent.
        #[arg(long)]
        ebpf_only: bool,
        #[command(flatten)]
        scale: ScaleArgs,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Internal: be the scale run's prober (in the client pod) of --probe-target.
        #[arg(long, hide = true, requires = "probe_target")]
        prober: bool,
        #[arg(long, hide = true)]
        probe_target: Option<SocketAddr>,
    },
    /// The sync suite (root): ebpf, iptables, ipvs-fallback and nftables against raw
    /// loads of kube-proxy-shaped rules (iptables-legacy-restore; nft -f for nftables): a
    /// cold full sync, add one service, remove one endpoint, scale one service 4 -> 40, at N
    /// services x 4.
    BenchSyncModes {
        /// 1 rep at 1,000 services: proves the suite works, not the speed.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        reps: Option<u32>,
        /// Service counts, comma-separated (default 1000,10000,50000; quick: 1000).
        #[arg(long, value_delimiter = ',')]
        services: Vec<u32>,
        /// Sides, comma-separated (default: all of ebpf, iptables, ipvs-fallback, nftables,
        /// kube-proxy-iptables, kube-proxy-nft).
        #[arg(long, value_delimiter = ',')]
        sides: Vec<SideKind>,
        /// Consecutive changes of each kind after the steps, on the ebpf side (default 60;
        /// quick: 5; 0: none).
        #[arg(long)]
        steady_changes: Option<u32>,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// The programming-latency benchmark (root): time from a new Service + EndpointSlice
    /// in the test API server to the first answered connection through its ClusterIP.
    BenchLatency {
        /// `ebpf` (default) and/or `iptables-legacy`; repeatable, run in that order.
        #[arg(long = "mode")]
        modes: Vec<String>,
        /// 1,000 services, 20 changes/s for 5 s: proves the bench works, not the speed.
        #[arg(long)]
        quick: bool,
        /// The agent binary (default: proxy-agent beside this binary).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Filler services preloaded (default 10000; quick: 1000).
        #[arg(long)]
        services: Option<u32>,
        /// Changes per second (default 100; quick: 20).
        #[arg(long)]
        rate: Option<f64>,
        /// Seconds of changes (default 60; quick: 5).
        #[arg(long)]
        seconds: Option<f64>,
        /// The agent's minSyncPeriod in ms (default: 0 for ebpf, 1000 for iptables).
        #[arg(long)]
        min_sync_ms: Option<u64>,
        /// A change not programmed after this many ms is failed (default 10000).
        #[arg(long, default_value_t = 10_000)]
        give_up_ms: u64,
        /// The prober's connects per second in all (default: 10000 ebpf, 2000 iptables).
        #[arg(long)]
        probe_budget: Option<u32>,
        #[arg(long, default_value_t = 1)]
        reps: u32,
        /// Append the results to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Internal: be the prober (stdin commands, stdout reports) in the client pod.
        #[arg(long, hide = true)]
        prober: bool,
    },
    /// The dataplane benchmark (root): connection rate, latencies and throughput through
    /// N services in each mode (direct, ebpf, iptables, kube-proxy-shaped iptables/nft).
    BenchDataplane(bench::dataplane::cli::DataplaneArgs),
    /// The report's suites (all, or those given with --suite), each a `bench-<suite>` run of
    /// this binary appending to `<csv-dir>/<suite>.csv` (or `<suite>-quick.csv`); unless
    /// --quick, this run's rows are then published as `<publish>/<suite>.csv` (what
    /// `cargo xtask bench` runs before it regenerates the report).
    BenchReportSuites {
        /// A suite to run (repeatable; default: dataplane, sync, latency, bpf, memory).
        #[arg(long = "suite")]
        suites: Vec<String>,
        /// Each suite's quick slice; nothing is published.
        #[arg(long)]
        quick: bool,
        /// Where the suites append their rows.
        #[arg(long)]
        csv_dir: PathBuf,
        /// Where this run's rows are published (docs/bench).
        #[arg(long)]
        publish: Option<PathBuf>,
        /// Options for every suite run.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// Remove namespaces, cgroups, pins and files of benchmark runs whose process died.
    CleanupStale,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("loadgen: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { listen, udp, cpu } => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let listener =
                TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
            if udp {
                let socket =
                    UdpSocket::bind(listen).with_context(|| format!("binding {listen}/udp"))?;
                std::thread::spawn(move || serve_udp(&socket));
            }
            println!("READY");
            std::io::stdout().flush()?;
            serve(&listener, Duration::from_secs(2)).context("serving")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Client {
            targets,
            seconds,
            slice_ms,
            max_connections,
            warmup_ms,
            cpu,
            target_cgroups,
        } => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let mut opts = ClientOptions::new(
                targets,
                Duration::try_from_secs_f64(seconds).context("--seconds")?,
            );
            opts.slice = Duration::from_millis(slice_ms);
            if let Some(max) = max_connections {
                opts.max_connections = max;
            }
            opts.warmup = Duration::from_millis(warmup_ms);
            opts.cgroups = target_cgroups
                .iter()
                .map(|c| (c != "-").then(|| PathBuf::from(c)))
                .collect();
            let reports = run_client(&opts);
            println!("{}", serde_json::to_string(&reports)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchClusterip {
            agent,
            quick,
            reps,
            seconds,
            services,
            client_cpu,
            server_cpu,
            csv,
        } => {
            let here = std::env::current_exe().context("locating this binary")?;
            let agent = match agent {
                Some(path) => path,
                None => here
                    .parent()
                    .map(|dir| dir.join("proxy-agent"))
                    .context("locating proxy-agent")?,
            };
            let mut opts = if quick {
                BenchOptions::quick(agent, here)
            } else {
                BenchOptions::full(agent, here)
            };
            if let Some(reps) = reps {
                opts.reps = reps;
            }
            if let Some(seconds) = seconds {
                opts.rep_duration = Duration::try_from_secs_f64(seconds).context("--seconds")?;
            }
            if !services.is_empty() {
                opts.service_counts = services;
            }
            opts.client_cpu = client_cpu;
            opts.server_cpu = server_cpu;
            Ok(run_reported(csv.as_deref(), || run_clusterip(&opts))?)
        }
        Command::UdpClient {
            targets,
            seconds,
            slice_ms,
            warmup_ms,
            window,
            payload,
            cpu,
        } => {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu)?;
            }
            let mut opts = UdpOptions::new(
                targets,
                Duration::try_from_secs_f64(seconds).context("--seconds")?,
            );
            opts.slice = Duration::from_millis(slice_ms);
            opts.warmup = Duration::from_millis(warmup_ms);
            opts.window = window;
            opts.payload = payload;
            let reports = run_udp_client(&opts).context("UDP client")?;
            println!("{}", serde_json::to_string(&reports)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchNodeport {
            agent,
            quick,
            reps,
            seconds,
            attach,
            backends,
            window,
            client_cpu,
            server_cpu,
            csv,
        } => {
            let here = std::env::current_exe().context("locating this binary")?;
            let agent = match agent {
                Some(path) => path,
                None => here
                    .parent()
                    .map(|dir| dir.join("proxy-agent"))
                    .context("locating proxy-agent")?,
            };
            let mut opts = if quick {
                NodeportOptions::quick(agent, here)
            } else {
                NodeportOptions::full(agent, here)
            };
            if let Some(reps) = reps {
                opts.reps = reps;
            }
            if let Some(seconds) = seconds {
                opts.rep_duration = Duration::try_from_secs_f64(seconds).context("--seconds")?;
            }
            if !attach.is_empty() {
                opts.attaches = attach;
            }
            if !backends.is_empty() {
                opts.backends = backends;
            }
            if let Some(window) = window {
                opts.udp_window = window;
            }
            opts.client_cpu = client_cpu;
            opts.server_cpu = server_cpu;
            Ok(run_reported(csv.as_deref(), || run_nodeport(&opts))?)
        }
        Command::BenchSync {
            mode,
            quick,
            reps,
            services,
            endpoints,
            iptables,
            changes,
            csv,
        } => {
            let mut opts = if quick {
                SyncOptions::quick(mode)
            } else {
                SyncOptions::full(mode)
            };
            if let Some(reps) = reps {
                opts.reps = reps;
            }
            if !services.is_empty() {
                opts.service_counts = services;
            }
            if let Some(endpoints) = endpoints {
                opts.endpoints_per_service = endpoints;
            }
            opts.iptables = iptables;
            if let Some(changes) = changes {
                opts.partial_changes = changes;
            }
            Ok(run_reported(csv.as_deref(), || run_sync(&opts))?)
        }
        Command::BenchBpf {
            agent,
            quick,
            reps,
            seconds,
            services,
            connect_reps,
            connect_seconds,
            ct_flows,
            entries,
            batch,
            maglev_backends,
            maglev_sizes,
            csv,
        } => {
            let here = std::env::current_exe().context("locating this binary")?;
            let agent = agent_path(agent, &here)?;
            let mut opts = if quick {
                BpfOptions::quick(agent, here)
            } else {
                BpfOptions::full(agent, here)
            };
            if let Some(reps) = connect_reps {
                opts.connect_reps = reps;
            }
            if let Some(seconds) = connect_seconds {
                opts.connect_duration =
                    Duration::try_from_secs_f64(seconds).context("--connect-seconds")?;
            }
            if !ct_flows.is_empty() {
                opts.ct_entries = ct_flows
                    .iter()
                    .filter(|f| f.as_str() != "none")
                    .map(|f| f.parse::<u32>().with_context(|| format!("--ct-flows {f}")))
                    .collect::<anyhow::Result<_>>()?;
            }
            if let Some(reps) = reps {
                opts.reps = reps;
                opts.map_reps = reps;
            }
            if let Some(seconds) = seconds {
                opts.client_duration = Duration::try_from_secs_f64(seconds).context("--seconds")?;
            }
            if !services.is_empty() {
                opts.service_counts = services.into_iter().filter(|n| *n > 0).collect();
            }
            if !entries.is_empty() {
                opts.map_entries = entries.into_iter().filter(|n| *n > 0).collect();
            }
            if let Some(batch) = batch {
                opts.batch_size = batch.max(1);
            }
            if !maglev_backends.is_empty() {
                opts.maglev_backends = maglev_backends.into_iter().filter(|n| *n > 0).collect();
            }
            if !maglev_sizes.is_empty() {
                opts.maglev_sizes = maglev_sizes;
            }
            Ok(run_reported(csv.as_deref(), || run_bpf(&opts))?)
        }
        Command::BenchMemory {
            agent,
            quick,
            services,
            ebpf_only,
            scale,
            csv,
            prober,
            probe_target,
        } => {
            if let (true, Some(target)) = (prober, probe_target) {
                memory::probe::run_prober(target).context("probing")?;
                return Ok(ExitCode::SUCCESS);
            }
            let here = std::env::current_exe().context("locating this binary")?;
            let agent = agent_path(agent, &here)?;
            let mut opts = if quick {
                MemoryOptions::quick(agent, here)
            } else {
                MemoryOptions::full(agent, here)
            };
            opts.scale = scale.apply(opts.scale)?;
            if !services.is_empty() {
                opts.service_counts = services;
            }
            if ebpf_only {
                opts.modes = vec![MemMode::Ebpf];
            }
            Ok(run_reported(csv.as_deref(), || run_memory(&opts))?)
        }
        Command::BenchSyncModes {
            quick,
            reps,
            services,
            sides,
            steady_changes,
            csv,
        } => {
            let mut opts = if quick {
                SuiteOptions::quick()
            } else {
                SuiteOptions::full()
            };
            if let Some(reps) = reps {
                opts.reps = reps;
                opts.reps_large = reps;
            }
            if !services.is_empty() {
                opts.service_counts = services;
            }
            if !sides.is_empty() {
                opts.sides = sides;
            }
            if let Some(n) = steady_changes {
                opts.steady_changes = n;
            }
            Ok(run_reported(csv.as_deref(), || run_suite(&opts))?)
        }
        Command::BenchLatency {
            modes,
            quick,
            agent,
            services,
            rate,
            seconds,
            min_sync_ms,
            give_up_ms,
            probe_budget,
            reps,
            csv,
            prober,
        } => {
            let give_up = Duration::from_millis(give_up_ms);
            if prober {
                let budget = probe_budget.unwrap_or(latency::prober::MAX_CONNECTS_PER_SEC);
                latency::prober::run_prober(give_up, budget).context("probing")?;
                return Ok(ExitCode::SUCCESS);
            }
            let here = std::env::current_exe().context("locating this binary")?;
            let agent = match agent {
                Some(path) => path,
                None => here
                    .parent()
                    .map(|dir| dir.join("proxy-agent"))
                    .context("locating proxy-agent")?,
            };
            let modes = if modes.is_empty() {
                vec!["ebpf".to_string()]
            } else {
                modes
            };
            signals::watch()?;
            let started = std::time::Instant::now();
            for name in &modes {
                let mode = LatencyMode::parse(name)
                    .with_context(|| format!("unknown mode {name:?} (ebpf, iptables-legacy)"))?;
                for rep in 0..reps {
                    let mut opts = if quick {
                        LatencyOptions::quick(agent.clone(), here.clone(), mode)
                    } else {
                        LatencyOptions::full(agent.clone(), here.clone(), mode)
                    };
                    opts.services = services.unwrap_or(opts.services);
                    opts.rate = rate.unwrap_or(opts.rate);
                    if let Some(seconds) = seconds {
                        opts.duration =
                            Duration::try_from_secs_f64(seconds).context("--seconds")?;
                    }
                    if let Some(ms) = min_sync_ms {
                        opts.min_sync_period = Duration::from_millis(ms);
                    }
                    opts.give_up = give_up;
                    opts.probe_budget = probe_budget.unwrap_or(opts.probe_budget);
                    opts.rep = rep;
                    let code = run_reported(csv.as_deref(), || run_latency(&opts))?;
                    if code != ExitCode::SUCCESS {
                        return Ok(code);
                    }
                }
            }
            println!("took {:.0} s in all", started.elapsed().as_secs_f64());
            Ok(ExitCode::SUCCESS)
        }
        Command::BenchDataplane(args) => bench::dataplane::cli::main(args),
        Command::BenchReportSuites {
            suites,
            quick,
            csv_dir,
            publish,
            extra,
        } => {
            let here = std::env::current_exe().context("locating this binary")?;
            let opts = SuitesOptions {
                suites,
                quick,
                csv_dir,
                publish,
                extra,
            };
            Ok(match run_suites(&here, &opts)? {
                None => ExitCode::SUCCESS,
                Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            })
        }
        Command::CleanupStale => {
            for line in nodeport::cleanup_stale()? {
                println!("removed {line}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--agent`, else proxy-agent beside this binary.
fn agent_path(agent: Option<PathBuf>, here: &std::path::Path) -> anyhow::Result<PathBuf> {
    match agent {
        Some(path) => Ok(path),
        None => here
            .parent()
            .map(|dir| dir.join("proxy-agent"))
            .context("locating proxy-agent"),
    }
}
