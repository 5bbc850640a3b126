// SPDX-License-Identifier: Apache-2.0
//! A three-node cluster (tests/src/multinode): every node runs its own agent, and the flows
//! that cross nodes are checked from both ends — the client must see the address it
//! dialled, the backend the source the mode promises.
//!
//! - `cross_node_*`: tests/multinode/c1-cross-node.yaml, a cluster scenario file: NodePort
//!   on node A to a pod on node B (eTP=Cluster: SNAT to A,
//!   reply back through A), UDP too; eTP=Local on nodes without a local endpoint (DROP
//!   there, health-check node port 503) and on the node with one (the client's address
//!   kept, 200); external traffic to LB IPs entering through each node; pod on A (and on
//!   C) to a ClusterIP served on B (the backend sees the pod); hairpin through another
//!   node (a pod reaching itself through node A's NodePort). In ebpf, in iptables, and in
//!   the three rotations of ebpf, iptables and nftables over the three nodes (each mode in
//!   each role).
//! - `rolling_upgrade_*`: every node's agent replaced in turn under load (new connections,
//!   long-lived TCP connections and a UDP flow through a ClusterIP and a NodePort across
//!   nodes): nothing fails, breaks or is lost.
//! - `drained_node_*`: a node drained (its endpoints leave the EndpointSlice) and its
//!   agent stopped: after one sync the other nodes send nothing to its pods.
//! - `maglev_*`: a Maglev service (by annotation) reached at its LB IP: the same 5-tuple
//!   entering through each node reaches the same backend, and removing one of five
//!   backends moves about a fifth of a set of new flows (those it served, and few others).
//! - `mode_switch_*`: node A switched between iptables (or nftables) and ebpf and back
//!   under the same load, starting from either: nothing fails, breaks or is lost (the
//!   handover of proxy-agent/src/proxier/ebpf/handover.rs, both ways). Each migration
//!   prints its numbers.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tests::{
    multinode::{
        AgentSetup, Cluster, at,
        load::LoadReport,
        net::{EXTERNAL_CLIENT, node_address, node_name, pod_address},
        scenario::{self, ClusterScenario},
    },
    node_harness::{TestNode, time_scale},
    require_root,
    scenario::Mode,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

/// eTP=Cluster LoadBalancer: ClusterIP, LB IP, NodePorts (TCP and UDP 80, TCP 81).
const WEB_VIP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 10);
const WEB_LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const WEB_NODE_PORT: u16 = 30080;
const WEB_LONG_NODE_PORT: u16 = 30081;
/// eTP=Local LoadBalancer with its health-check node port.
const LOCAL_VIP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 20);
const LOCAL_LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 20);
const LOCAL_NODE_PORT: u16 = 30090;
const LOCAL_HEALTH_PORT: u16 = 30990;

/// Node indices: A is where traffic enters, B holds the endpoints, C is the third node.
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;

/// Pods: `(node, host)`.
const CLIENT_A: (usize, u8) = (A, 10);
const WEB_BACKEND: (usize, u8) = (B, 10);
const LOCAL_BACKEND: (usize, u8) = (B, 11);
const CLIENT_C: (usize, u8) = (C, 10);
/// A second web backend, on C, for the drain and load tests.
const WEB_BACKEND_C: (usize, u8) = (C, 11);

fn pod(p: (usize, u8)) -> Ipv4Addr {
    pod_address(p.0, p.1)
}

fn endpoint_yaml(p: (usize, u8)) -> String {
    format!(
        "{{addresses: [{}], nodeName: {}, conditions: {{ready: true}}}}",
        pod(p),
        node_name(p.0)
    )
}

