// SPDX-License-Identifier: Apache-2.0
//! ServiceChangeTracker and ServicePortMap (upstream servicechangetracker_test.go restated).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use super::{nsn, port_name};
use crate::k8s::fixtures::mk_service;
use crate::model::{
    IpFamily, ObjectKind, Protocol, ServiceChangeTracker, ServicePortMap, UpdateServiceMapResult,
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

struct Fake {
    tracker: ServiceChangeTracker,
    map: ServicePortMap,
}

impl Fake {
    fn new() -> Self {
        Self {
            tracker: ServiceChangeTracker::new(IpFamily::V4),
            map: ServicePortMap::new(),
        }
    }

    fn add(&mut self, svc: &Service) -> bool {
        self.tracker.update(None, Some(svc))
    }

    fn apply(&mut self) -> UpdateServiceMapResult {
        self.map.apply(&mut self.tracker)
    }
}

fn cluster_ip_svc() -> Service {
    mk_service("ns2", "cluster-ip")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("port1", 1234, "UDP", 4321)
        .node_port("port2", 1235, "UDP", 5321)
        .build()
}

fn node_port_svc() -> Service {
    mk_service("ns2", "node-port")
        .type_("NodePort")
        .legacy_cluster_ip("172.16.55.10")
        .node_port("port1", 345, "UDP", 678)
        .node_port("port2", 344, "TCP", 677)
        .build()
}

fn load_balancer_svc() -> Service {
    mk_service("ns1", "load-balancer")
        .type_("LoadBalancer")
        .legacy_cluster_ip("172.16.55.11")
        .node_port("foobar", 8675, "UDP", 30061)
        .node_port("baz", 8676, "UDP", 30062)
        .lb_ingress("10.1.2.4", None)
        .build()
}

fn only_local_load_balancer_svc() -> Service {
    mk_service("ns1", "only-local-load-balancer")
        .type_("LoadBalancer")
        .legacy_cluster_ip("172.16.55.12")
        .node_port("foobar2", 8677, "UDP", 30063)
        .node_port("baz", 8678, "UDP", 30064)
        .lb_ingress("10.1.2.3", None)
        .external_traffic_policy("Local")
        .health_check_node_port(345)
        .build()
}

#[test]
fn headless_and_external_name_services_are_ignored() {
    let mut fake = Fake::new();
    let headless = mk_service("ns2", "headless")
        .headless()
        .port("rpc", 1234, "UDP")
        .build();
    let headless_without_port = mk_service("ns2", "headless-without-port")
        .headless()
        .build();
    let external_name = mk_service("ns2", "external-name")
        .legacy_cluster_ip("172.16.55.4")
        .external_name("foo2.bar.com")
        .port("blah", 1235, "UDP")
        .build();
    assert!(!fake.add(&headless));
    assert!(!fake.add(&headless_without_port));
    assert!(!fake.add(&external_name));

    let result = fake.apply();
    assert!(fake.map.is_empty());
    assert!(result.updated_services.is_empty());
    assert!(fake.map.health_check_node_ports().is_empty());
    assert_eq!(fake.tracker.rejected_count(), 0);
}

#[test]
fn services_are_added_and_removed() {
    let mut fake = Fake::new();
    let services = [
        cluster_ip_svc(),
        node_port_svc(),
        load_balancer_svc(),
        only_local_load_balancer_svc(),
    ];
    for svc in &services {
        assert!(fake.add(svc));
    }
    assert_eq!(fake.tracker.pending_count(), 4);

    let result = fake.apply();
    assert_eq!(fake.map.len(), 8);
    assert_eq!(
        result.updated_services,
        HashSet::from([
            nsn("ns2", "cluster-ip"),
            nsn("ns2", "node-port"),
            nsn("ns1", "load-balancer"),
            nsn("ns1", "only-local-load-balancer"),
        ])
    );
    assert!(
        result.replaced_udp_ports.is_empty(),
        "new ports replace nothing"
    );
    assert_eq!(
        fake.map.health_check_node_ports(),
        HashMap::from([(nsn("ns1", "only-local-load-balancer"), 345)])
    );
    assert_eq!(fake.tracker.pending_count(), 0);

    // The cluster-ip service loses both its ports and gains "p2"; the others go away.
    let one_port = mk_service("ns2", "cluster-ip")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("p2", 1235, "UDP", 5321)
        .build();
    fake.tracker.update(Some(&services[0]), Some(&one_port));
    for svc in &services[1..] {
        fake.tracker.update(Some(svc), None);
    }
    let result = fake.apply();
    assert_eq!(
        fake.map.keys().cloned().collect::<Vec<_>>(),
        [port_name("ns2", "cluster-ip", "p2", Protocol::Udp)]
    );
    assert_eq!(result.updated_services.len(), 4);
    assert!(fake.map.health_check_node_ports().is_empty());
    // Every removed UDP port is reported with its last version (the TCP one of
    // node-port is not); the kept "p2" did not exist before.
    let mut replaced: Vec<(IpAddr, u16)> = result
        .replaced_udp_ports
        .iter()
        .map(|port| (port.cluster_ip, port.port))
        .collect();
    replaced.sort();
    assert_eq!(
        replaced,
        [
            (ip("172.16.55.4"), 1234),
            (ip("172.16.55.4"), 1235),
            (ip("172.16.55.10"), 345),
            (ip("172.16.55.11"), 8675),
            (ip("172.16.55.11"), 8676),
            (ip("172.16.55.12"), 8677),
            (ip("172.16.55.12"), 8678),
        ]
    );
}

#[test]
fn removing_only_tcp_ports_reports_no_udp_port() {
    let mut fake = Fake::new();
    let svc = mk_service("ns1", "tcp")
        .cluster_ip("172.16.55.20")
        .port("http", 80, "TCP")
        .build();
    fake.add(&svc);
    fake.apply();
    fake.tracker.update(Some(&svc), None);
    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "tcp")]));
    assert!(result.replaced_udp_ports.is_empty());
    assert!(fake.map.is_empty());
}

