// SPDX-License-Identifier: Apache-2.0
//! The apply stage against in-memory maps: contents, write order, incremental syncs,
//! drift repair and restart adoption.

use std::{collections::HashSet, net::IpAddr, sync::Arc};

use proxy_common::{SCOPE_EXTERNAL, SCOPE_INTERNAL, svc_flags};

use super::{
    apply::{ApplyState, PlannedSync, PreparedSync},
    budget::MapKind,
    desired::FrontendKey,
    entries::SvcEntryKey,
    maps::{LbMaps, Op as LoggedOp, OpLog},
};
use crate::{
    k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
    model::{ClusterState, IpFamily, NamespacedName},
    node::NodeAddresses,
    proxier::{NodeContext, SyncStats},
};

pub(super) const TCP: u8 = 6;

pub(super) struct Harness {
    pub(super) cluster: ClusterState,
    pub(super) node: NodeContext,
    pub(super) apply: ApplyState,
    pub(super) maps: LbMaps,
    pub(super) log: OpLog,
}

impl Harness {
    pub(super) fn new() -> Self {
        Self::with_maps(LbMaps::in_memory(1024), ApplyState::new(1024, 1024))
    }

    /// A harness over `maps` (with their log) and `apply`.
    pub(super) fn with_maps((maps, log): (LbMaps, OpLog), apply: ApplyState) -> Self {
        Self {
            cluster: ClusterState::new(&[IpFamily::V4], "node-a"),
            node: NodeContext {
                name: "node-a".into(),
                primary_ips: NodeAddresses {
                    v4: Some("192.168.0.2".parse().unwrap()),
                    v6: None,
                },
                host_addresses: vec!["192.168.0.2".parse().unwrap()],
                ..Default::default()
            },
            apply,
            maps,
            log,
        }
    }

    pub(super) fn service(&mut self, svc: k8s_openapi::api::core::v1::Service) {
        self.cluster.service(&Arc::new(svc), false);
    }

    pub(super) fn delete_service(&mut self, svc: k8s_openapi::api::core::v1::Service) {
        self.cluster.service(&Arc::new(svc), true);
    }

    pub(super) fn slice(&mut self, slice: k8s_openapi::api::discovery::v1::EndpointSlice) {
        self.cluster.endpoint_slice(&slice, false);
    }

    /// Applies pending changes and plans a sync of them (of everything when `full`)
    /// without writing it.
    pub(super) fn plan_pending(&mut self, full: bool) -> PlannedSync {
        let changes = self.cluster.apply_pending();
        self.apply
            .plan(
                &self.maps,
                self.cluster.families(),
                &self.node,
                &changes.changed,
                full,
            )
            .expect("plan succeeds")
    }

    /// Applies pending changes and prepares a sync of them (of everything when `full`):
    /// the services to admit, not admitted yet.
    pub(super) fn prepare_pending(&mut self, full: bool) -> PreparedSync {
        let changes = self.cluster.apply_pending();
        self.apply
            .prepare(
                &self.maps,
                self.cluster.families(),
                &self.node,
                &changes.changed,
                full,
            )
            .expect("prepare succeeds")
    }

    /// Applies pending changes and syncs; returns the logged map operations.
    pub(super) fn sync(&mut self, full: bool) -> Vec<LoggedOp> {
        self.sync_with_stats(full).0
    }

    /// Applies pending changes and syncs; returns the logged map operations and the stats.
    pub(super) fn sync_with_stats(&mut self, full: bool) -> (Vec<LoggedOp>, SyncStats) {
        let changes = self.cluster.apply_pending();
        self.log.lock().unwrap().clear();
        let stats = self
            .apply
            .sync(
                &mut self.maps,
                self.cluster.families(),
                &self.node,
                &changes.changed,
                full,
            )
            .expect("sync succeeds");
        // The entry counts the agent keeps from sync to sync are those its own account
        // gives when counted afresh (the full count a partial sync no longer makes).
        let counted = self.apply.entries();
        for usage in &stats.map_usage {
            let (kind, family) = MapKind::ALL
                .into_iter()
                .flat_map(|k| [(k, IpFamily::V4), (k, IpFamily::V6)])
                .find(|(k, f)| k.map_name(*f) == usage.map)
                .expect("a budgeted map");
            assert_eq!(
                usage.entries,
                counted.get(kind, family),
                "{} entries after a {} sync",
                usage.map,
                if full { "full" } else { "partial" }
            );
        }
        (self.log.lock().unwrap().clone(), stats)
    }

