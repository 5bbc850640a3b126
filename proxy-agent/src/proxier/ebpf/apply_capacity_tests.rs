// SPDX-License-Identifier: Apache-2.0
//! The apply stage against full maps: services are admitted whole or not at all, in a
//! fixed order, never at the expense of what is programmed; the rest is reported and gets
//! in once there is room, including after a restart.

use proxy_common::{SCOPE_EXTERNAL, svc_flags};

use super::{
    apply::ApplyState,
    apply_tests::{Harness, etp_local_lb_service, etp_local_lb_slice},
    budget::MapKind,
    entries::Snapshot,
    growth::Ceilings,
    maps::{LbMaps, Op as LoggedOp},
};
use crate::{
    config::MapSizeLimits,
    k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
    model::{ClusterState, IpFamily},
    proxier::FullMap,
};

/// SVC4 holds `services` entries; every other map is roomy.
fn harness(services: usize, max_backends: u32) -> Harness {
    let maps = LbMaps::in_memory_with(|name| if name == "SVC4_V2" { services } else { 1024 });
    Harness::with_maps(maps, ApplyState::new(max_backends, 1024))
}

/// ClusterIP service `name` at 172.30.0.`host`, port 80: three SVC4 entries with one
/// backend (slot 0, slot 1, the ClusterIP wildcard).
fn add_service(h: &mut Harness, name: &str, host: u8, backends: &[&str]) {
    h.service(
        mk_service("ns1", name)
            .cluster_ip(&format!("172.30.0.{host}"))
            .port("http", 80, "TCP")
            .build(),
    );
    let mut slice =
        mk_endpointslice("ns1", &format!("{name}-1"), name, "IPv4").port("http", 8080, "TCP");
    for b in backends {
        slice = slice.endpoint(mk_endpoint(b).node("node-b").build());
    }
    h.slice(slice.build());
}

fn vip(host: u8) -> String {
    format!("172.30.0.{host}")
}

/// Every frontend's slot 0 points at slots, backends and a reverse-NAT entry that exist.
fn assert_consistent(snapshot: &Snapshot) {
    for (key, value) in &snapshot.svc {
        if key.slot != 0 || value.flags & svc_flags::WILDCARD != 0 {
            continue;
        }
        let v6 = key.frontend.addr.is_ipv6();
        assert!(
            snapshot.rev_nat.contains_key(&(v6, value.rev_nat_id)),
            "{key:?} has no reverse NAT"
        );
        for slot in 1..=value.count {
            let mut slot_key = *key;
            slot_key.slot = slot;
            let entry = snapshot
                .svc
                .get(&slot_key)
                .unwrap_or_else(|| panic!("{key:?} lacks slot {slot}"));
            assert!(
                snapshot.backends.contains_key(&(v6, entry.backend_id)),
                "{slot_key:?} points at a missing backend"
            );
        }
    }
}

/// Five services of three SVC4 entries each in a map of six: a and b fit (first by name).
fn full_of_a_and_b() -> Harness {
    let mut h = harness(6, 1024);
    for (i, name) in ["svc-a", "svc-b", "svc-c", "svc-d", "svc-e"]
        .iter()
        .enumerate()
    {
        add_service(&mut h, name, 10 + i as u8, &[&format!("10.0.1.{}", i + 1)]);
    }
    h
}

