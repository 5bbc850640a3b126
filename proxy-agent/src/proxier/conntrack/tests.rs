// SPDX-License-Identifier: Apache-2.0
//! Which conntrack entries a sync's stale report deletes.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::*;
use crate::model::{
    LoadBalancerIngress, LoadBalancerIpMode, NamespacedName, ServiceEndpoint, ServicePortName,
};
use crate::proxier::StaleConntrack;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn udp_port(name: &str) -> ServicePortName {
    ServicePortName::new(NamespacedName::new("ns", name), "dns", Protocol::Udp)
}

fn udp_service(cluster_ip: &str) -> ServicePort {
    ServicePort {
        cluster_ip: ip(cluster_ip),
        port: 53,
        protocol: Protocol::Udp,
        node_port: Some(30053),
        external_ips: vec![ip("192.168.99.22")],
        load_balancer_ingress: vec![
            LoadBalancerIngress {
                ip: ip("1.2.3.4"),
                ip_mode: LoadBalancerIpMode::Vip,
            },
            LoadBalancerIngress {
                ip: ip("5.6.7.8"),
                ip_mode: LoadBalancerIpMode::Proxy,
            },
        ],
        load_balancer_source_ranges: vec![],
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        session_affinity: None,
    }
}

fn families(services: &[(&str, ServicePort)]) -> Vec<FamilyState> {
    let mut state = FamilyState::new(IpFamily::V4);
    let mut tracker = crate::model::ServiceChangeTracker::new(IpFamily::V4);
    for (name, svc) in services {
        let port = udp_port(name);
        let ports = [(port, Arc::new(svc.clone()))].into_iter().collect();
        tracker.update_ports(port_service(name), || None, ports);
    }
    state.services.apply(&mut tracker);
    vec![state]
}

fn port_service(name: &str) -> NamespacedName {
    NamespacedName::new("ns", name)
}

#[test]
fn a_service_gaining_endpoints_clears_all_its_addresses_and_node_port() {
    let families = families(&[("dns", udp_service("172.30.0.10"))]);
    let stale = StaleConntrack {
        new_services_with_endpoints: vec![udp_port("dns")],
        ..Default::default()
    };
    let filters = plan_udp_cleanup(&stale, &families);
    let expected: BTreeSet<Filter> = [
        Filter::to_ip(ip("172.30.0.10")),
        Filter::to_ip(ip("192.168.99.22")),
        // Only VIP-mode ingress IPs are programmed, so only they can have entries.
        Filter::to_ip(ip("1.2.3.4")),
        Filter::to_port(IpFamily::V4, 30053),
    ]
    .into_iter()
    .collect();
    assert_eq!(filters.into_iter().collect::<BTreeSet<_>>(), expected);
}

#[test]
fn a_deleted_endpoint_clears_only_entries_translated_to_it() {
    let families = families(&[("dns", udp_service("172.30.0.10"))]);
    let endpoint: SocketAddr = "10.180.0.1:53".parse().unwrap();
    let stale = StaleConntrack {
        deleted_udp_endpoints: vec![ServiceEndpoint {
            service_port_name: udp_port("dns"),
            endpoint,
        }],
        deleted_udp_cluster_ips: [ip("172.30.0.99")].into_iter().collect(),
        ..Default::default()
    };
    let filters = plan_udp_cleanup(&stale, &families);
    let ep = ip("10.180.0.1");
    for expected in [
        Filter::nat(ip("172.30.0.10"), ep),
        Filter::nat(ip("192.168.99.22"), ep),
        Filter::nat(ip("1.2.3.4"), ep),
        Filter::port_nat(30053, ep),
        Filter::to_ip(ip("172.30.0.99")),
    ] {
        assert!(filters.contains(&expected), "{expected:?} missing");
    }
    assert_eq!(filters.len(), 5);
}

#[test]
fn endpoints_of_vanished_or_other_family_services_plan_nothing() {
    let families = families(&[]);
    let stale = StaleConntrack {
        deleted_udp_endpoints: vec![ServiceEndpoint {
            service_port_name: udp_port("gone"),
            endpoint: "[fd00::1]:53".parse().unwrap(),
        }],
        new_services_with_endpoints: vec![udp_port("gone")],
        ..Default::default()
    };
    assert!(plan_udp_cleanup(&stale, &families).is_empty());
}

#[test]
fn filters_match_on_original_destination_and_reply_source() {
    let entry = Entry {
        family: IpFamily::V4,
        orig: Tuple {
            src: ip("10.0.0.2"),
            dst: ip("172.30.0.10"),
            protocol: IPPROTO_UDP,
            src_port: 40000,
            dst_port: 53,
        },
        reply: Tuple {
            src: ip("10.180.0.1"),
            dst: ip("10.0.0.2"),
            protocol: IPPROTO_UDP,
            src_port: 53,
            dst_port: 40000,
        },
        zone: 0,
    };
    assert!(Filter::to_ip(ip("172.30.0.10")).matches(&entry));
    assert!(Filter::nat(ip("172.30.0.10"), ip("10.180.0.1")).matches(&entry));
    assert!(!Filter::nat(ip("172.30.0.10"), ip("10.180.0.9")).matches(&entry));
    assert!(Filter::to_port(IpFamily::V4, 53).matches(&entry));
    assert!(!Filter::to_port(IpFamily::V6, 53).matches(&entry));
    let tcp = Filter {
        protocol: IPPROTO_TCP,
        ..Filter::to_ip(ip("172.30.0.10"))
    };
    assert!(!tcp.matches(&entry));
}
