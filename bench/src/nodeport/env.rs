// SPDX-License-Identifier: Apache-2.0
//! The NodePort benchmark's world, built with the scenario runner's library: a node
//! (the agent in ebpf mode, tc on its uplink, optionally XDP in front) on a switch with an
//! external router namespace (the client) and a remote node; one backend pod behind the
//! node and one behind the remote node, each running the `loadgen` server (TCP and UDP).
//!
//! ```text
//!  ext ns (client 203.0.113.2)        node ns (agent)              pod 10.180.0.1 (local)
//!  ext0 192.168.0.1 --- switch --- eth0 192.168.0.2 -- kp0 -----
//!                          \---- remote ns eth0 192.168.0.3 -- kp1 --- pod 10.180.1.1
//! ```
//!
//! Both routes cross the same devices: the client always sends to the node (its only
//! route), and the remote node routes the client's address back through the node, so a
//! direct connection to the remote pod takes the same hops as a NodePort connection to it.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde_json::{Map, Value, json};

use ::tests::scenario::{
    Scenario,
    cluster::{ClusterSource, DirSource},
    format::{Change as StageChange, RawScenario},
    netns::{Place, ip_in, sysctl_in},
    objects::with_node,
    placement::Placement,
    run::merged_config,
    topology::{ReadyProcesses, Topology, UPLINK},
};

use super::super::{
    agent::{BenchAgent, NODE_NAME, config_fragment},
    error::{Error, Result},
};
use super::{Attach, Backend};

pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 2);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
pub const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(10, 180, 0, 1);
pub const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 180, 1, 1);
pub const BACKEND_PORT: u16 = 8080;

/// The NodePorts of a backend's service: (TCP, UDP).
pub fn node_ports(backend: Backend) -> (u16, u16) {
    match backend {
        Backend::Local => (30080, 30081),
        Backend::Remote => (30090, 30091),
    }
}

pub fn pod_of(backend: Backend) -> Ipv4Addr {
    match backend {
        Backend::Local => LOCAL_POD,
        Backend::Remote => REMOTE_POD,
    }
}

fn service(name: &str, cluster_ip: &str, pod: Ipv4Addr, node: &str, ports: (u16, u16)) -> String {
    let (tcp, udp) = ports;
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: bench}}
  spec:
    type: NodePort
    clusterIP: {cluster_ip}
    clusterIPs: [{cluster_ip}]
    ipFamilies: [IPv4]
    externalTrafficPolicy: Cluster
    ports:
    - {{name: tcp, port: 80, protocol: TCP, targetPort: {BACKEND_PORT}, nodePort: {tcp}}}
    - {{name: udp, port: 80, protocol: UDP, targetPort: {BACKEND_PORT}, nodePort: {udp}}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {name}-1, namespace: bench, labels: {{kubernetes.io/service-name: {name}}}}}
  addressType: IPv4
  endpoints: [{{addresses: [{pod}], nodeName: {node}, conditions: {{ready: true}}}}]
  ports: [{{name: tcp, port: {BACKEND_PORT}, protocol: TCP}}, {{name: udp, port: {BACKEND_PORT}, protocol: UDP}}]
"
    )
}

/// The benchmark as a scenario: its node, objects, and one flow per backend (so the
/// placement puts the client outside and the remote backend behind a remote node).
pub fn scenario_text() -> String {
    let (local_tcp, _) = node_ports(Backend::Local);
    let (remote_tcp, _) = node_ports(Backend::Remote);
    format!(
        "name: bench-nodeport
about: NodePort from an external client to a local and to a remote backend
node:
  name: {NODE_NAME}
  addresses: [{NODE_IP}/24]
  podCIDR: [10.0.0.0/8]
config:
  clusterCIDR: 10.0.0.0/8
objects:
{}{}flows:
- {{from: {CLIENT_IP}, to: '{NODE_IP}:{local_tcp}', expect: ['{LOCAL_POD}:{BACKEND_PORT}']}}
- {{from: {CLIENT_IP}, to: '{NODE_IP}:{remote_tcp}', expect: ['{REMOTE_POD}:{BACKEND_PORT}'], masq: true}}
",
        service("local", "172.30.0.10", LOCAL_POD, NODE_NAME, node_ports(Backend::Local)),
        service("remote", "172.30.0.11", REMOTE_POD, "node2", node_ports(Backend::Remote)),
    )
}

