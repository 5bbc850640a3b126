// SPDX-License-Identifier: Apache-2.0
//! EndpointSlice cache, EndpointsChangeTracker and EndpointsMap (upstream
//! endpointslicecache_test.go and endpoints_test.go restated).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{nsn, port_name};
use crate::k8s::fixtures::{EndpointSliceBuilder, mk_endpoint, mk_endpointslice};
use crate::model::{
    Endpoint, EndpointsChangeTracker, EndpointsMap, IpFamily, ObjectKind, Protocol,
    ServicePortName, SliceEndpoint, UpdateEndpointsMapResult,
};

const HOST: &str = "host1";

struct Fake {
    tracker: EndpointsChangeTracker,
    map: EndpointsMap,
}

impl Fake {
    fn new(node: &str) -> Self {
        Self {
            tracker: EndpointsChangeTracker::new(IpFamily::V4, node),
            map: EndpointsMap::new(),
        }
    }

    fn add(&mut self, slice: &EndpointSlice) -> bool {
        self.tracker.endpoint_slice_update(slice, false)
    }

    fn delete(&mut self, slice: &EndpointSlice) -> bool {
        self.tracker.endpoint_slice_update(slice, true)
    }

    fn apply(&mut self) -> UpdateEndpointsMapResult {
        self.map.apply(&mut self.tracker)
    }

    /// "ip:port" of a port's endpoints, in map order.
    fn endpoints(&self, name: &ServicePortName) -> Vec<String> {
        self.map
            .get(name)
            .map(|list| list.iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }
}

/// Slice `slice` of `svc` in ns1 with endpoints 10.0.<slice>.1..=count on the given nodes
/// (round robin), port "port-0" TCP `port`.
fn generated_slice(svc: &str, slice: u8, count: u8, nodes: &[&str], port: i32) -> EndpointSlice {
    let mut builder =
        mk_endpointslice("ns1", &format!("{svc}-{slice}"), svc, "IPv4").port("port-0", port, "TCP");
    for i in 1..=count {
        let mut endpoint = mk_endpoint(&format!("10.0.{slice}.{i}"));
        if !nodes.is_empty() {
            endpoint = endpoint.node(nodes[usize::from(i) % nodes.len()]);
        }
        builder = builder.endpoint(endpoint);
    }
    builder.build()
}

fn tcp(svc: &str, port: &str) -> ServicePortName {
    port_name("ns1", svc, port, Protocol::Tcp)
}

#[test]
fn one_slice_two_ports() {
    let mut fake = Fake::new(HOST);
    let slice = mk_endpointslice("ns1", "svc1-1", "svc1", "IPv4")
        .port("port-0", 80, "TCP")
        .port("port-1", 443, "TCP")
        .endpoint(mk_endpoint("10.0.1.1").node("host2"))
        .endpoint(mk_endpoint("10.0.1.2").node(HOST))
        .endpoint(mk_endpoint("10.0.1.3").node("host2"))
        .build();
    assert!(fake.add(&slice));
    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "svc1")]));
    assert_eq!(
        fake.endpoints(&tcp("svc1", "port-0")),
        ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]
    );
    assert_eq!(
        fake.endpoints(&tcp("svc1", "port-1")),
        ["10.0.1.1:443", "10.0.1.2:443", "10.0.1.3:443"]
    );
    let local: Vec<String> = fake.map[&tcp("svc1", "port-0")]
        .iter()
        .filter(|e| e.is_local)
        .map(|e| e.to_string())
        .collect();
    assert_eq!(local, ["10.0.1.2:80"]);
    let first = &fake.map[&tcp("svc1", "port-0")][0];
    assert!(first.ready && first.serving && !first.terminating);
    assert_eq!(first.node_name.as_deref(), Some("host2"));
}