#[test]
fn services_that_do_not_fit_are_left_out_whole_and_reported() {
    let mut h = full_of_a_and_b();
    let (_, stats) = h.sync_with_stats(false);

    assert_eq!(
        h.backends_of(&vip(10), 80, SCOPE_EXTERNAL),
        vec!["10.0.1.1:8080"]
    );
    assert_eq!(
        h.backends_of(&vip(11), 80, SCOPE_EXTERNAL),
        vec!["10.0.1.2:8080"]
    );
    for host in [12, 13, 14] {
        assert!(h.svc(&vip(host), 80, SCOPE_EXTERNAL, 0).is_none());
    }
    let snapshot = h.maps.snapshot().unwrap();
    assert_eq!(snapshot.svc.len(), 6);
    // Nothing of the refused services was written, not even their backends.
    assert_eq!(snapshot.backends.len(), 2);
    assert_eq!(snapshot.rev_nat.len(), 2);
    assert_consistent(&snapshot);

    assert_eq!(stats.not_programmed, 3);
    assert_eq!(
        stats.not_programmed_examples,
        vec!["ns1/svc-c", "ns1/svc-d", "ns1/svc-e"]
    );
    assert_eq!(
        stats.full_maps,
        vec![FullMap {
            map: "SVC4_V2",
            capacity: 6,
            setting: "ebpf.mapSizes.services"
        }]
    );
    let svc4 = stats.map_usage.iter().find(|u| u.map == "SVC4_V2").unwrap();
    assert_eq!((svc4.entries, svc4.capacity), (6, 6));
    // A full sync agrees and writes nothing.
    let (ops, stats) = h.sync_with_stats(true);
    assert!(ops.is_empty(), "{ops:#?}");
    assert_eq!(stats.not_programmed, 3);
}

#[test]
fn a_newcomer_never_pushes_out_what_is_programmed() {
    let mut h = full_of_a_and_b();
    h.sync(false);
    let before = h.maps.snapshot().unwrap();

    // "svc-aa" sorts before svc-b, but svc-b is in the maps: it keeps its place.
    add_service(&mut h, "svc-aa", 20, &["10.0.1.20"]);
    let (ops, stats) = h.sync_with_stats(false);
    assert!(ops.is_empty(), "nothing is written or deleted: {ops:#?}");
    assert_eq!(h.maps.snapshot().unwrap(), before);
    assert_eq!(stats.not_programmed, 4);
    assert_eq!(stats.not_programmed_examples[0], "ns1/svc-aa");
}

#[test]
fn a_service_that_outgrows_the_room_keeps_its_old_entries() {
    let mut h = full_of_a_and_b();
    h.sync(false);
    let before = h.maps.snapshot().unwrap();

    // svc-a gains a backend: one more slot, and there is no room for it.
    add_service(&mut h, "svc-a", 10, &["10.0.1.1", "10.0.1.9"]);
    let (ops, stats) = h.sync_with_stats(false);
    assert!(ops.is_empty(), "{ops:#?}");
    assert_eq!(h.maps.snapshot().unwrap(), before);
    assert_eq!(
        h.backends_of(&vip(10), 80, SCOPE_EXTERNAL),
        vec!["10.0.1.1:8080"]
    );
    assert!(
        stats
            .not_programmed_examples
            .contains(&"ns1/svc-a".to_string())
    );
}

#[test]
fn refused_services_get_in_once_a_sync_has_freed_room() {
    let mut h = full_of_a_and_b();
    h.sync(false);
    h.delete_service(mk_service("ns1", "svc-b").build());
    let (_, stats) = h.sync_with_stats(false);
    // The deletions run after the writes: the room they free is for the next sync.
    assert!(stats.deleted > 0);
    assert_eq!(stats.not_programmed, 3);
    assert!(h.svc(&vip(11), 80, SCOPE_EXTERNAL, 0).is_none());

    // Nothing changed in the cluster: the refused services are tried again all the same.
    let (ops, stats) = h.sync_with_stats(false);
    assert!(!ops.is_empty());
    assert_eq!(
        h.backends_of(&vip(12), 80, SCOPE_EXTERNAL),
        vec!["10.0.1.3:8080"]
    );
    assert_eq!(stats.not_programmed, 2);
    assert_eq!(
        stats.not_programmed_examples,
        vec!["ns1/svc-d", "ns1/svc-e"]
    );
    assert_consistent(&h.maps.snapshot().unwrap());
}