/// The endpoints of these pods, as the items of a YAML flow list.
fn endpoints_yaml(pods: &[(usize, u8)]) -> String {
    pods.iter()
        .copied()
        .map(endpoint_yaml)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The two services and their EndpointSlices; `web` is served by `web_backends`.
fn objects(web_backends: &[(usize, u8)]) -> String {
    let web = endpoints_yaml(web_backends);
    format!(
        r#"- apiVersion: v1
  kind: Service
  metadata: {{name: web, namespace: ns1}}
  spec:
    type: LoadBalancer
    clusterIP: {WEB_VIP}
    clusterIPs: [{WEB_VIP}]
    externalTrafficPolicy: Cluster
    ports:
    - {{name: p, port: 80, protocol: TCP, targetPort: 9000, nodePort: {WEB_NODE_PORT}}}
    - {{name: u, port: 80, protocol: UDP, targetPort: 9000, nodePort: {WEB_NODE_PORT}}}
    - {{name: s, port: 81, protocol: TCP, targetPort: 9001, nodePort: {WEB_LONG_NODE_PORT}}}
  status: {{loadBalancer: {{ingress: [{{ip: {WEB_LB}}}]}}}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: web-1, namespace: ns1, labels: {{kubernetes.io/service-name: web}}}}
  addressType: IPv4
  endpoints: [{web}]
  ports:
  - {{name: p, port: 9000, protocol: TCP}}
  - {{name: u, port: 9000, protocol: UDP}}
  - {{name: s, port: 9001, protocol: TCP}}
- apiVersion: v1
  kind: Service
  metadata: {{name: local, namespace: ns1}}
  spec:
    type: LoadBalancer
    clusterIP: {LOCAL_VIP}
    clusterIPs: [{LOCAL_VIP}]
    externalTrafficPolicy: Local
    healthCheckNodePort: {LOCAL_HEALTH_PORT}
    ports:
    - {{name: p, port: 80, protocol: TCP, targetPort: 9000, nodePort: {LOCAL_NODE_PORT}}}
  status: {{loadBalancer: {{ingress: [{{ip: {LOCAL_LB}}}]}}}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: local-1, namespace: ns1, labels: {{kubernetes.io/service-name: local}}}}
  addressType: IPv4
  endpoints: [{}]
  ports:
  - {{name: p, port: 9000, protocol: TCP}}
"#,
        endpoint_yaml(LOCAL_BACKEND)
    )
}

fn setup() -> AgentSetup {
    AgentSetup {
        binary: TestNode::agent_binary(),
        runner: PathBuf::from(RUNNER),
        ready_timeout: Duration::from_secs(30) * time_scale(),
        config: Default::default(),
    }
}

async fn cluster(modes: [Mode; 3], web_backends: &[(usize, u8)]) -> Cluster {
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let pods = [
        CLIENT_A,
        WEB_BACKEND,
        LOCAL_BACKEND,
        CLIENT_C,
        WEB_BACKEND_C,
    ];
    let mut cluster = Cluster::build(
        setup(),
        &pods,
        &[WEB_LB, LOCAL_LB],
        &["echo/tcp/:9000", "echo/udp/:9000", "session/tcp/:9001"],
        &objects(web_backends),
    )
    .expect("the cluster builds");
    cluster
        .start_agents(modes)
        .await
        .expect("every agent starts in its mode");
    cluster
}

