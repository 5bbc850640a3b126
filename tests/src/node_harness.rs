// SPDX-License-Identifier: Apache-2.0
//! One sandbox node for agent-level tests that are not scenario replays (mode switches,
//! drift, restarts): the scenario runner's topology (node namespace, pod namespaces, the
//! node's own cgroup) built from a small object list, the test API server bound inside
//! the node namespace (or upstream's API server: [`TestNode::build_real`]), and the agent
//! started in any mode with configuration overrides. Dropping it removes everything.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, SystemTime},
};

use serde_json::{Map, Value};

use crate::scenario::{
    Error, Mode, Result, Scenario,
    agent::{Agent, AgentOptions, ConfigInputs, bpffs_root},
    cluster::{ApiServerStore, ClusterSource, ObjectStore, Tracked},
    netns::{Place, in_netns},
    placement::Placement,
    readiness::{Change, set_time_scale},
    real_api::{RealApiStore, uncovered_cluster_ips},
    run::merged_config,
    topology::Topology,
};

/// Runs `bpftool args` (maps are reached by their pins: no namespace needed) and asserts
/// that it succeeded.
pub fn bpftool(args: &[&str]) {
    let status = Command::new("bpftool")
        .args(args)
        .status()
        .expect("bpftool runs");
    assert!(status.success(), "bpftool {args:?}");
}

/// A Node object (YAML list item) with one InternalIP and the 10.0.0.0/8 pod CIDR the
/// harness's scenarios use.
pub fn node_yaml(name: &str, address: &str) -> String {
    format!(
        r#"- apiVersion: v1
  kind: Node
  metadata: {{name: {name}}}
  spec: {{podCIDRs: [10.0.0.0/8]}}
  status: {{addresses: [{{type: InternalIP, address: {address}}}]}}
"#
    )
}

