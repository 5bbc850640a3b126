// SPDX-License-Identifier: Apache-2.0
//! The ipvs dataplane: upstream kube-proxy's IPVS proxier.
//!
//! - `desired` turns one family's model into virtual servers, real servers, ipset
//!   members, kube-ipvs0 addresses and drop rules (pure); `sets` names and types the
//!   ipsets; `rules` writes the iptables rules that match them (pure);
//! - `genl` speaks IPVS over generic netlink, `ipset` drives the `ipset` binary,
//!   kube-ipvs0 goes through rtnetlink (`crate::proxier::netlink::route`);
//! - `apply` diffs against what the kernel lists, `graceful` drains removed real
//!   servers; `setup` sets the sysctls; [`cleanup`] removes everything.

mod apply;
mod cleanup;
mod desired;
mod genl;
mod graceful;
mod ipset;
mod kernel;
pub(super) mod mode;
mod rules;
mod sets;
mod setup;

/// What the kernel tests drive directly.
pub use self::{
    cleanup::cleanup,
    desired::{FamilyDesired, RealServer, ServiceKey, build as build_desired, nodeport_ips},
    genl::IpvsSocket,
    sets::{SetEntry, SetKind},
};

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{IpFamily, NamespacedName};
use crate::node::Sysctl;
use crate::proxier::conntrack::{NetlinkConntrack, UdpConntrackReconciler};
use crate::proxier::netfilter::cleanup::TableError;
use crate::proxier::netfilter::jumps::write_missing_jumps;
use crate::proxier::netfilter::matches::{LocalMatch, masquerade_mark};
use crate::proxier::netfilter::{CommandBackend, ExecError, IptablesBackend, Table};
use crate::proxier::netlink::NetlinkError;
use crate::proxier::netlink::route::RouteSocket;
use crate::proxier::{FamilyReport, Proxier, RestoreFailure, SyncError, SyncRequest, SyncStats};
use apply::{Counts, ServiceApply, apply_addresses};
use desired::DesiredService;
use genl::Timeouts;
use graceful::Draining;
use ipset::{IpsetBackend, IpsetCommand, IpsetError};
use kernel::{DummyAddresses, IpvsTable};
use rules::RuleContext;