#[test]
fn endpoints_of_all_slices_are_merged_and_duplicates_removed() {
    let mut fake = Fake::new(HOST);
    fake.add(&generated_slice("svc1", 1, 3, &[], 80));
    // A second slice repeating 10.0.1.1 and 10.0.1.2 (an endpoint moving between slices).
    fake.add(
        &mk_endpointslice("ns1", "svc1-2", "svc1", "IPv4")
            .port("port-0", 80, "TCP")
            .endpoint(mk_endpoint("10.0.1.1"))
            .endpoint(mk_endpoint("10.0.1.2"))
            .endpoint(mk_endpoint("10.0.1.10"))
            .build(),
    );
    fake.add(&generated_slice("svc2", 2, 1, &[], 80));
    fake.apply();
    // Sorted as text, as upstream sorts them: "10.0.1.10:80" < "10.0.1.1:80".
    assert_eq!(
        fake.endpoints(&tcp("svc1", "port-0")),
        ["10.0.1.10:80", "10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]
    );
    assert_eq!(fake.endpoints(&tcp("svc2", "port-0")), ["10.0.2.1:80"]);
}

#[test]
fn a_duplicate_address_prefers_the_endpoint_that_is_not_terminating() {
    let terminating = |slice: &str| {
        mk_endpointslice("ns1", slice, "svc1", "IPv4")
            .port("p", 80, "TCP")
            .endpoint(
                mk_endpoint("10.0.1.1")
                    .conditions(false, true, true)
                    .node("old-node"),
            )
            .build()
    };
    let running = |slice: &str| {
        mk_endpointslice("ns1", slice, "svc1", "IPv4")
            .port("p", 80, "TCP")
            .endpoint(mk_endpoint("10.0.1.1").node("new-node"))
            .build()
    };
    // Whichever slice sorts first, the running endpoint wins.
    for (first, second) in [
        (terminating("a"), running("b")),
        (running("a"), terminating("b")),
    ] {
        let mut fake = Fake::new(HOST);
        fake.add(&first);
        fake.add(&second);
        fake.apply();
        let endpoints = &fake.map[&tcp("svc1", "p")];
        assert_eq!(endpoints.len(), 1);
        assert!(endpoints[0].ready && !endpoints[0].terminating);
        assert_eq!(endpoints[0].node_name.as_deref(), Some("new-node"));
    }
}

/// Two running endpoints with one address: the slice whose name sorts last wins, however
/// the slices arrived (upstream merges its slices in name order too).
#[test]
fn a_duplicate_address_comes_from_the_last_slice_by_name() {
    let on_node = |slice: &str, node: &str| {
        mk_endpointslice("ns1", slice, "svc1", "IPv4")
            .port("p", 80, "TCP")
            .endpoint(mk_endpoint("10.0.1.1").node(node))
            .build()
    };
    let mut fake = Fake::new(HOST);
    fake.add(&on_node("svc1-c", "node-c"));
    fake.add(&on_node("svc1-a", "node-a"));
    fake.add(&on_node("svc1-b", "node-b"));
    fake.apply();
    let node = |fake: &Fake| fake.map[&tcp("svc1", "p")][0].node_name.clone();
    assert_eq!(node(&fake).as_deref(), Some("node-c"));
    fake.delete(&on_node("svc1-c", "node-c"));
    fake.apply();
    assert_eq!(node(&fake).as_deref(), Some("node-b"));
    fake.add(&on_node("svc1-d", "node-d"));
    fake.delete(&on_node("svc1-b", "node-b"));
    fake.apply();
    assert_eq!(node(&fake).as_deref(), Some("node-d"));
    fake.delete(&on_node("svc1-d", "node-d"));
    fake.apply();
    assert_eq!(node(&fake).as_deref(), Some("node-a"));
}

#[test]
fn same_ip_on_different_ports_are_different_endpoints() {
    let mut fake = Fake::new(HOST);
    for (slice, port) in [(1, 80), (2, 8080)] {
        fake.add(
            &mk_endpointslice("ns1", &format!("svc1-{slice}"), "svc1", "IPv4")
                .port("port-0", port, "TCP")
                .endpoint(mk_endpoint("10.0.1.1").node("host2"))
                .endpoint(mk_endpoint("10.0.1.2").node(HOST))
                .build(),
        );
    }
    fake.apply();
    assert_eq!(
        fake.endpoints(&tcp("svc1", "port-0")),
        [
            "10.0.1.1:80",
            "10.0.1.1:8080",
            "10.0.1.2:80",
            "10.0.1.2:8080"
        ]
    );
    assert_eq!(
        fake.map.local_ready_endpoints(),
        HashMap::from([(nsn("ns1", "svc1"), 1)])
    );
}

#[test]
fn ports_without_a_number_yield_nothing() {
    let mut fake = Fake::new(HOST);
    let slice = mk_endpointslice("ns1", "svc1-1", "svc1", "IPv4")
        .endpoint(mk_endpoint("10.0.1.1"))
        .with(|s| {
            s.ports = Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
                name: Some("port-0".into()),
                port: None,
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]);
        })
        .build();
    fake.add(&slice);
    let result = fake.apply();
    assert!(fake.map.is_empty());
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "svc1")]));
}

