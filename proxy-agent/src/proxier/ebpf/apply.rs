// SPDX-License-Identifier: Apache-2.0
//! Turning desired services into ordered map writes.
//!
//! Lookups must never see a half-written service (after Cilium's lb.h): backends and
//! reverse-NAT entries are written before any slot refers to them; a frontend's slots
//! 1..n before its slot 0 (which publishes the count), the internal scope before the
//! external slot 0 that announces it; shrinking publishes the smaller count first and
//! deletes the extra slots after; a vanishing frontend loses its slot 0 first; entries
//! nothing refers to any more go last.
//!
//! Partial syncs diff each changed service against what was written for it; full syncs
//! compare everything with what the maps actually hold, which repairs drift and adopts the
//! maps a previous agent left behind without rewriting identical entries.
//!
//! When the maps are full, services are admitted whole or not at all, in a fixed order
//! (see `admission`): what does not fit is reported and retried at every sync. With
//! ceilings (see `growth`), admission counts on the room the maps may grow to, and a sync
//! is planned ([`ApplyState::plan`]) before it is written ([`ApplyState::execute`]), so
//! that the maps can grow in between, before anything is written.
//!
//! Frontends that use Maglev get a table written before the slot 0 that points at it, and
//! a table in use is never rewritten (see `maglev`).

mod admission;
pub mod ahead;
mod maglev;

use std::net::IpAddr;

// foldhash, not SipHash: a cold sync of 100,000 services hashes every entry several times
// here, and SipHash showed as a tenth of the sync thread's time. The keys are addresses
// and names from the cluster; foldhash's per-process random seed keeps them from being
// chosen to collide.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use ipnet::IpNet;
use proxy_common::{SCOPE_EXTERNAL, SCOPE_INTERNAL, SvcValue, svc_flags};
use tracing::{debug, warn};

use self::{
    admission::Refusals,
    maglev::{BackendSet, MaglevState, TableWrites, with_table},
};
use super::{
    budget::{Budget, MapKind, PerMap},
    desired::{BackendAddr, DesiredService, FrontendKey, Scope},
    entries::{BackendEntry, Snapshot, SvcEntryKey},
    growth::Ceilings,
    ids::{Exhausted, IdAllocator},
    maps::{LbMaps, MapOpError},
};
use crate::{
    model::{FamilyState, IpFamily, NamespacedName},
    parallel,
    proxier::{NodeContext, SyncStats},
    sorted::{SortedMap, SortedSet},
};

/// A planned sync of this many map writes or more runs [`ApplyState::execute_alongside`]'s
/// other work on another thread.
const PARALLEL_WRITE_MIN: usize = 16_384;
/// A partial sync of this many services or more writes its backend and reverse-NAT
/// entries while it admits them (see the `ahead` module).
const WRITE_AHEAD_MIN: usize = 4_096;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Map(#[from] MapOpError),
}

/// One map operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutBackend(u32, BackendEntry),
    PutRevNat(u32, IpAddr, u16),
    PutSrcRange(u32, IpNet),
    PutSvc(SvcEntryKey, SvcValue),
    PutNodePortAddr(IpAddr),
    PutSvcCidr(IpNet),
    DelSvc(SvcEntryKey),
    DelSrcRange(u32, IpNet),
    DelRevNat(bool, u32),
    DelBackend(bool, u32),
    DelNodePortAddr(IpAddr),
    DelSvcCidr(IpNet),
    /// Writes Maglev table `index` for these backends (identity, id), built at write time.
    PutMaglevTable(u16, Vec<(BackendAddr, u32)>),
}

/// The flags of a backend's entry (its address is the allocator's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackendFlags {
    local: bool,
    terminating: bool,
}

impl BackendFlags {
    fn of(entry: &BackendEntry) -> Self {
        Self {
            local: entry.local,
            terminating: entry.terminating,
        }
    }

    fn entry(self, addr: BackendAddr) -> BackendEntry {
        BackendEntry {
            addr,
            local: self.local,
            terminating: self.terminating,
        }
    }
}

/// What has been written for one service of one family, and the ids it holds.
#[derive(Clone, Debug, Default)]
struct AppliedService {
    svc: SortedMap<SvcEntryKey, SvcValue>,
    src_ranges: SortedSet<(u32, IpNet)>,
    /// One reference on the rev_nat id of each.
    frontends: Vec<FrontendKey>,
    /// One reference on the backend id of each occurrence.
    backends: Vec<BackendAddr>,
    /// (rev_nat_id, backend ids) of frontends with session affinity.
    affinity: Vec<(u32, Vec<u32>)>,
    /// One reference on the Maglev table of each frontend that uses one.
    maglev: Vec<BackendSet>,
    no_local_internal: bool,
    no_local_external: bool,
}

impl AppliedService {
    /// Gives back what building left unused: the record is kept for as long as the
    /// service is programmed, 50,000 of them in a big cluster.
    fn shrink_to_fit(&mut self) {
        self.svc.shrink_to_fit();
        self.src_ranges.shrink_to_fit();
        self.frontends.shrink_to_fit();
        self.backends.shrink_to_fit();
        self.affinity.shrink_to_fit();
        self.maglev.shrink_to_fit();
    }
}

/// The agent's memory of the maps: ids and per-service entries.
#[derive(Debug)]
pub struct ApplyState {
    /// With the flags of the entry written for each backend (None until one is).
    backend_ids: IdAllocator<BackendAddr, Option<BackendFlags>>,
    rev_nat_ids: IdAllocator<FrontendKey>,
    owners: HashMap<FrontendKey, (IpFamily, NamespacedName)>,
    services: HashMap<(IpFamily, NamespacedName), AppliedService>,
    nodeport_addrs: HashSet<IpAddr>,
    svc_cidrs: HashSet<IpNet>,
    adopted: bool,
    /// Services that did not fit at the last sync: tried again at every sync until they do.
    deferred: HashSet<(IpFamily, NamespacedName)>,
    /// The entries of each budgeted map after the last sync, kept up to date from what
    /// each sync adds and deletes, so that a partial sync costs what its services cost,
    /// not a count over every service. None until the first sync and after a failed one
    /// (then counted afresh); every full sync counts the maps themselves.
    counted: Option<PerMap>,
    /// Services in `services` with no local endpoint for a Local internal / external
    /// traffic policy (kept as they come and go, for the same reason as `counted`).
    no_local: (usize, usize),
    maglev: MaglevState,
    /// What the maps may grow to (None: they keep their size).
    ceilings: Option<Ceilings>,
}