#[test]
fn service_updates_change_ports_in_place() {
    let mut fake = Fake::new();
    let v1 = mk_service("ns1", "svc1")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("p1", 1234, "UDP", 4321)
        .node_port("p2", 1235, "TCP", 5321)
        .build();
    let v2 = mk_service("ns1", "svc1")
        .type_("LoadBalancer")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("p1", 1234, "UDP", 4321)
        .node_port("p2", 1235, "TCP", 5321)
        .lb_ingress("10.1.2.3", None)
        .external_traffic_policy("Local")
        .health_check_node_port(345)
        .build();

    fake.add(&v1);
    let result = fake.apply();
    assert_eq!(fake.map.len(), 2);
    assert_eq!(result.updated_services.len(), 1);
    assert!(fake.map.health_check_node_ports().is_empty());
    let v1_p1 = fake.map[&port_name("ns1", "svc1", "p1", Protocol::Udp)].clone();

    assert!(fake.tracker.update(Some(&v1), Some(&v2)));
    let result = fake.apply();
    assert_eq!(fake.map.len(), 2);
    assert_eq!(result.updated_services.len(), 1);
    // The UDP port changed (it gained an LB IP): its previous version is reported, so
    // that frontends it loses can be cleaned; the TCP port is not.
    assert_eq!(
        result
            .replaced_udp_ports
            .iter()
            .map(|port| port.as_ref())
            .collect::<Vec<_>>(),
        [v1_p1.as_ref()]
    );
    assert_eq!(fake.map.health_check_node_ports().len(), 1);
    let p1 = &fake.map[&port_name("ns1", "svc1", "p1", Protocol::Udp)];
    assert!(p1.external_policy_local);
    assert_eq!(
        p1.load_balancer_vips().collect::<Vec<_>>(),
        [ip("10.1.2.3")]
    );

    // No change: nothing to apply.
    assert!(!fake.tracker.update(Some(&v2), Some(&v2)));
    let result = fake.apply();
    assert_eq!(fake.map.len(), 2);
    assert!(result.updated_services.is_empty());

    // Back to ClusterIP: the health check goes.
    fake.tracker.update(Some(&v2), Some(&v1));
    let result = fake.apply();
    assert_eq!(result.updated_services.len(), 1);
    assert!(fake.map.health_check_node_ports().is_empty());
}

#[test]
fn changes_that_cancel_out_leave_nothing_pending() {
    let mut fake = Fake::new();
    let svc = cluster_ip_svc();
    assert!(fake.tracker.update(None, Some(&svc)));
    assert_eq!(
        fake.tracker.pending_changes(),
        HashSet::from([nsn("ns2", "cluster-ip")])
    );
    assert!(!fake.tracker.update(Some(&svc), None));
    assert!(fake.tracker.pending_changes().is_empty());
    assert_eq!(fake.tracker.changes_total(), 2);
    let result = fake.apply();
    assert!(result.updated_services.is_empty());
    assert!(fake.map.is_empty());

    // Change then change back, after an apply.
    fake.add(&svc);
    fake.apply();
    let changed = mk_service("ns2", "cluster-ip")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("port1", 1234, "UDP", 4321)
        .build();
    assert!(fake.tracker.update(Some(&svc), Some(&changed)));
    assert!(!fake.tracker.update(Some(&changed), Some(&svc)));
    assert!(fake.apply().updated_services.is_empty());
    assert_eq!(fake.map.len(), 2);
}

