// SPDX-License-Identifier: Apache-2.0
//! Maglev tables in the apply stage: which frontends use one, which table each uses, and
//! when a table is written.
//!
//! **One table per distinct backend set**, not per frontend: the ClusterIP, NodePort,
//! externalIPs and LB IPs of a service port with eTP=Cluster share one backend set, hence
//! one table. Tables are ids of an [`IdAllocator`] keyed by the set (the sorted backend
//! identities), counted by reference like backend ids; table `id - 1` is the one in the
//! map, and the frontend's external slot 0 carries its index and the `MAGLEV` flag. Only
//! the external scope gets a table: it is what traffic from outside the node uses (with
//! eTP=Local it holds this node's endpoints only, so the table does too).
//!
//! **Writes never touch a table in use.** A backend set that changes is a new key, hence a
//! new table id: the table is written in full (phase `maglev_puts`, after the backends it
//! names and before any slot 0) and only then does the slot 0 switch to it; the table the
//! frontend used before is released and, like every released id, handed out again only
//! after the sync has ended, when no slot 0 points at it any more. So no packet ever reads
//! a half-written table, and a sync costs the tables of the sets that changed (a set that
//! stays keeps its id and is not rewritten, also on full syncs).
//!
//! **A restart** reads the tables in use back from the slot 0s and their slots (the set of
//! each) and adopts their ids, so that new tables never land on one a live frontend reads;
//! its first full sync writes every table it uses once, as the map may have been created
//! afresh (a new table size) or left half-written by the previous agent.
//!
//! When no table id is left, the frontend is programmed without Maglev (random choice)
//! and a warning names `ebpf.mapSizes.maglevTables`; every full sync tries again.
//!
//! **Why one flat array** (`MAGLEV_V1`, entry `table * size + i`) and not Cilium's outer
//! hash of inner arrays (`cilium_lb4_maglev`): the table size is a setting, so it cannot be
//! a compile-time value size, and with an outer map every table would be an inner map the
//! agent creates from userspace, keeps open or pinned by itself, and finds again after a
//! restart, outside the pinning, resizing and layout-upgrade machinery every other map goes
//! through (`loader`, `resize`, `upgrade`: one pin per map name). The flat array is one more
//! pinned map; the size lives in `MAGLEV_CONFIG_V1`, written before the programs attach; a
//! change of size or of table count replaces both pins at start-up (`resize`). What it
//! costs: the array is preallocated for all `maglevTables`, used or not (4 MiB at the
//! defaults).

use std::collections::BTreeMap;

use proxy_common::{
    SCOPE_EXTERNAL, maglev::DEFAULT_TABLE_SIZE, maps::DEFAULT_MAGLEV_TABLES, svc_flags,
};
use tracing::warn;

use super::{AppliedService, Plan};
use crate::{
    model::LoadBalancerAlgorithm,
    proxier::ebpf::{
        desired::{BackendAddr, Scope},
        entries::{Snapshot, SvcEntryKey},
        ids::IdAllocator,
    },
};

/// The key of a table: the backend identities of its set, sorted, each once.
pub(super) type BackendSet = Vec<BackendAddr>;

/// A table to write: its index and its backends with this node's ids.
pub(super) type TableWrites = BTreeMap<u16, Vec<(BackendAddr, u32)>>;

/// The Maglev settings and the tables in use.
#[derive(Debug)]
pub(super) struct MaglevState {
    /// The configured algorithm, for services without the annotation.
    pub default: LoadBalancerAlgorithm,
    /// Entries per table.
    pub size: u32,
    ids: IdAllocator<BackendSet>,
    /// Write every table acquired (the first sync after adopting, or after a failed one).
    rewrite: bool,
}

impl MaglevState {
    pub fn new(default: LoadBalancerAlgorithm, size: u32, tables: u32) -> Self {
        Self {
            default,
            size,
            // Table indices are u16 (slot 0's `maglev_table`).
            ids: IdAllocator::new("maglev table", u64::from(tables.min(u32::from(u16::MAX)))),
            rewrite: true,
        }
    }