/// A sync planned and not written yet: the operations in their safe order and what the
/// maps hold at its peak.
#[derive(Debug)]
pub struct PlannedSync {
    ops: Vec<Op>,
    budget: Budget,
    refusals: Refusals,
    dead_frontends: HashSet<u32>,
    dead_pairs: HashSet<(u32, u32)>,
    /// Entries written while the sync was planned (see the `ahead` module).
    written_ahead: usize,
}

/// A sync whose services are known and not admitted yet (see [`ApplyState::prepare`]).
pub struct PreparedSync {
    /// What the maps hold (a full sync only).
    actual: Option<Snapshot>,
    budget: Budget,
    candidates: Vec<admission::Candidate>,
    estimated_peak: PerMap,
}

/// What a sync read of the maps before looking at its services (see
/// [`ApplyState::read_maps`]).
pub struct MapsRead {
    /// What the maps hold (a full sync only).
    actual: Option<Snapshot>,
    budget: Budget,
}

impl PreparedSync {
    /// The entries each budgeted map would hold at the peak of the sync if every service
    /// got in: what the maps hold plus what the services add beyond what they have. A
    /// backend two services share counts for each; a service that replaces entries by as
    /// many new ones adds nothing here, so the plan's peak can be higher. Known before
    /// admission, it lets the maps grow while the services are admitted instead of after.
    pub fn estimated_peak(&self) -> &PerMap {
        &self.estimated_peak
    }

    /// The services to admit, as `family/namespace/name`, in admission order.
    #[cfg(test)]
    pub fn candidate_names(&self) -> Vec<String> {
        self.candidates
            .iter()
            .map(admission::Candidate::label)
            .collect()
    }
}

impl PlannedSync {
    /// The entries of each budgeted map at the peak of the sync: what they held, plus what
    /// the admitted services add (deletes come after).
    pub fn peak(&self) -> &PerMap {
        self.budget.used()
    }
}

fn v6(addr: &IpAddr) -> bool {
    addr.is_ipv6()
}

impl ApplyState {
    pub fn new(max_backends: u32, max_rev_nat: u32) -> Self {
        Self {
            backend_ids: IdAllocator::new("backend", u64::from(max_backends)),
            rev_nat_ids: IdAllocator::new(
                "rev_nat",
                u64::from(max_rev_nat.min(proxy_common::MAX_REV_NAT_ID)),
            ),
            owners: HashMap::new(),
            services: HashMap::new(),
            nodeport_addrs: HashSet::new(),
            svc_cidrs: HashSet::new(),
            adopted: false,
            deferred: HashSet::new(),
            counted: None,
            no_local: (0, 0),
            maglev: MaglevState::default(),
            ceilings: None,
        }
    }

    /// Lets admission count on the maps growing up to `ceilings` (the caller grows them
    /// between [`ApplyState::plan`] and [`ApplyState::execute`]).
    pub fn with_ceilings(mut self, ceilings: Ceilings) -> Self {
        self.ceilings = Some(ceilings);
        self
    }

    /// From now on, admission counts on the maps' own capacity (growing failed).
    pub fn stop_growing(&mut self) {
        self.ceilings = None;
    }

    /// Sets the Maglev settings: the configured algorithm, the entries of a table, and how
    /// many tables the map holds.
    pub fn with_maglev(
        mut self,
        default: crate::model::LoadBalancerAlgorithm,
        table_size: u32,
        tables: u32,
    ) -> Self {
        self.maglev = MaglevState::new(default, table_size, tables);
        self
    }

    /// Takes over the reverse-NAT ids an agent of the previous map layout gave its
    /// frontends (`upgrade::previous_rev_nat_ids`), before the first sync adopts
    /// what this layout's maps hold: the same frontend keeps its id across the upgrade, so
    /// conntrack entries and connected sockets, which keep their maps, still name it.
    pub fn inherit_rev_nat_ids(&mut self, ids: impl IntoIterator<Item = (FrontendKey, u32)>) {
        for (frontend, id) in ids {
            self.rev_nat_ids.adopt(frontend, u64::from(id));
        }
    }

    /// Takes ids over from maps a previous agent left, so that identical entries keep
    /// their ids and need no write.
    fn adopt(&mut self, actual: &Snapshot) {
        for ((_, id), entry) in &actual.backends {
            self.backend_ids
                .adopt_with(entry.addr, u64::from(*id), Some(BackendFlags::of(entry)));
        }
        for (key, value) in &actual.svc {
            if key.names_frontend(value.flags) {
                self.rev_nat_ids
                    .adopt(key.frontend, u64::from(value.rev_nat_id));
            }
        }
        self.maglev.adopt(actual);
        self.adopted = true;
    }

    /// Acquires ids for `desired` and builds its entries into `out` (which holds what was
    /// acquired even when an id runs out, so that it can be released). Frontends another
    /// service owns already are skipped with a warning (first come, first served). Backend
    /// entries to write go to `ops` only: they are remembered once the service is admitted.
    fn build(
        &mut self,
        family: IpFamily,
        service: &NamespacedName,
        desired: &DesiredService,
        out: &mut AppliedService,
        ops: &mut Plan,
    ) -> Result<(), Exhausted> {
        out.no_local_internal = desired.no_local_internal;
        out.no_local_external = desired.no_local_external;
        // Sized once for what follows (each grew step by step, a cold sync's hundred
        // thousand services over).
        let scopes = desired
            .frontends
            .iter()
            .map(|f| 1 + usize::from(f.internal.is_some()))
            .sum::<usize>();
        let backends = desired.backend_slots();
        out.frontends.reserve(desired.frontends.len());
        out.backends.reserve(backends);
        out.svc.reserve(backends + scopes + desired.wildcards.len());
        ops.backend_entries.reserve(backends);
        ops.backend_puts.reserve(backends);
        ops.fresh_backends.reserve(backends);
        for frontend in &desired.frontends {
            let owner = (family, service.clone());
            match self.owners.get(&frontend.key) {
                Some(o) if *o != owner => {
                    warn!(
                        service = %service,
                        frontend = ?frontend.key,
                        owner = %o.1,
                        "frontend already used by another service; skipped"
                    );
                    continue;
                }
                _ => {}
            }
            let acquired = self.rev_nat_ids.acquire_looked(&frontend.key)?;
            let rev_nat_id = acquired.id as u32;
            if acquired.fresh {
                ops.rev_nat_puts.push(Op::PutRevNat(
                    rev_nat_id,
                    frontend.key.addr,
                    frontend.key.port,
                ));
                ops.fresh_rev_nat.push(rev_nat_id);
            }
            self.owners.insert(frontend.key, owner);
            out.frontends.push(frontend.key);

            let mut scopes = vec![(SCOPE_EXTERNAL, &frontend.external)];
            if let Some(internal) = &frontend.internal {
                scopes.push((SCOPE_INTERNAL, internal));
            }
            for (scope_id, scope) in scopes {
                let ids = self.backend_slots(scope, out, ops)?;
                // Flows from outside the node use the external scope: it alone gets a table.
                let table = (scope_id == SCOPE_EXTERNAL
                    && !ids.is_empty()
                    && self.maglev.applies(frontend.load_balancer_algorithm))
                .then(|| self.maglev.acquire(scope, &ids, out, ops))
                .flatten();
                let (flags, maglev_table) = with_table(scope.flags, table);
                for (i, id) in ids.iter().enumerate() {
                    out.svc.insert(
                        SvcEntryKey {
                            frontend: frontend.key,
                            scope: scope_id,
                            slot: (i + 1) as u16,
                        },
                        SvcValue {
                            backend_id: *id,
                            rev_nat_id,
                            ..Default::default()
                        },
                    );
                }
                out.svc.insert(
                    SvcEntryKey {
                        frontend: frontend.key,
                        scope: scope_id,
                        slot: 0,
                    },
                    SvcValue {
                        backend_id: frontend.affinity_timeout.unwrap_or(0),
                        count: ids.len() as u16,
                        rev_nat_id,
                        flags,
                        maglev_table,
                        _pad: 0,
                    },
                );
                if frontend.affinity_timeout.is_some() {
                    out.affinity.push((rev_nat_id, ids));
                }
            }
            for range in &frontend.source_ranges {
                out.src_ranges.insert((rev_nat_id, *range));
            }
        }
        for ip in &desired.wildcards {
            out.svc.insert(
                SvcEntryKey::wildcard(*ip),
                SvcValue {
                    flags: svc_flags::WILDCARD,
                    ..Default::default()
                },
            );
        }
        Ok(())
    }

