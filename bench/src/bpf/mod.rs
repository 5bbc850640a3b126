// SPDX-License-Identifier: Apache-2.0
//! The `bpf` benchmark, two parts:
//!
//! - program cost: the ebpf-mode agent in the benchmark namespaces (as `clusterip`), the
//!   client connecting through the ClusterIP for a few seconds with N services in the
//!   maps; the kernel's run-time statistics of each of the run's programs, read before and
//!   after, give calls and nanoseconds per call ([`progs`]);
//! - map updates: the time per element to fill (and overwrite) a service map of N entries
//!   one update at a time against batched updates ([`mapupdate`]);
//! - Maglev tables: the time to build a table over N backends against writing it into
//!   the map ([`maglev`]).

mod batch;
pub mod maglev;
pub mod mapupdate;
pub mod progs;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use serde_json::{Map, Value, json};

use ::tests::scenario::readiness::Change;

use super::{
    agent::{BenchAgent, config_fragment},
    client::connection_run,
    error::{Error, Result},
    load::{ClientReport, allowed_cpus},
    manifests::{self, SERVICE_IP, SERVICE_PORT},
    net::{self, BenchNet},
    results::Environment,
    rows::{Row, with_medians},
    signals,
};

pub const BENCH: &str = "bpf";
/// The connect4 target of issue 8 (reported by the lead, never asserted).
pub const TARGET_CONNECT4_NS: f64 = 150.0;

#[derive(Debug, Clone)]
pub struct BpfOptions {
    pub agent_binary: PathBuf,
    pub loadgen_binary: PathBuf,
    /// Services in the maps for the program-cost part (empty: skip it).
    pub service_counts: Vec<u32>,
    pub reps: u32,
    /// How long the client runs per rep.
    pub client_duration: Duration,
    /// Map sizes for the map-update part (empty: skip it).
    pub map_entries: Vec<u32>,
    pub map_reps: u32,
    pub batch_size: usize,
    /// Backend counts of the Maglev part (empty: skip it), and its table sizes.
    pub maglev_backends: Vec<u32>,
    pub maglev_sizes: Vec<u32>,
    pub sync_timeout: Duration,
    pub verbose: bool,
}

impl BpfOptions {
    /// 1 and 50,000 services, 3 reps of 3 s; maps of 1k to 1M entries, 3 reps, 4096 per
    /// batch; Maglev tables of 16381 and 65521 entries over 1,000 backends, 3 reps.
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        BpfOptions {
            agent_binary,
            loadgen_binary,
            service_counts: vec![1, 50_000],
            reps: 3,
            client_duration: Duration::from_secs(3),
            map_entries: vec![1_000, 10_000, 100_000, 1_000_000],
            map_reps: 3,
            batch_size: 4096,
            maglev_backends: vec![1_000],
            maglev_sizes: vec![16_381, 65_521],
            sync_timeout: Duration::from_secs(180),
            verbose: true,
        }
    }

    /// 1 and 1,000 services, 1 rep of 1 s; a map of 1,000 entries; one Maglev table of
    /// 16381 entries over 1,000 backends.
    pub fn quick(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        BpfOptions {
            service_counts: vec![1, 1_000],
            reps: 1,
            client_duration: Duration::from_secs(1),
            map_entries: vec![1_000],
            map_reps: 1,
            maglev_sizes: vec![16_381],
            sync_timeout: Duration::from_secs(60),
            ..Self::full(agent_binary, loadgen_binary)
        }
    }

    fn progress(&self, line: &str) {
        if self.verbose {
            eprintln!("==> {line}");
        }
    }
}

#[derive(Debug, Clone)]
pub struct BpfResults {
    /// The run id of the program-cost part (`None` when it was skipped).
    pub run_id: Option<String>,
    pub env: Environment,
    /// How run-time statistics were enabled.
    pub stats_by: Option<&'static str>,
    pub rows: Vec<Row>,
}

/// The smallest power of two holding `needed` with a quarter to spare, never below
/// `default`.
fn sized(needed: u64, default: u32) -> u32 {
    let wanted = (needed + needed / 4).max(u64::from(default));
    u32::try_from(wanted.next_power_of_two()).unwrap_or(proxy_agent::config::MAX_MAP_ENTRIES)
}

/// The benchmark's agent settings for up to `services` services of `endpoints` backends
/// each: the maps sized to hold them (a frontend takes a slot-0 entry, a slot per backend
/// and its address's wildcard entry; a backend and a reverse-NAT entry each).
pub fn agent_fragment(services: u32, endpoints: u32) -> Map<String, Value> {
    let defaults = proxy_agent::config::MapSizes::default();
    let (s, e) = (u64::from(services), u64::from(endpoints));
    let mut fragment = config_fragment();
    fragment.insert(
        "ebpf".into(),
        json!({"mapSizes": {
            "services": sized(s * (2 + e), defaults.services),
            "backends": sized(s * e, defaults.backends),
            "revNat": sized(s, defaults.rev_nat),
        }}),
    );
    fragment
}

