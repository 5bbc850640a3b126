// SPDX-License-Identifier: Apache-2.0
//! `--cleanup`: removes what any mode ever installed on this node, and exits. Safe to run
//! twice; each mode's part reports what it removed. A starting mode removes, the same way,
//! what the others left. Each mode's cleanup is its registration's (see
//! [`crate::proxier::MODES`]).

use std::path::Path;

use ipnet::IpNet;
use tracing::{info, warn};

pub use crate::proxier::CleanupReport;
use crate::{
    config::ProxyMode,
    proxier::{CleanupScope, HostLayout, MODES},
};

fn log(mode: &str, report: &CleanupReport) -> bool {
    info!(mode, removed = report.removed, "cleaned up");
    for e in &report.errors {
        warn!(mode, error = %e, "cleanup incomplete");
    }
    report.errors.is_empty()
}

fn layout(bpffs_root: &Path, ipvs_exclude: &[IpNet]) -> HostLayout {
    HostLayout {
        bpffs_root: bpffs_root.to_path_buf(),
        ipvs_exclude: ipvs_exclude.to_vec(),
    }
}

/// Every mode's cleanup, in the registry's order. Returns whether everything went.
pub fn cleanup_all(bpffs_root: &Path, ipvs_exclude: &[IpNet]) -> bool {
    let layout = layout(bpffs_root, ipvs_exclude);
    let mut all_went = true;
    for entry in MODES {
        if let Some(report) = (entry.cleanup)(&layout, CleanupScope::Everything) {
            all_went &= log(entry.mode.as_str(), &report);
        }
    }
    all_went
}

/// When a mode starts, what the other modes left behind goes (switching modes leaves no
/// trace of the previous one). The `handover` subcommand does the same for a mode that
/// another proxy (kube-proxy, on rollback) runs. Returns whether everything went.
pub fn cleanup_other_modes(running: ProxyMode, bpffs_root: &Path, ipvs_exclude: &[IpNet]) -> bool {
    let layout = layout(bpffs_root, ipvs_exclude);
    let mut all_went = true;
    for entry in MODES.iter().filter(|e| e.mode != running) {
        if let Some(report) = (entry.cleanup)(&layout, CleanupScope::LeftBeside(running)) {
            all_went &= log(entry.mode.as_str(), &report);
        }
    }
    all_went
}
