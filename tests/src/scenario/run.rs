// SPDX-License-Identifier: Apache-2.0
//! Replaying one scenario file in one mode: topology, listeners, cluster state, agent,
//! then every stage's flows in order.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, SystemTime},
};

use serde_json::Value;

use super::{
    agent::{Agent, AgentOptions, ConfigInputs, Proxy, bpffs_root},
    cluster::{ApiServerStore, ClusterSource, DirSource, Tracked},
    conformance::{Observation, ObservedFlow},
    echo::sctp_supported,
    error::{Error, Result},
    format::{Change, Expectation, Flow, Mode, Proto, Scenario},
    netns::Place,
    objects::{object_ref, with_node},
    outcome::{Attempt, Judge},
    placement::Placement,
    readiness,
    real_api::{RealApiStore, uncovered_cluster_ips},
    report::{FlowReport, Status},
    topology::{Topology, Unbound},
    upstream_outcomes::UpstreamOutcomes,
};

/// Which API server holds a scenario's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterApi {
    /// The home-made test API server, inside the node namespace: fast, and the faults a
    /// real server cannot be made to show.
    TestServer,
    /// A manifest directory the agent reads (`--source DIR`).
    Directory,
    /// Upstream's kube-apiserver of the control plane in this directory (`testbed`):
    /// the real validation, defaulting and allocation, the agent with deploy/'s RBAC.
    Real(PathBuf),
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The mode flows are judged in, and the mode the agent must be running (checked on
    /// its /proxyMode once it synced).
    pub mode: Mode,
    /// `None`: no agent (`--no-agent`); only flows needing no proxy can pass.
    pub agent: Option<AgentOptions>,
    /// This runner's own binary, for the `echo`, `probe` and `http-get` subcommands.
    pub runner_exe: PathBuf,
    /// Connect and answer timeout of one probe attempt.
    pub timeout: Duration,
    /// Leave namespaces, cgroup and files in place afterwards.
    pub keep: bool,
    /// Where the agent reads the scenario's objects from.
    pub api: ClusterApi,
    /// After each flow, ask the running agent's `proxy-agent trace` what it would do with
    /// the flow, and fail the flow when that disagrees with what the probes saw (ebpf and
    /// iptables modes).
    pub trace_check: bool,
    /// Only flows of this protocol (`None`: every flow). The qemu guest replays only the
    /// SCTP flows, which this host's kernel cannot carry; every stage is still applied.
    pub only_proto: Option<Proto>,
    /// Only flows whose client is outside the node (`Placement::external_clients`). The
    /// XDP trial replays these: XDP sits on the uplink, and the node's own and its pods'
    /// flows would replay the plain ebpf run.
    pub only_external_clients: bool,
    /// Upstream's outcomes where they are not the files' (`tests/upstream-outcomes.yaml`):
    /// what upstream's kube-proxy is judged by for a listed flow.
    pub upstream_outcomes: UpstreamOutcomes,
    /// Where each flow's observation is appended, one JSON line a flow, for a differential
    /// replay ([`super::conformance`]).
    pub observations: Option<PathBuf>,
}

impl RunOptions {
    /// A plain replay by `agent` in its mode: one-second probes, the test API server, no
    /// trace check, every flow, nothing kept.
    pub fn for_agent(agent: AgentOptions, runner_exe: PathBuf) -> Self {
        Self {
            mode: agent.mode,
            agent: Some(agent),
            runner_exe,
            timeout: Duration::from_secs(1),
            keep: false,
            api: ClusterApi::TestServer,
            trace_check: false,
            only_proto: None,
            only_external_clients: false,
            upstream_outcomes: UpstreamOutcomes::default(),
            observations: None,
        }
    }

    /// Whose proxy runs the replay (ours without an agent: nothing is upstream's).
    pub fn proxy(&self) -> Proxy {
        self.agent.as_ref().map_or(Proxy::Ours, |a| a.proxy)
    }

    /// Whether `flow` is replayed in this run; `external_clients` are the file's clients
    /// outside the node (`None` where its placement failed: the run then reports why, so
    /// nothing is filtered out by place).
    pub fn replays(&self, flow: &Flow, external_clients: Option<&BTreeSet<IpAddr>>) -> bool {
        flow.applies_to(self.mode)
            && self.only_proto.is_none_or(|p| flow.proto == p)
            && (!self.only_external_clients
                || external_clients.is_none_or(|clients| clients.contains(&flow.from)))
    }
}

