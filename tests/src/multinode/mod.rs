// SPDX-License-Identifier: Apache-2.0
//! A cluster, not a node: three node namespaces on one routed network, each with its own
//! agent (its own mode, bpffs root and cgroup), pods on every node, one test API server
//! serving all three agents, and an external namespace that reaches every node and routes
//! LB IPs over them as an ECMP router would ([`net`]).
//!
//! Flows are probed from where their client lives (a pod, a node, outside) with the
//! scenario runner's `probe`; the answer names the backend and the source it saw, and the
//! client records the address its socket talked to, so a reply path is checked from both
//! ends. [`load`] is the traffic a migration must not disturb.

pub mod load;
pub mod net;
pub mod scenario;

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Stdio},
    time::{Duration, SystemTime},
};

use serde_json::{Map, Value, json};

use self::{
    load::LoadReport,
    net::{CLUSTER_CIDR, ClusterNet, NODE_COUNT, pod_cidr},
};
use crate::scenario::{
    Error, Mode, Result,
    agent::{Agent, ConfigInputs, Launch},
    cluster::{AgentConnection, ApiServerStore, ClusterSource, Tracked},
    netns::Place,
    outcome::Attempt,
    readiness::Change,
    topology::ReadyProcesses,
};

/// A Node object for node `index` of the cluster (YAML list item).
pub fn node_object(index: usize) -> String {
    let (name, address, cidr) = (
        net::node_name(index),
        net::node_address(index),
        pod_cidr(index),
    );
    format!(
        "- apiVersion: v1\n  kind: Node\n  metadata: {{name: {name}}}\n  spec: {{podCIDR: {cidr}, podCIDRs: [{cidr}]}}\n  status: {{addresses: [{{type: InternalIP, address: {address}}}]}}\n"
    )
}

/// The three agents' binaries and settings.
#[derive(Debug, Clone)]
pub struct AgentSetup {
    pub binary: PathBuf,
    /// The scenario runner (for `echo`, `probe` and `load`).
    pub runner: PathBuf,
    pub ready_timeout: Duration,
    /// Merged over every agent's configuration (objects key by key).
    pub config: Map<String, Value>,
}

/// The cluster: its network, the API server, an agent per node, the pods' servers.
pub struct Cluster {
    // Dropped in this order: the agents (each cleans up its dataplane), the servers,
    // the API server, then the namespaces.
    agents: Vec<Option<Agent>>,
    /// The pods' echo servers: held for the cluster's life, killed on drop.
    _echo_servers: ReadyProcesses,
    pub source: Tracked<ApiServerStore>,
    kubeconfigs: Vec<PathBuf>,
    setup: AgentSetup,
    /// How many agents each node has started (names their config and log files).
    generation: Vec<u32>,
    pub net: ClusterNet,
}

impl Cluster {
    /// Builds the network with pods at `(node, host)` (see [`net::pod_address`]), starts
    /// the API server with the Node objects and `objects` (a YAML list), and in every pod
    /// the `listeners` (`kind/proto/:port`, e.g. `echo/tcp/:9000`, `session/tcp/:9001`: the
    /// pod's address goes before the colon). Needs a tokio runtime.
    pub fn build(
        setup: AgentSetup,
        pods: &[(usize, u8)],
        lb_ips: &[std::net::Ipv4Addr],
        listeners: &[&str],
        objects: &str,
    ) -> Result<Self> {
        let net = ClusterNet::build(pods, lb_ips)?;
        let namespaces: Vec<String> = net.nodes.iter().map(|n| n.ns.clone()).collect();
        let (store, kubeconfigs) = ApiServerStore::start_in_all(&namespaces, &net.run_dir)?;
        let mut source = Tracked::new(store);
        let nodes: String = (0..NODE_COUNT).map(node_object).collect();
        let values: Vec<Value> = serde_yaml::from_str(&format!("{nodes}{objects}"))?;
        source.apply_state(&values)?;
        let mut servers = ReadyProcesses::new(&net.run_dir);
        for pod in &net.pods {
            let listeners: Vec<String> = listeners
                .iter()
                .map(|l| l.replacen("/:", &format!("/{}:", pod.address), 1))
                .collect();
            let place = net.place_of(pod.address);
            let args: Vec<String> = std::iter::once("echo".to_string())
                .chain(listeners)
                .collect();
            servers.spawn_ready(
                &format!("echo-{}", pod.address),
                &place,
                &setup.runner,
                &args,
            )?;
        }
        Ok(Cluster {
            agents: (0..NODE_COUNT).map(|_| None).collect(),
            _echo_servers: servers,
            source,
            kubeconfigs,
            setup,
            generation: vec![0; NODE_COUNT],
            net,
        })
    }

    /// Replaces the cluster's objects (the Node objects are kept) and waits until every
    /// running agent has synced the change.
    pub async fn apply(&mut self, objects: &str) -> Result<()> {
        let started = SystemTime::now();
        let nodes: String = (0..NODE_COUNT).map(node_object).collect();
        let values: Vec<Value> = serde_yaml::from_str(&format!("{nodes}{objects}"))?;
        self.source.apply_state(&values)?;
        let change = Change {
            started,
            at: SystemTime::now(),
            initial: false,
        };
        for agent in self.agents.iter_mut().flatten() {
            agent.wait_synced(change).await?;
        }
        Ok(())
    }

