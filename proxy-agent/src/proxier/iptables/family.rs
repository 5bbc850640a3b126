// SPDX-License-Identifier: Apache-2.0
//! One family's proxier (upstream runs one per family behind a meta-proxier): generates,
//! completes the input with what only the kernel can tell (missing jump rules, stale
//! chains), restores it, and watches for flushes.

use std::collections::HashSet;
use std::fmt::Write;
use std::time::{Duration, Instant};

use super::Error;
use super::jumps::{FLUSH_WITNESSES, JUMPS, LOCALNET_JUMPS};
use super::names::is_service_chain;
use super::rules::{
    self, FamilyContext, Generated, Model, Probabilities, RestoreBuffers, RuleCache, RuleOptions,
    Scope,
};
use crate::model::{IpFamily, NamespacedName};
use crate::proxier::netfilter::cleanup::TableError;
use crate::proxier::netfilter::exec::lines_around;
use crate::proxier::netfilter::jumps::write_missing_jumps;
use crate::proxier::netfilter::names::KUBE_PROXY_CANARY;
use crate::proxier::netfilter::{ExecError, IptablesBackend, Jump, Table, save};
use crate::proxier::{FamilyState, NodeContext, TableRules};

/// What one family's sync did.
#[derive(Debug, Default)]
pub struct FamilySync {
    pub generated: Generated,
    /// Rule lines written (including jump rules inserted).
    pub written: usize,
    /// Stale chains deleted.
    pub deleted: usize,
    /// Rules of our chains, by table, as the sync left the kernel, and as it wrote them.
    pub rules: Vec<TableRules>,
}

#[derive(Debug)]
pub struct FamilyProxier {
    pub family: IpFamily,
    needs_full: bool,
    synced: bool,
    cache: RuleCache,
    probabilities: Probabilities,
    buffers: RestoreBuffers,
    input: String,
    last_stale_scan: Option<Instant>,
}

impl FamilyProxier {
    pub fn new(family: IpFamily) -> Self {
        Self {
            family,
            needs_full: true,
            synced: false,
            cache: RuleCache::default(),
            probabilities: Probabilities::default(),
            buffers: RestoreBuffers::default(),
            input: String::new(),
            last_stale_scan: None,
        }
    }

    /// Whether a sync asked to be `full` or not will rewrite everything (after a failure
    /// or a flush it does, whatever was asked).
    pub fn syncs_fully(&self, full: bool) -> bool {
        full || self.needs_full
    }

    /// The restore input of the last sync.
    pub fn last_input(&self) -> &str {
        &self.input
    }

    #[expect(clippy::too_many_arguments, reason = "the sync's inputs, all distinct")]
    pub fn sync(
        &mut self,
        backend: &mut dyn IptablesBackend,
        state: &FamilyState,
        node: &NodeContext,
        options: RuleOptions,
        sync_period: Duration,
        full: bool,
        changed: &HashSet<NamespacedName>,
    ) -> Result<FamilySync, Error> {
        let full = full || self.needs_full;
        // Stays set unless this sync succeeds: the cache is updated as rules are
        // generated, so after a failure only a full sync is trustworthy.
        self.needs_full = true;
        let ctx = FamilyContext::new(node, self.family, options);
        let scope = if full {
            Scope::Full
        } else {
            Scope::Partial(changed)
        };
        let model = Model {
            services: &state.services,
            endpoints: &state.endpoints,
        };
        let generated = rules::generate(
            model,
            &ctx,
            scope,
            &mut self.cache,
            &mut self.probabilities,
            &mut self.buffers,
        );
        let mut outcome = FamilySync::default();
        // Counted before the jumps from the built-in chains and the chain deletions are
        // added: the rules in our chains.
        let (filter_rules, nat_rules) = self.buffers.rule_lines_by_table();
        outcome.rules = vec![
            TableRules {
                table: Table::Filter.as_str(),
                total: filter_rules,
                last: filter_rules,
            },
            TableRules {
                table: Table::Nat.as_str(),
                total: nat_rules + generated.kept_nat_rules,
                last: nat_rules,
            },
        ];
        // A new String rather than `clear()`: after a full sync at 10,000 services the old
        // one holds ~13 MB of capacity that every later (mostly small, partial) sync would
        // keep; `assemble` reserves what this sync needs.
        self.input = String::new();
        if full {
            let (deleted, saved_nat) =
                self.delete_stale_kernel_chains(backend, &generated, sync_period);
            outcome.deleted = deleted;
            self.add_missing_jumps(backend, &ctx, saved_nat.as_deref())?;
            // The canary tells a later check that nobody deleted our chains.
            let _ = writeln!(self.buffers.filter_chains, ":{KUBE_PROXY_CANARY} - [0:0]");
            let _ = writeln!(self.buffers.nat_chains, ":{KUBE_PROXY_CANARY} - [0:0]");
            let _ = writeln!(self.input, "*mangle\n:{KUBE_PROXY_CANARY} - [0:0]\nCOMMIT");
        } else {
            outcome.deleted = self
                .buffers
                .delete_chains(generated.stale_chains.iter().map(ToString::to_string));
        }
        outcome.written = self.buffers.rule_lines() - outcome.deleted;
        self.buffers.assemble(&mut self.input);
        // The buffers' text is now in `input`: give their capacity back rather than keep a
        // second copy of the rules (~20 MB at 10,000 services, the size of the largest
        // sync ever made) for the agent's lifetime. Re-growing them costs a few
        // reallocations per sync, nothing next to iptables-restore reading the text.
        self.buffers = RestoreBuffers::default();

        tracing::debug!(
            family = %self.family,
            full,
            service_ports = generated.service_ports,
            endpoints = generated.endpoints,
            large_cluster = generated.large_cluster,
            bytes = self.input.len(),
            "restoring iptables rules"
        );
        if let Err(err) = backend.restore(self.family, &self.input) {
            if let ExecError::Failed {
                line: Some(line), ..
            } = &err
            {
                tracing::error!(family = %self.family, reason = %err, input = %lines_around(&self.input, *line, 3), "iptables-restore failed");
            } else {
                tracing::error!(family = %self.family, reason = %err, "iptables-restore failed");
            }
            return Err(TableError::Restore {
                family: self.family,
                source: err,
            }
            .into());
        }
        self.needs_full = false;
        self.synced = true;
        outcome.generated = generated;
        Ok(outcome)
    }