    pub(super) fn svc(
        &self,
        addr: &str,
        port: u16,
        scope: u8,
        slot: u16,
    ) -> Option<proxy_common::SvcValue> {
        let snapshot = self.maps.snapshot().unwrap();
        snapshot
            .svc
            .get(&SvcEntryKey {
                frontend: FrontendKey {
                    addr: addr.parse().unwrap(),
                    port,
                    proto: TCP,
                },
                scope,
                slot,
            })
            .copied()
    }

    pub(super) fn backends_of(&self, addr: &str, port: u16, scope: u8) -> Vec<String> {
        let snapshot = self.maps.snapshot().unwrap();
        let Some(slot0) = self.svc(addr, port, scope, 0) else {
            return Vec::new();
        };
        let mut out: Vec<String> = (1..=slot0.count)
            .map(|slot| {
                let id = self
                    .svc(addr, port, scope, slot)
                    .expect("slot present")
                    .backend_id;
                let b = snapshot
                    .backends
                    .get(&(false, id))
                    .expect("backend present");
                format!("{}:{}", b.addr.addr, b.addr.port)
            })
            .collect();
        out.sort();
        out
    }
}

fn web(eps: &[&str]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let mut b = mk_endpointslice("ns1", "web-1", "web", "IPv4").port("http", 8080, "TCP");
    for ep in eps {
        b = b.endpoint(mk_endpoint(ep).node("node-b").build());
    }
    b.build()
}

fn web_service() -> k8s_openapi::api::core::v1::Service {
    mk_service("ns1", "web")
        .cluster_ip("172.30.0.10")
        .port("http", 80, "TCP")
        .build()
}

/// LoadBalancer "lb" with eTP=Local: ClusterIP 172.30.0.30:80, NodePort 30080, LB IP
/// 1.2.3.4.
pub(super) fn etp_local_lb_service() -> k8s_openapi::api::core::v1::Service {
    mk_service("ns1", "lb")
        .type_("LoadBalancer")
        .cluster_ip("172.30.0.30")
        .node_port("http", 80, "TCP", 30080)
        .lb_ingress("1.2.3.4", None)
        .external_traffic_policy("Local")
        .health_check_node_port(30000)
        .build()
}

/// The endpoints of [`etp_local_lb_service`]: 10.0.3.1 on this node, 10.0.3.2 on another.
pub(super) fn etp_local_lb_slice() -> k8s_openapi::api::discovery::v1::EndpointSlice {
    mk_endpointslice("ns1", "lb-1", "lb", "IPv4")
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.3.1").node("node-a").build())
        .endpoint(mk_endpoint("10.0.3.2").node("node-b").build())
        .build()
}

/// Index of the last logged op matching `pred`.
pub(super) fn last_pos(ops: &[LoggedOp], pred: impl Fn(&LoggedOp) -> bool) -> usize {
    ops.iter()
        .rposition(pred)
        .unwrap_or_else(|| panic!("no such op in {ops:#?}"))
}

/// Index of the first logged op matching `pred`.
fn pos(ops: &[LoggedOp], pred: impl Fn(&LoggedOp) -> bool) -> usize {
    ops.iter()
        .position(pred)
        .unwrap_or_else(|| panic!("no such op in {ops:#?}"))
}

pub(super) fn is_put<'a>(map: &'static str, key_part: &'a str) -> impl Fn(&LoggedOp) -> bool + 'a {
    move |op| matches!(op, LoggedOp::Put { map: m, key } if *m == map && key.contains(key_part))
}

fn is_del<'a>(map: &'static str, key_part: &'a str) -> impl Fn(&LoggedOp) -> bool + 'a {
    move |op| matches!(op, LoggedOp::Delete { map: m, key } if *m == map && key.contains(key_part))
}

