// SPDX-License-Identifier: Apache-2.0
//! Pending Service changes, and the map of service ports they are applied to.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

use super::{
    InvalidObject, IpFamily, NamespacedName, ObjectKind, Protocol, Rejections, ServicePort,
    ServicePortName,
};
use crate::k8s::convert;

/// The ports of one service.
pub type ServicePorts = HashMap<ServicePortName, Arc<ServicePort>>;

#[derive(Debug)]
struct ServiceChange {
    previous: ServicePorts,
    current: ServicePorts,
}

/// Collects Service events for one IP family until a sync applies them to a
/// [`ServicePortMap`]. For each service it keeps the ports as last applied and as they
/// are now; a service whose events cancel out has no pending change.
#[derive(Debug)]
pub struct ServiceChangeTracker {
    family: IpFamily,
    /// foldhash: looked up for every service change.
    items: foldhash::HashMap<NamespacedName, ServiceChange>,
    rejections: Rejections,
    changes_total: u64,
}

impl ServiceChangeTracker {
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            items: foldhash::HashMap::default(),
            rejections: Rejections::default(),
            changes_total: 0,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Records an add (`None, Some`), update (`Some, Some`) or delete (`Some, None`).
    /// Returns whether any change is pending, from this call or an earlier one. A service
    /// the proxy does not handle has no ports; an invalid one has none either and is
    /// reported through [`ServiceChangeTracker::take_rejected`].
    pub fn update(&mut self, previous: Option<&Service>, current: Option<&Service>) -> bool {
        let Some(service) = current.or(previous) else {
            return false;
        };
        let name = convert::object_name(&service.metadata);
        let family = self.family;
        self.update_from_model(name, current, || {
            previous.map(|svc| convert_quietly(svc, family))
        })
    }

    /// [`ServiceChangeTracker::update`] for a caller that keeps no previous Service
    /// object: `previous` yields the ports the model holds for `name` (what the previous
    /// version was turned into; asked only when no change is pending for the service, so
    /// the model is then exactly that). `current` is `None` when the service is gone.
    pub fn update_from_model(
        &mut self,
        name: NamespacedName,
        current: Option<&Service>,
        previous: impl FnOnce() -> Option<ServicePorts>,
    ) -> bool {
        let family = self.family;
        let current = current.map(|svc| service_ports(svc, family));
        self.update_converted(name, current, previous)
    }

    /// [`ServiceChangeTracker::update_from_model`] with the current version already
    /// converted for this family ([`service_ports`]): its ports, or why it is refused.
    pub fn update_converted(
        &mut self,
        name: NamespacedName,
        current: Option<Result<ServicePorts, InvalidObject>>,
        previous: impl FnOnce() -> Option<ServicePorts>,
    ) -> bool {
        self.changes_total += 1;
        let current_ports = match current {
            None => {
                self.rejections.clear(ObjectKind::Service, &name);
                ServicePorts::new()
            }
            Some(Ok(ports)) => {
                self.rejections.clear(ObjectKind::Service, &name);
                ports
            }
            Some(Err(invalid)) => {
                self.rejections.record(invalid);
                ServicePorts::new()
            }
        };
        self.update_ports(name, previous, current_ports);
        !self.items.is_empty()
    }

    /// The domain-level form of [`ServiceChangeTracker::update`]: `previous` yields the
    /// ports as last seen (called only when no change is pending for the service).
    pub fn update_ports(
        &mut self,
        service: NamespacedName,
        previous: impl FnOnce() -> Option<ServicePorts>,
        current: ServicePorts,
    ) {
        match self.items.entry(service) {
            Entry::Occupied(mut entry) => {
                if entry.get().previous == current {
                    entry.remove();
                } else {
                    entry.get_mut().current = current;
                }
            }
            Entry::Vacant(entry) => {
                let previous = previous().unwrap_or_default();
                if previous != current {
                    tracing::debug!(service = %entry.key(), ports = current.len(), "service ports changed");
                    entry.insert(ServiceChange { previous, current });
                }
            }
        }
    }

    /// Services with changes not yet applied.
    pub fn pending_changes(&self) -> HashSet<NamespacedName> {
        self.items.keys().cloned().collect()
    }

    pub fn pending_count(&self) -> usize {
        self.items.len()
    }

    /// Room for `services` more pending changes (see `ClusterState::make_room`).
    pub fn make_room(&mut self, services: usize) {
        self.items
            .reserve(services.saturating_sub(self.items.len()));
    }

    /// How many pending changes the tracker has room for.
    #[cfg(test)]
    pub(crate) fn room(&self) -> usize {
        self.items.capacity()
    }

    /// Service events seen so far (kubeproxy_sync_proxy_rules_service_changes_total).
    pub fn changes_total(&self) -> u64 {
        self.changes_total
    }

    /// Invalid services seen since the last call, each reported once.
    pub fn take_rejected(&mut self) -> Vec<InvalidObject> {
        self.rejections.take_fresh()
    }

