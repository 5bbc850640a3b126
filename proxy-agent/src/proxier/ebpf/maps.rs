// SPDX-License-Identifier: Apache-2.0
//! The maps as the apply stage sees them: a small key/value interface implemented by the
//! pinned kernel maps and by an in-memory fake that records every operation, so that the
//! order of writes (the consistency guarantee) is tested without privileges.

use std::{
    collections::HashMap as StdHashMap,
    hash::Hash,
    sync::{Arc, Mutex},
};

use aya::maps::{
    Array, HashMap as AyaHash, IterableMap, MapData, MapError,
    lpm_trie::{Key as LpmKey, LpmTrie},
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend4Value, Backend6Value, NodeAddr4Key, NodeAddr6Key,
    RevNat4Value, RevNat6Value, SourceRange4, SourceRange6, Svc4Key, Svc6Key, SvcValue,
};

#[derive(Debug, thiserror::Error)]
pub enum MapOpError {
    #[error("{map}: {op} failed: {source}")]
    Kernel {
        map: &'static str,
        op: &'static str,
        #[source]
        source: MapError,
    },
    #[error("{map}: map is full ({op})")]
    Full { map: &'static str, op: &'static str },
}

pub type Result<T, E = MapOpError> = std::result::Result<T, E>;

/// One map, keyed and valued by plain-old-data types.
pub trait KvMap<K, V>: Send {
    fn name(&self) -> &'static str;
    /// max_entries: how many entries the map can hold.
    fn capacity(&self) -> Result<usize>;
    fn get(&self, key: &K) -> Result<Option<V>>;
    fn put(&mut self, key: &K, value: &V) -> Result<()>;
    /// Writes every entry, in order, as `put` one after the other would (maps that can
    /// write them in fewer system calls do).
    fn put_many(&mut self, entries: &[(K, V)]) -> Result<()> {
        entries.iter().try_for_each(|(k, v)| self.put(k, v))
    }
    /// Writes every entry of every part: each part in order, the parts in no particular
    /// order (at once, on threads of their own, where the map allows). For entries whose
    /// order matters only within a part.
    fn put_parts(&mut self, parts: &[&[(K, V)]]) -> Result<()> {
        parts.iter().try_for_each(|part| self.put_many(part))
    }
    /// Deleting a missing key is not an error.
    fn delete(&mut self, key: &K) -> Result<()>;
    fn entries(&self) -> Result<Vec<(K, V)>>;
}

fn kernel_err(map: &'static str, op: &'static str, source: MapError) -> MapOpError {
    // E2BIG from an update means the map is at capacity.
    if let MapError::SyscallError(ref e) = source
        && e.io_error.raw_os_error() == Some(libc::E2BIG)
    {
        return MapOpError::Full { map, op };
    }
    MapOpError::Kernel { map, op, source }
}

/// The key is not there (never was, evicted, or deleted meanwhile).
pub(crate) fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound | MapError::ElementNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The kernel's max_entries of a loaded map (a reused pin keeps the size it was created
/// with, whatever the object asks for).
fn kernel_capacity(name: &'static str, map: &MapData) -> Result<usize> {
    let info = map
        .info()
        .map_err(|source| kernel_err(name, "info", source))?;
    Ok(usize::try_from(info.max_entries()).unwrap_or(usize::MAX))
}

/// A kernel hash (or LRU hash) map.
pub struct KernelHash<K: aya::Pod, V: aya::Pod> {
    name: &'static str,
    map: AyaHash<MapData, K, V>,
    /// Whether the kernel refused a batched update (before 5.6): one call per entry then.
    no_batch: bool,
}

impl<K: aya::Pod, V: aya::Pod> KernelHash<K, V> {
    pub fn new(name: &'static str, map: AyaHash<MapData, K, V>) -> Self {
        Self {
            name,
            map,
            no_batch: false,
        }
    }
}

impl<K: aya::Pod + Send + Sync, V: aya::Pod + Send + Sync> KernelHash<K, V> {
    /// Writes `entries` one system call each: what batched updates left (a kernel
    /// without them from now on, when there are any).
    fn put_one_by_one(&mut self, entries: &[(K, V)]) -> Result<()> {
        if !entries.is_empty() {
            self.no_batch = true;
        }
        entries.iter().try_for_each(|(k, v)| self.put(k, v))
    }
}

