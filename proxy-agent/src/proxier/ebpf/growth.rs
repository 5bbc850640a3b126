// SPDX-License-Identifier: Apache-2.0
//! Maps that grow by themselves: `ebpf.mapSizes` gives the starting capacity of the maps
//! services fill (services, backends, rev_nat, source ranges; one map per family each),
//! and a sync that would fill one beyond a high-water mark first replaces it by a bigger
//! one, up to the ceiling of `ebpf.mapSizeLimits`.
//!
//! The decision is taken between planning a sync and writing it (see `apply`): admission
//! counts room up to the ceilings, so the plan says how many entries each map holds at the
//! peak of the sync; a map that would be fuller than [`HIGH_WATER_PERCENT`] grows to
//! twice its size, or to a quarter more than the peak when that is more, before anything
//! is written. A cold start with far more services than the defaults thus sizes its maps
//! to the whole cluster in one step, on maps that are still empty, and a growing cluster
//! pays a logarithmic number of steps. Growth is never entry by entry.
//!
//! The same decision is taken once before admission, from an estimate of the peak (what
//! the services to look at add beyond what they have; a backend two services share
//! counts twice): the maps then grow on another thread while the services are admitted,
//! and the check after the plan finds them big enough unless the estimate fell short
//! (a service replacing entries by new ones), when they grow again.
//!
//! Growing reuses the resize of a restart (see `resize`): new maps at staging pins, the
//! entries copied, the programs loaded against them and swapped in without a gap, what
//! the old programs added meanwhile copied again, the pins renamed. The maps keep their
//! entries, so the apply stage's ids and records stay valid. The maps the programs fill
//! themselves (conntrack, affinity, socket rev-NAT) are LRU maps and keep their size: the
//! new programs share them.
//!
//! A map at its ceiling refuses what does not fit (the not-programmed metric, event and
//! warning, as with maps of fixed size). A map's capacity survives a restart: the next
//! agent keeps a grown map's size, within its starting size and ceiling.
//!
//! This module only decides; `EbpfProxier` carries the decisions out.

use super::budget::{MapKind, PerMap};
use crate::{
    config::{MAX_MAP_ENTRIES, MapSizeLimits, MapSizes},
    model::IpFamily,
};

/// A map fuller than this (percent of its capacity) at the peak of a sync grows first.
pub const HIGH_WATER_PERCENT: u64 = 80;

/// The rev_nat maps hold one entry per id, and ids go up to
/// [`proxy_common::MAX_REV_NAT_ID`] (0 is never used): no more entries than this can ever be
/// in them.
pub const REV_NAT_KEYS: u32 = proxy_common::MAX_REV_NAT_ID + 1;

/// Sizes are rounded up to a multiple of 1/16 of their next power of two (at most 6 %
/// more), and of at least this.
const MIN_GRANULE: u64 = 64;

/// The largest capacity each kind of map may grow to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceilings {
    services: u32,
    backends: u32,
    rev_nat: u32,
    source_ranges: u32,
}

impl Ceilings {
    /// The configured ceilings; unset ones are as high as the layout allows.
    pub fn from_config(limits: &MapSizeLimits) -> Self {
        let or_max = |limit: Option<u32>| limit.unwrap_or(MAX_MAP_ENTRIES).min(MAX_MAP_ENTRIES);
        Self {
            services: or_max(limits.services),
            backends: or_max(limits.backends),
            rev_nat: or_max(limits.rev_nat).min(REV_NAT_KEYS),
            source_ranges: or_max(limits.source_ranges),
        }
    }

    pub fn of(&self, kind: MapKind) -> u32 {
        match kind {
            MapKind::Services => self.services,
            MapKind::Backends => self.backends,
            MapKind::RevNat => self.rev_nat,
            MapKind::SourceRanges => self.source_ranges,
        }
    }

    /// The room admission may count on in each map: its ceiling, or its capacity when
    /// that is more (a map is never shrunk while the agent runs).
    pub fn room(&self, capacity: &PerMap) -> PerMap {
        let mut out = PerMap::default();
        for kind in MapKind::ALL {
            for family in [IpFamily::V4, IpFamily::V6] {
                let room = capacity.get(kind, family).max(self.of(kind) as usize);
                out.add(kind, family, room);
            }
        }
        out
    }
}

