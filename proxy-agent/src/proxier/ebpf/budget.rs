// SPDX-License-Identifier: Apache-2.0
//! Room in the LB maps during one sync. A service goes in whole or not at all: before its
//! entries join the plan, what it adds to each map of its family is taken from the room
//! left; a service that does not fit takes nothing, keeps what it had, and is tried again
//! at the next sync. Entries already in the maps are never given up to make room.
//!
//! Room is counted at the peak of a sync, not at its end: the plan writes every new entry
//! before it deletes any old one (lookups must never see half a service), so what a sync
//! deletes frees room only for the next sync.

use std::collections::HashMap;

use proxy_common::maps as names;

use super::{
    entries::Snapshot,
    ids::IdBits,
    maps::{LbMaps, Result},
};
use crate::{
    model::IpFamily,
    proxier::{FullMap, MapUsage},
};

/// The maps a service's entries go to (one of each per family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapKind {
    Services,
    Backends,
    RevNat,
    SourceRanges,
}

impl MapKind {
    pub const ALL: [MapKind; 4] = [
        MapKind::Services,
        MapKind::Backends,
        MapKind::RevNat,
        MapKind::SourceRanges,
    ];

    /// The pinned name of this kind's map of `family`.
    pub fn map_name(self, family: IpFamily) -> &'static str {
        let v4 = family == IpFamily::V4;
        match self {
            MapKind::Services if v4 => names::SVC4,
            MapKind::Services => names::SVC6,
            MapKind::Backends if v4 => names::BACKENDS4,
            MapKind::Backends => names::BACKENDS6,
            MapKind::RevNat if v4 => names::REV_NAT4,
            MapKind::RevNat => names::REV_NAT6,
            MapKind::SourceRanges if v4 => names::SRC_RANGES4,
            MapKind::SourceRanges => names::SRC_RANGES6,
        }
    }

    /// The configuration field that sizes this kind of map.
    pub fn setting(self) -> &'static str {
        match self {
            MapKind::Services => "ebpf.mapSizes.services",
            MapKind::Backends => "ebpf.mapSizes.backends",
            MapKind::RevNat => "ebpf.mapSizes.revNat",
            MapKind::SourceRanges => "ebpf.mapSizes.sourceRanges",
        }
    }

    /// The configuration field that caps this kind of map when it grows.
    pub fn limit_setting(self) -> &'static str {
        match self {
            MapKind::Services => "ebpf.mapSizeLimits.services",
            MapKind::Backends => "ebpf.mapSizeLimits.backends",
            MapKind::RevNat => "ebpf.mapSizeLimits.revNat",
            MapKind::SourceRanges => "ebpf.mapSizeLimits.sourceRanges",
        }
    }
}

const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

fn family_of(v6: bool) -> IpFamily {
    if v6 { IpFamily::V6 } else { IpFamily::V4 }
}

/// A count per map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerMap(HashMap<(MapKind, IpFamily), usize>);

impl PerMap {
    pub fn get(&self, kind: MapKind, family: IpFamily) -> usize {
        self.0.get(&(kind, family)).copied().unwrap_or(0)
    }

    pub fn add(&mut self, kind: MapKind, family: IpFamily, n: usize) {
        *self.0.entry((kind, family)).or_default() += n;
    }

    pub fn sub(&mut self, kind: MapKind, family: IpFamily, n: usize) {
        let count = self.0.entry((kind, family)).or_default();
        *count = count.saturating_sub(n);
    }

    /// The capacity (max_entries) of each map.
    pub fn capacities(maps: &LbMaps) -> Result<Self> {
        let mut out = Self::default();
        for (kind, family, capacity) in [
            (MapKind::Services, IpFamily::V4, maps.svc4.capacity()?),
            (MapKind::Services, IpFamily::V6, maps.svc6.capacity()?),
            (MapKind::Backends, IpFamily::V4, maps.backends4.capacity()?),
            (MapKind::Backends, IpFamily::V6, maps.backends6.capacity()?),
            (MapKind::RevNat, IpFamily::V4, maps.rev_nat4.capacity()?),
            (MapKind::RevNat, IpFamily::V6, maps.rev_nat6.capacity()?),
            (
                MapKind::SourceRanges,
                IpFamily::V4,
                maps.src_ranges4.capacity()?,
            ),
            (
                MapKind::SourceRanges,
                IpFamily::V6,
                maps.src_ranges6.capacity()?,
            ),
        ] {
            out.add(kind, family, capacity);
        }
        Ok(out)
    }

    /// The entries of each map in `snapshot`.
    pub fn entries_of(snapshot: &Snapshot) -> Self {
        let mut out = Self::default();
        for key in snapshot.svc.keys() {
            out.add(MapKind::Services, family_of(key.frontend.addr.is_ipv6()), 1);
        }
        for (v6, _) in snapshot.backends.keys() {
            out.add(MapKind::Backends, family_of(*v6), 1);
        }
        for (v6, _) in snapshot.rev_nat.keys() {
            out.add(MapKind::RevNat, family_of(*v6), 1);
        }
        for (_, net) in &snapshot.src_ranges {
            out.add(MapKind::SourceRanges, family_of(net.addr().is_ipv6()), 1);
        }
        out
    }

