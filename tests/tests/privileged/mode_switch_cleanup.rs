// SPDX-License-Identifier: Apache-2.0
//! Switching modes leaves no trace of the previous one, and `--cleanup` leaves no trace
//! of any: on a node namespace the agent runs in ebpf mode, then iptables mode (the ebpf
//! pins and attached programs must be gone), then ebpf again (the KUBE-* chains must be
//! gone), then `proxy-agent --cleanup` runs twice (both exit 0) and the node has no KUBE-*
//! chain in either family, no KUBE-* ipset, no kube-ipvs0 link, no pins under the agent's
//! bpffs root and no program on its cgroup.

use std::path::{Path, PathBuf};

use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, service_yaml},
    require_root,
    scenario::Mode,
};

const VIP: &str = "172.30.0.51";
const BACKEND: &str = "10.181.0.1";
const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

pub(crate) fn node() -> TestNode {
    let objects = node_yaml("switch-node", "192.168.0.2")
        + &service_yaml("svc1", VIP, "UDP", BACKEND, "switch-node", Some(30080));
    TestNode::build(
        "switch",
        &scenario_header("switch", "switch-node"),
        &objects,
        &format!(
            "- {{from: 10.0.0.2, to: \"{VIP}:80\", proto: udp, expect: [\"{BACKEND}:9000\"]}}"
        ),
    )
    .unwrap()
}

/// What a mode can leave on the node, as seen from inside its namespace.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    pub(crate) kube_chains: Vec<String>,
    pub(crate) kube_ipsets: Vec<String>,
    pub(crate) ipvs_link: bool,
    pub(crate) pins: Vec<PathBuf>,
    pub(crate) cgroup_programs: String,
}

pub(crate) fn leftovers(node: &TestNode) -> Leftovers {
    let out = |program: &str, args: &[&str]| node.output(program, args).unwrap();
    let mut kube_chains: Vec<String> = ["iptables-save", "ip6tables-save"]
        .iter()
        .flat_map(|save| {
            out(save, &[])
                .lines()
                .filter(|l| l.starts_with(":KUBE-"))
                .map(|l| format!("{save}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    kube_chains.sort();
    let kube_ipsets = out("ipset", &["list", "-n"])
        .lines()
        .filter(|l| l.starts_with("KUBE-"))
        .map(str::to_string)
        .collect();
    let ipvs_link = !out("ip", &["-o", "link", "show", "kube-ipvs0"])
        .trim()
        .is_empty();
    let mut pins = Vec::new();
    collect_files(&node.bpffs_root(), &mut pins);
    let cgroup = node.topology.cgroup.display().to_string();
    let cgroup_programs = out("bpftool", &["cgroup", "show", &cgroup]);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_and_cleanup_leave_nothing_behind() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let node = node();
    let runner = Path::new(RUNNER);
    // Each agent is kept and killed: what it leaves is for the next one to deal with.
    let start = |mode| node.start_agent(mode, Default::default(), true, runner);

    let mut ebpf = start(Mode::Ebpf).await.unwrap();
    let seen = leftovers(&node);
    assert!(!seen.pins.is_empty(), "ebpf mode pins its maps: {seen:?}");
    assert!(
        !seen.cgroup_programs.is_empty(),
        "ebpf mode attaches to the node's cgroup: {seen:?}"
    );
    assert!(seen.kube_chains.is_empty(), "{seen:?}");
    ebpf.kill();

    let mut iptables = start(Mode::Iptables).await.unwrap();
    let seen = leftovers(&node);
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

    let mut ebpf = start(Mode::Ebpf).await.unwrap();
    let seen = leftovers(&node);
    assert!(
        seen.kube_chains.is_empty(),
        "starting ebpf mode removed iptables' chains: {seen:?}"
    );
    assert!(!seen.pins.is_empty(), "{seen:?}");
    ebpf.kill();

    let bpffs = node.bpffs_root().display().to_string();
    for run in 1..=2 {
        let out = node
            .run(&binary, &["--cleanup", "--bpffs-root", &bpffs])
            .unwrap();
        assert!(
            out.status.success(),
            "--cleanup run {run} exits 0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen = leftovers(&node);
        assert!(seen.kube_chains.is_empty(), "run {run}: {seen:?}");
        assert!(seen.kube_ipsets.is_empty(), "run {run}: {seen:?}");
        assert!(!seen.ipvs_link, "run {run}: {seen:?}");
        assert!(seen.pins.is_empty(), "run {run}: {seen:?}");
        assert!(seen.cgroup_programs.is_empty(), "run {run}: {seen:?}");
    }
}