/// `base` with `overrides` laid over it; objects present in both merge key by key.
pub fn merged_config(
    base: &serde_json::Map<String, serde_json::Value>,
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut out = base.clone();
    for (key, value) in overrides {
        match (out.get_mut(key), value) {
            (Some(serde_json::Value::Object(inner)), serde_json::Value::Object(over)) => {
                *inner = merged_config(inner, over);
            }
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    out
}

/// `*.yaml` files of the directories, sorted by name, whose file name contains `filter`.
pub fn discover(dirs: &[PathBuf], filter: Option<&str>) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for dir in dirs {
        let entries =
            std::fs::read_dir(dir).map_err(Error::io(format!("reading {}", dir.display())))?;
        for entry in entries {
            let path = entry
                .map_err(Error::io(format!("reading {}", dir.display())))?
                .path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(".yaml") && filter.is_none_or(|f| name.contains(f)) {
                files.push(path);
            }
        }
    }
    files.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
    Ok(files)
}

/// Attempts per flow: enough to see several backends chosen, ten for stickiness, one
/// where the answer is silence.
pub fn attempts_for(flow: &Flow) -> u32 {
    match flow.expect {
        _ if flow.sticky => 10,
        Expectation::Backends(_) => 4,
        Expectation::Reject => 2,
        Expectation::Drop | Expectation::Local | Expectation::Untouched => 1,
    }
}

/// Fixed UDP source ports, one per (from, to): a UDP flow keeps its port across steps
/// so conntrack entries from earlier steps are hit again.
#[derive(Debug)]
pub struct UdpPorts {
    taken: BTreeSet<u16>,
    given: BTreeMap<(IpAddr, SocketAddr), u16>,
    next: u16,
}

impl UdpPorts {
    pub fn new(scenario: &Scenario, placement: &Placement) -> Self {
        let mut taken: BTreeSet<u16> = scenario.flows().map(|f| f.to.port()).collect();
        for pod in &placement.pods {
            taken.extend(&pod.echo_ports);
        }
        UdpPorts {
            taken,
            given: BTreeMap::new(),
            next: 20000,
        }
    }

    pub fn port_for(&mut self, from: IpAddr, to: SocketAddr) -> u16 {
        if let Some(port) = self.given.get(&(from, to)) {
            return *port;
        }
        while self.taken.contains(&self.next) {
            self.next += 1;
        }
        let port = self.next;
        self.taken.insert(port);
        self.given.insert((from, to), port);
        port
    }
}

fn report(scenario: &Scenario, flow: &Flow, status: Status, text: String) -> FlowReport {
    FlowReport {
        status,
        scenario: scenario.name.clone(),
        index: flow.index,
        from: flow.from,
        to: flow.to,
        proto: flow.proto,
        text,
    }
}

/// Runs every flow of `scenario` that applies to the mode; `emit` sees each result
/// as soon as it is known. Setup failures become FAILs of the flows they prevent.
pub async fn run_scenario(
    options: &RunOptions,
    scenario: &Scenario,
    emit: &mut dyn FnMut(&FlowReport),
) -> Vec<FlowReport> {
    let mut out = Vec::new();
    let mut push = |r: FlowReport, out: &mut Vec<FlowReport>| {
        emit(&r);
        out.push(r);
    };
    let external_clients = Placement::plan(scenario)
        .ok()
        .map(|placement| placement.external_clients);
    let replays = |f: &Flow| options.replays(f, external_clients.as_ref());
    let applicable = |stage: usize| -> Vec<&Flow> {
        scenario.stages[stage]
            .flows
            .iter()
            .filter(|f| replays(f))
            .collect()
    };
    if scenario.flows().all(|f| !replays(f)) {
        return out;
    }
    let sctp = sctp_supported();
    let unsupported = |flow: &Flow| flow.proto == Proto::Sctp && !sctp;
    let skip = |flow: &Flow| {
        report(
            scenario,
            flow,
            Status::Skip,
            "kernel has no SCTP support (the suite replays SCTP flows in the qemu guest: \
             guest::sctp_scenarios in tests/tests/vm_guest.rs)"
                .into(),
        )
    };
    // The full error (with the agent's log) is printed once; flows get its first line.
    let first_line = |err: &Error| {
        err.to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let mut env = match ScenarioEnv::set_up(options, scenario, sctp).await {
        Ok(env) => env,
        Err(err) => {
            eprintln!("{} ({}): setup failed: {err}", scenario.name, options.mode);
            for stage in 0..scenario.stages.len() {
                for flow in applicable(stage) {
                    let r = if unsupported(flow) {
                        skip(flow)
                    } else {
                        report(
                            scenario,
                            flow,
                            Status::Fail,
                            format!("setup failed: {}", first_line(&err)),
                        )
                    };
                    push(r, &mut out);
                }
            }
            return out;
        }
    };
    for n in 0..scenario.stages.len() {
        let ready = if n == 0 {
            Ok(())
        } else {
            env.enter_stage(n).await
        };
        let node_addresses = ready.and_then(|()| env.topology.node_addresses());
        if let Err(err) = &node_addresses {
            eprintln!(
                "{} ({}): step {n} not applied: {err}",
                scenario.name, options.mode
            );
        }
        let ipvs_lacks = match &node_addresses {
            Ok(_) => env.ipvs_lacks().await,
            Err(_) => None,
        };
        for flow in applicable(n) {
            let r = match &node_addresses {
                _ if unsupported(flow) => skip(flow),
                Err(err) => report(
                    scenario,
                    flow,
                    Status::Fail,
                    format!("step {n} not applied: {}", first_line(err)),
                ),
                Ok(addrs) => {
                    let (judged, listed) = match options.proxy() {
                        Proxy::Upstream => options.upstream_outcomes.judged_by_upstream(
                            &scenario.path,
                            flow,
                            options.mode,
                        ),
                        Proxy::Ours => (flow.clone(), None),
                    };
                    let (status, mut text, observed) = env.run_flow_observed(&judged, addrs).await;
                    if let (Some(path), Some(observed)) = (&options.observations, observed) {
                        record_observation(path, scenario, flow, observed);
                    }
                    if let Some(entry) = listed {
                        text.push_str(&format!(
                            " (judged by upstream's outcome {}, listed as {:?} in {})",
                            judged.expect,
                            entry.kind,
                            super::upstream_outcomes::PATH
                        ));
                    }
                    report(scenario, flow, status, text)
                }
            };
            push(r, &mut out);
        }
        // Beside the flows' own outcomes, not instead of them: a flow that passed did pass.
        if let Some(why) = ipvs_lacks {
            push(FlowReport::check(&scenario.name, n, why), &mut out);
        }
    }
    if out.iter().any(|r| r.status == Status::Fail)
        && let Some(agent) = &env.agent
    {
        eprintln!(
            "--- {} ({}): last lines of {} ---",
            scenario.name,
            options.mode,
            agent.log.display()
        );
        eprintln!("{}", agent.log_tail(30));
    }
    out
}

/// Appends what `flow` of `scenario` showed to `path` (see [`RunOptions::observations`]); a
/// line that cannot be written is reported and the replay goes on.
fn record_observation(path: &Path, scenario: &Scenario, flow: &Flow, observed: Observation) {
    use std::io::Write as _;
    let file = scenario
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let line = ObservedFlow::new(file, flow, observed);
    let written = serde_json::to_string(&line)
        .map_err(std::io::Error::other)
        .and_then(|text| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{text}"))
        });
    if let Err(err) = written {
        eprintln!("observations: writing {}: {err}", path.display());
    }
}

/// Everything one scenario run holds: the namespaces with their listeners, the cluster
/// state, the agent. Field order is drop order: the agent stops (and cleans up) before
/// the namespaces go. Tests that look at the dataplane while a scenario is set up use it
/// directly; [`run_scenario`] drives it through every stage.
pub struct ScenarioEnv<'a> {
    pub agent: Option<Agent>,
    source: Box<dyn ClusterSource>,
    pub topology: Topology,
    state: Vec<Value>,
    udp_ports: UdpPorts,
    /// The current stage's plain listeners that could not bind.
    unbound: Vec<Unbound>,
    sctp: bool,
    options: &'a RunOptions,
    scenario: &'a Scenario,
}

