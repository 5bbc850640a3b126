// SPDX-License-Identifier: Apache-2.0
//! EndpointSlices grouped by service, merged into per-port endpoint lists.
//!
//! Endpoints can move between the slices of a service, so the cache keeps every slice of
//! a service (by slice name) and rebuilds the service's endpoints from all of them. Each
//! service keeps its applied slices, its pending (not yet applied) slice updates, and the
//! ports last handed out, so that checking out changes costs only the services that
//! changed.
//!
//! An applied slice keeps its endpoints as the finished per-port [`Endpoint`] records, and
//! the merged lists handed out are made of those same records: at 50,000 services the
//! model would otherwise hold every endpoint twice (the slice's copy and the merged one),
//! and every checkout of a service would build all its records again.

use std::net::SocketAddr;
use std::sync::Arc;

use super::{
    Endpoint, IpFamily, NamespacedName, ServicePortName, SliceEndpoint, SliceInfo, SlicePort,
};
use crate::{parallel, sorted::SortedMap};

/// The endpoints of one service, per service port.
///
/// foldhash, not SipHash: one is built for every changed service (all of them in a cold
/// sync), and hashing the names with SipHash was a sixth of a cold sync's model work.
pub type ServiceEndpoints = foldhash::HashMap<ServicePortName, Vec<Arc<Endpoint>>>;

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
    applied: SlicesByName<AppliedSlice>,
    /// `None` marks a removal.
    pending: SlicesByName<Option<Arc<SliceInfo>>>,
    /// The ports the last checkout produced endpoints for.
    ports: Vec<ServicePortName>,
}

/// Below this many services with changes, a checkout runs on the calling thread.
pub(crate) const PARALLEL_CHECKOUT_MIN: usize = 4_096;

impl SliceTracker {
    /// Applies the pending slice updates of `service` and merges its endpoints; also says
    /// whether it has no slices left (the tracker can go).
    fn checkout(&mut self, service: &NamespacedName, node_name: &str) -> (EndpointsChange, bool) {
        for (name, slice) in std::mem::take(&mut self.pending) {
            match slice {
                Some(slice) => {
                    let slice = AppliedSlice::new(Arc::unwrap_or_clone(slice), node_name);
                    self.applied.insert(name, slice);
                }
                None => {
                    self.applied.remove(&*name);
                }
            }
        }
        // Kept until the service's next change: no room for more slices.
        self.applied.shrink_to_fit();
        let current = merge_endpoints(service, &self.applied);
        let mut ports: Vec<ServicePortName> = current.keys().cloned().collect();
        ports.shrink_to_fit();
        let previous_ports = std::mem::replace(&mut self.ports, ports);
        let change = EndpointsChange {
            previous_ports,
            current,
        };
        (change, self.applied.is_empty())
    }
}

/// A service's slices by name, in name order (a sorted `Vec`: most services have one slice,
/// see [`crate::sorted`]).
type SlicesByName<V> = SortedMap<Box<str>, V>;

/// A slice once applied: what [`SliceInfo`] holds, with its endpoints built into the
/// records the merged per-port lists share.
#[derive(Debug)]
struct AppliedSlice {
    address_family: IpFamily,
    ports: Vec<SlicePort>,
    /// Per port of `ports`, in order, one record per endpoint of the slice, in the slice's
    /// order. A slice without ports keeps one list for port 0, which is never handed out:
    /// it is what tells a later version of the slice apart.
    endpoints_by_port: Vec<Vec<Arc<Endpoint>>>,
}

impl AppliedSlice {
    fn new(slice: SliceInfo, node_name: &str) -> Self {
        let records_for = |port: u16| -> Vec<Arc<Endpoint>> {
            slice
                .endpoints
                .iter()
                .map(|endpoint| Arc::new(endpoint_record(endpoint, port, node_name)))
                .collect()
        };
        let endpoints_by_port = if slice.ports.is_empty() {
            vec![records_for(0)]
        } else {
            slice
                .ports
                .iter()
                .map(|port| records_for(port.port))
                .collect()
        };
        AppliedSlice {
            address_family: slice.address_family,
            ports: slice.ports,
            endpoints_by_port,
        }
    }