#[test]
fn absent_conditions_take_upstream_defaults() {
    let mut fake = Fake::new(HOST);
    fake.add(
        &mk_endpointslice("ns1", "svc1-1", "svc1", "IPv4")
            .port("p", 80, "TCP")
            .endpoint(mk_endpoint("10.0.1.1").no_conditions())
            .build(),
    );
    fake.apply();
    let endpoint = &fake.map[&tcp("svc1", "p")][0];
    assert!(endpoint.ready && endpoint.serving && !endpoint.terminating);
}

#[test]
fn an_empty_node_name_makes_nothing_local() {
    let mut fake = Fake::new("");
    fake.add(
        &mk_endpointslice("ns1", "svc1-1", "svc1", "IPv4")
            .port("p", 80, "TCP")
            .endpoint(mk_endpoint("10.0.1.1"))
            .endpoint(mk_endpoint("10.0.1.2").node(""))
            .build(),
    );
    fake.apply();
    assert!(fake.map[&tcp("svc1", "p")].iter().all(|e| !e.is_local));
}

#[test]
fn deleting_slices_removes_their_endpoints() {
    let mut fake = Fake::new(HOST);
    let first = generated_slice("svc1", 1, 2, &[], 80);
    let second = generated_slice("svc1", 2, 1, &[], 80);
    fake.add(&first);
    fake.add(&second);
    fake.apply();
    assert_eq!(fake.endpoints(&tcp("svc1", "port-0")).len(), 3);

    assert!(fake.delete(&first));
    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "svc1")]));
    assert_eq!(fake.endpoints(&tcp("svc1", "port-0")), ["10.0.2.1:80"]);

    assert!(fake.delete(&second));
    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "svc1")]));
    assert!(fake.map.is_empty());

    // Deleting what is gone changes nothing.
    assert!(!fake.delete(&second));
    assert!(fake.apply().updated_services.is_empty());
}

#[test]
fn repeated_and_cancelled_updates() {
    let mut fake = Fake::new(HOST);
    let slice = generated_slice("svc1", 1, 2, &[], 80);
    assert!(fake.add(&slice));
    assert!(!fake.add(&slice), "same content as pending");
    fake.apply();
    assert!(!fake.add(&slice), "same content as applied");
    assert_eq!(fake.tracker.pending_count(), 0);

    // Only the trigger time differs: nothing to sync.
    let annotated = EndpointSliceBuilder::from_slice(slice.clone())
        .annotation(
            "endpoints.kubernetes.io/last-change-trigger-time",
            "2030-01-01T00:00:00Z",
        )
        .build();
    assert!(!fake.add(&annotated));

    let changed = generated_slice("svc1", 1, 3, &[], 80);
    assert!(fake.add(&changed));
    assert_eq!(
        fake.tracker.pending_changes(),
        HashSet::from([nsn("ns1", "svc1")])
    );
    assert_eq!(fake.tracker.changes_total(), 5);
    fake.apply();
    assert_eq!(fake.endpoints(&tcp("svc1", "port-0")).len(), 3);
}