/// How long a stage's plain listener keeps trying an address still in use: the proxy may
/// close a port it served in the previous stage a moment after it reported the sync.
pub fn plain_bind_patience() -> Duration {
    readiness::scaled(Duration::from_secs(5))
}

impl<'a> ScenarioEnv<'a> {
    /// Builds the topology, starts the echo servers (SCTP ones only with `sctp`), loads the
    /// first stage's objects, starts the agent (if any) and waits until it synced them,
    /// then starts the first stage's plain listeners (after the agent opened its ports).
    pub async fn set_up(
        options: &'a RunOptions,
        scenario: &'a Scenario,
        sctp: bool,
    ) -> Result<Self> {
        let placement = Placement::plan(scenario)?;
        let mut topology = Topology::build(&scenario.node, &placement, options.keep)?;
        topology.start_listeners(&options.runner_exe, sctp)?;
        let mut source: Box<dyn ClusterSource> = match &options.api {
            ClusterApi::Directory => {
                Box::new(DirSource::in_dir(&topology.run_dir.join("objects"))?)
            }
            ClusterApi::TestServer => Box::new(Tracked::new(ApiServerStore::start(
                &topology.node_ns,
                &topology.run_dir,
            )?)),
            ClusterApi::Real(plane) => {
                let every_stage = scenario
                    .stages
                    .iter()
                    .flat_map(|stage| match &stage.change {
                        Change::Replace(objects) => objects.as_slice(),
                        Change::Delete(_) => &[],
                    });
                let proxy = options.proxy();
                Box::new(Tracked::new(RealApiStore::for_proxy(
                    proxy,
                    plane,
                    &topology.node_ns,
                    &topology.run_dir,
                    &uncovered_cluster_ips(every_stage),
                )?))
            }
        };
        let initial = match &scenario.stages[0].change {
            Change::Replace(objects) => with_node(objects, &scenario.node),
            Change::Delete(_) => with_node(&[], &scenario.node),
        };
        let started = SystemTime::now();
        source.apply_state(&initial)?;
        let change = readiness::Change {
            started,
            at: SystemTime::now(),
            initial: true,
        };
        let agent = match &options.agent {
            Some(agent_options) => {
                let connection = source.connection();
                let bpffs = bpffs_root(&topology.id);
                let fragment = merged_config(&scenario.config, &agent_options.config_overrides);
                let inputs = ConfigInputs {
                    proxy: agent_options.proxy,
                    fragment: &fragment,
                    mode: agent_options.mode,
                    node_name: &scenario.node.name,
                    connection: &connection,
                    bpffs_root: &bpffs,
                    cgroup_root: &topology.cgroup,
                };
                let mut agent = Agent::start(
                    agent_options,
                    &inputs,
                    topology.node_place(),
                    &topology.run_dir,
                    &options.runner_exe,
                    options.keep,
                )?;
                agent.wait_synced(change).await?;
                agent.check_running_mode(options.mode).await?;
                Some(agent)
            }
            None => None,
        };
        let mut env = ScenarioEnv {
            agent,
            source,
            udp_ports: UdpPorts::new(scenario, &topology.placement),
            topology,
            state: initial,
            unbound: Vec::new(),
            sctp,
            options,
            scenario,
        };
        env.start_plain_listeners(0)?;
        Ok(env)
    }

