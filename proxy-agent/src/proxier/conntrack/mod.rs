// SPDX-License-Identifier: Apache-2.0
//! Stale UDP conntrack reconciler, shared by the iptables and ipvs modes (upstream
//! pkg/proxy/conntrack since 1.32, with its 2026 fixes).
//!
//! UDP has no connection end: a netfilter conntrack entry keeps translating a client's
//! datagrams to the endpoint it picked for as long as the client keeps sending, whatever
//! the rules say now. So after a sync that changed a UDP service or its endpoints, each
//! family's table is listed and every UDP entry whose original destination is a service
//! frontend and whose reply source is not an endpoint serving that frontend is deleted
//! ([`UdpFrontends`] decides, purely). The next datagram then meets the current rules: a
//! live endpoint, or the REJECT/DROP of a service without one.
//!
//! [`UdpConntrackReconciler`] runs it over a [`ConntrackTable`]: ctnetlink in production
//! ([`netlink::NetlinkConntrack`]: one dump, then one delete per stale entry by its exact
//! tuple, which works on every kernel).

mod frontends;
mod netlink;

#[cfg(test)]
pub(super) mod fake;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use crate::model::{IpFamily, Protocol, ServicePort};
pub use crate::proxier::ConntrackReconcile;
use crate::proxier::SyncRequest;

pub use frontends::{FlowVerdict, UdpFrontends};
pub use netlink::{NatFlow, NetlinkConntrack, Replace};

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

/// One direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// A conntrack entry as the kernel dumps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub family: IpFamily,
    pub orig: Tuple,
    pub reply: Tuple,
    pub zone: u16,
}

impl Entry {
    /// Where the client sent it (`--orig-dst`, `--orig-port-dst`).
    pub fn original_destination(&self) -> SocketAddr {
        SocketAddr::new(self.orig.dst, self.orig.dst_port)
    }

    /// Who answers (`--reply-src`, `--reply-port-src`): the endpoint after DNAT, or the
    /// destination itself when nothing translated it.
    pub fn reply_source(&self) -> SocketAddr {
        SocketAddr::new(self.reply.src, self.reply.src_port)
    }
}

/// The conntrack table of this network namespace.
pub trait ConntrackTable: Send {
    /// Every entry of one family.
    fn list(&mut self, family: IpFamily) -> Result<Vec<Entry>>;
    /// Deletes these entries (by their original tuple); returns how many were deleted.
    /// Entries gone meanwhile are not an error.
    fn delete(&mut self, entries: &[Entry]) -> Result<usize>;
}

/// The UDP entries of `entries` that lead a client's next datagram to the wrong place.
pub fn stale_udp_entries<'e>(frontends: &UdpFrontends, entries: &'e [Entry]) -> Vec<&'e Entry> {
    entries
        .iter()
        .filter(|entry| entry.orig.protocol == IPPROTO_UDP)
        .filter(|entry| {
            frontends.verdict(entry.original_destination(), entry.reply_source())
                == FlowVerdict::Stale
        })
        .collect()
}

/// Runs the reconcile after the syncs that call for one.
pub struct UdpConntrackReconciler {
    table: Box<dyn ConntrackTable>,
    /// Run at the next sync whatever it reports: the first sync (entries left from before
    /// the agent started), and after a reconcile that failed.
    due: bool,
    /// Replaced ports a failed reconcile could not finish with.
    carried: Vec<Arc<ServicePort>>,
}

impl UdpConntrackReconciler {
    pub fn new(table: Box<dyn ConntrackTable>) -> Self {
        Self {
            table,
            due: true,
            carried: Vec::new(),
        }
    }

    /// After a sync's rules are in (entries deleted earlier could be recreated by packets
    /// still following the old rules), for each family of the request. Failures are logged
    /// and retried at the next sync, never fail the sync: the rules are right, only old
    /// flows linger.
    pub fn after_sync(&mut self, request: &SyncRequest<'_>) -> Vec<ConntrackReconcile> {
        if !self.due && !request.stale.cleanup_required() {
            return Vec::new();
        }
        let replaced: Vec<Arc<ServicePort>> = self
            .carried
            .drain(..)
            .chain(request.stale.replaced_udp_ports.iter().cloned())
            .collect();
        let mut failed = false;
        let mut reports = Vec::new();
        for state in request.families {
            let started = Instant::now();
            let frontends = UdpFrontends::new(
                state,
                replaced.iter().map(Arc::as_ref),
                &request.node.host_addresses,
            );
            match self.reconcile_family(state.family, &frontends) {
                Ok(deleted) => {
                    tracing::debug!(family = %state.family, deleted, "reconciled UDP conntrack entries");
                    reports.push(ConntrackReconcile {
                        family: state.family,
                        took: started.elapsed(),
                        deleted,
                    });
                }
                Err(err) => {
                    tracing::error!(family = %state.family, reason = %err, "failed to delete stale UDP conntrack entries; retrying at the next sync");
                    failed = true;
                }
            }
        }
        self.due = failed;
        if failed {
            self.carried = replaced;
        }
        reports
    }

    fn reconcile_family(&mut self, family: IpFamily, frontends: &UdpFrontends) -> Result<usize> {
        if frontends.is_empty() {
            return Ok(0);
        }
        let entries = self.table.list(family)?;
        let stale: Vec<Entry> = stale_udp_entries(frontends, &entries)
            .into_iter()
            .copied()
            .collect();
        if stale.is_empty() {
            return Ok(0);
        }
        self.table.delete(&stale)
    }
}

#[cfg(test)]
mod tests;
