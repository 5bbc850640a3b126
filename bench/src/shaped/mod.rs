// SPDX-License-Identifier: Apache-2.0
//! Rules shaped like upstream kube-proxy's for a set of TCP ClusterIP services (pure): the
//! baselines the benchmarks load with the raw tools, with no proxy running.
//!
//! The shapes follow upstream's iptables and nftables proxiers as their tests show them
//! (`pkg/proxy/iptables`, `pkg/proxy/nftables`); the code is ours. Only what a TCP
//! ClusterIP service with ready endpoints needs is written: no NodePorts, external IPs,
//! session affinity or filter table.
//!
//! # API
//!
//! - [`ShapedService`]: one service port (`namespace/name:port_name`, ClusterIP, port, the
//!   endpoints). [`fillers`] makes `count` of them with deterministic addresses.
//! - [`ShapedOptions`]: the cluster CIDR (pods); with one, traffic from outside it is
//!   marked for masquerade, as upstream does when `--cluster-cidr` is set.
//! - [`iptables_full`]: the `nat` table text for `iptables-restore --noflush` in a fresh
//!   namespace: every chain, in the order the services are given (so the measured one can
//!   be placed last in `KUBE-SERVICES`, or anywhere), plus the jumps from the built-in
//!   chains (upstream adds those with `iptables -I`; here they ride along).
//! - [`iptables_partial`]: what upstream restores after a change with its
//!   minimize-iptables-restore behaviour: the top-level chains (`KUBE-SERVICES`,
//!   `KUBE-NODEPORTS`, `KUBE-POSTROUTING`, `KUBE-MARK-MASQ`) rewritten whole, the chains of
//!   changed services only, chains that lost their service or endpoint deleted (`-X`).
//! - [`nft_full`]: the `table ip kube-proxy` text for `nft -f` (created and flushed, then
//!   filled), with the `service-ips` verdict map and one `numgen` chain per service.
//!   [`nft_full_in_transactions`] cuts the same into several `nft -f` texts (see there).
//! - [`nft_update`]: upstream's incremental transaction for a change: elements added or
//!   deleted, changed service chains flushed and rewritten, stale chains deleted.
//! - [`Change`]: the three changes the sync benchmark measures (add one service, remove one
//!   endpoint, scale one service from 4 to 40 endpoints), applied to a service list; the
//!   partial functions take the lists before and after and work for any change.
//!
//! ```ignore
//! let before = shaped::fillers(10_000, 4);
//! let after = shaped::Change::ScaleTo { service: 17, endpoints: 40 }.apply(&before);
//! let opts = shaped::ShapedOptions::default();
//! let full = shaped::iptables_full(&before, &opts);
//! let partial = shaped::iptables_partial(&before, &after, &opts);
//! let nft = shaped::nft_update(&before, &after, &opts);
//! ```

pub mod iptables;
pub mod nft;

#[cfg(all(test, feature = "hand-run"))]
mod compare_tests;
#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddrV4},
};

use ipnet::Ipv4Net;
use ring::digest;

pub use self::{
    iptables::{iptables_full, iptables_partial},
    nft::{nft_full, nft_full_in_transactions, nft_update},
};

/// One TCP ClusterIP service port and its ready endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapedService {
    pub namespace: String,
    pub name: String,
    /// The service port's name; may be empty (single-port services).
    pub port_name: String,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub endpoints: Vec<SocketAddrV4>,
}

impl ShapedService {
    /// Upstream's `ServicePortName` text: `ns/name:port`, or `ns/name` for an unnamed port.
    pub fn port_name_text(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }

    /// What identifies the service port across a change (its chains are named after it).
    fn key(&self) -> (&str, &str, &str) {
        (&self.namespace, &self.name, &self.port_name)
    }
}

/// Rule options shared by both shapes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapedOptions {
    /// The pods' CIDR; with it, service traffic from outside is marked for masquerade.
    pub cluster_cidr: Option<Ipv4Net>,
}

/// Filler ClusterIPs count up from 10.100.0.1 (the range the benchmark manifests use for
/// fillers), their endpoints from 10.128.0.1, endpoints added by [`Change`] from
/// 10.192.0.1: the three never overlap below 1M services.
const FILLER_IP_BASE: u32 = u32::from_be_bytes([10, 100, 0, 0]);
const FILLER_ENDPOINT_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
const ADDED_ENDPOINT_BASE: u32 = u32::from_be_bytes([10, 192, 0, 0]);
/// The port fillers listen on, and their endpoints' port.
pub const FILLER_PORT: u16 = 80;
pub const FILLER_TARGET_PORT: u16 = 8080;
/// Endpoints [`Change::ScaleTo`] may add per service (its new addresses are unique below it).
pub const MAX_SCALE: usize = 64;

