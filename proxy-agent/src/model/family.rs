// SPDX-License-Identifier: Apache-2.0
//! The model of each IP family as the event loop keeps it between syncs, and what its
//! trackers reported since the last one: the inputs every proxier syncs from.

use std::sync::Arc;

use ipnet::IpNet;

use super::{
    EndpointsMap, IpFamily, ServicePort, ServicePortMap, UpdateEndpointsMapResult,
    UpdateServiceMapResult,
};

/// The model of one IP family, as the event loop keeps it.
#[derive(Debug)]
pub struct FamilyState {
    pub family: IpFamily,
    pub services: ServicePortMap,
    pub endpoints: EndpointsMap,
    /// Service CIDRs of this family (from ServiceCIDR objects), for the dataplanes that
    /// police them (ebpf drops traffic to unallocated addresses inside them, as nftables).
    pub service_cidrs: Vec<IpNet>,
}

impl FamilyState {
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            services: ServicePortMap::new(),
            endpoints: EndpointsMap::new(),
            service_cidrs: Vec::new(),
        }
    }
}

/// What the trackers reported since the last sync for the stale UDP conntrack reconciler
/// (see `proxier::conntrack`): whether it must run, and the frontends it can no longer find in
/// the model.
#[derive(Clone, Debug, Default)]
pub struct StaleConntrack {
    /// Previous versions of UDP service ports removed or changed (any family).
    pub replaced_udp_ports: Vec<Arc<ServicePort>>,
    /// The endpoints of a service with a UDP port changed.
    pub udp_endpoints_changed: bool,
}

impl StaleConntrack {
    /// Adds what one family's trackers reported when they were applied.
    pub fn record(
        &mut self,
        services: &UpdateServiceMapResult,
        endpoints: &UpdateEndpointsMapResult,
    ) {
        self.replaced_udp_ports
            .extend(services.replaced_udp_ports.iter().cloned());
        self.udp_endpoints_changed |= endpoints.conntrack_cleanup_required;
    }

    /// Adds a later report (changes applied while no sync succeeded yet).
    pub fn merge(&mut self, later: StaleConntrack) {
        self.replaced_udp_ports.extend(later.replaced_udp_ports);
        self.udp_endpoints_changed |= later.udp_endpoints_changed;
    }

    /// Whether anything changed that can leave UDP conntrack entries stale.
    pub fn cleanup_required(&self) -> bool {
        self.udp_endpoints_changed || !self.replaced_udp_ports.is_empty()
    }
}
