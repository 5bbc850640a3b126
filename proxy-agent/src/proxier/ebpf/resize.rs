// SPDX-License-Identifier: Apache-2.0
//! Pinned maps whose capacity differs from the configuration's are replaced by maps of the
//! new size holding the same entries, so that raising `ebpf.mapSizes` and restarting the
//! agent takes effect without dropping a service or a tracked flow:
//!
//! 1. before loading, such a map gets a staging pin path: the loader creates the new map
//!    there, from the object (with its BTF), while the old map stays pinned and in use;
//! 2. after loading, before any program is attached, every entry is copied over;
//! 3. the programs are attached against the new maps and replace the old programs' links
//!    (each link swap is gapless, see the loader); entries the old programs added in the
//!    meantime (conntrack and affinity of new flows) are copied too;
//! 4. the staging pin is renamed over the old one, which goes with its last user.
//!
//! The same steps grow a map while the agent runs (see `growth`): the sizes then come from
//! the growth decision instead of the configuration ([`Capacities`]).
//!
//! A map whose entries cannot all move (more of them than the new capacity, a layout that
//! differs, a copy that fails) is kept as it is, with a warning; the apply stage reads the
//! capacity of the maps as loaded, so it still never overfills one.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use aya::{
    Pod,
    maps::{HashMap as AyaHash, LpmTrie, Map as AyaMap, MapData, MapInfo, MapType, lpm_trie},
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend4Value, Backend6Value, Ct4Key, Ct6Key, CtValue,
    RevNat4Value, RevNat6Value, SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value,
    SourceRange4, SourceRange6, Svc4Key, Svc6Key, SvcValue, maps as names,
};
use tracing::{debug, info, warn};

use super::{
    maps::{KernelHash, KernelLpm, KvMap, MapOpError},
    pins::MapSizes,
};

/// What a map is, as far as copying its entries goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub map_type: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// What the load does with one pinned map.
#[derive(Clone, Debug, PartialEq)]
pub enum PinPlan {
    /// No pin yet, or one of the wanted shape: the loader creates or reuses it.
    AsIs,
    /// A new map of the wanted size at the staging pin, the entries moved over (how many:
    /// counted when shrinking, else once copied).
    Resize { from: u32, entries: usize },
    /// The old map stays as it is, for this reason.
    Keep(String),
}

/// Chooses what to do with a pinned map of shape `existing` (None: no pin) when the object
/// asks for `wanted`; `entries` counts the pinned map's entries (only asked when needed).
pub fn decide(
    existing: Option<&Shape>,
    wanted: &Shape,
    entries: impl FnOnce() -> Result<usize, MapOpError>,
) -> PinPlan {
    let Some(existing) = existing else {
        return PinPlan::AsIs;
    };
    if existing == wanted {
        return PinPlan::AsIs;
    }
    let layout = |s: &Shape| (s.map_type, s.key_size, s.value_size);
    if layout(existing) != layout(wanted) {
        return PinPlan::Keep(format!(
            "its layout ({:?}, {}-byte keys, {}-byte values) is not the program's ({:?}, {}, \
             {}): entries cannot be copied, and a new layout needs a new map name",
            existing.map_type,
            existing.key_size,
            existing.value_size,
            wanted.map_type,
            wanted.key_size,
            wanted.value_size
        ));
    }
    if wanted.max_entries >= existing.max_entries {
        // Growing: every entry fits, no need to count them first (a map of millions).
        return PinPlan::Resize {
            from: existing.max_entries,
            entries: 0,
        };
    }
    match entries() {
        Err(e) => PinPlan::Keep(format!("its entries cannot be read: {e}")),
        Ok(n) if n > wanted.max_entries as usize => PinPlan::Keep(format!(
            "it holds {n} entries, more than the {} configured",
            wanted.max_entries
        )),
        Ok(n) => PinPlan::Resize {
            from: existing.max_entries,
            entries: n,
        },
    }
}

/// Copies every entry of `from` into `to`; with `only_missing`, keys `to` has already keep
/// their value there (the new programs wrote them, they are the newer). Returns how many
/// were written.
pub fn copy_entries<K, V>(
    from: &dyn KvMap<K, V>,
    to: &mut dyn KvMap<K, V>,
    only_missing: bool,
) -> Result<usize, MapOpError> {
    let entries = from.entries()?;
    if !only_missing {
        to.put_many(&entries)?;
        return Ok(entries.len());
    }
    let mut written = 0;
    for (key, value) in entries {
        if only_missing && to.get(&key)?.is_some() {
            continue;
        }
        to.put(&key, &value)?;
        written += 1;
    }
    Ok(written)
}

