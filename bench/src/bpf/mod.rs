// SPDX-License-Identifier: Apache-2.0
//! The `bpf` benchmark:
//!
//! - connect() cost, the reported figure: the ebpf-mode agent in the benchmark namespaces
//!   (as `clusterip`) with N services in the maps, one client alternating in 100 ms slices
//!   between connect() through the socket programs and connect() from a cgroup without
//!   them ([`connect`]);
//! - per-packet cost of `tc_pod_ingress` with `BPF_PROG_TEST_RUN`, the conntrack map empty
//!   and holding 1,000,000 flows, and what the run-time statistics add per call, measured
//!   the same way ([`testrun`]);
//! - program cost by run-time statistics (a secondary view): the client connecting through
//!   the ClusterIP for a few seconds; the kernel's statistics of each of the run's
//!   programs, read before and after, give calls and nanoseconds per call ([`progs`]), and
//!   the same less the statistics' own measured overhead (`_net`);
//! - map updates: the time per element to fill (and overwrite) a service map of N entries
//!   one update at a time against batched updates ([`mapupdate`]);
//! - Maglev tables: the time to build a table over N backends against writing it into
//!   the map ([`maglev`]).

mod batch;
pub mod connect;
pub mod maglev;
pub mod mapupdate;
pub mod progs;
pub mod testrun;

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
    rows::{Row, with_medians, with_spread},
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
    /// Reps of the connect() comparison, and its measured time per route and rep.
    pub connect_reps: u32,
    pub connect_duration: Duration,
    /// Conntrack flows in the map for the test-run part (empty: skip it), its reps and
    /// the kernel's repetitions per measurement.
    pub ct_entries: Vec<u32>,
    pub test_run_reps: u32,
    pub test_run_repeat: u32,
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
    /// 1 and 100,000 services: connect() 5 reps of 3 s per route, statistics 3 reps of
    /// 3 s; test runs with 0 and 1,000,000 conntrack flows, 5 reps of 200,000 runs; maps of
    /// 1k to 1M entries, 3 reps, 4096 per batch; Maglev tables of 16381 and 65521 entries
    /// over 1,000 backends, 3 reps.
    pub fn full(agent_binary: PathBuf, loadgen_binary: PathBuf) -> Self {
        BpfOptions {
            agent_binary,
            loadgen_binary,
            service_counts: vec![1, 100_000],
            reps: 3,
            client_duration: Duration::from_secs(3),
            connect_reps: 5,
            connect_duration: Duration::from_secs(3),
            ct_entries: vec![0, 1_000_000],
            test_run_reps: 5,
            test_run_repeat: 200_000,
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
            connect_reps: 1,
            connect_duration: Duration::from_millis(500),
            ct_entries: vec![0, 10_000],
            test_run_reps: 1,
            test_run_repeat: 10_000,
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
/// and its address's wildcard entry; a backend each; reverse-NAT entries are room for two
/// per service, as the dataplane suite gives them: at 100,000 services one each overflows).
pub fn agent_fragment(services: u32, endpoints: u32) -> Map<String, Value> {
    agent_fragment_with_ct(services, endpoints, 0)
}

/// [`agent_fragment`], with a conntrack map of at least `ct_flows` entries (an LRU map
/// is allocated whole: no room is added beyond the power of two).
pub fn agent_fragment_with_ct(services: u32, endpoints: u32, ct_flows: u32) -> Map<String, Value> {
    let defaults = proxy_agent::config::MapSizes::default();
    let (s, e) = (u64::from(services), u64::from(endpoints));
    let conntrack = u32::try_from(u64::from(ct_flows).next_power_of_two())
        .unwrap_or(proxy_agent::config::MAX_MAP_ENTRIES)
        .max(defaults.conntrack);
    let mut fragment = config_fragment();
    fragment.insert(
        "ebpf".into(),
        json!({"mapSizes": {
            "services": sized(s * (2 + e), defaults.services),
            "backends": sized(s * e, defaults.backends),
            "revNat": sized(2 * s, defaults.rev_nat),
            "conntrack": conntrack,
        }}),
    );
    fragment
}

/// The uplink of the program part's node.
const UPLINK: &str = "up0";

/// `fragment` with the agent's tc and XDP (generic) programs on [`UPLINK`].
fn with_uplink(mut fragment: Map<String, Value>) -> Map<String, Value> {
    if let Some(Value::Object(ebpf)) = fragment.get_mut("ebpf") {
        ebpf.insert("devices".into(), json!([UPLINK]));
        ebpf.insert("xdpMode".into(), json!("generic"));
    }
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
    results.rows = with_spread(
        with_medians(std::mem::take(&mut results.rows)),
        &[
            connect::MODE_ATTACHED,
            testrun::MODE_TEST_RUN,
            testrun::MODE_TEST_RUN_STATS,
        ],
    );
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
    // An uplink for the north-south programs (tc and generic XDP), which the test runs
    // measure; no traffic goes through it. (A veth pair: this kernel has no dummy device.)
    let uplink = format!("{}/24", testrun::UPLINK_IP);
    for args in [
        vec!["link", "add", UPLINK, "type", "veth", "peer", "name", "up1"],
        vec!["addr", "add", uplink.as_str(), "dev", UPLINK],
        vec!["link", "set", "up1", "up"],
        vec!["link", "set", UPLINK, "up"],
    ] {
        ::tests::scenario::netns::ip_in(&bench_net.node_ns, &args)?;
    }

    opts.progress("starting the agent (ebpf mode)");
    let bpffs = net::bpffs_root(&id);
    let largest = counts.last().copied().unwrap_or(1);
    let started = SystemTime::now();
    let ct_flows = opts.ct_entries.iter().copied().max().unwrap_or(0);
    // Declared after the namespaces, so it stops (and unpins) before they go.
    let mut agent = BenchAgent::start_with(
        &opts.agent_binary,
        bench_net.node_place(),
        &bench_net.run_dir,
        &manifests_dir,
        &bpffs,
        &with_uplink(agent_fragment_with_ct(largest, 1, ct_flows)),
    )?;
    agent.wait_initial_sync(started, opts.sync_timeout)?;
    let ids = progs::run_program_ids(&bpffs)?;
    let bare = connect::BareCgroup::create(&id)?;
    let watched: Vec<usize> = client_cpu.into_iter().chain(server_cpu).collect();
    let mut connect_reps = Vec::new();
    let mut stats_rows = Vec::new();
    for services in counts {
        match load_services(opts, &mut agent, &manifests_dir, &bpffs, services) {
            Ok(()) => {}
            // The agent cannot hold N services (the counts ascend: nor any larger N): the
            // parts measured so far, and the others, still count.
            Err(err @ (Error::Setup(_) | Error::Agent(_))) => {
                opts.progress(&format!("N={services}: not measured: {err}"));
                break;
            }
            Err(err) => return Err(err),
        }
        for rep in 0..opts.connect_reps {
            signals::check()?;
            let r = connect::measure(
                &bench_net,
                &opts.loadgen_binary,
                &bare.path,
                (client_cpu, &watched),
                opts.connect_duration,
                (services, rep),
            )?;
            opts.progress(&format!(
                "N={services} rep {rep} connect() p50/p99: attached {:.1}/{:.1} us, detached {:.1}/{:.1} us (p99 {:.3}x)",
                r.attached.connect_p50_us,
                r.attached.connect_p99_us,
                r.detached.connect_p50_us,
                r.detached.connect_p99_us,
                r.attached.connect_p99_us / r.detached.connect_p99_us.max(f64::MIN_POSITIVE),
            ));
            connect_reps.push(r);
        }
        let stats = progs::StatsGuard::enable()?;
        results.stats_by = Some(stats.how);
        for rep in 0..opts.reps {
            stats_rows.extend(stats_rep(
                opts, &bench_net, client_cpu, &ids, services, rep,
            )?);
        }
        drop(stats);
    }
    results.rows.extend(connect::rows(&connect_reps));
    let test_run_rows = if opts.ct_entries.is_empty() {
        Vec::new()
    } else {
        test_runs(opts, &id, &bpffs, &ids)?
    };
    // The statistics' own cost per call, from the test runs with the map empty.
    let overheads: Vec<f64> = test_run_rows
        .iter()
        .filter(|r| r.metric == testrun::METRIC_STATS_OVERHEAD && r.n == 0)
        .map(|r| r.value)
        .collect();
    let overhead = crate::stats::median(&overheads);
    results.rows.extend(test_run_rows);
    if let Some(overhead) = overhead {
        let net: Vec<Row> = stats_rows
            .iter()
            .filter(|r| r.metric.ends_with("_ns_per_call"))
            .map(|r| Row {
                metric: format!("{}_net", r.metric),
                value: r.value - overhead,
                ..r.clone()
            })
            .collect();
        stats_rows.extend(net);
    }
    results.rows.extend(stats_rows);
    drop(bare);
    drop(agent);
    bench_net.cleanup();
    Ok(())
}

/// One statistics rep: calls and ns per call of each program over a client run.
fn stats_rep(
    opts: &BpfOptions,
    bench_net: &BenchNet,
    client_cpu: Option<usize>,
    ids: &[u32],
    services: u32,
    rep: u32,
) -> Result<Vec<Row>> {
    let before = progs::snapshot(ids)?;
    let report = run_client(opts, bench_net, client_cpu)?;
    let after = progs::snapshot(ids)?;
    let mut rows = Vec::new();
    for (name, d) in &progs::delta(&before, &after) {
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
        rows.push(row(format!("{name}_calls"), d.run_cnt as f64, "calls"));
        if d.run_cnt > 0 {
            let ns = d.run_time_ns as f64 / d.run_cnt as f64;
            opts.progress(&format!(
                "N={services} rep {rep} {name:<20} {:>9} calls {ns:>8.1} ns/call (stats on)",
                d.run_cnt
            ));
            rows.push(row(format!("{name}_ns_per_call"), ns, "ns"));
        }
    }
    opts.progress(&format!(
        "N={services} rep {rep}: client {} connections ({:.0}/s)",
        report.connections, report.rate
    ));
    Ok(rows)
}

/// The test-run part: the tc and XDP programs of the run's agent at each conntrack fill.
fn test_runs(opts: &BpfOptions, id: &str, bpffs: &Path, ids: &[u32]) -> Result<Vec<Row>> {
    if testrun::stats_forced_on() {
        opts.progress(
            "kernel.bpf_stats_enabled is 1: the test runs' \"off\" include the statistics",
        );
    }
    let names = progs::snapshot(ids)?;
    let pins = testrun::PinDir::create(&net::bpffs_root(&format!("{id}-progs")))?;
    let mut programs = Vec::new();
    for (name, xdp, frame, verdict) in testrun::measured_programs() {
        match names.iter().find(|(_, (n, _))| n == name) {
            Some((prog_id, _)) => {
                programs.push((name, pins.open(*prog_id, name, xdp)?, frame, verdict));
            }
            None if name == testrun::PROGRAM => {
                return Err(Error::Setup(format!("the agent attached no {name}")));
            }
            None => opts.progress(&format!("{name} is not attached: not measured")),
        }
    }
    let maps = proxy_agent::proxier::ebpf::maps_dir(bpffs);
    let mut rows = Vec::new();
    for &flows in &opts.ct_entries {
        let written = if flows > 0 {
            testrun::fill_conntrack(&maps, flows)?
        } else {
            0
        };
        let measured: Result<Vec<Row>> = programs
            .iter()
            .map(|(name, prog, frame, verdict)| {
                testrun::measure(
                    (name, prog),
                    (frame, *verdict),
                    u64::from(flows),
                    (opts.test_run_reps, opts.test_run_repeat),
                )
            })
            .collect::<Result<Vec<_>>>()
            .map(|all| all.concat());
        if flows > 0 {
            testrun::clear_conntrack(&maps, flows)?;
        }
        let measured = measured?;
        for r in &measured {
            opts.progress(&format!(
                "{flows} conntrack flows ({written} written) rep {} {:<15} {:<32} {:>7.1} ns",
                r.rep, r.mode, r.metric, r.value
            ));
        }
        rows.extend(measured);
    }
    drop(programs);
    drop(pins);
    Ok(rows)
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
            &manifests_dir.join("fillers.json"),
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
