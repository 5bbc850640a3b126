// SPDX-License-Identifier: Apache-2.0
//! EndpointSlices grouped by service, merged into per-port endpoint lists.
//!
//! Endpoints can move between the slices of a service, so the cache keeps every slice of
//! a service (by slice name) and rebuilds the service's endpoints from all of them. Each
//! service keeps its applied slices, its pending (not yet applied) slice updates, and the
//! endpoints last handed out, so that checking out changes costs only the services that
//! changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use super::{Endpoint, NamespacedName, ServicePortName, SliceInfo};

/// The endpoints of one service, per service port.
pub type ServiceEndpoints = HashMap<ServicePortName, Vec<Arc<Endpoint>>>;

/// How one service's endpoints changed between two checkouts.
#[derive(Debug, Default)]
pub struct EndpointsChange {
    /// The ports the previous checkout had endpoints for (their endpoints are in the
    /// consumer's map: the cache does not keep a second copy).
    pub previous_ports: Vec<ServicePortName>,
    pub current: ServiceEndpoints,
}

#[derive(Debug, Default)]
struct SliceTracker {
    applied: BTreeMap<String, Arc<SliceInfo>>,
    /// `None` marks a removal.
    pending: BTreeMap<String, Option<Arc<SliceInfo>>>,
    /// The ports the last checkout produced endpoints for.
    ports: Vec<ServicePortName>,
}

#[derive(Debug)]
pub struct EndpointSliceCache {
    node_name: String,
    /// foldhash: looked up for every slice change.
    trackers: foldhash::HashMap<NamespacedName, SliceTracker>,
    pending_services: HashSet<NamespacedName>,
}

impl EndpointSliceCache {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            trackers: foldhash::HashMap::default(),
            pending_services: HashSet::new(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Records a new version of a slice (`Some`) or its removal (`None`). Returns whether
    /// this differs from what the cache already holds for that slice, pending or applied.
    pub fn update_pending(
        &mut self,
        service: &NamespacedName,
        slice_name: &str,
        slice: Option<SliceInfo>,
    ) -> bool {
        let tracker = match self.trackers.get_mut(service) {
            Some(tracker) => tracker,
            None if slice.is_none() => return false,
            None => self.trackers.entry(service.clone()).or_default(),
        };
        let known = match tracker.pending.get(slice_name) {
            Some(pending) => Some(pending.as_deref()),
            None => tracker
                .applied
                .get(slice_name)
                .map(|applied| Some(applied.as_ref())),
        };
        let changed = match (known, slice.as_ref()) {
            (Some(Some(old)), Some(new)) => !old.same_content(new),
            (Some(None), None) => false,
            (None, None) => false,
            _ => true,
        };
        if changed {
            tracker
                .pending
                .insert(slice_name.to_owned(), slice.map(Arc::new));
            self.pending_services.insert(service.clone());
        }
        changed
    }

    /// Applies every pending slice update and returns, per service that had some, its
    /// endpoints before and after.
    pub fn checkout_changes(&mut self) -> Vec<(NamespacedName, EndpointsChange)> {
        let mut changes = Vec::with_capacity(self.pending_services.len());
        for service in std::mem::take(&mut self.pending_services) {
            let Some(tracker) = self.trackers.get_mut(&service) else {
                continue;
            };
            for (name, slice) in std::mem::take(&mut tracker.pending) {
                match slice {
                    Some(slice) => tracker.applied.insert(name, slice),
                    None => tracker.applied.remove(&name),
                };
            }
            let current = merge_endpoints(&service, &tracker.applied, &self.node_name);
            let mut ports: Vec<ServicePortName> = current.keys().cloned().collect();
            ports.shrink_to_fit();
            let previous_ports = std::mem::replace(&mut tracker.ports, ports);
            if tracker.applied.is_empty() {
                self.trackers.remove(&service);
            }
            changes.push((
                service,
                EndpointsChange {
                    previous_ports,
                    current,
                },
            ));
        }
        changes
    }

    /// Services with slice updates not yet checked out.
    pub fn pending_services(&self) -> &HashSet<NamespacedName> {
        &self.pending_services
    }

    /// Number of services with at least one slice.
    pub fn service_count(&self) -> usize {
        self.trackers.len()
    }
}

/// Builds a service's per-port endpoints from all its slices: one endpoint per ip:port,
/// preferring a non-terminating endpoint over a terminating one with the same address
/// (an IP reused by a new pod while the old one terminates), sorted by "ip:port" text as
/// upstream sorts them.
fn merge_endpoints(
    service: &NamespacedName,
    slices: &BTreeMap<String, Arc<SliceInfo>>,
    node_name: &str,
) -> ServiceEndpoints {
    // foldhash: this runs over every endpoint of every changed service (all of them in a
    // cold sync), where SipHash showed in profiles.
    let mut by_port: foldhash::HashMap<
        ServicePortName,
        foldhash::HashMap<SocketAddr, Arc<Endpoint>>,
    > = foldhash::HashMap::default();
    for slice in slices.values() {
        for port in &slice.ports {
            let port_name = ServicePortName::new(service.clone(), port.name.clone(), port.protocol);
            let set = by_port.entry(port_name).or_default();
            for endpoint in &slice.endpoints {
                let addr = SocketAddr::new(endpoint.ip, port.port);
                if endpoint.terminating && set.contains_key(&addr) {
                    continue;
                }
                let is_local =
                    !node_name.is_empty() && endpoint.node_name.as_deref() == Some(node_name);
                set.insert(
                    addr,
                    Arc::new(Endpoint {
                        ip: endpoint.ip,
                        port: port.port,
                        ready: endpoint.ready,
                        serving: endpoint.serving,
                        terminating: endpoint.terminating,
                        node_name: endpoint.node_name.clone(),
                        zone: endpoint.zone.clone(),
                        hints: endpoint.hints.clone(),
                        is_local,
                    }),
                );
            }
        }
    }
    by_port
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(port_name, set)| {
            let mut endpoints: Vec<Arc<Endpoint>> = set.into_values().collect();
            endpoints.sort_by_cached_key(|endpoint| endpoint.to_string());
            (port_name, endpoints)
        })
        .collect()
}