pub const MODE: &str = "ipvs";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Netlink(#[from] NetlinkError),
    #[error("{0}")]
    Ipset(#[from] IpsetError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("iptables is not usable: {0}")]
    Detect(#[source] ExecError),
    #[error("cannot set sysctl {name}: {source}")]
    Sysctl {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of this mode (the `ipvs` section of the configuration).
#[derive(Clone, Debug, Default)]
pub struct IpvsConfig {
    /// ipvs.scheduler; empty means rr.
    pub scheduler: String,
    /// Virtual servers in these ranges are someone else's: never deleted.
    pub exclude_cidrs: Vec<IpNet>,
    pub strict_arp: bool,
    pub timeouts: Timeouts,
}

/// The mode's settings from the (validated) configuration.
pub fn ipvs_config(config: &crate::config::KubeProxyConfiguration) -> IpvsConfig {
    let seconds =
        |d: crate::config::Duration| u32::try_from(d.to_std().as_secs()).unwrap_or(u32::MAX);
    IpvsConfig {
        scheduler: config.ipvs.scheduler.clone(),
        // Validation already refused bad CIDRs.
        exclude_cidrs: config.ipvs_exclude_cidrs().unwrap_or_default(),
        strict_arp: config.ipvs.strict_arp,
        timeouts: Timeouts {
            tcp: seconds(config.ipvs.tcp_timeout),
            tcp_fin: seconds(config.ipvs.tcp_fin_timeout),
            udp: seconds(config.ipvs.udp_timeout),
        },
    }
}

/// The kernel-facing parts, replaceable in tests.
pub struct Parts {
    pub table: Box<dyn IpvsTable>,
    pub dummy: Box<dyn DummyAddresses>,
    pub ipset: Box<dyn IpsetBackend>,
    pub iptables: Box<dyn IptablesBackend>,
    pub conntrack: UdpConntrackReconciler,
    pub random_fully: bool,
}

pub struct IpvsProxier {
    parts: Parts,
    config: IpvsConfig,
    draining: Draining,
    /// The virtual servers of each service after the last successful sync.
    last_keys: BTreeMap<NamespacedName, BTreeSet<ServiceKey>>,
    families: Vec<IpFamily>,
    needs_full: bool,
}

impl IpvsProxier {
    /// Opens the IPVS family (loading ip_vs), sets the sysctls and timeouts, finds the
    /// iptables binaries; the first sync will be full.
    pub fn new(config: IpvsConfig, sysctl: &mut dyn Sysctl) -> Result<Self> {
        let mut table = IpvsSocket::open()?;
        setup::apply(sysctl, config.strict_arp)?;
        let t = config.timeouts;
        if t.tcp > 0 || t.tcp_fin > 0 || t.udp > 0 {
            table.set_timeouts(&t)?;
        }
        let iptables = CommandBackend::detect().map_err(Error::Detect)?;
        let random_fully = iptables.version.has_random_fully();
        let parts = Parts {
            table: Box::new(table),
            dummy: Box::new(RouteSocket::open()?),
            ipset: Box::new(IpsetCommand),
            iptables: Box::new(iptables),
            conntrack: UdpConntrackReconciler::new(Box::new(NetlinkConntrack::new())),
            random_fully,
        };
        Ok(Self::with_parts(parts, config))
    }

    pub fn with_parts(parts: Parts, config: IpvsConfig) -> Self {
        Self {
            parts,
            config,
            draining: Draining::default(),
            last_keys: BTreeMap::new(),
            families: Vec::new(),
            needs_full: true,
        }
    }

    /// Real servers waiting for their connections to end.
    pub fn draining(&self) -> &Draining {
        &self.draining
    }

    fn sync_all(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats> {
        let full = request.full || self.needs_full;
        let node = request.node;
        let families: Vec<IpFamily> = request.families.iter().map(|f| f.family).collect();
        let desired: Vec<(IpFamily, FamilyDesired)> = request
            .families
            .iter()
            .map(|state| {
                (
                    state.family,
                    desired::build(state, node, &self.config.scheduler),
                )
            })
            .collect();
        let mut stats = SyncStats::default();
        let mut counts = Counts::default();

        // Sets first: the rules refer to them.
        let saved = ipset::parse_save(&self.parts.ipset.save()?);
        let mut input = String::new();
        for (family, d) in &desired {
            let changes = ipset::diff(*family, &d.sets, &saved);
            input.push_str(&changes.input);
            counts.written += changes.created + changes.added;
            counts.deleted += changes.deleted;
        }
        self.parts.ipset.restore(&input)?;

        for (family, d) in &desired {
            let family = *family;
            let ctx = RuleContext {
                family,
                mark: masquerade_mark(node.masquerade_bit),
                local: LocalMatch::of(&node.local_detector, family),
                masquerade_all: node.masquerade_all,
                random_fully: self.parts.random_fully,
            };
            let (filter, nat) = rules::generate(d, &ctx);
            let (mut extra_filter, mut extra_nat) = (String::new(), String::new());
            if full {
                write_missing_jumps(
                    self.parts.iptables.as_mut(),
                    family,
                    rules::JUMPS,
                    None,
                    &mut extra_nat,
                    &mut extra_filter,
                )
                .map_err(|source| TableError::List { family, source })?;
            }
            let input = rules::assemble(&filter, &nat, &extra_filter, &extra_nat);
            self.parts
                .iptables
                .restore(family, &input)
                .map_err(|source| TableError::Restore { family, source })?;
            stats.services += d.keys_by_service.len();
            stats.no_local_endpoints_internal += d.no_local_endpoints_internal;
            stats.no_local_endpoints_external += d.no_local_endpoints_external;
            stats.per_family.push(FamilyReport {
                family,
                no_local_endpoints_internal: d.no_local_endpoints_internal,
                no_local_endpoints_external: d.no_local_endpoints_external,
                iptables_rules: Vec::new(),
                nftables_cleanup_failed: false,
            });
        }

        // Addresses before virtual servers: a VIP must be local before IPVS serves it.
        let addresses: BTreeSet<IpAddr> = desired
            .iter()
            .flat_map(|(_, d)| d.addresses.iter().copied())
            .collect();
        apply_addresses(
            self.parts.dummy.as_mut(),
            &addresses,
            &families,
            &mut counts,
        )?;

        let merged: BTreeMap<ServiceKey, &DesiredService> = desired
            .iter()
            .flat_map(|(_, d)| d.services.iter().map(|(k, v)| (*k, v)))
            .collect();
        let mut keys_by_service: BTreeMap<NamespacedName, BTreeSet<ServiceKey>> = BTreeMap::new();
        for (_, d) in &desired {
            for (name, keys) in &d.keys_by_service {
                keys_by_service
                    .entry(name.clone())
                    .or_default()
                    .extend(keys.iter().copied());
            }
        }
        let scope: Option<BTreeSet<ServiceKey>> = (!full).then(|| {
            request
                .changed
                .iter()
                .flat_map(|name| {
                    let old = self.last_keys.get(name).into_iter().flatten();
                    let new = keys_by_service.get(name).into_iter().flatten();
                    old.chain(new).copied()
                })
                .collect()
        });
        let mut apply = ServiceApply {
            table: self.parts.table.as_mut(),
            draining: &mut self.draining,
            exclude: &self.config.exclude_cidrs,
            families: &families,
            counts: Counts::default(),
        };
        apply.apply(&merged, scope.as_ref())?;
        counts.written += apply.counts.written;
        counts.deleted += apply.counts.deleted;

        self.last_keys = keys_by_service;
        self.families = families;
        self.needs_full = false;
        stats.written = counts.written;
        stats.deleted = counts.deleted;
        Ok(stats)
    }

    /// Whether the jumps into our chains are still in place (a firewall reload flushes
    /// them); a family never synced has nothing to lose.
    pub fn check_flushed(&mut self) -> bool {
        for &family in &self.families {
            let witness = &rules::JUMPS[1];
            match self
                .parts
                .iptables
                .list_chain(family, Table::Nat, witness.from)
            {
                Ok(listing) => {
                    let listing = listing.unwrap_or_default();
                    if !listing.lines().any(|line| witness.matches(line)) {
                        tracing::info!(%family, "ipvs mode's iptables rules were flushed; a full sync will restore them");
                        self.needs_full = true;
                        return true;
                    }
                }
                Err(err) => {
                    tracing::warn!(%family, reason = %err, "could not check the iptables jumps")
                }
            }
        }
        false
    }
}

impl Proxier for IpvsProxier {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError> {
        let mut stats = self.sync_all(request).map_err(|err| {
            self.needs_full = true;
            // Upstream's ipvs mode counts restore failures, not partial ones.
            let failure = match &err {
                Error::Table(TableError::Restore { family, .. }) => Some(RestoreFailure {
                    family: *family,
                    partial: false,
                }),
                _ => None,
            };
            SyncError::new(MODE, err).with_restore_failure(failure)
        })?;
        stats.conntrack_reconciles = self.parts.conntrack.after_sync(request);
        Ok(stats)
    }

    fn maintain(&mut self) {
        if self.draining.is_empty() {
            return;
        }
        let mut apply = ServiceApply {
            table: self.parts.table.as_mut(),
            draining: &mut self.draining,
            exclude: &self.config.exclude_cidrs,
            families: &self.families,
            counts: Counts::default(),
        };
        if let Err(err) = apply.check_draining(&BTreeSet::new()) {
            tracing::warn!(reason = %err, "checking draining real servers failed");
        }
    }

    fn needs_full_resync(&mut self) -> bool {
        self.check_flushed()
    }
}