    /// Acquires the backend ids of one scope (planning writes of new or changed backends).
    fn backend_slots(
        &mut self,
        scope: &Scope,
        out: &mut AppliedService,
        ops: &mut Plan,
    ) -> Result<Vec<u32>, Exhausted> {
        let mut ids = Vec::with_capacity(scope.backends.len());
        for b in &scope.backends {
            let entry = BackendEntry {
                addr: b.addr,
                local: b.local,
                terminating: b.terminating,
            };
            let acquired = self.backend_ids.acquire_looked(&b.addr)?;
            let id = acquired.id as u32;
            out.backends.push(b.addr);
            // A fresh id is this plan's first reference: nothing is known of its entry.
            let known = if acquired.fresh {
                ops.fresh_backends.push(id);
                None
            } else {
                ops.backend_entries
                    .get(&b.addr)
                    .copied()
                    .or_else(|| acquired.payload.map(|flags| flags.entry(b.addr)))
            };
            if known != Some(entry) {
                ops.backend_entries.insert(b.addr, entry);
                ops.backend_puts.push(Op::PutBackend(id, entry));
            }
            ids.push(id);
        }
        Ok(ids)
    }

    /// Drops the references `old` held; ids that became free get their entries deleted.
    fn release(
        &mut self,
        family: IpFamily,
        service: &NamespacedName,
        old: &AppliedService,
        ops: &mut Plan,
    ) {
        for key in &old.frontends {
            if let Some(id) = self.rev_nat_ids.release(key) {
                ops.rev_nat_dels
                    .push(Op::DelRevNat(v6(&key.addr), id as u32));
                ops.dead_rev_nat.insert(id as u32);
                if self.owners.get(key) == Some(&(family, service.clone())) {
                    self.owners.remove(key);
                }
            }
        }
        self.maglev.release(old);
        for addr in &old.backends {
            if let Some(id) = self.backend_ids.release(addr) {
                ops.backend_dels
                    .push(Op::DelBackend(v6(&addr.addr), id as u32));
            }
        }
    }
}

/// Operations grouped by phase; [`Plan::ordered`] flattens them in the safe order.
#[derive(Debug, Default)]
struct Plan {
    backend_puts: Vec<Op>,
    rev_nat_puts: Vec<Op>,
    range_puts: Vec<Op>,
    svc_puts: Vec<(SvcEntryKey, SvcValue)>,
    node_puts: Vec<Op>,
    /// Maglev tables, written after the backends they name and before any slot 0.
    maglev_puts: TableWrites,
    svc_dels: Vec<SvcEntryKey>,
    range_dels: Vec<Op>,
    rev_nat_dels: Vec<Op>,
    backend_dels: Vec<Op>,
    node_dels: Vec<Op>,
    /// rev_nat ids whose affinity entries must go (frontend gone or backends removed).
    dead_rev_nat: HashSet<u32>,
    dead_affinity: HashSet<(u32, u32)>,
    /// Backend entries one service's plan writes, remembered by the state once the
    /// service is admitted (not carried over by [`Plan::absorb`]).
    backend_entries: HashMap<BackendAddr, BackendEntry>,
    /// Ids handed out for the first time by one service's plan (their entries are new;
    /// these three are not carried over by [`Plan::absorb`] either).
    fresh_backends: Vec<u32>,
    fresh_rev_nat: Vec<u32>,
    /// Maglev table ids handed out for the first time by this plan.
    fresh_maglev: HashSet<u64>,
}

impl Plan {
    /// Takes over the operations of `other` (an admitted service's).
    fn absorb(&mut self, other: Plan) {
        self.backend_puts.extend(other.backend_puts);
        self.rev_nat_puts.extend(other.rev_nat_puts);
        self.range_puts.extend(other.range_puts);
        self.svc_puts.extend(other.svc_puts);
        self.node_puts.extend(other.node_puts);
        self.svc_dels.extend(other.svc_dels);
        self.range_dels.extend(other.range_dels);
        self.rev_nat_dels.extend(other.rev_nat_dels);
        self.backend_dels.extend(other.backend_dels);
        self.node_dels.extend(other.node_dels);
        self.dead_rev_nat.extend(other.dead_rev_nat);
        self.dead_affinity.extend(other.dead_affinity);
        self.maglev_puts.extend(other.maglev_puts);
        // `backend_entries` and the `fresh_*` sets serve one service's admission only (the
        // state keeps the admitted entries with their ids): gathering them here cost a
        // million hash inserts in a cold sync of 100,000 services.
    }

