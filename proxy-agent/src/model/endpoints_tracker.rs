// SPDX-License-Identifier: Apache-2.0
//! Pending EndpointSlice changes, and the map of endpoints they are applied to.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::endpointslice_cache::EndpointSliceCache;
use super::{
    Endpoint, InvalidObject, IpFamily, NamespacedName, ObjectKind, Protocol, Rejections,
    ServicePortName, SliceInfo, SliceRecord,
};
use crate::k8s::convert;

/// Collects EndpointSlice events for one IP family until a sync applies them to an
/// [`EndpointsMap`].
#[derive(Debug)]
pub struct EndpointsChangeTracker {
    family: IpFamily,
    cache: EndpointSliceCache,
    last_change_trigger_times: HashMap<NamespacedName, Vec<SystemTime>>,
    /// Trigger times from before the tracker existed say nothing about this proxy's
    /// programming latency.
    start_time: SystemTime,
    rejections: Rejections,
    changes_total: u64,
}

impl EndpointsChangeTracker {
    /// `node_name` is this node's name: endpoints on it are local.
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        Self {
            family,
            cache: EndpointSliceCache::new(node_name),
            last_change_trigger_times: HashMap::new(),
            start_time: SystemTime::now(),
            rejections: Rejections::default(),
            changes_total: 0,
        }
    }

    /// Replaces the start time (trigger times at or before it are not reported).
    pub fn with_start_time(mut self, start_time: SystemTime) -> Self {
        self.start_time = start_time;
        self
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    pub fn node_name(&self) -> &str {
        self.cache.node_name()
    }

    /// Records an added or updated slice (`removed == false`) or a deleted one. Returns
    /// whether this update needs a sync. Slices of the other family, FQDN slices and slices
    /// without a service name label are ignored. A slice outside kube-proxy's label
    /// selector, or an invalid one, counts as removed; an invalid one is also reported
    /// through [`EndpointsChangeTracker::take_rejected`].
    pub fn endpoint_slice_update(&mut self, slice: &EndpointSlice, removed: bool) -> bool {
        // A slice of the other family is not converted at all.
        if IpFamily::from_api(&slice.address_type) != Some(self.family) {
            return false;
        }
        self.slice_record_update(convert::slice_record(slice, removed))
    }

    /// [`EndpointsChangeTracker::endpoint_slice_update`] for a slice already converted
    /// ([`convert::slice_record`]; a deletion's record holds no content).
    pub fn slice_record_update(&mut self, record: SliceRecord) -> bool {
        if record.family != Some(self.family) {
            return false;
        }
        let Some((service, slice_name)) = record.owner else {
            tracing::warn!(
                endpoint_slice = %record.object,
                label = convert::LABEL_SERVICE_NAME,
                "ignoring EndpointSlice without a service name label"
            );
            return false;
        };
        let info = match record.info {
            Ok(info) => info,
            Err(invalid) => {
                self.rejections.record(invalid);
                self.changes_total += 1;
                return self.update_slice(&service, &slice_name, None);
            }
        };
        self.rejections
            .clear(ObjectKind::EndpointSlice, &record.object);
        self.changes_total += 1;
        self.update_slice(&service, &slice_name, info)
    }

    /// The domain-level form of [`EndpointsChangeTracker::endpoint_slice_update`]: `info`
    /// is the slice's new content, or `None` when it is gone.
    pub fn update_slice(
        &mut self,
        service: &NamespacedName,
        slice_name: &str,
        info: Option<SliceInfo>,
    ) -> bool {
        if info
            .as_ref()
            .is_some_and(|info| info.address_family != self.family)
        {
            return false;
        }
        let trigger_time = info.as_ref().and_then(|info| info.last_change_trigger_time);
        let removed = info.is_none();
        let changed = self.cache.update_pending(service, slice_name, info);
        if changed {
            if removed {
                // A deletion's trigger time would be that of the last update, not of the
                // deletion, so it says nothing.
                self.last_change_trigger_times.remove(service);
            } else if let Some(time) = trigger_time.filter(|time| *time > self.start_time) {
                self.last_change_trigger_times
                    .entry(service.clone())
                    .or_default()
                    .push(time);
            }
        }
        changed
    }

    /// Services with changes not yet applied.
    pub fn pending_changes(&self) -> HashSet<NamespacedName> {
        self.cache.pending_services().iter().cloned().collect()
    }

    pub fn pending_count(&self) -> usize {
        self.cache.pending_services().len()
    }

    /// Room for the slices of `services` services (see `ClusterState::make_room`).
    pub fn make_room(&mut self, services: usize) {
        self.cache.make_room(services);
    }

    /// How many services' slices the tracker has room for.
    #[cfg(test)]
    pub(crate) fn room(&self) -> usize {
        self.cache.room()
    }

    /// Slice events accepted so far (kubeproxy_sync_proxy_rules_endpoint_changes_total).
    pub fn changes_total(&self) -> u64 {
        self.changes_total
    }

    /// Invalid slices seen since the last call, each reported once.
    pub fn take_rejected(&mut self) -> Vec<InvalidObject> {
        self.rejections.take_fresh()
    }

    /// Slices refused right now.
    pub fn rejected_count(&self) -> usize {
        self.rejections.active_count()
    }
}