#[test]
fn a_cluster_ip_service_is_written_backends_first_slot_zero_last() {
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1", "10.0.1.2"]));
    let ops = h.sync(false);

    assert_eq!(
        h.backends_of("172.30.0.10", 80, SCOPE_EXTERNAL),
        vec!["10.0.1.1:8080", "10.0.1.2:8080"]
    );
    let slot0 = h.svc("172.30.0.10", 80, SCOPE_EXTERNAL, 0).unwrap();
    assert_eq!(slot0.count, 2);
    assert_ne!(slot0.flags & svc_flags::CLUSTER_IP, 0);
    // The wildcard entry of the ClusterIP rejects other ports.
    let wildcard = h
        .maps
        .snapshot()
        .unwrap()
        .svc
        .into_iter()
        .find(|(k, _)| k.frontend.port == 0);
    assert_eq!(wildcard.map(|(_, v)| v.flags), Some(svc_flags::WILDCARD));

    let first_slot0 = pos(
        &ops,
        |op| matches!(op, LoggedOp::Put { map: "SVC4_V2", key } if key.contains("slot: 0") && key.contains("dport: 20480")),
    );
    let last_backend = last_pos(&ops, is_put("BACKENDS4_V1", ""));
    let rev_nat = pos(&ops, is_put("REV_NAT4_V2", ""));
    let slot1 = pos(
        &ops,
        |op| matches!(op, LoggedOp::Put { map: "SVC4_V2", key } if key.contains("slot: 1")),
    );
    assert!(
        last_backend < slot1 && rev_nat < slot1 && slot1 < first_slot0,
        "{ops:#?}"
    );
}

#[test]
fn scaling_touches_only_what_changed_in_a_safe_order() {
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1", "10.0.1.2"]));
    h.sync(false);

    // Grow: new backend, then slot 3, then slot 0 with the new count.
    h.slice(web(&["10.0.1.1", "10.0.1.2", "10.0.1.3"]));
    let ops = h.sync(false);
    assert!(
        ops.iter().all(|op| matches!(op, LoggedOp::Put { .. })),
        "{ops:#?}"
    );
    let backend = pos(&ops, is_put("BACKENDS4_V1", ""));
    let slot3 = pos(&ops, is_put("SVC4_V2", "slot: 3"));
    let slot0 = pos(&ops, is_put("SVC4_V2", "slot: 0"));
    assert!(backend < slot3 && slot3 < slot0);
    assert_eq!(
        ops.len(),
        3,
        "only the new backend, its slot and slot 0: {ops:#?}"
    );

    // Shrink to one: slot 0 first (count 1), then the extra slots and the unused backends.
    h.slice(web(&["10.0.1.3"]));
    let ops = h.sync(false);
    let slot0 = pos(&ops, is_put("SVC4_V2", "slot: 0"));
    let first_del = pos(&ops, |op| matches!(op, LoggedOp::Delete { .. }));
    let backend_del = pos(&ops, is_del("BACKENDS4_V1", ""));
    assert!(slot0 < first_del && first_del <= backend_del);
    assert_eq!(
        h.backends_of("172.30.0.10", 80, SCOPE_EXTERNAL),
        vec!["10.0.1.3:8080"]
    );
    assert_eq!(h.maps.snapshot().unwrap().backends.len(), 1);
}

#[test]
fn a_deleted_service_disappears_slot_zero_first_and_leaves_nothing() {
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1"]));
    h.sync(false);
    h.delete_service(web_service());
    let ops = h.sync(false);
    let slot0 = pos(
        &ops,
        |op| matches!(op, LoggedOp::Delete { map: "SVC4_V2", key } if key.contains("slot: 0") && key.contains("dport: 20480")),
    );
    let slot1 = pos(&ops, is_del("SVC4_V2", "slot: 1"));
    let rev_nat = pos(&ops, is_del("REV_NAT4_V2", ""));
    let backend = pos(&ops, is_del("BACKENDS4_V1", ""));
    assert!(
        slot0 < slot1 && slot1 < rev_nat && rev_nat < backend,
        "{ops:#?}"
    );
    let snapshot = h.maps.snapshot().unwrap();
    assert!(snapshot.svc.is_empty() && snapshot.backends.is_empty() && snapshot.rev_nat.is_empty());
}