    /// Plans the writes that turn `old` into `new`; with `entries` false, only the affinity
    /// entries that must go (a full sync plans its writes from what the maps hold instead,
    /// see [`ApplyState::reconcile`]).
    fn diff_service(&mut self, old: &AppliedService, new: &AppliedService, entries: bool) {
        self.diff_affinity(old, new);
        if !entries {
            return;
        }
        let first = self.svc_puts.len();
        for (k, v) in &new.svc {
            if old.svc.get(k) != Some(v) {
                self.svc_puts.push((*k, *v));
            }
        }
        // A frontend's entries are all this service's: their order is settled here, on
        // a few entries, instead of in one sort of every entry of the sync.
        order_svc_puts(&mut self.svc_puts[first..]);
        for k in old.svc.keys() {
            if !new.svc.contains_key(k) {
                self.svc_dels.push(*k);
            }
        }
        for r in new.src_ranges.difference(&old.src_ranges) {
            self.range_puts.push(Op::PutSrcRange(r.0, r.1));
        }
        for r in old.src_ranges.difference(&new.src_ranges) {
            self.range_dels.push(Op::DelSrcRange(r.0, r.1));
        }
    }

    /// The affinity entries of `old` that could send a client to a backend `new` dropped.
    fn diff_affinity(&mut self, old: &AppliedService, new: &AppliedService) {
        for (id, old_ids) in &old.affinity {
            let now: HashSet<u32> = new
                .affinity
                .iter()
                .filter(|(i, _)| i == id)
                .flat_map(|(_, ids)| ids.iter().copied())
                .collect();
            for b in old_ids {
                if !now.contains(b) {
                    self.dead_affinity.insert((*id, *b));
                }
            }
        }
    }

    /// What [`Plan::ordered`] returns besides the operations (a full sync writes from what
    /// the maps hold, not from this plan's operations).
    fn into_dead(self) -> (HashSet<u32>, HashSet<(u32, u32)>) {
        (self.dead_rev_nat, self.dead_affinity)
    }

    /// The operations in an order that keeps every lookup consistent. `svc_puts` must be
    /// in [`order_svc_puts`] order within each frontend already, each frontend's entries
    /// together.
    fn ordered(mut self) -> (Vec<Op>, HashSet<u32>, HashSet<(u32, u32)>) {
        // Slot 0 of the external scope first (the frontend disappears at once), then the
        // rest.
        self.svc_dels.sort_by_key(|k| {
            (
                !(k.slot == 0 && k.scope == SCOPE_EXTERNAL),
                k.frontend,
                k.scope,
                k.slot,
            )
        });
        // Sized once: a cold sync plans millions of operations.
        let mut ops = Vec::with_capacity(
            self.backend_puts.len()
                + self.rev_nat_puts.len()
                + self.range_puts.len()
                + self.node_puts.len()
                + self.maglev_puts.len()
                + self.svc_puts.len()
                + self.svc_dels.len()
                + self.range_dels.len()
                + self.rev_nat_dels.len()
                + self.backend_dels.len()
                + self.node_dels.len(),
        );
        ops.extend(self.backend_puts);
        ops.extend(self.rev_nat_puts);
        ops.extend(self.range_puts);
        ops.extend(self.node_puts);
        ops.extend(
            self.maglev_puts
                .into_iter()
                .map(|(index, members)| Op::PutMaglevTable(index, members)),
        );
        ops.extend(self.svc_puts.into_iter().map(|(k, v)| Op::PutSvc(k, v)));
        ops.extend(self.svc_dels.into_iter().map(Op::DelSvc));
        ops.extend(self.range_dels);
        ops.extend(self.rev_nat_dels);
        ops.extend(self.backend_dels);
        ops.extend(self.node_dels);
        (ops, self.dead_rev_nat, self.dead_affinity)
    }
}

/// Puts service entries in the order lookups need: each frontend's together, its internal
/// scope before its external one, and within a scope slots 1..n before slot 0 (which
/// publishes the count). Unstable: a key is planned at most once (one owner per
/// frontend), or, for a ClusterIP wildcard two services claim, twice with the same value.
fn order_svc_puts(puts: &mut [(SvcEntryKey, SvcValue)]) {
    puts.sort_unstable_by_key(|(k, _)| {
        (k.frontend, std::cmp::Reverse(k.scope), k.slot == 0, k.slot)
    });
}

/// Node-level map contents of every family.
fn desired_node(families: &[FamilyState], node: &NodeContext) -> (HashSet<IpAddr>, HashSet<IpNet>) {
    let mut addrs = HashSet::new();
    let mut cidrs = HashSet::new();
    for f in families {
        let loopback = node.serves_loopback_nodeports(f.family);
        match node.nodeport_addresses_of(f.family) {
            Some(list) => addrs.extend(list.into_iter().filter(|a| loopback || !a.is_loopback())),
            None => addrs.extend(
                node.host_addresses
                    .iter()
                    .filter(|a| f.family.contains(a) && !a.is_loopback())
                    .copied(),
            ),
        }
        cidrs.extend(f.service_cidrs.iter().copied());
    }
    (addrs, cidrs)
}

/// The budgeted map entry an op deletes (every delete removes an entry that is there).
fn deleted_entry(op: &Op) -> Option<(MapKind, IpFamily)> {
    let family = |v6: bool| if v6 { IpFamily::V6 } else { IpFamily::V4 };
    match op {
        Op::DelSvc(k) => Some((MapKind::Services, family(k.frontend.addr.is_ipv6()))),
        Op::DelSrcRange(_, net) => Some((MapKind::SourceRanges, family(net.addr().is_ipv6()))),
        Op::DelRevNat(v6, _) => Some((MapKind::RevNat, family(*v6))),
        Op::DelBackend(v6, _) => Some((MapKind::Backends, family(*v6))),
        _ => None,
    }
}

/// The entries of the service puts among `ops`.
fn svc_puts(ops: &[Op]) -> impl Iterator<Item = (&SvcEntryKey, &SvcValue)> {
    ops.iter().filter_map(|op| match op {
        Op::PutSvc(k, v) => Some((k, v)),
        _ => None,
    })
}

/// A run of service puts this long is written in two halves at once.
const PARALLEL_SVC_WRITE_MIN: usize = 65_536;

/// Where the second half of a run of service puts starts: the first entry of a frontend
/// at or after the middle (a frontend's entries are together, see [`order_svc_puts`]).
/// `None` when the run's last frontend starts before the middle.
fn frontend_boundary(run: &[Op]) -> Option<usize> {
    let frontend = |op: &Op| match op {
        Op::PutSvc(k, _) => Some(k.frontend),
        _ => None,
    };
    let middle = run.len() / 2;
    let before = frontend(run.get(middle.checked_sub(1)?)?)?;
    (middle..run.len()).find(|&at| frontend(&run[at]) != Some(before))
}