/// What [`EndpointsMap::apply`] changed.
#[derive(Debug, Default, PartialEq)]
pub struct UpdateEndpointsMapResult {
    /// Services whose endpoints were added, updated or deleted.
    pub updated_services: HashSet<NamespacedName>,
    /// A changed service has (or had) a UDP port: the conntrack reconciler must run
    /// (upstream's `ConntrackCleanupRequired`).
    pub conntrack_cleanup_required: bool,
    /// Trigger times of the applied changes, for the network programming latency metric.
    pub last_change_trigger_times: HashMap<NamespacedName, Vec<SystemTime>>,
}

/// Every service port's endpoints, for one IP family. Endpoints of a port are sorted by
/// their "ip:port" text.
#[derive(Debug, Default)]
pub struct EndpointsMap(HashMap<ServicePortName, Vec<Arc<Endpoint>>>);

impl Deref for EndpointsMap {
    type Target = HashMap<ServicePortName, Vec<Arc<Endpoint>>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl EndpointsMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies the tracker's pending changes. Costs only the services that changed.
    pub fn apply(&mut self, tracker: &mut EndpointsChangeTracker) -> UpdateEndpointsMapResult {
        let mut result = UpdateEndpointsMapResult::default();
        let changes = tracker.cache.checkout_changes();
        // Room for the ports of the services that come in, once (a cold start takes
        // 100,000 at a time: the table would rehash at each doubling). Estimated at a
        // port each: a service with more grows it as before.
        self.0.reserve(changes.len());
        result.updated_services.reserve(changes.len());
        for (service, change) in changes {
            if !result.conntrack_cleanup_required {
                result.conntrack_cleanup_required = change
                    .previous_ports
                    .iter()
                    .chain(change.current.keys())
                    .any(|port_name| port_name.protocol == Protocol::Udp);
            }
            for port_name in &change.previous_ports {
                self.0.remove(port_name);
            }
            self.0.extend(change.current);
            result.updated_services.insert(service);
        }
        result.last_change_trigger_times = std::mem::take(&mut tracker.last_change_trigger_times);
        result
    }

    /// Per service, the number of distinct local ready endpoint IPs (an IP serving two
    /// ports counts once): what health-check node ports report. A full scan.
    pub fn local_ready_endpoints(&self) -> HashMap<NamespacedName, usize> {
        let mut ips: HashMap<&NamespacedName, HashSet<IpAddr>> = HashMap::new();
        for (port_name, endpoints) in &self.0 {
            for endpoint in endpoints.iter().filter(|e| e.ready && e.is_local) {
                ips.entry(&port_name.service)
                    .or_default()
                    .insert(endpoint.ip);
            }
        }
        ips.into_iter()
            .map(|(service, ips)| (service.clone(), ips.len()))
            .collect()
    }
}
