// SPDX-License-Identifier: Apache-2.0
//! Bad input, one case per test, each asserting what the conversion makes of it.
//!
//! Upstream kube-proxy (pkg/proxy servicechangetracker.go, endpointslicecache.go) trusts
//! the API server's validation and has explicit handling only for a few cases: it parses
//! addresses with `ParseIPSloppy` (leading zeros are decimal; the canonical form is what
//! is used), skips malformed `externalIPs` / `loadBalancerSourceRanges` / ingress IPs with
//! a log line, skips EndpointSlice ports without a name or number and endpoints without
//! addresses, merges slice ports of the same name, and ignores (with a log line) slices
//! without the `kubernetes.io/service-name` label. Those are followed exactly. Everything
//! else here the API server refuses; upstream's result for it is undefined (an endpoint
//! "<nil>:80", a rule iptables-restore rejects, failing the whole sync), so the object is
//! refused whole with one reason, and every other object keeps syncing.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};

use crate::k8s::convert::{endpoint_slice_info, service_ports};
use crate::k8s::fixtures::{ServiceBuilder, mk_endpoint, mk_endpointslice, mk_service};
use crate::model::{IpFamily, NamespacedName, ObjectKind, Protocol, SlicePort};

fn svc() -> ServiceBuilder {
    mk_service("ns1", "svc1").cluster_ip("172.30.0.10")
}

/// The refusal reason, after checking it names the object.
fn refused(svc: &Service, family: IpFamily) -> String {
    let err = service_ports(svc, family).expect_err("refused");
    assert_eq!(err.kind, ObjectKind::Service);
    assert_eq!((err.namespace.as_str(), err.name.as_str()), ("ns1", "svc1"));
    err.reason
}

fn slice_refused(slice: &EndpointSlice) -> String {
    let err = endpoint_slice_info(slice).expect_err("refused");
    assert_eq!(err.kind, ObjectKind::EndpointSlice);
    assert_eq!(err.namespace, "ns1");
    err.reason
}

fn v4_slice() -> crate::k8s::fixtures::EndpointSliceBuilder {
    mk_endpointslice("ns1", "svc1-a", "svc1", "IPv4")
}

// ---- Services: addresses ------------------------------------------------------------

#[test]
fn service_unparsable_cluster_ip_is_refused() {
    for bad in [
        "10.0.0.x",
        "10.0.0.256",
        " 10.0.0.1",
        "10.0.0.1/32",
        "fd00::g",
    ] {
        let svc = mk_service("ns1", "svc1")
            .cluster_ip(bad)
            .port("p", 80, "TCP")
            .build();
        let reason = refused(&svc, IpFamily::V4);
        assert!(reason.contains("is not an IP address"), "{bad}: {reason}");
    }
}

#[test]
fn service_cluster_ip_with_leading_zeros_is_normalised() {
    let svc = mk_service("ns1", "svc1")
        .cluster_ip("172.030.000.010")
        .port("p", 80, "TCP")
        .build();
    let ports = service_ports(&svc, IpFamily::V4).unwrap();
    assert_eq!(ports[0].1.cluster_ip.to_string(), "172.30.0.10");
}

#[test]
fn service_non_canonical_ipv6_cluster_ip_is_normalised() {
    let svc = mk_service("ns1", "svc1")
        .cluster_ips(&["FD00:0:0::000A"])
        .ip_families(&["IPv6"])
        .port("p", 80, "TCP")
        .build();
    let ports = service_ports(&svc, IpFamily::V6).unwrap();
    assert_eq!(ports[0].1.cluster_ip.to_string(), "fd00::a");
}

#[test]
fn service_ipv4_mapped_cluster_ip_is_ipv4() {
    // Go's parser returns ::ffff:a.b.c.d as an IPv4 address, and so does ours.
    let svc = mk_service("ns1", "svc1")
        .legacy_cluster_ip("::ffff:172.30.0.10")
        .port("p", 80, "TCP")
        .build();
    let ports = service_ports(&svc, IpFamily::V4).unwrap();
    assert_eq!(ports[0].1.cluster_ip.to_string(), "172.30.0.10");
    assert!(service_ports(&svc, IpFamily::V6).unwrap().is_empty());
}

#[test]
fn service_fullwidth_digits_are_not_an_address() {
    let svc = mk_service("ns1", "svc1")
        .cluster_ip("172.30.0.１０")
        .port("p", 80, "TCP")
        .build();
    assert!(refused(&svc, IpFamily::V4).contains("is not an IP address"));
}