/// A ClusterIP Service in `ns1` with one port `p` (80 to 9000, `protocol`) and its
/// EndpointSlice holding one ready endpoint on `node` (YAML list items). `extra_spec`
/// lines (e.g. `type: NodePort`) go into the Service's spec; `node_port` sets the port's
/// nodePort.
pub fn service_yaml(
    name: &str,
    vip: &str,
    protocol: &str,
    backend: &str,
    node: &str,
    node_port: Option<u16>,
) -> String {
    let (type_line, node_port) = match node_port {
        Some(port) => (
            "\n    type: NodePort".to_string(),
            format!(", nodePort: {port}"),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        r#"- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: ns1}}
  spec:{type_line}
    clusterIP: {vip}
    clusterIPs: [{vip}]
    ports: [{{name: p, port: 80, protocol: {protocol}, targetPort: 9000{node_port}}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {name}-1, namespace: ns1, labels: {{kubernetes.io/service-name: {name}}}}}
  addressType: IPv4
  endpoints: [{{addresses: [{backend}], nodeName: {node}, conditions: {{ready: true}}}}]
  ports: [{{name: p, port: 9000, protocol: {protocol}}}]
"#
    )
}

/// The scenario header the harness's tests use: `name`, a node `node` at 192.168.0.2/24
/// with the 10.0.0.0/8 pod CIDR and clusterCIDR.
pub fn scenario_header(name: &str, node: &str) -> String {
    format!(
        "name: {name}\n\
         about: {name}\n\
         node: {{name: {node}, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}}\n\
         config: {{clusterCIDR: 10.0.0.0/8}}"
    )
}

/// How much slower than a normal machine this one runs: `SCENARIO_TIME_SCALE` (the
/// emulated guest of `cargo xtask vm` sets 10), 1 when unset. Tests stretch their waits
/// and timing assertions by it rather than loosening them everywhere.
pub fn time_scale() -> u32 {
    std::env::var("SCENARIO_TIME_SCALE")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Returns from an ipvs-mode test on a kernel without IPVS (or without ipvsadm/ipset),
/// saying where it runs instead.
#[macro_export]
macro_rules! require_ipvs {
    () => {
        if let Some(reason) = $crate::node_harness::ipvs_missing() {
            eprintln!(
                "SKIP {}: {reason}; the IPVS guest runs it (guest::ipvs_scenarios in \
                 tests/tests/vm_guest.rs, or cargo xtask vm)",
                module_path!()
            );
            return;
        }
    };
}

/// Why the agent cannot run ipvs mode here, if it cannot: the kernel has no IPVS (asked
/// over generic netlink from a fresh namespace, which loads ip_vs where it is a module),
/// or `ipvsadm` (the tests read the table with it) or `ipset` is missing. The qemu guest
/// of `cargo xtask vm` has all three (tests/tests/vm_guest.rs runs the ipvs tests there).
pub fn ipvs_missing() -> Option<String> {
    let ns = crate::privileged::TempNetns::new("kpe-ipvs-probe");
    let kernel = in_netns(&ns.name, || {
        Ok(proxy_agent::proxier::ipvs::IpvsSocket::open()
            .err()
            .map(|err| err.to_string()))
    });
    match kernel {
        Ok(Some(err)) => return Some(format!("no IPVS in this kernel ({err})")),
        Err(err) => return Some(format!("cannot probe for IPVS: {err}")),
        Ok(None) => {}
    }
    [("ipvsadm", "-v"), ("ipset", "version")]
        .iter()
        .find(|(tool, arg)| Command::new(tool).arg(arg).output().is_err())
        .map(|(tool, _)| format!("{tool} is not installed"))
}

/// One line of the IPVS table as `ipvsadm -Ln` lists it, without its connection counts:
/// a virtual server (`TCP 172.30.0.41:80 rr`) or one of its real servers (`TCP
/// 172.30.0.41:80 -> 10.180.0.1:9000 Masq 1`: forwarding method and weight).
pub type IpvsLine = String;

/// Parses `ipvsadm -Ln` into [`IpvsLine`]s, or `ipvsadm -Ln --stats --exact` into the
/// cumulative connection count of each virtual and real server (keyed like the lines,
/// without scheduler, method or weight).
fn parse_ipvsadm(text: &str, stats: bool) -> BTreeMap<IpvsLine, u64> {
    let mut table = BTreeMap::new();
    let mut service = String::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [proto, addr, rest @ ..] if ["TCP", "UDP", "SCTP", "FWM"].contains(proto) => {
                service = format!("{proto} {addr}");
                if stats {
                    let conns = rest.first().and_then(|c| c.parse().ok()).unwrap_or(0);
                    table.insert(service.clone(), conns);
                } else {
                    table.insert(words.join(" "), 0);
                }
            }
            ["->", addr, rest @ ..] if *addr != "RemoteAddress:Port" => {
                let key = if stats {
                    format!("{service} -> {addr}")
                } else {
                    // Forward and Weight; ActiveConn and InActConn change with traffic.
                    let kept: Vec<&str> = rest.iter().take(2).copied().collect();
                    format!("{service} -> {addr} {}", kept.join(" "))
                };
                let conns = rest.first().and_then(|c| c.parse().ok()).unwrap_or(0);
                table.insert(key, if stats { conns } else { 0 });
            }
            _ => {}
        }
    }
    table
}

/// One entry of a pinned BPF map as bpftool prints it with BTF.
#[derive(Clone, Debug)]
pub struct MapEntry {
    /// The key's bytes in hex, as `bpftool map delete ... key hex` takes them.
    pub raw_key: Vec<String>,
    pub key: Value,
    pub value: Value,
}

impl MapEntry {
    /// `key => value`, for comparing map contents.
    pub fn formatted(&self) -> String {
        format!("{} => {}", self.key, self.value)
    }
}

/// The node, its cluster and its run directory.
pub struct TestNode<S: ObjectStore = ApiServerStore> {
    pub scenario: Scenario,
    pub topology: Topology,
    pub source: Tracked<S>,
    dir: PathBuf,
}

/// The scenario (written to `dir`), its placement and topology, before any store exists.
fn build_parts(
    name: &str,
    header: &str,
    objects: &str,
    flows: &str,
) -> Result<(PathBuf, Scenario, Topology, Vec<Value>)> {
    let dir = std::env::temp_dir().join(format!("kpe-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let indented: String = objects.lines().map(|l| format!("  {l}\n")).collect();
    let text = format!("{header}\nobjects:\n{indented}flows:\n{flows}\n");
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).map_err(Error::io(format!("writing {}", path.display())))?;
    // The runner's own waits (settling, links coming up) stretch like the tests'.
    set_time_scale(time_scale());
    let scenario = Scenario::load(&path)?;
    let placement = Placement::plan(&scenario)?;
    let topology = Topology::build(&scenario.node, &placement, false)?;
    let values: Vec<Value> = serde_yaml::from_str(objects)?;
    Ok((dir, scenario, topology, values))
}

/// The agent binary beside the test binary (target/debug/proxy-agent), or the one
/// `PROXY_AGENT_BINARY` names: with a build dir apart from the target dir, test binaries
/// are not beside the agent this tree built.
pub fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PROXY_AGENT_BINARY") {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(Path::to_path_buf))
        .unwrap_or_default()
        .join("proxy-agent")
}

