// SPDX-License-Identifier: Apache-2.0
//! The implementation-level IPVS proxier tests of upstream (pkg/proxy/ipvs/proxier_test.go)
//! that `proxy-agent/src/proxier/ipvs/tests` leaves uncovered, restated on the ipvs mode's
//! desired state (`desired::build`, pure, no kernel): the no-local-endpoints counters
//! (TestNoEndpointsMetric), the health-check node port set (TestHealthCheckNodePort,
//! TestHealthCheckNodePortE2E), which node addresses carry NodePorts (TestGetNodeIPs,
//! TestIpIsValidForSet) and the addresses bound to kube-ipvs0 (TestMultiPortServiceBindAddr).
//! Their packet-level content is in tests/scenarios/w*-ipvs-*.yaml.

use std::{collections::BTreeSet, net::IpAddr};

use proxy_agent::{
    model::IpFamily,
    node::local::LocalDetector,
    proxier::{
        FamilyState, NodeContext,
        ipvs::{FamilyDesired, SetEntry, SetKind, build_desired, nodeport_ips},
    },
};
use upstream_support::Cluster;

mod upstream_support;

const NODE: &str = "test-hostname";

fn node() -> NodeContext {
    NodeContext {
        name: NODE.into(),
        host_addresses: vec!["10.0.0.1".parse().expect("address")],
        local_detector: LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().expect("cidr")]),
        ..NodeContext::default()
    }
}

fn build(cluster: &Cluster, node: &NodeContext) -> FamilyDesired {
    build_desired(&cluster.families()[0], node, "")
}

/// svc1/ns1 on 172.20.1.1 port p80 (nodePort 30000), with the given policy lines.
fn service(policies: &str) -> String {
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1}}
  spec:
    clusterIP: 172.20.1.1
    clusterIPs: [172.20.1.1]
    ipFamilies: [IPv4]
    ports: [{{name: p80, port: 80, targetPort: 80, protocol: TCP, nodePort: 30000}}]
{policies}"
    )
}

/// Ready endpoints 10.0.1.1-3 on the given nodes.
fn slice(nodes: &[&str]) -> String {
    let mut yaml = String::from(
        "- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  ports: [{name: p80, port: 80, protocol: TCP}]
  endpoints:
",
    );
    for (i, node) in nodes.iter().enumerate() {
        yaml += &format!(
            "  - {{addresses: [10.0.1.{}], nodeName: {node}, conditions: {{ready: true}}}}\n",
            i + 1
        );
    }
    if nodes.is_empty() {
        yaml = yaml.replace("  endpoints:\n", "  endpoints: []\n");
    }
    yaml
}

#[test]
fn no_local_endpoints_counters() {
    // TestNoEndpointsMetric, every row: (policies, endpoint nodes, internal, external).
    const ITP_LOCAL: &str = "    type: ClusterIP\n    internalTrafficPolicy: Local\n";
    const ETP_LOCAL: &str = "    type: NodePort\n    externalTrafficPolicy: Local\n";
    const BOTH_LOCAL: &str =
        "    type: NodePort\n    internalTrafficPolicy: Local\n    externalTrafficPolicy: Local\n";
    let with_local: &[&str] = &[NODE, "host1", "host2"];
    let without_local: &[&str] = &["host0", "host1", "host2"];
    let rows: [(&str, &str, &[&str], usize, usize); 7] = [
        ("iTP Local, local endpoints", ITP_LOCAL, with_local, 0, 0),
        ("eTP Local, local endpoints", ETP_LOCAL, with_local, 0, 0),
        ("both Local, local endpoints", BOTH_LOCAL, with_local, 0, 0),
        (
            "iTP Local, no local endpoints",
            ITP_LOCAL,
            without_local,
            1,
            0,
        ),
        (
            "eTP Local, no local endpoints",
            ETP_LOCAL,
            without_local,
            0,
            1,
        ),
        (
            "both Local, no local endpoints",
            BOTH_LOCAL,
            without_local,
            1,
            1,
        ),
        ("both Local, no endpoints at all", BOTH_LOCAL, &[], 0, 0),
    ];
    for (name, policies, nodes, internal, external) in rows {
        let mut cluster = Cluster::new(NODE);
        cluster.set(&format!("{}{}", service(policies), slice(nodes)));
        let got = build(&cluster, &node());
        assert_eq!(
            (
                got.no_local_endpoints_internal,
                got.no_local_endpoints_external
            ),
            (internal, external),
            "{name}"
        );
    }
}

fn health_check_ports(desired: &FamilyDesired) -> BTreeSet<String> {
    desired
        .sets
        .get(&SetKind::HealthCheckNodePort)
        .map(|entries| entries.iter().map(SetEntry::to_string).collect())
        .unwrap_or_default()
}