/// How many ops from the start of `ops` `matches` accepts.
fn run_len(ops: &[Op], matches: impl Fn(&Op) -> bool) -> usize {
    ops.iter().take_while(|op| matches(op)).count()
}

/// Runs `ops` in order (Maglev tables are built here, of `maglev_size` entries). Runs of
/// puts into the same kind of map go in as few system calls as the maps allow (a full
/// sync writes up to millions), in the same order.
fn execute(maps: &mut LbMaps, ops: &[Op], maglev_size: u32) -> Result<(usize, usize), MapOpError> {
    let (mut written, mut deleted) = (0, 0);
    let mut rest = ops;
    while let Some(first) = rest.first() {
        let batched = match first {
            Op::PutSvc(..) => {
                let n = run_len(rest, |op| matches!(op, Op::PutSvc(..)));
                match frontend_boundary(&rest[..n]) {
                    // Two halves at once (a cold sync's million entries): the order that
                    // matters is within each frontend's entries, which stay together.
                    Some(half) if n >= PARALLEL_SVC_WRITE_MIN => {
                        maps.put_svcs_in_parts([svc_puts(&rest[..half]), svc_puts(&rest[half..n])])?
                    }
                    _ => maps.put_svcs(svc_puts(&rest[..n]))?,
                }
                n
            }
            Op::PutBackend(..) => {
                let n = run_len(rest, |op| matches!(op, Op::PutBackend(..)));
                maps.put_backends(rest[..n].iter().filter_map(|op| match op {
                    Op::PutBackend(id, b) => Some((*id, b)),
                    _ => None,
                }))?;
                n
            }
            Op::PutRevNat(..) => {
                let n = run_len(rest, |op| matches!(op, Op::PutRevNat(..)));
                maps.put_rev_nats(rest[..n].iter().filter_map(|op| match op {
                    Op::PutRevNat(id, addr, port) => Some((*id, *addr, *port)),
                    _ => None,
                }))?;
                n
            }
            _ => 0,
        };
        if batched > 0 {
            written += batched;
            rest = &rest[batched..];
            continue;
        }
        rest = &rest[1..];
        let op = first;
        match op {
            Op::PutBackend(id, b) => maps.put_backend(*id, b)?,
            Op::PutRevNat(id, addr, port) => maps.put_rev_nat(*id, *addr, *port)?,
            Op::PutSrcRange(id, net) => maps.put_src_range(*id, net)?,
            Op::PutSvc(k, v) => maps.put_svc(k, v)?,
            Op::PutNodePortAddr(ip) => maps.put_nodeport_addr(*ip)?,
            Op::PutSvcCidr(net) => maps.put_svc_cidr(net)?,
            Op::DelSvc(k) => maps.del_svc(k)?,
            Op::DelSrcRange(id, net) => maps.del_src_range(*id, net)?,
            Op::DelRevNat(v6, id) => maps.del_rev_nat(*v6, *id)?,
            Op::DelBackend(v6, id) => maps.del_backend(*v6, *id)?,
            Op::DelNodePortAddr(ip) => maps.del_nodeport_addr(*ip)?,
            Op::DelSvcCidr(net) => maps.del_svc_cidr(net)?,
            Op::PutMaglevTable(index, members) => maps
                .maglev
                .write(*index, &super::maglev::build_table(members, maglev_size))?,
        }
        if matches!(
            op,
            Op::PutBackend(..)
                | Op::PutRevNat(..)
                | Op::PutSrcRange(..)
                | Op::PutSvc(..)
                | Op::PutNodePortAddr(..)
                | Op::PutSvcCidr(..)
                | Op::PutMaglevTable(..)
        ) {
            written += 1;
        } else {
            deleted += 1;
        }
    }
    Ok((written, deleted))
}

/// What `candidates` add to each budgeted map beyond what they have (see
/// [`admission::Candidate::added_entries`]; a backend two services share counts for
/// each), and how many of them are services new to the maps.
fn added_by(candidates: &[admission::Candidate]) -> (PerMap, usize) {
    let mut added = PerMap::default();
    let mut new_services = 0usize;
    for candidate in candidates {
        for (kind, family, n) in candidate.added_entries() {
            added.add(kind, family, n);
        }
        let (desired, old) = candidate.desired_and_old();
        new_services += usize::from(old.svc.is_empty() && !desired.frontends.is_empty());
    }
    (added, new_services)
}

/// Deletes affinity entries that could send a client to a backend its frontend no longer
/// has (or to a frontend id that is gone and may be reused).
fn clean_affinity(
    maps: &mut LbMaps,
    dead_frontends: &HashSet<u32>,
    dead_pairs: &HashSet<(u32, u32)>,
) -> Result<usize, MapOpError> {
    if dead_frontends.is_empty() && dead_pairs.is_empty() {
        return Ok(0);
    }
    let mut removed = 0;
    for (key, value) in maps.affinity.entries()? {
        if dead_frontends.contains(&key.rev_nat_id)
            || dead_pairs.contains(&(key.rev_nat_id, value.backend_id))
        {
            maps.affinity.delete(&key)?;
            removed += 1;
        }
    }
    Ok(removed)
}

impl ApplyState {
    /// Brings the maps in line with `families` for the services in `changed` (every service
    /// when `full`).
    pub fn sync(
        &mut self,
        maps: &mut LbMaps,
        families: &[FamilyState],
        node: &NodeContext,
        changed: &std::collections::HashSet<NamespacedName>,
        full: bool,
    ) -> Result<SyncStats, ApplyError> {
        let planned = self.plan(maps, families, node, changed, full)?;
        self.execute(maps, planned)
    }

    /// The first half of [`ApplyState::sync`]: admits the services and plans the writes,
    /// writing nothing. The state already counts the plan as done: it must be given to
    /// [`ApplyState::execute`] (on maps holding the same entries) or
    /// [`ApplyState::abandon`].
    pub fn plan(
        &mut self,
        maps: &LbMaps,
        families: &[FamilyState],
        node: &NodeContext,
        changed: &std::collections::HashSet<NamespacedName>,
        full: bool,
    ) -> Result<PlannedSync, ApplyError> {
        let prepared = self.prepare(maps, families, node, changed, full)?;
        Ok(self.admit_prepared(prepared, families, node))
    }

