// SPDX-License-Identifier: Apache-2.0
//! The ipvs mode's registration: whether it can run here, how it starts, what it leaves.

use super::{IpvsProxier, genl::IpvsSocket, ipset::IpsetCommand, ipvs_config};
use crate::{
    config::ProxyMode,
    node::ProcSysctl,
    proxier::{
        CleanupReport, CleanupScope, HostLayout, ModeEntry, ModeSettings, ModeTools, Proxier,
    },
};

pub static MODE: ModeEntry = ModeEntry {
    mode: ProxyMode::Ipvs,
    fallback: Some(ProxyMode::Iptables),
    // The mode programs iptables rules too.
    probe: |_| ipvs_unavailable().or_else(super::super::iptables::mode::unavailable),
    start,
    cleanup,
    written_beside,
    // No reader of IPVS's tables yet; its iptables rules are iptables mode's to show.
    tools: ModeTools::NONE,
};

/// Why ipvs mode cannot run here, if it cannot: the kernel must answer the IPVS generic
/// netlink family (asking for it loads the ip_vs module when the kernel has one) and
/// ipset must be able to talk to the kernel.
pub fn ipvs_unavailable() -> Option<String> {
    if let Err(err) = IpvsSocket::open() {
        return Some(match err.errno() {
            Some(nix::errno::Errno::ENOENT) => "the kernel has no IPVS support (the IPVS generic netlink family is unknown and no ip_vs module could be loaded)".to_string(),
            _ => format!("the kernel's IPVS interface cannot be used: {err}"),
        });
    }
    match IpsetCommand::probe() {
        Ok(_) => None,
        Err(err) if err.not_installed() => Some("ipset is not installed".to_string()),
        Err(err) => Some(format!("ipset is not usable: {err}")),
    }
}

fn start(settings: &ModeSettings<'_>) -> Result<Box<dyn Proxier>, String> {
    let config = ipvs_config(settings.config);
    let proxier =
        IpvsProxier::new(config, &mut ProcSysctl::default()).map_err(|e| e.to_string())?;
    Ok(Box::new(proxier))
}

/// Removes the chains, ipsets, kube-ipvs0 and the virtual servers outside
/// kube-proxy's ipvs mode on the node: its dummy interface `kube-ipvs0`, which holds the
/// service addresses.
fn written_beside(_running: ProxyMode) -> Vec<String> {
    if std::path::Path::new("/sys/class/net/kube-ipvs0").exists() {
        vec!["interface kube-ipvs0".to_string()]
    } else {
        Vec::new()
    }
}

/// `ipvs.excludeCIDRs`; when another mode starts, only when the mode left something.
fn cleanup(layout: &HostLayout, scope: CleanupScope) -> Option<CleanupReport> {
    let only_if_present = match scope {
        CleanupScope::LeftBeside(_) => true,
        CleanupScope::Everything => false,
    };
    let mut report = CleanupReport::default();
    match super::cleanup::cleanup(&layout.ipvs_exclude, only_if_present) {
        Ok(r) => report.removed += r.total(),
        Err(e) => report.errors.push(format!("ipvs: {e}")),
    }
    Some(report)
}
