// SPDX-License-Identifier: Apache-2.0
//! The trace decision against states built the way the agent programs them: model ->
//! desired -> apply into in-memory maps -> decode, so the inputs are the real map layout.

use std::{collections::HashMap, sync::Arc};

use proxy_common::proto;

use super::*;
use crate::{
    k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
    model::{ClusterState, IpFamily, PortRef},
    node::{LocalDetector, NodeAddresses},
    proxier::{
        NodeContext,
        ebpf::{
            apply::ApplyState,
            inspect::live::{LiveAffinity, RawMaps, decode},
            maps::LbMaps,
            node_settings,
        },
    },
};

struct World {
    cluster: ClusterState,
    node: NodeContext,
}

impl World {
    fn new() -> Self {
        Self {
            cluster: ClusterState::new(&[IpFamily::V4], "node-a"),
            node: NodeContext {
                name: "node-a".into(),
                primary_ips: NodeAddresses {
                    v4: Some("192.168.0.2".parse().unwrap()),
                    v6: None,
                },
                host_addresses: vec!["192.168.0.2".parse().unwrap()],
                // clusterCIDR: the default of upstream's test fixtures.
                local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]),
                ..Default::default()
            },
        }
    }

    fn add(&mut self, svc: k8s_openapi::api::core::v1::Service, eps: &[(&str, &str, bool)]) {
        let name = svc.metadata.name.clone().unwrap();
        let ns = svc.metadata.namespace.clone().unwrap();
        let port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].clone();
        self.cluster.service(&Arc::new(svc), false);
        let mut slice = mk_endpointslice(&ns, &format!("{name}-1"), &name, "IPv4").port(
            port.name.as_deref().unwrap_or(""),
            port.port,
            port.protocol.as_deref().unwrap_or("TCP"),
        );
        for (addr, node, ready) in eps {
            let mut ep = mk_endpoint(addr).node(node);
            if !ready {
                ep = ep.conditions(false, true, true);
            }
            slice = slice.endpoint(ep.build());
        }
        self.cluster.endpoint_slice(&slice.build(), false);
    }

    /// Programs the model into in-memory maps and decodes them, as inspect would.
    fn state(&mut self) -> LiveState {
        let changes = self.cluster.apply_pending();
        let (mut maps, _) = LbMaps::in_memory(1024);
        let mut apply = ApplyState::new(1024, 1024);
        apply
            .sync(
                &mut maps,
                self.cluster.families(),
                &self.node,
                &changes.changed,
                true,
            )
            .unwrap();
        let mut names = HashMap::new();
        for (family, svc) in apply.programmed() {
            for (_, id) in apply.frontend_ids(*family, svc) {
                names.insert(
                    (false, id),
                    PortRef {
                        namespace: svc.namespace().to_string(),
                        name: svc.name().to_string(),
                        port_name: "p80".into(),
                    },
                );
            }
        }
        let mut raw = RawMaps {
            snapshot: maps.snapshot().unwrap(),
            names,
            now: 1000,
            ..Default::default()
        };
        raw.config.masq4 = u32::from_ne_bytes([192, 168, 0, 2]);
        raw.config.host_netns_cookie = 4096;
        raw.config.flags = node_settings::config_flags(&self.node);
        raw.local_cidrs = node_settings::local_cidrs(&self.node).into_iter().collect();
        raw.uplinks = vec!["eth0".into()];
        decode(&raw)
    }
}

fn q(from: &str, to: &str, client: ClientKind) -> Question {
    Question {
        from: from.parse().unwrap(),
        to: to.parse().unwrap(),
        proto: proto::TCP,
        client,
    }
}

fn addrs(v: &Verdict) -> Vec<String> {
    let mut a: Vec<String> = v
        .candidates
        .iter()
        .map(|c| SocketAddr::new(c.address, c.port).to_string())
        .collect();
    a.sort();
    a
}

#[test]
fn clusterip_from_a_pod_forwards_to_every_endpoint_without_nat() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", 80, "TCP")
            .build(),
        &[
            ("10.180.0.1", "node-a", true),
            ("10.180.1.1", "node-b", true),
        ],
    );
    let state = w.state();
    let v = trace(&state, &q("10.180.0.2", "172.30.0.41:80", ClientKind::Pod));
    assert_eq!(v.action, Action::Forward);
    assert_eq!(v.decided_by, "socket");
    assert_eq!(addrs(&v), ["10.180.0.1:80", "10.180.1.1:80"]);
    assert!(!v.masquerade);
    assert_eq!(v.backend_sees_source, Some("10.180.0.2".parse().unwrap()));
    let f = v.frontend.as_ref().unwrap();
    assert_eq!(f.kind, FrontendKind::ClusterIp);
    assert_eq!(f.service.as_ref().unwrap().to_string(), "ns1/svc1:p80");
    // Another port of the ClusterIP: rejected; another address: untouched.
    let v = trace(&state, &q("10.180.0.2", "172.30.0.41:81", ClientKind::Pod));
    assert_eq!(v.action, Action::Reject);
    let v = trace(&state, &q("10.180.0.2", "172.30.0.99:80", ClientKind::Pod));
    assert_eq!(v.action, Action::Untouched);
}

