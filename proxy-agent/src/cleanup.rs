// SPDX-License-Identifier: Apache-2.0
//! `--cleanup`: removes what any mode ever installed on this node, and exits. Safe to run
//! twice; each mode's part reports what it removed.

use std::path::Path;

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

fn log(mode: &str, report: &CleanupReport) -> bool {
    info!(mode, removed = report.removed, "cleaned up");
    for e in &report.errors {
        warn!(mode, error = %e, "cleanup incomplete");
    }
    report.errors.is_empty()
}

/// Every mode's cleanup. Returns whether everything went.
pub fn cleanup_all(bpffs_root: &Path) -> bool {
    let ebpf = log("ebpf", &cleanup_ebpf(bpffs_root));
    let iptables = log("iptables", &cleanup_iptables());
    ebpf && iptables
}

/// When a mode starts, what the other modes left behind goes (switching modes leaves no
/// trace of the previous one).
pub fn cleanup_other_modes(running: ProxyMode, bpffs_root: &Path) {
    if running != ProxyMode::Ebpf && bpffs_root.exists() {
        log("ebpf", &cleanup_ebpf(bpffs_root));
    }
    if running != ProxyMode::Iptables {
        log("iptables", &cleanup_iptables());
    }
}