#[test]
fn slices_the_tracker_does_not_handle_are_ignored() {
    let mut fake = Fake::new(HOST);
    let v6 = mk_endpointslice("ns1", "svc1-v6", "svc1", "IPv6")
        .port("p", 80, "TCP")
        .endpoint(mk_endpoint("fd00::1"))
        .build();
    let fqdn = mk_endpointslice("ns1", "svc1-fqdn", "svc1", "FQDN")
        .port("p", 80, "TCP")
        .endpoint(mk_endpoint("example.com"))
        .build();
    let unlabelled = generated_slice("svc1", 1, 1, &[], 80);
    let unlabelled = EndpointSliceBuilder::from_slice(unlabelled)
        .with(|s| s.metadata.labels = None)
        .build();
    assert!(!fake.add(&v6));
    assert!(!fake.add(&fqdn));
    assert!(!fake.add(&unlabelled));
    assert_eq!(fake.tracker.changes_total(), 0);
    assert!(fake.apply().updated_services.is_empty());

    // The IPv6 tracker takes the IPv6 slice.
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V6, HOST);
    let mut map = EndpointsMap::new();
    assert!(tracker.endpoint_slice_update(&v6, false));
    map.apply(&mut tracker);
    assert_eq!(map[&tcp("svc1", "p")][0].to_string(), "[fd00::1]:80");
}

#[test]
fn slices_labelled_for_another_proxy_or_headless_count_as_removed() {
    let mut fake = Fake::new(HOST);
    let slice = generated_slice("svc1", 1, 1, &[], 80);
    fake.add(&slice);
    fake.apply();
    for label in [
        "service.kubernetes.io/service-proxy-name",
        "service.kubernetes.io/headless",
    ] {
        let labelled = EndpointSliceBuilder::from_slice(slice.clone())
            .label(label, "x")
            .build();
        assert!(fake.add(&labelled));
        fake.apply();
        assert!(fake.map.is_empty(), "{label}");
        fake.add(&slice);
        fake.apply();
        assert_eq!(fake.map.len(), 1);
    }
}

#[test]
fn an_invalid_slice_is_rejected_once_and_counts_as_removed() {
    let mut fake = Fake::new(HOST);
    let good = generated_slice("svc1", 1, 1, &[], 80);
    let other = generated_slice("svc2", 2, 1, &[], 80);
    fake.add(&good);
    fake.add(&other);
    fake.apply();

    let bad = EndpointSliceBuilder::from_slice(good.clone())
        .endpoint(mk_endpoint("10.0.1.999"))
        .build();
    assert!(fake.add(&bad));
    assert!(!fake.add(&bad));
    let rejected = fake.tracker.take_rejected();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].kind, ObjectKind::EndpointSlice);
    assert_eq!(rejected[0].name, "svc1-1");
    assert!(fake.tracker.take_rejected().is_empty());

    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "svc1")]));
    assert!(!fake.map.contains_key(&tcp("svc1", "port-0")));
    assert_eq!(fake.endpoints(&tcp("svc2", "port-0")), ["10.0.2.1:80"]);

    assert!(fake.add(&good));
    assert_eq!(fake.tracker.rejected_count(), 0);
    fake.apply();
    assert_eq!(fake.endpoints(&tcp("svc1", "port-0")), ["10.0.1.1:80"]);
}

fn udp_slice(name: &str, endpoints: &[(&str, bool, bool)]) -> EndpointSlice {
    let mut builder = mk_endpointslice("ns1", name, "svc1", "IPv4")
        .port("dns", 53, "UDP")
        .port("dns-tcp", 53, "TCP");
    for (ip, ready, serving) in endpoints {
        builder =
            builder.endpoint(mk_endpoint(ip).conditions(*ready, *serving, !*ready && *serving));
    }
    builder.build()
}

