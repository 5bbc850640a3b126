// SPDX-License-Identifier: Apache-2.0
//! Bad input through the change trackers and maps: a refused object contributes nothing,
//! is reported once, leaves every other object's entries alone, and is forgotten when it
//! turns valid or goes away; what upstream normalises or ignores is normalised or ignored
//! here (see k8s/convert/tests/bad_input.rs for the per-case conversion outcomes).

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{nsn, port_name};
use crate::k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service};
use crate::model::{
    EndpointsChangeTracker, EndpointsMap, IpFamily, ObjectKind, Protocol, ServiceChangeTracker,
    ServicePortMap,
};

fn good_service() -> Service {
    mk_service("ns1", "good")
        .cluster_ip("172.30.0.1")
        .port("http", 80, "TCP")
        .build()
}

fn bad_service() -> Service {
    mk_service("ns1", "bad")
        .cluster_ip("172.30.0.2")
        .port("http", 70_000, "TCP")
        .build()
}

fn endpoints_of(map: &EndpointsMap, service: &str, port: &str) -> Vec<String> {
    map.get(&port_name("ns1", service, port, Protocol::Tcp))
        .map(|list| list.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

#[test]
fn refused_service_is_reported_once_and_others_keep_their_ports() {
    let mut tracker = ServiceChangeTracker::new(IpFamily::V4);
    let mut map = ServicePortMap::new();
    let (good, bad) = (good_service(), bad_service());
    tracker.update(None, Some(&good));
    tracker.update(None, Some(&bad));
    map.apply(&mut tracker);
    assert_eq!(map.len(), 1);
    assert!(map.contains_key(&port_name("ns1", "good", "http", Protocol::Tcp)));

    let rejected = tracker.take_rejected();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].kind, ObjectKind::Service);
    assert_eq!(rejected[0].object_name(), nsn("ns1", "bad"));
    assert_eq!(
        rejected[0].reason,
        "port \"http\": port 70000 is out of range"
    );

    // Resyncs and relists resend the object unchanged: no change, no second report.
    assert!(!tracker.update(Some(&bad), Some(&bad)));
    assert!(tracker.take_rejected().is_empty());
    assert_eq!(tracker.rejected_count(), 1);

    // Fixed: it gets its port and is no longer refused.
    let fixed = mk_service("ns1", "bad")
        .cluster_ip("172.30.0.2")
        .port("http", 7000, "TCP")
        .build();
    assert!(tracker.update(Some(&bad), Some(&fixed)));
    map.apply(&mut tracker);
    assert_eq!(map.len(), 2);
    assert_eq!(tracker.rejected_count(), 0);
}

#[test]
fn a_service_turned_invalid_loses_its_ports_and_deleting_it_forgets_it() {
    let mut tracker = ServiceChangeTracker::new(IpFamily::V4);
    let mut map = ServicePortMap::new();
    let before = mk_service("ns1", "bad")
        .cluster_ip("172.30.0.2")
        .port("http", 80, "TCP")
        .build();
    tracker.update(None, Some(&before));
    map.apply(&mut tracker);
    assert_eq!(map.len(), 1);

    let broken = mk_service("ns1", "bad")
        .cluster_ip("172.30.0.2")
        .port("http", 80, "TCP")
        .port("http", 81, "UDP")
        .build();
    tracker.update(Some(&before), Some(&broken));
    map.apply(&mut tracker);
    assert!(map.is_empty(), "an invalid object counts as removed");
    assert_eq!(tracker.take_rejected().len(), 1);

    tracker.update(Some(&broken), None);
    map.apply(&mut tracker);
    assert_eq!(tracker.rejected_count(), 0);
    assert!(map.is_empty());
}

#[test]
fn refused_slice_is_reported_once_and_the_services_other_slices_still_count() {
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-a");
    let mut map = EndpointsMap::new();
    let good = mk_endpointslice("ns1", "web-a", "web", "IPv4")
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .build();
    let mixed = mk_endpointslice("ns1", "web-b", "web", "IPv4")
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.0.2"))
        .endpoint(mk_endpoint("fd00::2"))
        .build();
    tracker.endpoint_slice_update(&good, false);
    tracker.endpoint_slice_update(&mixed, false);
    map.apply(&mut tracker);
    assert_eq!(endpoints_of(&map, "web", "http"), ["10.0.0.1:8080"]);
    let rejected = tracker.take_rejected();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].object_name(), nsn("ns1", "web-b"));

    assert!(!tracker.endpoint_slice_update(&mixed, false));
    assert!(tracker.take_rejected().is_empty());
    // Deleting the refused slice clears it.
    tracker.endpoint_slice_update(&mixed, true);
    assert_eq!(tracker.rejected_count(), 0);
}

#[test]
fn slice_without_service_name_label_is_ignored_not_refused() {
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-a");
    let unlabelled = mk_endpointslice("ns1", "orphan", "web", "IPv4")
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .with(|s| s.metadata.labels = None)
        .build();
    assert!(!tracker.endpoint_slice_update(&unlabelled, false));
    assert_eq!(tracker.pending_count(), 0);
    assert!(tracker.take_rejected().is_empty());
}