/// Runs both parts. Needs root.
pub fn run_bpf(opts: &BpfOptions) -> Result<BpfResults> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Setup("the benchmark needs root (eBPF)".into()));
    }
    let env = Environment::detect();
    let mut results = BpfResults {
        run_id: None,
        env,
        stats_by: None,
        rows: Vec::new(),
    };
    if !opts.service_counts.is_empty() {
        program_costs(opts, &mut results)?;
    }
    for &entries in &opts.map_entries {
        for rep in 0..opts.map_reps {
            signals::check()?;
            let rows = mapupdate::measure(entries, opts.batch_size, rep)?;
            for r in &rows {
                opts.progress(&format!(
                    "{} entries rep {rep} {:<10} {:<22} {:>8.1} ns/elem",
                    entries, r.mode, r.metric, r.value
                ));
            }
            results.rows.extend(rows);
        }
    }
    for &backends in &opts.maglev_backends {
        for &size in &opts.maglev_sizes {
            for rep in 0..opts.map_reps {
                let rows = maglev::measure(backends, size, rep)?;
                for r in &rows {
                    opts.progress(&format!(
                        "{backends} backends, table of {size} rep {rep} {:<13} {:>8.2} ms",
                        r.mode, r.value
                    ));
                }
                results.rows.extend(rows);
            }
        }
    }
    results.rows = with_medians(std::mem::take(&mut results.rows));
    Ok(results)
}

fn program_costs(opts: &BpfOptions, results: &mut BpfResults) -> Result<()> {
    net::check_built(&[&opts.agent_binary, &opts.loadgen_binary])?;
    let counts = net::service_counts(&opts.service_counts, opts.reps)?;
    for line in net::cleanup_stale()? {
        opts.progress(&format!("removed stale {line}"));
    }
    let (client_cpu, server_cpu) = match allowed_cpus().as_slice() {
        [first, second, ..] => (Some(*first), Some(*second)),
        _ => (None, None),
    };
    let id = net::new_run_id();
    results.run_id = Some(id.clone());
    opts.progress(&format!("building namespaces {id}-{{node,cli,srv}}"));
    let mut bench_net = BenchNet::build(&id)?;
    let manifests_dir = bench_net.measured_manifests()?;
    bench_net.start_backend(&opts.loadgen_binary, server_cpu)?;

    opts.progress("starting the agent (ebpf mode)");
    let bpffs = net::bpffs_root(&id);
    let largest = counts.last().copied().unwrap_or(1);
    let started = SystemTime::now();
    // Declared after the namespaces, so it stops (and unpins) before they go.
    let mut agent = BenchAgent::start_with(
        &opts.agent_binary,
        bench_net.node_place(),
        &bench_net.run_dir,
        &manifests_dir,
        &bpffs,
        &agent_fragment(largest, 1),
    )?;
    agent.wait_synced(
        Change {
            started,
            at: started,
            initial: true,
        },
        opts.sync_timeout,
    )?;
    let ids = progs::run_program_ids(&bpffs)?;
    let stats = progs::StatsGuard::enable()?;
    results.stats_by = Some(stats.how);
    opts.progress(&format!(
        "run-time stats on ({}) for programs {ids:?}",
        stats.how
    ));
    for services in counts {
        load_services(opts, &mut agent, &manifests_dir, &bpffs, services)?;
        for rep in 0..opts.reps {
            let before = progs::snapshot(&ids)?;
            let report = run_client(opts, &bench_net, client_cpu)?;
            let after = progs::snapshot(&ids)?;
            let deltas = progs::delta(&before, &after);
            for (name, d) in &deltas {
                let row = |metric: String, value: f64, unit: &'static str| Row {
                    bench: BENCH,
                    mode: "ebpf".into(),
                    n: u64::from(services),
                    rep: rep.to_string(),
                    metric,
                    value,
                    unit,
                    ratio: None,
                };
                results
                    .rows
                    .push(row(format!("{name}_calls"), d.run_cnt as f64, "calls"));
                if d.run_cnt > 0 {
                    let ns = d.run_time_ns as f64 / d.run_cnt as f64;
                    opts.progress(&format!(
                        "N={services} rep {rep} {name:<20} {:>9} calls {ns:>8.1} ns/call",
                        d.run_cnt
                    ));
                    results
                        .rows
                        .push(row(format!("{name}_ns_per_call"), ns, "ns"));
                }
            }
            opts.progress(&format!(
                "N={services} rep {rep}: client {} connections ({:.0}/s)",
                report.connections, report.rate
            ));
        }
    }
    drop(stats);
    drop(agent);
    bench_net.cleanup();
    Ok(())
}

fn run_client(opts: &BpfOptions, bench_net: &BenchNet, cpu: Option<usize>) -> Result<ClientReport> {
    connection_run(
        &bench_net.client_place(),
        &opts.loadgen_binary,
        SocketAddr::from((SERVICE_IP, SERVICE_PORT)),
        opts.client_duration,
        Duration::ZERO,
        cpu,
    )
}

/// Makes the maps hold `services` services (the measured one and fillers) and waits
/// until the agent synced and the service map shows exactly that many frontends.
fn load_services(
    opts: &BpfOptions,
    agent: &mut BenchAgent,
    manifests_dir: &Path,
    bpffs: &Path,
    services: u32,
) -> Result<()> {
    let started = Instant::now();
    if services > 1 {
        let changed_at = SystemTime::now();
        net::write_atomically(
            &manifests_dir.join("fillers.yaml"),
            &manifests::filler_services(services - 1),
        )?;
        agent.wait_synced(
            Change {
                started: changed_at,
                at: SystemTime::now(),
                initial: false,
            },
            opts.sync_timeout,
        )?;
    }
    crate::maps::wait_frontends(agent, bpffs, services, opts.sync_timeout)?;
    opts.progress(&format!(
        "{services} services in the service map (after {:.1} s)",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

#[cfg(test)]
mod tests;