#[test]
fn a_change_to_one_service_touches_only_its_entries() {
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1"]));
    h.service(
        mk_service("ns2", "db")
            .cluster_ip("172.30.0.20")
            .port("sql", 5432, "TCP")
            .build(),
    );
    h.slice(
        mk_endpointslice("ns2", "db-1", "db", "IPv4")
            .port("sql", 5432, "TCP")
            .endpoint(mk_endpoint("10.0.2.1").build())
            .build(),
    );
    h.sync(false);
    h.slice(web(&["10.0.1.9"]));
    let ops = h.sync(false);
    assert!(!ops.is_empty());
    for op in &ops {
        let key = match op {
            LoggedOp::Put { key, .. } | LoggedOp::Delete { key, .. } => key,
        };
        // 172.30.0.20 is 0x14001eac in native order; no op may name it or its backend.
        assert!(
            !key.contains(&u32::from_ne_bytes([172, 30, 0, 20]).to_string()),
            "{op:?}"
        );
        assert!(
            !key.contains(&u32::from_ne_bytes([10, 0, 2, 1]).to_string()),
            "{op:?}"
        );
    }
}

#[test]
fn a_full_sync_after_partial_ones_writes_nothing_and_repairs_drift() {
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1", "10.0.1.2"]));
    h.sync(false);
    assert!(h.sync(true).is_empty(), "nothing differs");

    // Someone deletes slot 2 and adds an entry of their own.
    let slot2 = SvcEntryKey {
        frontend: FrontendKey {
            addr: "172.30.0.10".parse().unwrap(),
            port: 80,
            proto: TCP,
        },
        scope: SCOPE_EXTERNAL,
        slot: 2,
    };
    let value = h.svc("172.30.0.10", 80, SCOPE_EXTERNAL, 2).unwrap();
    h.maps.del_svc(&slot2).unwrap();
    let stray = SvcEntryKey {
        frontend: FrontendKey {
            addr: "172.30.9.9".parse().unwrap(),
            port: 1,
            proto: TCP,
        },
        scope: SCOPE_EXTERNAL,
        slot: 0,
    };
    h.maps.put_svc(&stray, &value).unwrap();
    let ops = h.sync(true);
    assert_eq!(ops.len(), 2, "{ops:#?}");
    assert_eq!(h.svc("172.30.0.10", 80, SCOPE_EXTERNAL, 2), Some(value));
    assert!(h.svc("172.30.9.9", 1, SCOPE_EXTERNAL, 0).is_none());
}

#[test]
fn a_restarted_agent_adopts_the_maps_without_rewriting_them() {
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1", "10.0.1.2"]));
    h.sync(false);
    let before = h.maps.snapshot().unwrap();

    // A new agent: fresh state and trackers, same maps.
    h.apply = ApplyState::new(1024, 1024);
    h.cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    h.service(web_service());
    h.slice(web(&["10.0.1.2", "10.0.1.1"]));
    let ops = h.sync(true);
    assert!(ops.is_empty(), "identical entries keep their ids: {ops:#?}");
    assert_eq!(h.maps.snapshot().unwrap(), before);
}

#[test]
fn a_restarted_agent_adopts_every_frontend_of_several_services_without_a_write() {
    // Frontends of several services side by side in the maps (a ClusterIP, a load
    // balancer IP and a NodePort with two scopes): each service adopts exactly its own.
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1", "10.0.1.2", "10.0.1.3"]));
    h.service(etp_local_lb_service());
    h.slice(etp_local_lb_slice());
    h.sync(false);
    let before = h.maps.snapshot().unwrap();

    h.apply = ApplyState::new(1024, 1024);
    h.cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    h.service(etp_local_lb_service());
    h.slice(etp_local_lb_slice());
    h.service(web_service());
    h.slice(web(&["10.0.1.3", "10.0.1.1", "10.0.1.2"]));
    let ops = h.sync(true);
    assert!(ops.is_empty(), "every entry is adopted as it is: {ops:#?}");
    assert_eq!(h.maps.snapshot().unwrap(), before);
    // And the adopted state is the agent's own: a change writes only what changed.
    h.slice(web(&["10.0.1.1", "10.0.1.2"]));
    let ops = h.sync(false);
    assert!(!ops.is_empty());
    assert_eq!(
        h.backends_of("1.2.3.4", 80, SCOPE_EXTERNAL),
        vec!["10.0.3.1:8080"]
    );
}

