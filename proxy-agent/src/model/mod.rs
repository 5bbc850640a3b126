// SPDX-License-Identifier: Apache-2.0
//! The pure model: service port -> service, service port -> endpoints, with upstream
//! kube-proxy's change trackers and topology rules.
//!
//! Every type here is free of Kubernetes API types; conversion lives in
//! [`crate::k8s::convert`]. The sources hand the event loop objects already converted
//! ([`ServiceRecord`], [`SliceRecord`]); the trackers' `update` / `endpoint_slice_update`
//! entry points still take API objects (for tests and tools) and convert them; everything
//! else works on domain values. Each
//! tracker and map covers one IP family, as each upstream proxier does. [`ClusterState`]
//! holds them all (every family's trackers and the maps they are applied to, a
//! [`FamilyState`] each) for the event loop.

mod cluster_state;
mod endpoint;
mod endpoints_tracker;
mod endpointslice_cache;
mod family;
pub mod interner;
mod invalid;
mod names;
mod records;
mod service_port;
mod service_tracker;
pub mod topology;

#[cfg(test)]
mod tests;

pub use cluster_state::{AppliedChanges, BatchRoom, ClusterState, FamilyRoom, union_into};
pub use endpoint::{Endpoint, EndpointHints, HintNames, SliceEndpoint, SliceInfo, SlicePort};
pub use endpoints_tracker::{EndpointsChangeTracker, EndpointsMap, UpdateEndpointsMapResult};
pub use endpointslice_cache::{EndpointSliceCache, EndpointsChange, ServiceEndpoints};
pub use family::{FamilyState, StaleConntrack};
pub use invalid::{InvalidObject, ObjectKind, Rejections};
pub use names::{IpFamily, NamespacedName, PortRef, Protocol, ServicePortName};
pub use records::{ServiceRecord, SliceRecord};
pub use service_port::{
    LoadBalancerAlgorithm, LoadBalancerIngress, LoadBalancerIpMode, ServicePort, SessionAffinity,
};
pub use service_tracker::{
    ServiceChangeTracker, ServicePortMap, ServicePorts, UpdateServiceMapResult, service_ports,
};
pub use topology::{CategorizedEndpoints, categorize_endpoints};
