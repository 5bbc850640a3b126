// SPDX-License-Identifier: Apache-2.0
//! Endpoints: the model's view of one EndpointSlice, and the merged per-port endpoints.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use super::{IpFamily, NamespacedName, Protocol};

/// One backend of one service port. Built by the EndpointSlice cache, which knows this
/// node's name (for `is_local`).
///
/// Kept once per endpoint per port, so it is kept small: names are shared (interned)
/// strings and the rarely present hints sit behind one pointer. `size_of` is pinned by a
/// test.
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
    /// `None` when the endpoint carries neither zone nor node hints.
    pub hints: Option<Arc<EndpointHints>>,
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
            hints: None,
            is_local: false,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// `hints.forZones[].name`; `None` when the endpoint carries no zone hint.
    pub fn zone_hints(&self) -> Option<&HintNames> {
        EndpointHints::zones_of(&self.hints)
    }

    /// `hints.forNodes[].name`; `None` when the endpoint carries no node hint.
    pub fn node_hints(&self) -> Option<&HintNames> {
        EndpointHints::nodes_of(&self.hints)
    }

    pub fn has_zone_hint(&self, zone: &str) -> bool {
        self.zone_hints().is_some_and(|hints| hints.contains(zone))
    }

    pub fn has_node_hint(&self, node: &str) -> bool {
        self.node_hints().is_some_and(|hints| hints.contains(node))
    }
}

/// `ip:port`, `[ip6]:port`.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr().fmt(f)
    }
}

/// An endpoint's topology hints. Most endpoints carry none, so both kinds sit behind one
/// pointer ([`EndpointHints::new`] gives `None` for no hints at all); the pointer is an
/// `Arc` so that the merged per-port endpoints share their slice endpoint's hints instead
/// of copying them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointHints {
    /// `hints.forZones[].name`; `None` when the endpoint carries no zone hint.
    pub zones: Option<HintNames>,
    /// `hints.forNodes[].name`; `None` when the endpoint carries no node hint.
    pub nodes: Option<HintNames>,
}

impl EndpointHints {
    /// The hints of an endpoint; `None` when it has neither kind, so that an endpoint
    /// without hints is always `hints: None` (endpoints are compared field by field).
    pub fn new(zones: Option<HintNames>, nodes: Option<HintNames>) -> Option<Arc<Self>> {
        if zones.is_none() && nodes.is_none() {
            return None;
        }
        Some(Arc::new(EndpointHints { zones, nodes }))
    }

    /// The zone hints of an endpoint's `hints` (both endpoint records keep them so).
    fn zones_of(hints: &Option<Arc<Self>>) -> Option<&HintNames> {
        hints.as_ref()?.zones.as_ref()
    }

    /// The node hints of an endpoint's `hints`.
    fn nodes_of(hints: &Option<Arc<Self>>) -> Option<&HintNames> {
        hints.as_ref()?.nodes.as_ref()
    }
}

/// A set of hint names, kept sorted and without duplicates in one boxed slice: an
/// endpoint is hinted for one zone or node, rarely a few, where a `BTreeSet` would
/// allocate a node of about 200 bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HintNames(Box<[Arc<str>]>);

impl HintNames {
    pub fn contains(&self, name: &str) -> bool {
        self.0
            .binary_search_by(|hinted| hinted.as_ref().cmp(name))
            .is_ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The names in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(AsRef::as_ref)
    }
}

impl FromIterator<Arc<str>> for HintNames {
    fn from_iter<I: IntoIterator<Item = Arc<str>>>(names: I) -> Self {
        let mut names: Vec<Arc<str>> = names.into_iter().collect();
        names.sort_unstable();
        names.dedup();
        HintNames(names.into_boxed_slice())
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
    /// Shared with every other port of that name (see [`super::interner`]).
    pub name: Arc<str>,
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
    /// Shared with the merged endpoints built from this one.
    pub hints: Option<Arc<EndpointHints>>,
}

impl SliceEndpoint {
    pub fn zone_hints(&self) -> Option<&HintNames> {
        EndpointHints::zones_of(&self.hints)
    }

    pub fn node_hints(&self) -> Option<&HintNames> {
        EndpointHints::nodes_of(&self.hints)
    }
}