    /// Entries and capacity of every map, for the metrics.
    pub fn usage(&self, capacity: &PerMap) -> Vec<MapUsage> {
        let mut out = Vec::new();
        for kind in MapKind::ALL {
            for family in FAMILIES {
                out.push(MapUsage {
                    map: kind.map_name(family),
                    entries: self.get(kind, family),
                    capacity: capacity.get(kind, family),
                });
            }
        }
        out
    }
}

/// What one service adds to the maps of its family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    pub svc_entries: usize,
    pub src_ranges: usize,
    /// Backend ids whose entry is not in the map yet, in any order, an id possibly more
    /// than once (a backend several services, or scopes, share is counted once).
    pub backends: Vec<u32>,
    /// rev_nat ids whose entry is not in the map yet (as `backends`).
    pub rev_nat: Vec<u32>,
}

/// The room of one sync.
#[derive(Debug)]
pub struct Budget {
    capacity: PerMap,
    /// Whether `capacity` is the maps' ceilings (they grow) rather than their size.
    ceilings: bool,
    used: PerMap,
    /// The backend and rev_nat ids this sync has counted already, per family.
    backends: [CountedIds; 2],
    rev_nat: [CountedIds; 2],
}

/// The ids of one map a sync has counted: a short list while few, a bitmap once many. A
/// cold sync of 100,000 services counts a million backend ids, where a hash set spent a
/// tenth of admission growing and hashing; a one-service sync counts a few, where a bitmap
/// as long as the highest id in the maps was allocated and zeroed at every sync.
#[derive(Debug, Default)]
struct CountedIds {
    few: Vec<u32>,
    many: Option<IdBits>,
}

/// Past this many ids, a sync's counted ids go into a bitmap.
const FEW_IDS: usize = 64;

impl CountedIds {
    fn contains(&self, id: u32) -> bool {
        match &self.many {
            Some(bits) => bits.contains(id),
            None => self.few.contains(&id),
        }
    }

    /// Counts `id`, which is not counted yet.
    fn insert(&mut self, id: u32) {
        if let Some(bits) = &mut self.many {
            bits.insert(id);
            return;
        }
        self.few.push(id);
        if self.few.len() > FEW_IDS {
            let mut bits = IdBits::default();
            for id in self.few.drain(..) {
                bits.insert(id);
            }
            self.many = Some(bits);
        }
    }
}