    /// Starts node `index`'s agent in `mode` and waits for its first sync; fails unless it
    /// runs that mode (no fallback passes for it).
    pub async fn start_agent(&mut self, index: usize, mode: Mode) -> Result<()> {
        self.generation[index] += 1;
        let generation = self.generation[index];
        let node = &self.net.nodes[index];
        let connection = AgentConnection::Kubeconfig(self.kubeconfigs[index].clone());
        let mut fragment = Map::new();
        fragment.insert("clusterCIDR".into(), json!(CLUSTER_CIDR));
        for (key, value) in &self.setup.config {
            fragment.insert(key.clone(), value.clone());
        }
        let inputs = ConfigInputs {
            proxy: crate::scenario::agent::Proxy::Ours,
            fragment: &fragment,
            mode,
            node_name: &node.name,
            connection: &connection,
            bpffs_root: &node.bpffs_root,
            cgroup_root: &node.cgroup,
        };
        let stem = format!("agent-{}-{generation}-{mode}", node.name);
        let mut agent = Agent::launch(&Launch {
            binary: &self.setup.binary,
            mode,
            inputs: &inputs,
            node: node.place(),
            config: self.net.run_dir.join(format!("{stem}.yaml")),
            log: self.net.run_dir.join(format!("{stem}.log")),
            extra_args: Vec::new(),
            env: Vec::new(),
            ready_timeout: self.setup.ready_timeout,
            keep: false,
        })?;
        agent.wait_first_sync().await?;
        agent.check_running_mode(mode).await?;
        self.agents[index] = Some(agent);
        Ok(())
    }

    /// Starts every node's agent, node `i` in `modes[i]`.
    pub async fn start_agents(&mut self, modes: [Mode; NODE_COUNT]) -> Result<()> {
        for (index, mode) in modes.into_iter().enumerate() {
            self.start_agent(index, mode).await?;
        }
        Ok(())
    }

    /// Stops node `index`'s agent as an upgrade or a mode switch does: SIGTERM and nothing
    /// else, so the dataplane it programmed stays for its successor to take over.
    pub fn stop_agent_keeping_dataplane(&mut self, index: usize) {
        if let Some(mut agent) = self.agents[index].take() {
            agent.terminate();
        }
    }

    /// Stops node `index`'s agent and removes its dataplane (`--cleanup`), as draining a
    /// node and removing the proxy from it does.
    pub fn stop_agent(&mut self, index: usize) {
        if let Some(mut agent) = self.agents[index].take() {
            agent.stop();
        }
    }

    pub fn agent(&self, index: usize) -> Option<&Agent> {
        self.agents[index].as_ref()
    }

    /// One attempt of a flow from `from` (where that client lives: see
    /// [`ClusterNet::place_of`]) to `to`.
    pub fn probe(&self, from: std::net::Ipv4Addr, to: SocketAddr, proto: &str) -> Result<Attempt> {
        self.probe_from_port(from, 0, to, proto)
    }

    /// [`Cluster::probe`] from a fixed source port (one 5-tuple).
    pub fn probe_from_port(
        &self,
        from: std::net::Ipv4Addr,
        from_port: u16,
        to: SocketAddr,
        proto: &str,
    ) -> Result<Attempt> {
        let place = self.net.place_of(from);
        let args: Vec<String> = [
            "probe",
            "--from",
            &from.to_string(),
            "--from-port",
            &from_port.to_string(),
            "--to",
            &to.to_string(),
            "--proto",
            proto,
            "--count",
            "1",
            "--timeout-ms",
            "1500",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let output = place
            .command(&self.setup.runner, &args)
            .stdin(Stdio::null())
            .output()
            .map_err(Error::io("running probe"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text.lines().next().ok_or_else(|| {
            Error::Setup(format!(
                "probe {from} -> {to} printed nothing: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        })?;
        serde_json::from_str(line).map_err(|e| Error::Setup(format!("probe output {line:?}: {e}")))
    }

    /// GET `url` from the external namespace: the status code, or `None` when nothing
    /// answered (a health-check node port seen from a load balancer).
    pub fn external_get(&self, url: &str) -> Option<u16> {
        crate::scenario::agent::get_in(&self.net.ext_ns, url, Duration::from_secs(1))
            .ok()
            .map(|answer| answer.status)
    }

    /// Starts the `load` subcommand from `from`; [`RunningLoad::finish`] stops it.
    pub fn start_load(&self, from: std::net::Ipv4Addr, args: &[String]) -> Result<RunningLoad> {
        let place = self.net.place_of(from);
        let mut all = vec!["load".to_string(), "--from".into(), from.to_string()];
        all.extend(args.iter().cloned());
        RunningLoad::start(&place, &self.setup.runner, &all)
    }

    pub fn kubeconfig(&self, index: usize) -> &Path {
        &self.kubeconfigs[index]
    }
}

/// A `load` process: it runs until [`finish`](Self::finish) closes its stdin.
pub struct RunningLoad {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl RunningLoad {
    fn start(place: &Place, runner: &Path, args: &[String]) -> Result<Self> {
        let mut child = place
            .command(runner, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(Error::io("starting load"))?;
        let stdin = child.stdin.take();
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Setup("load has no stdout".into()));
        };
        let mut load = Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        // The load prints READY once its long-lived connections are open.
        let mut ready = String::new();
        load.stdout
            .read_line(&mut ready)
            .map_err(Error::io("reading the load's READY"))?;
        if ready.trim() != "READY" {
            return Err(Error::Setup(format!("load did not start: {ready:?}")));
        }
        Ok(load)
    }

    /// Stops the load and returns what it saw.
    pub fn finish(mut self) -> Result<LoadReport> {
        drop(self.stdin.take());
        let mut text = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut text)
            .map_err(Error::io("reading the load's report"))?;
        let _ = self.child.wait();
        let line = text
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or_else(|| Error::Setup(format!("load printed no report: {text:?}")))?;
        serde_json::from_str(line).map_err(|e| Error::Setup(format!("load report {line:?}: {e}")))
    }
}

impl Drop for RunningLoad {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address of `ip` and `port`.
pub fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}
