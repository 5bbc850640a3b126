// SPDX-License-Identifier: Apache-2.0
//! Upstream's endpoint choice (pkg/proxy/topology.go, the newest version: `CategorizeEndpoints`
//! with `topologyModeFromHints`), restated for the cases neither `tests/topology.rs` nor the
//! scenario files pin down: node hints (trafficDistribution PreferSameNode) next to the
//! traffic policies, hints of endpoints that are not ready, and the serving-terminating
//! fallback, which never applies topology. Objects go the agent's way (YAML as the API serves
//! it -> `ClusterState` -> maps -> `categorize_endpoints`), so hints, conditions and node
//! names are also read from real EndpointSlices here.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::port_name;
use crate::k8s::convert::{ClusterObject, parse_objects};
use crate::model::ClusterState;
use crate::model::{CategorizedEndpoints, IpFamily, Protocol, categorize_endpoints};

const NODE: &str = "test-node";

/// One endpoint of the slice: address, nodeName, conditions, zone hint, node hint.
struct Ep<'a> {
    address: &'a str,
    node: &'a str,
    condition: Condition,
    zone_hint: Option<&'a str>,
    node_hint: Option<&'a str>,
}

#[derive(Clone, Copy)]
enum Condition {
    Ready,
    NotReady,
    ServingTerminating,
}

impl Condition {
    fn yaml(self) -> &'static str {
        match self {
            Condition::Ready => "{ready: true, serving: true, terminating: false}",
            Condition::NotReady => "{ready: false, serving: false, terminating: false}",
            Condition::ServingTerminating => "{ready: false, serving: true, terminating: true}",
        }
    }
}

/// An endpoint hinted for its own node and zone, as the EndpointSlice controller writes
/// them for PreferSameNode.
fn hinted<'a>(address: &'a str, node: &'a str, zone: &'a str) -> Ep<'a> {
    Ep {
        address,
        node,
        condition: Condition::Ready,
        zone_hint: Some(zone),
        node_hint: Some(node),
    }
}

impl Ep<'_> {
    fn condition(mut self, condition: Condition) -> Self {
        self.condition = condition;
        self
    }
    fn without_node_hint(mut self) -> Self {
        self.node_hint = None;
        self
    }
    fn without_zone_hint(mut self) -> Self {
        self.zone_hint = None;
        self
    }
}

/// svc1/ns1 (port p80) with the given spec lines, its slice, and test-node in `zone`.
fn objects(zone: Option<&str>, spec: &str, endpoints: &[Ep<'_>]) -> String {
    let zone_label = zone.map_or(String::new(), |z| {
        format!(", topology.kubernetes.io/zone: '{z}'")
    });
    let mut yaml = format!(
        "- apiVersion: v1
  kind: Node
  metadata: {{name: {NODE}, labels: {{kubernetes.io/hostname: {NODE}{zone_label}}}}}
  spec: {{podCIDR: 10.0.0.0/8, podCIDRs: [10.0.0.0/8]}}
- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1}}
  spec:
    clusterIP: 172.30.0.41
    clusterIPs: [172.30.0.41]
    ipFamilies: [IPv4]
{spec}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: svc1-1, namespace: ns1, labels: {{kubernetes.io/service-name: svc1}}}}
  addressType: IPv4
  ports: [{{name: p80, port: 80, protocol: TCP}}]
  endpoints:
"
    );
    for ep in endpoints {
        let mut hints = Vec::new();
        if let Some(zone) = ep.zone_hint {
            hints.push(format!("forZones: [{{name: {zone}}}]"));
        }
        if let Some(node) = ep.node_hint {
            hints.push(format!("forNodes: [{{name: {node}}}]"));
        }
        let hints = if hints.is_empty() {
            String::new()
        } else {
            format!(", hints: {{{}}}", hints.join(", "))
        };
        yaml += &format!(
            "  - {{addresses: [{}], nodeName: {}, conditions: {}{hints}}}\n",
            ep.address,
            ep.node,
            ep.condition.yaml()
        );
    }
    yaml
}

const CLUSTER_IP: &str = "    type: ClusterIP\n    ports: [{name: p80, port: 80, protocol: TCP}]";
const ETP_LOCAL_NODE_PORT: &str = "    type: NodePort\n    externalTrafficPolicy: Local\n    ports: [{name: p80, port: 80, protocol: TCP, nodePort: 3001}]";
const ITP_LOCAL: &str = "    type: ClusterIP\n    internalTrafficPolicy: Local\n    ports: [{name: p80, port: 80, protocol: TCP}]";

/// The objects through the agent's cluster state, then upstream's categorization.
fn categorize(yaml: &str) -> CategorizedEndpoints {
    let mut cluster = ClusterState::new(&[IpFamily::V4], NODE);
    for object in parse_objects(yaml).expect("test objects decode") {
        match object {
            ClusterObject::Node(node) => {
                cluster.node(&Arc::new(node));
            }
            ClusterObject::Service(service) => {
                cluster.service(&Arc::new(service), false);
            }
            ClusterObject::EndpointSlice(slice) => {
                cluster.endpoint_slice(&slice, false);
            }
            ClusterObject::ServiceCidr(_) => {}
        }
    }
    cluster.apply_pending();
    let family = &cluster.families()[0];
    let port = port_name("ns1", "svc1", "p80", Protocol::Tcp);
    let service = family
        .services
        .get(&port)
        .expect("svc1 p80 is in the model");
    let endpoints = family
        .endpoints
        .get(&port)
        .map(Vec::as_slice)
        .unwrap_or_default();
    categorize_endpoints(endpoints, service, NODE, cluster.node_labels())
}

