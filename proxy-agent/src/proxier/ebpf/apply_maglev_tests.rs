// SPDX-License-Identifier: Apache-2.0
//! Maglev tables in the apply stage, against in-memory maps: which frontends get one, what
//! it holds, when it is written (before the slot 0 that points at it, only when its backend
//! set is new) and what a restart or a shortage of tables does.

use proxy_common::{SCOPE_EXTERNAL, SCOPE_INTERNAL, maps::MAGLEV, svc_flags};

use super::{
    apply::ApplyState,
    apply_tests::{Harness, etp_local_lb_service, is_put, last_pos},
    desired::BackendAddr,
    maglev::build_table,
    maps::{LbMaps, Op as LoggedOp},
};
use crate::{
    k8s::{
        convert::LB_ALGORITHM_ANNOTATION,
        fixtures::{mk_endpoint, mk_endpointslice, mk_service},
    },
    model::{ClusterState, IpFamily, LoadBalancerAlgorithm},
};

/// A small prime table size, so the fake map stays small.
const SIZE: u32 = 251;

fn harness(default: LoadBalancerAlgorithm, tables: u32) -> Harness {
    let maps = LbMaps::in_memory_with(|name| {
        if name == MAGLEV {
            (tables * SIZE) as usize
        } else {
            1024
        }
    });
    Harness::with_maps(maps, state(default, tables))
}

fn state(default: LoadBalancerAlgorithm, tables: u32) -> ApplyState {
    ApplyState::new(1024, 1024).with_maglev(default, SIZE, tables)
}

/// A NodePort service `name` on ClusterIP `cluster_ip`, annotated with `algorithm` if any.
fn node_port_service(
    name: &str,
    cluster_ip: &str,
    node_port: i32,
    algorithm: Option<&str>,
) -> k8s_openapi::api::core::v1::Service {
    let mut b = mk_service("ns1", name)
        .type_("NodePort")
        .cluster_ip(cluster_ip)
        .node_port("http", 80, "TCP", node_port);
    if let Some(a) = algorithm {
        b = b.annotation(LB_ALGORITHM_ANNOTATION, a);
    }
    b.build()
}

fn slice(service: &str, eps: &[(&str, &str)]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let mut b =
        mk_endpointslice("ns1", &format!("{service}-1"), service, "IPv4").port("http", 8080, "TCP");
    for (ip, node) in eps {
        b = b.endpoint(mk_endpoint(ip).node(node).build());
    }
    b.build()
}

fn is_table_put(op: &LoggedOp) -> bool {
    matches!(op, LoggedOp::Put { map, .. } if *map == MAGLEV)
}

fn is_slot0_put(op: &LoggedOp) -> bool {
    matches!(op, LoggedOp::Put { map: "SVC4_V2", key } if key.contains("slot: 0"))
}

impl Harness {
    /// What the table of a frontend's scope must hold: the builder's table over the
    /// scope's backends with their ids in the maps.
    fn expected_table(&self, addr: &str, port: u16, scope: u8) -> Vec<u32> {
        let snapshot = self.maps.snapshot().unwrap();
        let slot0 = self.svc(addr, port, scope, 0).expect("frontend present");
        let members: Vec<(BackendAddr, u32)> = (1..=slot0.count)
            .map(|slot| {
                let id = self.svc(addr, port, scope, slot).unwrap().backend_id;
                (snapshot.backends[&(false, id)].addr, id)
            })
            .collect();
        build_table(&members, SIZE)
    }

    fn table_of(&self, addr: &str, port: u16) -> Option<(u16, Vec<u32>)> {
        let slot0 = self.svc(addr, port, SCOPE_EXTERNAL, 0)?;
        (slot0.flags & svc_flags::MAGLEV != 0).then(|| {
            let table = self.maps.maglev.read(slot0.maglev_table, SIZE).unwrap();
            (slot0.maglev_table, table)
        })
    }
}

