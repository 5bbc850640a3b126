// SPDX-License-Identifier: Apache-2.0
//! `scenario-runner`: replays behaviour scenarios through network namespaces
//! (`run`), and the helpers it starts inside them (`echo`, `probe`, `http-get`, and the
//! multi-node tests' `load`).
#![forbid(unsafe_code)]

use std::{io::Write, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use tests::scenario::{
    Mode, Proto, Scenario, Status, Totals,
    agent::{AgentOptions, Proxy, ProxyMode},
    conformance::{Difference, ObservedFlow, compare},
    echo::{self, ListenSpec},
    fuzz::{self, FuzzOptions},
    http,
    probe::{ProbeSpec, probe},
    report::FlowReport,
    run::{ClusterApi, RunOptions, check_privileges, default_dirs, discover, run_scenario},
    stale::cleanup_stale,
    upstream_outcomes::UpstreamOutcomes,
};

#[derive(Parser)]
#[command(about = "Replays behaviour scenarios with real packets through network namespaces")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenario files against the agent in one dataplane mode, or against upstream's
    /// kube-proxy in one of its modes (`upstream-iptables`, `upstream-nftables`,
    /// `upstream-ipvs`: the judge of the files, through upstream's API server).
    Run {
        #[arg(long, value_parser = parse_proxy_mode)]
        mode: ProxyMode,
        /// Scenario directories (default: ../shared/scenarios and tests/scenarios).
        #[arg(long = "dir")]
        dirs: Vec<PathBuf>,
        /// Only files whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// A scenario file to run after those of the directories (repeatable; with only
        /// files given, the default directories are not read).
        #[arg(long = "file")]
        files: Vec<PathBuf>,
        /// How many times slower than a normal machine this one is: stretches the
        /// runner's settle and grace waits (the emulated test VM sets 10).
        #[arg(long, env = "SCENARIO_TIME_SCALE", default_value_t = 1)]
        time_scale: u32,
        /// The agent binary (default: proxy-agent beside this binary; for an upstream mode,
        /// the kube-proxy `cargo xtask setup` built).
        #[arg(long, conflicts_with = "no_agent")]
        agent: Option<PathBuf>,
        /// Run without an agent: only flows that need no proxy can pass.
        #[arg(long)]
        no_agent: bool,
        /// Extra argument for the agent (repeatable).
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// Keep namespaces, cgroup, pins and files afterwards.
        #[arg(long)]
        keep: bool,
        /// Where the agent reads the objects from: `test` (the home-made test API server,
        /// inside each node namespace), `dir` (a manifest directory, --source) or `real`
        /// (upstream's kube-apiserver: the control plane named by KPE_CONTROL_PLANE, or
        /// one this run starts and stops). Default: `test`, and `real` for an upstream mode
        /// (the only one upstream's kube-proxy can use).
        #[arg(long, value_parser = ["test", "dir", "real"])]
        api: Option<String>,
        /// Connect and answer timeout per attempt.
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
        /// How long the agent may take to sync a change.
        #[arg(long, default_value_t = 15)]
        ready_timeout_s: u64,
        /// ebpf mode: XDP acceleration on the node's uplink (`ebpf.xdpMode`: off, generic,
        /// native).
        #[arg(long, value_parser = ["off", "generic", "native"])]
        xdp_mode: Option<String>,
        /// Ask the agent for --mode, but require that it runs this mode instead (its
        /// fallback, e.g. `--mode ipvs --expect-fallback iptables` on a kernel without
        /// IPVS) and judge the flows as this mode. Without it, an agent that fell back
        /// fails every flow.
        #[arg(long, value_parser = parse_mode, conflicts_with = "no_agent")]
        expect_fallback: Option<Mode>,
        /// After each flow, ask the running agent (`proxy-agent trace`) what it would do
        /// with the flow, and fail the flow when its answer disagrees with what the probes
        /// saw (ebpf and iptables modes).
        #[arg(long, conflicts_with = "no_agent")]
        trace_check: bool,
        /// Only flows of this protocol (tcp, udp, sctp); every stage is still applied.
        #[arg(long, value_parser = parse_proto)]
        only_proto: Option<Proto>,
        /// Only flows whose client is outside the node (what XDP on the uplink sees);
        /// every stage is still applied.
        #[arg(long)]
        only_external_clients: bool,
        /// Append what each flow's attempts showed to this file, one JSON line a flow
        /// (for `diff`).
        #[arg(long)]
        observations: Option<PathBuf>,
    },
    /// Compare two replays' observations (`run --observations`): ours in a mode and
    /// upstream's kube-proxy in the mode it is judged against; prints each flow they saw
    /// differently and fails on any not listed in tests/upstream-outcomes.yaml.
    Diff {
        #[arg(long)]
        ours: PathBuf,
        #[arg(long)]
        upstream: PathBuf,
        /// Our mode the `--ours` replay ran in (ebpf entries of the list apply to ebpf).
        #[arg(long, value_parser = parse_mode)]
        ours_mode: Mode,
        /// Upstream's mode (iptables, ipvs, nftables): whose listed outcomes apply.
        #[arg(long, value_parser = parse_mode)]
        upstream_mode: Mode,
        /// Where the replayed files are, for `--repro-dir`.
        #[arg(long, requires = "repro_dir")]
        cases_dir: Option<PathBuf>,
        /// Write a scenario file reproducing each undocumented difference of a file in
        /// `--cases-dir` here (fuzz::repro).
        #[arg(long, requires = "cases_dir")]
        repro_dir: Option<PathBuf>,
    },
    /// Write random scenario files for a differential replay (tests/src/scenario/fuzz.rs).
    FuzzGenerate {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 100)]
        cases: usize,
        #[arg(long, default_value_t = FuzzOptions::default().cases_per_file)]
        cases_per_file: usize,
        #[arg(long, default_value_t = FuzzOptions::default().flows_per_case)]
        flows_per_case: usize,
        #[arg(long)]
        out: PathBuf,
    },
    /// Serve echo/plain listeners (`echo/tcp/10.0.0.1:80`, `plain/udp/[fd00::1]:53`);
    /// prints READY once all are bound.
    Echo {
        /// Retry an address still in use for up to this long, then serve the rest: each
        /// listener that never bound is printed as `UNBOUND <listener> <reason>` before
        /// READY (without it, any bind failure is an error).
        #[arg(long)]
        bind_patience_ms: Option<u64>,
        listeners: Vec<String>,
    },
    /// Probe one flow; prints one JSON object per attempt.
    Probe {
        #[arg(long)]
        from: String,
        #[arg(long, default_value_t = 0)]
        from_port: u16,
        #[arg(long)]
        to: String,
        #[arg(long, default_value = "tcp")]
        proto: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Traffic a migration must not disturb (tests/src/multinode/load.rs): prints READY
    /// once its long-lived connections are open, runs until stdin closes, then prints its
    /// report as JSON.
    Load {
        #[arg(long, default_value = "0.0.0.0")]
        from: String,
        /// New connections, one per tick.
        #[arg(long)]
        new_to: Option<String>,
        /// Long-lived connections, one line each per tick.
        #[arg(long)]
        long_to: Option<String>,
        #[arg(long, default_value_t = 8)]
        long_count: usize,
        /// One UDP flow, one datagram per tick.
        #[arg(long)]
        udp_to: Option<String>,
        #[arg(long, default_value_t = 20)]
        tick_ms: u64,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// GET a URL; prints {"status":..,"body":..}.
    HttpGet {
        url: String,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Remove namespaces, cgroups, pins and run directories of crashed runs.
    CleanupStale,
}

fn parse_proto(s: &str) -> Result<Proto, String> {
    s.parse().map_err(|e: tests::scenario::Error| e.to_string())
}

fn parse_proxy_mode(s: &str) -> Result<ProxyMode, String> {
    s.parse().map_err(|e: tests::scenario::Error| e.to_string())
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse().map_err(|e: tests::scenario::Error| e.to_string())
}

/// The configuration that sets `ebpf.xdpMode`, if asked for.
fn xdp_overrides(mode: Option<&str>) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    if let Some(mode) = mode {
        out.insert("ebpf".into(), serde_json::json!({ "xdpMode": mode }));
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Echo {
            bind_patience_ms,
            listeners,
        } => run_echo(&listeners, bind_patience_ms.map(Duration::from_millis)),
        Command::Probe {
            from,
            from_port,
            to,
            proto,
            count,
            timeout_ms,
        } => run_probe(&from, from_port, &to, &proto, count, timeout_ms),
        Command::HttpGet { url, timeout_ms } => run_http_get(&url, timeout_ms),
        Command::Load {
            from,
            new_to,
            long_to,
            long_count,
            udp_to,
            tick_ms,
            timeout_ms,
        } => {
            let target = |t: Option<String>| {
                t.map(|t| tests::scenario::addr::parse_socket_addr(&t))
                    .transpose()
            };
            (|| {
                let spec = tests::multinode::load::LoadSpec {
                    from: tests::scenario::addr::parse_ip(&from)?,
                    new_to: target(new_to)?,
                    long_to: target(long_to)?,
                    long_count,
                    udp_to: target(udp_to)?,
                    tick: Duration::from_millis(tick_ms),
                    timeout: Duration::from_millis(timeout_ms),
                };
                run_load(&spec)
            })()
        }
        Command::CleanupStale => run_cleanup_stale(),
        Command::Diff {
            ours,
            upstream,
            ours_mode,
            upstream_mode,
            cases_dir,
            repro_dir,
        } => run_diff(
            &ours,
            &upstream,
            ours_mode,
            upstream_mode,
            cases_dir.zip(repro_dir),
        ),
        Command::FuzzGenerate {
            seed,
            cases,
            cases_per_file,
            flows_per_case,
            out,
        } => run_fuzz_generate(
            &FuzzOptions {
                seed,
                cases,
                cases_per_file,
                flows_per_case,
            },
            &out,
        ),
        Command::Run {
            mode,
            dirs,
            filter,
            files,
            time_scale,
            agent,
            no_agent,
            agent_args,
            keep,
            api,
            timeout_ms,
            ready_timeout_s,
            xdp_mode,
            expect_fallback,
            trace_check,
            only_proto,
            only_external_clients,
            observations,
        } => {
            tests::scenario::readiness::set_time_scale(time_scale);
            let ProxyMode { proxy, mode } = mode;
            let api = api.unwrap_or_else(|| match proxy {
                Proxy::Ours => "test".into(),
                Proxy::Upstream => "real".into(),
            });
            let agent = if no_agent {
                Ok(None)
            } else {
                check_upstream_options(proxy, &api, trace_check, expect_fallback, &xdp_mode)
                    .and_then(|()| proxy_binary(proxy, agent))
                    .map(|binary| {
                        Some(AgentOptions {
                            proxy,
                            binary,
                            mode,
                            extra_args: agent_args,
                            config_overrides: xdp_overrides(xdp_mode.as_deref()),
                            ready_timeout: Duration::from_secs(ready_timeout_s),
                        })
                    })
            };
            agent.and_then(|agent| {
                let judged = expect_fallback.unwrap_or(mode);
                if judged != mode {
                    println!(
                        "# {mode} mode requested, {judged} expected: the agent must have fallen \
                         back to {judged} (checked on /proxyMode); flows are judged as {judged}"
                    );
                }
                let upstream_outcomes =
                    UpstreamOutcomes::load(&testbed::binaries::workspace_root())?;
                if let Some(path) = &observations {
                    // Each replay writes its own file from the start.
                    let _ = std::fs::remove_file(path);
                }
                let options = RunOptions {
                    upstream_outcomes,
                    observations,
                    mode: judged,
                    agent,
                    runner_exe: std::env::current_exe().context("locating this binary")?,
                    timeout: Duration::from_millis(timeout_ms),
                    keep,
                    api: ClusterApi::TestServer,
                    trace_check,
                    only_proto,
                    only_external_clients,
                };
                let dirs = if dirs.is_empty() && files.is_empty() {
                    default_dirs()
                } else {
                    dirs
                };
                run_all(options, &api, dirs, filter, files)
            })
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("scenario-runner: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// What an upstream mode cannot do: read anything but an API server, be traced by our
/// `trace`, fall back (upstream exits instead), or run XDP.
fn check_upstream_options(
    proxy: Proxy,
    api: &str,
    trace_check: bool,
    expect_fallback: Option<Mode>,
    xdp_mode: &Option<String>,
) -> anyhow::Result<()> {
    if proxy == Proxy::Ours {
        return Ok(());
    }
    if api != "real" {
        bail!("upstream's kube-proxy runs against upstream's API server only (--api real)");
    }
    if trace_check {
        bail!("--trace-check asks proxy-agent's `trace`; upstream's kube-proxy has none");
    }
    if expect_fallback.is_some() {
        bail!("upstream's kube-proxy does not fall back to another mode (--expect-fallback)");
    }
    if xdp_mode.is_some() {
        bail!("--xdp-mode is ebpf mode's; upstream's kube-proxy has no ebpf mode");
    }
    Ok(())
}

/// The binary of `proxy`: `given`, else ours beside this binary, or upstream's kube-proxy
/// where `cargo xtask setup` built it.
fn proxy_binary(proxy: Proxy, given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match (proxy, given) {
        (Proxy::Upstream, None) => {
            let binaries = testbed::Binaries::locate()?;
            Ok(binaries.kube_proxy())
        }
        (_, given) => agent_binary(given),
    }
}

fn agent_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => std::env::current_exe()?
            .parent()
            .map(|dir| dir.join("proxy-agent"))
            .context("locating the agent")?,
    };
    if !path.is_file() {
        bail!(
            "no agent binary at {} (build it, pass --agent PATH, or --no-agent)",
            path.display()
        );
    }
    Ok(path.canonicalize()?)
}

fn run_echo(listeners: &[String], patience: Option<Duration>) -> anyhow::Result<ExitCode> {
    let specs = listeners
        .iter()
        .map(|l| l.parse::<ListenSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    let ready = |unbound: &[(ListenSpec, std::io::Error)]| {
        let mut out = std::io::stdout();
        for (spec, err) in unbound {
            let waited = match (err.kind(), patience) {
                (std::io::ErrorKind::AddrInUse, Some(p)) if !p.is_zero() => {
                    format!("; the port never freed within {} ms", p.as_millis())
                }
                _ => String::new(),
            };
            let _ = writeln!(out, "{} {spec} {err}{waited}", echo::UNBOUND);
        }
        let _ = writeln!(out, "READY");
        let _ = out.flush();
    };
    match patience {
        Some(patience) => echo::run_patiently(&specs, patience, ready),
        None => echo::run(&specs, || ready(&[]))?,
    }
    Ok(ExitCode::SUCCESS)
}

fn run_probe(
    from: &str,
    from_port: u16,
    to: &str,
    proto: &str,
    count: u32,
    timeout_ms: u64,
) -> anyhow::Result<ExitCode> {
    let spec = ProbeSpec {
        from: tests::scenario::addr::parse_ip(from)?,
        from_port,
        to: tests::scenario::addr::parse_socket_addr(to)?,
        proto: proto.parse::<Proto>()?,
        count,
        timeout: Duration::from_millis(timeout_ms),
    };
    let mut out = std::io::stdout().lock();
    for attempt in probe(&spec) {
        writeln!(out, "{}", serde_json::to_string(&attempt)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run_load(spec: &tests::multinode::load::LoadSpec) -> anyhow::Result<ExitCode> {
    let report = tests::multinode::load::run(spec, || {
        println!("READY");
        let _ = std::io::stdout().flush();
        // Until the parent closes stdin (or writes anything).
        let _ = std::io::stdin().read_line(&mut String::new());
    });
    println!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}

fn run_http_get(url: &str, timeout_ms: u64) -> anyhow::Result<ExitCode> {
    let response = http::get(url, Duration::from_millis(timeout_ms))?;
    println!("{}", serde_json::to_string(&response)?);
    Ok(ExitCode::SUCCESS)
}

fn read_observations(path: &std::path::Path) -> anyhow::Result<Vec<ObservedFlow>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("a line of {}", path.display())))
        .collect()
}

fn run_diff(
    ours: &std::path::Path,
    upstream: &std::path::Path,
    ours_mode: Mode,
    upstream_mode: Mode,
    repro: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<ExitCode> {
    let outcomes = UpstreamOutcomes::load(&testbed::binaries::workspace_root())?;
    let found = compare(
        &read_observations(ours)?,
        &read_observations(upstream)?,
        &outcomes,
        ours_mode,
        upstream_mode,
    );
    for listed in &found.documented {
        println!("DOCUMENTED {listed}");
    }
    for difference in &found.differences {
        println!("{difference}");
    }
    if let Some((cases, out)) = &repro {
        for path in write_repros(&found.differences, cases, out, ours_mode)? {
            println!("REPRO {}", path.display());
        }
    }
    println!(
        "{} flows compared, {} differ ({} documented in {}), {} replayed by one side only (the files' modes: splits)",
        found.compared,
        found.differences.len() + found.documented.len(),
        found.documented.len(),
        tests::scenario::upstream_outcomes::PATH,
        found.split
    );
    Ok(if found.differences.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_fuzz_generate(options: &FuzzOptions, out: &std::path::Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let files = fuzz::generate(options);
    for file in &files {
        let path = out.join(&file.name);
        std::fs::write(&path, &file.text).with_context(|| path.display().to_string())?;
    }
    println!(
        "{} cases in {} files under {}",
        options.cases,
        files.len(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A file reproducing each difference of a file under `cases` (fuzz::repro).
fn write_repros(
    differences: &[Difference],
    cases: &std::path::Path,
    out: &std::path::Path,
    ours_mode: Mode,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for difference in differences {
        let path = cases.join(&difference.file);
        if !path.is_file() {
            continue;
        }
        let scenario = Scenario::load(&path)?;
        let Some(flow) = scenario.flows().find(|f| f.index == difference.index) else {
            continue;
        };
        let Some(text) = fuzz::repro(
            &scenario,
            flow,
            &difference.upstream,
            &difference.what,
            ours_mode,
        ) else {
            println!(
                "NO REPRO {} #{}: upstream's answers were mixed",
                difference.file, difference.index
            );
            continue;
        };
        std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
        let target = out.join(format!("{}-flow{}.yaml", scenario.name, flow.index));
        std::fs::write(&target, text).with_context(|| target.display().to_string())?;
        written.push(target);
    }
    Ok(written)
}

fn run_cleanup_stale() -> anyhow::Result<ExitCode> {
    check_privileges()?;
    for line in cleanup_stale()? {
        println!("removed {line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn run_all(
    mut options: RunOptions,
    api: &str,
    dirs: Vec<PathBuf>,
    filter: Option<String>,
    extra_files: Vec<PathBuf>,
) -> anyhow::Result<ExitCode> {
    check_privileges()?;
    let mut files = discover(&dirs, filter.as_deref())?;
    files.extend(extra_files);
    if files.is_empty() {
        bail!("no scenario files in {dirs:?} matching {filter:?}");
    }
    let runtime = tokio::runtime::Runtime::new()?;
    // Started here, on the main thread, the control plane lives until this run ends (its
    // components die with the thread that started them).
    let mut own_plane = None;
    options.api = match api {
        "dir" => ClusterApi::Directory,
        "real" => match std::env::var_os(testbed::SHARED_ENV) {
            Some(dir) => ClusterApi::Real(PathBuf::from(dir)),
            None => {
                let dir =
                    std::env::temp_dir().join(format!("kpe-control-plane-{}", std::process::id()));
                println!("# starting upstream's control plane in {}", dir.display());
                let plane = runtime
                    .block_on(testbed::ControlPlane::start(testbed::Options::new(&dir)))
                    .context("starting upstream's control plane (--api real)")?;
                println!(
                    "# {} ready: upstream {}",
                    plane.server(),
                    plane.state().version
                );
                own_plane = Some(plane);
                ClusterApi::Real(dir)
            }
        },
        _ => ClusterApi::TestServer,
    };
    let totals = runtime.block_on(async move {
        tokio::select! {
            totals = replay(&options, &files) => Ok(totals),
            signal = shutdown_signal() => Err(signal),
        }
    });
    // The replay future is gone here, so every namespace and process was cleaned up.
    drop(own_plane);
    match totals {
        Ok(totals) => {
            println!("{totals}");
            Ok(if totals.failed > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Err(signal) => {
            eprintln!("scenario-runner: interrupted by {signal}; cleaned up");
            Ok(ExitCode::from(130))
        }
    }
}

async fn replay(options: &RunOptions, files: &[PathBuf]) -> Totals {
    let mut totals = Totals::default();
    for file in files {
        let scenario = match Scenario::load(file) {
            Ok(s) => s,
            Err(err) => {
                println!("FAIL {} #0: cannot load: {err}", file.display());
                totals.add(Status::Fail);
                continue;
            }
        };
        let mut emit = |r: &FlowReport| {
            println!("{r}");
            let _ = std::io::stdout().flush();
        };
        for r in run_scenario(options, &scenario, &mut emit).await {
            totals.add(r.status);
        }
    }
    totals
}

async fn shutdown_signal() -> &'static str {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        () = term => "SIGTERM",
    }
}
