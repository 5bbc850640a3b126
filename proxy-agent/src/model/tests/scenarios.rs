// SPDX-License-Identifier: Apache-2.0
//! The endpoint choices stated by the behaviour scenarios (shared/scenarios: m1-m10,
//! i1-terminating-etp-local, h1-internal-traffic-policy, f1-etp-local), checked on the
//! model: objects (YAML, as in the scenario files) -> trackers -> maps ->
//! `categorize_endpoints` -> which set a flow uses.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::port_name;
use crate::k8s::convert::{ClusterObject, parse_objects};
use crate::model::{
    EndpointsChangeTracker, EndpointsMap, IpFamily, NamespacedName, Protocol, ServiceChangeTracker,
    ServicePortMap, ServicePortName, categorize_endpoints,
};

const NODE: &str = "test-node";

#[derive(Clone, Copy, Debug)]
enum Flow {
    /// A pod on this node to the ClusterIP: the internal-policy set.
    PodToClusterIp,
    /// A pod on this node to an external IP, LB IP or node port: short-circuited to the
    /// cluster set whatever the external policy.
    PodToExternal,
    /// An external client to an external IP, LB IP or node port: the external-policy set.
    External,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Backends(BTreeSet<String>),
    Reject,
    Drop,
}

fn backends(addresses: &[&str]) -> Outcome {
    Outcome::Backends(addresses.iter().map(|a| (*a).to_owned()).collect())
}

struct World {
    node_labels: BTreeMap<String, String>,
    service_tracker: ServiceChangeTracker,
    endpoints_tracker: EndpointsChangeTracker,
    services: ServicePortMap,
    endpoints: EndpointsMap,
    service_objects: HashMap<NamespacedName, Service>,
    slice_objects: HashMap<NamespacedName, EndpointSlice>,
}

impl World {
    fn new() -> Self {
        Self {
            node_labels: BTreeMap::new(),
            service_tracker: ServiceChangeTracker::new(IpFamily::V4),
            endpoints_tracker: EndpointsChangeTracker::new(IpFamily::V4, NODE),
            services: ServicePortMap::new(),
            endpoints: EndpointsMap::new(),
            service_objects: HashMap::new(),
            slice_objects: HashMap::new(),
        }
    }

    /// Adds or replaces the objects, then syncs.
    fn load(&mut self, yaml: &str) {
        for object in parse_objects(yaml).unwrap() {
            let name = object.name();
            match object {
                ClusterObject::Node(node) if name.name() == NODE => {
                    self.node_labels = node.metadata.labels.unwrap_or_default();
                }
                ClusterObject::Service(svc) => {
                    let previous = self.service_objects.get(&name);
                    self.service_tracker.update(previous, Some(&svc));
                    self.service_objects.insert(name, svc);
                }
                ClusterObject::EndpointSlice(slice) => {
                    self.endpoints_tracker.endpoint_slice_update(&slice, false);
                    self.slice_objects.insert(name, slice);
                }
                _ => {}
            }
        }
        self.sync();
    }

    fn delete_slice(&mut self, namespace: &str, name: &str) {
        let slice = self
            .slice_objects
            .remove(&NamespacedName::new(namespace, name))
            .unwrap();
        assert!(self.endpoints_tracker.endpoint_slice_update(&slice, true));
        self.sync();
    }

    fn sync(&mut self) {
        self.services.apply(&mut self.service_tracker);
        self.endpoints.apply(&mut self.endpoints_tracker);
        assert!(self.service_tracker.take_rejected().is_empty());
        assert!(self.endpoints_tracker.take_rejected().is_empty());
    }

    fn outcome(&self, port: &ServicePortName, flow: Flow) -> Outcome {
        let svc = &self.services[port];
        let endpoints = self
            .endpoints
            .get(port)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let sets = categorize_endpoints(endpoints, svc, NODE, &self.node_labels);
        let chosen = match flow {
            Flow::PodToClusterIp if svc.internal_policy_local => &sets.local,
            Flow::External if svc.external_policy_local => &sets.local,
            _ => &sets.cluster,
        };
        if !chosen.is_empty() {
            Outcome::Backends(chosen.iter().map(|e| e.to_string()).collect())
        } else if sets.has_any_endpoints {
            Outcome::Drop
        } else {
            Outcome::Reject
        }
    }
}