    /// The part of [`ApplyState::plan`] that reads the maps ([`ApplyState::read_maps`])
    /// and finds the services to look at ([`ApplyState::prepare_read`]). The maps are
    /// not read again until the plan is written: they may be replaced by bigger ones
    /// holding the same entries (growing, see `PreparedSync::estimated_peak`) while
    /// [`ApplyState::admit_prepared`] runs. The services to look at are taken out of the
    /// state: what this returns must be given to `admit_prepared`.
    pub fn prepare(
        &mut self,
        maps: &LbMaps,
        families: &[FamilyState],
        node: &NodeContext,
        changed: &std::collections::HashSet<NamespacedName>,
        full: bool,
    ) -> Result<PreparedSync, ApplyError> {
        let read = self.read_maps(maps, full)?;
        Ok(self.prepare_read(read, families, node, changed, |_, _| {}))
    }

    /// What a sync needs of the maps before its services are looked at: what they hold
    /// (a full sync, when it reads them all) and their capacity.
    pub fn read_maps(&mut self, maps: &LbMaps, full: bool) -> Result<MapsRead, ApplyError> {
        let actual = if full { Some(maps.snapshot()?) } else { None };
        if let Some(actual) = &actual
            && !self.adopted
        {
            self.adopt(actual);
        }
        let capacity = PerMap::capacities(maps)?;
        let in_maps = match (&actual, self.counted.take()) {
            (Some(actual), _) => PerMap::entries_of(actual),
            (None, Some(counted)) => counted,
            (None, None) => self.entries(),
        };
        let budget = match &self.ceilings {
            Some(ceilings) => Budget::up_to_ceilings(ceilings.room(&capacity), in_maps),
            None => Budget::new(capacity, in_maps),
        };
        Ok(MapsRead { actual, budget })
    }

    /// The services to look at with what each should have, after [`ApplyState::read_maps`]
    /// (a full sync when that read what the maps hold); without the maps. As soon as
    /// the estimated peak (`PreparedSync::estimated_peak`) is known, and before the rest
    /// (putting the services in admission order, making room in the tables), it is
    /// given to `on_estimate` with whether the backend and reverse-NAT entries are worth
    /// writing while the services are admitted (see the `ahead` module: a partial sync
    /// of many services): the maps can start growing then.
    pub fn prepare_read(
        &mut self,
        read: MapsRead,
        families: &[FamilyState],
        node: &NodeContext,
        changed: &std::collections::HashSet<NamespacedName>,
        on_estimate: impl FnOnce(&PerMap, bool),
    ) -> PreparedSync {
        let MapsRead { actual, budget } = read;
        let candidates = self.candidates(families, node, changed, actual.as_ref());
        let (added, new_services) = added_by(&candidates);
        let mut estimated_peak = budget.used().clone();
        for kind in MapKind::ALL {
            for family in [IpFamily::V4, IpFamily::V6] {
                estimated_peak.add(kind, family, added.get(kind, family));
            }
        }
        let writes_ahead = actual.is_none() && candidates.len() >= WRITE_AHEAD_MIN;
        on_estimate(&estimated_peak, writes_ahead);
        self.reserve_for(&added, new_services);
        PreparedSync {
            actual,
            budget,
            candidates: admission::in_admission_order(candidates),
            estimated_peak,
        }
    }

    /// The rest of [`ApplyState::plan`]: admits the prepared services and plans the
    /// writes, without reading the maps.
    pub fn admit_prepared(
        &mut self,
        prepared: PreparedSync,
        families: &[FamilyState],
        node: &NodeContext,
    ) -> PlannedSync {
        self.admit_writing_ahead(prepared, families, node, None)
    }

    /// [`ApplyState::admit_prepared`], sending the backend and reverse-NAT writes of a
    /// partial sync to `ahead` as the services are admitted (see the `ahead` module): the
    /// `ahead::AheadWriter`'s outcome must be given back with `PlannedSync::take_back`
    /// before the plan is written.
    pub fn admit_writing_ahead(
        &mut self,
        prepared: PreparedSync,
        families: &[FamilyState],
        node: &NodeContext,
        ahead: Option<ahead::AheadSender>,
    ) -> PlannedSync {
        // A full sync's writes are known only once everything is compared with the maps.
        let mut ahead = ahead.filter(|_| prepared.actual.is_none());
        let PreparedSync {
            actual,
            mut budget,
            candidates,
            estimated_peak,
        } = prepared;
        let mut plan = Plan::default();
        // Room for the writes of what the services add, at once: the plan gathers each
        // admitted service's writes, and a cold sync's millions of them grew these lists
        // by doubling, each time copying them to fresh memory.
        let added = |kind| {
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .map(|family| {
                    estimated_peak
                        .get(kind, family)
                        .saturating_sub(budget.used().get(kind, family))
                })
                .sum::<usize>()
        };
        if ahead.is_none() {
            // (Written ahead, they leave a chunk at a time.)
            plan.backend_puts.reserve(added(MapKind::Backends));
            plan.rev_nat_puts.reserve(added(MapKind::RevNat));
        }
        plan.svc_puts.reserve(added(MapKind::Services));
        plan.range_puts.reserve(added(MapKind::SourceRanges));
        let mut refusals = Refusals::default();
        for candidate in candidates {
            self.admit(
                candidate,
                actual.as_ref(),
                &mut budget,
                &mut plan,
                &mut refusals,
            );
            if let Some(ahead) = &mut ahead {
                ahead.offer(&mut plan.backend_puts, &mut plan.rev_nat_puts, false);
            }
        }
        self.deferred = refusals.services.iter().cloned().collect();
        let (addrs, cidrs) = desired_node(families, node);
        for a in addrs.difference(&self.nodeport_addrs) {
            plan.node_puts.push(Op::PutNodePortAddr(*a));
        }
        for a in self.nodeport_addrs.difference(&addrs) {
            plan.node_dels.push(Op::DelNodePortAddr(*a));
        }
        for c in cidrs.difference(&self.svc_cidrs) {
            plan.node_puts.push(Op::PutSvcCidr(*c));
        }
        for c in self.svc_cidrs.difference(&cidrs) {
            plan.node_dels.push(Op::DelSvcCidr(*c));
        }
        self.nodeport_addrs = addrs;
        self.svc_cidrs = cidrs;

        // Ids adopted from the maps that no service claimed: their entries go below.
        // The entry written for each goes with its id, so a later service with this
        // backend does not find it "already written" under an id whose entry is gone.
        for (_, id) in self.backend_ids.drop_unreferenced() {
            debug!(id, "dropping an adopted backend id nothing uses");
        }
        for (_, id) in self.rev_nat_ids.drop_unreferenced() {
            plan.dead_rev_nat.insert(id as u32);
        }
        self.maglev.drop_unreferenced();

        // Tables are not in the snapshot (nothing reads them back): a full sync writes the
        // ones this plan wrote, in the same phase.
        let tables = if actual.is_some() {
            std::mem::take(&mut plan.maglev_puts)
        } else {
            TableWrites::new()
        };
        // A full sync compares with what the maps hold instead of what was written.
        let (ops, dead_frontends, dead_pairs) = match actual {
            Some(actual) => {
                let (dead_frontends, dead_pairs) = plan.into_dead();
                (self.reconcile(&actual, tables), dead_frontends, dead_pairs)
            }
            None => {
                // What is left of the backend and reverse-NAT writes goes ahead too.
                if let Some(mut ahead) = ahead {
                    ahead.offer(&mut plan.backend_puts, &mut plan.rev_nat_puts, true);
                }
                plan.ordered()
            }
        };
        PlannedSync {
            ops,
            budget,
            refusals,
            dead_frontends,
            dead_pairs,
            written_ahead: 0,
        }
    }