/// Writes `entries` in order in batched updates of [`BATCH`] entries. Returns what is
/// left when the kernel has no batched updates (for this map): from the first entry it
/// did not write.
fn put_batches<'a, K: aya::Pod, V: aya::Pod>(
    name: &'static str,
    map: &MapData,
    entries: &'a [(K, V)],
) -> Result<&'a [(K, V)]> {
    let mut rest = entries;
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(BATCH));
        let keys: Vec<K> = chunk.iter().map(|(k, _)| *k).collect();
        let values: Vec<V> = chunk.iter().map(|(_, v)| *v).collect();
        match crate::sys::map_update_batch(map, &keys, &values) {
            Ok(_) => rest = after,
            // No batched updates in this kernel (or for this map).
            Err((e, written))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | ENOTSUPP | libc::EOPNOTSUPP)
                ) =>
            {
                return Ok(&rest[(written as usize).min(chunk.len())..]);
            }
            Err((io_error, _)) => {
                let source = MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_batch",
                    io_error,
                });
                return Err(kernel_err(name, "update", source));
            }
        }
    }
    Ok(rest)
}

/// The kernel's own "operation not supported" (not in libc: it never reaches userspace
/// but from bpf(), for a map type without batched operations).
const ENOTSUPP: i32 = 524;

/// Entries per batched update: large enough that the system call costs nothing per entry,
/// small enough that the copies of keys and values stay small.
const BATCH: usize = 8192;

impl<K: aya::Pod + Send + Sync, V: aya::Pod + Send + Sync> KvMap<K, V> for KernelHash<K, V> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn capacity(&self) -> Result<usize> {
        kernel_capacity(self.name, self.map.map())
    }
    fn get(&self, key: &K) -> Result<Option<V>> {
        match self.map.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(kernel_err(self.name, "lookup", e)),
        }
    }
    fn put(&mut self, key: &K, value: &V) -> Result<()> {
        self.map
            .insert(key, value, 0)
            .map_err(|e| kernel_err(self.name, "update", e))
    }
    fn put_many(&mut self, entries: &[(K, V)]) -> Result<()> {
        let rest = if self.no_batch {
            entries
        } else {
            put_batches(self.name, self.map.map(), entries)?
        };
        self.put_one_by_one(rest)
    }
    fn put_parts(&mut self, parts: &[&[(K, V)]]) -> Result<()> {
        let [first, others @ ..] = parts else {
            return Ok(());
        };
        if self.no_batch || others.is_empty() {
            return parts.iter().try_for_each(|part| self.put_many(part));
        }
        // The kernel takes concurrent updates of one hash map (its buckets have locks of
        // their own), so the parts go in on as many threads.
        let (name, map) = (self.name, self.map.map());
        let left: Vec<Result<&[(K, V)]>> = std::thread::scope(|scope| {
            let spawned: Vec<_> = others
                .iter()
                .map(|part| scope.spawn(move || put_batches(name, map, part)))
                .collect();
            let mut left = vec![put_batches(name, map, first)];
            for thread in spawned {
                match thread.join() {
                    Ok(part_left) => left.push(part_left),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            left
        });
        for rest in left {
            self.put_one_by_one(rest?)?;
        }
        Ok(())
    }
    fn delete(&mut self, key: &K) -> Result<()> {
        match self.map.remove(key) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(kernel_err(self.name, "delete", e)),
        }
    }
    fn entries(&self) -> Result<Vec<(K, V)>> {
        match crate::sys::map_lookup_all(self.map.map(), BATCH as u32) {
            Ok(all) => return Ok(all),
            // No batched reads here (or a bucket bigger than a batch): one entry at a time.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | ENOTSUPP | libc::EOPNOTSUPP | libc::ENOSPC)
                ) => {}
            Err(io_error) => {
                let source = MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                });
                return Err(kernel_err(self.name, "iterate", source));
            }
        }
        let mut out = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok(kv) => out.push(kv),
                // An entry deleted while iterating (LRU eviction) is not an error.
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(kernel_err(self.name, "iterate", e)),
            }
        }
        Ok(out)
    }
}

/// A prefix as the agent sees it: (prefix length in bits, data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix<D> {
    pub len: u32,
    pub data: D,
}

/// A kernel LPM trie.
pub struct KernelLpm<D: aya::Pod> {
    name: &'static str,
    map: LpmTrie<MapData, D, u8>,
}

impl<D: aya::Pod> KernelLpm<D> {
    pub fn new(name: &'static str, map: LpmTrie<MapData, D, u8>) -> Self {
        Self { name, map }
    }
}