    /// [`SliceInfo::same_content`] against the slice this was built from, which was keyed
    /// by `service` and `slice_name` as `new` is.
    fn same_content(&self, service: &NamespacedName, slice_name: &str, new: &SliceInfo) -> bool {
        let Some(records) = self.endpoints_by_port.first() else {
            return false;
        };
        new.service == *service
            && new.slice_name == slice_name
            && new.address_family == self.address_family
            && new.ports == self.ports
            && new.endpoints.len() == records.len()
            && new
                .endpoints
                .iter()
                .zip(records)
                .all(|(endpoint, record)| same_endpoint(endpoint, record))
    }
}

/// The record of one endpoint of a slice for one of its ports. Runs on this node when the
/// slice names this node (and this node has a name).
fn endpoint_record(endpoint: &SliceEndpoint, port: u16, node_name: &str) -> Endpoint {
    let is_local = !node_name.is_empty() && endpoint.node_name.as_deref() == Some(node_name);
    Endpoint {
        ip: endpoint.ip,
        port,
        ready: endpoint.ready,
        serving: endpoint.serving,
        terminating: endpoint.terminating,
        node_name: endpoint.node_name.clone(),
        zone: endpoint.zone.clone(),
        hints: endpoint.hints.clone(),
        is_local,
    }
}

/// Whether `record` was built from an endpoint equal to `endpoint`.
fn same_endpoint(endpoint: &SliceEndpoint, record: &Endpoint) -> bool {
    // Destructured so that a field added to SliceEndpoint cannot be left out here.
    let SliceEndpoint {
        ip,
        ready,
        serving,
        terminating,
        node_name,
        zone,
        hints,
    } = endpoint;
    *ip == record.ip
        && *ready == record.ready
        && *serving == record.serving
        && *terminating == record.terminating
        && *node_name == record.node_name
        && *zone == record.zone
        && *hints == record.hints
}

#[derive(Debug)]
pub struct EndpointSliceCache {
    node_name: String,
    /// foldhash: looked up for every slice change.
    trackers: foldhash::HashMap<NamespacedName, SliceTracker>,
    /// foldhash: every changed service is looked up in it at checkout.
    pending_services: foldhash::HashSet<NamespacedName>,
}

