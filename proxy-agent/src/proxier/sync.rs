// SPDX-License-Identifier: Apache-2.0
//! What every mode shares: the facts about this node a sync needs, one sync's request and
//! report, and the [`Proxier`] trait each mode implements.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    time::Duration,
};

use ipnet::IpNet;

use crate::{
    model::{FamilyState, IpFamily, NamespacedName, StaleConntrack},
    node::{LocalDetector, NodeAddresses},
    proxier::ebpf::SocketSweepUnsupported as Unsupported,
};

/// Facts about this node and the settings every proxier shares.
#[derive(Clone, Debug, Default)]
pub struct NodeContext {
    pub name: String,
    /// The Node's labels (topology.kubernetes.io/zone for topology hints).
    pub labels: BTreeMap<String, String>,
    /// The node's primary IPs (--bind-address or the Node object).
    pub primary_ips: NodeAddresses,
    /// Every address on the host's interfaces.
    pub host_addresses: Vec<IpAddr>,
    /// nodePortAddresses resolved: the addresses NodePorts are served on, or `None` for
    /// "every local address".
    pub nodeport_addresses: Option<Vec<IpAddr>>,
    pub local_detector: LocalDetector,
    pub masquerade_all: bool,
    /// The fwmark bit iptables/ipvs use to mark packets for masquerading.
    pub masquerade_bit: u32,
    /// iptables.localhostNodePorts (iptables mode, IPv4).
    pub localhost_nodeports: bool,
    /// The families whose loopback address serves NodePorts in ebpf mode, which follows
    /// nftables mode: with the KubeProxyNFTablesLocalhostNodePorts gate on, where
    /// nodePortAddresses lists a loopback range explicitly (upstream's userspace proxy
    /// serves TCP there; the socket programs serve TCP and UDP).
    pub loopback_nodeport_families: Vec<IpFamily>,
    /// The KubeProxyNFTablesLocalhostNodePorts gate: loopback NodePorts of the other
    /// families are refused (ebpf mode, as nftables mode refuses them).
    pub loopback_nodeports_gate: bool,
}

impl NodeContext {
    /// NodePort addresses of one family (`None`: every local address of it).
    pub fn nodeport_addresses_of(&self, family: IpFamily) -> Option<Vec<IpAddr>> {
        self.nodeport_addresses.as_ref().map(|addrs| {
            addrs
                .iter()
                .filter(|a| family.contains(a))
                .copied()
                .collect()
        })
    }

    /// Whether NodePorts are served on `family`'s loopback address (ebpf mode).
    pub fn serves_loopback_nodeports(&self, family: IpFamily) -> bool {
        self.loopback_nodeport_families.contains(&family)
    }

    /// Whether NodePorts on `family`'s loopback addresses are refused (ebpf mode).
    pub fn rejects_loopback_nodeports(&self, family: IpFamily) -> bool {
        self.loopback_nodeports_gate && !self.serves_loopback_nodeports(family)
    }

    /// Whether `ip` is one of this node's addresses.
    pub fn is_node_address(&self, ip: &IpAddr) -> bool {
        self.host_addresses.contains(ip)
    }
}

/// The feature gate of upstream 1.37's localhost NodePorts in nftables mode.
pub const LOCALHOST_NODEPORTS_GATE: &str = "KubeProxyNFTablesLocalhostNodePorts";

/// [`NodeContext::loopback_nodeport_families`]: with the gate on, the families of which
/// nodePortAddresses lists a loopback range itself.
pub fn loopback_nodeport_families(
    gate_on: bool,
    addresses: &crate::config::NodePortAddresses,
) -> Vec<IpFamily> {
    if !gate_on {
        return Vec::new();
    }
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|family| addresses.lists_loopback_explicitly(*family == IpFamily::V6))
        .collect()
}