/// Replays tests/multinode/c1-cross-node.yaml with node `i` in `modes[i]`.
async fn cross_node(modes: [Mode; 3]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("multinode/c1-cross-node.yaml");
    let scenario = ClusterScenario::load(&path).expect("the scenario loads");
    let listeners = scenario.listeners();
    let listeners: Vec<&str> = listeners.iter().map(String::as_str).collect();
    let mut cluster = Cluster::build(
        setup(),
        &scenario.pods().expect("every pod has its node"),
        &scenario.lb_ips,
        &listeners,
        &scenario.objects_yaml().expect("objects"),
    )
    .expect("the cluster builds");
    cluster
        .start_agents(modes)
        .await
        .expect("every agent starts in its mode");
    let failures = scenario::failures(&cluster, &scenario).expect("the flows run");
    assert!(
        failures.is_empty(),
        "{} in modes {modes:?}: {} flows wrong:\n{}",
        scenario.name,
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_ebpf() {
    require_root!();
    cross_node([Mode::Ebpf; 3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_iptables() {
    require_root!();
    cross_node([Mode::Iptables; 3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_mixed_ebpf_iptables_nftables() {
    require_root!();
    cross_node([Mode::Ebpf, Mode::Iptables, Mode::Nftables]).await;
}

/// The other two rotations of the three modes over the three nodes: with the one above,
/// each mode holds each role (entry node, endpoint node, third node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_mixed_iptables_nftables_ebpf() {
    require_root!();
    cross_node([Mode::Iptables, Mode::Nftables, Mode::Ebpf]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_mixed_nftables_ebpf_iptables() {
    require_root!();
    cross_node([Mode::Nftables, Mode::Ebpf, Mode::Iptables]).await;
}

/// ipvs where the kernel has it (the qemu guest of `cargo xtask vm`): node A in ipvs, B in
/// ebpf, C in nftables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_mixed_ipvs_ebpf_nftables() {
    require_root!();
    tests::require_ipvs!();
    cross_node([Mode::Ipvs, Mode::Ebpf, Mode::Nftables]).await;
}

/// The load of a migration: from a pod on A through the ClusterIP, and from outside
/// through A's NodePorts, to the backends on B and C.
fn start_loads(cluster: &Cluster) -> Vec<(&'static str, tests::multinode::RunningLoad)> {
    let a = node_address(A);
    let arguments = |new: String, long: String, udp: String| -> Vec<String> {
        vec![
            "--new-to".into(),
            new,
            "--long-to".into(),
            long,
            "--long-count".into(),
            "8".into(),
            "--udp-to".into(),
            udp,
            "--tick-ms".into(),
            "20".into(),
            "--timeout-ms".into(),
            (1000 * time_scale()).to_string(),
        ]
    };
    let east_west = arguments(
        at(WEB_VIP, 81).to_string(),
        at(WEB_VIP, 81).to_string(),
        at(WEB_VIP, 80).to_string(),
    );
    let north_south = arguments(
        at(a, WEB_LONG_NODE_PORT).to_string(),
        at(a, WEB_LONG_NODE_PORT).to_string(),
        at(a, WEB_NODE_PORT).to_string(),
    );
    vec![
        (
            "pod on A -> ClusterIP",
            cluster
                .start_load(pod(CLIENT_A), &east_west)
                .expect("the east-west load starts"),
        ),
        (
            "outside -> NodePort of A",
            cluster
                .start_load(EXTERNAL_CLIENT, &north_south)
                .expect("the north-south load starts"),
        ),
    ]
}

fn finish_loads(
    loads: Vec<(&'static str, tests::multinode::RunningLoad)>,
) -> Vec<(&'static str, LoadReport)> {
    loads
        .into_iter()
        .map(|(name, load)| (name, load.finish().expect("the load reports")))
        .collect()
}

/// The sources the backends saw, from the reports (`backend saw source` lines), per load:
/// the pod itself through the ClusterIP (no NAT of the source), node A's address through
/// its NodePort (eTP=Cluster masquerades). The client's side (its socket's peer is what it
/// dialled) is checked by the load itself, at every connection.
fn assert_sources(migration: &str, reports: &[(&str, LoadReport)]) {
    let expected = [pod(CLIENT_A), node_address(A)];
    for ((name, report), source) in reports.iter().zip(expected) {
        let wrong: Vec<&String> = report
            .seen
            .iter()
            .filter(|line| !line.ends_with(&format!(" saw {source}")))
            .collect();
        assert!(
            !report.seen.is_empty() && wrong.is_empty(),
            "{migration}: {name}: every backend must see {source}: {:?}",
            report.seen
        );
    }
}
fn assert_clean(migration: &str, reports: &[(&str, LoadReport)]) {
    for (name, report) in reports {
        eprintln!("{migration}: {name}: {}", report.summary());
    }
    let dirty: Vec<String> = reports
        .iter()
        .filter(|(_, r)| !r.clean())
        .map(|(name, r)| format!("{name}: {}\n  failures: {:?}", r.summary(), r.failures))
        .collect();
    assert!(dirty.is_empty(), "{migration}:\n{}", dirty.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_ebpf_drops_nothing() {
    require_root!();
    let mut cluster = cluster([Mode::Ebpf; 3], &[WEB_BACKEND, WEB_BACKEND_C]).await;
    let loads = start_loads(&cluster);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in [A, B, C] {
        let begun = Instant::now();
        cluster.stop_agent_keeping_dataplane(node);
        cluster
            .start_agent(node, Mode::Ebpf)
            .await
            .expect("the new agent starts");
        eprintln!(
            "rolling upgrade: node {node} replaced in {} ms (stop to first sync)",
            begun.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reports = finish_loads(loads);
    assert_clean("rolling upgrade (ebpf)", &reports);
    assert_sources("rolling upgrade (ebpf)", &reports);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_node_gets_no_traffic_after_one_sync() {
    require_root!();
    let mut cluster = cluster(
        [Mode::Ebpf, Mode::Iptables, Mode::Ebpf],
        &[WEB_BACKEND, WEB_BACKEND_C],
    )
    .await;
    let before: Vec<_> = (0..12)
        .filter_map(|_| cluster.probe(pod(CLIENT_A), at(WEB_VIP, 80), "tcp").ok())
        .filter_map(|attempt| attempt.backend)
        .collect();
    assert!(
        before.contains(&at(pod(WEB_BACKEND_C), 9000)),
        "before the drain C's pod is used: {before:?}"
    );
    // The drain: C's endpoint leaves the slice, then C's agent is stopped for good.
    cluster
        .apply(&objects(&[WEB_BACKEND]))
        .await
        .expect("every agent syncs the drain");
    cluster.stop_agent(C);
    for (from, to) in [
        (pod(CLIENT_A), at(WEB_VIP, 80)),
        (EXTERNAL_CLIENT, at(node_address(A), WEB_NODE_PORT)),
        (EXTERNAL_CLIENT, at(node_address(B), WEB_NODE_PORT)),
    ] {
        for _ in 0..10 {
            let attempt = cluster.probe(from, to, "tcp").expect("probe runs");
            assert_eq!(
                attempt.backend,
                Some(at(pod(WEB_BACKEND), 9000)),
                "{from} -> {to} after the drain: {}",
                attempt.describe()
            );
        }
    }
}

/// Node A switched from `first` to `second` and back under load (opened in `first`).
async fn mode_switch(first: Mode, second: Mode) {
    let mut cluster = cluster(
        [first, Mode::Ebpf, Mode::Ebpf],
        &[WEB_BACKEND, WEB_BACKEND_C],
    )
    .await;
    let loads = start_loads(&cluster);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for mode in [second, first] {
        let begun = Instant::now();
        cluster.stop_agent_keeping_dataplane(A);
        cluster
            .start_agent(A, mode)
            .await
            .expect("the agent starts in the new mode");
        eprintln!(
            "mode switch: node A now {mode} after {} ms (stop to first sync)",
            begun.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let reports = finish_loads(loads);
    assert_clean(
        &format!("{first} -> {second} -> {first} on node A"),
        &reports,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_iptables_ebpf_iptables() {
    require_root!();
    mode_switch(Mode::Iptables, Mode::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_ebpf_iptables_ebpf() {
    require_root!();
    mode_switch(Mode::Ebpf, Mode::Iptables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_ebpf_nftables_ebpf() {
    require_root!();
    mode_switch(Mode::Ebpf, Mode::Nftables).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_switch_nftables_ebpf_nftables() {
    require_root!();
    mode_switch(Mode::Nftables, Mode::Ebpf).await;
}

const MAGLEV_VIP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 30);
const MAGLEV_LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 30);
const MAGLEV_BACKENDS: [(usize, u8); 5] = [(A, 20), (A, 21), (B, 20), (B, 21), (C, 20)];

/// An eTP=Cluster LoadBalancer service using Maglev, served by `backends` (UDP 80 to 9000).
fn maglev_objects(backends: &[(usize, u8)]) -> String {
    let endpoints = endpoints_yaml(backends);
    format!(
        r#"- apiVersion: v1
  kind: Service
  metadata:
    name: mag
    namespace: ns1
    annotations: {{kube-proxy-ebpf.io/lb-algorithm: maglev}}
  spec:
    type: LoadBalancer
    clusterIP: {MAGLEV_VIP}
    clusterIPs: [{MAGLEV_VIP}]
    externalTrafficPolicy: Cluster
    ports:
    - {{name: u, port: 80, protocol: UDP, targetPort: 9000, nodePort: 30100}}
  status: {{loadBalancer: {{ingress: [{{ip: {MAGLEV_LB}}}]}}}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: mag-1, namespace: ns1, labels: {{kubernetes.io/service-name: mag}}}}
  addressType: IPv4
  endpoints: [{endpoints}]
  ports:
  - {{name: u, port: 9000, protocol: UDP}}
"#
    )
}

/// Which backend each flow (the external client's source port `port`, UDP to the LB IP)
/// reaches while the router sends it through node `node`.
fn maglev_backends(
    cluster: &Cluster,
    node: usize,
    ports: std::ops::Range<u16>,
) -> Vec<Option<Ipv4Addr>> {
    cluster
        .net
        .route_via(MAGLEV_LB, node)
        .expect("the router's route moves");
    ports
        .map(|port| {
            let attempt = cluster
                .probe_from_port(EXTERNAL_CLIENT, port, at(MAGLEV_LB, 80), "udp")
                .expect("probe runs");
            // SNAT at the entry node (eTP=Cluster), the reply back through it.
            assert_eq!(
                attempt.seen_source,
                Some(node_address(node).into()),
                "port {port} through node {node}: {}",
                attempt.describe()
            );
            assert_eq!(attempt.peer, Some(at(MAGLEV_LB, 80)), "port {port}");
            attempt.backend.and_then(|b| match b.ip() {
                std::net::IpAddr::V4(ip) => Some(ip),
                std::net::IpAddr::V6(_) => None,
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maglev_same_backend_through_every_node_and_little_movement() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let mut cluster = Cluster::build(
        setup(),
        &MAGLEV_BACKENDS,
        &[MAGLEV_LB],
        &["echo/udp/:9000"],
        &maglev_objects(&MAGLEV_BACKENDS),
    )
    .expect("the cluster builds");
    cluster
        .start_agents([Mode::Ebpf; 3])
        .await
        .expect("every agent starts");

    // The same 5-tuples through each of the three nodes.
    let same = 41000..41030;
    let through: Vec<Vec<Option<Ipv4Addr>>> = [A, B, C]
        .into_iter()
        .map(|node| maglev_backends(&cluster, node, same.clone()))
        .collect();
    for (i, port) in same.clone().enumerate() {
        let seen: Vec<_> = through.iter().map(|b| b[i]).collect();
        assert!(
            seen[0].is_some() && seen.iter().all(|b| *b == seen[0]),
            "source port {port}: backends through nodes A, B, C: {seen:?}"
        );
    }
    let used: std::collections::BTreeSet<_> = through[0].iter().flatten().collect();
    assert!(
        used.len() >= 3,
        "30 flows spread over the backends: {used:?}"
    );

    // New flows: their backends through B, then (after one of five backends goes) through
    // C, which has never seen them.
    let fresh = 42000..42100;
    let before = maglev_backends(&cluster, B, fresh.clone());
    let removed = pod(MAGLEV_BACKENDS[4]);
    cluster
        .apply(&maglev_objects(&MAGLEV_BACKENDS[..4]))
        .await
        .expect("every agent syncs the removal");
    let after = maglev_backends(&cluster, C, fresh.clone());
    let on_removed = before.iter().filter(|b| **b == Some(removed)).count();
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    let moved_elsewhere = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b != a && **b != Some(removed))
        .count();
    eprintln!(
        "maglev: removing 1 of 5 backends moved {moved} of {} flows: {on_removed} were on it, {moved_elsewhere} others",
        fresh.len()
    );
    assert!(
        after.iter().all(|b| b.is_some() && *b != Some(removed)),
        "{after:?}"
    );
    assert!(
        on_removed > 0,
        "some flows used the removed backend: {before:?}"
    );
    // Maglev's promise: about 1/N moves. Every flow of the removed backend must move; of the
    // others only a few may (the table's disruption is small, not zero).
    assert!(
        moved_elsewhere * 10 <= fresh.len(),
        "{moved_elsewhere} of {} flows moved between backends that stayed",
        fresh.len()
    );
}