#[test]
fn a_restarted_agent_keeps_the_programmed_services_even_one_that_no_longer_fits() {
    let mut h = full_of_a_and_b();
    h.sync(false);
    let before = h.maps.snapshot().unwrap();

    // A new agent, same maps; while it was down svc-a gained a backend that does not fit.
    h.apply = ApplyState::new(1024, 1024);
    h.cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    add_service(&mut h, "svc-e", 14, &["10.0.1.5"]);
    add_service(&mut h, "svc-a", 10, &["10.0.1.1", "10.0.1.9"]);
    add_service(&mut h, "svc-c", 12, &["10.0.1.3"]);
    add_service(&mut h, "svc-b", 11, &["10.0.1.2"]);
    let (ops, stats) = h.sync_with_stats(true);
    assert!(ops.is_empty(), "nothing is deleted or added: {ops:#?}");
    assert_eq!(h.maps.snapshot().unwrap(), before);
    assert_eq!(
        stats.not_programmed_examples,
        vec!["ns1/svc-a", "ns1/svc-c", "ns1/svc-e"]
    );

    // Once svc-a shrinks back, it is current again, and a partial sync only sees the rest.
    add_service(&mut h, "svc-a", 10, &["10.0.1.1"]);
    let (ops, stats) = h.sync_with_stats(false);
    assert!(ops.is_empty(), "{ops:#?}");
    assert_eq!(
        stats.not_programmed_examples,
        vec!["ns1/svc-c", "ns1/svc-e"]
    );
}

#[test]
fn raising_the_capacity_lets_everything_in_without_rewriting_what_was_there() {
    let mut h = full_of_a_and_b();
    h.sync(false);
    let before = h.maps.snapshot().unwrap();

    // The restart after a capacity raise: same entries, bigger maps, a new agent.
    let mut bigger = LbMaps::in_memory(1024);
    for (key, value) in &before.svc {
        bigger.0.put_svc(key, value).unwrap();
    }
    for ((_, id), entry) in &before.backends {
        bigger.0.put_backend(*id, entry).unwrap();
    }
    for ((_, id), (addr, port)) in &before.rev_nat {
        bigger.0.put_rev_nat(*id, *addr, *port).unwrap();
    }
    let cluster = std::mem::replace(&mut h.cluster, ClusterState::new(&[IpFamily::V4], "x"));
    let mut h2 = Harness::with_maps(bigger, ApplyState::new(1024, 1024));
    h2.cluster = cluster;
    let (ops, stats) = h2.sync_with_stats(true);
    assert_eq!(stats.not_programmed, 0);
    assert!(stats.full_maps.is_empty());
    // Only additions: what was programmed keeps its entries and ids.
    assert!(
        ops.iter().all(|op| matches!(op, LoggedOp::Put { .. })),
        "{ops:#?}"
    );
    let after = h2.maps.snapshot().unwrap();
    for (key, value) in &before.svc {
        assert_eq!(after.svc.get(key), Some(value));
    }
    assert_eq!(after.svc.len(), 15);
    assert_consistent(&after);
}

#[test]
fn running_out_of_backend_ids_refuses_the_service_and_names_the_backends_map() {
    let mut h = harness(1024, 2);
    add_service(&mut h, "svc-a", 10, &["10.0.1.1", "10.0.1.2", "10.0.1.3"]);
    add_service(&mut h, "svc-b", 11, &["10.0.1.4"]);
    let (_, stats) = h.sync_with_stats(false);
    assert!(h.svc(&vip(10), 80, SCOPE_EXTERNAL, 0).is_none());
    assert_eq!(
        h.backends_of(&vip(11), 80, SCOPE_EXTERNAL),
        vec!["10.0.1.4:8080"]
    );
    assert_eq!(stats.not_programmed_examples, vec!["ns1/svc-a"]);
    assert_eq!(stats.full_maps[0].map, "BACKENDS4_V1");
    assert_consistent(&h.maps.snapshot().unwrap());
}

/// In-memory maps of `capacity` entries each holding what `snapshot` holds (a growth: the
/// resize copies every entry into the new maps).
fn grown(snapshot: &Snapshot, capacity: usize) -> LbMaps {
    let (mut maps, _) = LbMaps::in_memory(capacity);
    for (key, value) in &snapshot.svc {
        maps.put_svc(key, value).unwrap();
    }
    for ((_, id), entry) in &snapshot.backends {
        maps.put_backend(*id, entry).unwrap();
    }
    for ((_, id), (addr, port)) in &snapshot.rev_nat {
        maps.put_rev_nat(*id, *addr, *port).unwrap();
    }
    maps
}

fn growing(services: usize, ceiling: u32) -> Harness {
    let maps = LbMaps::in_memory_with(|name| if name == "SVC4_V2" { services } else { 1024 });
    let ceilings = Ceilings::from_config(&MapSizeLimits {
        services: Some(ceiling),
        ..Default::default()
    });
    Harness::with_maps(maps, ApplyState::new(1024, 1024).with_ceilings(ceilings))
}