    /// Services refused right now.
    pub fn rejected_count(&self) -> usize {
        self.rejections.active_count()
    }
}

/// The ports of `svc` for `family` as the tracker files them, or why it is refused (what
/// [`crate::model::ServiceRecord`] carries per family).
pub fn service_ports(svc: &Service, family: IpFamily) -> Result<ServicePorts, InvalidObject> {
    convert::service_ports(svc, family).map(into_service_ports)
}

fn into_service_ports(ports: Vec<(ServicePortName, ServicePort)>) -> ServicePorts {
    ports
        .into_iter()
        .map(|(name, port)| (name, Arc::new(port)))
        .collect()
}

/// The previous version was reported (or accepted), and its skipped entries logged, when
/// it was current.
fn convert_quietly(svc: &Service, family: IpFamily) -> ServicePorts {
    convert::service_ports_quietly(svc, family)
        .map(into_service_ports)
        .unwrap_or_default()
}

/// What [`ServicePortMap::apply`] changed.
#[derive(Debug, Default, PartialEq)]
pub struct UpdateServiceMapResult {
    /// Services added, updated or deleted.
    pub updated_services: HashSet<NamespacedName>,
    /// The previous version of every UDP service port that was removed or changed: its
    /// frontends (ClusterIP, external IPs, LB IPs, NodePort) may be gone, and the conntrack
    /// reconciler must still know them to delete the entries that lead there. Upstream
    /// reports removed ports only (`DeletedServices`); a changed port is here too, so that
    /// a removed external IP or LB IP, or a changed NodePort, is cleaned as well.
    pub replaced_udp_ports: Vec<Arc<ServicePort>>,
}

/// Every service port of one IP family, with an index from each service to its ports so
/// that proxiers can work service by service at the cost of that service alone.
#[derive(Debug, Default)]
pub struct ServicePortMap {
    ports: HashMap<ServicePortName, Arc<ServicePort>>,
    /// foldhash: looked up for every service of every sync.
    by_service: foldhash::HashMap<NamespacedName, Vec<ServicePortName>>,
}

impl Deref for ServicePortMap {
    type Target = HashMap<ServicePortName, Arc<ServicePort>>;

    fn deref(&self) -> &Self::Target {
        &self.ports
    }
}

impl ServicePortMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies the tracker's pending changes. Costs only the services that changed.
    pub fn apply(&mut self, tracker: &mut ServiceChangeTracker) -> UpdateServiceMapResult {
        let mut result = UpdateServiceMapResult::default();
        // Room for a big change at once (a cold start brings 100,000 services), instead of
        // the tables doubling, rehashing every key, a dozen times each. What the
        // changed services will have is a floor of the tables' size after the change, so
        // this never makes room that stays unused.
        let (services, ports) = tracker
            .items
            .values()
            .filter(|change| !change.current.is_empty())
            .fold((0usize, 0usize), |(services, ports), change| {
                (services + 1, ports + change.current.len())
            });
        self.ports.reserve(ports.saturating_sub(self.ports.len()));
        self.by_service
            .reserve(services.saturating_sub(self.by_service.len()));
        result.updated_services.reserve(tracker.items.len());
        // Taken whole: the first sync's pending map has room for every service, and
        // draining would keep that room for good.
        for (service, change) in std::mem::take(&mut tracker.items) {
            for (port_name, previous) in &change.previous {
                let current = change.current.get(port_name);
                if current.is_none() {
                    self.ports.remove(port_name);
                }
                if previous.protocol == Protocol::Udp && current != Some(previous) {
                    result.replaced_udp_ports.push(previous.clone());
                }
            }
            if change.current.is_empty() {
                self.by_service.remove(&service);
            } else {
                let mut names: Vec<ServicePortName> = change.current.keys().cloned().collect();
                names.sort_by(|a, b| (&a.port_name, a.protocol).cmp(&(&b.port_name, b.protocol)));
                self.by_service.insert(service.clone(), names);
            }
            self.ports.extend(change.current);
            result.updated_services.insert(service);
        }
        result
    }

    /// The ports of one service (in a stable order), empty when it has none.
    pub fn ports_of<'a>(
        &'a self,
        service: &NamespacedName,
    ) -> impl Iterator<Item = (&'a ServicePortName, &'a Arc<ServicePort>)> + 'a {
        self.by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|name| self.ports.get_key_value(name))
    }

    /// Whether `service` has ports here.
    pub fn has_ports(&self, service: &NamespacedName) -> bool {
        self.by_service.contains_key(service)
    }

    /// Every service that has ports.
    pub fn services(&self) -> impl Iterator<Item = &NamespacedName> {
        self.by_service.keys()
    }

    /// Health-check node ports by service (LoadBalancer services with eTP=Local). A full
    /// scan.
    pub fn health_check_node_ports(&self) -> HashMap<NamespacedName, u16> {
        self.ports
            .iter()
            .filter_map(|(name, port)| {
                port.health_check_node_port
                    .map(|hc| (name.service.clone(), hc))
            })
            .collect()
    }
}