#[test]
fn no_endpoints_rejects_and_local_policy_without_local_endpoints_drops() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "empty")
            .cluster_ip("172.30.0.42")
            .port("p80", 80, "TCP")
            .build(),
        &[],
    );
    w.add(
        mk_service("ns1", "itp")
            .cluster_ip("172.30.0.43")
            .port("p80", 80, "TCP")
            .internal_traffic_policy("Local")
            .build(),
        &[("10.180.1.1", "node-b", true)],
    );
    let state = w.state();
    let v = trace(&state, &q("10.180.0.2", "172.30.0.42:80", ClientKind::Pod));
    assert_eq!(v.action, Action::Reject);
    let v = trace(&state, &q("10.180.0.2", "172.30.0.43:80", ClientKind::Pod));
    assert_eq!(v.action, Action::Drop);
    assert!(v.steps.iter().any(|s| s.contains("Local")), "{:?}", v.steps);
}

#[test]
fn nodeport_from_outside_masquerades_for_cluster_and_keeps_the_source_for_local() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "np")
            .cluster_ip("172.30.0.44")
            .type_("NodePort")
            .node_port("p80", 80, "TCP", 3001)
            .build(),
        &[
            ("10.180.0.1", "node-a", true),
            ("10.180.1.1", "node-b", true),
        ],
    );
    w.add(
        mk_service("ns1", "npl")
            .cluster_ip("172.30.0.45")
            .type_("NodePort")
            .node_port("p80", 80, "TCP", 3002)
            .external_traffic_policy("Local")
            .build(),
        &[
            ("10.180.0.3", "node-a", true),
            ("10.180.1.3", "node-b", true),
        ],
    );
    let state = w.state();
    let v = trace(
        &state,
        &q("203.0.113.9", "192.168.0.2:3001", ClientKind::External),
    );
    assert_eq!(v.action, Action::Forward);
    assert_eq!(v.decided_by, "tc");
    assert_eq!(v.frontend.as_ref().unwrap().kind, FrontendKind::NodePort);
    assert_eq!(addrs(&v), ["10.180.0.1:80", "10.180.1.1:80"]);
    assert!(v.masquerade);
    assert_eq!(v.backend_sees_source, Some("192.168.0.2".parse().unwrap()));

    let v = trace(
        &state,
        &q("203.0.113.9", "192.168.0.2:3002", ClientKind::External),
    );
    assert_eq!(addrs(&v), ["10.180.0.3:80"]);
    assert!(!v.masquerade);
    assert_eq!(v.backend_sees_source, Some("203.0.113.9".parse().unwrap()));
    // A pod on this node short-circuits to every endpoint.
    let v = trace(
        &state,
        &q("10.180.0.2", "192.168.0.2:3002", ClientKind::Pod),
    );
    assert_eq!(v.frontend.as_ref().unwrap().scope, "internal");
    assert_eq!(addrs(&v), ["10.180.0.3:80", "10.180.1.3:80"]);
}

#[test]
fn affinity_reports_the_pinned_backend_of_an_external_client() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "aff")
            .cluster_ip("172.30.0.46")
            .type_("NodePort")
            .node_port("p80", 80, "TCP", 3003)
            .session_affinity_client_ip(Some(600))
            .build(),
        &[
            ("10.180.0.1", "node-a", true),
            ("10.180.1.1", "node-b", true),
        ],
    );
    let mut state = w.state();
    let np = state
        .frontends
        .iter()
        .find(|f| f.kind == FrontendKind::NodePort)
        .unwrap()
        .clone();
    state.affinity.push(LiveAffinity {
        client: "203.0.113.9".into(),
        client_address: Some("203.0.113.9".parse().unwrap()),
        netns_cookie: None,
        rev_nat_id: np.rev_nat_id,
        frontend: None,
        service: None,
        backend_id: 0,
        backend: Some("10.180.1.1:80".into()),
        idle_seconds: 5,
    });
    let v = trace(
        &state,
        &q("203.0.113.9", "192.168.0.2:3003", ClientKind::External),
    );
    let aff = v.affinity.unwrap();
    assert_eq!(aff.timeout_seconds, 600);
    assert_eq!(aff.pinned_backend, Some("10.180.1.1:80".parse().unwrap()));
    // Another client has no entry yet.
    let v = trace(
        &state,
        &q("203.0.113.10", "192.168.0.2:3003", ClientKind::External),
    );
    assert_eq!(v.affinity.unwrap().pinned_backend, None);
}

