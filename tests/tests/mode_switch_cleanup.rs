// SPDX-License-Identifier: Apache-2.0
//! Switching modes leaves no trace of the previous one, and `--cleanup` leaves no trace
//! of any: on a node namespace the agent runs in ebpf mode, then iptables mode (the ebpf
//! pins and attached programs must be gone), then ebpf again (the KUBE-* chains must be
//! gone), then `proxy-agent --cleanup` runs twice (both exit 0) and the node has no KUBE-*
//! chain in either family, no KUBE-* ipset, no kube-ipvs0 link, no pins under the agent's
//! bpffs root and no program on its cgroup.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, SystemTime},
};

use tests::{
    require_root,
    scenario::{
        agent::{Agent, AgentOptions, ConfigInputs, bpffs_root},
        cluster::{ApiServerStore, ClusterSource, Tracked},
        format::{Mode, Scenario},
        netns::Place,
        placement::Placement,
        readiness::Change,
        topology::Topology,
    },
};

const VIP: &str = "172.30.0.51";
const BACKEND: &str = "10.181.0.1";

fn objects() -> String {
    format!(
        r#"
- apiVersion: v1
  kind: Node
  metadata: {{name: switch-node}}
  spec: {{podCIDRs: [10.0.0.0/8]}}
  status: {{addresses: [{{type: InternalIP, address: 192.168.0.2}}]}}
- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1}}
  spec:
    type: NodePort
    clusterIP: {VIP}
    clusterIPs: [{VIP}]
    ports: [{{name: p, port: 80, protocol: UDP, targetPort: 9000, nodePort: 30080}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: svc1-1, namespace: ns1, labels: {{kubernetes.io/service-name: svc1}}}}
  addressType: IPv4
  endpoints: [{{addresses: [{BACKEND}], nodeName: switch-node, conditions: {{ready: true}}}}]
  ports: [{{name: p, port: 9000, protocol: UDP}}]
"#
    )
}

/// A scenario whose only job is to build the node and place the pod.
fn scenario(dir: &Path) -> Scenario {
    let objects: String = objects().lines().map(|l| format!("  {l}\n")).collect();
    let text = format!(
        "name: switch\n\
         about: mode switches and cleanup\n\
         node: {{name: switch-node, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}}\n\
         config: {{clusterCIDR: 10.0.0.0/8}}\n\
         objects:\n{objects}\
         flows:\n\
         - {{from: 10.0.0.2, to: \"{VIP}:80\", proto: udp, expect: [\"{BACKEND}:9000\"]}}\n"
    );
    let path = dir.join("switch.yaml");
    std::fs::write(&path, text).unwrap();
    Scenario::load(&path).unwrap()
}

fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .unwrap()
        .join("proxy-agent")
}

/// What a mode can leave on the node, as seen from inside its namespace.
#[derive(Debug, Default)]
struct Leftovers {
    kube_chains: Vec<String>,
    kube_ipsets: Vec<String>,
    ipvs_link: bool,
    pins: Vec<PathBuf>,
    cgroup_programs: String,
}

