// SPDX-License-Identifier: Apache-2.0
//! `--cleanup`: removes what any mode ever installed on this node, and exits. Safe to run
//! twice; each mode's part reports what it removed.

use std::path::Path;

use tracing::{info, warn};

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

/// Every mode's cleanup. Returns whether everything went.
pub fn cleanup_all(bpffs_root: &Path) -> bool {
    let mut ok = true;
    for (mode, report) in [("ebpf", cleanup_ebpf(bpffs_root))] {
        info!(mode, removed = report.removed, "cleaned up");
        for e in &report.errors {
            warn!(mode, error = %e, "cleanup incomplete");
            ok = false;
        }
    }
    ok
}
