// SPDX-License-Identifier: Apache-2.0
//! The cluster of the sync benchmark, built through the agent's own change trackers
//! (pure): N ClusterIP services with one TCP port and E ready endpoints each, on an IPv4
//! node whose cluster CIDR makes pod traffic local (the common kube-proxy setup), and the
//! one-service changes a partial sync is measured on.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use ipnet::IpNet;
use proxy_agent::{
    model::{
        EndpointsChangeTracker, IpFamily, NamespacedName, Protocol, ServiceChangeTracker,
        ServicePort, ServicePortName, SliceEndpoint, SliceInfo, SlicePort,
    },
    node::{LocalDetector, NodeAddresses},
    proxier::{FamilyState, NodeContext, StaleConntrack, SyncRequest},
};

pub const NAMESPACE: &str = "bench";
pub const NODE_NAME: &str = "bench-node";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 2);
/// ClusterIPs count up from here (room for 2^20 services in 172.16.0.0/12).
const CLUSTER_IP_BASE: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 0);
/// Endpoints: [`MAX_ENDPOINTS`] addresses per service from here (10.64.0.0/10, inside the
/// cluster CIDR: room for 65,536 services with 64 each).
const ENDPOINT_BASE: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 0);
pub const CLUSTER_CIDR: &str = "10.0.0.0/8";
/// The most endpoints a service can have here (its block of addresses).
pub const MAX_ENDPOINTS: u8 = 64;
pub const SERVICE_PORT: u16 = 80;
pub const TARGET_PORT: u16 = 8080;

pub fn service_name(index: u32) -> NamespacedName {
    NamespacedName::new(NAMESPACE, format!("svc{index}"))
}

pub fn cluster_ip(index: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(CLUSTER_IP_BASE) + 1 + index))
}

/// Endpoint `slot` (< [`MAX_ENDPOINTS`]) of service `index`.
pub fn endpoint_ip(index: u32, slot: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(ENDPOINT_BASE) + index * u32::from(MAX_ENDPOINTS) + u32::from(slot),
    ))
}

/// The node as the proxier sees it: kube-proxy's defaults (masquerade bit 14, localhost
/// NodePorts) with detectLocalMode ClusterCIDR.
pub fn node_context() -> NodeContext {
    let cluster_cidr: IpNet = CLUSTER_CIDR.parse().unwrap_or_else(|_| unreachable!());
    NodeContext {
        name: NODE_NAME.into(),
        primary_ips: NodeAddresses {
            v4: Some(IpAddr::V4(NODE_IP)),
            v6: None,
        },
        host_addresses: vec![IpAddr::V4(NODE_IP), IpAddr::V4(Ipv4Addr::LOCALHOST)],
        local_detector: LocalDetector::Cidrs(vec![cluster_cidr]),
        masquerade_bit: 14,
        localhost_nodeports: true,
        ..Default::default()
    }
}

/// Service `index`'s one port, as the service change tracker takes it.
fn service_ports(index: u32) -> std::collections::HashMap<ServicePortName, Arc<ServicePort>> {
    let port = ServicePort {
        cluster_ip: cluster_ip(index),
        port: SERVICE_PORT,
        protocol: Protocol::Tcp,
        node_port: None,
        external_ips: vec![],
        load_balancer_ingress: vec![],
        load_balancer_source_ranges: vec![],
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        session_affinity: None,
        load_balancer_algorithm: None,
    };
    [(
        ServicePortName::new(service_name(index), "p", Protocol::Tcp),
        Arc::new(port),
    )]
    .into_iter()
    .collect()
}

/// The cluster and its trackers; changes go through the trackers as the agent's do.
pub struct SyncWorld {
    pub node: NodeContext,
    pub families: Vec<FamilyState>,
    endpoints: EndpointsChangeTracker,
    pub service_count: u32,
    pub endpoints_per_service: u8,
    /// How many endpoints each service has now (all start with `endpoints_per_service`).
    current: Vec<u8>,
}

fn slice(index: u32, endpoints: u8) -> SliceInfo {
    SliceInfo {
        service: service_name(index),
        slice_name: format!("svc{index}-1"),
        address_family: IpFamily::V4,
        ports: vec![SlicePort {
            name: "p".into(),
            port: TARGET_PORT,
            protocol: Protocol::Tcp,
        }],
        endpoints: (0..endpoints)
            .map(|slot| SliceEndpoint {
                ip: endpoint_ip(index, slot),
                ready: true,
                serving: true,
                terminating: false,
                node_name: None,
                zone: None,
                hints: None,
            })
            .collect(),
        last_change_trigger_time: None,
    }
}

impl SyncWorld {
    /// `services` services with `endpoints` endpoints each (at most [`MAX_ENDPOINTS`]),
    /// applied to the model.
    pub fn new(services: u32, endpoints: u8) -> Self {
        let endpoints = endpoints.min(MAX_ENDPOINTS);
        let mut service_tracker = ServiceChangeTracker::new(IpFamily::V4);
        let mut endpoint_tracker = EndpointsChangeTracker::new(IpFamily::V4, NODE_NAME);
        for index in 0..services {
            let name = service_name(index);
            service_tracker.update_ports(name.clone(), || None, service_ports(index));
            endpoint_tracker.update_slice(
                &name,
                &format!("svc{index}-1"),
                Some(slice(index, endpoints)),
            );
        }
        let mut state = FamilyState::new(IpFamily::V4);
        state.services.apply(&mut service_tracker);
        state.endpoints.apply(&mut endpoint_tracker);
        SyncWorld {
            node: node_context(),
            families: vec![state],
            endpoints: endpoint_tracker,
            service_count: services,
            endpoints_per_service: endpoints,
            current: vec![endpoints; services as usize],
        }
    }

