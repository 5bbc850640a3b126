// SPDX-License-Identifier: Apache-2.0
//! The scale measurement of issue 20: N services × E endpoints (100,000 × 10 by default)
//! added at once to an ebpf agent that runs with the default configuration (default map
//! sizes: the maps must grow by themselves) and already serves one service, which a
//! prober keeps connecting to through the whole sync and every growth step.
//!
//! One rep, in fresh benchmark namespaces:
//! 1. the echo server in the server pod and the measured service (its ClusterIP, whose
//!    one endpoint is that server) in the agent's `--source` directory; the agent starts
//!    with no settings of the benchmark's own and is waited for until that service is in
//!    its service map;
//! 2. the N services are written beside the directory, the prober ([`super::probe`])
//!    starts in the client pod and answers once, then, once the default minSyncPeriod
//!    (1 s) has passed since the agent's last sync (a cold start has no earlier sync to
//!    hold the next one back), the file is renamed into the directory: the agent sees all
//!    of them in one change;
//! 3. the run waits until the agent has applied every one of them (its service and
//!    endpoint change counters, which a sync reads when it starts, moved by N, and no sync
//!    is queued after the last one: the readiness judge of the scenario runner), checks
//!    that it left none out (`kubeproxy_ebpf_services_not_programmed`), and counts the
//!    N + 1 frontends in the pinned service map; only then does the prober stop.
//!
//! What is recorded (bench `scale`, mode `ebpf`, N = the services):
//! - `cold_sync_ms`: from the rename to the end of the sync that programmed the last of
//!   them (the agent's `kubeproxy_sync_proxy_rules_last_timestamp_seconds`): the agent's
//!   time for the change, reading and parsing the manifest included (the directory
//!   source is woken by inotify when the file is renamed in; its 500 ms poll is only the
//!   fallback);
//! - `cold_sync_agent_ms` and `cold_syncs`: what the agent's own sync histogram
//!   (`kubeproxy_sync_proxy_rules_duration_seconds`) adds up over the syncs of that change,
//!   and how many there were: the proxier's time, without the reading and parsing, nor
//!   the waits between syncs (minSyncPeriod);
//! - `failed_probes` and `probes`, `probe_longest_gap_ms` (see [`ProbeReport`]);
//! - `agent_rss`, `agent_peak_rss` (VmRSS and VmHWM after the settle time), and
//!   `bpf_map_memory` (the pinned maps' `bytes_memlock`), in MiB;
//! - `map_growths`: `kubeproxy_ebpf_map_growths_total`, summed over the maps.
//!
//! A run that does not get there fails with what it saw: how many of the changes the
//! agent applied, how many frontends the map holds, what the agent left out, the probes,
//! and the end of the agent's log. `SCALE_KEEP_AGENT_LOG=FILE` keeps the whole log.

use std::{
    fs,
    net::SocketAddr,
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use clap::Args;
use serde_json::Map;

use ::tests::scenario::{
    netns::ip_in,
    readiness::{Change, SyncTimes, judge_metrics, parse_sync_times},
};

use super::{
    MIB, MemoryOptions, agent_memory, pinned_maps,
    probe::{ProbeReport, ProberProcess},
};
use crate::{
    agent::BenchAgent,
    error::{Error, Result},
    latency::prober::monotonic_ns,
    manifests::{self, MAX_FILLER, SERVICE_IP, SERVICE_PORT},
    maps::{frontends_in, wait_frontends},
    metrics::{metric_sum, samples},
    net::{self, BenchNet},
    rows::Row,
};

pub const BENCH: &str = "scale";
/// The only mode the scale run measures.
pub const MODE: &str = "ebpf";
/// A file the agent's log of each scale run is copied to (the last run's stays).
pub const KEEP_AGENT_LOG: &str = "SCALE_KEEP_AGENT_LOG";
/// The most endpoints per service the manifests write.
pub const MAX_ENDPOINTS: u32 = 64;

/// What the scale part of the memory suite runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleOptions {
    /// Services added at once (each with `endpoints` endpoints).
    pub services: u32,
    pub endpoints: u32,
    /// Scale runs, each in fresh namespaces with a fresh agent; 0: none.
    pub reps: u32,
    /// The bound of each wait on the agent (the probed service's sync, the big sync, the
    /// frontends in the map).
    pub sync_timeout: Duration,
}