    /// Gives up a planned sync without writing it. The state counted the plan as written:
    /// it forgets everything, as a restarted agent starts, and the next sync (which must
    /// be full) takes back what the maps hold.
    pub fn abandon(&mut self, planned: PlannedSync) {
        drop(planned);
        let id_space = |max: u64| u32::try_from(max).unwrap_or(u32::MAX);
        let mut fresh = Self::new(
            id_space(self.backend_ids.max()),
            id_space(self.rev_nat_ids.max()),
        );
        fresh.maglev = self.maglev.fresh();
        fresh.ceilings = self.ceilings;
        *self = fresh;
    }

    /// The second half of [`ApplyState::sync`]: writes a planned sync.
    pub fn execute(
        &mut self,
        maps: &mut LbMaps,
        planned: PlannedSync,
    ) -> Result<SyncStats, ApplyError> {
        self.execute_alongside(maps, planned, |_| ()).0
    }

    /// [`ApplyState::execute`], running `alongside` (which reads the state as planned:
    /// every admitted service has its ids) meanwhile. A write of many entries, where the
    /// kernel takes most of a second for 100,000 services, leaves the other cores idle:
    /// `alongside` runs on one of them then; a small write runs it after, on this thread.
    pub fn execute_alongside<R: Send>(
        &mut self,
        maps: &mut LbMaps,
        planned: PlannedSync,
        alongside: impl FnOnce(&ApplyState) -> R + Send,
    ) -> (Result<SyncStats, ApplyError>, R) {
        let outcome = if parallel::workers_for(planned.ops.len(), PARALLEL_WRITE_MIN) > 1 {
            let (state, maglev_size) = (&*self, self.maglev.size);
            std::thread::scope(|scope| {
                let beside = scope.spawn(move || alongside(state));
                let executed = execute(maps, &planned.ops, maglev_size);
                match beside.join() {
                    Ok(beside) => (executed, beside),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            })
        } else {
            let executed = execute(maps, &planned.ops, self.maglev.size);
            (executed, alongside(self))
        };
        let (executed, beside) = outcome;
        (self.finish_execute(maps, planned, executed), beside)
    }

    /// What follows the writes of a planned sync: ids freed, entries counted, the report.
    fn finish_execute(
        &mut self,
        maps: &mut LbMaps,
        planned: PlannedSync,
        executed: Result<(usize, usize), MapOpError>,
    ) -> Result<SyncStats, ApplyError> {
        let PlannedSync {
            ops,
            budget,
            refusals,
            dead_frontends,
            dead_pairs,
            written_ahead,
        } = planned;
        // Ids freed by this sync are safe to hand out once their entries are gone (or, if a
        // write failed, at the next sync, which is then full and rewrites what it needs).
        self.backend_ids.recycle();
        self.rev_nat_ids.recycle();
        self.maglev.finish(executed.is_err());
        let (written, deleted) = executed?;
        // At the peak the maps held what they had plus what was admitted; the deletes
        // came after.
        let mut counted = budget.used().clone();
        for op in &ops {
            if let Some((kind, family)) = deleted_entry(op) {
                counted.sub(kind, family, 1);
            }
        }
        // The maps' own capacity (the budget's may be their ceilings).
        let map_usage = counted.usage(&PerMap::capacities(maps)?);
        self.counted = Some(counted);
        let affinity_removed = clean_affinity(maps, &dead_frontends, &dead_pairs)?;
        Ok(SyncStats {
            services: self.services.len(),
            written: written + written_ahead,
            deleted: deleted + affinity_removed,
            no_local_endpoints_internal: self.no_local.0,
            no_local_endpoints_external: self.no_local.1,
            not_programmed: refusals.distinct_services(),
            not_programmed_examples: refusals.examples(),
            full_maps: refusals.full_maps(&budget),
            map_usage,
            // The proxier adds the maps it grew before the writes.
            map_growth: Vec::new(),
            // The ebpf proxier adds its conntrack cleanup after the maps are written.
            conntrack_reconciles: Vec::new(),
            // The proxier adds the connected UDP socket sweep after the maps are written.
            connected_udp: Default::default(),
            // The maps hold both families at once: no per-family split.
            per_family: Vec::new(),
        })
    }

    /// Grows the tables keyed by backend, frontend and service once for what a sync adds
    /// (`added` entries, `new_services`, see [`added_by`]): a cold sync of 100,000
    /// services otherwise rehashed each table every time it doubled, a tenth of the
    /// planning. An estimate: a table reserved too big only holds spare room until the
    /// next big change.
    fn reserve_for(&mut self, added: &PerMap, new_services: usize) {
        let of_both = |kind| added.get(kind, IpFamily::V4) + added.get(kind, IpFamily::V6);
        self.backend_ids.reserve(of_both(MapKind::Backends));
        self.rev_nat_ids.reserve(of_both(MapKind::RevNat));
        self.owners.reserve(of_both(MapKind::RevNat));
        self.services.reserve(new_services);
    }

    /// Takes a service's record out (it is put back, or replaced, by [`Self::put_service`]).
    fn take_service(&mut self, key: &(IpFamily, NamespacedName)) -> Option<AppliedService> {
        let old = self.services.remove(key)?;
        self.no_local.0 -= usize::from(old.no_local_internal);
        self.no_local.1 -= usize::from(old.no_local_external);
        Some(old)
    }

    fn put_service(&mut self, key: (IpFamily, NamespacedName), applied: AppliedService) {
        self.no_local.0 += usize::from(applied.no_local_internal);
        self.no_local.1 += usize::from(applied.no_local_external);
        if let Some(old) = self.services.insert(key, applied) {
            self.no_local.0 -= usize::from(old.no_local_internal);
            self.no_local.1 -= usize::from(old.no_local_external);
        }
    }

    /// The frontends programmed for `service` in `family` with their rev_nat ids (the
    /// names table `proxy-agent inspect` reads is written from it).
    pub fn frontend_ids(
        &self,
        family: IpFamily,
        service: &NamespacedName,
    ) -> Vec<(FrontendKey, u32)> {
        let owner = (family, service.clone());
        let Some(applied) = self.services.get(&owner) else {
            return Vec::new();
        };
        applied
            .frontends
            .iter()
            .filter(|k| self.owners.get(*k) == Some(&owner))
            .filter_map(|k| self.rev_nat_ids.get(k).map(|id| (*k, id as u32)))
            .collect()
    }

    /// Services that did not fit at the last sync (they are tried again at the next).
    pub fn deferred(&self) -> impl Iterator<Item = &NamespacedName> {
        self.deferred.iter().map(|(_, s)| s)
    }

    /// Every (family, service) with entries in the maps.
    pub fn programmed(&self) -> impl Iterator<Item = &(IpFamily, NamespacedName)> {
        self.services.keys()
    }

    /// Everything the maps should hold now.
    pub fn expected(&self) -> Snapshot {
        let mut s = Snapshot::default();
        // Sized once: a full sync of a big cluster builds millions of entries here.
        s.svc
            .reserve(self.services.values().map(|svc| svc.svc.len()).sum());
        s.backends.reserve(self.backend_ids.len());
        s.rev_nat.reserve(self.owners.len());
        for svc in self.services.values() {
            s.svc.extend(svc.svc.iter().map(|(k, v)| (*k, *v)));
            s.src_ranges.extend(svc.src_ranges.iter().copied());
        }
        for (addr, id, flags) in self.backend_ids.iter() {
            if let Some(flags) = flags {
                s.backends
                    .insert((v6(&addr.addr), id as u32), flags.entry(*addr));
            }
        }
        for key in self.owners.keys() {
            if let Some(id) = self.rev_nat_ids.get(key) {
                s.rev_nat
                    .insert((v6(&key.addr), id as u32), (key.addr, key.port));
            }
        }
        s.nodeport_addrs = self.nodeport_addrs.iter().copied().collect();
        s.svc_cidrs = self.svc_cidrs.iter().copied().collect();
        s
    }

    /// The operations that turn `actual` into [`ApplyState::expected`], in safe order, with
    /// the Maglev `tables` to write.
    fn reconcile(&self, actual: &Snapshot, tables: TableWrites) -> Vec<Op> {
        let expected = self.expected();
        let mut plan = Plan {
            maglev_puts: tables,
            ..Plan::default()
        };
        for (id, entry) in &expected.backends {
            if actual.backends.get(id) != Some(entry) {
                plan.backend_puts.push(Op::PutBackend(id.1, *entry));
            }
        }
        for (id, (addr, port)) in &expected.rev_nat {
            if actual.rev_nat.get(id) != Some(&(*addr, *port)) {
                plan.rev_nat_puts.push(Op::PutRevNat(id.1, *addr, *port));
            }
        }
        for r in expected.src_ranges.difference(&actual.src_ranges) {
            plan.range_puts.push(Op::PutSrcRange(r.0, r.1));
        }
        for (k, v) in &expected.svc {
            if actual.svc.get(k) != Some(v) {
                plan.svc_puts.push((*k, *v));
            }
        }
        // From a hash map: in no order yet.
        order_svc_puts(&mut plan.svc_puts);
        for a in expected.nodeport_addrs.difference(&actual.nodeport_addrs) {
            plan.node_puts.push(Op::PutNodePortAddr(*a));
        }
        for c in expected.svc_cidrs.difference(&actual.svc_cidrs) {
            plan.node_puts.push(Op::PutSvcCidr(*c));
        }
        for k in actual.svc.keys() {
            if !expected.svc.contains_key(k) {
                plan.svc_dels.push(*k);
            }
        }
        for r in actual.src_ranges.difference(&expected.src_ranges) {
            plan.range_dels.push(Op::DelSrcRange(r.0, r.1));
        }
        for id in actual.rev_nat.keys() {
            if !expected.rev_nat.contains_key(id) {
                plan.rev_nat_dels.push(Op::DelRevNat(id.0, id.1));
            }
        }
        for id in actual.backends.keys() {
            if !expected.backends.contains_key(id) {
                plan.backend_dels.push(Op::DelBackend(id.0, id.1));
            }
        }
        for a in actual.nodeport_addrs.difference(&expected.nodeport_addrs) {
            plan.node_dels.push(Op::DelNodePortAddr(*a));
        }
        for c in actual.svc_cidrs.difference(&expected.svc_cidrs) {
            plan.node_dels.push(Op::DelSvcCidr(*c));
        }
        plan.ordered().0
    }
}

#[cfg(test)]
mod boundary_tests {
    use std::net::{IpAddr, Ipv4Addr};