#[test]
fn maps_grown_between_plan_and_writes_take_every_service_and_keep_the_ids() {
    let mut h = growing(6, 1024);
    let names = ["svc-a", "svc-b", "svc-c", "svc-d", "svc-e"];
    for (i, name) in names.iter().enumerate() {
        add_service(&mut h, name, 10 + i as u8, &[&format!("10.0.1.{}", i + 1)]);
    }
    let planned = h.plan_pending(true);
    // Admission counted on the ceiling: every service is in the plan, 15 entries at the
    // peak for a map of 6, which must grow before anything is written.
    assert_eq!(planned.peak().get(MapKind::Services, IpFamily::V4), 15);
    assert!(
        h.maps.snapshot().unwrap().svc.is_empty(),
        "nothing written yet"
    );
    h.maps = grown(&h.maps.snapshot().unwrap(), 32);
    let stats = h.apply.execute(&mut h.maps, planned).unwrap();
    assert_eq!(stats.not_programmed, 0);
    let usage = stats.map_usage.iter().find(|u| u.map == "SVC4_V2").unwrap();
    assert_eq!(
        (usage.entries, usage.capacity),
        (15, 32),
        "the maps' own capacity"
    );
    let before = h.maps.snapshot().unwrap();
    assert_consistent(&before);

    // A second growth with entries in the maps: they move over, ids and all, and the
    // partial sync after it writes only the new service.
    add_service(&mut h, "svc-f", 20, &["10.0.1.6"]);
    let planned = h.plan_pending(false);
    assert_eq!(planned.peak().get(MapKind::Services, IpFamily::V4), 18);
    h.maps = grown(&h.maps.snapshot().unwrap(), 64);
    let stats = h.apply.execute(&mut h.maps, planned).unwrap();
    assert_eq!(stats.written, 5, "backend, rev_nat, three slots: {stats:?}");
    let after = h.maps.snapshot().unwrap();
    for (key, value) in &before.svc {
        assert_eq!(after.svc.get(key), Some(value));
    }
    assert_eq!(after.svc.len(), 18);
    assert_consistent(&after);
    // And a full sync finds nothing to repair.
    let (ops, _) = h.sync_with_stats(true);
    assert!(ops.is_empty(), "{ops:#?}");
}

#[test]
fn at_the_ceiling_services_are_refused_naming_the_limit() {
    let mut h = growing(6, 9);
    for (i, name) in ["svc-a", "svc-b", "svc-c", "svc-d"].iter().enumerate() {
        add_service(&mut h, name, 10 + i as u8, &[&format!("10.0.1.{}", i + 1)]);
    }
    let planned = h.plan_pending(true);
    assert_eq!(planned.peak().get(MapKind::Services, IpFamily::V4), 9);
    h.maps = grown(&h.maps.snapshot().unwrap(), 9);
    let stats = h.apply.execute(&mut h.maps, planned).unwrap();
    assert_eq!(stats.not_programmed_examples, vec!["ns1/svc-d"]);
    assert_eq!(
        stats.full_maps,
        vec![FullMap {
            map: "SVC4_V2",
            capacity: 9,
            setting: "ebpf.mapSizeLimits.services"
        }]
    );
    assert_consistent(&h.maps.snapshot().unwrap());
}

#[test]
fn an_abandoned_plan_leaves_the_maps_untouched_and_the_next_full_sync_repairs() {
    let mut h = growing(6, 1024);
    add_service(&mut h, "svc-a", 10, &["10.0.1.1"]);
    add_service(&mut h, "svc-b", 11, &["10.0.1.2"]);
    add_service(&mut h, "svc-c", 12, &["10.0.1.3"]);
    let planned = h.plan_pending(true);
    // The growth failed: nothing is written, and the maps keep their size from now on.
    h.apply.abandon(planned);
    h.apply.stop_growing();
    assert!(h.maps.snapshot().unwrap().svc.is_empty());
    let (_, stats) = h.sync_with_stats(true);
    assert_eq!(stats.not_programmed_examples, vec!["ns1/svc-c"]);
    assert_eq!(stats.full_maps[0].setting, "ebpf.mapSizes.services");
    assert_consistent(&h.maps.snapshot().unwrap());
}