    /// Starts the plain listeners of `stage` (see [`Topology::start_plain_listeners`]).
    pub fn start_plain_listeners(&mut self, stage: usize) -> Result<()> {
        self.unbound = self.topology.start_plain_listeners(
            stage,
            &self.options.runner_exe,
            self.sctp,
            plain_bind_patience(),
        )?;
        Ok(())
    }

    /// Stops the current stage's plain listeners; their ports are free when this returns.
    pub fn stop_plain_listeners(&mut self) {
        self.topology.stop_plain_listeners();
        self.unbound.clear();
    }

    /// Applies stage `stage`'s change and waits until the agent synced it.
    pub async fn apply_stage(&mut self, stage: usize) -> Result<()> {
        let change = &self
            .scenario
            .stages
            .get(stage)
            .ok_or_else(|| Error::Setup(format!("{} has no stage {stage}", self.scenario.name)))?
            .change;
        self.change(change).await
    }

    /// Moves to stage `stage`: stops the plain listeners of the stage before (so that no
    /// port the proxy must open is held by the runner), applies the stage's change, waits
    /// until the agent synced it, then starts the stage's plain listeners.
    pub async fn enter_stage(&mut self, stage: usize) -> Result<()> {
        self.stop_plain_listeners();
        self.apply_stage(stage).await?;
        self.start_plain_listeners(stage)
    }

