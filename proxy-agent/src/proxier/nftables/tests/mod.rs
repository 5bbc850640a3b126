// SPDX-License-Identifier: Apache-2.0
//! Tests of the nftables groundwork: golden rulesets and partial transactions for every
//! behaviour scenario and a few more (IPv6, ServiceCIDRs, nodePortAddresses), the shape
//! (uniform endpoint choice, set objects independent of the number of services), the
//! written-state bookkeeping, and (as root with `nft`) the kernel accepting the texts.

mod golden;
pub(super) mod kernel;
mod proxier;
mod shape;
mod written;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::model::{
    Endpoint, NamespacedName, Protocol, ServicePort, ServicePortName, SessionAffinity,
};
use crate::node::LocalDetector;
use crate::proxier::NodeContext;

/// A node as the scenarios' (test-node, 192.168.0.2, pods in 10.0.0.0/8).
pub fn node() -> NodeContext {
    NodeContext {
        name: "test-node".into(),
        primary_ips: crate::node::NodeAddresses {
            v4: Some("192.168.0.2".parse().unwrap()),
            v6: Some("fd00:192::2".parse().unwrap()),
        },
        host_addresses: vec!["192.168.0.2".parse().unwrap()],
        local_detector: LocalDetector::Cidrs(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fd00:10::/64".parse().unwrap(),
        ]),
        masquerade_bit: 14,
        labels: BTreeMap::new(),
        ..Default::default()
    }
}

pub fn port_name(ns: &str, name: &str, port: &str) -> ServicePortName {
    ServicePortName::new(NamespacedName::new(ns, name), port, Protocol::Tcp)
}

pub fn cluster_ip(ip: &str, port: u16) -> ServicePort {
    ServicePort::cluster_ip_only(ip.parse().unwrap(), port, Protocol::Tcp)
}

pub fn with_affinity(mut svc: ServicePort) -> ServicePort {
    svc.session_affinity = Some(SessionAffinity {
        timeout_seconds: 10_800,
    });
    svc
}

pub fn endpoint(addr: &str, local: bool) -> Arc<Endpoint> {
    let addr: SocketAddr = addr.parse().unwrap();
    Arc::new(Endpoint {
        ip: addr.ip(),
        port: addr.port(),
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(if local { "test-node" } else { "other" }.into()),
        zone: None,
        hints: None,
        is_local: local,
    })
}

/// `count` endpoints of service `index`, all remote, unique across services.
pub fn endpoints_of(index: u32, count: u32, v6: bool) -> Vec<Arc<Endpoint>> {
    (0..count)
        .map(|e| {
            let n = index * count + e + 1;
            let ip: IpAddr = if v6 {
                format!("fd00:10::{:x}:{:x}", n >> 16, n & 0xffff)
                    .parse()
                    .unwrap()
            } else {
                std::net::Ipv4Addr::from(u32::from_be_bytes([10, 128, 0, 0]) + n).into()
            };
            endpoint(&SocketAddr::new(ip, 8080).to_string(), false)
        })
        .collect()
}

/// `count` services of every kind the ruleset has (ClusterIP, NodePort, LB with source
/// ranges, external IP, eTP/iTP Local, affinity, no endpoints), `endpoints` each.
pub fn mixed_services(
    count: u32,
    endpoints: u32,
    v6: bool,
) -> Vec<(ServicePortName, ServicePort, Vec<Arc<Endpoint>>)> {
    (0..count)
        .map(|i| {
            let name = port_name("fillers", &format!("svc-{i}"), "http");
            let ip = |base: [u8; 2]| -> IpAddr {
                if v6 {
                    format!("fd00:{:x}{:02x}::{:x}", base[0], base[1], i + 1)
                        .parse()
                        .unwrap()
                } else {
                    std::net::Ipv4Addr::from(u32::from_be_bytes([base[0], base[1], 0, 0]) + i + 1)
                        .into()
                }
            };
            let mut svc = cluster_ip(&ip([10, 100]).to_string(), 80);
            let mut eps = endpoints_of(i, endpoints, v6);
            match i % 8 {
                1 => svc.node_port = Some(30000 + (i % 2000) as u16),
                2 => {
                    svc.node_port = Some(30000 + (i % 2000) as u16);
                    svc.load_balancer_ingress = vec![crate::model::LoadBalancerIngress {
                        ip: ip([5, 6]),
                        ip_mode: crate::model::LoadBalancerIpMode::Vip,
                    }];
                    svc.load_balancer_source_ranges = vec![if v6 {
                        "fd00:203::/64".parse().unwrap()
                    } else {
                        "203.0.113.0/25".parse().unwrap()
                    }];
                }
                3 => svc.external_ips = vec![ip([50, 60])],
                4 => {
                    svc.node_port = Some(30000 + (i % 2000) as u16);
                    svc.external_policy_local = true;
                    if let Some(first) = eps.first_mut() {
                        let mut local = (**first).clone();
                        local.is_local = true;
                        *first = Arc::new(local);
                    }
                }
                5 => svc.internal_policy_local = true,
                6 => svc = with_affinity(svc),
                7 => eps.clear(),
                _ => {}
            }
            (name, svc, eps)
        })
        .collect()
}
