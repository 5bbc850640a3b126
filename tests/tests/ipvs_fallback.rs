// SPDX-License-Identifier: Apache-2.0
//! ipvs mode on a kernel without IPVS (this host): with `--strict-mode` the agent refuses
//! to fall back and exits 1 naming the missing kernel support. (Without it the agent
//! falls back to iptables: the `ipvs-fallback::*` scenario tests show that, judging every
//! flow as iptables after checking the agent's /proxyMode.)
//!
//! Needs root (the agent runs in a fresh network namespace, where its servers bind); on a
//! kernel with IPVS there is nothing to fall back from, and the test says so and returns.

use std::{path::PathBuf, time::Duration};

fn agent_binary() -> PathBuf {
    tests::node_harness::TestNode::agent_binary()
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata:
  name: strict-node
  labels: {kubernetes.io/hostname: strict-node}
status:
  addresses: [{type: InternalIP, address: 192.168.0.2}]
";

#[test]
fn strict_ipvs_mode_exits_1_naming_the_missing_kernel_support() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a fresh network namespace for the agent)");
        return;
    }
    if xtask::vm::host_kernel_has_ipvs() {
        eprintln!("skipped: this kernel has IPVS, so ipvs mode has no reason to fall back");
        return;
    }
    let agent = agent_binary();
    assert!(agent.is_file(), "{} not built", agent.display());
    let (status, output) = tests::privileged::run_agent_to_exit(
        &agent,
        &[
            "--proxy-mode",
            "ipvs",
            "--strict-mode",
            "--hostname-override",
            "strict-node",
        ],
        NODE,
        None,
        Duration::from_secs(60),
    );
    assert_eq!(status.code(), Some(1), "exit status; output:\n{output}");
    let refusal = output
        .lines()
        .find(|l| l.contains("proxy mode ipvs cannot run on this node"))
        .unwrap_or_else(|| panic!("no refusal naming ipvs mode; output:\n{output}"));
    let reason = refusal
        .split_once("cannot run on this node")
        .map(|(_, r)| r)
        .unwrap_or_default();
    assert!(
        reason.contains("IPVS") || reason.contains("ip_vs"),
        "the refusal does not name the missing kernel support (IPVS): {refusal}"
    );
    assert!(
        !output.contains("PROXY MODE FALLBACK"),
        "strict mode fell back anyway:\n{output}"
    );
}