/// `count` services `fillers/filler-<i>:http` with `endpoints` endpoints each.
pub fn fillers(count: u32, endpoints: u32) -> Vec<ShapedService> {
    (0..count)
        .map(|i| ShapedService {
            namespace: "fillers".into(),
            name: format!("filler-{i}"),
            port_name: "http".into(),
            cluster_ip: Ipv4Addr::from(FILLER_IP_BASE + 1 + i),
            port: FILLER_PORT,
            endpoints: (0..endpoints)
                .map(|e| {
                    let ip = Ipv4Addr::from(FILLER_ENDPOINT_BASE + 1 + i * endpoints + e);
                    SocketAddrV4::new(ip, FILLER_TARGET_PORT)
                })
                .collect(),
        })
        .collect()
}

/// A change to a service list (the ones the sync benchmark measures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Append a service.
    AddService(ShapedService),
    /// Drop the last endpoint of service `service` (an index into the list).
    RemoveEndpoint { service: usize },
    /// Grow (or shrink) service `service` to `endpoints` endpoints (at most [`MAX_SCALE`]),
    /// keeping the endpoints it has.
    ScaleTo { service: usize, endpoints: usize },
}

impl Change {
    /// The list after the change (an index out of range changes nothing).
    pub fn apply(&self, services: &[ShapedService]) -> Vec<ShapedService> {
        let mut after = services.to_vec();
        match self {
            Change::AddService(svc) => after.push(svc.clone()),
            Change::RemoveEndpoint { service } => {
                if let Some(svc) = after.get_mut(*service) {
                    svc.endpoints.pop();
                }
            }
            Change::ScaleTo { service, endpoints } => {
                if let Some(svc) = after.get_mut(*service) {
                    let want = (*endpoints).min(MAX_SCALE);
                    svc.endpoints.truncate(want);
                    for n in svc.endpoints.len()..want {
                        let ip = ADDED_ENDPOINT_BASE + 1 + (*service * MAX_SCALE + n) as u32;
                        svc.endpoints
                            .push(SocketAddrV4::new(Ipv4Addr::from(ip), FILLER_TARGET_PORT));
                    }
                }
            }
        }
        after
    }
}

/// The services of `before` and `after` that differ, as (before, after) pairs, in the order
/// of `after` then the removed ones in the order of `before`. Unchanged services are left
/// out: upstream rewrites only the chains of services whose rules changed.
type Pair<'a> = (Option<&'a ShapedService>, Option<&'a ShapedService>);

fn changed<'a>(before: &'a [ShapedService], after: &'a [ShapedService]) -> Vec<Pair<'a>> {
    let old: HashMap<_, _> = before.iter().map(|s| (s.key(), s)).collect();
    let new: HashMap<_, _> = after.iter().map(|s| (s.key(), s)).collect();
    let mut out: Vec<Pair<'a>> = after
        .iter()
        .filter_map(|s| match old.get(&s.key()) {
            Some(prev) if *prev == s => None,
            prev => Some((prev.copied(), Some(s))),
        })
        .collect();
    out.extend(
        before
            .iter()
            .filter(|s| !new.contains_key(&s.key()))
            .map(|s| (Some(s), None)),
    );
    out
}

/// A service that has rules: one with endpoints (upstream rejects the others elsewhere).
fn live(svc: Option<&ShapedService>) -> Option<&ShapedService> {
    svc.filter(|s| !s.endpoints.is_empty())
}

/// The first `chars` characters of the base32 (RFC 4648 alphabet) of the SHA-256 of the
/// concatenated `parts`: how upstream names its per-service chains (16 characters for
/// iptables, 8 for nftables).
fn hash_prefix(parts: &[&str], chars: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut ctx = digest::Context::new(&digest::SHA256);
    for part in parts {
        ctx.update(part.as_bytes());
    }
    let sum = ctx.finish();
    let bytes = sum.as_ref();
    (0..chars.min(51))
        .map(|i| {
            // The 5 bits starting at bit 5*i, big-endian across bytes.
            let bit = 5 * i;
            let hi = u16::from(bytes[bit / 8]) << 8;
            let lo = bytes.get(bit / 8 + 1).copied().map_or(0, u16::from);
            let word = hi | lo;
            let index = (word >> (11 - bit % 8)) & 0x1f;
            char::from(ALPHABET[usize::from(index)])
        })
        .collect()
}
