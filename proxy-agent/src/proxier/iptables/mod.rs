// SPDX-License-Identifier: Apache-2.0
//! The iptables dataplane: upstream kube-proxy's iptables proxier, chain for chain.
//!
//! - `rules` turns one family's model into `iptables-restore` input (pure, golden-tested);
//! - `family` applies it for one family: full syncs also insert missing jump rules,
//!   declare the canary chain and delete stale chains found in the kernel; partial syncs
//!   rewrite the top-level chains and the chains of changed services only;
//! - [`IptablesProxier`] runs one family proxier per `FamilyState` of a sync (IPv4 with
//!   iptables-restore, IPv6 with ip6tables-restore), then deletes stale UDP conntrack
//!   entries;
//! - [`IptablesProxier::check_flushed`] notices when someone flushed our rules;
//! - [`cleanup::cleanup_with`] / [`cleanup_leftovers`] remove everything.
//!
//! Running the iptables binaries, reading their output and the jump rules' mechanics are
//! shared with the ipvs mode in [`crate::proxier::netfilter`].

mod cleanup;
mod counters;
mod family;
mod jumps;
pub(super) mod mode;
mod names;
mod rules;
mod setup;
mod trace;

#[cfg(test)]
mod fake;
#[cfg(test)]
pub(crate) mod tests;

use std::time::Duration;

pub use cleanup::cleanup_with;
pub use counters::{ct_state_invalid_dropped_packets, localhost_nodeports_accepted_packets};
pub use rules::{NfacctCounters, RuleOptions};

// The backend this mode is built with (tests and benchmarks construct it).
pub use crate::proxier::netfilter::{CommandBackend, ExecError, IptablesBackend};

use crate::model::IpFamily;
use crate::node::Sysctl;
use crate::proxier::conntrack::{ConntrackTable, NetlinkConntrack, UdpConntrackReconciler};
use crate::proxier::netfilter::cleanup::{CleanupReport, TableError, cleanup_chains_with};
use crate::proxier::{
    FamilyReport, NodeContext, Proxier, RestoreFailure, SyncError, SyncRequest, SyncStats,
};
use family::FamilyProxier;

pub const MODE: &str = "iptables";

#[derive(Debug, thiserror::Error)]
pub enum Error {
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

/// Settings of this mode beyond [`NodeContext`].
#[derive(Clone, Copy, Debug)]
pub struct IptablesConfig {
    /// iptables.syncPeriod: in large clusters, how often the kernel is searched for stale
    /// chains.
    pub sync_period: Duration,
}

impl Default for IptablesConfig {
    fn default() -> Self {
        Self {
            sync_period: Duration::from_secs(30),
        }
    }
}

/// The iptables proxier for both families.
pub struct IptablesProxier {
    backend: Box<dyn IptablesBackend>,
    conntrack: UdpConntrackReconciler,
    options: RuleOptions,
    config: IptablesConfig,
    families: Vec<FamilyProxier>,
}

impl IptablesProxier {
    /// Finds the iptables binaries, applies the sysctls this mode needs (see `setup`) and
    /// returns a proxier whose first sync will be full.
    pub fn new(
        config: IptablesConfig,
        node: &NodeContext,
        sysctl: &mut dyn Sysctl,
    ) -> Result<Self> {
        let backend = CommandBackend::detect().map_err(Error::Detect)?;
        let settings = setup::apply(sysctl, node)?;
        let options = RuleOptions {
            random_fully: backend.version.has_random_fully(),
            conntrack_tcp_be_liberal: settings.conntrack_tcp_be_liberal,
            nfacct: counters::ensure_nfacct_counters(),
        };
        Ok(Self::with_parts(
            Box::new(backend),
            Box::new(NetlinkConntrack::new()),
            options,
            config,
        ))
    }

    /// A proxier over any backend and conntrack table (tests, benchmarks).
    pub fn with_parts(
        backend: Box<dyn IptablesBackend>,
        conntrack: Box<dyn ConntrackTable>,
        options: RuleOptions,
        config: IptablesConfig,
    ) -> Self {
        Self {
            backend,
            conntrack: UdpConntrackReconciler::new(conntrack),
            options,
            config,
            families: Vec::new(),
        }
    }

