// SPDX-License-Identifier: Apache-2.0
//! Removes what the ipvs mode installs, from what the kernel has (so also what an earlier
//! run or kube-proxy left): its iptables chains and the rules jumping to them (first:
//! they refer to the sets), its ipsets, the kube-ipvs0 interface, and the virtual servers
//! outside ipvs.excludeCIDRs. Used by `--cleanup` and when another mode starts; running
//! it twice is harmless.

use std::path::Path;

use ipnet::IpNet;

use super::apply::excluded;
use super::genl::IpvsSocket;
use super::ipset::{IpsetBackend, IpsetCommand, our_sets, parse_save};
use super::kernel::DUMMY_DEVICE;
use super::rules::{ipvs_chain, ipvs_only_chain};
use super::{Error, Result};
use crate::model::IpFamily;
use crate::proxier::netfilter::cleanup::cleanup_chains_with;
use crate::proxier::netfilter::save::declared_chains;
use crate::proxier::netfilter::{CommandBackend, IptablesBackend, Table};
use crate::proxier::netlink::route::RouteSocket;

/// What a cleanup removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub chains: usize,
    pub rules: usize,
    pub sets: usize,
    pub link: bool,
    pub virtual_servers: usize,
}

impl CleanupReport {
    pub fn total(&self) -> usize {
        self.chains + self.rules + self.sets + usize::from(self.link) + self.virtual_servers
    }
}

/// Whether the IPVS module is loaded in this network namespace (cleanup must not load
/// it just to find nothing).
fn ipvs_loaded() -> bool {
    Path::new("/proc/net/ip_vs").exists()
}

/// Whether anything of the ipvs mode is here: its own chains, its sets or kube-ipvs0.
pub fn leftovers_present(iptables: Option<&mut CommandBackend>) -> bool {
    if let Some(backend) = iptables {
        for family in [IpFamily::V4, IpFamily::V6] {
            for table in [Table::Nat, Table::Filter] {
                if let Ok(saved) = backend.save(family, table)
                    && declared_chains(&saved).any(|c| ipvs_only_chain(table, c))
                {
                    return true;
                }
            }
        }
    }
    if let Ok(saved) = IpsetCommand.save()
        && !our_sets(&parse_save(&saved)).is_empty()
    {
        return true;
    }
    RouteSocket::open()
        .and_then(|mut route| route.link_index(DUMMY_DEVICE))
        .is_ok_and(|index| index.is_some())
}

/// Removes everything (see the module documentation). `only_if_present`: do nothing
/// unless the mode left something (another mode starting on a node that never ran ipvs
/// must not flush IPVS services someone else owns). Every part is attempted; the first
/// error is returned after the others ran.
pub fn cleanup(exclude: &[IpNet], only_if_present: bool) -> Result<CleanupReport> {
    let mut iptables = CommandBackend::detect().ok();
    if only_if_present && !leftovers_present(iptables.as_mut()) {
        return Ok(CleanupReport::default());
    }
    let mut report = CleanupReport::default();
    let mut first_error: Option<Error> = None;

    if let Some(backend) = iptables.as_mut() {
        match cleanup_chains_with(backend, &[IpFamily::V4, IpFamily::V6], ipvs_chain) {
            Ok(r) => {
                report.chains += r.chains_deleted;
                report.rules += r.rules_deleted;
            }
            Err(err) => {
                tracing::warn!(reason = %err, "ipvs mode's iptables chains not all removed")
            }
        }
    }

    let sets = IpsetCommand
        .save()
        .map(|saved| our_sets(&parse_save(&saved)));
    match sets {
        Ok(names) if !names.is_empty() => {
            let input: String = names.iter().map(|n| format!("destroy {n}\n")).collect();
            match IpsetCommand.restore(&input) {
                Ok(()) => report.sets += names.len(),
                Err(err) => {
                    first_error.get_or_insert(err.into());
                }
            }
        }
        Ok(_) => {}
        // No ipset binary, or no ipset support in the kernel: there can be no sets of
        // ours either.
        Err(err) if err.not_installed() || err.failed() => {
            tracing::debug!(reason = %err, "no ipsets to clean up");
        }
        Err(err) => {
            first_error.get_or_insert(err.into());
        }
    }

    match RouteSocket::open().and_then(|mut route| route.delete_link(DUMMY_DEVICE)) {
        Ok(deleted) => report.link = deleted,
        Err(err) => {
            first_error.get_or_insert(err.into());
        }
    }

    if ipvs_loaded() {
        let result = IpvsSocket::open().and_then(|mut ipvs| {
            let mut deleted = 0;
            for server in ipvs.services()? {
                if excluded(&server.key.addr, exclude) {
                    continue;
                }
                ipvs.delete_service(&server.key)?;
                deleted += 1;
            }
            Ok(deleted)
        });
        match result {
            Ok(n) => report.virtual_servers = n,
            Err(err) => {
                first_error.get_or_insert(err.into());
            }
        }
    }

    match first_error {
        Some(err) => Err(err),
        None => {
            tracing::info!(?report, "removed the ipvs mode's leftovers");
            Ok(report)
        }
    }
}