#[test]
fn the_frontends_of_a_maglev_service_share_one_table_written_before_their_slot_zero() {
    let mut h = harness(LoadBalancerAlgorithm::Random, 4);
    h.service(node_port_service(
        "web",
        "172.30.0.10",
        30080,
        Some("maglev"),
    ));
    h.slice(slice(
        "web",
        &[
            ("10.0.1.1", "node-b"),
            ("10.0.1.2", "node-b"),
            ("10.0.1.3", "node-c"),
        ],
    ));
    let ops = h.sync(false);

    let (cluster_index, cluster_table) = h
        .table_of("172.30.0.10", 80)
        .expect("ClusterIP uses Maglev");
    let (node_port_index, _) = h.table_of("0.0.0.0", 30080).expect("NodePort uses Maglev");
    assert_eq!(cluster_index, node_port_index, "one backend set, one table");
    assert_eq!(
        cluster_table,
        h.expected_table("172.30.0.10", 80, SCOPE_EXTERNAL)
    );
    assert!(cluster_table.iter().all(|id| *id != 0));

    assert_eq!(
        ops.iter().filter(|op| is_table_put(op)).count(),
        1,
        "{ops:#?}"
    );
    let table = ops.iter().position(is_table_put).unwrap();
    let last_backend = last_pos(&ops, is_put("BACKENDS4_V1", ""));
    let first_slot0 = ops.iter().position(is_slot0_put).unwrap();
    assert!(last_backend < table && table < first_slot0, "{ops:#?}");
}

#[test]
fn a_changed_backend_set_gets_a_new_table_and_an_unchanged_one_is_not_rewritten() {
    let mut h = harness(LoadBalancerAlgorithm::Maglev, 4);
    h.service(node_port_service("web", "172.30.0.10", 30080, None));
    h.service(node_port_service("api", "172.30.0.20", 30081, None));
    h.slice(slice(
        "web",
        &[("10.0.1.1", "node-b"), ("10.0.1.2", "node-b")],
    ));
    h.slice(slice("api", &[("10.0.2.1", "node-b")]));
    // The agent's first sync is full (it adopts the maps, and writes every table once).
    h.sync(true);
    let (web_before, _) = h.table_of("172.30.0.10", 80).unwrap();
    let (api_before, api_table) = h.table_of("172.30.0.20", 80).unwrap();
    assert_ne!(web_before, api_before);

    h.slice(slice(
        "web",
        &[
            ("10.0.1.1", "node-b"),
            ("10.0.1.2", "node-b"),
            ("10.0.1.3", "node-b"),
        ],
    ));
    let ops = h.sync(false);
    let (web_after, web_table) = h.table_of("172.30.0.10", 80).unwrap();
    // The table in use is never rewritten: the new set has a table of its own, written
    // before the slot 0s switch to it.
    assert_ne!(web_after, web_before);
    assert_eq!(
        web_table,
        h.expected_table("172.30.0.10", 80, SCOPE_EXTERNAL)
    );
    assert_eq!(
        ops.iter().filter(|op| is_table_put(op)).count(),
        1,
        "{ops:#?}"
    );
    assert!(ops.iter().position(is_table_put) < ops.iter().position(is_slot0_put));
    assert_eq!(h.table_of("172.30.0.20", 80), Some((api_before, api_table)));

    // A full sync finds nothing to write, tables included.
    let ops = h.sync(true);
    assert!(ops.is_empty(), "{ops:#?}");

    // The released table is handed out again after the sync that released it.
    h.slice(slice(
        "api",
        &[("10.0.2.1", "node-b"), ("10.0.2.2", "node-b")],
    ));
    h.sync(false);
    let (api_after, _) = h.table_of("172.30.0.20", 80).unwrap();
    assert_eq!(api_after, web_before);
}

#[test]
fn the_annotation_overrides_the_configured_algorithm() {
    let mut h = harness(LoadBalancerAlgorithm::Maglev, 4);
    h.service(node_port_service("web", "172.30.0.10", 30080, None));
    h.service(node_port_service(
        "api",
        "172.30.0.20",
        30081,
        Some("random"),
    ));
    h.service(node_port_service(
        "odd",
        "172.30.0.30",
        30082,
        Some("ring-hash"),
    ));
    h.slice(slice("web", &[("10.0.1.1", "node-b")]));
    h.slice(slice("api", &[("10.0.2.1", "node-b")]));
    h.slice(slice("odd", &[("10.0.3.1", "node-b")]));
    h.sync(false);
    assert!(h.table_of("172.30.0.10", 80).is_some());
    assert!(h.table_of("172.30.0.20", 80).is_none());
    assert!(h.table_of("0.0.0.0", 30081).is_none());
    // An unknown value leaves the configured algorithm.
    assert!(h.table_of("172.30.0.30", 80).is_some());

    let mut h = harness(LoadBalancerAlgorithm::Random, 4);
    h.service(node_port_service("web", "172.30.0.10", 30080, None));
    h.slice(slice("web", &[("10.0.1.1", "node-b")]));
    h.sync(false);
    assert!(h.table_of("172.30.0.10", 80).is_none());
}

