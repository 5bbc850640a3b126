// SPDX-License-Identifier: Apache-2.0
//! The orchestration of a latency run (root): namespaces, backend, API server, agent,
//! prober, the paced changes, and the cleanup of all of them.

use std::{
    collections::HashMap,
    fs, thread,
    time::{Duration, Instant, SystemTime},
};

use super::{
    node::{ProberProcess, agent_fragment, fail_fast_route, legacy_path, sync_counts},
    objects,
    options::{LatencyMode, LatencyOptions},
    prober::{Report, monotonic_ns, parse_report},
    results::{LatencyResults, SyncCounts},
};
use ::tests::{
    apiserver::{ServerConfig, TestApiServer},
    scenario::{Mode, cluster::AgentConnection, netns::bind_tcp_listener_in},
};

use crate::{
    agent::{BenchAgent, StartSpec},
    error::{Error, Result},
    maps::frontends_in,
    net::{self, BenchNet, SERVER_IP},
    results::Environment,
    signals,
};

pub(super) fn progress(opts: &LatencyOptions, line: &str) {
    if opts.verbose {
        eprintln!("==> {line}");
    }
}

fn api_error(context: &str, err: impl std::fmt::Display) -> Error {
    Error::Setup(format!("{context}: {err}"))
}

/// Runs the benchmark. Needs root.
pub fn run_latency(opts: &LatencyOptions) -> Result<LatencyResults> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Setup("the benchmark needs root".into()));
    }
    net::check_built(&[&opts.agent_binary, &opts.loadgen_binary])?;
    if opts.min_sync_period < Duration::from_millis(1) {
        return Err(Error::Setup(
            "minSyncPeriod below 1 ms: the agent (as upstream) would default 0 to 1 s".into(),
        ));
    }
    let total = opts.total_changes();
    if total == 0 || opts.rate <= 0.0 || u64::from(objects::MAX_INDEX) < total {
        return Err(Error::Setup(format!("cannot make {total} changes")));
    }
    for line in net::cleanup_stale()? {
        progress(opts, &format!("removed stale {line}"));
    }
    let env = Environment::detect();
    let began = Instant::now();
    // Declared first, dropped last: the API server's tasks run on it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(Error::io("starting the API server's runtime"))?;
    let _entered = runtime.enter();

    let id = net::new_run_id();
    progress(opts, &format!("building namespaces {id}-{{node,cli,srv}}"));
    let mut bench_net = BenchNet::build(&id)?;
    fail_fast_route(opts, &bench_net)?;
    bench_net.start_backend(&opts.loadgen_binary, None)?;

    let listener = bind_tcp_listener_in(&bench_net.node_ns, ([127, 0, 0, 1], 0).into())?;
    let config = ServerConfig {
        // Every change since the preload stays resumable: a paged list or a watch
        // restarted mid-run must never see 410 Expired.
        history_limit: 4 * (opts.services as usize + total as usize) + 1024,
        ..ServerConfig::default()
    };
    let api = TestApiServer::start_on(listener, config)
        .map_err(|e| api_error("starting the test API server", e))?;
    let kubeconfig = bench_net.run_dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)
        .map_err(|e| api_error("writing the kubeconfig", e))?;
    progress(
        opts,
        &format!("preloading {} services × 4 endpoints", opts.services),
    );
    api.create_value(objects::node(net::CLIENT_GATEWAY))
        .map_err(|e| api_error("creating the Node", e))?;
    for index in 0..opts.services {
        signals::check()?;
        for object in objects::filler(index) {
            api.create_value(object)
                .map_err(|e| api_error("creating a filler", e))?;
        }
    }

    progress(
        opts,
        &format!("starting the agent ({} mode)", opts.mode.name()),
    );
    let agent_env = match opts.mode {
        LatencyMode::Ebpf => Vec::new(),
        LatencyMode::IptablesLegacy => vec![
            ("PATH".into(), legacy_path(&bench_net.run_dir)?),
            // The node namespace's tables are ours alone: a lock of our own keeps other
            // iptables users of the machine (the global /run/xtables.lock) from stalling
            // the agent's syncs.
            (
                "XTABLES_LOCKFILE".into(),
                bench_net.run_dir.join("xtables.lock").into_os_string(),
            ),
        ],
    };
    let fragment = agent_fragment(opts);
    let bpffs = net::bpffs_root(&id);
    let started = SystemTime::now();
    let spec = StartSpec {
        connection: AgentConnection::Kubeconfig(kubeconfig),
        fragment: &fragment,
        mode: match opts.mode {
            LatencyMode::Ebpf => Mode::Ebpf,
            LatencyMode::IptablesLegacy => Mode::Iptables,
        },
        env: agent_env,
    };
    // Declared after the namespaces, so it stops (and unpins) before they go.
    let mut agent = BenchAgent::start_spec(
        &opts.agent_binary,
        bench_net.node_place(),
        &bench_net.run_dir,
        &bpffs,
        &spec,
    )?;
    agent.wait_initial_sync(started, opts.sync_timeout)?;
    if opts.mode == LatencyMode::Ebpf {
        let frontends = frontends_in(&bpffs)?;
        if frontends != opts.services as usize {
            return Err(agent.failure(format!(
                "synced, but the service map holds {frontends} frontends, not {}",
                opts.services
            )));
        }
    }
    progress(
        opts,
        &format!("agent synced in {:.1} s", began.elapsed().as_secs_f64()),
    );

    let mut prober = ProberProcess::start(opts, &bench_net)?;
    prober.send(&format!("control {}", objects::control_frontend()))?;
    let before = sync_counts(&bench_net.node_ns);
    let measured = measure(opts, &api, &mut prober, total)?;
    let after = sync_counts(&bench_net.node_ns);
    let (control_attempts, false_successes, longest_interval_us) =
        prober.finish(Duration::from_secs(10))?;
    drop(prober);
    if let Some(keep) = std::env::var_os("LATENCY_KEEP_AGENT_LOG") {
        let _ = fs::copy(&agent.log, keep);
    }
    drop(agent);
    bench_net.cleanup();
    drop(api);
    Ok(LatencyResults {
        run_id: id,
        env,
        mode: opts.mode.name().into(),
        services: opts.services,
        rep: opts.rep,
        changes: measured.changes,
        latencies_ms: measured.latencies_ms,
        failed: measured.failed,
        change_rate: measured.change_rate,
        target_rate: opts.rate,
        min_sync_period_ms: opts.min_sync_period.as_secs_f64() * 1e3,
        control_attempts,
        false_successes,
        probe_attempts: measured.probe_attempts,
        longest_probe_interval_ms: longest_interval_us as f64 / 1e3,
        syncs: SyncCounts {
            full: after.full.saturating_sub(before.full),
            partial: after.partial.saturating_sub(before.partial),
            full_seconds: after.full_seconds - before.full_seconds,
            partial_seconds: after.partial_seconds - before.partial_seconds,
        },
        seconds: began.elapsed().as_secs_f64(),
    })
}

