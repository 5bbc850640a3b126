// SPDX-License-Identifier: Apache-2.0
//! Endpoints: the model's view of one EndpointSlice, and the merged per-port endpoints.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use super::{IpFamily, NamespacedName, Protocol};

/// One backend of one service port. Built by the EndpointSlice cache, which knows this
/// node's name (for `is_local`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// Ready and not terminating (an absent condition counts as ready).
    pub ready: bool,
    /// Ready regardless of termination (absent: same as `ready`'s API default, true).
    pub serving: bool,
    pub terminating: bool,
    /// Shared by every endpoint naming the same node (see [`super::interner`]).
    pub node_name: Option<Arc<str>>,
    /// Shared by every endpoint naming the same zone.
    pub zone: Option<Arc<str>>,
    /// `hints.forZones[].name`; `None` when the endpoint carries no zone hint.
    pub zone_hints: Option<BTreeSet<String>>,
    /// `hints.forNodes[].name`; `None` when the endpoint carries no node hint.
    pub node_hints: Option<BTreeSet<String>>,
    /// Runs on the node this proxy runs on.
    pub is_local: bool,
}

impl Endpoint {
    /// A ready, serving endpoint with no node, zone or hints.
    pub fn ready_at(addr: SocketAddr) -> Self {
        Endpoint {
            ip: addr.ip(),
            port: addr.port(),
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            zone_hints: None,
            node_hints: None,
            is_local: false,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    pub fn has_zone_hint(&self, zone: &str) -> bool {
        self.zone_hints
            .as_ref()
            .is_some_and(|hints| hints.contains(zone))
    }

    pub fn has_node_hint(&self, node: &str) -> bool {
        self.node_hints
            .as_ref()
            .is_some_and(|hints| hints.contains(node))
    }
}

/// `ip:port`, `[ip6]:port`.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr().fmt(f)
    }
}

/// The parts of one EndpointSlice the proxy uses, already validated and normalised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    /// The service named by the slice's `kubernetes.io/service-name` label.
    pub service: NamespacedName,
    pub slice_name: String,
    pub address_family: IpFamily,
    /// Ports usable for proxying (ports without a name or number are left out, as upstream
    /// does).
    pub ports: Vec<SlicePort>,
    /// Endpoints with at least one address; only the first address is used.
    pub endpoints: Vec<SliceEndpoint>,
    /// From the `endpoints.kubernetes.io/last-change-trigger-time` annotation.
    pub last_change_trigger_time: Option<SystemTime>,
}

impl SliceInfo {
    /// Equal for proxying purposes: everything but the trigger-time annotation, whose
    /// change alone needs no sync.
    pub fn same_content(&self, other: &SliceInfo) -> bool {
        self.service == other.service
            && self.slice_name == other.slice_name
            && self.address_family == other.address_family
            && self.ports == other.ports
            && self.endpoints == other.endpoints
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlicePort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SliceEndpoint {
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Interned, as in [`Endpoint`].
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub zone_hints: Option<BTreeSet<String>>,
    pub node_hints: Option<BTreeSet<String>>,
}