impl TestNode {
    /// See [`agent_binary`].
    pub fn agent_binary() -> PathBuf {
        agent_binary()
    }

    /// Builds a node from a scenario `header` (name, node, config) and `objects` (a YAML
    /// list). `flows` (YAML list items, optionally followed by a `steps:` section) only
    /// place the pods; they are never replayed. Needs a tokio runtime (the API server).
    pub fn build(name: &str, header: &str, objects: &str, flows: &str) -> Result<Self> {
        let (dir, scenario, topology, values) = build_parts(name, header, objects, flows)?;
        let mut source = Tracked::new(ApiServerStore::start(&topology.node_ns, &topology.run_dir)?);
        source.apply_state(&values)?;
        Ok(Self {
            scenario,
            topology,
            source,
            dir,
        })
    }
}

impl TestNode<RealApiStore> {
    /// [`TestNode::build`] with the objects in upstream's API server of the control plane
    /// in `plane_dir` (see [`RealApiStore`]: what an earlier user left there is removed),
    /// which the agent reads with deploy/'s ServiceAccount and RBAC. `more_objects` are
    /// objects of later changes whose ClusterIPs need a ServiceCIDR from the start.
    pub fn build_real(
        name: &str,
        header: &str,
        objects: &str,
        flows: &str,
        plane_dir: &Path,
        more_objects: &[Value],
    ) -> Result<Self> {
        let (dir, scenario, topology, values) = build_parts(name, header, objects, flows)?;
        let cluster_ips = uncovered_cluster_ips(values.iter().chain(more_objects));
        let store = RealApiStore::new(
            plane_dir,
            &topology.node_ns,
            &topology.run_dir,
            &cluster_ips,
        )?;
        let mut source = Tracked::new(store);
        source.apply_state(&values)?;
        Ok(Self {
            scenario,
            topology,
            source,
            dir,
        })
    }
}

impl<S: ObjectStore> TestNode<S> {
    pub fn bpffs_root(&self) -> PathBuf {
        bpffs_root(&self.topology.id)
    }

    pub fn node_place(&self) -> Place {
        self.topology.node_place()
    }

    /// Starts the agent in `mode` and waits for its first sync. `keep`: stopping or
    /// dropping it leaves its dataplane in place (a crash, or a hand-over to the next).
    pub async fn start_agent(
        &self,
        mode: Mode,
        config_overrides: Map<String, Value>,
        keep: bool,
        runner_exe: &Path,
    ) -> Result<Agent> {
        let mut agent = self.spawn_agent(mode, config_overrides, keep, runner_exe)?;
        agent.wait_first_sync().await?;
        Ok(agent)
    }

    /// [`TestNode::start_agent`] without the wait for a first sync.
    pub fn spawn_agent(
        &self,
        mode: Mode,
        config_overrides: Map<String, Value>,
        keep: bool,
        runner_exe: &Path,
    ) -> Result<Agent> {
        let connection = self.source.connection();
        let bpffs = self.bpffs_root();
        let fragment = merged_config(&self.scenario.config, &config_overrides);
        let inputs = ConfigInputs {
            proxy: crate::scenario::agent::Proxy::Ours,
            fragment: &fragment,
            mode,
            node_name: &self.scenario.node.name,
            connection: &connection,
            bpffs_root: &bpffs,
            cgroup_root: &self.topology.cgroup,
        };
        let options = AgentOptions {
            proxy: crate::scenario::agent::Proxy::Ours,
            binary: agent_binary(),
            mode,
            extra_args: Vec::new(),
            config_overrides,
            ready_timeout: Duration::from_secs(20) * time_scale(),
        };
        Agent::start(
            &options,
            &inputs,
            self.node_place(),
            &self.topology.run_dir,
            runner_exe,
            keep,
        )
    }

    /// Makes `objects` the cluster's state and waits until `agent` synced it.
    pub async fn apply_and_sync(&mut self, agent: &mut Agent, objects: &[Value]) -> Result<()> {
        let started = SystemTime::now();
        self.source.apply_state(objects)?;
        agent
            .wait_synced(Change {
                started,
                at: SystemTime::now(),
                initial: false,
            })
            .await
    }