impl ScaleOptions {
    /// Issue 20's target: 100,000 × 10, once.
    pub fn full() -> Self {
        ScaleOptions {
            services: 100_000,
            endpoints: 10,
            reps: 1,
            sync_timeout: Duration::from_secs(120),
        }
    }

    /// A small run that proves the measurement works: enough services that the service
    /// and backend maps outgrow their default 65,536 entries.
    pub fn quick() -> Self {
        ScaleOptions {
            services: 6_000,
            sync_timeout: Duration::from_secs(60),
            ..Self::full()
        }
    }

    /// Fails for a run the manifests cannot describe.
    pub fn check(&self) -> Result<()> {
        if self.reps == 0 {
            return Ok(());
        }
        if self.services == 0 || !(1..=MAX_ENDPOINTS).contains(&self.endpoints) {
            return Err(Error::Setup(format!(
                "a scale run needs at least one service and 1 to {MAX_ENDPOINTS} endpoints \
                 each (asked: {} × {})",
                self.services, self.endpoints
            )));
        }
        if u64::from(self.services) * u64::from(self.endpoints) > u64::from(MAX_FILLER) {
            return Err(Error::Setup(format!(
                "{} services × {} endpoints is more than the {MAX_FILLER} backend addresses \
                 the manifests have",
                self.services, self.endpoints
            )));
        }
        if self.sync_timeout.is_zero() {
            return Err(Error::Setup("the scale run's timeout is 0".into()));
        }
        Ok(())
    }
}

/// The scale run's options on `loadgen bench-memory`.
#[derive(Debug, Clone, Default, Args)]
pub struct ScaleArgs {
    /// Services of the scale run, added at once to a probed one (default 100000; quick:
    /// 6000).
    #[arg(long)]
    pub scale_services: Option<u32>,
    /// Endpoints of each of them (default 10).
    #[arg(long)]
    pub scale_endpoints: Option<u32>,
    /// Scale runs (default 1; 0 leaves the scale run out).
    #[arg(long)]
    pub scale_reps: Option<u32>,
    /// Seconds each wait on the agent may take before the run fails (default 120; quick:
    /// 60).
    #[arg(long)]
    pub scale_timeout_secs: Option<u64>,
}

impl ScaleArgs {
    /// `opts` with the options given here in place of its own, checked.
    pub fn apply(&self, mut opts: ScaleOptions) -> Result<ScaleOptions> {
        if let Some(services) = self.scale_services {
            opts.services = services;
        }
        if let Some(endpoints) = self.scale_endpoints {
            opts.endpoints = endpoints;
        }
        if let Some(reps) = self.scale_reps {
            opts.reps = reps;
        }
        if let Some(secs) = self.scale_timeout_secs {
            opts.sync_timeout = Duration::from_secs(secs);
        }
        opts.check()?;
        Ok(opts)
    }
}

/// What the agent's metrics say at one moment (pure).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSample {
    pub times: SyncTimes,
    /// Service and EndpointSlice changes applied by the last sync that started.
    pub service_changes: f64,
    pub endpoint_changes: f64,
    /// Syncs so far and their total duration. Every IP family's series records each sync
    /// (the agent programs them together): the largest series is the count.
    pub syncs: f64,
    pub sync_seconds: f64,
    pub map_growths: f64,
    pub not_programmed: f64,
}

const SYNC_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";

