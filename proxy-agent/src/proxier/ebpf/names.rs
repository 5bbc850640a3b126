// SPDX-License-Identifier: Apache-2.0
//! The names table: which service port each frontend (rev_nat_id) belongs to, so that
//! `proxy-agent inspect` and `proxy-agent trace` can say "ns1/svc1:http" instead of an id.
//!
//! The dataplane maps hold only ids. The table is a pinned BPF hash map next to them
//! (`maps/SVC_NAMES_V2`) rather than a file, because bpffs holds no regular files and because
//! a map shares the other pins' lifetime: it survives agent restarts, is removed by
//! `--cleanup` with them, and each entry is replaced atomically, so a reader never sees half a
//! name. The programs never read it. It is written at every sync, while the kernel takes the
//! maps' writes, from the ids the apply stage planned; on a partial sync only the changed
//! services' entries are touched.
//!
//! Key: `(v6 << 31) | rev_nat_id` (layout 2; layout 1 put the family in bit 16, when ids
//! were 16 bits). Value: namespace, name and port name, each NUL-padded in a
//! fixed field (Kubernetes caps them at 63, 63 and 15 bytes).

use std::{
    collections::{HashMap, HashSet},
    fs,
    hash::BuildHasher,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::maps::{HashMap as AyaHash, Map as AyaMap, MapData, MapInfo};
// foldhash, not SipHash: a cold sync writes a name for each of 100,000 frontends (see
// `apply`).
use foldhash::{HashMap as FastMap, HashSet as FastSet};
use tracing::{info, warn};

use super::{
    apply::ApplyState,
    desired::{FrontendKey, proto_number},
    maps::{KernelHash, KvMap, MapOpError},
    resize,
};
use crate::model::{FamilyState, IpFamily, NamespacedName, PortRef, ServicePort};

pub use super::pins::SVC_NAMES;

const NS_LEN: usize = 64;
const NAME_LEN: usize = 64;
const PORT_LEN: usize = 16;
pub const VALUE_LEN: usize = NS_LEN + NAME_LEN + PORT_LEN;

pub type NameValue = [u8; VALUE_LEN];

/// Ids are at most [`proxy_common::MAX_REV_NAT_ID`] (24 bits), so the family fits in the
/// top bit.
pub fn key(v6: bool, rev_nat_id: u32) -> u32 {
    (u32::from(v6) << 31) | (rev_nat_id & !(1 << 31))
}

/// `(v6, rev_nat_id)` of a key.
pub fn split_key(key: u32) -> (bool, u32) {
    (key >> 31 != 0, key & !(1 << 31))
}

fn put_field(out: &mut [u8], text: &str) {
    // Longer than Kubernetes allows cannot happen; cut at a character boundary anyway.
    let mut end = text.len().min(out.len() - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&text.as_bytes()[..end]);
}

fn get_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

pub fn encode(port: &PortRef) -> NameValue {
    let mut v = [0u8; VALUE_LEN];
    put_field(&mut v[..NS_LEN], &port.namespace);
    put_field(&mut v[NS_LEN..NS_LEN + NAME_LEN], &port.name);
    put_field(&mut v[NS_LEN + NAME_LEN..], &port.port_name);
    v
}

pub fn decode(v: &NameValue) -> PortRef {
    PortRef {
        namespace: get_field(&v[..NS_LEN]),
        name: get_field(&v[NS_LEN..NS_LEN + NAME_LEN]),
        port_name: get_field(&v[NS_LEN + NAME_LEN..]),
    }
}

fn unspecified(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// The frontends a service port gets (the same keys [`super::desired`] programs).
pub fn port_frontend_keys(port: &ServicePort, family: IpFamily) -> Vec<FrontendKey> {
    let proto = proto_number(port.protocol);
    let mut keys = vec![FrontendKey {
        addr: port.cluster_ip,
        port: port.port,
        proto,
    }];
    if let Some(node_port) = port.node_port {
        keys.push(FrontendKey {
            addr: unspecified(family),
            port: node_port,
            proto,
        });
    }
    for addr in port
        .external_ips
        .iter()
        .copied()
        .chain(port.load_balancer_vips())
    {
        keys.push(FrontendKey {
            addr,
            port: port.port,
            proto,
        });
    }
    keys
}

/// The table entries of one service in one family.
fn service_entries(
    state: &FamilyState,
    apply: &ApplyState,
    service: &NamespacedName,
) -> FastMap<u32, NameValue> {
    let mut by_key: FastMap<FrontendKey, PortRef> = FastMap::default();
    for (name, port) in state.services.ports_of(service) {
        for k in port_frontend_keys(port, state.family) {
            by_key.entry(k).or_insert_with(|| PortRef {
                namespace: service.namespace().to_string(),
                name: service.name().to_string(),
                port_name: name.port_name.to_string(),
            });
        }
    }
    apply
        .frontend_ids(state.family, service)
        .into_iter()
        .filter_map(|(k, id)| {
            let port = by_key.get(&k)?;
            Some((key(state.family == IpFamily::V6, id), encode(port)))
        })
        .collect()
}

/// The table and what the agent wrote into it.
pub struct NamesTable {
    map: Box<dyn KvMap<u32, NameValue>>,
    /// A fingerprint of the value written under each key: enough to tell an entry that
    /// needs no write, at 8 bytes instead of the value's 144 (7 MB at 50,000 frontends).
    /// The hasher's seed is random per process, so names cannot be chosen to collide.
    written: FastMap<u32, u64>,
    fingerprints: foldhash::quality::RandomState,
    /// The keys written for each service: a boxed slice, not a `Vec`, as the lists never
    /// grow (8 bytes less in each of 50,000 entries).
    by_service: FastMap<(IpFamily, NamespacedName), Box<[u32]>>,
    loaded: bool,
}

/// Opens the pinned table under `maps_dir`, creating and pinning it on first use, and
/// giving it a new size when `max_entries` changed.
pub fn open_or_create(maps_dir: &Path, max_entries: u32) -> Result<NamesTable, MapOpError> {
    let path = maps_dir.join(SVC_NAMES);
    if !path.exists() {
        create_pinned(&path, max_entries)?;
    } else if let Ok(info) = MapInfo::from_pin(&path)
        && info.max_entries() != max_entries
    {
        resize_table(maps_dir, &path, max_entries);
    }
    Ok(NamesTable::new(Box::new(open(&path)?)))
}

fn create_pinned(path: &Path, max_entries: u32) -> Result<(), MapOpError> {
    // `pin` consumes the handle: the pin is then opened like an existing one.
    let created = AyaHash::<MapData, u32, NameValue>::create(max_entries, 0).map_err(|source| {
        MapOpError::Kernel {
            map: SVC_NAMES,
            op: "create",
            source,
        }
    })?;
    created.pin(path).map_err(|error| MapOpError::Kernel {
        map: SVC_NAMES,
        op: "pin",
        source: aya::maps::MapError::PinError {
            name: Some(SVC_NAMES.into()),
            error,
        },
    })
}

fn open(path: &Path) -> Result<KernelHash<u32, NameValue>, MapOpError> {
    let kernel = |source| MapOpError::Kernel {
        map: SVC_NAMES,
        op: "open",
        source,
    };
    let data = MapData::from_pin(path).map_err(kernel)?;
    let map: AyaHash<MapData, u32, NameValue> =
        AyaHash::try_from(AyaMap::from_map_data(data).map_err(kernel)?).map_err(kernel)?;
    Ok(KernelHash::new(SVC_NAMES, map))
}

/// Replaces the table by one of `max_entries` with the same entries (its size follows
/// `ebpf.mapSizes.revNat`). Only `inspect` reads it: when that fails, the old one stays.
fn resize_table(maps_dir: &Path, path: &Path, max_entries: u32) {
    let staging = resize::staging_pin(maps_dir, SVC_NAMES);
    let _ = fs::remove_file(&staging);
    let moved = (|| {
        let old = open(path)?;
        create_pinned(&staging, max_entries)?;
        let mut new = open(&staging)?;
        resize::copy_entries(&old, &mut new, false)
    })();
    let outcome = moved.map_err(|e| e.to_string()).and_then(|entries| {
        fs::rename(&staging, path)
            .map(|()| entries)
            .map_err(|e| e.to_string())
    });
    match outcome {
        Ok(entries) => info!(map = SVC_NAMES, to = max_entries, entries, "map resized"),
        Err(e) => {
            let _ = fs::remove_file(&staging);
            warn!(map = SVC_NAMES, error = %e, "the names table keeps its size");
        }
    }
}

impl NamesTable {
    pub fn new(map: Box<dyn KvMap<u32, NameValue>>) -> Self {
        Self {
            map,
            written: FastMap::default(),
            fingerprints: foldhash::quality::RandomState::default(),
            by_service: FastMap::default(),
            loaded: false,
        }
    }

    /// Writes the entries of `changed` services (every programmed service when `full`).
    /// Entries of frontends that are gone are deleted before new ones are written, so an id
    /// handed from one service to another in the same sync ends up with the new name.
    pub fn sync(
        &mut self,
        families: &[FamilyState],
        apply: &ApplyState,
        changed: &HashSet<NamespacedName>,
        full: bool,
    ) -> Result<(), MapOpError> {
        if !self.loaded {
            // What a previous agent left: compared against, never blindly rewritten.
            self.written = self
                .map
                .entries()?
                .into_iter()
                .map(|(id, value)| (id, self.fingerprints.hash_one(value)))
                .collect();
            self.loaded = true;
        }
        let mut todo: FastSet<(IpFamily, NamespacedName)> = FastSet::default();
        for state in families {
            if full {
                todo.extend(state.services.services().map(|s| (state.family, s.clone())));
            } else {
                todo.extend(changed.iter().map(|s| (state.family, s.clone())));
            }
        }
        if full {
            todo.extend(self.by_service.keys().cloned());
            todo.extend(apply.programmed().cloned());
        }
        let mut desired: FastMap<u32, NameValue> = FastMap::default();
        let mut old_ids: FastSet<u32> = FastSet::default();
        for (family, service) in &todo {
            let entries = families
                .iter()
                .find(|s| s.family == *family)
                .map(|state| service_entries(state, apply, service))
                .unwrap_or_default();
            let key = (*family, service.clone());
            if let Some(old) = self.by_service.remove(&key) {
                old_ids.extend(old);
            }
            if !entries.is_empty() {
                self.by_service
                    .insert(key, entries.keys().copied().collect());
            }
            desired.extend(entries);
        }
        if full {
            // Entries nothing owns any more (e.g. left by an agent that ran before).
            let owned: FastSet<u32> = self.by_service.values().flatten().copied().collect();
            old_ids.extend(self.written.keys().filter(|k| !owned.contains(k)));
        }
        for id in old_ids.iter().filter(|id| !desired.contains_key(id)) {
            self.map.delete(id)?;
            self.written.remove(id);
        }
        let changed: Vec<(u32, NameValue)> = desired
            .into_iter()
            .filter(|(id, value)| self.written.get(id) != Some(&self.fingerprints.hash_one(value)))
            .collect();
        // In as few system calls as the map allows (a cold sync writes every name).
        self.map.put_many(&changed)?;
        self.written.extend(
            changed
                .iter()
                .map(|(id, value)| (*id, self.fingerprints.hash_one(value))),
        );
        Ok(())
    }
}

/// Reads a pinned table: `(v6, rev_nat_id)` -> service port. Absent table: empty.
pub fn read_pinned(maps_dir: &Path) -> Result<HashMap<(bool, u32), PortRef>, MapOpError> {
    let path = maps_dir.join(SVC_NAMES);
    if !path.exists() {
        return Ok(HashMap::new());
    }
    Ok(open(&path)?
        .entries()?
        .into_iter()
        .map(|(k, v)| (split_key(k), decode(&v)))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
        model::{ClusterState, IpFamily},
        node::NodeAddresses,
        proxier::{
            NodeContext,
            ebpf::{
                desired::desired_service,
                maps::{LbMaps, MemMap},
            },
        },
    };

    #[test]
    fn values_round_trip_and_keys_split() {
        let p = PortRef {
            namespace: "ns1".into(),
            name: "svc1".into(),
            port_name: "http".into(),
        };
        assert_eq!(decode(&encode(&p)), p);
        assert_eq!(p.to_string(), "ns1/svc1:http");
        assert_eq!(split_key(key(true, 7)), (true, 7));
        assert_eq!(split_key(key(false, 65535)), (false, 65535));
        let largest = proxy_common::MAX_REV_NAT_ID;
        assert_eq!(split_key(key(true, largest)), (true, largest));
        assert_eq!(split_key(key(false, 70_000)), (false, 70_000));
        let long = PortRef {
            namespace: "n".repeat(70),
            name: String::new(),
            port_name: String::new(),
        };
        assert_eq!(decode(&encode(&long)).namespace.len(), NS_LEN - 1);
    }

    #[test]
    fn the_table_follows_the_programmed_frontends() {
        let mut cluster = ClusterState::new(&[IpFamily::V4], "node-a");
        let node = NodeContext {
            name: "node-a".into(),
            primary_ips: NodeAddresses {
                v4: Some("192.168.0.2".parse().unwrap()),
                v6: None,
            },
            host_addresses: vec!["192.168.0.2".parse().unwrap()],
            ..Default::default()
        };
        let svc = mk_service("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .type_("NodePort")
            .node_port("http", 80, "TCP", 3001)
            .external_ips(&["192.168.99.11"])
            .build();
        cluster.service(&Arc::new(svc.clone()), false);
        cluster.endpoint_slice(
            &mk_endpointslice("ns1", "svc1-a", "svc1", "IPv4")
                .port("http", 80, "TCP")
                .endpoint(mk_endpoint("10.180.0.1").node("node-a").build())
                .build(),
            false,
        );
        let changes = cluster.apply_pending();
        let (mut maps, _) = LbMaps::in_memory(64);
        let mut apply = ApplyState::new(64, 64);
        apply
            .sync(&mut maps, cluster.families(), &node, &changes.changed, true)
            .unwrap();
        let log = Arc::default();
        let mut table = NamesTable::new(Box::new(MemMap::new(SVC_NAMES, 64, log)));
        table
            .sync(cluster.families(), &apply, &changes.changed, true)
            .unwrap();

        // Same frontends as the desired state, each with its name.
        let state = &cluster.families()[0];
        let service = NamespacedName::new("ns1", "svc1");
        let desired: HashSet<FrontendKey> = desired_service(&service, state, &node)
            .frontends
            .iter()
            .map(|f| f.key)
            .collect();
        let ids = apply.frontend_ids(IpFamily::V4, &service);
        assert_eq!(ids.iter().map(|(k, _)| *k).collect::<HashSet<_>>(), desired);
        assert_eq!(desired.len(), 3);
        let entries: HashMap<u32, NameValue> = table.map.entries().unwrap().into_iter().collect();
        assert_eq!(entries.len(), 3);
        for (_, id) in &ids {
            assert_eq!(
                decode(&entries[&key(false, *id)]).to_string(),
                "ns1/svc1:http"
            );
        }

        // The service goes: so do its names (a partial sync).
        cluster.service(&Arc::new(svc), true);
        let changes = cluster.apply_pending();
        apply
            .sync(
                &mut maps,
                cluster.families(),
                &node,
                &changes.changed,
                false,
            )
            .unwrap();
        table
            .sync(cluster.families(), &apply, &changes.changed, false)
            .unwrap();
        assert!(table.map.entries().unwrap().is_empty());
    }
}
