// SPDX-License-Identifier: Apache-2.0
//! `categorize_endpoints`: upstream's TestCategorizeEndpoints cases restated, plus the
//! node-hint (PreferSameNode) rules of current upstream.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::model::topology::LABEL_TOPOLOGY_ZONE;
use crate::model::{
    Endpoint, EndpointHints, HintNames, Protocol, ServicePort, categorize_endpoints,
};

const NODE: &str = "test-node";

/// An endpoint with every condition false, not local, no hints.
fn ep(addr: &str) -> Endpoint {
    let addr: SocketAddr = addr.parse().unwrap();
    Endpoint {
        ready: false,
        serving: false,
        ..Endpoint::ready_at(addr)
    }
}

trait EndpointExt {
    fn ready(self) -> Self;
    fn serving_terminating(self) -> Self;
    fn local(self) -> Self;
    fn zones(self, zones: &[&str]) -> Self;
    fn nodes(self, nodes: &[&str]) -> Self;
}

impl EndpointExt for Endpoint {
    fn ready(mut self) -> Self {
        self.ready = true;
        self
    }
    fn serving_terminating(mut self) -> Self {
        self.serving = true;
        self.terminating = true;
        self
    }
    fn local(mut self) -> Self {
        self.is_local = true;
        self
    }
    fn zones(mut self, zones: &[&str]) -> Self {
        self.hints = EndpointHints::new(Some(hint_names(zones)), self.node_hints().cloned());
        self
    }
    fn nodes(mut self, nodes: &[&str]) -> Self {
        self.hints = EndpointHints::new(self.zone_hints().cloned(), Some(hint_names(nodes)));
        self
    }
}

fn hint_names(names: &[&str]) -> HintNames {
    names.iter().map(|name| Arc::from(*name)).collect()
}

#[derive(Clone, Copy, Default)]
struct Policy {
    internal_local: bool,
    external_local: bool,
    node_port: Option<u16>,
}

fn service(policy: Policy) -> ServicePort {
    ServicePort {
        cluster_ip: "172.30.0.41".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: policy.node_port,
        external_ips: vec![],
        load_balancer_ingress: vec![],
        load_balancer_source_ranges: vec![],
        external_policy_local: policy.external_local,
        internal_policy_local: policy.internal_local,
        health_check_node_port: None,
        session_affinity: None,
        load_balancer_algorithm: None,
    }
}

fn zone_labels(zone: Option<&str>) -> BTreeMap<String, String> {
    zone.map(|z| BTreeMap::from([(LABEL_TOPOLOGY_ZONE.to_owned(), z.to_owned())]))
        .unwrap_or_default()
}

fn addrs(endpoints: &[Arc<Endpoint>]) -> BTreeSet<String> {
    endpoints.iter().map(|e| e.to_string()).collect()
}

fn set(addresses: &[&str]) -> BTreeSet<String> {
    addresses.iter().map(|a| (*a).to_owned()).collect()
}

/// One upstream case. `None` for cluster/local means "the service never uses that kind
/// of endpoints"; `all` may be left out when only one of them is used.
#[derive(Default)]
struct Case<'a> {
    name: &'a str,
    zone: Option<&'a str>,
    policy: Policy,
    endpoints: Vec<Endpoint>,
    cluster: Option<&'a [&'a str]>,
    local: Option<&'a [&'a str]>,
    all: Option<&'a [&'a str]>,
    only_remote: bool,
}

fn check(case: Case<'_>) {
    let svc = service(case.policy);
    let endpoints: Vec<Arc<Endpoint>> = case.endpoints.into_iter().map(Arc::new).collect();
    let got = categorize_endpoints(&endpoints, &svc, NODE, &zone_labels(case.zone));
    let name = case.name;

    assert_eq!(
        svc.uses_cluster_endpoints(),
        case.cluster.is_some(),
        "{name}: uses cluster"
    );
    assert_eq!(
        svc.uses_local_endpoints(),
        case.local.is_some(),
        "{name}: uses local"
    );
    assert_eq!(
        addrs(&got.cluster),
        set(case.cluster.unwrap_or_default()),
        "{name}: cluster"
    );
    assert_eq!(
        addrs(&got.local),
        set(case.local.unwrap_or_default()),
        "{name}: local"
    );
    let expected_all = match (case.cluster, case.local) {
        (Some(cluster), None) => set(cluster),
        (None, Some(local)) => set(local),
        _ => set(case.all.expect("case must state all endpoints")),
    };
    assert_eq!(
        addrs(&got.all_reachable),
        expected_all,
        "{name}: all reachable"
    );
    assert_eq!(
        got.has_any_endpoints,
        !expected_all.is_empty() || case.only_remote,
        "{name}: has any endpoints"
    );
}