#[test]
fn slice_of_an_unknown_address_type_is_ignored_not_refused() {
    // Upstream's tracker drops address types it does not support before anything else.
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-a");
    for address_type in ["IPv5", "FQDN", "ipv4"] {
        let slice = mk_endpointslice("ns1", "web-a", "web", address_type)
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.0.1"))
            .build();
        assert!(
            !tracker.endpoint_slice_update(&slice, false),
            "{address_type}"
        );
    }
    assert_eq!(tracker.pending_count(), 0);
    assert!(tracker.take_rejected().is_empty());
}

#[test]
fn slice_ports_of_one_name_merge_into_one_service_port() {
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-a");
    let mut map = EndpointsMap::new();
    let slice = mk_endpointslice("ns1", "web-a", "web", "IPv4")
        .port("http", 80, "TCP")
        .port("http", 8080, "TCP")
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1"))
        .build();
    tracker.endpoint_slice_update(&slice, false);
    map.apply(&mut tracker);
    assert_eq!(map.len(), 1);
    assert_eq!(
        endpoints_of(&map, "web", "http"),
        ["10.0.0.1:80", "10.0.0.1:8080"]
    );
}

#[test]
fn non_canonical_duplicates_of_one_address_are_one_endpoint() {
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-a");
    let mut map = EndpointsMap::new();
    let slice = mk_endpointslice("ns1", "web-a", "web", "IPv4")
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.8"))
        .endpoint(mk_endpoint("010.000.000.008"))
        .endpoint(mk_endpoint("::ffff:10.0.0.8"))
        .build();
    tracker.endpoint_slice_update(&slice, false);
    map.apply(&mut tracker);
    assert_eq!(endpoints_of(&map, "web", "http"), ["10.0.0.8:80"]);
}

#[test]
fn unicode_names_key_the_model_verbatim() {
    let mut services = ServiceChangeTracker::new(IpFamily::V4);
    let mut service_map = ServicePortMap::new();
    let svc = mk_service("ns1", "wéb-☃")
        .cluster_ip("172.30.0.3")
        .port("ℌttp", 80, "TCP")
        .build();
    services.update(None, Some(&svc));
    service_map.apply(&mut services);
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "nöde");
    let mut map = EndpointsMap::new();
    let slice = mk_endpointslice("ns1", "wéb-☃-1", "wéb-☃", "IPv4")
        .port("ℌttp", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.0.1").node("nöde"))
        .build();
    tracker.endpoint_slice_update(&slice, false);
    map.apply(&mut tracker);
    let name = port_name("ns1", "wéb-☃", "ℌttp", Protocol::Tcp);
    assert!(service_map.contains_key(&name));
    let endpoints = &map[&name];
    assert_eq!(endpoints.len(), 1);
    assert!(endpoints[0].is_local);
}

#[test]
fn ten_thousand_endpoints_in_one_slice_all_reach_the_map() {
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-7");
    let mut map = EndpointsMap::new();
    let slice = big_slice(10_000);
    let started = std::time::Instant::now();
    assert!(tracker.endpoint_slice_update(&slice, false));
    let result = map.apply(&mut tracker);
    let took = started.elapsed();
    assert_eq!(result.updated_services.len(), 1);
    let endpoints = &map[&port_name("ns1", "big", "http", Protocol::Tcp)];
    assert_eq!(endpoints.len(), 10_000);
    assert_eq!(endpoints.iter().filter(|e| e.is_local).count(), 100);
    // Sorted by "ip:port" text, as upstream sorts.
    assert!(
        endpoints
            .windows(2)
            .all(|w| w[0].to_string() < w[1].to_string())
    );
    assert!(took.as_secs() < 10, "{took:?}");

    // An unchanged resend costs no sync; removing one endpoint is one change.
    assert!(!tracker.endpoint_slice_update(&slice, false));
    let smaller = big_slice(9_999);
    assert!(tracker.endpoint_slice_update(&smaller, false));
    map.apply(&mut tracker);
    assert_eq!(
        map[&port_name("ns1", "big", "http", Protocol::Tcp)].len(),
        9_999
    );
}

fn big_slice(count: u32) -> EndpointSlice {
    let mut builder = mk_endpointslice("ns1", "big-1", "big", "IPv4").port("http", 8080, "TCP");
    for i in 0..count {
        let ip = format!("10.1.{}.{}", i >> 8, i & 0xff);
        builder = builder.endpoint(mk_endpoint(&ip).node(&format!("node-{}", i % 100)));
    }
    builder.build()
}

#[test]
fn a_skipped_entry_is_logged_once_per_version_not_again_as_the_previous_one() {
    let captured = crate::telemetry::CapturedLog::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let mut tracker = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let v1 = mk_service("ns1", "svc")
            .cluster_ip("172.30.0.9")
            .port("http", 80, "TCP")
            .external_ips(&["bogus", "192.168.0.9"])
            .build();
        tracker.update(None, Some(&v1));
        map.apply(&mut tracker);
        let v2 = mk_service("ns1", "svc")
            .cluster_ip("172.30.0.9")
            .port("http", 80, "TCP")
            .port("https", 443, "TCP")
            .external_ips(&["bogus", "192.168.0.9"])
            .build();
        tracker.update(Some(&v1), Some(&v2));
        map.apply(&mut tracker);
        assert_eq!(map.len(), 2);
    });
    let text = captured.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("skipping invalid external IP"))
        .collect();
    assert_eq!(lines.len(), 2, "one per version converted: {text}");
    assert!(
        lines
            .iter()
            .all(|line| line.contains("ns1/svc") && line.contains("\"bogus\"")),
        "{lines:?}"
    );
}
