// SPDX-License-Identifier: Apache-2.0
//! `proxy-agent handover --to iptables`, the rollback step of the cleanup DaemonSet
//! (deploy/cleanup/): on a node where the agent ran in ebpf mode and kube-proxy (iptables
//! mode) has since put its chains back, it removes the agent's pins and cgroup programs and
//! leaves kube-proxy's chains alone, unlike `--cleanup`. Twice, both exiting 0.

use std::path::Path;

use tests::{node_harness::TestNode, require_root, scenario::Mode};

use super::mode_switch_cleanup::{leftovers, node};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_removes_ebpf_state_and_keeps_kube_proxys_chains() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let node = node();
    let mut ebpf = node
        .start_agent(Mode::Ebpf, Default::default(), true, Path::new(RUNNER))
        .await
        .unwrap();
    ebpf.kill();
    let seen = leftovers(&node);
    assert!(
        !seen.pins.is_empty(),
        "the stopped agent's pins stay: {seen:?}"
    );
    assert!(!seen.cgroup_programs.is_empty(), "{seen:?}");

    // kube-proxy, back in iptables mode, has programmed its chains.
    for args in [
        &["-t", "nat", "-N", "KUBE-SERVICES"][..],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "172.30.0.51/32",
            "-j",
            "RETURN",
        ],
    ] {
        node.output("iptables", args).unwrap();
    }

    let bpffs = node.bpffs_root().display().to_string();
    for run in 1..=2 {
        let out = node
            .run(
                &binary,
                &["handover", "--to", "iptables", "--bpffs-root", &bpffs],
            )
            .unwrap();
        assert!(
            out.status.success(),
            "handover run {run} exits 0: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let seen = leftovers(&node);
        assert!(seen.pins.is_empty(), "run {run}: {seen:?}");
        assert!(seen.cgroup_programs.is_empty(), "run {run}: {seen:?}");
        assert!(
            seen.kube_chains
                .iter()
                .any(|c| c.starts_with("iptables-save: :KUBE-SERVICES")),
            "run {run}: kube-proxy's chain is kept: {seen:?}"
        );
        let rules = node.output("iptables-save", &["-t", "nat"]).unwrap();
        assert!(
            rules.contains("-A KUBE-SERVICES -d 172.30.0.51/32 -j RETURN"),
            "run {run}: and its rule:\n{rules}"
        );
    }
}