#[test]
fn service_bad_external_ips_are_skipped_and_the_rest_normalised() {
    let svc = svc()
        .port("p", 80, "TCP")
        .external_ips(&["bogus", "", "192.168.001.002", "10.0.0.300", "2001:db8::1"])
        .build();
    let ports = service_ports(&svc, IpFamily::V4).unwrap();
    let ips: Vec<String> = ports[0]
        .1
        .external_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ips, ["192.168.1.2"]);
}

#[test]
fn service_bad_source_ranges_are_skipped_and_the_rest_masked() {
    let svc = svc()
        .type_("LoadBalancer")
        .port("p", 80, "TCP")
        .source_ranges(&["10.0.0.0/33", "nonsense", " 192.168.1.77/24 ", "fd00::/8"])
        .build();
    let ports = service_ports(&svc, IpFamily::V4).unwrap();
    let ranges: Vec<String> = ports[0]
        .1
        .load_balancer_source_ranges
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ranges, ["192.168.1.0/24"]);
}

#[test]
fn service_bad_load_balancer_ingress_ip_is_skipped() {
    let svc = svc()
        .type_("LoadBalancer")
        .port("p", 80, "TCP")
        .lb_ingress("1.2.3.999", None)
        .lb_ingress("1.2.3.004", Some("VIP"))
        .build();
    let ports = service_ports(&svc, IpFamily::V4).unwrap();
    let ips: Vec<String> = ports[0]
        .1
        .load_balancer_ingress
        .iter()
        .map(|ingress| ingress.ip.to_string())
        .collect();
    assert_eq!(ips, ["1.2.3.4"]);
}

// ---- Services: ports ----------------------------------------------------------------

#[test]
fn service_port_zero_is_refused() {
    let reason = refused(&svc().port("p", 0, "TCP").build(), IpFamily::V4);
    assert_eq!(reason, "port \"p\": port 0 is out of range");
}

#[test]
fn service_port_above_65535_is_refused() {
    let reason = refused(&svc().port("p", 65_536, "TCP").build(), IpFamily::V4);
    assert_eq!(reason, "port \"p\": port 65536 is out of range");
}

#[test]
fn service_negative_port_is_refused() {
    let reason = refused(&svc().port("p", -443, "TCP").build(), IpFamily::V4);
    assert_eq!(reason, "port \"p\": port -443 is out of range");
}

#[test]
fn service_node_port_out_of_range_is_refused() {
    let reason = refused(
        &svc().node_port("p", 80, "TCP", 70_000).build(),
        IpFamily::V4,
    );
    assert_eq!(reason, "port \"p\": nodePort 70000 is out of range");
}

#[test]
fn service_node_port_zero_means_none() {
    let svc = svc().type_("NodePort").node_port("p", 80, "TCP", 0).build();
    assert_eq!(
        service_ports(&svc, IpFamily::V4).unwrap()[0].1.node_port,
        None
    );
}

#[test]
fn service_duplicate_port_name_is_refused() {
    let svc = svc().port("p", 80, "TCP").port("p", 81, "UDP").build();
    assert_eq!(
        refused(&svc, IpFamily::V4),
        "duplicate port name \"p\"".to_owned()
    );
}

#[test]
fn service_duplicate_port_and_protocol_is_refused() {
    let svc = svc().port("a", 80, "TCP").port("b", 80, "TCP").build();
    assert_eq!(
        refused(&svc, IpFamily::V4),
        "port \"b\": duplicate port 80/TCP"
    );
}

#[test]
fn service_same_port_with_two_protocols_is_two_ports() {
    let svc = svc()
        .port("dns", 53, "UDP")
        .port("dns-tcp", 53, "TCP")
        .build();
    let mut ports: Vec<(String, u16, Protocol)> = service_ports(&svc, IpFamily::V4)
        .unwrap()
        .into_iter()
        .map(|(name, port)| (name.port_name.to_string(), port.port, port.protocol))
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            ("dns".to_owned(), 53, Protocol::Udp),
            ("dns-tcp".to_owned(), 53, Protocol::Tcp)
        ]
    );
}

#[test]
fn service_duplicate_node_port_is_refused() {
    let svc = svc()
        .type_("NodePort")
        .node_port("a", 80, "TCP", 30_080)
        .node_port("b", 81, "TCP", 30_080)
        .build();
    assert_eq!(
        refused(&svc, IpFamily::V4),
        "port \"b\": duplicate nodePort 30080/TCP"
    );
}

// ---- Services: protocols and families -----------------------------------------------

#[test]
fn service_unknown_protocol_is_refused() {
    for bad in ["tcp", "ICMP", "HTTP", ""] {
        let reason = refused(&svc().port("p", 80, bad).build(), IpFamily::V4);
        assert_eq!(reason, format!("port \"p\": unknown protocol {bad:?}"));
    }
}