    use proxy_common::{SCOPE_EXTERNAL, SvcValue};

    use super::{Op, frontend_boundary};
    use crate::proxier::ebpf::{desired::FrontendKey, entries::SvcEntryKey};

    /// A run of `sizes[i]` entries for frontend i (slots 1..n, then 0, as they are put).
    fn run(sizes: &[u16]) -> Vec<Op> {
        let mut ops = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let frontend = FrontendKey {
                addr: IpAddr::V4(Ipv4Addr::new(10, 96, 0, i as u8)),
                port: 80,
                proto: 6,
            };
            for slot in (1..*size).chain([0]) {
                let key = SvcEntryKey {
                    frontend,
                    scope: SCOPE_EXTERNAL,
                    slot,
                };
                ops.push(Op::PutSvc(key, SvcValue::default()));
            }
        }
        ops
    }

    /// The halves of a run never split a frontend's entries: the second starts at the
    /// first frontend that begins at or after the middle.
    #[test]
    fn halves_split_between_frontends() {
        // Frontends of 3, 3, 3, 3: the middle (6) starts the third.
        assert_eq!(frontend_boundary(&run(&[3, 3, 3, 3])), Some(6));
        // 4, 5, 1: the middle (5) is inside the second, which starts at 4 and ends at 9.
        assert_eq!(frontend_boundary(&run(&[4, 5, 1])), Some(9));
        // One frontend, or the last one starting before the middle: no halves.
        assert_eq!(frontend_boundary(&run(&[8])), None);
        assert_eq!(frontend_boundary(&run(&[1, 7])), None);
        assert_eq!(frontend_boundary(&[]), None);
    }
}