    /// The plain listener of `flow` that could not bind in this stage, if any.
    fn unbound_for(&self, flow: &Flow) -> Option<&Unbound> {
        if flow.expect != Expectation::Untouched {
            return None;
        }
        let home = self
            .topology
            .placement
            .place_client(&self.scenario.node, flow.from);
        self.unbound.iter().find(|u| {
            u.spec.proto == flow.proto
                && u.spec.addr == flow.to
                && (!flow.to.ip().is_loopback() || u.home == home)
        })
    }

    /// Applies a change to the cluster state and waits until the agent synced it.
    async fn change(&mut self, change: &Change) -> Result<()> {
        let started = SystemTime::now();
        match change {
            Change::Replace(objects) => {
                self.state = with_node(objects, &self.scenario.node);
                self.source.apply_state(&self.state)?;
            }
            Change::Delete(refs) => {
                self.state
                    .retain(|o| object_ref(o).map_or(true, |r| !refs.contains(&r)));
                self.source.delete(refs)?;
            }
        }
        let change = readiness::Change {
            started,
            at: SystemTime::now(),
            initial: false,
        };
        match &mut self.agent {
            Some(agent) => agent.wait_synced(change).await,
            None => Ok(()),
        }
    }

    /// ipvs mode: the stage's ClusterIP and externalIP ports that `ipvsadm -Ln` in the node
    /// namespace does not show as virtual servers (see [`super::ipvs_check`]).
    pub async fn ipvs_lacks(&self) -> Option<String> {
        if self.options.mode != Mode::Ipvs || self.agent.is_none() {
            return None;
        }
        let families: BTreeSet<bool> = self
            .scenario
            .node
            .addresses
            .iter()
            .map(|a| a.addr().is_ipv6())
            .collect();
        let expected = super::ipvs_check::expected_virtual_servers(&self.state, &families);
        let place = Place {
            netns: self.topology.node_ns.clone(),
            cgroup: None,
        };
        let command = place.command(std::path::Path::new("ipvsadm"), &["-Ln".to_string()]);
        let output = match tokio::process::Command::from(command)
            .stdin(Stdio::null())
            .output()
            .await
        {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                return Some(format!(
                    "ipvsadm -Ln failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return Some(format!("ipvsadm -Ln could not run: {e}")),
        };
        let shown = super::ipvs_check::parse_ipvsadm(&String::from_utf8_lossy(&output.stdout));
        let missing = super::ipvs_check::missing(&expected, &shown);
        (!missing.is_empty()).then(|| format!("ipvsadm -Ln lacks virtual servers {missing:?}"))
    }

    /// Probes `flow` and judges the attempts.
    pub async fn run_flow(
        &mut self,
        flow: &Flow,
        node_addresses: &BTreeSet<IpAddr>,
    ) -> (Status, String) {
        let (status, text, _) = self.run_flow_observed(flow, node_addresses).await;
        (status, text)
    }

    /// [`ScenarioEnv::run_flow`], with what the attempts showed (none if no probe ran).
    pub async fn run_flow_observed(
        &mut self,
        flow: &Flow,
        node_addresses: &BTreeSet<IpAddr>,
    ) -> (Status, String, Option<Observation>) {
        let (status, text, observed) = self.probe_and_judge(flow, node_addresses).await;
        match self.unbound_for(flow) {
            Some(u) => (
                status,
                format!(
                    "{text}; the runner's plain listener {} was not placed: {}",
                    u.spec, u.reason
                ),
                observed,
            ),
            None => (status, text, observed),
        }
    }

    async fn probe_and_judge(
        &mut self,
        flow: &Flow,
        node_addresses: &BTreeSet<IpAddr>,
    ) -> (Status, String, Option<Observation>) {
        match self.probe(flow).await {
            Ok(attempts) => {
                let observed = Observation::of(&attempts, node_addresses);
                let verdict = Judge {
                    flow,
                    node_addresses,
                }
                .verdict(&attempts);
                let status = if verdict.pass {
                    Status::Pass
                } else {
                    Status::Fail
                };
                match self
                    .trace_disagreement(flow, &attempts, node_addresses)
                    .await
                {
                    Some(why) => (
                        Status::Fail,
                        format!("{}; trace disagrees: {why}", verdict.text),
                        Some(observed),
                    ),
                    None => (status, verdict.text, Some(observed)),
                }
            }
            Err(err) => (Status::Fail, format!("probe failed: {err}"), None),
        }
    }

    /// With `trace_check`: why `proxy-agent trace` disagrees with what the probes saw, if
    /// it does (see [`super::trace`]).
    async fn trace_disagreement(
        &self,
        flow: &Flow,
        attempts: &[Attempt],
        node_addresses: &BTreeSet<IpAddr>,
    ) -> Option<String> {
        let checked = matches!(
            self.options.mode,
            Mode::Ebpf | Mode::Iptables | Mode::Nftables
        );
        let agent = self.options.agent.as_ref()?;
        if !self.options.trace_check || !checked {
            return None;
        }
        let place = Place {
            netns: self.topology.node_ns.clone(),
            cgroup: None,
        };
        let bpffs = bpffs_root(&self.topology.id);
        match super::trace::trace_flow(&agent.binary, self.options.mode, &place, &bpffs, flow).await
        {
            Ok(trace) => {
                super::trace::agreement(&trace, flow.from, flow.to, attempts, node_addresses).err()
            }
            Err(err) => Some(err.to_string()),
        }
    }

    /// Runs the flow's attempts from where its client lives (`probe` subcommand).
    pub async fn probe(&mut self, flow: &Flow) -> Result<Vec<Attempt>> {
        let mut args = vec![
            "probe".to_string(),
            "--from".into(),
            flow.from.to_string(),
            "--to".into(),
            flow.to.to_string(),
            "--proto".into(),
            flow.proto.to_string(),
            "--count".into(),
            attempts_for(flow).to_string(),
            "--timeout-ms".into(),
            timeout_for(flow, self.options.timeout)
                .as_millis()
                .to_string(),
        ];
        if flow.proto == Proto::Udp {
            let port = self.udp_ports.port_for(flow.from, flow.to);
            args.extend(["--from-port".to_string(), port.to_string()]);
        }
        let place = self.topology.client_place(flow.from);
        let output = tokio::process::Command::from(place.command(&self.options.runner_exe, &args))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(Error::io("running probe"))?;
        if !output.status.success() {
            return Err(Error::Setup(format!(
                "probe exited {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(Error::from))
            .collect()
    }
}

/// Whether the runner can build topologies here (root, and the tools it drives).
pub fn check_privileges() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Setup(
            "the scenario runner needs root (network namespaces, cgroups)".into(),
        ));
    }
    for tool in ["ip", "nsenter", "sysctl", "sh"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()));
        if !found {
            return Err(Error::Setup(format!("`{tool}` not found in PATH")));
        }
    }
    Ok(())
}

/// The scenario directories used when none is given: the project's shared scenarios
/// beside the workspace, and this crate's own.
pub fn default_dirs() -> Vec<PathBuf> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        crate_dir.join("../../shared/scenarios"),
        crate_dir.join("scenarios"),
    ]
    .into_iter()
    .filter(|d| d.is_dir())
    .collect()
}

