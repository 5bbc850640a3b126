// SPDX-License-Identifier: Apache-2.0
//! `--cleanup`: removes what any mode ever installed on this node, and exits. Safe to run
//! twice; each mode's part reports what it removed.

use std::path::Path;

use ipnet::IpNet;
use tracing::{info, warn};

use crate::config::ProxyMode;

/// What one mode's cleanup did.
#[derive(Debug, Default)]
pub struct CleanupReport {
    pub removed: usize,
    pub errors: Vec<String>,
}

/// Removes the ebpf mode's programs (their pinned links) and maps under `bpffs_root`.
pub fn cleanup_ebpf(bpffs_root: &Path) -> CleanupReport {
    let mut report = CleanupReport::default();
    match crate::proxier::ebpf::loader::unpin_all(bpffs_root) {
        Ok(n) => report.removed += n,
        Err(e) => report
            .errors
            .push(format!("ebpf pins under {}: {e}", bpffs_root.display())),
    }
    report
}

/// Removes the iptables mode's chains and jump rules (both families).
pub fn cleanup_iptables() -> CleanupReport {
    let mut report = CleanupReport::default();
    match crate::proxier::iptables::cleanup_leftovers() {
        Ok(r) => report.removed += r.chains_deleted + r.rules_deleted,
        Err(e) => report.errors.push(format!("iptables: {e}")),
    }
    report
}

/// Removes the iptables mode's chains the ipvs mode does not share (ipvs mode starting).
pub fn cleanup_iptables_only() -> CleanupReport {
    let mut report = CleanupReport::default();
    match crate::proxier::iptables::cleanup_iptables_only_chains() {
        Ok(r) => report.removed += r.chains_deleted + r.rules_deleted,
        Err(e) => report.errors.push(format!("iptables: {e}")),
    }
    report
}

/// Removes the ipvs mode's chains, ipsets, kube-ipvs0 and the virtual servers outside
/// `exclude`; with `only_if_present`, only when the mode left something behind.
pub fn cleanup_ipvs(exclude: &[IpNet], only_if_present: bool) -> CleanupReport {
    let mut report = CleanupReport::default();
    match crate::proxier::ipvs::cleanup::cleanup(exclude, only_if_present) {
        Ok(r) => report.removed += r.total(),
        Err(e) => report.errors.push(format!("ipvs: {e}")),
    }
    report
}

fn log(mode: &str, report: &CleanupReport) -> bool {
    info!(mode, removed = report.removed, "cleaned up");
    for e in &report.errors {
        warn!(mode, error = %e, "cleanup incomplete");
    }
    report.errors.is_empty()
}

/// Every mode's cleanup. Returns whether everything went. The ipvs part goes first: its
/// sets can only go once no rule refers to them, and it removes its own rules.
pub fn cleanup_all(bpffs_root: &Path, ipvs_exclude: &[IpNet]) -> bool {
    let ebpf = log("ebpf", &cleanup_ebpf(bpffs_root));
    let ipvs = log("ipvs", &cleanup_ipvs(ipvs_exclude, false));
    let iptables = log("iptables", &cleanup_iptables());
    ebpf && ipvs && iptables
}

/// When a mode starts, what the other modes left behind goes (switching modes leaves no
/// trace of the previous one).
pub fn cleanup_other_modes(running: ProxyMode, bpffs_root: &Path, ipvs_exclude: &[IpNet]) {
    if running != ProxyMode::Ebpf && bpffs_root.exists() {
        log("ebpf", &cleanup_ebpf(bpffs_root));
    }
    if running != ProxyMode::Ipvs {
        // First: the iptables cleanup below would leave rules that use the sets.
        log("ipvs", &cleanup_ipvs(ipvs_exclude, true));
    }
    match running {
        ProxyMode::Iptables => {}
        // The chains both modes share are rewritten by ipvs mode's first sync.
        ProxyMode::Ipvs => {
            log("iptables", &cleanup_iptables_only());
        }
        _ => {
            log("iptables", &cleanup_iptables());
        }
    }
}
