// SPDX-License-Identifier: Apache-2.0
//! Map layout upgrades. Every map name carries its layout version (`SVC4_V1`): an agent
//! whose maps have another layout finds none of its pins, creates its maps empty, and must
//! not let its programs replace the running ones before those maps hold the services, or new
//! connections would find no service for a moment. So, when programs of an earlier agent are
//! attached (pinned links) and this layout's service map is not pinned yet, the loader keeps
//! the old programs serving from the old maps, the first full sync fills the new ones, and
//! only then are the new programs attached (each link replaced without a gap) and the old
//! layout's pins removed. Established connections keep flowing (a socket translated at
//! connect() needs no map afterwards); north-south flows through conntrack start afresh.

use std::{fs, io, path::Path};

use proxy_common::maps as names;
use tracing::{info, warn};

use super::pins::SVC_NAMES;

/// Whether the loader should defer attaching: an earlier agent's programs are attached and
/// this layout's maps are new.
pub fn deferred_attach(maps_dir: &Path, links_dir: &Path) -> bool {
    let links_pinned = fs::read_dir(links_dir).is_ok_and(|mut entries| entries.next().is_some());
    links_pinned && !maps_dir.join(names::SVC4).exists()
}

/// The name's base and layout version: `SVC4_V1` -> (`SVC4`, 1).
fn layout_of(name: &str) -> Option<(&str, u32)> {
    let (base, version) = name.rsplit_once("_V")?;
    let version: u32 = version.parse().ok()?;
    (!base.is_empty()).then_some((base, version))
}

/// Pins among `pinned` that hold another layout of one of this agent's maps.
pub fn other_layouts(pinned: &[String]) -> Vec<&str> {
    let current: Vec<(&str, u32)> = names::ALL
        .iter()
        .chain(std::iter::once(&SVC_NAMES))
        .filter_map(|n| layout_of(n))
        .collect();
    pinned
        .iter()
        .map(String::as_str)
        .filter(|pin| {
            layout_of(pin).is_some_and(|(base, version)| {
                current.iter().any(|(b, v)| *b == base && *v != version)
            })
        })
        .collect()
}

/// Removes the pins of other layouts (the programs that used them are detached by now).
/// Returns how many.
pub fn remove_other_layouts(maps_dir: &Path) -> io::Result<usize> {
    let pinned: Vec<String> = fs::read_dir(maps_dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut removed = 0;
    for pin in other_layouts(&pinned) {
        match fs::remove_file(maps_dir.join(pin)) {
            Ok(()) => {
                info!(pin, "map of an earlier layout removed");
                removed += 1;
            }
            Err(e) => warn!(pin, error = %e, "could not remove a map of an earlier layout"),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_layouts_are_other_versions_of_our_maps_only() {
        let pinned: Vec<String> = [
            names::SVC4,
            "SVC4_V0",
            "SVC4_V2",
            "CT4_V0",
            "SVC_NAMES_V0",
            "SVC4_V1_staging",
            "SOMEONE_ELSES_V0",
            "NOT_VERSIONED",
            "_V3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            other_layouts(&pinned),
            ["SVC4_V0", "SVC4_V2", "CT4_V0", "SVC_NAMES_V0"]
        );
    }

    #[test]
    fn attaching_is_deferred_only_over_running_programs_of_another_layout() {
        let root = std::env::temp_dir().join(format!("kpe-upgrade-{}", std::process::id()));
        let (maps, links) = (root.join("maps"), root.join("links"));
        fs::create_dir_all(&maps).unwrap();
        fs::create_dir_all(&links).unwrap();
        assert!(!deferred_attach(&maps, &links), "a fresh node");
        fs::write(links.join("sock_connect4"), b"").unwrap();
        assert!(
            deferred_attach(&maps, &links),
            "programs running, no maps of ours"
        );
        fs::write(maps.join(names::SVC4), b"").unwrap();
        assert!(
            !deferred_attach(&maps, &links),
            "a restart of the same layout"
        );
        let _ = fs::remove_dir_all(&root);
    }
}
