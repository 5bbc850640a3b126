// SPDX-License-Identifier: Apache-2.0
//! What the agent leaves on a node is not writable by anyone but root: every pin under its
//! bpffs root (maps and links) and every directory there has no group or other write bit,
//! so another user can neither rewrite a service's backends through a map nor replace an
//! attached program, even when the agent runs with a umask of 0. (The agent's defaults keep metrics on localhost: see the config
//! tests; the DaemonSet's capabilities: tests/tests/deploy_manifests.rs.)

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use tests::{node_harness::TestNode, require_root, scenario::Mode};

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
    let node = TestNode::build(
        "privilege",
        "name: privilege\n\
         about: pin permissions\n\
         node: {name: priv-node, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}\n\
         config: {clusterCIDR: 10.0.0.0/8}",
        r#"- apiVersion: v1
  kind: Node
  metadata: {name: priv-node}
  spec: {podCIDRs: [10.0.0.0/8]}
  status: {addresses: [{type: InternalIP, address: 192.168.0.2}]}
- apiVersion: v1
  kind: Service
  metadata: {name: svc1, namespace: ns1}
  spec:
    clusterIP: 172.30.0.81
    clusterIPs: [172.30.0.81]
    ports: [{name: p, port: 80, protocol: TCP, targetPort: 9000}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  endpoints: [{addresses: [10.184.0.1], nodeName: priv-node, conditions: {ready: true}}]
  ports: [{name: p, port: 9000, protocol: TCP}]
"#,
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
        pins.iter().any(|(p, _)| p.ends_with("maps/SVC4_V1")),
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
