// SPDX-License-Identifier: Apache-2.0
//! The nftables proxier: one table per family (`ip kube-proxy`, `ip6 kube-proxy`), each
//! moved to the model's state by one `nft -f -` transaction per sync. A full sync (the
//! first, every sync period, after a failure or a flush) rewrites every chain and refills
//! the maps; a partial sync writes only the changed services' chains and the map elements
//! that changed. Chains no longer used are flushed at once and deleted by a later sync, at
//! least [`STALE_CHAIN_DELAY`](super::STALE_CHAIN_DELAY) after (upstream's order: their
//! deletion is the first transaction of the sync that finds them due). Stale UDP conntrack
//! entries go after the rules, as in the other modes.

use std::time::Instant;

use super::context::NftContext;
use super::names::{NAT_PREROUTING, TABLE};
use super::ruleset::{DesiredState, Model};
use super::state::Written;
use super::transport::{NftTransport, context_of, family_keyword};
use crate::model::IpFamily;
use crate::proxier::conntrack::{ConntrackTable, UdpConntrackReconciler};
use crate::proxier::netfilter::ExecError;
use crate::proxier::{
    FamilyReport, FamilyState, Proxier, RestoreFailure, SyncError, SyncRequest, SyncStats,
};

pub const MODE: &str = "nftables";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{family} nftables transaction failed: {source}")]
    Transaction {
        family: IpFamily,
        #[source]
        source: ExecError,
    },
}

/// One family's table, as this proxier wrote it.
#[derive(Debug)]
struct FamilyTable {
    family: IpFamily,
    /// Empty when the next sync must be full: before the first, and after a failure or a
    /// flush (nobody knows then what the kernel holds).
    written: Written,
}

/// The nftables proxier for both families.
pub struct NftablesProxier {
    transport: Box<dyn NftTransport>,
    conntrack: UdpConntrackReconciler,
    families: Vec<FamilyTable>,
    /// The last transaction run, for logs and tests.
    last_script: String,
}

/// What one family's sync did.
#[derive(Debug, Default)]
struct FamilySync {
    written: usize,
    deleted: usize,
    /// The stale-chain deletion failed (`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`).
    cleanup_failed: bool,
}

impl NftablesProxier {
    /// A proxier whose first sync will be full.
    pub fn new(transport: Box<dyn NftTransport>, conntrack: Box<dyn ConntrackTable>) -> Self {
        Self {
            transport,
            conntrack: UdpConntrackReconciler::new(conntrack),
            families: Vec::new(),
            last_script: String::new(),
        }
    }

    /// The text of the last transaction run (the sync's own, after any stale-chain
    /// deletion).
    pub fn last_script(&self) -> &str {
        &self.last_script
    }

    /// The index of `family`'s table, created on first use.
    fn family_index(&mut self, family: IpFamily) -> usize {
        match self.families.iter().position(|f| f.family == family) {
            Some(index) => index,
            None => {
                self.families.push(FamilyTable {
                    family,
                    written: Written::default(),
                });
                self.families.len() - 1
            }
        }
    }

    fn sync_family(
        &mut self,
        state: &FamilyState,
        request: &SyncRequest<'_>,
    ) -> Result<FamilySync, (Error, RestoreFailure)> {
        let family = state.family;
        let ctx = NftContext::new(request.node, family, &state.service_cidrs);
        let now = Instant::now();
        let mut outcome = FamilySync::default();
        let index = self.family_index(family);
        let transport = &mut self.transport;
        let table = &mut self.families[index];

        if let Some(deletion) = table.written.stale_chain_deletion(&ctx, now) {
            match transport.run(&deletion) {
                Ok(()) => outcome.deleted += deletion.lines().count(),
                Err(err) => {
                    // The chains are empty already; the next full sync finds them in the
                    // listing and tries again.
                    tracing::warn!(%family, reason = %err, "could not delete stale nftables chains");
                    outcome.cleanup_failed = true;
                }
            }
        }

        let full = request.full || table.written.is_empty();
        let model = Model {
            services: &state.services,
            endpoints: &state.endpoints,
        };
        let (script, stats) = if full {
            let listed = match transport.list_chains(family) {
                Ok(chains) => Some(chains),
                Err(err) => {
                    tracing::warn!(%family, reason = %err, "could not list the nftables chains; rewriting every chain that may exist");
                    None
                }
            };
            let desired = DesiredState::build(model, &ctx);
            table.written.full(&desired, &ctx, listed.as_deref(), now)
        } else {
            table
                .written
                .partial_from_model(model, &ctx, request.changed, now)
        };
        tracing::debug!(
            %family,
            full,
            service_ports = state.services.len(),
            bytes = script.len(),
            "running the nftables transaction"
        );
        if let Err(source) = transport.run(&script) {
            match context_of(&source, &script) {
                Some(input) => {
                    tracing::error!(%family, reason = %source, %input, "nft transaction failed")
                }
                None => tracing::error!(%family, reason = %source, "nft transaction failed"),
            }
            // Nobody knows what the kernel holds now: the next sync rewrites it all.
            table.written.reset();
            self.last_script = script;
            return Err((
                Error::Transaction { family, source },
                RestoreFailure {
                    family,
                    partial: !full,
                },
            ));
        }
        self.last_script = script;
        outcome.written += stats.chains_written + stats.elements_added;
        outcome.deleted += stats.chains_flushed_stale + stats.elements_deleted;
        Ok(outcome)
    }

    /// Whether someone removed our table or emptied its dispatch (a firewall reload
    /// running `nft flush ruleset`, say) since the last sync of a family: its next sync is
    /// then full. Reads one small chain per family.
    pub fn check_flushed(&mut self) -> bool {
        let mut flushed = false;
        for table in &mut self.families {
            let family = table.family;
            if table.written.is_empty() {
                continue;
            }
            match self.transport.chain_has_rules(family, NAT_PREROUTING) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(%family, table = %format_args!("{} {TABLE}", family_keyword(family)), "the nftables table was flushed or deleted; a full sync will restore it");
                    table.written.reset();
                    flushed = true;
                }
                Err(err) => {
                    tracing::warn!(%family, reason = %err, "could not check the nftables table")
                }
            }
        }
        flushed
    }
}

impl Proxier for NftablesProxier {
    fn mode(&self) -> &'static str {
        MODE
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError> {
        let mut stats = SyncStats::default();
        for state in request.families {
            let outcome = self.sync_family(state, request).map_err(|(err, failure)| {
                SyncError::new(MODE, err).with_restore_failure(Some(failure))
            })?;
            let index = self.family_index(state.family);
            let (internal, external) = self.families[index].written.no_local_endpoints();
            stats.services += state.services.len();
            stats.written += outcome.written;
            stats.deleted += outcome.deleted;
            stats.no_local_endpoints_internal += internal;
            stats.no_local_endpoints_external += external;
            stats.per_family.push(FamilyReport {
                family: state.family,
                no_local_endpoints_internal: internal,
                no_local_endpoints_external: external,
                iptables_rules: Vec::new(),
                nftables_cleanup_failed: outcome.cleanup_failed,
            });
        }
        stats.conntrack_reconciles = self.conntrack.after_sync(request);
        Ok(stats)
    }

    fn needs_full_resync(&mut self) -> bool {
        self.check_flushed()
    }
}
