// SPDX-License-Identifier: Apache-2.0
//! Stale UDP conntrack cleanup, shared by the iptables and ipvs modes.
//!
//! UDP has no connection end, so a conntrack entry created while a service had no
//! endpoints (rejected or dropped), or one pointing at an endpoint that is gone, keeps
//! capturing a client's packets for as long as the client keeps sending. Upstream deletes
//! such entries after each sync; so do we: [`plan_udp_cleanup`] turns what the trackers
//! reported into [`Filter`]s (upstream's `conntrack -D` invocations), and a
//! [`ConntrackCleaner`] deletes the matching entries, over ctnetlink in production
//! ([`netlink::NetlinkConntrack`]: one dump, then one delete per matching entry by its
//! exact tuple, which works on every kernel).

pub mod netlink;

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::model::{IpFamily, Protocol, ServicePort};
use crate::proxier::{FamilyState, StaleConntrack};

pub use netlink::NetlinkConntrack;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;

pub fn ip_protocol(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("netlink socket: {0}")]
    Socket(#[source] nix::Error),
    #[error("conntrack {operation} failed: {source}")]
    Kernel {
        operation: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("malformed netlink message: {0}")]
    Malformed(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which entries to delete; every set field must match. Fields compare the original
/// direction's destination and the reply direction's source (the endpoint, after DNAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Filter {
    pub family: IpFamily,
    pub protocol: u8,
    pub orig_dst: Option<IpAddr>,
    pub orig_dst_port: Option<u16>,
    pub reply_src: Option<IpAddr>,
}

impl Filter {
    /// `conntrack -D --orig-dst ip -p udp`.
    pub fn to_ip(ip: IpAddr) -> Self {
        Self {
            family: IpFamily::of(&ip),
            protocol: IPPROTO_UDP,
            orig_dst: Some(ip),
            orig_dst_port: None,
            reply_src: None,
        }
    }

    /// `conntrack -D -p udp --dport port`.
    pub fn to_port(family: IpFamily, port: u16) -> Self {
        Self {
            family,
            protocol: IPPROTO_UDP,
            orig_dst: None,
            orig_dst_port: Some(port),
            reply_src: None,
        }
    }

    /// `conntrack -D --orig-dst ip --dst-nat endpoint -p udp`.
    pub fn nat(ip: IpAddr, endpoint: IpAddr) -> Self {
        Self {
            reply_src: Some(endpoint),
            ..Self::to_ip(ip)
        }
    }

    /// `conntrack -D -p udp --dport port --dst-nat endpoint`.
    pub fn port_nat(port: u16, endpoint: IpAddr) -> Self {
        Self {
            reply_src: Some(endpoint),
            ..Self::to_port(IpFamily::of(&endpoint), port)
        }
    }

    pub fn matches(&self, entry: &Entry) -> bool {
        entry.family == self.family
            && entry.orig.protocol == self.protocol
            && self.orig_dst.is_none_or(|ip| entry.orig.dst == ip)
            && self
                .orig_dst_port
                .is_none_or(|port| entry.orig.dst_port == port)
            && self.reply_src.is_none_or(|ip| entry.reply.src == ip)
    }
}

/// One direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// A conntrack entry as the kernel dumps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub family: IpFamily,
    pub orig: Tuple,
    pub reply: Tuple,
    pub zone: u16,
}

/// Deletes conntrack entries.
pub trait ConntrackCleaner: Send {
    /// Deletes every entry matching any filter; returns how many were deleted.
    fn delete(&mut self, filters: &[Filter]) -> Result<usize>;
}

/// Upstream's cleanup after a sync, as filters:
/// - ClusterIPs of removed UDP service ports: every entry to them;
/// - UDP service ports that gained their first endpoints: every entry to their ClusterIP,
///   external IPs, LB IPs and NodePort (created while traffic was rejected or dropped);
/// - UDP endpoints that went away: entries to the service's addresses (and NodePort)
///   that were translated to that endpoint.
///
/// `families` is the model after the sync.
pub fn plan_udp_cleanup(stale: &StaleConntrack, families: &[FamilyState]) -> Vec<Filter> {
    let mut filters = BTreeSet::new();
    let service = |name, family: IpFamily| -> Option<&ServicePort> {
        let state = families.iter().find(|f| f.family == family)?;
        state
            .services
            .get(name)
            .map(|svc| svc.as_ref())
            .filter(|svc| svc.protocol == Protocol::Udp)
    };
    for ip in &stale.deleted_udp_cluster_ips {
        filters.insert(Filter::to_ip(*ip));
    }
    for name in &stale.new_services_with_endpoints {
        for state in families {
            let Some(svc) = service(name, state.family) else {
                continue;
            };
            for ip in service_ips(svc) {
                filters.insert(Filter::to_ip(ip));
            }
            if let Some(port) = svc.node_port {
                filters.insert(Filter::to_port(state.family, port));
            }
        }
    }
    for deleted in &stale.deleted_udp_endpoints {
        let endpoint = deleted.endpoint.ip();
        let Some(svc) = service(&deleted.service_port_name, IpFamily::of(&endpoint)) else {
            continue;
        };
        if let Some(port) = svc.node_port {
            filters.insert(Filter::port_nat(port, endpoint));
        }
        for ip in service_ips(svc) {
            filters.insert(Filter::nat(ip, endpoint));
        }
    }
    filters.into_iter().collect()
}

fn service_ips(svc: &ServicePort) -> impl Iterator<Item = IpAddr> + '_ {
    std::iter::once(svc.cluster_ip)
        .chain(svc.external_ips.iter().copied())
        .chain(svc.load_balancer_vips())
}

/// Runs the cleanup the stale report calls for; errors are logged, as upstream does: a
/// failed cleanup must not fail the sync.
pub fn clean_stale_udp(
    cleaner: &mut dyn ConntrackCleaner,
    stale: &StaleConntrack,
    families: &[FamilyState],
) {
    let filters = plan_udp_cleanup(stale, families);
    if filters.is_empty() {
        return;
    }
    match cleaner.delete(&filters) {
        Ok(deleted) => {
            tracing::debug!(
                filters = filters.len(),
                deleted,
                "deleted stale UDP conntrack entries"
            )
        }
        Err(err) => {
            tracing::error!(reason = %err, filters = filters.len(), "failed to delete stale UDP conntrack entries")
        }
    }
}

#[cfg(test)]
mod tests;
