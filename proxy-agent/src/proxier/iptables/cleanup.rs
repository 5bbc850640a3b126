// SPDX-License-Identifier: Apache-2.0
//! Removes everything this mode installs, in both families: the rules that jump to our
//! chains (from the built-in chains or anywhere else), then the chains themselves. Used by
//! `--cleanup` and when switching modes. It works from what the kernel has, not from what
//! this process remembers, so it also removes what an earlier run (or kube-proxy itself)
//! left; running it twice is harmless.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::Error;
use super::exec::IptablesBackend;
use super::family::chains_in_save;
use super::jumps::{Table, jump_target};
use super::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_PROXY_FIREWALL, KUBE_SERVICES, is_service_chain,
};
use crate::model::IpFamily;

/// Our fixed chains, per table.
fn fixed_chains(table: Table) -> &'static [&'static str] {
    match table {
        Table::Nat => &[
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
            KUBE_PROXY_CANARY,
        ],
        Table::Filter => &[
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_FORWARD,
            KUBE_NODEPORTS,
            KUBE_PROXY_FIREWALL,
            KUBE_PROXY_CANARY,
            KUBE_FIREWALL,
        ],
        Table::Mangle => &[KUBE_PROXY_CANARY],
    }
}

/// Every chain of this mode.
pub fn ours(table: Table, chain: &str) -> bool {
    fixed_chains(table).contains(&chain) || (table == Table::Nat && is_service_chain(chain))
}

/// The chains only this mode has: what goes when the ipvs mode, which shares the other
/// chain names, takes over (it rewrites the shared ones itself).
pub fn iptables_only(table: Table, chain: &str) -> bool {
    match table {
        Table::Nat => {
            [KUBE_NODEPORTS, KUBE_PROXY_CANARY].contains(&chain) || is_service_chain(chain)
        }
        Table::Filter => [
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_NODEPORTS,
            KUBE_PROXY_CANARY,
            KUBE_FIREWALL,
        ]
        .contains(&chain),
        Table::Mangle => chain == KUBE_PROXY_CANARY,
    }
}

/// Which chains a cleanup removes.
pub type ChainFilter = fn(Table, &str) -> bool;

/// What a cleanup removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub chains_deleted: usize,
    pub rules_deleted: usize,
}

/// The restore input that removes our chains and every rule jumping to them from
/// `saved` (one table's `iptables-save` output); `None` when there is nothing of ours.
pub fn cleanup_input(table: Table, saved: &str, report: &mut CleanupReport) -> Option<String> {
    cleanup_input_of(table, saved, report, ours)
}

/// [`cleanup_input`] for the chains `which` selects.
pub fn cleanup_input_of(
    table: Table,
    saved: &str,
    report: &mut CleanupReport,
    which: ChainFilter,
) -> Option<String> {
    let chains: BTreeSet<&str> = chains_in_save(saved)
        .filter(|chain| which(table, chain))
        .collect();
    if chains.is_empty() {
        return None;
    }
    let mut input = format!("*{table}\n");
    // Rules in other chains that jump to ours must go first, or the chains cannot be
    // deleted. Ours are flushed by their chain lines.
    for line in saved.lines() {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let Some((chain, _)) = rule.split_once(' ') else {
            continue;
        };
        if chains.contains(chain) {
            continue;
        }
        if jump_target(rule).is_some_and(|target| chains.contains(target)) {
            let _ = writeln!(input, "-D {rule}");
            report.rules_deleted += 1;
        }
    }
    for chain in &chains {
        let _ = writeln!(input, ":{chain} - [0:0]");
    }
    for chain in &chains {
        let _ = writeln!(input, "-X {chain}");
    }
    input.push_str("COMMIT\n");
    report.chains_deleted += chains.len();
    Some(input)
}

/// Removes this mode's rules and chains from `families`, table by table. Every table is
/// attempted; the first error is returned after the others were tried.
pub fn cleanup_with(
    backend: &mut dyn IptablesBackend,
    families: &[IpFamily],
) -> Result<CleanupReport, Error> {
    cleanup_chains_with(backend, families, ours)
}

/// Removes the chains `which` selects (and the rules jumping to them) from `families`.
pub fn cleanup_chains_with(
    backend: &mut dyn IptablesBackend,
    families: &[IpFamily],
    which: ChainFilter,
) -> Result<CleanupReport, Error> {
    let mut report = CleanupReport::default();
    let mut first_error = None;
    for &family in families {
        for table in [Table::Filter, Table::Nat, Table::Mangle] {
            let result = backend
                .save(family, table)
                .map_err(|source| Error::List { family, source })
                .and_then(
                    |saved| match cleanup_input_of(table, &saved, &mut report, which) {
                        Some(input) => backend
                            .restore(family, &input)
                            .map_err(|source| Error::Restore { family, source }),
                        None => Ok(()),
                    },
                );
            if let Err(err) = result {
                tracing::error!(%family, %table, reason = %err, "iptables cleanup failed");
                first_error.get_or_insert(err);
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => {
            tracing::info!(
                chains = report.chains_deleted,
                rules = report.rules_deleted,
                "removed the iptables mode's rules"
            );
            Ok(report)
        }
    }
}