fn node_yaml(zone: Option<&str>) -> String {
    let zone = zone.map_or(String::new(), |z| {
        format!(", topology.kubernetes.io/zone: '{z}'")
    });
    format!(
        "- apiVersion: v1
  kind: Node
  metadata: {{name: test-node, labels: {{kubernetes.io/hostname: test-node{zone}}}}}
  spec: {{podCIDR: 10.0.0.0/8, podCIDRs: [10.0.0.0/8]}}
"
    )
}

/// svc1/ns1 at 172.30.0.41 with port p80; `spec_extra` adds spec fields, `annotation` the
/// topology-aware-hints annotation.
fn topology_service_yaml(annotation: Option<&str>, spec_extra: &str) -> String {
    let annotations = annotation.map_or(String::new(), |a| {
        format!(", annotations: {{service.kubernetes.io/topology-aware-hints: {a}}}")
    });
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1{annotations}}}
  spec:
    clusterIP: 172.30.0.41
    clusterIPs: [172.30.0.41]
    ipFamilies: [IPv4]
    ports: [{{name: p80, port: 80, protocol: TCP, targetPort: 80{port_extra}}}]
{spec_extra}",
        port_extra = if spec_extra.contains("NodePort") {
            ", nodePort: 8080"
        } else {
            ""
        },
    )
}

/// (address, nodeName, zone hint)
fn hinted_slice_yaml(endpoints: &[(&str, &str, &str)]) -> String {
    let mut yaml = String::from(
        "- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  ports: [{name: p80, port: 80, protocol: TCP}]
  endpoints:
",
    );
    for (address, node, hint) in endpoints {
        yaml += &format!(
            "  - {{addresses: [{address}], conditions: {{ready: true, serving: true, terminating: false}}, \
             nodeName: {node}, hints: {{forZones: [{{name: {hint}}}]}}}}\n"
        );
    }
    yaml
}

fn p80() -> ServicePortName {
    port_name("ns1", "svc1", "p80", Protocol::Tcp)
}

fn hints_abca() -> String {
    hinted_slice_yaml(&[
        ("10.1.2.3", "node-zone-a", "zone-a"),
        ("10.1.2.4", "node-zone-b", "zone-b"),
        ("10.1.2.5", "node-zone-c", "zone-c"),
        ("10.1.2.6", "node-zone-a", "zone-a"),
    ])
}

#[test]
fn m1_m2_m3_m4_m10_hints_are_honoured_whatever_the_annotation() {
    for annotation in [
        Some("auto"),
        Some("disabled"),
        Some("aUto"),
        Some("Auto"),
        None,
    ] {
        let mut world = World::new();
        world.load(&format!(
            "{}{}{}",
            node_yaml(Some("zone-a")),
            topology_service_yaml(annotation, ""),
            hints_abca()
        ));
        assert_eq!(
            world.outcome(&p80(), Flow::PodToClusterIp),
            backends(&["10.1.2.3:80", "10.1.2.6:80"]),
            "annotation {annotation:?}"
        );
    }
}

fn local_hinted_endpoints() -> String {
    hinted_slice_yaml(&[
        ("10.1.2.3", NODE, "zone-a"),
        ("10.1.2.4", NODE, "zone-b"),
        ("10.1.2.5", "node-zone-c", "zone-c"),
        ("10.1.2.6", "node-zone-a", "zone-a"),
    ])
}

#[test]
fn m5_topology_filters_the_cluster_set_but_never_the_local_set() {
    let mut world = World::new();
    world.load(&format!(
        "{}{}{}",
        node_yaml(Some("zone-a")),
        topology_service_yaml(
            Some("auto"),
            "    type: NodePort\n    externalTrafficPolicy: Local\n"
        ),
        local_hinted_endpoints()
    ));
    assert_eq!(
        world.outcome(&p80(), Flow::PodToClusterIp),
        backends(&["10.1.2.3:80", "10.1.2.6:80"])
    );
    assert_eq!(
        world.outcome(&p80(), Flow::External),
        backends(&["10.1.2.3:80", "10.1.2.4:80"])
    );
}

