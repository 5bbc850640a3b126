// SPDX-License-Identifier: Apache-2.0
//! Which BPF conntrack entries go: the netfilter reconciler's rule, where every entry is a
//! service flow.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proxy_common::{CtValue, proto};

use super::*;
use crate::k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service};
use crate::model::{EndpointsChangeTracker, ServiceChangeTracker};

const NODE_IP: &str = "192.168.0.2";

fn model(family: IpFamily, services: &[Service], slices: &[EndpointSlice]) -> FamilyState {
    let mut state = FamilyState::new(family);
    let mut service_tracker = ServiceChangeTracker::new(family);
    let mut endpoint_tracker = EndpointsChangeTracker::new(family, "test-node");
    for svc in services {
        service_tracker.update(None, Some(svc));
    }
    for slice in slices {
        endpoint_tracker.endpoint_slice_update(slice, false);
    }
    state.services.apply(&mut service_tracker);
    state.endpoints.apply(&mut endpoint_tracker);
    state
}

/// dns: ClusterIP 172.30.0.10, external IP 192.168.99.22, LB IP 1.2.3.4, NodePort 30053.
fn dns() -> Service {
    mk_service("ns", "dns")
        .type_("LoadBalancer")
        .cluster_ip("172.30.0.10")
        .external_ips(&["192.168.99.22"])
        .node_port("dns", 53, "UDP", 30053)
        .node_port("dns-tcp", 53, "TCP", 30054)
        .lb_ingress("1.2.3.4", None)
        .build()
}

/// (address, ready, serving, terminating) endpoints on port 5353 for UDP and TCP.
fn dns_slice(endpoints: &[(&str, bool, bool, bool)]) -> EndpointSlice {
    let mut slice = mk_endpointslice("ns", "dns-0", "dns", "IPv4")
        .port("dns", 5353, "UDP")
        .port("dns-tcp", 5353, "TCP");
    for (ip, ready, serving, terminating) in endpoints {
        slice = slice.endpoint(mk_endpoint(ip).conditions(*ready, *serving, *terminating));
    }
    slice.build()
}

fn bytes16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut out = [0; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A flow as the tc program records it: ports in network order, IPv4 in the first bytes.
fn flow(frontend: &str, backend: &str) -> CtValue {
    let frontend: SocketAddr = frontend.parse().unwrap();
    let backend: SocketAddr = backend.parse().unwrap();
    CtValue {
        frontend_addr: bytes16(frontend.ip()),
        frontend_port: frontend.port().to_be(),
        backend_addr: bytes16(backend.ip()),
        backend_port: backend.port().to_be(),
        client_addr: bytes16("203.0.113.7".parse().unwrap()),
        client_port: 40000u16.to_be(),
        ..Default::default()
    }
}

fn frontends(state: &FamilyState) -> UdpFrontends {
    UdpFrontends::new(state, std::iter::empty(), &[NODE_IP.parse().unwrap()])
}

#[test]
fn flows_to_serving_backends_stay() {
    let state = model(
        IpFamily::V4,
        &[dns()],
        &[dns_slice(&[
            ("10.180.0.1", true, true, false),
            // Terminating but still serving: its flows stay, as upstream's.
            ("10.180.0.2", false, true, true),
        ])],
    );
    let frontends = frontends(&state);
    for frontend in [
        "172.30.0.10:53",
        "192.168.99.22:53",
        "1.2.3.4:53",
        "192.168.0.2:30053",
    ] {
        for backend in ["10.180.0.1:5353", "10.180.0.2:5353"] {
            assert!(
                !is_stale(
                    &frontends,
                    IpFamily::V4,
                    proto::UDP,
                    &flow(frontend, backend)
                ),
                "{frontend} -> {backend}"
            );
        }
    }
}

#[test]
fn a_backend_that_left_or_stopped_serving_loses_its_flows() {
    let state = model(
        IpFamily::V4,
        &[dns()],
        &[dns_slice(&[
            ("10.180.0.1", true, true, false),
            ("10.180.0.3", false, false, false),
        ])],
    );
    let frontends = frontends(&state);
    for backend in [
        "10.180.0.2:5353", // removed
        "10.180.0.3:5353", // not serving
        "10.180.0.1:53",   // same address, old port
    ] {
        for frontend in ["172.30.0.10:53", "1.2.3.4:53", "192.168.0.2:30053"] {
            assert!(
                is_stale(
                    &frontends,
                    IpFamily::V4,
                    proto::UDP,
                    &flow(frontend, backend)
                ),
                "{frontend} -> {backend}"
            );
        }
    }
}

#[test]
fn without_endpoints_or_without_the_frontend_every_flow_goes() {
    // Scaled to zero: the next datagram must meet the REJECT (or DROP).
    let no_endpoints = model(IpFamily::V4, &[dns()], &[]);
    // Deleted: the map holds only service flows, so an unknown frontend is stale too.
    let deleted = model(IpFamily::V4, &[], &[]);
    for state in [&no_endpoints, &deleted] {
        let frontends = frontends(state);
        for frontend in [
            "172.30.0.10:53",
            "192.168.99.22:53",
            "1.2.3.4:53",
            "192.168.0.2:30053",
        ] {
            assert!(is_stale(
                &frontends,
                IpFamily::V4,
                proto::UDP,
                &flow(frontend, "10.180.0.1:5353")
            ));
        }
    }
}

#[test]
fn only_udp_flows_are_touched() {
    let state = model(IpFamily::V4, &[], &[]);
    let frontends = frontends(&state);
    let gone = flow("172.30.0.10:53", "10.180.0.1:5353");
    assert!(!is_stale(&frontends, IpFamily::V4, proto::TCP, &gone));
    assert!(!is_stale(&frontends, IpFamily::V4, proto::SCTP, &gone));
}

#[test]
fn both_entries_of_a_flow_go_and_ipv6_decodes() {
    let svc = mk_service("ns", "dns6")
        .cluster_ip("fd00:30::10")
        .node_port("dns", 53, "UDP", 30053)
        .build();
    let slice = mk_endpointslice("ns", "dns6-0", "dns6", "IPv6")
        .port("dns", 5353, "UDP")
        .endpoint(mk_endpoint("fd00:10::1").conditions(true, true, false))
        .build();
    let state = model(IpFamily::V6, &[svc], &[slice]);
    let frontends = UdpFrontends::new(
        &state,
        std::iter::empty(),
        &["fd00:168::2".parse().unwrap()],
    );
    let live = flow("[fd00:30::10]:53", "[fd00:10::1]:5353");
    let stale = flow("[fd00:30::10]:53", "[fd00:10::2]:5353");
    let nodeport = flow("[fd00:168::2]:30053", "[fd00:10::1]:5353");
    // Forward and reply keys carry the same value.
    let entries = [
        ("live-forward", proto::UDP, live),
        ("live-reply", proto::UDP, live),
        ("stale-forward", proto::UDP, stale),
        ("stale-reply", proto::UDP, stale),
        ("nodeport-forward", proto::UDP, nodeport),
        ("stale-tcp", proto::TCP, stale),
    ];
    assert_eq!(
        stale_keys(&frontends, IpFamily::V6, entries),
        ["stale-forward", "stale-reply"]
    );
}