/// The starting size of each kind of map.
pub fn start_size(sizes: &MapSizes, kind: MapKind) -> u32 {
    match kind {
        MapKind::Services => sizes.services,
        MapKind::Backends => sizes.backends,
        MapKind::RevNat => sizes.rev_nat,
        MapKind::SourceRanges => sizes.source_ranges,
    }
}

/// Rounds a size up to a multiple of 1/16 of its next power of two: a few round numbers
/// instead of arbitrary ones, for little memory (the kernel rounds a hash map's buckets up
/// to a power of two anyway; its preallocated entries follow the size itself).
pub fn round_up(n: u64) -> u64 {
    let granule = (n.max(1).next_power_of_two() / 16).max(MIN_GRANULE);
    n.div_ceil(granule) * granule
}

/// The capacity a map of `capacity` entries should grow to when a sync fills `peak` of
/// them, within `ceiling`; None when it keeps its size (below the high-water mark, or at
/// its ceiling).
pub fn grown_size(capacity: u32, peak: usize, ceiling: u32) -> Option<u32> {
    let (capacity64, peak) = (u64::from(capacity), peak as u64);
    if capacity >= ceiling || peak * 100 <= capacity64 * HIGH_WATER_PERCENT {
        return None;
    }
    let wanted = (2 * capacity64).max((peak * 5).div_ceil(4));
    let size = round_up(wanted).min(u64::from(ceiling));
    // `ceiling` is a u32: so is the result.
    Some(u32::try_from(size).unwrap_or(ceiling))
}

/// One map's growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub kind: MapKind,
    pub family: IpFamily,
    pub from: u32,
    pub to: u32,
}

impl Step {
    pub fn map(&self) -> &'static str {
        self.kind.map_name(self.family)
    }
}

/// The maps to grow before a sync that fills each to `peak`, given their `capacity`.
pub fn plan(capacity: &PerMap, peak: &PerMap, ceilings: &Ceilings) -> Vec<Step> {
    let mut out = Vec::new();
    for kind in MapKind::ALL {
        for family in [IpFamily::V4, IpFamily::V6] {
            let from = u32::try_from(capacity.get(kind, family)).unwrap_or(u32::MAX);
            if let Some(to) = grown_size(from, peak.get(kind, family), ceilings.of(kind)) {
                out.push(Step {
                    kind,
                    family,
                    from,
                    to,
                });
            }
        }
    }
    out
}

/// Whether the sync cannot be written without the growth (some map would overflow), as
/// opposed to a growth ahead of need.
pub fn required(steps: &[Step], peak: &PerMap) -> bool {
    steps
        .iter()
        .any(|s| peak.get(s.kind, s.family) > s.from as usize)
}