#[test]
fn service_cluster_ip_of_the_wrong_family_is_refused() {
    let svc = mk_service("ns1", "svc1")
        .cluster_ips(&["172.30.0.10"])
        .ip_families(&["IPv6"])
        .port("p", 80, "TCP")
        .build();
    // Refused in both families' trackers: the object itself is inconsistent.
    for family in [IpFamily::V4, IpFamily::V6] {
        assert_eq!(
            refused(&svc, family),
            "clusterIPs[0] 172.30.0.10 is not of family IPv6"
        );
    }
}

#[test]
fn service_dual_stack_with_two_addresses_of_one_family_is_refused() {
    let svc = mk_service("ns1", "svc1")
        .cluster_ips(&["172.30.0.10", "172.30.0.11"])
        .ip_families(&["IPv4", "IPv6"])
        .port("p", 80, "TCP")
        .build();
    assert_eq!(
        refused(&svc, IpFamily::V4),
        "clusterIPs[1] 172.30.0.11 is not of family IPv6"
    );
}

#[test]
fn service_cluster_ip_differing_from_cluster_ips_0_is_refused() {
    let svc = mk_service("ns1", "svc1")
        .cluster_ips(&["172.30.0.10"])
        .with(|s| s.spec.as_mut().unwrap().cluster_ip = Some("172.30.0.11".into()))
        .port("p", 80, "TCP")
        .build();
    assert_eq!(
        refused(&svc, IpFamily::V4),
        "clusterIP \"172.30.0.11\" is not clusterIPs[0] \"172.30.0.10\""
    );
}

#[test]
fn service_single_stack_of_the_other_family_has_no_ports_here() {
    // Not an error: the IPv4 proxier simply has nothing to do for an IPv6 service.
    let svc = mk_service("ns1", "svc1")
        .cluster_ips(&["fd00::10"])
        .ip_families(&["IPv6"])
        .port("p", 80, "TCP")
        .build();
    assert_eq!(service_ports(&svc, IpFamily::V4), Ok(vec![]));
    assert_eq!(service_ports(&svc, IpFamily::V6).unwrap().len(), 1);
}

#[test]
fn service_unknown_ip_family_is_refused() {
    let svc = svc().ip_families(&["IPv5"]).port("p", 80, "TCP").build();
    assert_eq!(
        refused(&svc, IpFamily::V4),
        "unknown ipFamilies entry \"IPv5\""
    );
}

// ---- Services: names and metadata ---------------------------------------------------

#[test]
fn service_unicode_names_are_kept_verbatim() {
    let svc = mk_service("ns-ü", "wéb-☃")
        .cluster_ip("172.30.0.10")
        .port("ℌttp", 80, "TCP")
        .build();
    let ports = service_ports(&svc, IpFamily::V4).unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].0.service, NamespacedName::new("ns-ü", "wéb-☃"));
    assert_eq!(&*ports[0].0.port_name, "ℌttp");
    assert_eq!(ports[0].0.to_string(), "ns-ü/wéb-☃:ℌttp");
}

#[test]
fn service_huge_annotations_change_nothing() {
    let plain = svc().port("p", 80, "TCP").build();
    let annotated = svc()
        .port("p", 80, "TCP")
        .annotation("example.com/blob", &"a".repeat(1 << 20))
        .annotation("kubectl.kubernetes.io/last-applied-configuration", "{☃}")
        .build();
    assert_eq!(
        service_ports(&annotated, IpFamily::V4),
        service_ports(&plain, IpFamily::V4)
    );
}

#[test]
fn service_huge_bad_value_gives_a_short_reason() {
    let huge = format!("10.0.0.{}", "9".repeat(100_000));
    let svc = mk_service("ns1", "svc1")
        .cluster_ip(&huge)
        .port("p", 80, "TCP")
        .build();
    let reason = refused(&svc, IpFamily::V4);
    assert!(reason.len() < 200, "{} bytes", reason.len());
    assert!(reason.contains("(100007 bytes)"), "{reason}");
}

// ---- EndpointSlices -----------------------------------------------------------------

#[test]
fn slice_unparsable_address_is_refused() {
    let slice = v4_slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .endpoint(mk_endpoint("10.0.0.256"))
        .build();
    assert_eq!(
        slice_refused(&slice),
        "endpoint address \"10.0.0.256\" is not an IP address"
    );
}