pub fn scenario() -> Result<Scenario> {
    let raw: RawScenario = serde_yaml::from_str(&scenario_text())
        .map_err(|err| Error::Setup(format!("the benchmark's scenario: {err}")))?;
    Ok(Scenario::from_raw(raw, Path::new("bench-nodeport.yaml"))?)
}

/// How the agent's XDP program sits on the uplink, from `ip -j -d link show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpAttached {
    None,
    Native,
    Generic,
    Other(u64),
}

impl XdpAttached {
    /// From iproute2's JSON for one link (`"xdp": {"mode": 1|2|...}`; 1 = driver, 2 =
    /// generic (skb), as the kernel's XDP_ATTACHED_* values).
    pub fn from_link_json(text: &str) -> XdpAttached {
        let links: Vec<Value> = serde_json::from_str(text).unwrap_or_default();
        match links
            .first()
            .and_then(|l| l.get("xdp"))
            .and_then(|x| x.get("mode"))
        {
            None => XdpAttached::None,
            Some(mode) => match mode.as_u64() {
                Some(1) => XdpAttached::Native,
                Some(2) => XdpAttached::Generic,
                Some(other) => XdpAttached::Other(other),
                None => XdpAttached::Other(u64::MAX),
            },
        }
    }

    pub fn matches(self, attach: Attach) -> bool {
        matches!(
            (attach, self),
            (Attach::Tc, XdpAttached::None)
                | (Attach::XdpGeneric, XdpAttached::Generic)
                | (Attach::XdpNative, XdpAttached::Native)
        )
    }
}

/// The namespaces, the servers and the agent. Field order is drop order: the agent
/// stops and the servers die before the namespaces go.
pub struct NodeportEnv {
    agent: Option<BenchAgent>,
    servers: ReadyProcesses,
    source: DirSource,
    pub topology: Topology,
    agent_binary: PathBuf,
    base_config: Map<String, Value>,
    objects: Vec<Value>,
}

impl NodeportEnv {
    /// Builds the namespaces and starts the servers (no agent yet).
    pub fn build(loadgen: &Path, agent_binary: &Path, server_cpu: Option<usize>) -> Result<Self> {
        let scenario = scenario()?;
        let placement = Placement::plan(&scenario)?;
        let topology = Topology::build(&scenario.node, &placement, false)?;
        let servers = ReadyProcesses::new(&topology.run_dir);
        let source = DirSource::in_dir(&topology.run_dir.join("objects"))?;
        let initial = match &scenario.stages[0].change {
            StageChange::Replace(objects) => objects.clone(),
            StageChange::Delete(_) => Vec::new(),
        };
        let objects = with_node(&initial, &scenario.node);
        let mut env = NodeportEnv {
            agent: None,
            servers,
            source,
            base_config: merged_config(&scenario.config, &config_fragment()),
            topology,
            agent_binary: agent_binary.to_path_buf(),
            objects,
        };
        env.route_through_node()?;
        for backend in [Backend::Local, Backend::Remote] {
            let pod = pod_of(backend);
            let mut args = vec![
                "serve".to_string(),
                "--listen".into(),
                SocketAddr::from((pod, BACKEND_PORT)).to_string(),
                "--udp".into(),
            ];
            if let Some(cpu) = server_cpu {
                args.extend(["--cpu".into(), cpu.to_string()]);
            }
            let place = env.topology.client_place(IpAddr::V4(pod));
            env.servers.spawn_ready(
                &format!("server-{}", backend.as_str()),
                &place,
                loadgen,
                &args,
            )?;
        }
        let objects = env.objects.clone();
        env.source.apply_state(&objects)?;
        Ok(env)
    }