    /// The service partial change number `k` touches: spread over the services, never
    /// the same twice in a row.
    pub fn changed_service(&self, k: u32) -> u32 {
        (7 + k.wrapping_mul(7919)) % self.service_count.max(1)
    }

    /// One endpoint of service `index` goes away, or comes back if it is gone (the
    /// commonest change of a cluster: a pod replaced). Returns the changed services as the
    /// model reports them.
    pub fn toggle_one_endpoint(&mut self, index: u32) -> HashSet<NamespacedName> {
        let Some(now) = self.current.get(index as usize).copied() else {
            return HashSet::new();
        };
        let next = if now == self.endpoints_per_service {
            now.saturating_sub(1)
        } else {
            self.endpoints_per_service
        };
        self.set_endpoints(index, next)
    }

    /// How many endpoints service `index` has now.
    pub fn endpoints_of(&self, index: u32) -> u8 {
        self.current.get(index as usize).copied().unwrap_or(0)
    }

    /// Service `index` gets `count` endpoints (at most [`MAX_ENDPOINTS`]; a scale-up keeps
    /// the existing ones and adds more). Returns the changed services as the model reports
    /// them.
    pub fn set_endpoints(&mut self, index: u32, count: u8) -> HashSet<NamespacedName> {
        let Some(now) = self.current.get_mut(index as usize) else {
            return HashSet::new();
        };
        *now = count.min(MAX_ENDPOINTS);
        let name = service_name(index);
        self.endpoints
            .update_slice(&name, &format!("svc{index}-1"), Some(slice(index, *now)));
        self.families[0]
            .endpoints
            .apply(&mut self.endpoints)
            .updated_services
            .into_iter()
            .collect()
    }

    /// A new service (the next index) with `endpoints_per_service` endpoints, through the
    /// trackers as the agent's watch would add it. Returns its index and the changed
    /// services.
    pub fn add_service(&mut self) -> (u32, HashSet<NamespacedName>) {
        let index = self.service_count;
        let mut service_tracker = ServiceChangeTracker::new(IpFamily::V4);
        service_tracker.update_ports(service_name(index), || None, service_ports(index));
        self.endpoints.update_slice(
            &service_name(index),
            &format!("svc{index}-1"),
            Some(slice(index, self.endpoints_per_service)),
        );
        let state = &mut self.families[0];
        let mut changed: HashSet<NamespacedName> = state
            .services
            .apply(&mut service_tracker)
            .updated_services
            .into_iter()
            .collect();
        changed.extend(state.endpoints.apply(&mut self.endpoints).updated_services);
        self.service_count += 1;
        self.current.push(self.endpoints_per_service);
        (index, changed)
    }

    /// The sync request over this model.
    pub fn request<'a>(
        &'a self,
        full: bool,
        changed: &'a HashSet<NamespacedName>,
        stale: &'a StaleConntrack,
    ) -> SyncRequest<'a> {
        SyncRequest {
            families: &self.families,
            node: &self.node,
            full,
            changed,
            stale,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_services_with_their_endpoints() {
        let world = SyncWorld::new(300, 4);
        let state = &world.families[0];
        assert_eq!(state.services.len(), 300);
        let port = ServicePortName::new(service_name(299), "p", Protocol::Tcp);
        assert_eq!(state.services[&port].cluster_ip, cluster_ip(299));
        assert_eq!(state.endpoints[&port].len(), 4);
        assert_eq!(endpoint_ip(0, 0), "10.64.0.0".parse::<IpAddr>().unwrap());
        assert_eq!(endpoint_ip(1, 3), "10.64.0.67".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_toggle_changes_one_service_and_back() {
        let mut world = SyncWorld::new(50, 4);
        let index = world.changed_service(0);
        let port = ServicePortName::new(service_name(index), "p", Protocol::Tcp);
        let changed = world.toggle_one_endpoint(index);
        assert_eq!(changed, HashSet::from([service_name(index)]));
        assert_eq!(world.families[0].endpoints[&port].len(), 3);
        let changed = world.toggle_one_endpoint(index);
        assert_eq!(changed, HashSet::from([service_name(index)]));
        assert_eq!(world.families[0].endpoints[&port].len(), 4);
        assert_ne!(world.changed_service(1), index);
    }

    #[test]
    fn a_service_is_added_and_one_scales_to_forty() {
        let mut world = SyncWorld::new(10, 4);
        let (index, changed) = world.add_service();
        assert_eq!(index, 10);
        assert_eq!(changed, HashSet::from([service_name(10)]));
        assert_eq!(world.service_count, 11);
        let port = ServicePortName::new(service_name(10), "p", Protocol::Tcp);
        assert_eq!(world.families[0].services[&port].cluster_ip, cluster_ip(10));
        assert_eq!(world.families[0].endpoints[&port].len(), 4);
        let changed = world.set_endpoints(3, 40);
        assert_eq!(changed, HashSet::from([service_name(3)]));
        assert_eq!(world.endpoints_of(3), 40);
        let port = ServicePortName::new(service_name(3), "p", Protocol::Tcp);
        assert_eq!(world.families[0].endpoints[&port].len(), 40);
        // The 40 addresses are service 3's own.
        assert_eq!(endpoint_ip(3, 39), "10.64.0.231".parse::<IpAddr>().unwrap());
        assert_eq!(endpoint_ip(4, 0), "10.64.1.0".parse::<IpAddr>().unwrap());
    }
}