impl AgentSample {
    pub fn parse(text: &str) -> Self {
        let largest = |name: &str| {
            samples(text, name)
                .into_iter()
                .map(|(_, v)| v)
                .fold(0.0, f64::max)
        };
        let sum = |name: &str| metric_sum(text, name).unwrap_or(0.0);
        AgentSample {
            times: parse_sync_times(text),
            service_changes: sum("kubeproxy_sync_proxy_rules_service_changes_total"),
            endpoint_changes: sum("kubeproxy_sync_proxy_rules_endpoint_changes_total"),
            syncs: largest(&format!("{SYNC_DURATION}_count")),
            sync_seconds: largest(&format!("{SYNC_DURATION}_sum")),
            map_growths: sum("kubeproxy_ebpf_map_growths_total"),
            not_programmed: sum("kubeproxy_ebpf_services_not_programmed"),
        }
    }
}

/// Whether the agent has programmed the `services` added by `change` (`before`: its
/// metrics just before): a sync that started after it had heard of every one of them
/// (its change counters moved by that much) has finished, and no sync is queued after
/// it. Otherwise how far it got.
pub fn judge_scale_sync(
    before: &AgentSample,
    now: &AgentSample,
    services: u32,
    change: Change,
    at: SystemTime,
) -> Result<(), String> {
    let applied = |total: f64, earlier: f64| (total - earlier).max(0.0);
    let (svc, eps) = (
        applied(now.service_changes, before.service_changes),
        applied(now.endpoint_changes, before.endpoint_changes),
    );
    let wanted = f64::from(services);
    if svc < wanted || eps < wanted {
        return Err(format!(
            "the syncs so far applied {svc:.0} of {services} service and {eps:.0} of \
             {services} EndpointSlice changes"
        ));
    }
    judge_metrics(&now.times, change, at, &[])
}

/// One scale run's measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleRun {
    pub cold_sync: Duration,
    pub agent_sync: Duration,
    pub syncs: u64,
    pub probes: ProbeReport,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub map_bytes: u64,
    pub map_growths: u64,
}

impl ScaleRun {
    /// Its rows (bench `scale`, mode `ebpf`, N = `services`).
    pub fn rows(&self, services: u32, rep: u32) -> Vec<Row> {
        let row = |metric: &str, value: f64, unit: &'static str| Row {
            bench: BENCH,
            mode: MODE.into(),
            n: u64::from(services),
            rep: rep.to_string(),
            metric: metric.into(),
            value,
            unit,
            ratio: None,
        };
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mib = |bytes: u64| bytes as f64 / MIB;
        vec![
            row("cold_sync_ms", ms(self.cold_sync), "ms"),
            row("cold_sync_agent_ms", ms(self.agent_sync), "ms"),
            row("cold_syncs", self.syncs as f64, "count"),
            row("failed_probes", self.probes.failures as f64, "count"),
            row("probes", self.probes.attempts as f64, "count"),
            row(
                "probe_longest_gap_ms",
                self.probes.longest_gap_ms as f64,
                "ms",
            ),
            row("agent_rss", mib(self.rss_bytes), "MiB"),
            row("agent_peak_rss", mib(self.peak_rss_bytes), "MiB"),
            row("bpf_map_memory", mib(self.map_bytes), "MiB"),
            row("map_growths", self.map_growths as f64, "count"),
        ]
    }

    /// The run in one line.
    pub fn summary(&self, services: u32, endpoints: u32) -> String {
        format!(
            "scale {services} x {endpoints}: cold sync {:.0} ms (the agent's {} syncs: {:.0} ms), \
             {} of {} probes failed (longest gap {} ms), RSS {:.1} MiB, peak {:.1} MiB, \
             BPF maps {:.1} MiB, {} map growths",
            self.cold_sync.as_secs_f64() * 1000.0,
            self.syncs,
            self.agent_sync.as_secs_f64() * 1000.0,
            self.probes.failures,
            self.probes.attempts,
            self.probes.longest_gap_ms,
            self.rss_bytes as f64 / MIB,
            self.peak_rss_bytes as f64 / MIB,
            self.map_bytes as f64 / MIB,
            self.map_growths,
        )
    }
}

