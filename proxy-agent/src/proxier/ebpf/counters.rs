// SPDX-License-Identifier: Apache-2.0
//! The programs' own drop and reject counters (`DATAPATH_STATS_V1`, one per-CPU slot per
//! reason: `proxy_common::maps::DATAPATH_REASONS`), read from the pinned map at each scrape
//! and by `proxy-agent status`.

use std::path::Path;

use aya::maps::{Map, MapData, PerCpuArray};
use proxy_common::maps::{DATAPATH_REASONS, DATAPATH_STATS, DatapathVerdict};

/// One reason's count, summed over the CPUs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DatapathCount {
    pub verdict: &'static str,
    pub reason: &'static str,
    pub packets: u64,
}

/// Every reason's count from the pinned map under `maps_dir`, in slot order; `None` when
/// no agent left the map there (another mode runs) or it cannot be read.
pub fn datapath_counts(maps_dir: &Path) -> Option<Vec<DatapathCount>> {
    let path = maps_dir.join(DATAPATH_STATS);
    let data = MapData::from_pin(&path).ok()?;
    let map: PerCpuArray<MapData, u64> = PerCpuArray::try_from(Map::PerCpuArray(data)).ok()?;
    let mut out = Vec::with_capacity(DATAPATH_REASONS.len());
    for (slot, verdict, reason) in DATAPATH_REASONS {
        let per_cpu = map.get(slot, 0).ok()?;
        out.push(DatapathCount {
            verdict: verdict_name(*verdict),
            reason,
            packets: per_cpu.iter().sum(),
        });
    }
    Some(out)
}

/// The counts of one verdict as `(reason, packets)`, for the metrics.
pub fn counts_of(maps_dir: &Path, verdict: DatapathVerdict) -> Option<Vec<(String, u64)>> {
    let name = verdict_name(verdict);
    Some(
        datapath_counts(maps_dir)?
            .into_iter()
            .filter(|c| c.verdict == name)
            .map(|c| (c.reason.to_string(), c.packets))
            .collect(),
    )
}

fn verdict_name(verdict: DatapathVerdict) -> &'static str {
    match verdict {
        DatapathVerdict::Drop => "drop",
        DatapathVerdict::Reject => "reject",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_distinct_reason_in_slot_order() {
        let mut reasons: Vec<&str> = DATAPATH_REASONS.iter().map(|(_, _, r)| *r).collect();
        for (index, (slot, _, _)) in DATAPATH_REASONS.iter().enumerate() {
            assert_eq!(*slot as usize, index);
        }
        reasons.sort();
        reasons.dedup();
        assert_eq!(reasons.len(), DATAPATH_REASONS.len());
    }

    #[test]
    fn no_pinned_map_reads_as_none() {
        let dir = std::env::temp_dir().join(format!("kpe-no-counters-{}", std::process::id()));
        assert_eq!(datapath_counts(&dir), None);
        assert_eq!(counts_of(&dir, DatapathVerdict::Drop), None);
    }
}