impl<D: aya::Pod + Send> KvMap<Prefix<D>, u8> for KernelLpm<D> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn capacity(&self) -> Result<usize> {
        kernel_capacity(self.name, self.map.map())
    }
    fn get(&self, key: &Prefix<D>) -> Result<Option<u8>> {
        match self.map.get(&LpmKey::new(key.len, key.data), 0) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(kernel_err(self.name, "lookup", e)),
        }
    }
    fn put(&mut self, key: &Prefix<D>, value: &u8) -> Result<()> {
        self.map
            .insert(&LpmKey::new(key.len, key.data), value, 0)
            .map_err(|e| kernel_err(self.name, "update", e))
    }
    fn delete(&mut self, key: &Prefix<D>) -> Result<()> {
        match self.map.remove(&LpmKey::new(key.len, key.data)) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(kernel_err(self.name, "delete", e)),
        }
    }
    fn entries(&self) -> Result<Vec<(Prefix<D>, u8)>> {
        let mut out = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok((k, v)) => out.push((
                    Prefix {
                        len: k.prefix_len(),
                        data: k.data(),
                    },
                    v,
                )),
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(kernel_err(self.name, "iterate", e)),
            }
        }
        Ok(out)
    }
}

/// One recorded operation of the in-memory fake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put { map: &'static str, key: String },
    Delete { map: &'static str, key: String },
}

/// Shared log of operations across all fake maps, in order.
pub type OpLog = Arc<Mutex<Vec<Op>>>;

/// In-memory map for tests: same semantics as the kernel's (including capacity), and every
/// write appended to a shared log.
pub struct MemMap<K, V> {
    name: &'static str,
    entries: StdHashMap<K, V>,
    capacity: usize,
    log: OpLog,
}

impl<K, V> MemMap<K, V> {
    pub fn new(name: &'static str, capacity: usize, log: OpLog) -> Self {
        Self {
            name,
            entries: StdHashMap::new(),
            capacity,
            log,
        }
    }
}