    /// The same settings with no table in use (every table is written again).
    pub fn fresh(&self) -> Self {
        Self {
            default: self.default,
            size: self.size,
            ids: IdAllocator::new("maglev table", self.ids.max()),
            rewrite: true,
        }
    }

    /// Whether a frontend whose service asks for `chosen` uses Maglev.
    pub fn applies(&self, chosen: Option<LoadBalancerAlgorithm>) -> bool {
        chosen.unwrap_or(self.default) == LoadBalancerAlgorithm::Maglev
    }

    /// Takes a reference on the table of `scope`'s backends (whose ids are `ids`, in the
    /// same order), planning its write when it is new; returns its index, or None when no
    /// table is left (the frontend then goes without).
    pub fn acquire(
        &mut self,
        scope: &Scope,
        ids: &[u32],
        out: &mut AppliedService,
        plan: &mut Plan,
    ) -> Option<u16> {
        let mut members: Vec<(BackendAddr, u32)> = scope
            .backends
            .iter()
            .map(|b| b.addr)
            .zip(ids.iter().copied())
            .collect();
        members.sort_by_key(|(addr, _)| *addr);
        members.dedup_by_key(|(addr, _)| *addr);
        let key: BackendSet = members.iter().map(|(addr, _)| *addr).collect();
        let fresh = self.ids.get(&key).is_none();
        let id = match self.ids.acquire(&key) {
            Ok(id) => id,
            Err(exhausted) => {
                warn!(
                    error = %exhausted,
                    "no Maglev table left: a frontend picks its backends at random until one is free; raise ebpf.mapSizes.maglevTables"
                );
                return None;
            }
        };
        let index = (id - 1) as u16;
        if fresh {
            plan.fresh_maglev.insert(id);
        }
        if fresh || self.rewrite {
            plan.maglev_puts.insert(index, members);
        }
        out.maglev.push(key);
        Some(index)
    }

    /// Drops the references `old` held (their tables are reused after the sync).
    pub fn release(&mut self, old: &AppliedService) {
        for key in &old.maglev {
            self.ids.release(key);
        }
    }

    /// Makes the tables a refused plan took first available again at once (nothing was
    /// written for them).
    pub fn forget(&mut self, plan: &Plan) {
        for id in &plan.fresh_maglev {
            self.ids.forget(*id);
        }
    }

    /// Adopts the tables a previous agent's slot 0s point at, each under its backend set
    /// as the maps hold it.
    pub fn adopt(&mut self, actual: &Snapshot) {
        for (key, value) in &actual.svc {
            if key.slot != 0 || key.scope != SCOPE_EXTERNAL || value.flags & svc_flags::MAGLEV == 0
            {
                continue;
            }
            let v6 = key.frontend.addr.is_ipv6();
            let mut set: BackendSet = (1..=value.count)
                .filter_map(|slot| actual.svc.get(&SvcEntryKey { slot, ..*key }))
                .filter_map(|slot| actual.backends.get(&(v6, slot.backend_id)))
                .map(|entry| entry.addr)
                .collect();
            set.sort();
            set.dedup();
            self.ids.adopt(set, u64::from(value.maglev_table) + 1);
        }
        self.rewrite = true;
    }

    /// After admission: adopted tables no service took are released.
    pub fn drop_unreferenced(&mut self) {
        self.ids.drop_unreferenced();
    }

    /// After the writes: released tables become available; whether the next sync must
    /// rewrite every table it uses (after a failed one: the tables may be half written).
    pub fn finish(&mut self, writes_failed: bool) {
        self.ids.recycle();
        self.rewrite = writes_failed;
    }
}

impl Default for MaglevState {
    fn default() -> Self {
        Self::new(
            LoadBalancerAlgorithm::default(),
            DEFAULT_TABLE_SIZE,
            DEFAULT_MAGLEV_TABLES as u32,
        )
    }
}

/// The frontend flags and table index of an external scope that uses `table`.
pub(super) fn with_table(flags: u16, table: Option<u16>) -> (u16, u16) {
    match table {
        Some(index) => (flags | svc_flags::MAGLEV, index),
        None => (flags, 0),
    }
}