#[test]
fn m6_internal_local_ignores_hints_and_node_port_uses_the_zone_set() {
    let mut world = World::new();
    world.load(&format!(
        "{}{}{}",
        node_yaml(Some("zone-a")),
        topology_service_yaml(
            Some("auto"),
            "    type: NodePort\n    externalTrafficPolicy: Cluster\n    internalTrafficPolicy: Local\n"
        ),
        local_hinted_endpoints()
    ));
    assert_eq!(
        world.outcome(&p80(), Flow::PodToClusterIp),
        backends(&["10.1.2.3:80", "10.1.2.4:80"])
    );
    assert_eq!(
        world.outcome(&p80(), Flow::External),
        backends(&["10.1.2.3:80", "10.1.2.6:80"])
    );
}

#[test]
fn m7_m8_m9_hints_that_cannot_match_this_node_are_ignored() {
    for (name, zone) in [
        ("m7 no zone label", None),
        ("m8 empty zone label", Some("")),
        ("m9 other zone", Some("zone-b")),
    ] {
        let mut world = World::new();
        world.load(&format!(
            "{}{}{}",
            node_yaml(zone),
            topology_service_yaml(Some("auto"), ""),
            hinted_slice_yaml(&[("10.1.2.3", "node-zone-a", "zone-a")])
        ));
        assert_eq!(
            world.outcome(&p80(), Flow::PodToClusterIp),
            backends(&["10.1.2.3:80"]),
            "{name}"
        );
    }
}

const I1_SERVICE: &str = "
- apiVersion: v1
  kind: Service
  metadata: {name: svc1, namespace: ns1}
  spec:
    type: LoadBalancer
    clusterIP: 172.30.1.1
    clusterIPs: [172.30.1.1]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    ports: [{port: 80, protocol: TCP, targetPort: 80}]
    sessionAffinity: None
    externalTrafficPolicy: Local
    internalTrafficPolicy: Cluster
    healthCheckNodePort: 30000
    allocateLoadBalancerNodePorts: false
  status:
    loadBalancer:
      ingress: [{ip: 1.2.3.4, ipMode: VIP}]
";

/// address, nodeName, ready, serving, terminating
type ConditionedEndpoint<'a> = (&'a str, &'a str, bool, bool, bool);

