// SPDX-License-Identifier: Apache-2.0
//! Removes a selection of chains, and every rule jumping to them, from what the kernel
//! has (so also what an earlier run or kube-proxy left): the iptables mode's cleanup, the
//! ipvs mode's, and the iptables chains ipvs mode does not share when it takes over.
//! Running it twice is harmless.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::exec::{ExecError, IptablesBackend};
use super::save;
use super::table::Table;
use crate::model::IpFamily;

/// A restore or a listing of one family's tables that failed: the iptables and ipvs
/// proxiers and the chain cleanup report these alike.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("iptables-restore ({family}) failed: {source}")]
    Restore {
        family: IpFamily,
        #[source]
        source: ExecError,
    },
    #[error("listing iptables rules ({family}) failed: {source}")]
    List {
        family: IpFamily,
        #[source]
        source: ExecError,
    },
}

/// Which chains a cleanup removes.
pub type ChainFilter = fn(Table, &str) -> bool;

/// What a cleanup removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub chains_deleted: usize,
    pub rules_deleted: usize,
}

/// The restore input that removes the chains `which` selects and every rule jumping to
/// them from `saved` (one table's `iptables-save` output); `None` when it has none of them.
pub fn cleanup_input_of(
    table: Table,
    saved: &str,
    report: &mut CleanupReport,
    which: ChainFilter,
) -> Option<String> {
    let chains: BTreeSet<&str> = save::declared_chains(saved)
        .filter(|chain| which(table, chain))
        .collect();
    if chains.is_empty() {
        return None;
    }
    let mut input = format!("*{table}\n");
    // Rules in other chains that jump to ours must go first, or the chains cannot be
    // deleted. Ours are flushed by their chain lines.
    for rule in save::appended_rules(saved) {
        if chains.contains(rule.chain) {
            continue;
        }
        if rule
            .target()
            .is_some_and(|target| chains.contains(target.as_ref()))
        {
            let _ = writeln!(input, "-D {} {}", rule.chain, rule.spec);
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

/// Removes the chains `which` selects (and the rules jumping to them) from `families`,
/// table by table. Every table is attempted; the first error is returned after the others
/// were tried.
pub fn cleanup_chains_with(
    backend: &mut dyn IptablesBackend,
    families: &[IpFamily],
    which: ChainFilter,
) -> Result<CleanupReport, TableError> {
    let mut report = CleanupReport::default();
    let mut first_error = None;
    for &family in families {
        for table in [Table::Filter, Table::Nat, Table::Mangle] {
            let result = backend
                .save(family, table)
                .map_err(|source| TableError::List { family, source })
                .and_then(
                    |saved| match cleanup_input_of(table, &saved, &mut report, which) {
                        Some(input) => backend
                            .restore(family, &input)
                            .map_err(|source| TableError::Restore { family, source }),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kube_chains(_: Table, chain: &str) -> bool {
        chain.starts_with("KUBE-")
    }

    #[test]
    fn jumps_to_selected_chains_go_before_the_chains() {
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:OTHER - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A PREROUTING -j OTHER\n-A KUBE-SERVICES -j KUBE-SVC-A\n-A OTHER -m comment --comment \"-j KUBE-SERVICES in a comment\" -j ACCEPT\nCOMMIT\n";
        let mut report = CleanupReport::default();
        let input = cleanup_input_of(Table::Nat, saved, &mut report, kube_chains).unwrap();
        assert_eq!(
            input,
            "*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n-X KUBE-SERVICES\n-X KUBE-SVC-A\nCOMMIT\n"
        );
        assert_eq!(
            report,
            CleanupReport {
                chains_deleted: 2,
                rules_deleted: 1
            }
        );
        let none = "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n";
        assert!(cleanup_input_of(Table::Nat, none, &mut report, kube_chains).is_none());
    }
}