/// When the failed probes started, in ms after `origin_ms` (CLOCK_MONOTONIC).
pub fn failure_offsets(report: &ProbeReport, origin_ms: u64) -> String {
    let offsets: Vec<String> = report
        .failed_at_ms
        .iter()
        .map(|at| {
            let offset = i128::from(*at) - i128::from(origin_ms);
            format!("{offset:+} ms")
        })
        .collect();
    offsets.join(", ")
}

fn epoch_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn secs(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or_default()
}

/// One scale run in fresh namespaces (see the module doc).
pub(super) fn measure_scale(opts: &MemoryOptions, id: &str, rep: u32) -> Result<Vec<Row>> {
    let scale = &opts.scale;
    let (services, endpoints, timeout) = (scale.services, scale.endpoints, scale.sync_timeout);
    opts.progress(&format!(
        "scale: {services} services x {endpoints} endpoints added to a probed service, \
         default configuration ({id}, rep {rep})"
    ));
    let mut bench_net = BenchNet::build(id)?;
    bench_net.start_backend(&opts.loadgen_binary, None)?;
    // A connect the socket programs did not translate fails at once instead of leaving
    // the pod: a gap in the maps is a failed probe, not a slow one.
    ip_in(
        &bench_net.client_ns,
        &["route", "add", "unreachable", &format!("{SERVICE_IP}/32")],
    )?;
    let manifests_dir = bench_net.measured_manifests()?;
    let bpffs = net::bpffs_root(id);
    let started = SystemTime::now();
    // No settings of the benchmark's own: default map sizes, periods and limits.
    let mut agent = BenchAgent::start_with(
        &opts.agent_binary,
        bench_net.node_place(),
        &bench_net.run_dir,
        &manifests_dir,
        &bpffs,
        &Map::new(),
    )?;
    agent.wait_initial_sync(started, timeout)?;
    wait_frontends(&agent, &bpffs, 1, timeout)?;

    // Written beside the directory and renamed into it: the agent never sees half.
    let staged = bench_net.run_dir.join("scale.json");
    fs::write(
        &staged,
        manifests::filler_services_with(services, endpoints),
    )
    .map_err(Error::io(format!("writing {}", staged.display())))?;
    let target = SocketAddr::from((SERVICE_IP, SERVICE_PORT));
    let prober = ProberProcess::start(&bench_net, &opts.loadgen_binary, target)?;
    wait_out_min_sync_period(&agent)?;
    let before = AgentSample::parse(&agent.metrics().map_err(Error::Agent)?);
    let visible = SystemTime::now();
    let visible_ms = monotonic_ns() / 1_000_000;
    let placed = manifests_dir.join("scale.json");
    fs::rename(&staged, &placed).map_err(Error::io(format!("renaming to {}", placed.display())))?;
    let change = Change {
        started: visible,
        at: SystemTime::now(),
        initial: false,
    };
    let programmed = agent
        .wait_metrics(timeout, |text, at| {
            let sample = AgentSample::parse(text);
            judge_scale_sync(&before, &sample, services, change, at).map(|()| sample)
        })
        .and_then(|after| {
            if after.not_programmed > 0.0 {
                return Err(agent.failure(format!(
                    "the agent synced but left {:.0} services out of full maps",
                    after.not_programmed
                )));
            }
            wait_frontends(&agent, &bpffs, services + 1, timeout)?;
            Ok(after)
        });
    let probes = prober.finish();
    let after = match programmed {
        Ok(after) => after,
        Err(err) => {
            keep_agent_log(&agent);
            return Err(partial_state(
                err,
                &agent,
                &bpffs,
                services,
                &before,
                probes.as_ref().ok(),
            ));
        }
    };
    let probes = probes?;
    let cold_sync = after.times.last_sync().unwrap_or(0.0) - epoch_secs(visible);
    if cold_sync <= 0.0 {
        return Err(agent.failure(format!(
            "the last sync ended {:.3} s before the services were written",
            -cold_sync
        )));
    }
    if probes.failures > 0 {
        opts.progress(&format!(
            "scale: {} of {} probes failed ({}), at {} after the services were written",
            probes.failures,
            probes.attempts,
            probes.first_error.as_deref().unwrap_or("?"),
            failure_offsets(&probes, visible_ms)
        ));
    }
    thread::sleep(opts.settle);
    let (rss_bytes, peak_rss_bytes) = agent_memory(&agent)?;
    let map_bytes = pinned_maps(&bpffs)?.iter().map(|(_, b)| b).sum();
    // Read after the settle time: a growth counted late still counts.
    let growths = agent
        .metrics()
        .map(|text| AgentSample::parse(&text).map_growths)
        .unwrap_or(after.map_growths);
    let run = ScaleRun {
        cold_sync: secs(cold_sync),
        agent_sync: secs(after.sync_seconds - before.sync_seconds),
        syncs: (after.syncs - before.syncs).max(0.0) as u64,
        probes,
        rss_bytes,
        peak_rss_bytes,
        map_bytes,
        map_growths: growths.max(0.0) as u64,
    };
    opts.progress(&run.summary(services, endpoints));
    keep_agent_log(&agent);
    drop(agent);
    bench_net.cleanup();
    Ok(run.rows(services, rep))
}

