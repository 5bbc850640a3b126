// SPDX-License-Identifier: Apache-2.0
//! EndpointSlice -> SliceInfo conversion.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointPort;

use crate::k8s::convert::{endpoint_slice_info, endpoint_slice_keys, should_proxy_slice};
use crate::k8s::fixtures::{EndpointSliceBuilder, mk_endpoint, mk_endpointslice};
use crate::model::{
    EndpointHints, HintNames, IpFamily, NamespacedName, ObjectKind, Protocol, SliceEndpoint,
    SlicePort,
};

fn slice() -> EndpointSliceBuilder {
    mk_endpointslice("ns1", "svc1-abc", "svc1", "IPv4")
}

fn names(names: &[&str]) -> Option<HintNames> {
    Some(names.iter().map(|n| Arc::from(*n)).collect())
}

#[test]
fn keys_come_from_the_service_name_label() {
    assert_eq!(
        endpoint_slice_keys(&slice().build()),
        Some((NamespacedName::new("ns1", "svc1"), "svc1-abc".to_owned()))
    );
    let unlabelled = slice().with(|s| s.metadata.labels = None).build();
    assert_eq!(endpoint_slice_keys(&unlabelled), None);
    assert_eq!(endpoint_slice_info(&unlabelled), Ok(None));
    let empty = slice().label("kubernetes.io/service-name", "").build();
    assert_eq!(endpoint_slice_keys(&empty), None);
}

#[test]
fn proxy_selector_mirrors_kube_proxy_informers() {
    assert!(should_proxy_slice(&slice().build()));
    assert!(!should_proxy_slice(
        &slice().label("service.kubernetes.io/headless", "").build()
    ));
    assert!(!should_proxy_slice(
        &slice()
            .label("service.kubernetes.io/service-proxy-name", "x")
            .build()
    ));
}

#[test]
fn endpoints_ports_and_conditions() {
    let slice = slice()
        .port("http", 80, "TCP")
        .port("dns", 53, "UDP")
        .port("sip", 5060, "SCTP")
        .endpoint(
            mk_endpoint("10.180.00.001")
                .node("test-node")
                .zone("zone-a"),
        )
        .endpoint(mk_endpoint("10.180.0.2").no_conditions())
        .endpoint(mk_endpoint("10.180.0.3").conditions(false, true, true))
        .endpoint(
            mk_endpoint("10.180.0.4")
                .conditions(false, false, false)
                .zone_hints(&["zone-a", "zone-b"])
                .node_hints(&["test-node"]),
        )
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    assert_eq!(info.service, NamespacedName::new("ns1", "svc1"));
    assert_eq!(info.slice_name, "svc1-abc");
    assert_eq!(info.address_family, IpFamily::V4);
    assert_eq!(
        info.ports,
        [
            SlicePort {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Tcp
            },
            SlicePort {
                name: "dns".into(),
                port: 53,
                protocol: Protocol::Udp
            },
            SlicePort {
                name: "sip".into(),
                port: 5060,
                protocol: Protocol::Sctp
            },
        ]
    );
    let endpoint = |ip: &str, ready, serving, terminating| SliceEndpoint {
        ip: ip.parse().unwrap(),
        ready,
        serving,
        terminating,
        node_name: None,
        zone: None,
        hints: None,
    };
    assert_eq!(
        info.endpoints,
        [
            SliceEndpoint {
                node_name: Some("test-node".into()),
                zone: Some("zone-a".into()),
                ..endpoint("10.180.0.1", true, true, false)
            },
            // Absent conditions: ready and serving, not terminating.
            endpoint("10.180.0.2", true, true, false),
            endpoint("10.180.0.3", false, true, true),
            SliceEndpoint {
                hints: EndpointHints::new(names(&["zone-a", "zone-b"]), names(&["test-node"])),
                ..endpoint("10.180.0.4", false, false, false)
            },
        ]
    );
    assert_eq!(info.last_change_trigger_time, None);
}

#[test]
fn empty_hint_lists_are_no_hints() {
    let slice = slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1").zone_hints(&[]).node_hints(&[]))
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    // Neither zone nor node hints.
    assert_eq!(info.endpoints[0].hints, None);
}

