// SPDX-License-Identifier: Apache-2.0
//! What writing the service map costs per element: a fresh BPF hash map with the agent's
//! service-map key and value types ([`Svc4Key`] -> [`SvcValue`], the map the agent writes
//! most: a slot per frontend and per backend), filled one `BPF_MAP_UPDATE_ELEM` at a time
//! (as the agent writes) against `BPF_MAP_UPDATE_BATCH` in chunks, then every entry
//! overwritten both ways. The map lives in this process only: closing it frees it.

use std::time::{Duration, Instant};

use aya::maps::{HashMap as AyaHash, IterableMap, MapData};
use proxy_common::{Svc4Key, SvcValue};

use super::super::{
    error::{Error, Result},
    rows::Row,
    signals,
};

pub const MODE_SINGLE: &str = "map-single";
pub const MODE_BATCH: &str = "map-batch";
pub const METRIC_INSERT: &str = "update_ns_per_elem";
pub const METRIC_OVERWRITE: &str = "overwrite_ns_per_elem";

/// Entry `i` of the benchmark's service map: frontend 10.100.x.y:80/TCP, slot 0, as the
/// agent writes a frontend (the value carries a count, a reverse-NAT id and flags).
pub fn entry(i: u32) -> (Svc4Key, SvcValue) {
    let key = Svc4Key {
        addr: (0x0a64_0000u32.wrapping_add(i)).to_be(),
        dport: 80u16.to_be(),
        slot: 0,
        proto: 6,
        scope: 0,
        _pad: [0; 2],
    };
    let value = SvcValue {
        backend_id: i,
        count: 1,
        rev_nat_id: i & proxy_common::MAX_REV_NAT_ID,
        flags: 0,
        maglev_table: 0,
        _pad: 0,
    };
    (key, value)
}

type SvcMap = AyaHash<MapData, Svc4Key, SvcValue>;

fn create(entries: u32) -> Result<SvcMap> {
    SvcMap::create(entries, 0)
        .map_err(|e| Error::Setup(format!("creating a {entries}-entry hash map: {e}")))
}

/// Every entry written with one update each; the time per element.
fn single(map: &mut SvcMap, keys: &[Svc4Key], values: &[SvcValue]) -> Result<Duration> {
    let started = Instant::now();
    for (i, (key, value)) in keys.iter().zip(values).enumerate() {
        if i % 65_536 == 0 {
            signals::check()?;
        }
        map.insert(key, value, 0)
            .map_err(|e| Error::Setup(format!("BPF_MAP_UPDATE_ELEM: {e}")))?;
    }
    Ok(started.elapsed())
}

/// Every entry written in batches of `batch`; the time per element.
fn batched(map: &SvcMap, keys: &[Svc4Key], values: &[SvcValue], batch: usize) -> Result<Duration> {
    let data: &MapData = map.map();
    let started = Instant::now();
    for (k, v) in keys.chunks(batch).zip(values.chunks(batch)) {
        signals::check()?;
        let written = super::batch::map_update_batch(data, k, v)
            .map_err(Error::io("BPF_MAP_UPDATE_BATCH"))?;
        if written as usize != k.len() {
            return Err(Error::Setup(format!(
                "BPF_MAP_UPDATE_BATCH wrote {written} of {} entries",
                k.len()
            )));
        }
    }
    Ok(started.elapsed())
}

fn per_elem(took: Duration, n: usize) -> f64 {
    took.as_nanos() as f64 / n.max(1) as f64
}

/// One rep at `entries` entries: rows for both modes, insert and overwrite. Each fresh
/// map is dropped before the next is created, so at most one is in memory.
pub fn measure(entries: u32, batch: usize, rep: u32) -> Result<Vec<Row>> {
    let (keys, values): (Vec<Svc4Key>, Vec<SvcValue>) = (0..entries).map(entry).unzip();
    let n = keys.len();
    // Fresh map A: single inserts, then batched overwrites.
    let (single_insert, batch_overwrite) = {
        let mut map = create(entries)?;
        let insert = single(&mut map, &keys, &values)?;
        let overwrite = batched(&map, &keys, &values, batch)?;
        check_full(&map, entries)?;
        (insert, overwrite)
    };
    // Fresh map B: batched inserts, then single overwrites.
    let (batch_insert, single_overwrite) = {
        let mut map = create(entries)?;
        let insert = batched(&map, &keys, &values, batch)?;
        let overwrite = single(&mut map, &keys, &values)?;
        check_full(&map, entries)?;
        (insert, overwrite)
    };
    let row = |mode: &str, metric: &str, ns: f64, ratio: Option<f64>| Row {
        bench: "bpf",
        mode: mode.into(),
        n: u64::from(entries),
        rep: rep.to_string(),
        metric: metric.into(),
        value: ns,
        unit: "ns",
        ratio,
    };
    let mut rows = Vec::new();
    for (metric, s, b) in [
        (METRIC_INSERT, single_insert, batch_insert),
        (METRIC_OVERWRITE, single_overwrite, batch_overwrite),
    ] {
        let (s, b) = (per_elem(s, n), per_elem(b, n));
        rows.push(row(MODE_SINGLE, metric, s, None));
        rows.push(row(MODE_BATCH, metric, b, (s > 0.0).then(|| b / s)));
    }
    Ok(rows)
}

/// Proof the writes landed: the map holds every key (sampled: first, middle, last).
fn check_full(map: &SvcMap, entries: u32) -> Result<()> {
    for i in [0, entries / 2, entries.saturating_sub(1)] {
        let (key, value) = entry(i);
        match map.get(&key, 0) {
            Ok(found) if found == value => {}
            other => {
                return Err(Error::Setup(format!(
                    "entry {i} of {entries} reads back as {other:?}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_distinct_frontends() {
        let (a, _) = entry(0);
        let (b, vb) = entry(1);
        assert_ne!(a, b);
        assert_eq!(u32::from_be(b.addr), 0x0a64_0001);
        assert_eq!(u16::from_be(b.dport), 80);
        assert_eq!((b.slot, vb.count), (0, 1));
        assert_ne!(entry(999_999).0, entry(0).0);
    }
}
