// SPDX-License-Identifier: Apache-2.0
//! Switching modes leaves no trace of the previous one, and `--cleanup` leaves no trace
//! of any: on a node namespace the agent runs ebpf, iptables, nftables, ebpf, nftables,
//! iptables and ebpf mode in turn (every direction between the three), each killed so that
//! the next finds its state; at each step the running mode (its `/proxyMode`) has its
//! state on the node and every other mode's is gone: ebpf's pins and cgroup programs,
//! iptables' KUBE-* chains, nftables' `kube-proxy` tables. Then `proxy-agent --cleanup`
//! runs twice (both exit 0) and the node has no KUBE-* chain in either family, no KUBE-*
//! ipset, no kube-ipvs0 link, no `kube-proxy` nftables table, no pins under the agent's
//! bpffs root and no program on its cgroup.
//!
//! ipvs -> nftables -> ipvs needs a kernel with IPVS and skips without one. It is not in
//! the CI guest's list (tests/tests/vm_guest.rs): its three agent starts take about 110 s
//! under emulation. Run it there by hand: `cargo xtask vm -- '<privileged test binary>
//! mode_switch_cleanup::ipvs_ --test-threads=1'`.

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
    /// nftables mode's tables (`table ip kube-proxy`, `table ip6 kube-proxy`).
    pub(crate) nft_tables: Vec<String>,
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
    // Without nft there is no nftables mode and nothing of it to leave.
    let nft_tables = node
        .output("nft", &["list", "tables"])
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("table ") && l.ends_with(" kube-proxy"))
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
        nft_tables,
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

impl Leftovers {
    fn has_ebpf(&self) -> bool {
        !self.pins.is_empty() || !self.cgroup_programs.is_empty()
    }

    fn has_iptables(&self) -> bool {
        !self.kube_chains.is_empty()
    }

    fn has_nftables(&self) -> bool {
        !self.nft_tables.is_empty()
    }

    /// Fails unless `mode`'s state is on the node and no other mode's is.
    fn assert_only(&self, mode: Mode, step: &str) {
        let present = [
            (Mode::Ebpf, self.has_ebpf()),
            (Mode::Iptables, self.has_iptables()),
            (Mode::Nftables, self.has_nftables()),
        ];
        for (other, there) in present {
            if other == mode {
                assert!(there, "{step}: {mode} mode's state is missing: {self:?}");
            } else {
                assert!(
                    !there,
                    "{step}: starting {mode} mode left {other} mode's state: {self:?}"
                );
            }
        }
        assert!(self.kube_ipsets.is_empty(), "{step}: {self:?}");
        assert!(!self.ipvs_link, "{step}: {self:?}");
    }
}

/// Starts an agent in `mode` after one in `previous` (kept, to be killed by the caller) and
/// checks that it runs that mode; with the step's name for the assertions.
async fn start_checked(
    node: &TestNode,
    runner: &Path,
    previous: Option<Mode>,
    mode: Mode,
) -> (String, tests::scenario::agent::Agent) {
    let step = match previous {
        Some(from) => format!("{from} -> {mode}"),
        None => format!("first {mode}"),
    };
    let agent = node
        .start_agent(mode, Default::default(), true, runner)
        .await
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    agent
        .check_running_mode(mode)
        .await
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    (step, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_and_cleanup_leave_nothing_behind() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let node = node();
    let runner = Path::new(RUNNER);

    // Every direction between the three modes: ebpf -> iptables -> nftables -> ebpf ->
    // nftables -> iptables -> ebpf. Each agent is kept and killed: what it leaves is for
    // the next one to deal with.
    let sequence = [
        Mode::Ebpf,
        Mode::Iptables,
        Mode::Nftables,
        Mode::Ebpf,
        Mode::Nftables,
        Mode::Iptables,
        Mode::Ebpf,
    ];
    let mut previous: Option<Mode> = None;
    for mode in sequence {
        let (step, mut agent) = start_checked(&node, runner, previous, mode).await;
        let seen = leftovers(&node);
        seen.assert_only(mode, &step);
        match mode {
            Mode::Ebpf => assert!(
                !seen.pins.is_empty() && !seen.cgroup_programs.is_empty(),
                "{step}: ebpf mode pins its maps and attaches to the node's cgroup: {seen:?}"
            ),
            Mode::Iptables => assert!(
                seen.kube_chains
                    .iter()
                    .any(|c| c.contains(":KUBE-SERVICES")),
                "{step}: iptables mode programs its chains: {seen:?}"
            ),
            Mode::Nftables => assert!(
                seen.nft_tables.iter().any(|t| t == "table ip kube-proxy"),
                "{step}: nftables mode programs its IPv4 table: {seen:?}"
            ),
            Mode::Ipvs => unreachable!("not in the sequence"),
        }
        agent.kill();
        previous = Some(mode);
    }

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
        assert!(seen.nft_tables.is_empty(), "run {run}: {seen:?}");
        assert!(!seen.ipvs_link, "run {run}: {seen:?}");
        assert!(seen.pins.is_empty(), "run {run}: {seen:?}");
        assert!(seen.cgroup_programs.is_empty(), "run {run}: {seen:?}");
    }
}

/// The iptables mode's per-Service chains, which ipvs mode (whose own KUBE-* chains it
/// shares with iptables mode's names) never makes.
fn iptables_service_chains(seen: &Leftovers) -> Vec<&String> {
    seen.kube_chains
        .iter()
        .filter(|c| {
            [":KUBE-SVC-", ":KUBE-SEP-", ":KUBE-EXT-"]
                .iter()
                .any(|p| c.contains(p))
        })
        .collect()
}

/// ipvs mode's state is its kube-ipvs0 link and the VIP's virtual server; nftables mode
/// starting removes it all (link, IPVS table, KUBE-* ipsets and chains), and ipvs mode
/// starting again removes nftables mode's tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_and_nftables_switches_leave_nothing_behind() {
    require_root!();
    tests::require_ipvs!();
    let node = node();
    let runner = Path::new(RUNNER);
    let mut previous: Option<Mode> = None;
    for mode in [Mode::Ipvs, Mode::Nftables, Mode::Ipvs] {
        let (step, mut agent) = start_checked(&node, runner, previous, mode).await;
        let seen = leftovers(&node);
        let virtual_servers = node.ipvs_table().unwrap();
        assert!(!seen.has_ebpf(), "{step}: {seen:?}");
        if mode == Mode::Ipvs {
            assert!(
                seen.ipvs_link && virtual_servers.iter().any(|l| l.contains(VIP)),
                "{step}: ipvs mode has its link and the VIP's virtual server: \
                 {seen:?} {virtual_servers:?}"
            );
            assert!(
                !seen.has_nftables(),
                "{step}: starting ipvs mode left nftables mode's tables: {seen:?}"
            );
            assert!(
                iptables_service_chains(&seen).is_empty(),
                "{step}: {seen:?}"
            );
        } else {
            assert!(
                seen.nft_tables.iter().any(|t| t == "table ip kube-proxy"),
                "{step}: nftables mode programs its IPv4 table: {seen:?}"
            );
            assert!(
                !seen.ipvs_link
                    && virtual_servers.is_empty()
                    && seen.kube_ipsets.is_empty()
                    && seen.kube_chains.is_empty(),
                "{step}: starting nftables mode left ipvs mode's state: \
                 {seen:?} {virtual_servers:?}"
            );
        }
        agent.kill();
        previous = Some(mode);
    }
}