#[test]
fn unusable_ports_and_endpoints_are_skipped() {
    let slice = slice()
        .port("http", 80, "TCP")
        .with(|s| {
            let ports = s.ports.get_or_insert_with(Vec::new);
            ports.push(EndpointPort {
                name: None,
                port: Some(81),
                protocol: None,
                app_protocol: None,
            });
            ports.push(EndpointPort {
                name: Some("zero".into()),
                port: Some(0),
                protocol: None,
                app_protocol: None,
            });
            ports.push(EndpointPort {
                name: Some("none".into()),
                port: None,
                protocol: None,
                app_protocol: None,
            });
            ports.push(EndpointPort {
                name: Some("".into()),
                port: Some(82),
                protocol: None,
                app_protocol: None,
            });
        })
        .endpoint(mk_endpoint("10.0.0.1"))
        .with(|s| {
            s.endpoints.get_or_insert_with(Vec::new).push(
                k8s_openapi::api::discovery::v1::Endpoint {
                    addresses: vec![],
                    ..Default::default()
                },
            )
        })
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    assert_eq!(
        info.ports,
        [
            SlicePort {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Tcp
            },
            // An absent protocol is TCP, the API default.
            SlicePort {
                name: "".into(),
                port: 82,
                protocol: Protocol::Tcp
            },
        ]
    );
    assert_eq!(info.endpoints.len(), 1);
}

#[test]
fn only_the_first_address_counts() {
    let slice = slice()
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1").with_addresses(&["10.0.0.1", "10.0.0.2"]))
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    assert_eq!(info.endpoints.len(), 1);
    assert_eq!(
        info.endpoints[0].ip,
        "10.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
}

#[test]
fn address_types() {
    let v6 = mk_endpointslice("ns1", "s", "svc1", "IPv6")
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("fd00:0::0001"))
        .build();
    let info = endpoint_slice_info(&v6).unwrap().unwrap();
    assert_eq!(info.address_family, IpFamily::V6);
    assert_eq!(
        info.endpoints[0].ip,
        "fd00::1".parse::<std::net::IpAddr>().unwrap()
    );

    let fqdn = mk_endpointslice("ns1", "s", "svc1", "FQDN")
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("db.example.com"))
        .build();
    assert_eq!(endpoint_slice_info(&fqdn), Ok(None));
}

#[test]
fn trigger_time_annotation() {
    let annotated = slice()
        .annotation(
            "endpoints.kubernetes.io/last-change-trigger-time",
            "2023-11-14T22:13:20.25Z",
        )
        .build();
    let info = endpoint_slice_info(&annotated).unwrap().unwrap();
    assert_eq!(
        info.last_change_trigger_time,
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250))
    );
    let garbage = slice()
        .annotation(
            "endpoints.kubernetes.io/last-change-trigger-time",
            "yesterday",
        )
        .build();
    assert_eq!(
        endpoint_slice_info(&garbage)
            .unwrap()
            .unwrap()
            .last_change_trigger_time,
        None
    );
}

#[test]
fn invalid_slices_are_refused_with_a_reason() {
    let cases = vec![
        (
            "unknown address type",
            mk_endpointslice("ns1", "bad", "svc1", "IPv5").build(),
        ),
        (
            "unparsable address",
            slice().endpoint(mk_endpoint("10.0.0.256")).build(),
        ),
        (
            "address of the other family",
            slice().endpoint(mk_endpoint("fd00::1")).build(),
        ),
        (
            "port out of range",
            slice().port("p", 65_536, "TCP").build(),
        ),
        ("negative port", slice().port("p", -80, "TCP").build()),
        ("unknown protocol", slice().port("p", 80, "HTTP").build()),
    ];
    for (name, slice) in cases {
        let err = endpoint_slice_info(&slice).expect_err(name);
        assert_eq!(err.kind, ObjectKind::EndpointSlice, "{name}");
        assert_eq!(err.namespace, "ns1", "{name}");
        assert!(!err.reason.is_empty(), "{name}");
    }
}

/// What the sources hand the model: the slice converted once, with who it is and whose;
/// a deletion and a slice another proxy claims carry no content, an FQDN slice no family.
#[test]
fn a_slice_record_carries_its_keys_and_content_once() {
    use crate::k8s::convert::{LABEL_SERVICE_PROXY_NAME, slice_record};
    let live = slice()
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.0.1").build());
    let record = slice_record(&live.clone().build(), false);
    assert_eq!(record.object, NamespacedName::new("ns1", "svc1-abc"));
    assert_eq!(record.family, Some(IpFamily::V4));
    assert_eq!(
        record.owner,
        Some((NamespacedName::new("ns1", "svc1"), "svc1-abc".to_owned()))
    );
    assert_eq!(record.info, endpoint_slice_info(&live.clone().build()));
    assert!(matches!(record.info, Ok(Some(_))));

    let gone = slice_record(&live.clone().build(), true);
    assert_eq!((gone.owner, gone.info), (record.owner, Ok(None)));
    let claimed = live.label(LABEL_SERVICE_PROXY_NAME, "other").build();
    assert_eq!(slice_record(&claimed, false).info, Ok(None));
    let fqdn = mk_endpointslice("ns1", "svc1-f", "svc1", "FQDN").build();
    assert_eq!(slice_record(&fqdn, false).family, None);
}
