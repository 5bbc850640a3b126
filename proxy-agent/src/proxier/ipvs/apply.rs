// SPDX-License-Identifier: Apache-2.0
//! Apply: brings the IPVS table and kube-ipvs0's addresses in line with the desired state
//! by diffing against what the kernel lists. A full sync considers every virtual server
//! of the synced families; a partial one only those of the changed services (their old
//! and new keys). Virtual servers inside ipvs.excludeCIDRs belong to someone else and
//! are never deleted. Removed real servers drain ([`super::graceful`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::desired::{DesiredService, RealServer, ServiceKey};
use super::genl::RealServerStatus;
use super::graceful::{Draining, drained, drains};
use super::kernel::{DummyAddresses, IpvsTable};
use crate::model::IpFamily;
use crate::proxier::netlink::NetlinkError;

/// The weight of a serving real server.
pub const WEIGHT: u32 = 1;

/// Kernel objects written and deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub written: usize,
    pub deleted: usize,
}

pub fn excluded(ip: &IpAddr, exclude: &[IpNet]) -> bool {
    exclude.iter().any(|net| net.contains(ip))
}

/// The IPVS side of one sync.
pub struct ServiceApply<'a> {
    pub table: &'a mut dyn IpvsTable,
    pub draining: &'a mut Draining,
    pub exclude: &'a [IpNet],
    /// The families this sync covers; virtual servers of others are left alone.
    pub families: &'a [IpFamily],
    pub counts: Counts,
}

impl ServiceApply<'_> {
    /// Applies `desired`; `scope` limits the work to these keys (partial syncs).
    pub fn apply(
        &mut self,
        desired: &BTreeMap<ServiceKey, &DesiredService>,
        scope: Option<&BTreeSet<ServiceKey>>,
    ) -> Result<(), NetlinkError> {
        let kernel: BTreeMap<ServiceKey, _> = self
            .table
            .services()?
            .into_iter()
            .map(|vs| (vs.key, vs))
            .collect();
        let keys: BTreeSet<ServiceKey> = match scope {
            Some(keys) => keys.clone(),
            None => desired.keys().chain(kernel.keys()).copied().collect(),
        };
        let mut handled = BTreeSet::new();
        for key in keys {
            match (desired.get(&key), kernel.get(&key)) {
                (Some(want), None) => {
                    match self.table.add_service(&want.server) {
                        Err(err) if err.errno() == Some(nix::errno::Errno::EEXIST) => {
                            self.table.edit_service(&want.server)?
                        }
                        other => other?,
                    }
                    self.counts.written += 1;
                    self.sync_dests(&key, want, Vec::new())?;
                }
                (Some(want), Some(have)) => {
                    if have.scheduler != want.server.scheduler
                        || have.persistence_timeout != want.server.persistence_timeout
                    {
                        self.table.edit_service(&want.server)?;
                        self.counts.written += 1;
                    }
                    let actual = self.table.dests(&key)?;
                    self.sync_dests(&key, want, actual)?;
                }
                (None, Some(_)) => {
                    if !self.families.contains(&IpFamily::of(&key.addr))
                        || excluded(&key.addr, self.exclude)
                    {
                        continue;
                    }
                    match self.table.delete_service(&key) {
                        Err(err) if err.errno() != Some(nix::errno::Errno::ESRCH) => {
                            return Err(err);
                        }
                        _ => {}
                    }
                    self.draining.forget_service(&key);
                    self.counts.deleted += 1;
                }
                (None, None) => {}
            }
            handled.insert(key);
        }
        self.check_draining(&handled)
    }

    fn sync_dests(
        &mut self,
        key: &ServiceKey,
        want: &DesiredService,
        actual: Vec<RealServerStatus>,
    ) -> Result<(), NetlinkError> {
        let actual: BTreeMap<RealServer, RealServerStatus> =
            actual.into_iter().map(|s| (s.server, s)).collect();
        for rs in &want.real_servers {
            match actual.get(rs) {
                None => {
                    self.table.add_dest(key, rs, WEIGHT)?;
                    self.counts.written += 1;
                }
                Some(status) if status.weight != WEIGHT || !status.masquerading => {
                    // Draining and wanted again, or changed by someone else.
                    self.table.edit_dest(key, rs, WEIGHT)?;
                    self.counts.written += 1;
                }
                Some(_) => {}
            }
            self.draining.stop(key, rs);
        }
        for (rs, status) in &actual {
            if want.real_servers.contains(rs) {
                continue;
            }
            self.retire(key, status)?;
        }
        Ok(())
    }

    /// A real server that is no longer wanted: deleted when it carries nothing (or is
    /// UDP), otherwise set to weight 0 and left to drain.
    fn retire(&mut self, key: &ServiceKey, status: &RealServerStatus) -> Result<(), NetlinkError> {
        let rs = status.server;
        if !drains(key.protocol) || drained(status) {
            match self.table.delete_dest(key, &rs) {
                Err(err) if err.errno() != Some(nix::errno::Errno::ENOENT) => return Err(err),
                _ => {}
            }
            self.draining.stop(key, &rs);
            self.counts.deleted += 1;
        } else {
            if status.weight != 0 {
                self.table.edit_dest(key, &rs, 0)?;
                self.counts.written += 1;
                tracing::debug!(service = %key, real_server = %rs, active = status.active_connections, inactive = status.inactive_connections, "draining real server");
            }
            self.draining.start(*key, rs);
        }
        Ok(())
    }

    /// Deletes draining real servers whose connections are gone, for the virtual servers
    /// this sync did not look at.
    pub fn check_draining(&mut self, handled: &BTreeSet<ServiceKey>) -> Result<(), NetlinkError> {
        for key in self.draining.services() {
            if handled.contains(&key) {
                continue;
            }
            let actual = match self.table.dests(&key) {
                Ok(actual) => actual,
                Err(err) if err.errno() == Some(nix::errno::Errno::ESRCH) => {
                    self.draining.forget_service(&key);
                    continue;
                }
                Err(err) => return Err(err),
            };
            let listed: BTreeSet<RealServer> = actual.iter().map(|s| s.server).collect();
            for status in &actual {
                if self.draining.contains(&key, &status.server) && drained(status) {
                    self.retire(&key, status)?;
                }
            }
            // Servers deleted by someone else.
            let gone: Vec<RealServer> = self
                .draining
                .servers_of(&key)
                .into_iter()
                .filter(|rs| !listed.contains(rs))
                .collect();
            for rs in gone {
                self.draining.stop(&key, &rs);
            }
        }
        Ok(())
    }
}

/// Makes kube-ipvs0 hold exactly `desired` (addresses of other families untouched).
pub fn apply_addresses(
    dummy: &mut dyn DummyAddresses,
    desired: &BTreeSet<IpAddr>,
    families: &[IpFamily],
    counts: &mut Counts,
) -> Result<(), NetlinkError> {
    let index = dummy.ensure_link()?;
    let current: BTreeSet<IpAddr> = dummy.addresses(index)?.into_iter().collect();
    for ip in desired.difference(&current) {
        dummy.add_address(index, ip)?;
        counts.written += 1;
    }
    for ip in current.difference(desired) {
        if families.contains(&IpFamily::of(ip)) {
            dummy.delete_address(index, ip)?;
            counts.deleted += 1;
        }
    }
    Ok(())
}