impl<K, V> KvMap<K, V> for MemMap<K, V>
where
    K: Clone + Eq + Hash + std::fmt::Debug + Send,
    V: Clone + Send,
{
    fn name(&self) -> &'static str {
        self.name
    }
    fn capacity(&self) -> Result<usize> {
        Ok(self.capacity)
    }
    fn get(&self, key: &K) -> Result<Option<V>> {
        Ok(self.entries.get(key).cloned())
    }
    fn put(&mut self, key: &K, value: &V) -> Result<()> {
        if !self.entries.contains_key(key) && self.entries.len() >= self.capacity {
            return Err(MapOpError::Full {
                map: self.name,
                op: "update",
            });
        }
        self.entries.insert(key.clone(), value.clone());
        if let Ok(mut log) = self.log.lock() {
            log.push(Op::Put {
                map: self.name,
                key: format!("{key:?}"),
            });
        }
        Ok(())
    }
    fn delete(&mut self, key: &K) -> Result<()> {
        if self.entries.remove(key).is_some()
            && let Ok(mut log) = self.log.lock()
        {
            log.push(Op::Delete {
                map: self.name,
                key: format!("{key:?}"),
            });
        }
        Ok(())
    }
    fn entries(&self) -> Result<Vec<(K, V)>> {
        Ok(self
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

pub type Map<K, V> = Box<dyn KvMap<K, V>>;

/// The Maglev tables: one array of backend ids, table `t` at entries
/// `t * size..(t + 1) * size` (see `proxy_common::maps::MAGLEV`).
pub trait MaglevTables: Send {
    /// Entries of the map (tables times their size).
    fn capacity(&self) -> Result<usize>;
    /// Writes `table` as table `index` (`table.len()` is the table size).
    fn write(&mut self, index: u16, table: &[u32]) -> Result<()>;
    /// Table `index` of `size` entries as the map holds it.
    fn read(&self, index: u16, size: u32) -> Result<Vec<u32>>;
}

/// The first entry of table `index` and the end of its entries, checked against the map.
fn table_range(name: &'static str, capacity: usize, index: u16, size: usize) -> Result<(u32, u32)> {
    let start = usize::from(index) * size;
    let end = start + size;
    match (u32::try_from(start), u32::try_from(end)) {
        (Ok(start), Ok(end)) if end as usize <= capacity => Ok((start, end)),
        _ => Err(MapOpError::Full {
            map: name,
            op: "update",
        }),
    }
}

/// The kernel's Maglev array.
pub struct KernelMaglev {
    map: Array<MapData, u32>,
}

impl KernelMaglev {
    const NAME: &'static str = proxy_common::maps::MAGLEV;

    pub fn new(map: Array<MapData, u32>) -> Self {
        Self { map }
    }
}

impl MaglevTables for KernelMaglev {
    fn capacity(&self) -> Result<usize> {
        Ok(self.map.len() as usize)
    }
    fn write(&mut self, index: u16, table: &[u32]) -> Result<()> {
        let (start, _) = table_range(Self::NAME, self.capacity()?, index, table.len())?;
        // No batch update in aya: one update per entry. A program reading the table meanwhile
        // finds either entry valid (see `apply`: a table is written before any slot 0 points
        // at it, and is never rewritten while one does).
        for (i, id) in (start..).zip(table) {
            self.map
                .set(i, id, 0)
                .map_err(|e| kernel_err(Self::NAME, "update", e))?;
        }
        Ok(())
    }
    fn read(&self, index: u16, size: u32) -> Result<Vec<u32>> {
        let (start, end) = table_range(Self::NAME, self.capacity()?, index, size as usize)?;
        (start..end)
            .map(|i| {
                self.map
                    .get(&i, 0)
                    .map_err(|e| kernel_err(Self::NAME, "lookup", e))
            })
            .collect()
    }
}

/// In-memory Maglev tables for tests: a write is one logged operation (`table N`).
pub struct MemMaglev {
    tables: StdHashMap<u16, Vec<u32>>,
    capacity: usize,
    log: OpLog,
}

impl MemMaglev {
    pub fn new(capacity: usize, log: OpLog) -> Self {
        Self {
            tables: StdHashMap::new(),
            capacity,
            log,
        }
    }
}

impl MaglevTables for MemMaglev {
    fn capacity(&self) -> Result<usize> {
        Ok(self.capacity)
    }
    fn write(&mut self, index: u16, table: &[u32]) -> Result<()> {
        let name = proxy_common::maps::MAGLEV;
        table_range(name, self.capacity, index, table.len())?;
        self.tables.insert(index, table.to_vec());
        if let Ok(mut log) = self.log.lock() {
            log.push(Op::Put {
                map: name,
                key: format!("table {index}"),
            });
        }
        Ok(())
    }
    fn read(&self, index: u16, size: u32) -> Result<Vec<u32>> {
        table_range(
            proxy_common::maps::MAGLEV,
            self.capacity,
            index,
            size as usize,
        )?;
        Ok(self
            .tables
            .get(&index)
            .cloned()
            .unwrap_or_else(|| vec![0; size as usize]))
    }
}

/// Every map the agent writes.
pub struct LbMaps {
    pub svc4: Map<Svc4Key, SvcValue>,
    pub svc6: Map<Svc6Key, SvcValue>,
    pub backends4: Map<u32, Backend4Value>,
    pub backends6: Map<u32, Backend6Value>,
    pub rev_nat4: Map<u32, RevNat4Value>,
    pub rev_nat6: Map<u32, RevNat6Value>,
    pub affinity: Map<AffinityKey, AffinityValue>,
    pub svc_cidrs4: Map<Prefix<[u8; 4]>, u8>,
    pub svc_cidrs6: Map<Prefix<[u8; 16]>, u8>,
    pub nodeport_addrs4: Map<NodeAddr4Key, u8>,
    pub nodeport_addrs6: Map<NodeAddr6Key, u8>,
    pub src_ranges4: Map<Prefix<SourceRange4>, u8>,
    pub src_ranges6: Map<Prefix<SourceRange6>, u8>,
    pub maglev: Box<dyn MaglevTables>,
}

impl LbMaps {
    /// Fake maps sharing one operation log, with the given capacity each.
    pub fn in_memory(capacity: usize) -> (Self, OpLog) {
        Self::in_memory_with(|_| capacity)
    }

    /// Fake maps sharing one operation log, each with the capacity `capacity_of` gives
    /// its name.
    pub fn in_memory_with(capacity_of: impl Fn(&'static str) -> usize) -> (Self, OpLog) {
        use proxy_common::maps::*;
        let log: OpLog = Arc::default();
        fn mem<K, V>(
            name: &'static str,
            capacity_of: &impl Fn(&'static str) -> usize,
            log: &OpLog,
        ) -> Box<MemMap<K, V>> {
            Box::new(MemMap::new(name, capacity_of(name), log.clone()))
        }
        let (c, l) = (&capacity_of, &log);
        let maps = Self {
            svc4: mem(SVC4, c, l),
            svc6: mem(SVC6, c, l),
            backends4: mem(BACKENDS4, c, l),
            backends6: mem(BACKENDS6, c, l),
            rev_nat4: mem(REV_NAT4, c, l),
            rev_nat6: mem(REV_NAT6, c, l),
            affinity: mem(AFFINITY, c, l),
            svc_cidrs4: mem(SVC_CIDRS4, c, l),
            svc_cidrs6: mem(SVC_CIDRS6, c, l),
            nodeport_addrs4: mem(NODEPORT_ADDRS4, c, l),
            nodeport_addrs6: mem(NODEPORT_ADDRS6, c, l),
            src_ranges4: mem(SRC_RANGES4, c, l),
            src_ranges6: mem(SRC_RANGES6, c, l),
            maglev: Box::new(MemMaglev::new(capacity_of(MAGLEV), log.clone())),
        };
        (maps, log)
    }
}