    /// Per-service chains in the kernel that no service owns any more (from before a
    /// restart, or left by a failed sync). Listing the nat table is slow on big hosts, so
    /// in large clusters it happens at most once per sync period, as upstream does.
    /// Returns how many chains it deletes, and the nat table as saved when it was listed.
    fn delete_stale_kernel_chains(
        &mut self,
        backend: &mut dyn IptablesBackend,
        generated: &Generated,
        sync_period: Duration,
    ) -> (usize, Option<String>) {
        let due = !generated.large_cluster
            || self
                .last_stale_scan
                .is_none_or(|at| at.elapsed() > sync_period);
        if !due {
            return (0, None);
        }
        let saved = match backend.save(self.family, Table::Nat) {
            Ok(saved) => saved,
            Err(err) => {
                tracing::error!(family = %self.family, reason = %err, "iptables-save failed: stale chains will not be deleted");
                return (0, None);
            }
        };
        self.last_stale_scan = Some(Instant::now());
        let active: HashSet<String> = self.cache.all_chains().map(ToString::to_string).collect();
        let stale: Vec<&str> = save::declared_chains(&saved)
            .filter(|chain| is_service_chain(chain) && !active.contains(*chain))
            .collect();
        let deleted = self.buffers.delete_chains(stale);
        (deleted, Some(saved))
    }

    /// Inserts, at the top of the built-in chains, the jumps to our chains that are not
    /// there (first sync, or someone flushed). Returns how many. `saved_nat`: the nat table
    /// as this sync saved it, read instead of listing its chains again.
    fn add_missing_jumps(
        &mut self,
        backend: &mut dyn IptablesBackend,
        ctx: &FamilyContext<'_>,
        saved_nat: Option<&str>,
    ) -> Result<usize, Error> {
        let jumps: Vec<&Jump> = if ctx.localhost_nodeports {
            JUMPS.iter().chain(LOCALNET_JUMPS).collect()
        } else {
            JUMPS.iter().collect()
        };
        let buffers = &mut self.buffers;
        write_missing_jumps(
            backend,
            self.family,
            jumps,
            saved_nat.map(|text| (Table::Nat, text)),
            &mut buffers.nat_rules,
            &mut buffers.filter_rules,
        )
        .map_err(|source| {
            TableError::List {
                family: self.family,
                source,
            }
            .into()
        })
    }

    /// Whether someone removed our rules since the last sync: the canary chain is gone
    /// from a table (chains deleted, as a firewall reload does) or a jump from a built-in
    /// chain is (rules flushed). A family never synced has nothing to lose.
    pub fn check_flushed(&mut self, backend: &mut dyn IptablesBackend) -> bool {
        if !self.synced {
            return false;
        }
        let flushed = self.probe_flushed(backend);
        match flushed {
            Ok(None) => false,
            Ok(Some(what)) => {
                tracing::info!(family = %self.family, what, "iptables rules were flushed; a full sync will restore them");
                self.needs_full = true;
                true
            }
            Err(err) => {
                // Not knowing is not a flush: the next check may succeed.
                tracing::warn!(family = %self.family, reason = %err, "could not check the iptables canary");
                false
            }
        }
    }

    fn probe_flushed(
        &self,
        backend: &mut dyn IptablesBackend,
    ) -> Result<Option<&'static str>, ExecError> {
        for table in [Table::Mangle, Table::Nat, Table::Filter] {
            if backend
                .list_chain(self.family, table, KUBE_PROXY_CANARY)?
                .is_none()
            {
                return Ok(Some("canary chain deleted"));
            }
        }
        for jump in FLUSH_WITNESSES {
            let rules = backend
                .list_chain(self.family, jump.table, jump.from)?
                .unwrap_or_default();
            if !rules.lines().any(|line| jump.matches(line)) {
                return Ok(Some("jump rule missing"));
            }
        }
        Ok(None)
    }
}