#[test]
fn the_estimate_made_before_admission_is_the_peak_of_new_services_without_what_is_kept() {
    let mut h = growing(6, 1024);
    for (i, name) in ["svc-a", "svc-b", "svc-c"].iter().enumerate() {
        add_service(&mut h, name, 10 + i as u8, &[&format!("10.0.1.{}", i + 1)]);
    }
    // Three frontends (ClusterIP, NodePort, LB IP) and two scopes over the same two
    // backends: they count once.
    h.service(etp_local_lb_service());
    h.slice(etp_local_lb_slice());
    let prepared = h.prepare_pending(false);
    let estimate = prepared.estimated_peak().clone();
    let planned = h
        .apply
        .admit_prepared(prepared, h.cluster.families(), &h.node);
    for kind in MapKind::ALL {
        assert_eq!(
            estimate.get(kind, IpFamily::V4),
            planned.peak().get(kind, IpFamily::V4),
            "{kind:?}"
        );
    }
    assert_eq!(estimate.get(MapKind::Backends, IpFamily::V4), 5);
    assert_eq!(estimate.get(MapKind::RevNat, IpFamily::V4), 6);
    h.maps = grown(&h.maps.snapshot().unwrap(), 64);
    h.apply.execute(&mut h.maps, planned).unwrap();

    // Everything again, nothing new: the estimate is what the maps hold (no growth
    // ahead of a resync), and one more service adds its own entries only.
    let held = h.apply.entries();
    add_service(&mut h, "svc-d", 20, &["10.0.1.9"]);
    let prepared = h.prepare_pending(true);
    for kind in MapKind::ALL {
        let added = match kind {
            MapKind::Services => 3,
            MapKind::Backends | MapKind::RevNat => 1,
            MapKind::SourceRanges => 0,
        };
        assert_eq!(
            prepared.estimated_peak().get(kind, IpFamily::V4),
            held.get(kind, IpFamily::V4) + added,
            "{kind:?}"
        );
    }
}

#[test]
fn a_dual_stack_estimate_counts_each_family_in_its_own_maps() {
    let mut h = growing(6, 1024);
    h.cluster = ClusterState::new(&[IpFamily::V4, IpFamily::V6], "node-a");
    h.service(
        mk_service("ns1", "both")
            .cluster_ips(&["172.30.0.7", "fd00:30::7"])
            .ip_families(&["IPv4", "IPv6"])
            .port("http", 80, "TCP")
            .build(),
    );
    // Two IPv4 backends and three IPv6 ones.
    let mut v4 = mk_endpointslice("ns1", "both-4", "both", "IPv4").port("http", 8080, "TCP");
    for b in ["10.0.7.1", "10.0.7.2"] {
        v4 = v4.endpoint(mk_endpoint(b).node("node-b").build());
    }
    h.slice(v4.build());
    let mut v6 = mk_endpointslice("ns1", "both-6", "both", "IPv6").port("http", 8080, "TCP");
    for b in ["fd00:7::1", "fd00:7::2", "fd00:7::3"] {
        v6 = v6.endpoint(mk_endpoint(b).node("node-b").build());
    }
    h.slice(v6.build());

    let prepared = h.prepare_pending(false);
    let estimate = prepared.estimated_peak().clone();
    let planned = h
        .apply
        .admit_prepared(prepared, h.cluster.families(), &h.node);
    for family in [IpFamily::V4, IpFamily::V6] {
        for kind in MapKind::ALL {
            assert_eq!(
                estimate.get(kind, family),
                planned.peak().get(kind, family),
                "{kind:?} {family:?}"
            );
        }
    }
    assert_eq!(estimate.get(MapKind::Backends, IpFamily::V4), 2);
    assert_eq!(estimate.get(MapKind::Backends, IpFamily::V6), 3);
    assert_eq!(estimate.get(MapKind::RevNat, IpFamily::V4), 1);
    assert_eq!(estimate.get(MapKind::RevNat, IpFamily::V6), 1);
}