/// An unnamed-port slice for svc1.
fn condition_slice_yaml(endpoints: &[ConditionedEndpoint<'_>]) -> String {
    let mut yaml = String::from(
        "- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  ports: [{name: '', port: 80, protocol: TCP}]
  endpoints:
",
    );
    for (address, node, ready, serving, terminating) in endpoints {
        yaml += &format!(
            "  - {{addresses: [{address}], nodeName: {node}, \
             conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}}}\n"
        );
    }
    yaml
}

fn unnamed() -> ServicePortName {
    port_name("ns1", "svc1", "", Protocol::Tcp)
}

#[test]
fn i1_terminating_endpoints_with_external_policy_local() {
    let mut world = World::new();
    let lb = unnamed();
    let steps: [(&[ConditionedEndpoint<'_>], Outcome, Outcome); 4] = [
        (
            &[
                ("10.0.1.1", NODE, true, true, false),
                ("10.0.1.2", NODE, true, true, false),
                ("10.0.1.3", NODE, false, true, true),
                ("10.0.1.4", NODE, false, false, true),
                ("10.0.1.5", "node-1", true, true, false),
            ],
            backends(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.5:80"]),
            backends(&["10.0.1.1:80", "10.0.1.2:80"]),
        ),
        (
            &[
                ("10.0.1.2", NODE, false, true, true),
                ("10.0.1.3", NODE, false, true, true),
                ("10.0.1.4", NODE, false, false, true),
                ("10.0.1.5", "node-1", true, true, false),
            ],
            backends(&["10.0.1.5:80"]),
            backends(&["10.0.1.2:80", "10.0.1.3:80"]),
        ),
        (
            &[("10.0.1.5", "node-1", false, true, true)],
            backends(&["10.0.1.5:80"]),
            Outcome::Drop,
        ),
        (
            // The same address twice, local and remote, neither serving.
            &[
                ("10.0.1.5", NODE, false, false, true),
                ("10.0.1.5", "node-1", false, false, true),
            ],
            Outcome::Reject,
            Outcome::Reject,
        ),
    ];
    for (index, (endpoints, pod_to_cluster_ip, external_to_lb)) in steps.into_iter().enumerate() {
        world.load(&format!("{I1_SERVICE}{}", condition_slice_yaml(endpoints)));
        assert_eq!(
            world.outcome(&lb, Flow::PodToClusterIp),
            pod_to_cluster_ip,
            "step {index}"
        );
        assert_eq!(
            world.outcome(&lb, Flow::External),
            external_to_lb,
            "step {index}"
        );
        assert_eq!(world.services[&lb].health_check_node_port, Some(30000));

        world.delete_slice("ns1", "svc1-1");
        assert_eq!(
            world.outcome(&lb, Flow::PodToClusterIp),
            Outcome::Reject,
            "step {index} deleted"
        );
        assert_eq!(
            world.outcome(&lb, Flow::External),
            Outcome::Reject,
            "step {index} deleted"
        );
    }
}

fn h1_service(internal_policy: &str) -> String {
    format!(
        "
- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1}}
  spec:
    type: ClusterIP
    clusterIP: 172.30.1.1
    clusterIPs: [172.30.1.1]
    ipFamilies: [IPv4]
    ports: [{{port: 80, protocol: TCP, targetPort: 80}}]
    internalTrafficPolicy: {internal_policy}
"
    )
}

#[test]
fn h1_internal_traffic_policy() {
    let mut world = World::new();
    let ready = |address, node| (address, node, true, true, false);
    let steps = [
        (
            "Cluster",
            [
                ready("10.0.1.1", NODE),
                ready("10.0.1.2", "node1"),
                ready("10.0.1.3", "node2"),
            ],
            backends(&["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]),
        ),
        (
            "Local",
            [
                ready("10.0.1.1", NODE),
                ready("10.0.1.2", "node1"),
                ready("10.0.1.3", "node2"),
            ],
            backends(&["10.0.1.1:80"]),
        ),
        (
            "Local",
            [
                ready("10.0.1.1", NODE),
                ready("10.0.1.2", NODE),
                ready("10.0.1.3", "node2"),
            ],
            backends(&["10.0.1.1:80", "10.0.1.2:80"]),
        ),
        (
            "Local",
            [
                ready("10.0.1.1", "node0"),
                ready("10.0.1.2", "node1"),
                ready("10.0.1.3", "node2"),
            ],
            Outcome::Drop,
        ),
    ];
    for (index, (policy, endpoints, expected)) in steps.into_iter().enumerate() {
        world.load(&format!(
            "{}{}",
            h1_service(policy),
            condition_slice_yaml(&endpoints)
        ));
        assert_eq!(
            world.outcome(&unnamed(), Flow::PodToClusterIp),
            expected,
            "step {index}"
        );
        world.delete_slice("ns1", "svc1-1");
        assert_eq!(
            world.outcome(&unnamed(), Flow::PodToClusterIp),
            Outcome::Reject
        );
    }
}

const F1: &str = "
- apiVersion: v1
  kind: Service
  metadata: {name: svc1, namespace: ns1}
  spec:
    type: LoadBalancer
    clusterIP: 172.30.0.41
    clusterIPs: [172.30.0.41]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    externalIPs: [192.168.99.11]
    ports: [{name: p80, port: 80, protocol: TCP, targetPort: 80, nodePort: 3001}]
    externalTrafficPolicy: Local
    internalTrafficPolicy: Cluster
    healthCheckNodePort: 30000
  status:
    loadBalancer:
      ingress: [{ip: 1.2.3.4, ipMode: VIP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  endpoints:
  - addresses: [10.180.0.1]
    conditions: {ready: true, serving: true, terminating: false}
  - addresses: [10.180.2.1]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: test-node
  ports: [{name: p80, port: 80, protocol: TCP}]
";

#[test]
fn f1_external_policy_local() {
    let mut world = World::new();
    world.load(F1);
    let both = backends(&["10.180.0.1:80", "10.180.2.1:80"]);
    assert_eq!(world.outcome(&p80(), Flow::PodToClusterIp), both);
    assert_eq!(world.outcome(&p80(), Flow::PodToExternal), both);
    assert_eq!(
        world.outcome(&p80(), Flow::External),
        backends(&["10.180.2.1:80"])
    );
    let svc = &world.services[&p80()];
    assert_eq!(svc.node_port, Some(3001));
    assert_eq!(
        svc.external_ips,
        ["192.168.99.11".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(svc.health_check_node_port, Some(30000));
}
