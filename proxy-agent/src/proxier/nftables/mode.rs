// SPDX-License-Identifier: Apache-2.0
//! The nftables mode's registration: whether it can run here, how it starts, what it
//! leaves, and the operator tools on its live tables. It falls back to iptables.
//!
//! It can run where `nft` 1.0.1 or later is on PATH (older ones parse the whole ruleset,
//! other tables included, and may fail on what other software wrote: upstream's knftables
//! requires it too) and the kernel takes our fixed ruleset: the probe is a dry run
//! (`nft --check`) of the base chains, maps and sets and of one service, which needs every
//! nf_tables feature the rules use (verdict maps, concatenated keys, `fib`, `numgen`, NAT
//! chains, DNAT to an address and port looked up in a map).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use super::context::NftContext;
use super::names::TABLE;
use super::ruleset::DesiredState;
use super::transport::{NftCommand, family_keyword, nft};
use super::{NftablesProxier, trace};
use crate::proxier::netfilter::exec::tool_version;
use crate::{
    config::ProxyMode,
    inspect::Subject,
    model::{Endpoint, IpFamily, NamespacedName, Protocol, ServicePort, ServicePortName},
    proxier::{
        CleanupReport, CleanupScope, HostLayout, ModeEntry, ModeSettings, ModeTools, NodeContext,
        Proxier, conntrack::NetlinkConntrack,
    },
};

pub static MODE: ModeEntry = ModeEntry {
    mode: ProxyMode::Nftables,
    fallback: Some(ProxyMode::Iptables),
    probe: |_| unavailable(),
    start,
    cleanup,
    written_beside,
    tools: ModeTools {
        in_use: trace::in_use,
        inspect_subjects: &[Subject::Rules, Subject::Affinity],
        inspect: Some(trace::inspect_live),
        trace: Some(trace::trace_live),
        status: None,
    },
};

/// The oldest `nft` whose cache reads only the table it is asked about.
const MIN_NFT: (u32, u32, u32) = (1, 0, 1);

/// Why nftables mode cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    let version = match nft(&["--version"], None) {
        Ok(text) => text,
        Err(e) => return Some(format!("the nft binary cannot be run: {e}")),
    };
    match tool_version(&version) {
        Some(v) if v >= MIN_NFT => {}
        Some((a, b, c)) => {
            return Some(format!(
                "nft {a}.{b}.{c} is too old: nftables mode needs nft 1.0.1 or later"
            ));
        }
        None => return Some(format!("unrecognised nft version {:?}", version.trim())),
    }
    let node = NodeContext::default();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let (name, port, endpoints) = probe_service();
    let probe =
        DesiredState::from_ports([(&name, &port, endpoints.as_slice())], &ctx).cold_load(&ctx);
    // `nft --check`: the kernel checks the transaction and keeps nothing.
    nft(&["--check", "-f", "-"], Some(&probe)).err().map(|e| {
        format!("the kernel does not accept the nftables ruleset (no nf_tables, or a feature missing): {e}")
    })
}

/// A NodePort service with one endpoint: its rules use the slot maps' DNAT.
fn probe_service() -> (ServicePortName, ServicePort, Vec<Arc<Endpoint>>) {
    let name = ServicePortName::new(NamespacedName::new("probe", "probe"), "p", Protocol::Tcp);
    let mut port =
        ServicePort::cluster_ip_only(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 80, Protocol::Tcp);
    port.node_port = Some(30080);
    let endpoint = Endpoint::ready_at(SocketAddr::from(([10, 0, 0, 1], 8080)));
    (name, port, vec![Arc::new(endpoint)])
}

fn start(_settings: &ModeSettings<'_>) -> Result<Box<dyn Proxier>, String> {
    Ok(Box::new(NftablesProxier::new(
        Box::new(NftCommand),
        Box::new(NetlinkConntrack::new()),
    )))
}

/// kube-proxy's nftables mode on the node: a `kube-proxy` table of either family.
fn written_beside(_running: ProxyMode) -> Vec<String> {
    let Ok(listing) = nft(&["list", "tables"], None) else {
        return Vec::new();
    };
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|family| format!("table {} {TABLE}", family_keyword(family)))
        .filter(|table| listing.lines().any(|l| l.trim() == table))
        .map(|table| format!("nftables {table}"))
        .collect()
}

/// Deletes the `kube-proxy` tables of both families (when another mode starts, and for
/// `--cleanup`). Nothing to look at without `nft` or nf_tables.
fn cleanup(_: &HostLayout, _: CleanupScope) -> Option<CleanupReport> {
    // No nft, or no nf_tables: nothing of ours can be there.
    let listing = nft(&["list", "tables"], None).ok()?;
    let mut report = CleanupReport::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        let ip = family_keyword(family);
        if !listing
            .lines()
            .any(|l| l.trim() == format!("table {ip} {TABLE}"))
        {
            continue;
        }
        match nft(&["delete", "table", ip, TABLE], None) {
            Ok(_) => report.removed += 1,
            Err(e) => report.errors.push(e.to_string()),
        }
    }
    Some(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_versions() {
        assert_eq!(
            tool_version("nftables v1.0.6 (Lester Gooch #5)\n"),
            Some((1, 0, 6))
        );
        assert_eq!(tool_version("nftables v0.9.8 (E.D.S.)"), Some((0, 9, 8)));
        assert!(tool_version("nftables v0.9.8 (E.D.S.)").unwrap() < MIN_NFT);
        assert_eq!(tool_version("nftables v1.1 (x)"), Some((1, 1, 0)));
        assert_eq!(tool_version("garbage"), None);
    }
}