fn open(name: &'static str, path: &Path) -> Result<AyaMap, MapOpError> {
    let kernel = |source| MapOpError::Kernel {
        map: name,
        op: "open",
        source,
    };
    AyaMap::from_map_data(MapData::from_pin(path).map_err(kernel)?).map_err(kernel)
}

fn open_hash<K: Pod + Send + Sync, V: Pod + Send + Sync>(
    name: &'static str,
    path: &Path,
) -> Result<KernelHash<K, V>, MapOpError> {
    let map = AyaHash::try_from(open(name, path)?).map_err(|source| MapOpError::Kernel {
        map: name,
        op: "open",
        source,
    })?;
    Ok(KernelHash::new(name, map))
}

fn open_lpm<D: Pod + Send>(name: &'static str, path: &Path) -> Result<KernelLpm<D>, MapOpError> {
    let map = LpmTrie::try_from(open(name, path)?).map_err(|source| MapOpError::Kernel {
        map: name,
        op: "open",
        source,
    })?;
    Ok(KernelLpm::new(name, map))
}

fn count_hash<K: Pod + Send + Sync, V: Pod + Send + Sync>(
    name: &'static str,
    path: &Path,
) -> Result<usize, MapOpError> {
    Ok(open_hash::<K, V>(name, path)?.entries()?.len())
}

fn copy_hash<K: Pod + Send + Sync, V: Pod + Send + Sync>(
    name: &'static str,
    from: &Path,
    to: &Path,
    only_missing: bool,
) -> Result<usize, MapOpError> {
    let old = open_hash::<K, V>(name, from)?;
    let mut new = open_hash::<K, V>(name, to)?;
    copy_entries(&old, &mut new, only_missing)
}

fn count_lpm<D: Pod + Send>(name: &'static str, path: &Path) -> Result<usize, MapOpError> {
    Ok(open_lpm::<D>(name, path)?.entries()?.len())
}

fn copy_lpm<D: Pod + Send>(
    name: &'static str,
    from: &Path,
    to: &Path,
    only_missing: bool,
) -> Result<usize, MapOpError> {
    let old = open_lpm::<D>(name, from)?;
    let mut new = open_lpm::<D>(name, to)?;
    copy_entries(&old, &mut new, only_missing)
}