    /// Runs `program args` in the node namespace (outside its cgroup) and returns its
    /// standard output; a failure to start is an error, a nonzero exit is not.
    pub fn output(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = self.run(Path::new(program), args)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `program args` in the node namespace (outside its cgroup), without input, and
    /// returns how it ended and what it printed.
    pub fn run(&self, program: &Path, args: &[&str]) -> Result<std::process::Output> {
        let place = Place {
            netns: self.topology.node_ns.clone(),
            cgroup: None,
        };
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        place
            .command(program, &args)
            .stdin(Stdio::null())
            .output()
            .map_err(Error::io(format!("running {}", program.display())))
    }
}

impl<S: ObjectStore> TestNode<S> {
    /// The path of one of the ebpf mode's pinned maps (e.g. `SVC4_V2`).
    pub fn pinned_map(&self, map: &str) -> PathBuf {
        self.bpffs_root().join("maps").join(map)
    }

    /// The entries of one of the ebpf mode's pinned maps (`bpftool -j map dump`).
    pub fn map_entries(&self, map: &str) -> Result<Vec<MapEntry>> {
        let path = self.pinned_map(map).display().to_string();
        let text = self.output("bpftool", &["-j", "map", "dump", "pinned", &path])?;
        let entries: Vec<Value> = serde_json::from_str(&text)
            .map_err(|e| Error::Setup(format!("bpftool dump of {map}: {e}: {text}")))?;
        Ok(entries
            .into_iter()
            .map(|e| MapEntry {
                raw_key: e["key"]
                    .as_array()
                    .map(|bytes| {
                        bytes
                            .iter()
                            .filter_map(Value::as_str)
                            .map(|b| b.trim_start_matches("0x").to_string())
                            .collect()
                    })
                    .unwrap_or_default(),
                key: e["formatted"]["key"].clone(),
                value: e["formatted"]["value"].clone(),
            })
            .collect())
    }
}

impl<S: ObjectStore> TestNode<S> {
    /// The node's IPVS table (`ipvsadm -Ln`, see [`IpvsLine`]).
    pub fn ipvs_table(&self) -> Result<BTreeSet<IpvsLine>> {
        let text = self.output("ipvsadm", &["-Ln"])?;
        Ok(parse_ipvsadm(&text, false).into_keys().collect())
    }

    /// The cumulative connection count of each virtual and real server (`ipvsadm -Ln
    /// --stats --exact`): one deleted and added again starts again from zero.
    pub fn ipvs_connection_counts(&self) -> Result<BTreeMap<IpvsLine, u64>> {
        let text = self.output("ipvsadm", &["-Ln", "--stats", "--exact"])?;
        Ok(parse_ipvsadm(&text, true))
    }
}

impl<S: ObjectStore> Drop for TestNode<S> {
    fn drop(&mut self) {
        self.topology.cleanup();
        // Pins left by kept agents (unpinning a link detaches its program).
        let _ = std::fs::remove_dir_all(self.bpffs_root());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipvsadm_listings_are_parsed() {
        let table = "IP Virtual Server version 1.2.1 (size=4096)\n\
            Prot LocalAddress:Port Scheduler Flags\n  \
            -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
            TCP  172.30.0.41:80 rr persistent 10800\n  \
            -> 10.180.0.1:9000              Masq    1      1          0\n  \
            -> 10.180.0.2:9000              Masq    0      0          3\n";
        let lines: Vec<String> = parse_ipvsadm(table, false).into_keys().collect();
        assert_eq!(
            lines,
            [
                "TCP 172.30.0.41:80 -> 10.180.0.1:9000 Masq 1",
                "TCP 172.30.0.41:80 -> 10.180.0.2:9000 Masq 0",
                "TCP 172.30.0.41:80 rr persistent 10800",
            ]
        );
        let stats = "IP Virtual Server version 1.2.1 (size=4096)\n\
            Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n  \
            -> RemoteAddress:Port\n\
            TCP  172.30.0.41:80                      3       20       18     1234     1300\n  \
            -> 10.180.0.1:9000                     2       12       11      800      900\n";
        let counts = parse_ipvsadm(stats, true);
        assert_eq!(counts["TCP 172.30.0.41:80"], 3);
        assert_eq!(counts["TCP 172.30.0.41:80 -> 10.180.0.1:9000"], 2);
        assert_eq!(counts.len(), 2);
    }
}