/// How long one attempt may wait. DROP means silence for the runner's timeout; a REJECT may
/// take longer to surface without being a DROP: when the ICMPv6 error of a rejected SYN
/// comes back while connect() still holds the socket, Linux keeps it as a soft error and
/// reports the refusal with the next retransmission, one second later. Waiting longer for a
/// REJECT cannot turn a DROP into a pass (a DROP never answers).
pub fn timeout_for(flow: &Flow, base: Duration) -> Duration {
    if matches!(flow.expect, Expectation::Reject) {
        base.max(Duration::from_secs(3))
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::format::RawScenario;

    #[test]
    fn udp_ports_are_stable_and_avoid_scenario_ports() {
        let raw: RawScenario = serde_yaml::from_str(
            r#"
name: t
node: {name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
flows:
- {from: 10.0.0.2, to: '172.30.0.1:20000', proto: udp, expect: ['10.0.1.1:20001']}
"#,
        )
        .unwrap();
        let s = Scenario::from_raw(raw, Path::new("t")).unwrap();
        let p = Placement::plan(&s).unwrap();
        let mut ports = UdpPorts::new(&s, &p);
        let a: SocketAddr = "172.30.0.1:53".parse().unwrap();
        let b: SocketAddr = "172.30.0.2:53".parse().unwrap();
        let client: IpAddr = "10.0.0.2".parse().unwrap();
        let first = ports.port_for(client, a);
        assert_eq!(first, 20002);
        assert_eq!(ports.port_for(client, b), 20003);
        assert_eq!(ports.port_for(client, a), first);
    }

    /// Options of an ebpf-mode run without agent, filtering flows as given.
    fn filtering_options(only_proto: Option<Proto>, only_external_clients: bool) -> RunOptions {
        RunOptions {
            upstream_outcomes: UpstreamOutcomes::default(),
            observations: None,
            mode: Mode::Ebpf,
            agent: None,
            runner_exe: PathBuf::new(),
            timeout: Duration::from_secs(1),
            keep: false,
            api: ClusterApi::TestServer,
            trace_check: false,
            only_proto,
            only_external_clients,
        }
    }

    #[test]
    fn only_proto_keeps_the_flows_of_one_protocol_in_the_mode() {
        let raw: RawScenario = serde_yaml::from_str(
            r#"
name: t
node: {name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
flows:
- {from: 10.0.0.2, to: '1.1.1.1:1', proto: sctp, expect: DROP}
- {from: 10.0.0.2, to: '1.1.1.1:1', proto: sctp, expect: DROP, modes: [iptables]}
- {from: 10.0.0.2, to: '1.1.1.1:1', expect: DROP}
"#,
        )
        .unwrap();
        let s = Scenario::from_raw(raw, Path::new("t")).unwrap();
        let options = |only_proto| filtering_options(only_proto, false);
        let replayed = |o: &RunOptions| -> Vec<usize> {
            s.flows()
                .filter(|f| o.replays(f, None))
                .map(|f| f.index)
                .collect()
        };
        assert_eq!(replayed(&options(None)), [1, 3]);
        assert_eq!(replayed(&options(Some(Proto::Sctp))), [1]);
        assert_eq!(replayed(&options(Some(Proto::Udp))), Vec::<usize>::new());
    }

    #[test]
    fn only_external_clients_keeps_the_flows_from_outside_the_node() {
        let raw: RawScenario = serde_yaml::from_str(
            r#"
name: t
node: {name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
flows:
- {from: 10.0.0.2, to: '192.168.0.2:30001', expect: DROP}
- {from: 203.0.113.2, to: '192.168.0.2:30001', expect: DROP}
- {from: 192.168.0.2, to: '192.168.0.2:30001', expect: DROP}
- {from: 203.0.113.2, to: '192.168.0.2:30001', expect: DROP, modes: [iptables]}
"#,
        )
        .unwrap();
        let s = Scenario::from_raw(raw, Path::new("t")).unwrap();
        let options = filtering_options(None, true);
        let external = Placement::plan(&s).unwrap().external_clients;
        let replayed = |clients: Option<&BTreeSet<IpAddr>>| -> Vec<usize> {
            s.flows()
                .filter(|f| options.replays(f, clients))
                .map(|f| f.index)
                .collect()
        };
        assert_eq!(replayed(Some(&external)), [2]);
        // Without a placement nothing is filtered by place (the run reports the failure).
        assert_eq!(replayed(None), [1, 2, 3]);
    }

    #[test]
    fn attempt_counts() {
        let raw: RawScenario = serde_yaml::from_str(
            r#"
name: t
node: {name: n, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
flows:
- {from: 10.0.0.2, to: '1.1.1.1:1', expect: ['10.0.1.1:1'], sticky: true}
- {from: 10.0.0.2, to: '1.1.1.1:1', expect: ['10.0.1.1:1']}
- {from: 10.0.0.2, to: '1.1.1.1:1', expect: DROP}
"#,
        )
        .unwrap();
        let s = Scenario::from_raw(raw, Path::new("t")).unwrap();
        let counts: Vec<u32> = s.flows().map(attempts_for).collect();
        assert_eq!(counts, [10, 4, 1]);
    }

    #[test]
    fn discovers_and_filters() {
        let dirs = default_dirs();
        if dirs.is_empty() {
            return;
        }
        let all = discover(&dirs, None).unwrap();
        let some = discover(&dirs, Some("l1-")).unwrap();
        assert!(all.len() > some.len());
        assert!(some.iter().all(|p| p.to_string_lossy().contains("l1-")));
    }
}