struct Measured {
    changes: u64,
    latencies_ms: Vec<f64>,
    failed: u64,
    change_rate: f64,
    probe_attempts: u64,
}

/// Writes the changes at the asked rate and collects the prober's reports until every
/// change is programmed or failed (bounded by the duration, the give-up bound and 10 s).
fn measure(
    opts: &LatencyOptions,
    api: &TestApiServer,
    prober: &mut ProberProcess,
    total: u64,
) -> Result<Measured> {
    progress(
        opts,
        &format!(
            "{total} changes at {}/s; probing each new frontend every 1 ms",
            opts.rate
        ),
    );
    let interval_ns = 1e9 / opts.rate;
    let start = monotonic_ns();
    let deadline = Instant::now() + opts.duration + opts.give_up + Duration::from_secs(10);
    let mut t0s: HashMap<u64, u64> = HashMap::new();
    let (mut made, mut first_t0, mut last_t0) = (0u64, 0u64, 0u64);
    let mut latencies_ms = Vec::with_capacity(total as usize);
    let (mut failed, mut probe_attempts, mut resolved) = (0u64, 0u64, 0u64);
    let mut last_note = Instant::now();
    while resolved < total {
        signals::check()?;
        if Instant::now() > deadline {
            // The prober bounds each change itself; this only guards a stuck prober.
            failed += total - resolved;
            break;
        }
        // The schedule is absolute: a slow write is caught up, and the rate shows it.
        while made < total && monotonic_ns() as f64 >= start as f64 + made as f64 * interval_ns {
            let index = u32::try_from(made).unwrap_or(objects::MAX_INDEX);
            let [service, slice] = objects::change(index, SERVER_IP);
            api.create_value(service)
                .map_err(|e| api_error("creating a Service", e))?;
            let t0 = monotonic_ns();
            api.create_value(slice)
                .map_err(|e| api_error("creating an EndpointSlice", e))?;
            let id = made + 1;
            t0s.insert(id, t0);
            if made == 0 {
                first_t0 = t0;
            }
            last_t0 = t0;
            made += 1;
            prober.send(&format!(
                "probe {id} {}",
                objects::frontend(objects::new_ip(index))
            ))?;
        }
        while let Ok(line) = prober.lines().try_recv() {
            match parse_report(&line) {
                Some(Report::Ok {
                    id,
                    t1_ns,
                    attempts,
                }) => {
                    if let Some(t0) = t0s.remove(&id) {
                        latencies_ms.push(t1_ns.saturating_sub(t0) as f64 / 1e6);
                        probe_attempts += attempts;
                        resolved += 1;
                    }
                }
                Some(Report::Fail { id, attempts }) => {
                    if t0s.remove(&id).is_some() {
                        failed += 1;
                        probe_attempts += attempts;
                        resolved += 1;
                    }
                }
                _ => eprintln!("prober: {line}"),
            }
        }
        if last_note.elapsed() >= Duration::from_secs(10) {
            last_note = Instant::now();
            progress(
                opts,
                &format!(
                    "{made} changes made, {} programmed, {failed} failed",
                    latencies_ms.len()
                ),
            );
        }
        thread::sleep(Duration::from_micros(500));
    }
    let span = (last_t0.saturating_sub(first_t0)) as f64 / 1e9;
    let change_rate = if made > 1 && span > 0.0 {
        (made - 1) as f64 / span
    } else {
        f64::NAN
    };
    Ok(Measured {
        changes: made,
        latencies_ms,
        failed,
        change_rate,
        probe_attempts,
    })
}

#[cfg(test)]
mod tests;
