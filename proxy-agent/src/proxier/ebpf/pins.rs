// SPDX-License-Identifier: Apache-2.0
//! Where the ebpf mode keeps its state on the BPF filesystem and how large its maps are:
//! the layout every other part of the mode (loading, resizing, upgrading, naming,
//! inspecting, cleaning up) agrees on, so it depends on nothing else in the mode.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use tracing::warn;

/// The capacities of the maps, as the configuration's `ebpf.mapSizes` sets them.
pub use crate::config::MapSizes;

/// The pin directory of the ebpf mode: `ebpf.bpffsRoot`, or the default when unset.
pub fn bpffs_root(configured: &str) -> PathBuf {
    if configured.is_empty() {
        PathBuf::from(crate::config::DEFAULT_BPFFS_ROOT)
    } else {
        PathBuf::from(configured)
    }
}

/// Pin name of the agent's service-name table (layout version in the suffix, as for the
/// programs' maps; see `names`).
pub const SVC_NAMES: &str = "SVC_NAMES_V2";

/// The pinned maps.
pub fn maps_dir(root: &Path) -> PathBuf {
    root.join("maps")
}

/// The pinned program links.
pub fn links_dir(root: &Path) -> PathBuf {
    root.join("links")
}

/// Detaches every program and removes every pin under `root` (links first, then maps).
pub fn unpin_all(root: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for dir in [links_dir(root), maps_dir(root)] {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            fs::remove_file(entry.path())?;
            removed += 1;
        }
        fs::remove_dir(&dir)?;
    }
    match fs::remove_dir(root) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => warn!(root = %root.display(), error = %e, "could not remove the bpffs root"),
    }
    Ok(removed)
}