type CountFn = fn(&'static str, &Path) -> Result<usize, MapOpError>;
type CopyFn = fn(&'static str, &Path, &Path, bool) -> Result<usize, MapOpError>;

/// One map whose capacity the configuration sets.
#[derive(Clone, Copy)]
pub struct Resizable {
    pub name: &'static str,
    pub wanted: Shape,
    /// Whether the programs write entries (the LRU maps: conntrack, affinity, socket
    /// rev-NAT); only the agent writes the others, so step 3 has nothing to copy there.
    programs_write: bool,
    count: CountFn,
    copy: CopyFn,
}

impl Resizable {
    fn hash<K: Pod + Send + Sync, V: Pod + Send + Sync>(
        name: &'static str,
        map_type: MapType,
        max_entries: u32,
    ) -> Self {
        Self {
            name,
            wanted: Shape {
                map_type,
                key_size: size_of::<K>() as u32,
                value_size: size_of::<V>() as u32,
                max_entries,
            },
            programs_write: map_type == MapType::LruHash,
            count: count_hash::<K, V>,
            copy: copy_hash::<K, V>,
        }
    }

    fn lpm<D: Pod + Send>(name: &'static str, max_entries: u32) -> Self {
        Self {
            name,
            wanted: Shape {
                map_type: MapType::LpmTrie,
                key_size: size_of::<lpm_trie::Key<D>>() as u32,
                value_size: size_of::<u8>() as u32,
                max_entries,
            },
            programs_write: false,
            count: count_lpm::<D>,
            copy: copy_lpm::<D>,
        }
    }
}

/// Capacities of single maps (by pinned name) that replace the configuration's: the
/// sizes maps have grown to.
pub type Capacities = BTreeMap<&'static str, u32>;

/// Every map `ebpf.mapSizes` sizes, with the shape the programs define it with and the
/// capacity `capacities` gives it, or else the configured one.
pub fn resizable(sizes: &MapSizes, capacities: &Capacities) -> Vec<Resizable> {
    let mut maps = configured(sizes);
    for map in &mut maps {
        if let Some(capacity) = capacities.get(map.name) {
            map.wanted.max_entries = *capacity;
        }
    }
    maps
}

/// Every map `ebpf.mapSizes` sizes, with the configured capacity.
fn configured(sizes: &MapSizes) -> Vec<Resizable> {
    use MapType::{Hash, LruHash};
    vec![
        Resizable::hash::<Svc4Key, SvcValue>(names::SVC4, Hash, sizes.services),
        Resizable::hash::<Svc6Key, SvcValue>(names::SVC6, Hash, sizes.services),
        Resizable::hash::<u32, Backend4Value>(names::BACKENDS4, Hash, sizes.backends),
        Resizable::hash::<u32, Backend6Value>(names::BACKENDS6, Hash, sizes.backends),
        Resizable::hash::<u32, RevNat4Value>(names::REV_NAT4, Hash, sizes.rev_nat),
        Resizable::hash::<u32, RevNat6Value>(names::REV_NAT6, Hash, sizes.rev_nat),
        Resizable::hash::<SockRevNat4Key, SockRevNat4Value>(
            names::SOCK_REV_NAT4,
            LruHash,
            sizes.sock_rev_nat,
        ),
        Resizable::hash::<SockRevNat6Key, SockRevNat6Value>(
            names::SOCK_REV_NAT6,
            LruHash,
            sizes.sock_rev_nat,
        ),
        Resizable::hash::<AffinityKey, AffinityValue>(names::AFFINITY, LruHash, sizes.affinity),
        Resizable::hash::<Ct4Key, CtValue>(names::CT4, LruHash, sizes.conntrack),
        Resizable::hash::<Ct6Key, CtValue>(names::CT6, LruHash, sizes.conntrack),
        Resizable::lpm::<SourceRange4>(names::SRC_RANGES4, sizes.source_ranges),
        Resizable::lpm::<SourceRange6>(names::SRC_RANGES6, sizes.source_ranges),
    ]
}

/// Entries of the Maglev map: the configured tables of `table_size` entries (validation
/// keeps the product within a u32).
pub fn maglev_entries(sizes: &MapSizes, table_size: u32) -> u32 {
    sizes.maglev_tables.saturating_mul(table_size).max(1)
}

/// The Maglev map is not resized like the others: its entries are tables of a given size,
/// meaningless under another one. When the pinned map has another capacity, or the running
/// dataplane's configuration another table size, its pin is removed so that the load
/// creates the map afresh, and so is the configuration's (with another table size) so that
/// the running programs keep reading their old tables with their old size until they are
/// replaced. The new programs find empty tables (entry 0: they pick at random) until the
/// first full sync, which writes every table in use (see `apply`'s `maglev`).
pub fn replace_other_maglev_layout(maps_dir: &Path, entries: u32, table_size: u32) {
    let path = maps_dir.join(names::MAGLEV);
    let Some(shape) = pinned_shape(names::MAGLEV, &path) else {
        return;
    };
    let pinned_size = pinned_maglev_table_size(maps_dir);
    let same_size = pinned_size.is_none_or(|s| s == table_size);
    if shape.max_entries == entries && same_size {
        return;
    }
    info!(
        from_entries = shape.max_entries,
        to_entries = entries,
        from_table_size = ?pinned_size,
        to_table_size = table_size,
        "Maglev tables change shape: the map is created afresh and refilled by the first full sync"
    );
    let mut pins = vec![path];
    if !same_size {
        pins.push(maps_dir.join(names::MAGLEV_CONFIG));
    }
    for pin in pins {
        if let Err(e) = fs::remove_file(&pin) {
            warn!(pin = %pin.display(), error = %e, "could not remove a pinned Maglev map; the load reuses it");
        }
    }
}

/// The table size the running dataplane's pinned Maglev configuration holds (None: no pin,
/// unreadable, or not written yet).
fn pinned_maglev_table_size(maps_dir: &Path) -> Option<u32> {
    let data = MapData::from_pin(maps_dir.join(names::MAGLEV_CONFIG)).ok()?;
    let config: aya::maps::Array<MapData, u32> =
        aya::maps::Array::try_from(AyaMap::Array(data)).ok()?;
    let size = config.get(&0, 0).ok()?;
    (size != 0).then_some(size)
}

/// Where the new map of a resize is pinned until it replaces the old one (bpffs refuses
/// names with dots).
pub fn staging_pin(maps_dir: &Path, name: &str) -> PathBuf {
    maps_dir.join(format!("{name}_staging"))
}

/// The capacity of the map pinned as `name` under `maps_dir` (None: no pin, or not
/// readable).
pub fn pinned_capacity(maps_dir: &Path, name: &str) -> Option<u32> {
    pinned_shape(name, &maps_dir.join(name)).map(|s| s.max_entries)
}

/// The shape of the map pinned at `path` (None: no pin, or not readable as a map, which
/// the loader then reports).
fn pinned_shape(name: &str, path: &Path) -> Option<Shape> {
    if !path.exists() {
        return None;
    }
    let info = match MapInfo::from_pin(path) {
        Ok(info) => info,
        Err(e) => {
            warn!(map = name, error = %e, "cannot read the pinned map's description");
            return None;
        }
    };
    Some(Shape {
        map_type: info.map_type().ok()?,
        key_size: info.key_size(),
        value_size: info.value_size(),
        max_entries: info.max_entries(),
    })
}

/// Decides, for each resizable map, what the load does with its pin. Staging pins left by
/// an interrupted resize are removed first: the pin under the map's own name is the one
/// kept through a resize until its very end.
pub fn plan(maps_dir: &Path, maps: &[Resizable]) -> Vec<PinPlan> {
    maps.iter()
        .map(|m| {
            let staging = staging_pin(maps_dir, m.name);
            if staging.exists() {
                warn!(
                    map = m.name,
                    "removing the new map of an interrupted resize"
                );
                let _ = fs::remove_file(&staging);
            }
            let path = maps_dir.join(m.name);
            let plan = decide(pinned_shape(m.name, &path).as_ref(), &m.wanted, || {
                (m.count)(m.name, &path)
            });
            if let PinPlan::Keep(reason) = &plan {
                warn!(
                    map = m.name,
                    configured = m.wanted.max_entries,
                    "the pinned map keeps its size: {reason}"
                );
            }
            plan
        })
        .collect()
}

/// The pin path the loader must use for each map.
pub fn pin_path(maps_dir: &Path, name: &str, maps: &[Resizable], plans: &[PinPlan]) -> PathBuf {
    let resized = maps
        .iter()
        .zip(plans)
        .any(|(m, p)| m.name == name && matches!(p, PinPlan::Resize { .. }));
    if resized {
        staging_pin(maps_dir, name)
    } else {
        maps_dir.join(name)
    }
}

/// Step 2: copies the old maps' entries into the new ones. A map whose copy fails is kept
/// (its plan becomes [`PinPlan::Keep`]) and the new maps are unpinned: the object must
/// then be loaded again. Returns whether every copy succeeded.
pub fn copy_over(maps_dir: &Path, maps: &[Resizable], plans: &mut [PinPlan]) -> bool {
    let mut all = true;
    for (m, plan) in maps.iter().zip(plans.iter_mut()) {
        if !matches!(plan, PinPlan::Resize { .. }) {
            continue;
        }
        let staging = staging_pin(maps_dir, m.name);
        match (m.copy)(m.name, &maps_dir.join(m.name), &staging, false) {
            Ok(n) => {
                debug!(
                    map = m.name,
                    entries = n,
                    "entries copied into the resized map"
                );
                if let PinPlan::Resize { entries, .. } = plan {
                    *entries = n;
                }
            }
            Err(e) => {
                warn!(map = m.name, error = %e, "cannot copy into the resized map; keeping the old one");
                *plan = PinPlan::Keep(format!("copying its entries failed: {e}"));
                all = false;
            }
        }
    }
    if !all {
        discard_staging(maps_dir, maps);
    }
    all
}

/// Removes every staging pin (the new maps go with the object that holds them).
pub fn discard_staging(maps_dir: &Path, maps: &[Resizable]) {
    for m in maps {
        let _ = fs::remove_file(staging_pin(maps_dir, m.name));
    }
}

/// Steps 3 and 4, once the programs using the new maps are attached: copies what the old
/// programs added meanwhile, then pins each new map under its own name.
pub fn complete(maps_dir: &Path, maps: &[Resizable], plans: &[PinPlan]) -> std::io::Result<()> {
    for (m, plan) in maps.iter().zip(plans) {
        let PinPlan::Resize { from, entries } = plan else {
            continue;
        };
        let path = maps_dir.join(m.name);
        let staging = staging_pin(maps_dir, m.name);
        // A second pass reads every entry again (three system calls each): only for maps
        // the old programs may have added to meanwhile.
        let late = if m.programs_write {
            match (m.copy)(m.name, &path, &staging, true) {
                Ok(n) => n,
                Err(e) => {
                    warn!(map = m.name, error = %e, "entries added during the resize may be lost");
                    0
                }
            }
        } else {
            0
        };
        fs::rename(&staging, &path)?;
        info!(
            map = m.name,
            from,
            to = m.wanted.max_entries,
            entries = entries + late,
            "map resized; its entries moved over"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::proxier::ebpf::maps::MemMap;

    fn shape(max_entries: u32) -> Shape {
        Shape {
            map_type: MapType::Hash,
            key_size: 12,
            value_size: 8,
            max_entries,
        }
    }

    #[test]
    fn a_map_of_another_size_is_resized_when_its_entries_fit() {
        let wanted = shape(64);
        assert_eq!(decide(None, &wanted, || unreachable!()), PinPlan::AsIs);
        assert_eq!(
            decide(Some(&shape(64)), &wanted, || unreachable!()),
            PinPlan::AsIs
        );
        // Growing needs no count: every entry fits.
        assert_eq!(
            decide(Some(&shape(8)), &wanted, || unreachable!()),
            PinPlan::Resize {
                from: 8,
                entries: 0
            }
        );
        // Shrinking works while the entries fit.
        assert_eq!(
            decide(Some(&shape(64)), &shape(16), || Ok(16)),
            PinPlan::Resize {
                from: 64,
                entries: 16
            }
        );
    }

    #[test]
    fn a_map_whose_entries_cannot_move_is_kept() {
        let kept = |p: PinPlan| matches!(p, PinPlan::Keep(_));
        assert!(kept(decide(Some(&shape(64)), &shape(16), || Ok(17))));
        let other_layout = Shape {
            value_size: 16,
            ..shape(8)
        };
        assert!(kept(decide(Some(&other_layout), &shape(64), || {
            unreachable!()
        })));
        let unreadable = || {
            Err(MapOpError::Full {
                map: "X",
                op: "iterate",
            })
        };
        assert!(kept(decide(Some(&shape(64)), &shape(8), unreadable)));
    }

    #[test]
    fn copying_moves_every_entry_and_the_second_pass_keeps_newer_values() {
        let log = Arc::default();
        let mut old: MemMap<u32, u32> = MemMap::new("OLD", 4, Arc::clone(&log));
        for k in 1..=3 {
            old.put(&k, &(k * 10)).unwrap();
        }
        let mut new: MemMap<u32, u32> = MemMap::new("NEW", 8, Arc::clone(&log));
        assert_eq!(copy_entries(&old, &mut new, false).unwrap(), 3);
        // The new programs update flow 1; the old ones add flow 4 meanwhile.
        new.put(&1, &11).unwrap();
        old.put(&4, &40).unwrap();
        assert_eq!(copy_entries(&old, &mut new, true).unwrap(), 1);
        let mut got = new.entries().unwrap();
        got.sort();
        assert_eq!(got, vec![(1, 11), (2, 20), (3, 30), (4, 40)]);
        // A destination without room is an error, not a silent loss.
        let mut small: MemMap<u32, u32> = MemMap::new("SMALL", 2, log);
        assert!(copy_entries(&old, &mut small, false).is_err());
    }

    #[test]
    fn every_configured_map_is_resizable_and_staged_beside_its_pin() {
        let maps = resizable(&MapSizes::default(), &Capacities::new());
        assert_eq!(maps.len(), 13);
        let grown = resizable(
            &MapSizes::default(),
            &Capacities::from([(names::BACKENDS6, 1 << 20)]),
        );
        let capacity_of = |name| {
            grown
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.wanted.max_entries)
        };
        assert_eq!(capacity_of(names::BACKENDS6), Some(1 << 20));
        assert_eq!(capacity_of(names::BACKENDS4), Some(65_536));
        let dir = Path::new("/sys/fs/bpf/x/maps");
        let mut plans = vec![PinPlan::AsIs; maps.len()];
        plans[0] = PinPlan::Resize {
            from: 1,
            entries: 0,
        };
        assert_eq!(
            pin_path(dir, names::SVC4, &maps, &plans),
            dir.join("SVC4_V2_staging")
        );
        assert_eq!(
            pin_path(dir, names::SVC6, &maps, &plans),
            dir.join("SVC6_V2")
        );
        assert_eq!(
            pin_path(dir, names::LB_CONFIG, &maps, &plans),
            dir.join("LB_CONFIG_V1")
        );
        // The LPM key is the prefix length and the data.
        let src = maps.iter().find(|m| m.name == names::SRC_RANGES4).unwrap();
        assert_eq!(src.wanted.key_size as usize, 4 + size_of::<SourceRange4>());
        // Only the LRU maps get entries from the programs during a resize.
        let written: Vec<&str> = maps
            .iter()
            .filter(|m| m.programs_write)
            .map(|m| m.name)
            .collect();
        assert_eq!(
            written,
            [
                names::SOCK_REV_NAT4,
                names::SOCK_REV_NAT6,
                names::AFFINITY,
                names::CT4,
                names::CT6
            ]
        );
    }
}