#[test]
fn terminating_fallback_is_explained_and_text_renders() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "term")
            .cluster_ip("172.30.0.47")
            .port("p80", 80, "TCP")
            .build(),
        &[("10.180.0.1", "node-a", false)],
    );
    let state = w.state();
    let v = trace(
        &state,
        &q("192.168.0.2", "172.30.0.47:80", ClientKind::Node),
    );
    assert_eq!(v.action, Action::Forward);
    assert!(v.candidates.iter().all(|c| c.terminating));
    assert!(
        v.steps.iter().any(|s| s.contains("terminating")),
        "{:?}",
        v.steps
    );
    let text = v.to_text();
    assert!(
        text.contains("verdict: FORWARD to one of [10.180.0.1:80]"),
        "{text}"
    );
}

/// A LoadBalancer service with eTP=Local (svc2) and a ClusterIP service (svc1), each with a
/// local and a remote endpoint, as in upstream's TestInternalExternalMasquerade.
fn masquerade_world(configure: impl FnOnce(&mut NodeContext)) -> LiveState {
    let mut w = World::new();
    configure(&mut w.node);
    w.add(
        mk_service("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", 80, "TCP")
            .build(),
        &[
            ("10.180.0.1", "node-a", true),
            ("10.180.1.1", "node-b", true),
        ],
    );
    w.add(
        mk_service("ns2", "svc2")
            .cluster_ip("172.30.0.42")
            .type_("NodePort")
            .node_port("p80", 80, "TCP", 3002)
            .external_traffic_policy("Local")
            .build(),
        &[
            ("10.180.0.2", "node-a", true),
            ("10.180.1.2", "node-b", true),
        ],
    );
    w.state()
}

#[test]
fn clusterip_from_outside_is_masqueraded_by_the_local_traffic_detector() {
    let state = masquerade_world(|_| {});
    let v = trace(
        &state,
        &q("203.0.113.9", "172.30.0.41:80", ClientKind::External),
    );
    assert_eq!(v.action, Action::Forward);
    assert_eq!(v.decided_by, "tc");
    assert_eq!(addrs(&v), ["10.180.0.1:80", "10.180.1.1:80"]);
    assert!(v.masquerade);
    assert_eq!(v.backend_sees_source, Some("192.168.0.2".parse().unwrap()));
    // A source the detector calls local (a pod of another node routed here) keeps its address.
    let v = trace(
        &state,
        &q("10.99.0.9", "172.30.0.41:80", ClientKind::External),
    );
    assert!(!v.masquerade);
    assert_eq!(v.backend_sees_source, Some("10.99.0.9".parse().unwrap()));
    // Pods of this node: socket-level, unmasqueraded.
    let v = trace(&state, &q("10.0.0.2", "172.30.0.41:80", ClientKind::Pod));
    assert_eq!(v.decided_by, "socket");
    assert!(!v.masquerade);
}

#[test]
fn without_a_local_traffic_detector_nothing_to_a_clusterip_is_masqueraded_and_pods_do_not_short_circuit()
 {
    let state = masquerade_world(|n| n.local_detector = LocalDetector::None);
    let v = trace(
        &state,
        &q("203.0.113.9", "172.30.0.41:80", ClientKind::External),
    );
    assert!(!v.masquerade);
    assert_eq!(v.backend_sees_source, Some("203.0.113.9".parse().unwrap()));
    let v = trace(&state, &q("10.0.0.2", "192.168.0.2:3002", ClientKind::Pod));
    assert_eq!(v.frontend.as_ref().unwrap().scope, "external");
    assert_eq!(addrs(&v), ["10.180.0.2:80"]);
    // The node itself still short-circuits.
    let v = trace(
        &state,
        &q("192.168.0.2", "192.168.0.2:3002", ClientKind::Node),
    );
    assert_eq!(addrs(&v), ["10.180.0.2:80", "10.180.1.2:80"]);
}

#[test]
fn masquerade_all_sends_pod_clusterip_connections_through_tc_with_snat() {
    let state = masquerade_world(|n| n.masquerade_all = true);
    let v = trace(&state, &q("10.0.0.2", "172.30.0.41:80", ClientKind::Pod));
    assert_eq!(v.decided_by, "tc");
    assert!(v.masquerade);
    assert_eq!(v.backend_sees_source, Some("192.168.0.2".parse().unwrap()));
    // The eTP=Local short-circuit of a pod is not masqueraded (upstream: masqueradeAll only
    // concerns the ClusterIP rule), so it stays at the socket level.
    let v = trace(&state, &q("10.0.0.2", "192.168.0.2:3002", ClientKind::Pod));
    assert_eq!(v.decided_by, "socket");
    assert!(!v.masquerade);
    assert_eq!(addrs(&v), ["10.180.0.2:80", "10.180.1.2:80"]);
}