/// Resolves nodePortAddresses against the host's addresses: keywords `primary`, `localhost`,
/// `all` and CIDRs, as upstream's `NodePortAddresses`. An empty list means every address.
pub fn resolve_nodeport_addresses(
    cidrs: &[IpNet],
    include_primary: bool,
    primary: &NodeAddresses,
    host_addresses: &[IpAddr],
) -> Option<Vec<IpAddr>> {
    if cidrs.is_empty() && !include_primary {
        return None;
    }
    let mut out: Vec<IpAddr> = host_addresses
        .iter()
        .filter(|a| cidrs.iter().any(|c| c.contains(*a)))
        .copied()
        .collect();
    if include_primary {
        out.extend(primary.iter());
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// One sync.
#[derive(Clone, Copy, Debug)]
pub struct SyncRequest<'a> {
    pub families: &'a [FamilyState],
    pub node: &'a NodeContext,
    /// Rebuild everything and compare with the kernel's actual state (first sync, after a
    /// failure, periodically); otherwise only `changed` needs work.
    pub full: bool,
    /// Services whose ports or endpoints changed since the last successful sync.
    pub changed: &'a HashSet<NamespacedName>,
    pub stale: &'a StaleConntrack,
}

/// What a sync did, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Services (of all families) programmed.
    pub services: usize,
    /// Kernel objects written and deleted (map entries, rules, virtual servers).
    pub written: usize,
    pub deleted: usize,
    /// Services with a Local traffic policy and no local endpoint.
    pub no_local_endpoints_internal: usize,
    pub no_local_endpoints_external: usize,
    /// Services (distinct names) left out, in one family or all, because a map was full;
    /// the rest was programmed. They are retried at every sync.
    pub not_programmed: usize,
    /// The first few of them (`namespace/name`, sorted), for the log and the Node event.
    pub not_programmed_examples: Vec<String>,
    /// The maps that had no room for them.
    pub full_maps: Vec<FullMap>,
    /// Entries and capacity of each map the agent fills (ebpf mode).
    pub map_usage: Vec<MapUsage>,
    /// Maps grown before this sync's writes (ebpf mode).
    pub map_growth: Vec<MapGrowth>,
    /// The stale UDP conntrack reconciles this sync ran, per family (none when nothing
    /// called for one).
    pub conntrack_reconciles: Vec<ConntrackReconcile>,
    /// The sweep for connected UDP sockets whose backend went away (ebpf mode).
    pub connected_udp: SocketSweep,
    /// Each family's part, from the modes that sync the families apart (iptables, ipvs),
    /// for the metrics labelled by `ip_family`; empty from the others.
    pub per_family: Vec<FamilyReport>,
}

/// One family's part of a sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyReport {
    pub family: IpFamily,
    /// Services with a Local traffic policy and no local endpoint, in this family.
    pub no_local_endpoints_internal: usize,
    pub no_local_endpoints_external: usize,
    /// iptables mode: the rules of each table, for `kubeproxy_sync_proxy_rules_iptables_*`.
    pub iptables_rules: Vec<TableRules>,
    /// nftables mode: deleting the stale chains failed in this sync.
    pub nftables_cleanup_failed: bool,
}

/// Rules of one iptables table owned by the proxier (jump rules from the built-in chains
/// left out, as upstream leaves them out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRules {
    /// `filter` or `nat`.
    pub table: &'static str,
    /// Rules of ours in the kernel after the sync: those written plus those of the chains
    /// a partial sync left as they were.
    pub total: usize,
    /// Rules the sync wrote.
    pub last: usize,
}

/// One family's reconcile, for `kubeproxy_conntrack_reconciler_*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConntrackReconcile {
    pub family: IpFamily,
    pub took: Duration,
    pub deleted: usize,
}

/// How one sync's sweep went, for `kubeproxy_ebpf_udp_socket_*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SocketSweep {
    /// Whether this sync swept at all (it does when UDP services or endpoints changed, and
    /// at the first sync).
    pub swept: bool,
    /// Connected UDP sockets destroyed.
    pub terminated: usize,
    /// Namespaces not searched because entering them was refused (CAP_SYS_ADMIN).
    pub netns_unreachable: usize,
    /// What the kernel lacks, when that stopped the sweep.
    pub unsupported: Option<Unsupported>,
    /// Something else failed; the next sync sweeps again.
    pub failed: bool,
}

impl SocketSweep {
    /// The metric's `result` label.
    pub fn result(&self) -> &'static str {
        if self.unsupported.is_some() {
            "kernel_unsupported"
        } else if self.failed {
            "failed"
        } else if self.netns_unreachable > 0 {
            "netns_unreachable"
        } else {
            "complete"
        }
    }
}