#[test]
fn etp_local_gets_two_scopes_internal_written_before_the_external_slot_zero() {
    let mut h = Harness::new();
    h.service(etp_local_lb_service());
    h.slice(etp_local_lb_slice());
    let ops = h.sync(false);
    let ext = h.svc("1.2.3.4", 80, SCOPE_EXTERNAL, 0).unwrap();
    assert_ne!(ext.flags & svc_flags::TWO_SCOPES, 0);
    assert_ne!(ext.flags & svc_flags::ETP_LOCAL, 0);
    assert_eq!(
        h.backends_of("1.2.3.4", 80, SCOPE_EXTERNAL),
        vec!["10.0.3.1:8080"]
    );
    assert_eq!(
        h.backends_of("1.2.3.4", 80, SCOPE_INTERNAL),
        vec!["10.0.3.1:8080", "10.0.3.2:8080"]
    );
    // The NodePort entry uses the unspecified address.
    assert_eq!(
        h.backends_of("0.0.0.0", 30080, SCOPE_EXTERNAL),
        vec!["10.0.3.1:8080"]
    );
    let lb = u32::from_ne_bytes([1, 2, 3, 4]).to_string();
    let internal0 = pos(
        &ops,
        |op| matches!(op, LoggedOp::Put { map: "SVC4_V2", key } if key.contains(&lb) && key.contains("slot: 0") && key.contains("scope: 1")),
    );
    let external0 = pos(
        &ops,
        |op| matches!(op, LoggedOp::Put { map: "SVC4_V2", key } if key.contains(&lb) && key.contains("slot: 0") && key.contains("scope: 0")),
    );
    assert!(internal0 < external0);
    // The ClusterIP follows the internal policy (Cluster): every endpoint, one scope.
    assert_eq!(
        h.backends_of("172.30.0.30", 80, SCOPE_EXTERNAL),
        vec!["10.0.3.1:8080", "10.0.3.2:8080"]
    );
    assert!(h.svc("172.30.0.30", 80, SCOPE_INTERNAL, 0).is_none());
}

#[test]
fn no_endpoints_rejects_and_local_policy_without_local_endpoints_drops() {
    let mut h = Harness::new();
    h.service(
        mk_service("ns1", "itp")
            .cluster_ip("172.30.0.40")
            .port("http", 80, "TCP")
            .internal_traffic_policy("Local")
            .build(),
    );
    h.sync(false);
    let empty = h.svc("172.30.0.40", 80, SCOPE_EXTERNAL, 0).unwrap();
    assert_eq!(
        (empty.count, empty.flags & svc_flags::DROP_NO_ENDPOINTS),
        (0, 0)
    );
    h.slice(
        mk_endpointslice("ns1", "itp-1", "itp", "IPv4")
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.4.1").node("node-b").build())
            .build(),
    );
    h.sync(false);
    let remote_only = h.svc("172.30.0.40", 80, SCOPE_EXTERNAL, 0).unwrap();
    assert_eq!(remote_only.count, 0);
    assert_ne!(remote_only.flags & svc_flags::DROP_NO_ENDPOINTS, 0);
}