    /// The client always leaves from its own address; the remote node sends what is
    /// addressed to it back through the node; nobody is redirected around the node.
    fn route_through_node(&self) -> Result<()> {
        let ext = &self.topology.ext_ns;
        let client = CLIENT_IP.to_string();
        ip_in(
            ext,
            &[
                "route",
                "replace",
                "192.168.0.0/24",
                "dev",
                "ext0",
                "src",
                &client,
            ],
        )?;
        ip_in(
            ext,
            &[
                "route",
                "replace",
                "default",
                "via",
                &NODE_IP.to_string(),
                "dev",
                "ext0",
                "src",
                &client,
            ],
        )?;
        sysctl_in(
            &self.topology.node_ns,
            &[
                ("net.ipv4.conf.all.send_redirects", "0"),
                ("net.ipv4.conf.eth0.send_redirects", "0"),
            ],
        )?;
        sysctl_in(ext, &[("net.ipv4.conf.all.accept_redirects", "0")])?;
        for index in 0..self.topology.placement.remote_nodes.len() {
            let remote = self.topology.remote_ns(index);
            ip_in(
                &remote,
                &[
                    "route",
                    "replace",
                    &format!("{client}/32"),
                    "via",
                    &NODE_IP.to_string(),
                    "dev",
                    UPLINK,
                ],
            )?;
        }
        Ok(())
    }

    pub fn client_place(&self) -> Place {
        Place {
            netns: self.topology.ext_ns.clone(),
            cgroup: None,
        }
    }

    /// (Re)starts the agent with `attach` and waits until it synced; returns how XDP sits
    /// on the uplink afterwards.
    pub fn start_agent(&mut self, attach: Attach, timeout: Duration) -> Result<XdpAttached> {
        if let Some(mut old) = self.agent.take() {
            old.stop();
        }
        let mut overrides = Map::new();
        overrides.insert("ebpf".into(), json!({ "xdpMode": attach.xdp_mode() }));
        let fragment = merged_config(&self.base_config, &overrides);
        let bpffs = ::tests::scenario::agent::bpffs_root(&self.topology.id);
        let started = SystemTime::now();
        let mut agent = BenchAgent::start_with(
            &self.agent_binary,
            self.topology.node_place(),
            &self.topology.run_dir,
            &self.topology.run_dir.join("objects"),
            &bpffs,
            &fragment,
        )?;
        agent.wait_initial_sync(started, timeout)?;
        self.agent = Some(agent);
        self.xdp_attached()
    }

    pub fn xdp_attached(&self) -> Result<XdpAttached> {
        let out = ip_in(
            &self.topology.node_ns,
            &["-j", "-d", "link", "show", "dev", UPLINK],
        )?;
        Ok(XdpAttached::from_link_json(&out))
    }

    /// The agent's log lines that mention XDP (why it fell back, if it did).
    pub fn agent_xdp_lines(&self) -> String {
        let Some(agent) = &self.agent else {
            return String::new();
        };
        std::fs::read_to_string(&agent.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("xdp"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn stop_agent(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_places_the_client_outside_and_one_backend_remote() {
        let scenario = scenario().unwrap();
        let placement = Placement::plan(&scenario).unwrap();
        assert!(placement.external_clients.contains(&IpAddr::V4(CLIENT_IP)));
        assert_eq!(placement.pods.len(), 2);
        let local = &placement.pods[placement.pod_index(IpAddr::V4(LOCAL_POD)).unwrap()];
        let remote = &placement.pods[placement.pod_index(IpAddr::V4(REMOTE_POD)).unwrap()];
        assert!(local.remote.is_none());
        assert_eq!(placement.remote_node_of(remote).unwrap().name, "node2");
        assert_eq!(scenario.node.name, NODE_NAME);
    }

    #[test]
    fn xdp_attachment_from_ip_json() {
        let native = r#"[{"ifname":"eth0","xdp":{"mode":1,"prog":{"id":7}}}]"#;
        let generic = r#"[{"ifname":"eth0","xdp":{"mode":2,"prog":{"id":7}}}]"#;
        assert_eq!(XdpAttached::from_link_json(native), XdpAttached::Native);
        assert_eq!(XdpAttached::from_link_json(generic), XdpAttached::Generic);
        assert_eq!(
            XdpAttached::from_link_json(r#"[{"ifname":"eth0"}]"#),
            XdpAttached::None
        );
        assert!(XdpAttached::Native.matches(Attach::XdpNative));
        assert!(!XdpAttached::None.matches(Attach::XdpNative));
        assert!(XdpAttached::None.matches(Attach::Tc));
    }
}