fn addresses(endpoints: &[Arc<crate::model::Endpoint>]) -> BTreeSet<String> {
    endpoints.iter().map(|e| e.ip.to_string()).collect()
}

fn set(addresses: &[&str]) -> BTreeSet<String> {
    addresses.iter().map(|a| (*a).to_owned()).collect()
}

/// Four endpoints, one per node; test-node's in zone-a.
fn four_nodes<'a>() -> Vec<Ep<'a>> {
    vec![
        hinted("10.1.2.3", NODE, "zone-a"),
        hinted("10.1.2.4", "node-a2", "zone-a"),
        hinted("10.1.2.5", "node-b", "zone-b"),
        hinted("10.1.2.6", "node-c", "zone-c"),
    ]
}

#[test]
fn prefer_same_node_available() {
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &four_nodes()));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.3"]));
    assert!(got.local.is_empty());
    assert_eq!(addresses(&got.all_reachable), set(&["10.1.2.3"]));
    assert!(got.has_any_endpoints);
}

#[test]
fn prefer_same_node_falls_back_to_same_zone_if_no_endpoint_for_node() {
    let mut endpoints = four_nodes();
    endpoints[0] = hinted("10.1.2.3", "node-a1", "zone-a");
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.3", "10.1.2.4"]));
}

#[test]
fn prefer_same_node_ignored_if_some_endpoints_unhinted() {
    let mut endpoints = four_nodes();
    endpoints[3] = hinted("10.1.2.6", "node-c", "zone-c").without_node_hint();
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.3", "10.1.2.4"]));
}

#[test]
fn node_hints_need_no_zone_label_on_the_node() {
    let got = categorize(&objects(None, CLUSTER_IP, &four_nodes()));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.3"]));
}

#[test]
fn an_unready_endpoint_hinted_for_this_node_does_not_count() {
    // Only ready endpoints are inspected: the one hinted for test-node is not ready, so no
    // ready endpoint names this node and the zone hints decide.
    let mut endpoints = four_nodes();
    endpoints[0] = hinted("10.1.2.3", NODE, "zone-a").condition(Condition::NotReady);
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.4"]));
}

#[test]
fn the_local_set_ignores_node_hints_and_all_reachable_merges_both() {
    // eTP=Local: the cluster set follows the node hints, the local set is every local ready
    // endpoint whatever its hints, and all_reachable is their union.
    let endpoints = vec![
        hinted("10.1.2.3", NODE, "zone-a"),
        Ep {
            node_hint: Some("node-a2"),
            ..hinted("10.1.2.7", NODE, "zone-a")
        },
        hinted("10.1.2.4", "node-a2", "zone-a"),
    ];
    let got = categorize(&objects(Some("zone-a"), ETP_LOCAL_NODE_PORT, &endpoints));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.3"]));
    assert_eq!(addresses(&got.local), set(&["10.1.2.3", "10.1.2.7"]));
    assert_eq!(
        addresses(&got.all_reachable),
        set(&["10.1.2.3", "10.1.2.7"])
    );
}

#[test]
fn internal_policy_local_ignores_node_hints() {
    let endpoints = vec![
        Ep {
            node_hint: Some("node-a2"),
            ..hinted("10.1.2.3", NODE, "zone-a")
        },
        hinted("10.1.2.4", "node-a2", "zone-a"),
    ];
    let got = categorize(&objects(Some("zone-a"), ITP_LOCAL, &endpoints));
    assert!(
        got.cluster.is_empty(),
        "an internal-only iTP=Local service has no cluster set"
    );
    assert_eq!(addresses(&got.local), set(&["10.1.2.3"]));
}

#[test]
fn the_serving_terminating_fallback_ignores_topology() {
    // No endpoint is ready: topology is judged on ready endpoints only, so none applies,
    // and the fallback takes every serving-terminating endpoint, hinted for this node,
    // this zone or elsewhere.
    let endpoints: Vec<Ep<'_>> = four_nodes()
        .into_iter()
        .map(|ep| ep.condition(Condition::ServingTerminating))
        .collect();
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert_eq!(
        addresses(&got.cluster),
        set(&["10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"])
    );
    assert!(got.has_any_endpoints);
}

#[test]
fn ready_endpoints_elsewhere_win_over_serving_terminating_ones_hinted_here() {
    // The endpoint hinted for this node is terminating; the ready ones carry hints for
    // other nodes only and zone hints for other zones: no topology applies and the ready
    // endpoints are used, never the terminating one.
    let endpoints = vec![
        hinted("10.1.2.3", NODE, "zone-a").condition(Condition::ServingTerminating),
        hinted("10.1.2.5", "node-b", "zone-b"),
        hinted("10.1.2.6", "node-c", "zone-c"),
    ];
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.5", "10.1.2.6"]));
}

#[test]
fn node_hints_only_and_none_for_this_node_means_no_filtering() {
    let endpoints: Vec<Ep<'_>> = vec![
        hinted("10.1.2.4", "node-a2", "zone-a").without_zone_hint(),
        hinted("10.1.2.5", "node-b", "zone-b").without_zone_hint(),
    ];
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert_eq!(addresses(&got.cluster), set(&["10.1.2.4", "10.1.2.5"]));
}

#[test]
fn no_usable_endpoint_means_reject_whatever_the_hints() {
    let endpoints: Vec<Ep<'_>> = four_nodes()
        .into_iter()
        .map(|ep| ep.condition(Condition::NotReady))
        .collect();
    let got = categorize(&objects(Some("zone-a"), CLUSTER_IP, &endpoints));
    assert!(got.cluster.is_empty());
    assert!(got.all_reachable.is_empty());
    assert!(!got.has_any_endpoints, "nothing usable anywhere: reject");
}