/// Upstream's ConntrackCleanupRequired: any change to the endpoints of a service with a
/// UDP port calls for the conntrack reconciler, which then judges each flow against the
/// serving endpoints (proxier::conntrack's tests cover which flows go).
#[test]
fn udp_conntrack_cleanup_is_reported() {
    let mut fake = Fake::new(HOST);

    // First endpoints of a UDP port.
    fake.add(&udp_slice(
        "s",
        &[("10.0.1.1", true, true), ("10.0.1.2", true, true)],
    ));
    assert!(fake.apply().conntrack_cleanup_required);

    // 10.0.1.1 goes, 10.0.1.2 stops serving, 10.0.1.3 arrives.
    fake.add(&udp_slice(
        "s",
        &[("10.0.1.2", false, false), ("10.0.1.3", true, true)],
    ));
    assert!(fake.apply().conntrack_cleanup_required);

    // A serving endpoint that starts terminating: still a change of a UDP service.
    fake.add(&udp_slice(
        "s",
        &[("10.0.1.2", false, false), ("10.0.1.3", false, true)],
    ));
    assert!(fake.apply().conntrack_cleanup_required);

    // No change at all: nothing applied, nothing to reconcile.
    assert!(!fake.apply().conntrack_cleanup_required);

    // The slice goes: the service had a UDP port.
    fake.delete(&udp_slice("s", &[]));
    assert!(fake.apply().conntrack_cleanup_required);
}

#[test]
fn tcp_only_changes_need_no_conntrack_cleanup() {
    let mut fake = Fake::new(HOST);
    fake.add(&generated_slice("svc1", 1, 2, &[], 80));
    let result = fake.apply();
    assert!(!result.conntrack_cleanup_required);
    fake.delete(&generated_slice("svc1", 1, 2, &[], 80));
    let result = fake.apply();
    assert!(!result.conntrack_cleanup_required);
}

#[test]
fn trigger_times_after_the_tracker_started_are_reported() {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut fake = Fake::new(HOST);
    fake.tracker = EndpointsChangeTracker::new(IpFamily::V4, HOST).with_start_time(start);
    let annotate = |slice: EndpointSlice, time: &str| {
        EndpointSliceBuilder::from_slice(slice)
            .annotation("endpoints.kubernetes.io/last-change-trigger-time", time)
            .build()
    };
    // 2023-11-14T22:13:20Z is the start time itself.
    fake.add(&annotate(
        generated_slice("svc1", 1, 1, &[], 80),
        "2023-11-14T22:13:20Z",
    ));
    fake.add(&annotate(
        generated_slice("svc2", 2, 1, &[], 80),
        "2023-11-14T22:13:21.5Z",
    ));
    fake.add(&annotate(
        generated_slice("svc2", 3, 1, &[], 80),
        "2023-11-14T23:13:22+01:00",
    ));
    fake.add(&annotate(
        generated_slice("svc3", 4, 1, &[], 80),
        "not a time",
    ));
    let result = fake.apply();
    assert_eq!(
        result.last_change_trigger_times,
        HashMap::from([(
            nsn("ns1", "svc2"),
            vec![
                start + Duration::from_millis(1_500),
                start + Duration::from_secs(2)
            ]
        )])
    );
    assert_eq!(result.updated_services.len(), 3);

    // A deletion forgets the service's pending trigger times.
    fake.add(&annotate(
        generated_slice("svc2", 2, 2, &[], 80),
        "2023-11-14T22:13:30Z",
    ));
    fake.delete(&generated_slice("svc2", 2, 2, &[], 80));
    assert!(fake.apply().last_change_trigger_times.is_empty());
}

#[test]
fn apply_touches_only_changed_services() {
    let mut fake = Fake::new(HOST);
    fake.add(&generated_slice("svc1", 1, 2, &[], 80));
    fake.add(&generated_slice("svc2", 2, 2, &[], 80));
    fake.apply();
    let untouched = fake.map[&tcp("svc2", "port-0")][0].clone();
    fake.add(&generated_slice("svc1", 1, 3, &[], 80));
    let result = fake.apply();
    assert_eq!(result.updated_services, HashSet::from([nsn("ns1", "svc1")]));
    assert!(std::sync::Arc::ptr_eq(
        &untouched,
        &fake.map[&tcp("svc2", "port-0")][0]
    ));
}