fn zone_abca() -> Vec<Endpoint> {
    vec![
        ep("10.1.2.3:80").zones(&["zone-a"]).ready(),
        ep("10.1.2.4:80").zones(&["zone-b"]).ready(),
        ep("10.1.2.5:80").zones(&["zone-c"]).ready(),
        ep("10.1.2.6:80").zones(&["zone-a"]).ready(),
    ]
}

fn zone_abca_with_3_4_local() -> Vec<Endpoint> {
    vec![
        ep("10.1.2.3:80").zones(&["zone-a"]).ready().local(),
        ep("10.1.2.4:80").zones(&["zone-b"]).ready().local(),
        ep("10.1.2.5:80").zones(&["zone-c"]).ready(),
        ep("10.1.2.6:80").zones(&["zone-a"]).ready(),
    ]
}

#[test]
fn uses_topology_when_every_endpoint_has_hints_and_one_is_for_this_zone() {
    check(Case {
        name: "zone-a node, hints a,b,c,a",
        zone: Some("zone-a"),
        endpoints: zone_abca(),
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        ..Case::default()
    });
}

#[test]
fn external_policy_local_ignores_topology_for_local_endpoints() {
    check(Case {
        name: "eTP=Local",
        zone: Some("zone-a"),
        policy: Policy {
            external_local: true,
            node_port: Some(8080),
            ..Policy::default()
        },
        endpoints: zone_abca_with_3_4_local(),
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        ..Case::default()
    });
}

#[test]
fn internal_policy_local_ignores_topology_for_local_endpoints() {
    check(Case {
        name: "iTP=Local",
        zone: Some("zone-a"),
        policy: Policy {
            internal_local: true,
            node_port: Some(8080),
            ..Policy::default()
        },
        endpoints: zone_abca_with_3_4_local(),
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        ..Case::default()
    });
}

#[test]
fn no_zone_for_this_node_means_no_filtering() {
    for (name, zone) in [("no node labels", None), ("empty zone label", Some(""))] {
        check(Case {
            name,
            zone,
            endpoints: vec![ep("10.1.2.3:80").zones(&["zone-a"]).ready()],
            cluster: Some(&["10.1.2.3:80"]),
            ..Case::default()
        });
    }
}

#[test]
fn node_in_a_zone_no_endpoint_is_hinted_for_means_no_filtering() {
    check(Case {
        name: "zone-b node, only hint zone-a",
        zone: Some("zone-b"),
        endpoints: vec![ep("10.1.2.3:80").zones(&["zone-a"]).ready()],
        cluster: Some(&["10.1.2.3:80"]),
        ..Case::default()
    });
}

#[test]
fn unready_endpoints_are_left_out_of_the_zone_set() {
    let mut endpoints = zone_abca();
    endpoints[3].ready = false;
    check(Case {
        name: "unready endpoint",
        zone: Some("zone-a"),
        endpoints,
        cluster: Some(&["10.1.2.3:80"]),
        ..Case::default()
    });
}

#[test]
fn only_unready_endpoints_in_this_zone_means_no_filtering() {
    let mut endpoints = zone_abca();
    endpoints[0].ready = false;
    endpoints[3].ready = false;
    check(Case {
        name: "only unready in zone-a",
        zone: Some("zone-a"),
        endpoints,
        cluster: Some(&["10.1.2.4:80", "10.1.2.5:80"]),
        ..Case::default()
    });
}

#[test]
fn an_endpoint_without_hints_disables_filtering() {
    let mut endpoints = zone_abca();
    endpoints[2].hints = EndpointHints::new(None, endpoints[2].node_hints().cloned());
    check(Case {
        name: "missing hint",
        zone: Some("zone-a"),
        endpoints,
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
        ..Case::default()
    });
}