fn lb_local(name: &str, port: u16, health_check_node_port: u16) -> String {
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: ns1}}
  spec:
    type: LoadBalancer
    clusterIP: 172.20.1.{port}
    clusterIPs: [172.20.1.{port}]
    ipFamilies: [IPv4]
    ports: [{{name: p80, port: 80, protocol: TCP, nodePort: {port}}}]
    externalTrafficPolicy: Local
    healthCheckNodePort: {health_check_node_port}
"
    )
}

#[test]
fn the_health_check_node_port_set_follows_the_services() {
    // TestHealthCheckNodePort: one entry per eTP=Local LoadBalancer (upstream's third,
    // eTP=Cluster service with a health-check port cannot exist: the API refuses it).
    let mut cluster = Cluster::new(NODE);
    cluster.set(&format!(
        "{}{}",
        lb_local("valid-svc1", 31, 30000),
        lb_local("valid-svc2", 32, 30001)
    ));
    let want: BTreeSet<String> = ["30000", "30001"].map(String::from).into();
    assert_eq!(health_check_ports(&build(&cluster, &node())), want);

    // TestHealthCheckNodePortE2E: the entry follows the Service's port, and goes with it.
    let mut cluster = Cluster::new(NODE);
    cluster.set(&lb_local("svc1", 31, 30000));
    let want: BTreeSet<String> = ["30000"].map(String::from).into();
    assert_eq!(health_check_ports(&build(&cluster, &node())), want);
    cluster.set(&lb_local("svc1", 31, 30001));
    let want: BTreeSet<String> = ["30001"].map(String::from).into();
    assert_eq!(health_check_ports(&build(&cluster, &node())), want);
    cluster.set("");
    assert!(health_check_ports(&build(&cluster, &node())).is_empty());
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|a| a.parse().expect("address")).collect()
}

#[test]
fn nodeports_go_on_every_node_address_but_loopback_and_ipv6_link_local() {
    // TestGetNodeIPs with TestIpIsValidForSet: with nodePortAddresses unset, IPVS serves
    // NodePorts on every address of the family except loopback and, for IPv6, link-local
    // unicast ones; an IPv4 link-local address (169.254/16) is valid. (The addresses on
    // kube-ipvs0 are never node addresses: crate::node::host_addresses leaves them out.)
    let cluster = Cluster::new(NODE);
    let node = NodeContext {
        host_addresses: ips(&[
            "10.20.30.40",
            "172.17.0.1",
            "127.0.0.1",
            "169.254.0.1",
            "1000::",
            "::1",
            "fe80::200:ff:fe01:1",
        ]),
        ..node()
    };
    let got: BTreeSet<IpAddr> = nodeport_ips(&cluster.families()[0], &node)
        .into_iter()
        .collect();
    let want: BTreeSet<IpAddr> = ips(&["10.20.30.40", "172.17.0.1", "169.254.0.1"])
        .into_iter()
        .collect();
    assert_eq!(got, want, "IPv4 NodePort addresses");

    let v6 = FamilyState::new(IpFamily::V6);
    let got: BTreeSet<IpAddr> = nodeport_ips(&v6, &node).into_iter().collect();
    let want: BTreeSet<IpAddr> = ips(&["1000::"]).into_iter().collect();
    assert_eq!(got, want, "IPv6 NodePort addresses");
}

#[test]
fn a_multi_port_service_binds_its_address_once_until_deleted() {
    // TestMultiPortServiceBindAddr: two ports, one, three (one UDP), deleted.
    let svc = |ports: &str| {
        format!(
            "- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1}}
  spec:
    clusterIP: 172.16.55.4
    clusterIPs: [172.16.55.4]
    ipFamilies: [IPv4]
    ports: [{ports}]
"
        )
    };
    let p1 = "{name: port1, port: 1234, protocol: TCP}";
    let p2 = "{name: port2, port: 1235, protocol: TCP}";
    let p3 = "{name: port3, port: 1236, protocol: UDP}";
    let bound: BTreeSet<IpAddr> = ips(&["172.16.55.4"]).into_iter().collect();
    let mut cluster = Cluster::new(NODE);
    for (step, ports) in [
        ("two ports", format!("{p1}, {p2}")),
        ("one port", p1.to_string()),
        ("three ports", format!("{p1}, {p2}, {p3}")),
    ] {
        cluster.set(&svc(&ports));
        let got = build(&cluster, &node());
        assert_eq!(got.addresses, bound, "{step}");
    }
    cluster.set("");
    assert!(build(&cluster, &node()).addresses.is_empty(), "deleted");
}
