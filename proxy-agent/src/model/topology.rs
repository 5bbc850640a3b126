// SPDX-License-Identifier: Apache-2.0
//! Which endpoints a service port uses from this node (upstream `CategorizeEndpoints`).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use super::{Endpoint, ServicePort};

/// The node label holding this node's zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";

/// The endpoints of one service port, from this node's point of view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CategorizedEndpoints {
    /// For traffic under the "Cluster" policy (internal traffic with iTP=Cluster, and
    /// external traffic with eTP=Cluster or short-circuited from pods), topology applied.
    /// Empty when [`ServicePort::uses_cluster_endpoints`] is false.
    pub cluster: Vec<Arc<Endpoint>>,
    /// For traffic under the "Local" policy: this node's endpoints, topology ignored.
    /// Empty when [`ServicePort::uses_local_endpoints`] is false.
    pub local: Vec<Arc<Endpoint>>,
    /// The union of `cluster` and `local`, in input order: every endpoint this node may
    /// send to.
    pub all_reachable: Vec<Arc<Endpoint>>,
    /// Some usable endpoint exists somewhere in the cluster, even if none is reachable
    /// from here. With none, traffic is rejected; with some but none usable here (a Local
    /// policy on a node without local endpoints), it is dropped.
    pub has_any_endpoints: bool,
}

/// The topology filter in force for a service's cluster endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopologyMode {
    /// Every usable endpoint.
    None,
    /// Endpoints hinted for this node.
    PreferSameNode,
    /// Endpoints hinted for this node's zone.
    PreferSameZone,
}

/// Sorts a service port's endpoints into the sets the dataplane uses.
///
/// "Usable" means ready; when no ready endpoint exists (judged separately for the cluster
/// and the local set), serving-and-terminating endpoints are used instead; endpoints that
/// are not serving are never used. The cluster set honours topology hints when every
/// ready endpoint carries one and at least one matches: node hints (trafficDistribution
/// PreferSameNode) first, then zone hints (PreferSameZone, PreferClose, and the
/// topology-aware-routing annotations, which all produce zone hints). The service's
/// annotations play no part; the EndpointSlice controller decides by setting hints.
pub fn categorize_endpoints(
    endpoints: &[Arc<Endpoint>],
    svc: &ServicePort,
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
) -> CategorizedEndpoints {
    let mut result = CategorizedEndpoints::default();
    if endpoints.is_empty() {
        return result;
    }

    let mut topology_mode = TopologyMode::None;
    if svc.uses_cluster_endpoints() {
        let zone = node_labels
            .get(LABEL_TOPOLOGY_ZONE)
            .map_or("", String::as_str);
        topology_mode = topology_mode_from_hints(endpoints, node_name, zone);
        result.cluster = filter(endpoints, |ep| {
            ep.ready && available_for_topology(ep, topology_mode, node_name, zone)
        });
        // Topology was dropped above if no ready endpoint matched it, so an empty set
        // means no endpoint is ready anywhere.
        if result.cluster.is_empty() {
            result.cluster = filter(endpoints, |ep| ep.serving && ep.terminating);
        }
        result.has_any_endpoints = !result.cluster.is_empty();
    }

    if !svc.uses_local_endpoints() {
        result.all_reachable = result.cluster.clone();
        return result;
    }

    let mut has_local_ready = false;
    let mut has_local_serving_terminating = false;
    for ep in endpoints {
        if ep.ready {
            result.has_any_endpoints = true;
            has_local_ready |= ep.is_local;
        } else if ep.serving && ep.terminating {
            result.has_any_endpoints = true;
            has_local_serving_terminating |= ep.is_local;
        }
    }
    let mut local_uses_terminating = false;
    if has_local_ready {
        result.local = filter(endpoints, |ep| ep.is_local && ep.ready);
    } else if has_local_serving_terminating {
        local_uses_terminating = true;
        result.local = filter(endpoints, |ep| ep.is_local && ep.serving && ep.terminating);
    }

    if !svc.uses_cluster_endpoints() {
        result.all_reachable = result.local.clone();
        return result;
    }
    if topology_mode == TopologyMode::None && !local_uses_terminating {
        // Every ready endpoint is in the cluster set, and the local set holds only ready
        // endpoints: the cluster set already contains the local one.
        result.all_reachable = result.cluster.clone();
        return result;
    }
    let reachable: HashSet<SocketAddr> = result
        .cluster
        .iter()
        .chain(&result.local)
        .map(|ep| ep.addr())
        .collect();
    result.all_reachable = filter(endpoints, |ep| reachable.contains(&ep.addr()));
    result
}

fn topology_mode_from_hints(
    endpoints: &[Arc<Endpoint>],
    node_name: &str,
    zone: &str,
) -> TopologyMode {
    let mut has_ready = false;
    let mut all_have_node_hints = true;
    let mut has_endpoint_for_node = false;
    let mut all_have_zone_hints = true;
    let mut has_endpoint_for_zone = false;
    for ep in endpoints.iter().filter(|ep| ep.ready) {
        has_ready = true;
        match ep.node_hints() {
            Some(hints) if !hints.is_empty() => has_endpoint_for_node |= hints.contains(node_name),
            _ => all_have_node_hints = false,
        }
        match ep.zone_hints() {
            Some(hints) if !hints.is_empty() => has_endpoint_for_zone |= hints.contains(zone),
            _ => all_have_zone_hints = false,
        }
    }
    if !has_ready {
        return TopologyMode::None;
    }
    if all_have_node_hints && has_endpoint_for_node {
        return TopologyMode::PreferSameNode;
    }
    if all_have_zone_hints && has_endpoint_for_zone {
        return TopologyMode::PreferSameZone;
    }
    if all_have_zone_hints {
        tracing::debug!(zone, "ignoring zone hints: none is for this node's zone");
    }
    TopologyMode::None
}

fn available_for_topology(ep: &Endpoint, mode: TopologyMode, node_name: &str, zone: &str) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => ep.has_node_hint(node_name),
        TopologyMode::PreferSameZone => ep.has_zone_hint(zone),
    }
}

fn filter(endpoints: &[Arc<Endpoint>], keep: impl Fn(&Endpoint) -> bool) -> Vec<Arc<Endpoint>> {
    endpoints.iter().filter(|ep| keep(ep)).cloned().collect()
}