#[test]
fn slice_non_canonical_addresses_are_normalised() {
    let slice = v4_slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("010.000.001.001"))
        .endpoint(mk_endpoint("::ffff:10.0.1.2"))
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    let ips: Vec<String> = info.endpoints.iter().map(|e| e.ip.to_string()).collect();
    assert_eq!(ips, ["10.0.1.1", "10.0.1.2"]);

    let v6 = mk_endpointslice("ns1", "svc1-b", "svc1", "IPv6")
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("FD00:0000::0001"))
        .build();
    let info = endpoint_slice_info(&v6).unwrap().unwrap();
    assert_eq!(info.endpoints[0].ip.to_string(), "fd00::1");
}

#[test]
fn slice_address_of_the_other_family_is_refused() {
    let slice = v4_slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .endpoint(mk_endpoint("fd00::1"))
        .build();
    assert_eq!(
        slice_refused(&slice),
        "endpoint address fd00::1 is not of addressType IPv4"
    );
}

#[test]
fn slice_port_out_of_range_is_refused() {
    for (bad, text) in [(65_536, "65536"), (-1, "-1")] {
        let slice = v4_slice().port("http", bad, "TCP").build();
        assert_eq!(
            slice_refused(&slice),
            format!("port \"http\": {text} is out of range")
        );
    }
}

#[test]
fn slice_ports_without_number_or_name_are_skipped() {
    let slice = v4_slice()
        .port("zero", 0, "TCP")
        .port("http", 80, "TCP")
        .with(|s| {
            s.ports.as_mut().unwrap().push(EndpointPort {
                name: None,
                port: Some(81),
                protocol: Some("TCP".into()),
                app_protocol: None,
            })
        })
        .endpoint(mk_endpoint("10.0.0.1"))
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    assert_eq!(
        info.ports,
        [SlicePort {
            name: "http".into(),
            port: 80,
            protocol: Protocol::Tcp
        }]
    );
}

#[test]
fn slice_unknown_protocol_is_refused() {
    let slice = v4_slice().port("http", 80, "QUIC").build();
    assert_eq!(
        slice_refused(&slice),
        "port \"http\": unknown protocol \"QUIC\""
    );
}

#[test]
fn slice_duplicate_port_names_are_both_kept() {
    // Upstream merges ports of one name (their endpoints join one service port); the cache
    // does the same (see the model's bad-input tests), so conversion keeps both.
    let slice = v4_slice()
        .port("http", 80, "TCP")
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    let numbers: Vec<u16> = info.ports.iter().map(|p| p.port).collect();
    assert_eq!(numbers, [80, 8080]);
}

#[test]
fn slice_without_service_name_label_is_ignored() {
    for labels in [None, Some(("kubernetes.io/service-name", ""))] {
        let mut builder = v4_slice()
            .port("http", 80, "TCP")
            .endpoint(mk_endpoint("10.0.0.1"));
        builder = match labels {
            None => builder.with(|s| s.metadata.labels = None),
            Some((key, value)) => builder.label(key, value),
        };
        assert_eq!(endpoint_slice_info(&builder.build()), Ok(None));
    }
}

#[test]
fn slice_unicode_names_are_kept_verbatim() {
    let slice = mk_endpointslice("ns-ü", "wéb-☃-x", "wéb-☃", "IPv4")
        .port("ℌttp", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1").node("nöde-1"))
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    assert_eq!(info.service, NamespacedName::new("ns-ü", "wéb-☃"));
    assert_eq!(info.slice_name, "wéb-☃-x");
    assert_eq!(&*info.ports[0].name, "ℌttp");
    assert_eq!(info.endpoints[0].node_name.as_deref(), Some("nöde-1"));
}

#[test]
fn slice_huge_annotations_change_nothing() {
    let plain = v4_slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .build();
    let annotated = v4_slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .annotation("example.com/blob", &"a".repeat(1 << 20))
        .annotation(
            "endpoints.kubernetes.io/last-change-trigger-time",
            &"9".repeat(1 << 16),
        )
        .build();
    let info = endpoint_slice_info(&annotated).unwrap().unwrap();
    assert_eq!(info.last_change_trigger_time, None);
    assert_eq!(Some(info), endpoint_slice_info(&plain).unwrap());
}

#[test]
fn slice_with_10000_endpoints_converts_whole() {
    let mut builder = v4_slice().port("http", 8080, "TCP");
    for i in 0..10_000u32 {
        let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 0xff, i & 0xff);
        builder = builder.endpoint(mk_endpoint(&ip).node(&format!("node-{}", i % 100)));
    }
    let slice = builder.build();
    let started = std::time::Instant::now();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    let took = started.elapsed();
    assert_eq!(info.endpoints.len(), 10_000);
    assert_eq!(info.endpoints[9_999].ip.to_string(), "10.0.39.15");
    // Linear work: far below a second even unoptimised on a busy machine.
    assert!(took.as_secs() < 5, "{took:?}");
}
