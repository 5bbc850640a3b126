// SPDX-License-Identifier: Apache-2.0
//! Removes everything this mode installs, in both families: the rules that jump to our
//! chains (from the built-in chains or anywhere else), then the chains themselves. Used by
//! `--cleanup` and when switching modes. It works from what the kernel has, not from what
//! this process remembers, so it also removes what an earlier run (or kube-proxy itself)
//! left; running it twice is harmless.

use super::Error;
use super::names::is_service_chain;
use crate::model::IpFamily;
use crate::proxier::netfilter::IptablesBackend;
use crate::proxier::netfilter::Table;
use crate::proxier::netfilter::cleanup::{CleanupReport, cleanup_chains_with};
use crate::proxier::netfilter::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};

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

/// Removes this mode's rules and chains from `families`, table by table. Every table is
/// attempted; the first error is returned after the others were tried.
pub fn cleanup_with(
    backend: &mut dyn IptablesBackend,
    families: &[IpFamily],
) -> Result<CleanupReport, Error> {
    Ok(cleanup_chains_with(backend, families, ours)?)
}