type SliceEdit = fn(EndpointSliceBuilder) -> EndpointSliceBuilder;

/// An applied slice keeps its endpoints only as the merged records: a new version must
/// still be told apart from it by every field the proxy uses, and the same version must
/// not count as a change.
#[test]
fn an_applied_slice_is_compared_field_by_field() {
    let base = |ports: bool| {
        let mut slice = mk_endpointslice("ns1", "svc1-1", "svc1", "IPv4");
        if ports {
            slice = slice.port("port-0", 80, "TCP").port("port-1", 443, "TCP");
        }
        slice
            .endpoint(mk_endpoint("10.0.1.1").node(HOST).zone("zone-a"))
            .endpoint(
                mk_endpoint("10.0.1.2")
                    .node("host2")
                    .zone("zone-b")
                    .zone_hints(&["zone-b"])
                    .node_hints(&["host2"]),
            )
    };
    let edits: [(&str, SliceEdit); 10] = [
        ("terminating", |s| {
            s.with(|s| endpoint_at(s, 0).conditions.as_mut().unwrap().terminating = Some(true))
        }),
        ("ready", |s| s.with(|s| set_ready(s, 0, false))),
        ("node", |s| {
            s.with(|s| endpoint_at(s, 1).node_name = Some("host3".into()))
        }),
        ("zone", |s| s.with(|s| endpoint_at(s, 1).zone = None)),
        ("node hints", |s| {
            s.with(|s| endpoint_at(s, 1).hints.as_mut().unwrap().for_nodes = None)
        }),
        ("hints", |s| {
            s.with(|s| {
                endpoint_at(s, 1).hints = None;
            })
        }),
        ("address", |s| {
            s.with(|s| endpoint_at(s, 0).addresses = vec!["10.0.1.9".into()])
        }),
        ("a port", |s| s.port("port-2", 8080, "TCP")),
        ("a port number", |s| {
            s.with(|s| {
                if let Some(port) = s.ports.as_mut().and_then(|ports| ports.first_mut()) {
                    port.port = Some(81);
                }
            })
        }),
        ("an endpoint less", |s| {
            s.with(|s| s.endpoints.as_mut().unwrap().truncate(1))
        }),
    ];
    for ports in [true, false] {
        let mut fake = Fake::new(HOST);
        assert!(fake.add(&base(ports).build()));
        fake.apply();
        assert!(
            !fake.add(&base(ports).build()),
            "same content (ports: {ports})"
        );
        for (what, edit) in edits {
            if what == "a port number" && !ports {
                continue;
            }
            let mut fake = Fake::new(HOST);
            fake.add(&base(ports).build());
            fake.apply();
            assert!(
                fake.add(&edit(base(ports)).build()),
                "a change of {what} (ports: {ports})"
            );
        }
    }
}

fn endpoint_at(
    slice: &mut EndpointSlice,
    index: usize,
) -> &mut k8s_openapi::api::discovery::v1::Endpoint {
    &mut slice.endpoints.as_mut().unwrap()[index]
}

fn set_ready(slice: &mut EndpointSlice, index: usize, ready: bool) {
    endpoint_at(slice, index).conditions.as_mut().unwrap().ready = Some(ready);
}

