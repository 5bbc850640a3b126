// SPDX-License-Identifier: Apache-2.0
//! Stale UDP flows in the BPF conntrack maps: ebpf mode's counterpart of the netfilter
//! reconciler ([`crate::proxier::conntrack`]), with the same rule.
//!
//! A north-south flow (tc/XDP, and the per-packet path for pods) is looked up in the
//! conntrack map before any service lookup, and its entry holds the backend's address:
//! as long as a UDP client keeps its source port and keeps sending, every datagram goes
//! to the backend its first one picked, whatever the service maps say now — after the
//! frontend (service, port, external IP, LB IP, NodePort) is gone, after the backend left
//! the service, after the service went to zero endpoints (whose REJECT/DROP only new flows
//! meet). Backend ids play no part (the entry holds the address), so an id freed and reused
//! by another service changes nothing. Socket-level load balancing is not concerned: an
//! unconnected UDP socket is translated at every `sendmsg()`.
//!
//! So after a sync that changed a UDP service or its endpoints (and at the first sync), both
//! entries (forward and reply) of every UDP flow whose frontend is no live UDP frontend, or
//! whose backend does not serve it, are deleted; the next datagram is load-balanced afresh.
//! Unlike the netfilter table, the map holds nothing but service flows, so a frontend the
//! model does not know is stale too (no need for the previous versions of removed ports).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use aya::maps::{HashMap as AyaHash, MapData};
use proxy_common::{Ct4Key, Ct6Key, CtValue, proto};

use super::maps::is_not_found;
use crate::model::FamilyState;
use crate::model::IpFamily;
use crate::proxier::SyncRequest;
use crate::proxier::conntrack::{ConntrackReconcile, FlowVerdict, UdpFrontends};

/// Where a flow went and who it was given to (the value's frontend and backend).
fn flow_ends(value: &CtValue, family: IpFamily) -> (SocketAddr, SocketAddr) {
    let ip = |bytes: &[u8; 16]| match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(*bytes)),
    };
    (
        SocketAddr::new(ip(&value.frontend_addr), u16::from_be(value.frontend_port)),
        SocketAddr::new(ip(&value.backend_addr), u16::from_be(value.backend_port)),
    )
}

/// Whether a flow of protocol `protocol` recorded as `value` must go (pure).
pub fn is_stale(frontends: &UdpFrontends, family: IpFamily, protocol: u8, value: &CtValue) -> bool {
    if protocol != proto::UDP {
        return false;
    }
    let (frontend, backend) = flow_ends(value, family);
    frontends.verdict(frontend, backend) != FlowVerdict::Serving
}

/// The keys of `entries` to delete (pure).
pub fn stale_keys<K: Copy>(
    frontends: &UdpFrontends,
    family: IpFamily,
    entries: impl IntoIterator<Item = (K, u8, CtValue)>,
) -> Vec<K> {
    entries
        .into_iter()
        .filter(|(_, protocol, value)| is_stale(frontends, family, *protocol, value))
        .map(|(key, _, _)| key)
        .collect()
}

/// Runs the cleanup after the syncs that call for one.
#[derive(Debug)]
pub struct StaleBpfFlows {
    /// Run at the next sync whatever it reports (the first sync: flows from before the
    /// agent started; after a failed pass).
    due: bool,
}

impl Default for StaleBpfFlows {
    fn default() -> Self {
        Self { due: true }
    }
}

impl StaleBpfFlows {
    /// After the service maps are written (a flow deleted earlier could be recreated from
    /// the old maps). Errors are logged and retried at the next sync; they never fail it.
    pub fn after_sync(
        &mut self,
        ct4: &mut AyaHash<MapData, Ct4Key, CtValue>,
        ct6: &mut AyaHash<MapData, Ct6Key, CtValue>,
        request: &SyncRequest<'_>,
    ) -> Vec<ConntrackReconcile> {
        if !self.due && !request.stale.cleanup_required() {
            return Vec::new();
        }
        let hosts = &request.node.host_addresses;
        let frontends = |family: IpFamily| {
            let empty = FamilyState::new(family);
            let state = request
                .families
                .iter()
                .find(|state| state.family == family)
                .unwrap_or(&empty);
            UdpFrontends::new(state, std::iter::empty(), hosts)
        };
        let mut failed = false;
        let mut reports = Vec::new();
        let started = Instant::now();
        let v4 = frontends(IpFamily::V4);
        match clean(ct4, &v4, IpFamily::V4, |k: &Ct4Key| k.proto) {
            Ok(deleted) => reports.push(report(IpFamily::V4, started, deleted)),
            Err(e) => failed |= log_failure(IpFamily::V4, &e),
        }
        let started = Instant::now();
        let v6 = frontends(IpFamily::V6);
        match clean(ct6, &v6, IpFamily::V6, |k: &Ct6Key| k.proto) {
            Ok(deleted) => reports.push(report(IpFamily::V6, started, deleted)),
            Err(e) => failed |= log_failure(IpFamily::V6, &e),
        }
        self.due = failed;
        // A family the node does not use has nothing to report.
        reports.retain(|r| {
            r.deleted > 0
                || request
                    .families
                    .iter()
                    .any(|state| state.family == r.family)
        });
        reports
    }
}

fn report(family: IpFamily, started: Instant, deleted: usize) -> ConntrackReconcile {
    if deleted > 0 {
        tracing::debug!(%family, deleted, "deleted stale UDP flows from the BPF conntrack map");
    }
    ConntrackReconcile {
        family,
        took: started.elapsed(),
        deleted,
    }
}

fn log_failure(family: IpFamily, err: &aya::maps::MapError) -> bool {
    tracing::error!(%family, error = %err, "failed to delete stale UDP flows from the BPF conntrack map; retrying at the next sync");
    true
}

/// One map: read every entry, delete the stale ones. Entries the LRU evicts meanwhile,
/// or gone by the time they are deleted, are not an error.
fn clean<K: aya::Pod + Copy>(
    map: &mut AyaHash<MapData, K, CtValue>,
    frontends: &UdpFrontends,
    family: IpFamily,
    protocol_of: impl Fn(&K) -> u8,
) -> Result<usize, aya::maps::MapError> {
    let mut entries = Vec::new();
    for item in map.iter() {
        match item {
            Ok((key, value)) => entries.push((key, protocol_of(&key), value)),
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    let mut deleted = 0;
    for key in stale_keys(frontends, family, entries) {
        match map.remove(&key) {
            Ok(()) => deleted += 1,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests;