fn family_index(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

impl Budget {
    /// `used`: the entries in the maps when the sync starts.
    pub fn new(capacity: PerMap, used: PerMap) -> Self {
        Self {
            capacity,
            ceilings: false,
            used,
            backends: Default::default(),
            rev_nat: Default::default(),
        }
    }

    /// A budget whose `room` is what the maps may grow to (see `growth`): what does not
    /// fit is reported with the setting of the ceiling.
    pub fn up_to_ceilings(room: PerMap, used: PerMap) -> Self {
        Self {
            ceilings: true,
            ..Self::new(room, used)
        }
    }

    /// Takes room for `demand` in the maps of `family`; or, taking nothing, names the maps
    /// without enough room.
    pub fn take(&mut self, family: IpFamily, demand: &Demand) -> Result<(), Vec<MapKind>> {
        let f = family_index(family);
        let uncounted = |ids: &[u32], counted: &CountedIds| -> Vec<u32> {
            let mut out: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|id| !counted.contains(*id))
                .collect();
            out.sort_unstable();
            out.dedup();
            out
        };
        let backends = uncounted(&demand.backends, &self.backends[f]);
        let rev_nat = uncounted(&demand.rev_nat, &self.rev_nat[f]);
        let needs = [
            (MapKind::Services, demand.svc_entries),
            (MapKind::Backends, backends.len()),
            (MapKind::RevNat, rev_nat.len()),
            (MapKind::SourceRanges, demand.src_ranges),
        ];
        let short: Vec<MapKind> = needs
            .iter()
            .filter(|(kind, n)| {
                *n > 0 && self.used.get(*kind, family) + n > self.capacity.get(*kind, family)
            })
            .map(|(kind, _)| *kind)
            .collect();
        if !short.is_empty() {
            return Err(short);
        }
        for (kind, n) in needs {
            self.used.add(kind, family, n);
        }
        for id in backends {
            self.backends[f].insert(id);
        }
        for id in rev_nat {
            self.rev_nat[f].insert(id);
        }
        Ok(())
    }

    #[cfg(test)]
    pub fn capacity(&self) -> &PerMap {
        &self.capacity
    }

    /// The entries in the maps at the peak of the sync: those there at its start and
    /// those taken for admitted services.
    pub fn used(&self) -> &PerMap {
        &self.used
    }

    /// The report of a map that had no room.
    pub fn full_map(&self, kind: MapKind, family: IpFamily) -> FullMap {
        FullMap {
            map: kind.map_name(family),
            capacity: self.capacity.get(kind, family),
            setting: if self.ceilings {
                kind.limit_setting()
            } else {
                kind.setting()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(services: usize, backends: usize) -> PerMap {
        let mut c = PerMap::default();
        for family in FAMILIES {
            c.add(MapKind::Services, family, services);
            c.add(MapKind::Backends, family, backends);
            c.add(MapKind::RevNat, family, 100);
            c.add(MapKind::SourceRanges, family, 100);
        }
        c
    }

    fn demand(svc_entries: usize, backends: &[u32]) -> Demand {
        Demand {
            svc_entries,
            backends: backends.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_demand_that_does_not_fit_takes_nothing_and_names_the_full_maps() {
        let mut used = PerMap::default();
        used.add(MapKind::Services, IpFamily::V4, 5);
        let mut b = Budget::new(capacity(8, 2), used);
        assert_eq!(
            b.take(IpFamily::V4, &demand(4, &[1, 2, 3])),
            Err(vec![MapKind::Services, MapKind::Backends])
        );
        // Nothing was taken: a smaller service still fits exactly.
        assert_eq!(b.take(IpFamily::V4, &demand(3, &[1, 2])), Ok(()));
        assert_eq!(
            b.take(IpFamily::V4, &demand(1, &[])),
            Err(vec![MapKind::Services])
        );
        // The other family has its own maps.
        assert_eq!(b.take(IpFamily::V6, &demand(8, &[1, 2])), Ok(()));
    }

    #[test]
    fn shared_backends_are_counted_once_and_empty_demands_always_fit() {
        let mut b = Budget::new(capacity(100, 2), PerMap::default());
        assert_eq!(b.take(IpFamily::V4, &demand(1, &[7, 8])), Ok(()));
        assert_eq!(b.take(IpFamily::V4, &demand(1, &[7, 8])), Ok(()));
        assert_eq!(
            b.take(IpFamily::V4, &demand(1, &[9])),
            Err(vec![MapKind::Backends])
        );
        // Over capacity already (drift): a service that adds nothing still goes through.
        let mut used = PerMap::default();
        used.add(MapKind::Services, IpFamily::V4, 200);
        let mut b = Budget::new(capacity(100, 2), used);
        assert_eq!(b.take(IpFamily::V4, &Demand::default()), Ok(()));
    }

    #[test]
    fn ids_are_counted_once_in_a_short_list_and_after_it_became_a_bitmap() {
        let mut b = Budget::new(capacity(1_000, 1_000), PerMap::default());
        // Repeats within a demand and across demands, on both sides of the switch.
        let first: Vec<u32> = (1..=40).chain(1..=10).collect();
        assert_eq!(b.take(IpFamily::V4, &demand(1, &first)), Ok(()));
        assert!(b.backends[0].many.is_none(), "40 ids stay a list");
        let second: Vec<u32> = (30..=100).chain([100_000]).collect();
        assert_eq!(b.take(IpFamily::V4, &demand(1, &second)), Ok(()));
        assert!(b.backends[0].many.is_some(), "101 ids are a bitmap");
        assert_eq!(b.take(IpFamily::V4, &demand(1, &[5, 99, 100_000])), Ok(()));
        assert_eq!(b.used().get(MapKind::Backends, IpFamily::V4), 101);
        for id in (1..=100).chain([100_000]) {
            assert!(b.backends[0].contains(id), "{id}");
        }
        assert!(!b.backends[0].contains(101));
        assert!(!b.backends[1].contains(5), "families apart");
    }

    #[test]
    fn names_and_settings_of_the_maps() {
        assert_eq!(MapKind::Services.map_name(IpFamily::V4), "SVC4_V2");
        assert_eq!(
            MapKind::SourceRanges.map_name(IpFamily::V6),
            "SRC_RANGES6_V2"
        );
        assert_eq!(MapKind::RevNat.setting(), "ebpf.mapSizes.revNat");
        let b = Budget::new(capacity(8, 2), PerMap::default());
        assert_eq!(
            b.full_map(MapKind::Backends, IpFamily::V6),
            FullMap {
                map: "BACKENDS6_V1",
                capacity: 2,
                setting: "ebpf.mapSizes.backends"
            }
        );
        assert_eq!(b.capacity().usage(b.capacity()).len(), 8);
        let b = Budget::up_to_ceilings(capacity(8, 2), PerMap::default());
        assert_eq!(
            b.full_map(MapKind::RevNat, IpFamily::V4).setting,
            "ebpf.mapSizeLimits.revNat"
        );
    }
}