/// A checkout shares the applied slices' records: a slice that did not change hands out
/// the records it handed out before, and a port's records carry that port.
#[test]
fn unchanged_slices_hand_out_the_same_records() {
    let mut fake = Fake::new(HOST);
    fake.add(&generated_slice("svc1", 1, 2, &[HOST], 80));
    fake.add(&generated_slice("svc1", 2, 2, &[], 80));
    fake.apply();
    let before = fake.map[&tcp("svc1", "port-0")].clone();
    fake.add(&generated_slice("svc1", 2, 3, &[], 80));
    fake.apply();
    let after = &fake.map[&tcp("svc1", "port-0")];
    assert_eq!(after.len(), 5);
    for record in before
        .iter()
        .filter(|record| record.ip.to_string().starts_with("10.0.1."))
    {
        assert!(
            after
                .iter()
                .any(|kept| std::sync::Arc::ptr_eq(kept, record)),
            "{record} was built again"
        );
        assert!(record.is_local);
    }
}

/// A regression guard: the model keeps one `SliceEndpoint` per endpoint of every slice and
/// one `Endpoint` per endpoint per service port, so at 50,000 services × 4 endpoints each
/// byte here is about 200 kB of resident memory per record kind. Both were 136 bytes with
/// owned names and `BTreeSet` hints; names are now interned `Arc<str>` (16 bytes) and the
/// hints one pointer. Growing either needs a reason. (Packing the flags into one byte
/// would not shrink them: 40 bytes of pointers and the 17-byte `IpAddr` round up to 64
/// whatever the flags take.)
#[test]
fn endpoint_records_stay_small() {
    assert!(
        size_of::<Endpoint>() <= 64,
        "Endpoint is {} bytes",
        size_of::<Endpoint>()
    );
    assert!(
        size_of::<SliceEndpoint>() <= 64,
        "SliceEndpoint is {} bytes",
        size_of::<SliceEndpoint>()
    );
}

#[test]
fn a_checkout_of_thousands_of_services_split_over_threads_gives_each_its_own_endpoints() {
    use crate::model::endpointslice_cache::PARALLEL_CHECKOUT_MIN;
    let services = PARALLEL_CHECKOUT_MIN + 904;
    let mut fake = Fake::new(HOST);
    let slices: Vec<EndpointSlice> = (0..services)
        .map(|i| {
            generated_slice(
                &format!("svc{i}"),
                (i % 200) as u8,
                1 + (i % 3) as u8,
                &[HOST, "other"],
                80,
            )
        })
        .collect();
    for slice in &slices {
        assert!(fake.add(slice));
    }
    let result = fake.apply();
    assert_eq!(result.updated_services.len(), services);
    for i in [0, 1, 2, 1000, services - 1] {
        let expected: Vec<String> = (1..=1 + (i % 3))
            .map(|e| format!("10.0.{}.{e}:80", i % 200))
            .collect();
        assert_eq!(
            fake.endpoints(&tcp(&format!("svc{i}"), "port-0")),
            expected,
            "svc{i}"
        );
        // Endpoint e runs on nodes[e % 2]: HOST for the even ones.
        let local: Vec<bool> = fake
            .map
            .get(&tcp(&format!("svc{i}"), "port-0"))
            .unwrap()
            .iter()
            .map(|e| e.is_local)
            .collect();
        let expected_local: Vec<bool> = (1..=1 + (i % 3)).map(|e| e % 2 == 0).collect();
        assert_eq!(local, expected_local, "svc{i}");
    }

    // Every odd service loses its only slice, every even one gains an endpoint: one
    // checkout of all of them again, whose trackers for the odd ones go.
    for (i, slice) in slices.iter().enumerate() {
        if i % 2 == 1 {
            assert!(fake.delete(slice));
        } else {
            assert!(fake.add(&generated_slice(
                &format!("svc{i}"),
                (i % 200) as u8,
                4,
                &[],
                80
            )));
        }
    }
    let result = fake.apply();
    assert_eq!(result.updated_services.len(), services);
    for i in 0..services {
        let endpoints = fake.endpoints(&tcp(&format!("svc{i}"), "port-0"));
        if i % 2 == 1 {
            assert!(endpoints.is_empty(), "svc{i}: {endpoints:?}");
        } else {
            assert_eq!(endpoints.len(), 4, "svc{i}");
        }
    }
    assert_eq!(fake.map.len(), services.div_ceil(2));
}