fn output(place: &Place, program: &str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = place
        .command(Path::new(program), &args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn leftovers(place: &Place, bpffs: &Path, cgroup: &Path) -> Leftovers {
    let mut kube_chains: Vec<String> = ["iptables-save", "ip6tables-save"]
        .iter()
        .flat_map(|save| {
            output(place, save, &[])
                .lines()
                .filter(|l| l.starts_with(":KUBE-"))
                .map(|l| format!("{save}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    kube_chains.sort();
    let kube_ipsets = output(place, "ipset", &["list", "-n"])
        .lines()
        .filter(|l| l.starts_with("KUBE-"))
        .map(str::to_string)
        .collect();
    let ipvs_link = !output(place, "ip", &["-o", "link", "show", "kube-ipvs0"])
        .trim()
        .is_empty();
    let mut pins = Vec::new();
    collect_files(bpffs, &mut pins);
    let cgroup_programs = output(
        &Place {
            netns: place.netns.clone(),
            cgroup: None,
        },
        "bpftool",
        &["cgroup", "show", &cgroup.display().to_string()],
    );
    Leftovers {
        kube_chains,
        kube_ipsets,
        ipvs_link,
        pins,
        cgroup_programs: cgroup_programs.trim().to_string(),
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

async fn start(
    mode: Mode,
    topology: &Topology,
    source: &Tracked<ApiServerStore>,
    scenario: &Scenario,
) -> Agent {
    let connection = source.connection();
    let bpffs = bpffs_root(&topology.id);
    let inputs = ConfigInputs {
        fragment: &scenario.config,
        mode,
        node_name: &scenario.node.name,
        connection: &connection,
        bpffs_root: &bpffs,
        cgroup_root: &topology.cgroup,
    };
    let options = AgentOptions {
        binary: agent_binary(),
        mode,
        extra_args: Vec::new(),
        config_overrides: Default::default(),
        ready_timeout: Duration::from_secs(20),
    };
    // Kept: each agent is killed, and what it leaves is for the next one to deal with.
    let mut agent = Agent::start(
        &options,
        &inputs,
        topology.node_place(),
        &topology.run_dir,
        Path::new(env!("CARGO_BIN_EXE_scenario-runner")),
        true,
    )
    .unwrap();
    let now = SystemTime::now();
    agent
        .wait_synced(Change {
            started: now,
            at: now,
            initial: true,
        })
        .await
        .unwrap();
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_and_cleanup_leave_nothing_behind() {
    require_root!();
    assert!(
        agent_binary().exists(),
        "{} is not built",
        agent_binary().display()
    );
    let dir = std::env::temp_dir().join(format!("kpe-switch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = scenario(&dir);
    let placement = Placement::plan(&scenario).unwrap();
    let topology = Topology::build(&scenario.node, &placement, false).unwrap();
    let mut source =
        Tracked::new(ApiServerStore::start(&topology.node_ns, &topology.run_dir).unwrap());
    let values: Vec<serde_json::Value> = serde_yaml::from_str(&objects()).unwrap();
    source.apply_state(&values).unwrap();
    let node = topology.node_place();
    let bpffs = bpffs_root(&topology.id);

    let mut ebpf = start(Mode::Ebpf, &topology, &source, &scenario).await;
    let seen = leftovers(&node, &bpffs, &topology.cgroup);
    assert!(!seen.pins.is_empty(), "ebpf mode pins its maps: {seen:?}");
    assert!(
        !seen.cgroup_programs.is_empty(),
        "ebpf mode attaches to the node's cgroup: {seen:?}"
    );
    assert!(seen.kube_chains.is_empty(), "{seen:?}");
    ebpf.kill();

    let mut iptables = start(Mode::Iptables, &topology, &source, &scenario).await;
    let seen = leftovers(&node, &bpffs, &topology.cgroup);
    assert!(
        seen.kube_chains
            .iter()
            .any(|c| c.contains(":KUBE-SERVICES")),
        "iptables mode programs its chains: {seen:?}"
    );
    assert!(
        seen.pins.is_empty(),
        "starting iptables mode removed ebpf's pins: {seen:?}"
    );
    assert!(
        seen.cgroup_programs.is_empty(),
        "and its programs: {seen:?}"
    );
    iptables.kill();

    let mut ebpf = start(Mode::Ebpf, &topology, &source, &scenario).await;
    let seen = leftovers(&node, &bpffs, &topology.cgroup);
    assert!(
        seen.kube_chains.is_empty(),
        "starting ebpf mode removed iptables' chains: {seen:?}"
    );
    assert!(!seen.pins.is_empty(), "{seen:?}");
    ebpf.kill();

    for run in 1..=2 {
        let args = vec![
            "--cleanup".to_string(),
            "--bpffs-root".to_string(),
            bpffs.display().to_string(),
        ];
        let out = node
            .command(&agent_binary(), &args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "--cleanup run {run} exits 0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen = leftovers(&node, &bpffs, &topology.cgroup);
        assert!(seen.kube_chains.is_empty(), "run {run}: {seen:?}");
        assert!(seen.kube_ipsets.is_empty(), "run {run}: {seen:?}");
        assert!(!seen.ipvs_link, "run {run}: {seen:?}");
        assert!(seen.pins.is_empty(), "run {run}: {seen:?}");
        assert!(seen.cgroup_programs.is_empty(), "run {run}: {seen:?}");
    }

    drop(topology);
    let _ = std::fs::remove_dir_all(&dir);
}