#[test]
fn apply_leaves_unchanged_services_alone() {
    let mut fake = Fake::new();
    fake.add(&cluster_ip_svc());
    fake.add(&node_port_svc());
    fake.apply();
    let before = fake.map[&port_name("ns2", "node-port", "port1", Protocol::Udp)].clone();

    let svc = cluster_ip_svc();
    fake.tracker.update(Some(&svc), None);
    let result = fake.apply();
    assert_eq!(
        result.updated_services,
        HashSet::from([nsn("ns2", "cluster-ip")])
    );
    let after = &fake.map[&port_name("ns2", "node-port", "port1", Protocol::Udp)];
    assert!(
        std::sync::Arc::ptr_eq(&before, after),
        "untouched entries are not rebuilt"
    );
    assert_eq!(fake.map.len(), 2);
}

#[test]
fn an_invalid_service_is_rejected_once_and_others_still_sync() {
    let mut fake = Fake::new();
    let bad = mk_service("ns1", "bad")
        .cluster_ip("172.30.0.300")
        .port("p", 80, "TCP")
        .build();
    let good = mk_service("ns1", "good")
        .cluster_ip("172.30.0.1")
        .port("p", 80, "TCP")
        .build();
    fake.add(&bad);
    fake.add(&good);
    // A resync delivers the same invalid object again.
    fake.tracker.update(Some(&bad), Some(&bad));

    let rejected = fake.tracker.take_rejected();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].kind, ObjectKind::Service);
    assert_eq!(
        (rejected[0].namespace.as_str(), rejected[0].name.as_str()),
        ("ns1", "bad")
    );
    assert!(fake.tracker.take_rejected().is_empty());
    assert_eq!(fake.tracker.rejected_count(), 1);

    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "good")]));
    assert_eq!(fake.map.len(), 1);

    // Fixed: accepted and no longer counted as rejected.
    let fixed = mk_service("ns1", "bad")
        .cluster_ip("172.30.0.3")
        .port("p", 80, "TCP")
        .build();
    fake.tracker.update(Some(&bad), Some(&fixed));
    assert_eq!(fake.tracker.rejected_count(), 0);
    fake.apply();
    assert_eq!(fake.map.len(), 2);

    // Broken again: its ports leave the model, and the refusal is reported anew.
    let broken = mk_service("ns1", "bad")
        .cluster_ip("172.30.0.3")
        .port("p", 80, "QUIC")
        .build();
    fake.tracker.update(Some(&fixed), Some(&broken));
    assert_eq!(fake.tracker.take_rejected().len(), 1);
    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "bad")]));
    assert_eq!(fake.map.len(), 1);

    // Deleted: nothing left to reject.
    fake.tracker.update(Some(&broken), None);
    assert_eq!(fake.tracker.rejected_count(), 0);
}

#[test]
fn each_family_tracker_sees_its_own_cluster_ip() {
    let svc = mk_service("ns1", "dual")
        .cluster_ips(&["172.30.0.10", "fd00::10"])
        .port("dns", 53, "UDP")
        .build();
    for (family, expected) in [
        (IpFamily::V4, ip("172.30.0.10")),
        (IpFamily::V6, ip("fd00::10")),
    ] {
        let mut tracker = ServiceChangeTracker::new(family);
        let mut map = ServicePortMap::new();
        tracker.update(None, Some(&svc));
        map.apply(&mut tracker);
        let port = &map[&port_name("ns1", "dual", "dns", Protocol::Udp)];
        assert_eq!(port.cluster_ip, expected, "{family}");
        assert_eq!(tracker.family(), family);
    }
}

#[test]
fn services_of_another_proxy_are_ignored() {
    let mut fake = Fake::new();
    let svc = mk_service("ns1", "other")
        .cluster_ip("172.30.0.1")
        .port("p", 80, "TCP")
        .label("service.kubernetes.io/service-proxy-name", "other-proxy")
        .build();
    assert!(!fake.add(&svc));
    assert!(fake.apply().updated_services.is_empty());
    assert!(fake.map.is_empty());
}

#[test]
fn ports_of_follows_adds_updates_and_deletes() {
    let mut f = Fake::new();
    let svc = cluster_ip_svc();
    f.add(&svc);
    f.apply();
    let names: Vec<String> = f
        .map
        .ports_of(&nsn("ns2", "cluster-ip"))
        .map(|(name, _)| name.port_name.to_string())
        .collect();
    assert_eq!(names, vec!["port1", "port2"]);
    assert_eq!(f.map.services().count(), 1);

    let fewer = mk_service("ns2", "cluster-ip")
        .legacy_cluster_ip("172.16.55.4")
        .node_port("port2", 1235, "UDP", 5321)
        .build();
    f.tracker.update(Some(&svc), Some(&fewer));
    f.apply();
    assert_eq!(f.map.ports_of(&nsn("ns2", "cluster-ip")).count(), 1);

    f.tracker.update(Some(&fewer), None);
    f.apply();
    assert_eq!(f.map.ports_of(&nsn("ns2", "cluster-ip")).count(), 0);
    assert_eq!(f.map.services().count(), 0);
}