#[test]
fn with_etp_local_the_table_holds_the_local_endpoints_and_only_the_external_scope_has_one() {
    let mut h = harness(LoadBalancerAlgorithm::Maglev, 4);
    h.service(etp_local_lb_service());
    h.slice(slice(
        "lb",
        &[
            ("10.0.3.1", "node-a"),
            ("10.0.3.2", "node-a"),
            ("10.0.3.3", "node-b"),
        ],
    ));
    h.sync(false);
    let (_, table) = h.table_of("1.2.3.4", 80).expect("the LB IP uses Maglev");
    assert_eq!(table, h.expected_table("1.2.3.4", 80, SCOPE_EXTERNAL));
    assert_eq!(h.backends_of("1.2.3.4", 80, SCOPE_EXTERNAL).len(), 2);
    let local_ids: Vec<u32> = (1..=2)
        .map(|slot| {
            h.svc("1.2.3.4", 80, SCOPE_EXTERNAL, slot)
                .unwrap()
                .backend_id
        })
        .collect();
    assert!(table.iter().all(|id| local_ids.contains(id)));
    let internal = h.svc("1.2.3.4", 80, SCOPE_INTERNAL, 0).unwrap();
    assert_eq!(internal.flags & svc_flags::MAGLEV, 0);
    // The ClusterIP (every endpoint) has a table of its own.
    let (cluster_index, _) = h.table_of("172.30.0.30", 80).unwrap();
    assert_ne!(Some(cluster_index), h.table_of("1.2.3.4", 80).map(|t| t.0));
}

#[test]
fn without_a_free_table_a_frontend_picks_at_random_and_gets_one_when_one_is_free() {
    let mut h = harness(LoadBalancerAlgorithm::Maglev, 1);
    h.service(node_port_service("api", "172.30.0.20", 30081, None));
    h.service(node_port_service("web", "172.30.0.10", 30080, None));
    h.slice(slice("api", &[("10.0.2.1", "node-b")]));
    h.slice(slice("web", &[("10.0.1.1", "node-b")]));
    let (_, stats) = h.sync_with_stats(false);
    assert_eq!(stats.not_programmed, 0, "both services are programmed");
    let with_table = [h.table_of("172.30.0.20", 80), h.table_of("172.30.0.10", 80)];
    assert_eq!(with_table.iter().filter(|t| t.is_some()).count(), 1);
    assert_eq!(h.backends_of("172.30.0.10", 80, SCOPE_EXTERNAL).len(), 1);

    // The service with the table goes; the next full sync gives the other one the table.
    let holder = if with_table[0].is_some() {
        ("api", "172.30.0.20", 30081)
    } else {
        ("web", "172.30.0.10", 30080)
    };
    h.delete_service(node_port_service(holder.0, holder.1, holder.2, None));
    h.sync(false);
    h.sync(true);
    let other = if holder.0 == "api" {
        "172.30.0.10"
    } else {
        "172.30.0.20"
    };
    assert!(h.table_of(other, 80).is_some());
}

#[test]
fn a_restarted_agent_keeps_the_tables_in_use_and_writes_each_once() {
    let mut h = harness(LoadBalancerAlgorithm::Maglev, 4);
    h.service(node_port_service("web", "172.30.0.10", 30080, None));
    h.slice(slice(
        "web",
        &[("10.0.1.1", "node-b"), ("10.0.1.2", "node-b")],
    ));
    h.sync(false);
    let before = h.maps.snapshot().unwrap();
    let (index, table) = h.table_of("172.30.0.10", 80).unwrap();

    // A new agent over the same maps, which also has a second service to place.
    h.apply = state(LoadBalancerAlgorithm::Maglev, 4);
    h.cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    h.service(node_port_service("web", "172.30.0.10", 30080, None));
    h.slice(slice(
        "web",
        &[("10.0.1.2", "node-b"), ("10.0.1.1", "node-b")],
    ));
    h.service(node_port_service("api", "172.30.0.20", 30081, None));
    h.slice(slice("api", &[("10.0.2.1", "node-b")]));
    let ops = h.sync(true);
    assert_eq!(h.table_of("172.30.0.10", 80), Some((index, table)));
    let (api_index, _) = h.table_of("172.30.0.20", 80).unwrap();
    assert_ne!(api_index, index, "a new table never lands on one in use");
    // Both tables written once (the adopted one in case it was left half-written); web's
    // entries are as they were.
    assert_eq!(
        ops.iter().filter(|op| is_table_put(op)).count(),
        2,
        "{ops:#?}"
    );
    let after = h.maps.snapshot().unwrap();
    assert!(before.svc.iter().all(|(k, v)| after.svc.get(k) == Some(v)));
    // And the sync after writes nothing.
    assert!(h.sync(true).is_empty());
}