    /// The restore input of the last sync of `family` (for logs and tests).
    pub fn last_restore_input(&self, family: IpFamily) -> Option<&str> {
        self.families
            .iter()
            .find(|f| f.family == family)
            .map(FamilyProxier::last_input)
    }

    /// Checks every synced family for a flush of our rules (the canary chain deleted, or
    /// the jumps from the built-in chains gone). True means the next sync must be full;
    /// the proxier also remembers it, so even a partial request then syncs fully. Meant to
    /// be called periodically (upstream polls every sync period) and cheap: a few
    /// `iptables -S` per family.
    pub fn check_flushed(&mut self) -> bool {
        let mut flushed = false;
        for family in &mut self.families {
            flushed |= family.check_flushed(self.backend.as_mut());
        }
        flushed
    }

    /// Syncs every family; on failure, also which restore failed, if one did.
    fn sync_families(
        &mut self,
        request: &SyncRequest<'_>,
    ) -> Result<SyncStats, (Error, Option<RestoreFailure>)> {
        let mut stats = SyncStats::default();
        for state in request.families {
            let proxier = family_proxier(&mut self.families, state.family);
            let partial = !proxier.syncs_fully(request.full);
            let outcome = proxier
                .sync(
                    self.backend.as_mut(),
                    state,
                    request.node,
                    self.options,
                    self.config.sync_period,
                    request.full,
                    request.changed,
                )
                .map_err(|err| {
                    let failure = matches!(err, Error::Table(TableError::Restore { .. }))
                        .then_some(RestoreFailure {
                            family: state.family,
                            partial,
                        });
                    (err, failure)
                })?;
            let generated = &outcome.generated;
            stats.services += generated.service_ports;
            stats.written += outcome.written;
            stats.deleted += outcome.deleted;
            stats.no_local_endpoints_internal += generated.no_local_endpoints_internal;
            stats.no_local_endpoints_external += generated.no_local_endpoints_external;
            stats.per_family.push(FamilyReport {
                family: state.family,
                no_local_endpoints_internal: generated.no_local_endpoints_internal,
                no_local_endpoints_external: generated.no_local_endpoints_external,
                iptables_rules: outcome.rules,
                nftables_cleanup_failed: false,
            });
        }
        Ok(stats)
    }
}

/// The proxier of `family`, created on first use.
fn family_proxier(families: &mut Vec<FamilyProxier>, family: IpFamily) -> &mut FamilyProxier {
    let index = match families.iter().position(|f| f.family == family) {
        Some(index) => index,
        None => {
            families.push(FamilyProxier::new(family));
            families.len() - 1
        }
    };
    &mut families[index]
}

impl Proxier for IptablesProxier {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError> {
        let mut stats = self
            .sync_families(request)
            .map_err(|(err, failure)| SyncError::new(MODE, err).with_restore_failure(failure))?;
        stats.conntrack_reconciles = self.conntrack.after_sync(request);
        Ok(stats)
    }

    fn needs_full_resync(&mut self) -> bool {
        self.check_flushed()
    }
}

/// Removes this mode's rules and chains from both families with the binaries on PATH
/// (`--cleanup`, mode switches). A family whose tools are missing is reported as an error
/// after the other was cleaned.
pub fn cleanup_leftovers() -> Result<CleanupReport> {
    let mut backend = CommandBackend::detect().map_err(Error::Detect)?;
    cleanup_with(&mut backend, &[IpFamily::V4, IpFamily::V6])
}

/// Removes only the chains the ipvs mode does not share (when ipvs mode takes over: it
/// rewrites the shared chains on its first sync).
pub fn cleanup_iptables_only_chains() -> Result<CleanupReport> {
    let mut backend = CommandBackend::detect().map_err(Error::Detect)?;
    Ok(cleanup_chains_with(
        &mut backend,
        &[IpFamily::V4, IpFamily::V6],
        cleanup::iptables_only,
    )?)
}