#[test]
fn source_ranges_and_node_level_maps() {
    let mut h = Harness::new();
    h.node.local_detector = crate::node::LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    h.service(
        mk_service("ns1", "lbr")
            .type_("LoadBalancer")
            .cluster_ip("172.30.0.50")
            .node_port("http", 80, "TCP", 30081)
            .lb_ingress("5.6.7.8", None)
            .source_ranges(&["192.168.0.0/24", " 203.0.113.0/25"])
            .build(),
    );
    h.slice(web(&["10.0.1.1"]));
    h.sync(false);
    let lb = h.svc("5.6.7.8", 80, SCOPE_EXTERNAL, 0).unwrap();
    assert_ne!(lb.flags & svc_flags::SOURCE_RANGES, 0);
    // The node (192.168.0.2) is inside the ranges, pods (10.0.0.0/8) are not.
    assert_ne!(lb.flags & svc_flags::SRC_RANGE_HOST_ALLOWED, 0);
    assert_eq!(
        lb.flags & (svc_flags::SRC_RANGE_PODS_ALLOWED | svc_flags::SRC_RANGE_PODS_DEFER),
        0
    );
    let ranges: HashSet<String> = h
        .maps
        .snapshot()
        .unwrap()
        .src_ranges
        .iter()
        .map(|(id, net)| {
            assert_eq!(*id, lb.rev_nat_id);
            net.to_string()
        })
        .collect();
    // The node IP is allowed, so is the LB IP itself.
    let expected: HashSet<String> = ["192.168.0.0/24", "203.0.113.0/25", "5.6.7.8/32"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(ranges, expected);
    let nodeports: Vec<IpAddr> = h
        .maps
        .snapshot()
        .unwrap()
        .nodeport_addrs
        .into_iter()
        .collect();
    assert_eq!(nodeports, vec!["192.168.0.2".parse::<IpAddr>().unwrap()]);
}

#[test]
fn affinity_entries_of_removed_backends_are_deleted() {
    let mut h = Harness::new();
    h.service(
        mk_service("ns1", "web")
            .cluster_ip("172.30.0.10")
            .port("http", 80, "TCP")
            .session_affinity_client_ip(Some(60))
            .build(),
    );
    h.slice(web(&["10.0.1.1", "10.0.1.2"]));
    h.sync(false);
    let slot0 = h.svc("172.30.0.10", 80, SCOPE_EXTERNAL, 0).unwrap();
    assert_eq!(slot0.backend_id, 60, "slot 0 carries the affinity timeout");
    let gone = h
        .svc("172.30.0.10", 80, SCOPE_EXTERNAL, 1)
        .unwrap()
        .backend_id;
    let kept = h
        .svc("172.30.0.10", 80, SCOPE_EXTERNAL, 2)
        .unwrap()
        .backend_id;
    let snapshot = h.maps.snapshot().unwrap();
    let gone_addr = snapshot.backends[&(false, gone)].addr.addr.to_string();
    for (client, backend) in [(1u8, gone), (2, kept)] {
        let key = proxy_common::AffinityKey {
            client: [client; 16],
            rev_nat_id: slot0.rev_nat_id,
            kind: 0,
            _pad: [0; 3],
        };
        h.maps
            .affinity
            .put(
                &key,
                &proxy_common::AffinityValue {
                    backend_id: backend,
                    last_used: 1,
                },
            )
            .unwrap();
    }
    let keep: Vec<&str> = ["10.0.1.1", "10.0.1.2"]
        .into_iter()
        .filter(|a| *a != gone_addr)
        .collect();
    h.slice(web(&keep));
    h.sync(false);
    let left: Vec<u32> = h
        .maps
        .affinity
        .entries()
        .unwrap()
        .iter()
        .map(|(_, v)| v.backend_id)
        .collect();
    assert_eq!(left, vec![kept]);
}

#[test]
fn ids_are_stable_and_shared_backends_survive_one_service_going() {
    let mut h = Harness::new();
    h.service(web_service());
    h.service(
        mk_service("ns1", "web2")
            .cluster_ip("172.30.0.11")
            .port("http", 80, "TCP")
            .build(),
    );
    h.slice(web(&["10.0.1.1"]));
    h.slice(
        mk_endpointslice("ns1", "web2-1", "web2", "IPv4")
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.1.1").build())
            .build(),
    );
    h.sync(false);
    assert_eq!(
        h.maps.snapshot().unwrap().backends.len(),
        1,
        "one shared backend"
    );
    h.delete_service(web_service());
    h.sync(false);
    assert_eq!(
        h.backends_of("172.30.0.11", 80, SCOPE_EXTERNAL),
        vec!["10.0.1.1:8080"]
    );
    let _ = NamespacedName::new("ns1", "web");
}

#[test]
fn an_id_freed_and_needed_in_the_same_sync_is_not_deleted_under_the_new_owner() {
    // One service loses its backend while another gains a new one in the same sync: the
    // freed id must not be reused by the newcomer, or the delete that follows would wipe
    // the newcomer's backend entry.
    let mut h = Harness::new();
    h.service(web_service());
    h.slice(web(&["10.0.1.1"]));
    let db = mk_service("ns2", "db")
        .cluster_ip("172.30.0.20")
        .port("sql", 5432, "TCP")
        .build();
    h.service(db.clone());
    h.slice(
        mk_endpointslice("ns2", "db-1", "db", "IPv4")
            .port("sql", 5432, "TCP")
            .endpoint(mk_endpoint("10.0.2.1").build())
            .build(),
    );
    h.sync(false);
    for round in 0..20 {
        // Alternate which service loses and which gains, so both HashSet orders occur.
        h.delete_service(db.clone());
        h.slice(web(&[&format!("10.0.1.{}", round + 2)]));
        h.sync(false);
        assert_eq!(
            h.backends_of("172.30.0.10", 80, SCOPE_EXTERNAL),
            vec![format!("10.0.1.{}:8080", round + 2)],
            "round {round}"
        );
        h.service(db.clone());
        h.slice(web(&["10.0.1.1"]));
        h.sync(false);
        assert!(
            h.sync(true).is_empty(),
            "a full sync finds nothing to repair (round {round})"
        );
    }
}

/// Thousands of services: enough for the sync to work out what each should have on
/// several threads, and to run other work beside the writes.
const MANY: usize = 5_000;

fn many_services(h: &mut Harness) {
    for i in 0..MANY {
        let (hi, lo) = (i / 250, i % 250);
        h.service(
            mk_service("ns1", &format!("svc{i}"))
                .cluster_ip(&format!("172.30.{hi}.{}", lo + 1))
                .port("http", 80, "TCP")
                .build(),
        );
        let mut slice = mk_endpointslice("ns1", &format!("svc{i}-1"), &format!("svc{i}"), "IPv4")
            .port("http", 8080, "TCP");
        for e in 1..=3 {
            slice = slice.endpoint(mk_endpoint(&format!("10.{e}.{hi}.{}", lo + 1)).build());
        }
        h.slice(slice.build());
    }
}

/// Maps with room for [`MANY`] services, and the services.
fn harness_with_many_services() -> Harness {
    let mut h = Harness::with_maps(
        LbMaps::in_memory(BIG),
        ApplyState::new(BIG as u32, BIG as u32),
    );
    many_services(&mut h);
    h
}

const BIG: usize = 1 << 16;

#[test]
fn thousands_of_services_split_over_threads_are_written_whole_and_in_order() {
    let mut h = harness_with_many_services();
    let ops = h.sync(false);
    for i in [0, 1, 249, 250, 2_500, MANY - 1] {
        let (hi, lo) = (i / 250, i % 250);
        let ip = format!("172.30.{hi}.{}", lo + 1);
        let want: Vec<String> = (1..=3)
            .map(|e| format!("10.{e}.{hi}.{}:8080", lo + 1))
            .collect();
        assert_eq!(h.backends_of(&ip, 80, SCOPE_EXTERNAL), want, "svc{i}");
    }
    // Backends before any slot; each frontend's slot 0 after its other slots, whatever
    // thread planned it.
    let first_svc = pos(&ops, is_put("SVC4_V2", ""));
    assert!(last_pos(&ops, is_put("BACKENDS4_V1", "")) < first_svc);
    let mut last_slot: std::collections::HashMap<String, (usize, usize)> = Default::default();
    for (index, op) in ops.iter().enumerate() {
        if let LoggedOp::Put {
            map: "SVC4_V2",
            key,
        } = op
        {
            let (frontend, slot) = key.split_once("slot: ").expect("a slot in the key");
            let entry = last_slot.entry(frontend.to_string()).or_default();
            if slot.starts_with("0,") || slot.starts_with("0 ") {
                entry.0 = index;
            } else {
                entry.1 = entry.1.max(index);
            }
        }
    }
    for (frontend, (slot0, others)) in &last_slot {
        assert!(others < slot0, "{frontend}");
    }
    let frontends = h
        .maps
        .snapshot()
        .unwrap()
        .svc
        .keys()
        .filter(|k| k.slot == 0 && k.frontend.port == 80)
        .count();
    assert_eq!(frontends, MANY);

    // A restarted agent adopts all of them without a write.
    let before = h.maps.snapshot().unwrap();
    h.apply = ApplyState::new(BIG as u32, BIG as u32);
    h.cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    many_services(&mut h);
    let ops = h.sync(true);
    assert!(ops.is_empty(), "{} writes", ops.len());
    assert_eq!(h.maps.snapshot().unwrap(), before);
}

#[test]
fn work_beside_a_big_write_sees_every_admitted_service_and_a_small_one_runs_after() {
    let mut h = harness_with_many_services();
    let planned = h.plan_pending(false);
    let caller = std::thread::current().id();
    let (stats, (ids, thread)) = h.apply.execute_alongside(&mut h.maps, planned, |state| {
        let ids: usize = (0..MANY)
            .map(|i| {
                let service = NamespacedName::new("ns1", format!("svc{i}"));
                state.frontend_ids(IpFamily::V4, &service).len()
            })
            .sum();
        (ids, std::thread::current().id())
    });
    stats.unwrap();
    assert_eq!(ids, MANY);
    assert_ne!(thread, caller, "a write this big has company");

    // One service more: written first, then the work beside, on this thread.
    h.service(
        mk_service("ns1", "one-more")
            .cluster_ip("172.31.0.1")
            .port("http", 80, "TCP")
            .build(),
    );
    let planned = h.plan_pending(false);
    let (stats, thread) = h
        .apply
        .execute_alongside(&mut h.maps, planned, |_| std::thread::current().id());
    stats.unwrap();
    assert_eq!(thread, caller);
}

#[test]
fn a_partial_sync_looks_at_a_service_in_the_families_that_have_it_or_had_it() {
    let mut h = Harness::new();
    h.cluster = ClusterState::new(&[IpFamily::V4, IpFamily::V6], "node-a");
    let dual = |families: &[&str]| {
        let ips: &[&str] = if families.len() == 2 {
            &["172.30.0.7", "fd00:30::7"]
        } else {
            &["172.30.0.7"]
        };
        mk_service("ns1", "both")
            .cluster_ips(ips)
            .ip_families(families)
            .port("http", 80, "TCP")
            .build()
    };
    h.service(dual(&["IPv4", "IPv6"]));
    h.service(
        mk_service("ns1", "four")
            .cluster_ip("172.30.0.8")
            .port("http", 80, "TCP")
            .build(),
    );
    for (name, family, ip) in [
        ("both-4", "IPv4", "10.0.7.1"),
        ("both-6", "IPv6", "fd00:7::1"),
    ] {
        h.slice(
            mk_endpointslice("ns1", name, "both", family)
                .port("http", 8080, "TCP")
                .endpoint(mk_endpoint(ip).node("node-b").build())
                .build(),
        );
    }
    h.slice(
        mk_endpointslice("ns1", "four-1", "four", "IPv4")
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.8.1").node("node-b").build())
            .build(),
    );
    // The IPv4-only service is nothing to the IPv6 maps: no candidate there.
    let prepared = h.prepare_pending(false);
    assert_eq!(
        prepared.candidate_names(),
        ["V4/ns1/both", "V4/ns1/four", "V6/ns1/both"]
    );
    let planned = h
        .apply
        .admit_prepared(prepared, h.cluster.families(), &h.node);
    h.apply.execute(&mut h.maps, planned).unwrap();
    let v6_entries = |h: &Harness| {
        let snapshot = h.maps.snapshot().unwrap();
        snapshot
            .svc
            .keys()
            .filter(|k| k.frontend.addr.is_ipv6())
            .count()
    };
    assert!(v6_entries(&h) > 0);

    // Down to IPv4: the IPv6 family no longer has it but had it, and takes its entries out.
    h.service(dual(&["IPv4"]));
    let prepared = h.prepare_pending(false);
    assert_eq!(prepared.candidate_names(), ["V4/ns1/both", "V6/ns1/both"]);
    let planned = h
        .apply
        .admit_prepared(prepared, h.cluster.families(), &h.node);
    h.apply.execute(&mut h.maps, planned).unwrap();
    assert_eq!(v6_entries(&h), 0);
}

#[test]
fn the_estimate_is_given_before_admission_with_whether_the_writes_go_ahead() {
    // A partial sync of thousands of services writes ahead; a full one never does.
    for full in [false, true] {
        let mut h = harness_with_many_services();
        let changes = h.cluster.apply_pending();
        let read = h.apply.read_maps(&h.maps, full).unwrap();
        let mut given = None;
        let prepared = h.apply.prepare_read(
            read,
            h.cluster.families(),
            &h.node,
            &changes.changed,
            |estimate, writes_ahead| given = Some((estimate.clone(), writes_ahead)),
        );
        let (estimate, writes_ahead) = given.expect("the estimate is given");
        assert_eq!(&estimate, prepared.estimated_peak());
        assert_eq!(estimate.get(MapKind::RevNat, IpFamily::V4), MANY);
        assert_eq!(writes_ahead, !full, "full: {full}");
    }
    // A few services are written with the rest of their sync.
    let mut h = Harness::new();
    h.service(
        mk_service("ns1", "one")
            .cluster_ip("172.30.0.1")
            .port("http", 80, "TCP")
            .build(),
    );
    let changes = h.cluster.apply_pending();
    let read = h.apply.read_maps(&h.maps, false).unwrap();
    let mut writes_ahead = None;
    h.apply.prepare_read(
        read,
        h.cluster.families(),
        &h.node,
        &changes.changed,
        |_, ahead| writes_ahead = Some(ahead),
    );
    assert_eq!(writes_ahead, Some(false));
}