/// A map that could not take every service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FullMap {
    /// The map's pinned name (e.g. `SVC4_V2`).
    pub map: &'static str,
    pub capacity: usize,
    /// The configuration field that sets its capacity (e.g. `ebpf.mapSizes.services`).
    pub setting: &'static str,
}

/// A map replaced by a bigger one holding the same entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapGrowth {
    /// The map's pinned name (e.g. `SVC4_V2`).
    pub map: &'static str,
    /// Capacity (max_entries) before and after.
    pub from: usize,
    pub to: usize,
    /// How long the growth took (every map grown in one step shares it).
    pub took: Duration,
}

/// How full one map is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapUsage {
    pub map: &'static str,
    /// Entries the agent keeps in it.
    pub entries: usize,
    pub capacity: usize,
}

/// A failed sync; the runner retries it with a full sync.
#[derive(Debug, thiserror::Error)]
#[error("{mode} sync failed: {source}")]
pub struct SyncError {
    pub mode: &'static str,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    /// The rules transaction that failed, when that is what failed: an iptables-restore
    /// (iptables and ipvs modes; `kubeproxy_sync_proxy_rules_iptables_*restore_failures_total`)
    /// or an `nft -f` (nftables mode; `..._nftables_sync_failures_total`).
    pub restore_failed: Option<RestoreFailure>,
}

/// A failed iptables-restore or nft transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreFailure {
    pub family: IpFamily,
    /// It wrote a partial sync's rules (upstream then falls back to a full sync, as we do).
    pub partial: bool,
}

impl SyncError {
    pub fn new(mode: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            mode,
            source: Box::new(source),
            restore_failed: None,
        }
    }

    /// Records that an iptables-restore is what failed.
    pub fn with_restore_failure(mut self, failure: Option<RestoreFailure>) -> Self {
        self.restore_failed = failure;
        self
    }
}

/// A dataplane: turns the model into kernel state.
pub trait Proxier: Send {
    /// The mode name (`ebpf`, `iptables`, `ipvs`, `nftables`).
    fn mode(&self) -> &'static str;

    /// Brings the kernel in line with the model. Must leave the dataplane consistent
    /// whatever happens: a failure part-way is repaired by the next (full) sync.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError>;

    /// What follows a successful sync once it is reported (its duration and timestamp
    /// recorded): work the dataplane does not wait for. `request` is the sync's own. The
    /// agent calls it right after each successful sync; a mode must still be right when
    /// it is not called (its next sync then does that work itself).
    fn after_sync(&mut self, _request: &SyncRequest<'_>) {}

    /// Periodic housekeeping between syncs (new devices, expired state).
    fn maintain(&mut self) {}

    /// Whether the kernel state was wiped by someone else since the last sync (a firewall
    /// reload flushing iptables, say), so that the next sync must be full. The agent calls
    /// it periodically; modes that cannot tell return false.
    fn needs_full_resync(&mut self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeport_addresses_resolution() {
        let host: Vec<IpAddr> = ["127.0.0.1", "192.168.0.2", "192.168.1.2", "fd00::2"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let primary = NodeAddresses {
            v4: Some("192.168.0.2".parse().unwrap()),
            v6: None,
        };
        assert_eq!(
            resolve_nodeport_addresses(&[], false, &primary, &host),
            None
        );
        let only_primary = resolve_nodeport_addresses(&[], true, &primary, &host).unwrap();
        assert_eq!(only_primary, vec!["192.168.0.2".parse::<IpAddr>().unwrap()]);
        let cidr: IpNet = "192.168.1.0/24".parse().unwrap();
        let some = resolve_nodeport_addresses(&[cidr], false, &primary, &host).unwrap();
        assert_eq!(some, vec!["192.168.1.2".parse::<IpAddr>().unwrap()]);
        let ctx = NodeContext {
            nodeport_addresses: Some(host.clone()),
            ..Default::default()
        };
        assert_eq!(ctx.nodeport_addresses_of(IpFamily::V6).unwrap().len(), 1);
    }
}