/// The capacity a growable map gets at load time: the size a previous agent grew it to
/// (`pinned`), kept within the starting size and the ceiling; the starting size when
/// nothing is pinned.
pub fn load_size(pinned: Option<u32>, start: u32, ceiling: u32) -> u32 {
    match pinned {
        Some(pinned) => pinned.min(ceiling.max(start)).max(start),
        None => start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_map(entries: &[(MapKind, IpFamily, usize)]) -> PerMap {
        let mut out = PerMap::default();
        for (kind, family, n) in entries {
            out.add(*kind, *family, *n);
        }
        out
    }

    #[test]
    fn a_map_grows_past_the_high_water_mark_to_twice_its_size_or_more() {
        let unlimited = MAX_MAP_ENTRIES;
        // At or below 80 %: no growth.
        assert_eq!(grown_size(1000, 800, unlimited), None);
        assert_eq!(grown_size(1000, 0, unlimited), None);
        // Above: twice the size...
        assert_eq!(grown_size(1000, 801, unlimited), Some(2048));
        assert_eq!(grown_size(256, 300, unlimited), Some(512));
        // ...or a quarter more than the peak when that is more (a cold start with far
        // more services than the defaults: one step).
        assert_eq!(grown_size(65_536, 1_200_000, unlimited), Some(1_572_864));
    }

    #[test]
    fn growth_stops_at_the_ceiling() {
        assert_eq!(grown_size(256, 300, 384), Some(384));
        assert_eq!(grown_size(384, 384, 384), None, "at the ceiling");
        assert_eq!(grown_size(512, 600, 384), None, "above it (a larger start)");
        assert_eq!(grown_size(1 << 24, 16_000_000, REV_NAT_KEYS), None);
        assert_eq!(
            grown_size(1 << 23, 8_000_000, REV_NAT_KEYS),
            Some(REV_NAT_KEYS)
        );
        // 16-bit ids once capped this map at 65,536 entries; 100,000 frontends fit now.
        assert_eq!(grown_size(65_536, 100_000, REV_NAT_KEYS), Some(131_072));
    }

    #[test]
    fn sizes_are_rounded_to_a_sixteenth_of_their_power_of_two() {
        assert_eq!(round_up(1), 64);
        assert_eq!(round_up(512), 512);
        assert_eq!(round_up(513), 576);
        assert_eq!(round_up(1_500_000), 1_572_864);
        assert_eq!(round_up(131_072), 131_072);
        for n in [1000u64, 65_537, 999_999, 16_777_216] {
            let r = round_up(n);
            assert!(
                r >= n && (r - n) * 16 <= n.next_power_of_two(),
                "{n} -> {r}"
            );
        }
    }

    #[test]
    fn ceilings_default_to_what_the_layout_allows() {
        let c = Ceilings::from_config(&MapSizeLimits::default());
        assert_eq!(c.of(MapKind::Services), MAX_MAP_ENTRIES);
        assert_eq!(c.of(MapKind::RevNat), REV_NAT_KEYS.min(MAX_MAP_ENTRIES));
        let c = Ceilings::from_config(&MapSizeLimits {
            backends: Some(4096),
            rev_nat: Some(1 << 20),
            ..Default::default()
        });
        assert_eq!(c.of(MapKind::Backends), 4096);
        assert_eq!(c.of(MapKind::RevNat), 1 << 20);
        // Room is the ceiling, or the capacity of a map already larger.
        let room = c.room(&per_map(&[(MapKind::Backends, IpFamily::V4, 8192)]));
        assert_eq!(room.get(MapKind::Backends, IpFamily::V4), 8192);
        assert_eq!(room.get(MapKind::Backends, IpFamily::V6), 4096);
    }

    #[test]
    fn only_the_short_maps_of_a_sync_grow() {
        use IpFamily::{V4, V6};
        use MapKind::*;
        let capacity = per_map(&[
            (Services, V4, 256),
            (Services, V6, 256),
            (Backends, V4, 256),
            (Backends, V6, 256),
            (RevNat, V4, 64),
            (RevNat, V6, 64),
            (SourceRanges, V4, 16),
            (SourceRanges, V6, 16),
        ]);
        let peak = per_map(&[(Services, V4, 300), (Backends, V4, 100), (RevNat, V4, 60)]);
        let steps = plan(
            &capacity,
            &peak,
            &Ceilings::from_config(&Default::default()),
        );
        assert_eq!(
            steps,
            vec![
                Step {
                    kind: Services,
                    family: V4,
                    from: 256,
                    to: 512
                },
                Step {
                    kind: RevNat,
                    family: V4,
                    from: 64,
                    to: 128
                },
            ]
        );
        assert_eq!(steps[0].map(), "SVC4_V2");
        assert!(required(&steps, &peak), "300 entries do not fit in 256");
        let ahead = per_map(&[(RevNat, V4, 60)]);
        assert!(!required(
            &plan(
                &capacity,
                &ahead,
                &Ceilings::from_config(&Default::default())
            ),
            &ahead
        ));
    }

    #[test]
    fn a_grown_map_keeps_its_size_across_restarts_within_start_and_ceiling() {
        assert_eq!(load_size(None, 256, 4096), 256);
        assert_eq!(load_size(Some(1024), 256, 4096), 1024, "grown earlier");
        assert_eq!(
            load_size(Some(8192), 256, 4096),
            4096,
            "ceiling lowered since"
        );
        assert_eq!(load_size(Some(128), 256, 4096), 256, "start raised since");
        assert_eq!(load_size(Some(1024), 256, 256), 256, "growth switched off");
    }
}