impl EndpointSliceCache {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            trackers: foldhash::HashMap::default(),
            pending_services: foldhash::HashSet::default(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Room for the slices of `services` services: a tracker each, and a pending mark.
    /// How many services' slices the cache has room for.
    #[cfg(test)]
    pub(crate) fn room(&self) -> usize {
        self.trackers.capacity()
    }

    pub fn make_room(&mut self, services: usize) {
        self.trackers
            .reserve(services.saturating_sub(self.trackers.len()));
        self.pending_services
            .reserve(services.saturating_sub(self.pending_services.len()));
    }

    /// Records a new version of a slice (`Some`) or its removal (`None`). Returns whether
    /// this differs from what the cache already holds for that slice, pending or applied.
    /// `slice` is the slice `slice_name` of `service` (its own `service` and `slice_name`
    /// say the same).
    pub fn update_pending(
        &mut self,
        service: &NamespacedName,
        slice_name: &str,
        slice: Option<SliceInfo>,
    ) -> bool {
        debug_assert!(
            slice
                .as_ref()
                .is_none_or(|slice| slice.service == *service && slice.slice_name == slice_name),
            "slice {slice_name} of {service} filed under other keys"
        );
        let tracker = match self.trackers.get_mut(service) {
            Some(tracker) => tracker,
            None if slice.is_none() => return false,
            None => self.trackers.entry(service.clone()).or_default(),
        };
        let changed = match (tracker.pending.get(slice_name), slice.as_ref()) {
            (Some(Some(pending)), Some(new)) => !pending.same_content(new),
            (Some(Some(_)), None) => true,
            // A pending removal.
            (Some(None), new) => new.is_some(),
            (None, new) => match (tracker.applied.get(slice_name), new) {
                (Some(applied), Some(new)) => !applied.same_content(service, slice_name, new),
                (Some(_), None) => true,
                (None, new) => new.is_some(),
            },
        };
        if changed {
            tracker
                .pending
                .insert(Box::from(slice_name), slice.map(Arc::new));
            self.pending_services.insert(service.clone());
        }
        changed
    }

    /// Applies every pending slice update and returns, per service that had some, its
    /// endpoints before and after. Thousands of services (a cold start) are checked out on
    /// every core: each service's checkout touches only its own tracker.
    pub fn checkout_changes(&mut self) -> Vec<(NamespacedName, EndpointsChange)> {
        let pending = std::mem::take(&mut self.pending_services);
        let node_name = self.node_name.as_str();
        let workers = parallel::workers_for(pending.len(), PARALLEL_CHECKOUT_MIN);
        let changes: Vec<(NamespacedName, EndpointsChange, bool)> = if workers > 1 {
            // One pass over the trackers: the pending ones are most of them here.
            let mut todo: Vec<(&NamespacedName, &mut SliceTracker)> = self
                .trackers
                .iter_mut()
                .filter(|(service, _)| pending.contains(*service))
                .collect();
            parallel::map_each(&mut todo, workers, |(service, tracker)| {
                let (change, emptied) = tracker.checkout(service, node_name);
                ((*service).clone(), change, emptied)
            })
        } else {
            pending
                .into_iter()
                .filter_map(|service| {
                    let tracker = self.trackers.get_mut(&service)?;
                    let (change, emptied) = tracker.checkout(&service, node_name);
                    Some((service, change, emptied))
                })
                .collect()
        };
        changes
            .into_iter()
            .map(|(service, change, emptied)| {
                if emptied {
                    self.trackers.remove(&service);
                }
                (service, change)
            })
            .collect()
    }

    /// Services with slice updates not yet checked out.
    pub fn pending_services(&self) -> &foldhash::HashSet<NamespacedName> {
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
/// upstream sorts them. The lists share the slices' records.
fn merge_endpoints(
    service: &NamespacedName,
    slices: &SlicesByName<AppliedSlice>,
) -> ServiceEndpoints {
    // foldhash: this runs for every changed service (all of them in a cold sync), where
    // SipHash showed in profiles.
    let mut by_port: foldhash::HashMap<ServicePortName, Vec<Arc<Endpoint>>> =
        foldhash::HashMap::default();
    for slice in slices.values() {
        for (port, records) in slice.ports.iter().zip(&slice.endpoints_by_port) {
            let port_name = ServicePortName::new(service.clone(), port.name.clone(), port.protocol);
            by_port
                .entry(port_name)
                .or_default()
                .extend(records.iter().cloned());
        }
    }
    by_port
        .into_iter()
        .filter(|(_, records)| !records.is_empty())
        .map(|(port_name, mut records)| {
            // Stable: records of one address stay in their slices' order for the choice
            // below. Sorting first and merging neighbours replaced a hash set per port,
            // an insert per endpoint of every service.
            records.sort_by_cached_key(|endpoint| AddrText::of(&endpoint.addr()));
            (port_name, one_per_address(records))
        })
        .collect()
}

/// Of records with the same address (neighbours, in their slices' order): a later one
/// replaces the one kept unless it is terminating, so a ready endpoint wins over a
/// terminating one with its address, and otherwise the last one stays.
fn one_per_address(records: Vec<Arc<Endpoint>>) -> Vec<Arc<Endpoint>> {
    let mut out: Vec<Arc<Endpoint>> = Vec::with_capacity(records.len());
    for record in records {
        match out.last_mut() {
            Some(kept) if kept.addr() == record.addr() => {
                if !record.terminating {
                    *kept = record;
                }
            }
            _ => out.push(record),
        }
    }
    out
}

/// An address's "ip:port" text in a buffer of its own: sorts as the `String` upstream sorts
/// by, without a heap allocation per endpoint (a cold sync sorts every endpoint).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct AddrText {
    /// The text's bytes then zeros: byte-wise order of the arrays is the order of the
    /// texts, as no text holds a zero byte and a shorter text that is a prefix of a longer
    /// one sorts first either way.
    bytes: [u8; AddrText::MAX],
}

impl AddrText {
    /// The longest text, "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", is 47 bytes.
    const MAX: usize = 56;

    fn of(addr: &SocketAddr) -> Self {
        use std::io::Write as _;
        let mut bytes = [0u8; Self::MAX];
        match addr {
            // By hand: the formatter's machinery was a sixth of a cold sync's model work
            // (a million IPv4 endpoints).
            SocketAddr::V4(v4) => {
                let mut at = 0;
                for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                    if i > 0 {
                        bytes[at] = b'.';
                        at += 1;
                    }
                    at = put_decimal(&mut bytes, at, u32::from(octet));
                }
                bytes[at] = b':';
                put_decimal(&mut bytes, at + 1, u32::from(v4.port()));
            }
            SocketAddr::V6(_) => {
                let mut room = &mut bytes[..];
                // Cannot fail: every socket address fits (see MAX).
                let _ = write!(room, "{addr}");
            }
        }
        Self { bytes }
    }
}

/// Writes `value` in decimal at `at` in `bytes`; returns where it ends. An IPv4 socket
/// address's text (at most 21 bytes) always fits in [`AddrText::MAX`].
fn put_decimal(bytes: &mut [u8; AddrText::MAX], at: usize, value: u32) -> usize {
    let mut digits = [0u8; 10];
    let mut count = 0;
    let mut rest = value;
    loop {
        digits[count] = b'0' + (rest % 10) as u8;
        count += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for (i, digit) in digits[..count].iter().rev().enumerate() {
        bytes[at + i] = *digit;
    }
    at + count
}

#[cfg(test)]
mod addr_text_tests {
    use super::*;

    #[test]
    fn addr_text_sorts_as_the_string_does() {
        let addrs: Vec<SocketAddr> = [
            "10.0.1.10:80",
            "10.0.1.1:80",
            "10.0.1.1:8",
            "10.0.1.1:8080",
            "9.9.9.9:1",
            "[fd00::1]:80",
            "[fd00::10]:80",
            "[::ffff:255.255.255.255]:65535",
            "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535",
            "[::]:0",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        let mut by_string = addrs.clone();
        by_string.sort_by_cached_key(|a| a.to_string());
        let mut by_text = addrs;
        by_text.sort_by_cached_key(AddrText::of);
        assert_eq!(by_text, by_string);
        let longest: SocketAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
            .parse()
            .unwrap();
        assert!(longest.to_string().len() < AddrText::MAX);
    }

    #[test]
    fn an_ipv4_text_written_by_hand_is_the_formatters() {
        for text in [
            "0.0.0.0:0",
            "10.0.1.10:80",
            "9.9.9.9:1",
            "100.64.255.7:8080",
            "255.255.255.255:65535",
            "1.20.199.200:10",
        ] {
            let addr: SocketAddr = text.parse().unwrap();
            let written = AddrText::of(&addr);
            let end = written.bytes.iter().position(|b| *b == 0).unwrap();
            assert_eq!(std::str::from_utf8(&written.bytes[..end]), Ok(text));
            assert!(written.bytes[end..].iter().all(|b| *b == 0), "{text}");
        }
    }
}