#[test]
fn an_endpoint_hinted_for_several_zones_serves_each() {
    check(Case {
        name: "multiple hints per endpoint",
        zone: Some("zone-c"),
        endpoints: vec![
            ep("10.1.2.3:80")
                .zones(&["zone-a", "zone-b", "zone-c"])
                .ready(),
            ep("10.1.2.4:80").zones(&["zone-b", "zone-c"]).ready(),
            ep("10.1.2.5:80").zones(&["zone-b", "zone-d"]).ready(),
            ep("10.1.2.6:80").zones(&["zone-c"]).ready(),
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        ..Case::default()
    });
}

#[test]
fn conflicting_topology_and_locality_merge_into_all_reachable() {
    check(Case {
        name: "conflicting topology and localness",
        zone: Some("zone-a"),
        policy: Policy {
            external_local: true,
            node_port: Some(8080),
            ..Policy::default()
        },
        endpoints: vec![
            ep("10.0.0.0:80").zones(&["zone-a"]).ready().local(),
            ep("10.0.0.1:80").zones(&["zone-b"]).ready().local(),
            ep("10.0.0.2:80").zones(&["zone-a"]).ready(),
            ep("10.0.0.3:80").zones(&["zone-b"]).ready(),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
        local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"]),
        ..Case::default()
    });
}

#[test]
fn internal_policy_local_on_internal_only_services() {
    let itp_local = Policy {
        internal_local: true,
        ..Policy::default()
    };
    check(Case {
        name: "no endpoints at all",
        policy: itp_local,
        local: Some(&[]),
        ..Case::default()
    });
    check(Case {
        name: "all endpoints remote: drop, not reject",
        policy: itp_local,
        endpoints: vec![ep("10.0.0.0:80").ready(), ep("10.0.0.1:80").ready()],
        local: Some(&[]),
        only_remote: true,
        ..Case::default()
    });
    check(Case {
        name: "all endpoints local",
        policy: itp_local,
        endpoints: vec![
            ep("10.0.0.0:80").ready().local(),
            ep("10.0.0.1:80").ready().local(),
        ],
        local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..Case::default()
    });
    check(Case {
        name: "some endpoints local",
        policy: itp_local,
        endpoints: vec![ep("10.0.0.0:80").ready().local(), ep("10.0.0.1:80").ready()],
        local: Some(&["10.0.0.0:80"]),
        ..Case::default()
    });
    check(Case {
        name: "no cluster endpoints for an internal-only iTP=Local service",
        policy: itp_local,
        endpoints: vec![ep("10.0.0.0:80").ready(), ep("10.0.0.1:80").ready().local()],
        local: Some(&["10.0.0.1:80"]),
        ..Case::default()
    });
}

#[test]
fn cluster_policy_uses_ready_endpoints_then_serving_terminating_ones() {
    check(Case {
        name: "no endpoint ready",
        endpoints: vec![ep("10.0.0.0:80"), ep("10.0.0.1:80")],
        cluster: Some(&[]),
        ..Case::default()
    });
    check(Case {
        name: "some endpoints ready",
        endpoints: vec![ep("10.0.0.0:80"), ep("10.0.0.1:80").ready()],
        cluster: Some(&["10.0.0.1:80"]),
        ..Case::default()
    });
    check(Case {
        name: "all endpoints terminating",
        endpoints: vec![
            ep("10.0.0.0:80").serving_terminating().local(),
            ep("10.0.0.1:80").serving_terminating(),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..Case::default()
    });
}

#[test]
fn externally_accessible_services_use_both_sets() {
    let some_local = || vec![ep("10.0.0.0:80").ready().local(), ep("10.0.0.1:80").ready()];
    for (name, internal_local, external_local) in [
        ("iTP=Local eTP=Cluster", true, false),
        ("iTP=Cluster eTP=Local", false, true),
        ("iTP=Local eTP=Local", true, true),
    ] {
        check(Case {
            name,
            policy: Policy {
                internal_local,
                external_local,
                node_port: Some(8080),
            },
            endpoints: some_local(),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..Case::default()
        });
    }
    let both_local = Policy {
        internal_local: true,
        external_local: true,
        node_port: Some(8080),
    };
    check(Case {
        name: "iTP=Local eTP=Local, all endpoints remote",
        policy: both_local,
        endpoints: vec![ep("10.0.0.0:80").ready(), ep("10.0.0.1:80").ready()],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&[]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..Case::default()
    });
    check(Case {
        name: "iTP=Local eTP=Local, all endpoints remote and terminating",
        policy: both_local,
        endpoints: vec![
            ep("10.0.0.0:80").serving_terminating(),
            ep("10.0.0.1:80").serving_terminating(),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&[]),
        all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        only_remote: true,
        ..Case::default()
    });
}

#[test]
fn terminating_fallback_is_judged_separately_for_cluster_and_local() {
    let mut not_serving_local = ep("10.0.0.1:80").local();
    not_serving_local.serving = false;
    check(Case {
        name: "iTP=Cluster eTP=Local with terminating endpoints",
        policy: Policy {
            external_local: true,
            node_port: Some(8080),
            ..Policy::default()
        },
        endpoints: vec![
            ep("10.0.0.0:80").ready(),
            not_serving_local,
            ep("10.0.0.2:80").serving_terminating().local(),
            ep("10.0.0.3:80").serving_terminating(),
        ],
        cluster: Some(&["10.0.0.0:80"]),
        local: Some(&["10.0.0.2:80"]),
        all: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
        ..Case::default()
    });
}

#[test]
fn external_policy_is_ignored_when_not_externally_accessible() {
    check(Case {
        name: "eTP=Local without node port, external IP or LB VIP",
        policy: Policy {
            external_local: true,
            ..Policy::default()
        },
        endpoints: vec![ep("10.0.0.0:80").ready(), ep("10.0.0.1:80").ready().local()],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        ..Case::default()
    });
}

#[test]
fn node_hints_win_when_every_ready_endpoint_has_one_for_some_node() {
    check(Case {
        name: "PreferSameNode",
        zone: Some("zone-a"),
        endpoints: vec![
            ep("10.1.2.3:80").zones(&["zone-a"]).nodes(&[NODE]).ready(),
            ep("10.1.2.4:80")
                .zones(&["zone-a"])
                .nodes(&["other-node"])
                .ready(),
            ep("10.1.2.5:80")
                .zones(&["zone-b"])
                .nodes(&["third-node"])
                .ready(),
        ],
        cluster: Some(&["10.1.2.3:80"]),
        ..Case::default()
    });
}

#[test]
fn node_hints_fall_back_to_zone_hints() {
    check(Case {
        name: "no node hint for this node",
        zone: Some("zone-a"),
        endpoints: vec![
            ep("10.1.2.3:80")
                .zones(&["zone-a"])
                .nodes(&["other-node"])
                .ready(),
            ep("10.1.2.4:80")
                .zones(&["zone-a"])
                .nodes(&["other-node"])
                .ready(),
            ep("10.1.2.5:80")
                .zones(&["zone-b"])
                .nodes(&["third-node"])
                .ready(),
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        ..Case::default()
    });
    check(Case {
        name: "an endpoint without a node hint",
        zone: Some("zone-b"),
        endpoints: vec![
            ep("10.1.2.3:80").zones(&["zone-a"]).nodes(&[NODE]).ready(),
            ep("10.1.2.4:80").zones(&["zone-b"]).ready(),
        ],
        cluster: Some(&["10.1.2.4:80"]),
        ..Case::default()
    });
    check(Case {
        name: "node hints only, none for this node",
        zone: Some("zone-a"),
        endpoints: vec![
            ep("10.1.2.3:80").nodes(&["other-node"]).ready(),
            ep("10.1.2.4:80").nodes(&["third-node"]).ready(),
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        ..Case::default()
    });
}

#[test]
fn hints_of_unready_endpoints_do_not_count() {
    // The unready endpoint has no hint at all, yet topology applies: only ready endpoints
    // are inspected.
    check(Case {
        name: "unready endpoint without hints",
        zone: Some("zone-a"),
        endpoints: vec![
            ep("10.1.2.3:80").zones(&["zone-a"]).ready(),
            ep("10.1.2.4:80").zones(&["zone-b"]).ready(),
            ep("10.1.2.5:80"),
        ],
        cluster: Some(&["10.1.2.3:80"]),
        ..Case::default()
    });
}

#[test]
fn all_reachable_keeps_input_order() {
    let svc = service(Policy {
        external_local: true,
        node_port: Some(8080),
        ..Policy::default()
    });
    let endpoints: Vec<Arc<Endpoint>> = vec![
        Arc::new(ep("10.0.0.9:80").zones(&["zone-b"]).ready().local()),
        Arc::new(ep("10.0.0.1:80").zones(&["zone-a"]).ready()),
        Arc::new(ep("10.0.0.5:80").zones(&["zone-a"]).ready().local()),
    ];
    let got = categorize_endpoints(&endpoints, &svc, NODE, &zone_labels(Some("zone-a")));
    let order: Vec<String> = got.all_reachable.iter().map(|e| e.to_string()).collect();
    assert_eq!(order, ["10.0.0.9:80", "10.0.0.1:80", "10.0.0.5:80"]);
}

#[test]
fn hint_names_are_a_set() {
    let names = hint_names(&["zone-b", "zone-a", "zone-b"]);
    assert_eq!(names, hint_names(&["zone-a", "zone-b"]));
    assert_eq!(names.iter().collect::<Vec<_>>(), ["zone-a", "zone-b"]);
    assert!(names.contains("zone-a") && names.contains("zone-b") && !names.contains("zone-c"));
    assert!(hint_names(&[]).is_empty());
    // An endpoint given no hint of either kind has no hints at all.
    assert_eq!(ep("10.1.2.3:80").hints, None);
    assert_eq!(EndpointHints::new(None, None), None);
}