/// Copies the agent's log to `SCALE_KEEP_AGENT_LOG` when it is set (the run directory
/// goes with the cleanup).
fn keep_agent_log(agent: &BenchAgent) {
    if let Some(keep) = std::env::var_os(KEEP_AGENT_LOG)
        && let Err(err) = fs::copy(&agent.log, &keep)
    {
        eprintln!("keeping the agent's log: {err}");
    }
}

/// Sleeps until the default minSyncPeriod has passed since the agent's last sync (the
/// probed service's): a cold start has no earlier sync whose rate limit could hold the
/// next one back, so none may be timed here.
fn wait_out_min_sync_period(agent: &BenchAgent) -> Result<()> {
    let min_sync = proxy_agent::config::default_config()
        .effective_sync_periods(proxy_agent::config::ProxyMode::Ebpf)
        .min_sync
        .to_std();
    let last_sync = parse_sync_times(&agent.metrics().map_err(Error::Agent)?)
        .last_sync()
        .ok_or_else(|| agent.failure("no sync before the scale run".into()))?;
    let free_at = last_sync + min_sync.as_secs_f64();
    let now = epoch_secs(SystemTime::now());
    if free_at > now {
        thread::sleep(secs(free_at - now));
    }
    Ok(())
}

/// `err` with what the agent had programmed when the run gave up.
fn partial_state(
    err: Error,
    agent: &BenchAgent,
    bpffs: &std::path::Path,
    services: u32,
    before: &AgentSample,
    probes: Option<&ProbeReport>,
) -> Error {
    let frontends = match frontends_in(bpffs) {
        Ok(n) => n.to_string(),
        Err(e) => format!("? ({e})"),
    };
    let agent_state = match agent.metrics() {
        Ok(text) => {
            let now = AgentSample::parse(&text);
            format!(
                "the agent applied {:.0} of {services} service and {:.0} of {services} \
                 EndpointSlice changes, left {:.0} services out of full maps, grew maps {:.0} \
                 times",
                (now.service_changes - before.service_changes).max(0.0),
                (now.endpoint_changes - before.endpoint_changes).max(0.0),
                now.not_programmed,
                now.map_growths
            )
        }
        Err(e) => format!("the agent's metrics: {e}"),
    };
    let probes = probes.map_or_else(
        || "the prober did not report".to_string(),
        |p| format!("{} of {} probes failed", p.failures, p.attempts),
    );
    Error::Agent(format!(
        "scale run of {services} services not programmed: {frontends} of {} frontends in \
         the service map; {agent_state}; {probes}\n{err}",
        services + 1
    ))
}

#[cfg(test)]
#[path = "scale_tests.rs"]
mod tests;
