// SPDX-License-Identifier: Apache-2.0
//! What the agent leaves on a node is not writable by anyone but root: every pin under its
//! bpffs root (maps and links) and every directory there has no group or other write bit,
//! so another user can neither rewrite a service's backends through a map nor replace an
//! attached program, even when the agent runs with a umask of 0. (The agent's defaults keep metrics on localhost: see the config
//! tests; the DaemonSet's capabilities: tests/tests/deploy_manifests.rs.)

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, service_yaml},
    require_root,
    scenario::Mode,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

fn walk(dir: &Path, out: &mut Vec<(String, u32)>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let mode = entry
            .metadata()
            .map(|m| m.permissions().mode())
            .unwrap_or(0);
        out.push((path.display().to_string(), mode));
        if path.is_dir() {
            walk(&path, out);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_are_writable_by_root_only() {
    require_root!();
    let objects = node_yaml("priv-node", "192.168.0.2")
        + &service_yaml(
            "svc1",
            "172.30.0.81",
            "TCP",
            "10.184.0.1",
            "priv-node",
            None,
        );
    let node = TestNode::build(
        "privilege",
        &scenario_header("privilege", "priv-node"),
        &objects,
        "- {from: 10.0.0.2, to: \"172.30.0.81:80\", expect: [\"10.184.0.1:9000\"]}",
    )
    .unwrap();
    // Whatever umask the agent is started with (a container runtime may give it 0).
    let old_umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let agent = node
        .start_agent(Mode::Ebpf, Default::default(), false, Path::new(RUNNER))
        .await;
    nix::sys::stat::umask(old_umask);
    let mut agent = agent.unwrap();
    let mut pins = Vec::new();
    walk(&node.bpffs_root(), &mut pins);
    assert!(
        pins.iter().any(|(p, _)| p.ends_with("maps/SVC4_V2")),
        "the maps are pinned: {pins:#?}"
    );
    assert!(
        pins.iter().any(|(p, _)| p.contains("/links/")),
        "the links are pinned: {pins:#?}"
    );
    let writable: Vec<String> = pins
        .iter()
        .filter(|(_, mode)| mode & 0o022 != 0)
        .map(|(p, mode)| format!("{p} {:o}", mode & 0o7777))
        .collect();
    assert!(
        writable.is_empty(),
        "writable by group or others: {writable:#?}"
    );
    let root_mode = std::fs::metadata(node.bpffs_root())
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0);
    assert_eq!(root_mode, 0o700, "only root may enter the pin directory");
    agent.stop();
}
