// SPDX-License-Identifier: Apache-2.0
//! Map layout upgrades. Every map name carries its layout version (`SVC4_V2`): an agent
//! whose maps have another layout finds none of its pins, creates its maps empty, and must
//! not let its programs replace the running ones before those maps hold the services, or new
//! connections would find no service for a moment. So, when programs of an earlier agent are
//! attached (pinned links) and this layout's service map is not pinned yet, the loader keeps
//! the old programs serving from the old maps, the first full sync fills the new ones, and
//! only then are the new programs attached (each link replaced without a gap) and the old
//! layout's pins removed. Established connections keep flowing (a socket translated at
//! connect() needs no map afterwards). Maps whose layout did not change are the same pins
//! for both agents: layout 2 (32-bit reverse-NAT ids) kept conntrack and the per-socket
//! records, and takes the frontends' ids over from the layout-1 service maps
//! ([`previous_rev_nat_ids`]), so north-south flows keep their conntrack entries and those
//! entries still name their service. A change of the conntrack layout itself would start
//! those flows afresh.

use std::{fs, io, path::Path};

use aya::maps::{HashMap as AyaHash, Map, MapData};
use proxy_common::{Svc4Key, Svc6Key, SvcValueV1, maps as names};
use tracing::{info, warn};

use super::{desired::FrontendKey, entries::SvcEntryKey, pins::SVC_NAMES};

/// The service maps of layout 1, whose values [`SvcValueV1`] describes.
const SVC4_LAYOUT_1: &str = "SVC4_V1";
const SVC6_LAYOUT_1: &str = "SVC6_V1";

/// Whether the loader should defer attaching: an earlier agent's programs are attached and
/// this layout's maps are new.
pub fn deferred_attach(maps_dir: &Path, links_dir: &Path) -> bool {
    let links_pinned = fs::read_dir(links_dir).is_ok_and(|mut entries| entries.next().is_some());
    links_pinned && !maps_dir.join(names::SVC4).exists()
}

/// The name's base and layout version: `SVC4_V2` -> (`SVC4`, 1).
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

/// The reverse-NAT id each frontend had in the service maps of layout 1, when an agent of
/// that layout left them pinned (ids were 16 bits then; layout 2 widened them but kept the
/// conntrack and socket maps, whose entries hold ids). Unreadable maps give nothing: the
/// frontends then get fresh ids, and only `inspect` and getpeername() of sockets connected
/// before the upgrade can tell.
pub fn previous_rev_nat_ids(maps_dir: &Path) -> Vec<(FrontendKey, u32)> {
    let mut ids = Vec::new();
    match read_layout_1::<Svc4Key>(&maps_dir.join(SVC4_LAYOUT_1)) {
        Ok(entries) => ids.extend(frontend_ids(entries, SvcEntryKey::from_svc4)),
        Err(e) => warn!(pin = SVC4_LAYOUT_1, error = %e, "earlier layout's ids not read"),
    }
    match read_layout_1::<Svc6Key>(&maps_dir.join(SVC6_LAYOUT_1)) {
        Ok(entries) => ids.extend(frontend_ids(entries, SvcEntryKey::from_svc6)),
        Err(e) => warn!(pin = SVC6_LAYOUT_1, error = %e, "earlier layout's ids not read"),
    }
    if !ids.is_empty() {
        info!(
            frontends = ids.len(),
            "reverse-NAT ids taken over from the earlier map layout"
        );
    }
    ids
}

/// Entries of a pinned layout-1 service map; none when it is not pinned.
fn read_layout_1<K: aya::Pod>(pin: &Path) -> Result<Vec<(K, SvcValueV1)>, String> {
    if !pin.exists() {
        return Ok(Vec::new());
    }
    let data = MapData::from_pin(pin).map_err(|e| e.to_string())?;
    let map: AyaHash<MapData, K, SvcValueV1> =
        AyaHash::try_from(Map::HashMap(data)).map_err(|e| e.to_string())?;
    map.iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// The frontends named by slot-0 entries, with their ids.
fn frontend_ids<K>(
    entries: Vec<(K, SvcValueV1)>,
    key_of: fn(&K) -> SvcEntryKey,
) -> impl Iterator<Item = (FrontendKey, u32)> {
    entries.into_iter().filter_map(move |(k, v)| {
        let key = key_of(&k);
        key.names_frontend(v.flags)
            .then_some((key.frontend, u32::from(v.rev_nat_id)))
    })
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
            "SVC4_V1",
            "SVC4_V3",
            "CT4_V0",
            names::CT4,
            "SVC_NAMES_V1",
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
            ["SVC4_V1", "SVC4_V3", "CT4_V0", "SVC_NAMES_V1"]
        );
    }

    /// A layout-1 service map as an earlier agent left it pinned: its frontends' ids are
    /// taken over; wildcards, backend slots and the internal scope name no frontend.
    #[test]
    fn ids_of_the_layout_1_service_maps_are_taken_over() {
        use proxy_common::{SCOPE_EXTERNAL, SCOPE_INTERNAL, svc_flags};
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: creating a BPF map needs root");
            return;
        }
        let dir = Path::new("/sys/fs/bpf").join(format!("kpe-upgrade-ids-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let key = |last: u8, port: u16, scope: u8, slot: u16| Svc4Key {
            addr: u32::from_ne_bytes([172, 30, 0, last]),
            dport: port.to_be(),
            slot,
            proto: 6,
            scope,
            _pad: [0; 2],
        };
        let value = |rev_nat_id: u16, flags: u16| SvcValueV1 {
            rev_nat_id,
            flags,
            count: 1,
            ..SvcValueV1::default()
        };
        let mut map = AyaHash::<MapData, Svc4Key, SvcValueV1>::create(16, 0).unwrap();
        for (k, v) in [
            (
                key(1, 80, SCOPE_EXTERNAL, 0),
                value(40_000, svc_flags::CLUSTER_IP),
            ),
            (key(1, 80, SCOPE_EXTERNAL, 1), value(40_000, 0)),
            (
                key(1, 80, SCOPE_INTERNAL, 0),
                value(40_000, svc_flags::CLUSTER_IP),
            ),
            (
                key(2, 443, SCOPE_EXTERNAL, 0),
                value(7, svc_flags::CLUSTER_IP),
            ),
            (key(2, 0, SCOPE_EXTERNAL, 0), value(0, svc_flags::WILDCARD)),
        ] {
            map.insert(k, v, 0).unwrap();
        }
        map.pin(dir.join(SVC4_LAYOUT_1)).unwrap();

        let mut ids = previous_rev_nat_ids(&dir);
        ids.sort_by_key(|(_, id)| *id);
        let _ = fs::remove_file(dir.join(SVC4_LAYOUT_1));
        let _ = fs::remove_dir(&dir);
        let frontend = |last: u8, port: u16| FrontendKey {
            addr: std::net::IpAddr::from([172, 30, 0, last]),
            port,
            proto: 6,
        };
        assert_eq!(ids, [(frontend(2, 443), 7), (frontend(1, 80), 40_000)]);
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