#[test]
fn sctp_from_a_pod_is_translated_per_packet_and_its_hairpin_masqueraded() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "sctp")
            .cluster_ip("172.30.0.41")
            .port("p80", 80, "SCTP")
            .build(),
        &[
            ("10.180.0.1", "node-a", true),
            ("10.180.0.2", "node-a", true),
        ],
    );
    let state = w.state();
    let mut question = q("10.180.0.1", "172.30.0.41:80", ClientKind::Pod);
    question.proto = proto::SCTP;
    let v = trace(&state, &question);
    assert_eq!(v.action, Action::Forward);
    assert_eq!(v.decided_by, "tc");
    assert!(
        !v.masquerade,
        "no rule masquerades pod traffic to a ClusterIP"
    );
    // The way to itself is masqueraded (hairpin), the way to the other pod is not.
    let masq: Vec<(String, bool)> = v
        .candidates
        .iter()
        .map(|c| (c.address.to_string(), c.masquerade))
        .collect();
    assert_eq!(
        masq,
        [
            ("10.180.0.1".to_string(), true),
            ("10.180.0.2".to_string(), false)
        ]
    );
    assert!(
        v.steps.iter().any(|s| s.contains("hairpin")),
        "{:?}",
        v.steps
    );
}

#[test]
fn with_socket_lb_limited_to_the_host_a_pods_connection_is_translated_per_packet() {
    let mut w = World::new();
    w.add(
        mk_service("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", 80, "TCP")
            .build(),
        &[("10.180.0.1", "node-a", true)],
    );
    let mut state = w.state();
    state.node.socket_lb_host_namespace_only = true;
    let v = trace(&state, &q("10.0.0.2", "172.30.0.41:80", ClientKind::Pod));
    assert_eq!(v.action, Action::Forward);
    assert_eq!(v.decided_by, "tc");
    assert!(!v.masquerade);
    assert_eq!(addrs(&v), ["10.180.0.1:80"]);
    assert!(
        v.steps
            .iter()
            .any(|s| s.contains("socketLBHostNamespaceOnly")),
        "{:?}",
        v.steps
    );
    // The node's own connections keep the socket-level path.
    let from_node = trace(
        &state,
        &q("192.168.0.2", "172.30.0.41:80", ClientKind::Node),
    );
    assert_eq!(from_node.decided_by, "socket");
}

#[test]
fn a_pods_loopback_is_its_own_even_where_the_node_serves_nodeports_on_loopback() {
    let mut w = World::new();
    w.node.nodeport_addresses = Some(vec!["127.0.0.1".parse().unwrap()]);
    w.node.loopback_nodeport_families = vec![crate::model::IpFamily::V4];
    w.add(
        mk_service("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .type_("NodePort")
            .node_port("p80", 80, "TCP", 30080)
            .build(),
        &[("10.180.0.1", "node-a", true)],
    );
    let state = w.state();
    let from_node = trace(&state, &q("127.0.0.1", "127.0.0.1:30080", ClientKind::Node));
    assert_eq!(from_node.action, Action::Forward);
    let from_pod = trace(&state, &q("10.0.0.2", "127.0.0.1:30080", ClientKind::Pod));
    assert_eq!(from_pod.action, Action::Untouched, "{:?}", from_pod.steps);
}

#[test]
fn with_the_gate_and_no_loopback_listed_loopback_nodeports_are_refused() {
    let mut w = World::new();
    w.node.loopback_nodeports_gate = true;
    w.add(
        mk_service("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .type_("NodePort")
            .node_port("p80", 80, "TCP", 30080)
            .build(),
        &[("10.180.0.1", "node-a", true)],
    );
    let state = w.state();
    for to in ["127.0.0.1:30080", "127.0.0.5:30080"] {
        let v = trace(&state, &q("127.0.0.1", to, ClientKind::Node));
        assert_eq!(v.action, Action::Reject, "{to}: {:?}", v.steps);
    }
    let other_port = trace(&state, &q("127.0.0.1", "127.0.0.1:30081", ClientKind::Node));
    assert_eq!(other_port.action, Action::Untouched);
    let from_pod = trace(&state, &q("10.0.0.2", "127.0.0.1:30080", ClientKind::Pod));
    assert_eq!(from_pod.action, Action::Untouched);
}
