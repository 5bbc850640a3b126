// SPDX-License-Identifier: Apache-2.0
//! Reading the ebpf dataplane's pinned maps (the only part of `inspect` that touches the
//! kernel, besides iptables-save): every map the programs act on, the names table, the
//! runtime configuration and the devices the uplink program is attached to.

use std::path::Path;

use aya::maps::{Array, HashMap as AyaHash, Map as AyaMap, MapData, lpm_trie::LpmTrie};
use proxy_common::{Ct4Key, Ct6Key, CtValue, LbConfig, maps as names};

use super::live::{LiveError, RawMaps};
use crate::proxier::ebpf::{
    loader::{links_dir, maps_dir},
    maps::{KernelHash, KernelLpm, KvMap, LbMaps, MemMaglev},
    names::read_pinned as read_names,
    node_settings::LocalCidrMaps,
};

fn open(dir: &Path, name: &'static str) -> Result<AyaMap, LiveError> {
    let data =
        MapData::from_pin(dir.join(name)).map_err(|source| LiveError::Map { name, source })?;
    AyaMap::from_map_data(data).map_err(|source| LiveError::Map { name, source })
}

fn hash<K: aya::Pod + Send + Sync, V: aya::Pod + Send + Sync>(
    dir: &Path,
    name: &'static str,
) -> Result<Box<KernelHash<K, V>>, LiveError> {
    let map =
        AyaHash::try_from(open(dir, name)?).map_err(|source| LiveError::Map { name, source })?;
    Ok(Box::new(KernelHash::new(name, map)))
}

fn lpm<D: aya::Pod + Send>(dir: &Path, name: &'static str) -> Result<Box<KernelLpm<D>>, LiveError> {
    let map: LpmTrie<MapData, D, u8> =
        LpmTrie::try_from(open(dir, name)?).map_err(|source| LiveError::Map { name, source })?;
    Ok(Box::new(KernelLpm::new(name, map)))
}

/// Devices the uplink ingress program is attached to, from the link pins' names.
fn uplinks(root: &Path) -> Vec<String> {
    const PREFIX: &str = "tc_uplink_ingress_";
    let mut out: Vec<String> = std::fs::read_dir(links_dir(root))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(PREFIX)
                .filter(|d| !d.ends_with("_staging"))
                .map(str::to_string)
        })
        .collect();
    out.sort();
    out
}

fn monotonic_coarse_secs() -> u32 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(|t| t.tv_sec() as u32)
        .unwrap_or(0)
}

/// Whether an ebpf dataplane is pinned under `bpffs_root`.
pub fn is_pinned(bpffs_root: &Path) -> bool {
    maps_dir(bpffs_root).join(names::SVC4).exists()
}

/// Reads every map the programs act on from the pins under `bpffs_root`.
pub fn read_pinned(bpffs_root: &Path) -> Result<RawMaps, LiveError> {
    let dir = maps_dir(bpffs_root);
    if !is_pinned(bpffs_root) {
        return Err(LiveError::NotPinned(bpffs_root.to_path_buf()));
    }
    let maps = LbMaps {
        svc4: hash(&dir, names::SVC4)?,
        svc6: hash(&dir, names::SVC6)?,
        backends4: hash(&dir, names::BACKENDS4)?,
        backends6: hash(&dir, names::BACKENDS6)?,
        rev_nat4: hash(&dir, names::REV_NAT4)?,
        rev_nat6: hash(&dir, names::REV_NAT6)?,
        affinity: hash(&dir, names::AFFINITY)?,
        svc_cidrs4: lpm(&dir, names::SVC_CIDRS4)?,
        svc_cidrs6: lpm(&dir, names::SVC_CIDRS6)?,
        nodeport_addrs4: hash(&dir, names::NODEPORT_ADDRS4)?,
        nodeport_addrs6: hash(&dir, names::NODEPORT_ADDRS6)?,
        src_ranges4: lpm(&dir, names::SRC_RANGES4)?,
        src_ranges6: lpm(&dir, names::SRC_RANGES6)?,
        // Inspection reads no table: what a frontend uses is in its slot 0.
        maglev: Box::new(MemMaglev::new(0, Default::default())),
    };
    let snapshot = maps.snapshot()?;
    let affinity = maps.affinity.entries()?;
    let ct4 = hash::<Ct4Key, CtValue>(&dir, names::CT4)?.entries()?;
    let ct6 = hash::<Ct6Key, CtValue>(&dir, names::CT6)?.entries()?;
    let name = names::LB_CONFIG;
    let config: Array<MapData, LbConfig> =
        Array::try_from(open(&dir, name)?).map_err(|source| LiveError::Map { name, source })?;
    let config = config.get(&0, 0).unwrap_or_default();
    // Pins of an agent from before the detector's tries existed: none.
    let local_cidrs = match (
        lpm::<[u8; 4]>(&dir, names::LOCAL_CIDRS4),
        lpm::<[u8; 16]>(&dir, names::LOCAL_CIDRS6),
    ) {
        (Ok(v4), Ok(v6)) => LocalCidrMaps { v4, v6 }.read()?.into_iter().collect(),
        _ => Vec::new(),
    };
    Ok(RawMaps {
        snapshot,
        names: read_names(&dir)?,
        affinity,
        ct4,
        ct6,
        config,
        local_cidrs,
        uplinks: uplinks(bpffs_root),
        now: monotonic_coarse_secs(),
    })
}
