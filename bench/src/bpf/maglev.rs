// SPDX-License-Identifier: Apache-2.0
//! What building a Maglev table costs the agent: the table of `size` entries over N
//! backends (the agent's own builder, `proxier::ebpf::build_maglev_table`), against a
//! baseline measured in the same rep: writing that table into a fresh BPF array of the
//! same size one `BPF_MAP_UPDATE_ELEM` per entry, as the agent writes it. The ratio says
//! what the build adds to the write a changed backend set costs anyway (build / write).
//! The array lives in this process only: closing it frees it.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData};
use proxy_agent::proxier::ebpf::{BackendAddr, build_maglev_table};

use super::super::{
    error::{Error, Result},
    rows::Row,
    signals,
};

pub const MODE_BUILD: &str = "maglev-build";
pub const MODE_WRITE: &str = "maglev-write";

/// The metric of a table of `size` entries.
pub fn metric(size: u32) -> String {
    format!("maglev_table_{size}_ms")
}

/// Backend `i`: 10.x.y.z:8080/TCP, with id `i + 1` (any ids: the layout depends on the
/// addresses).
fn backends(n: u32) -> Vec<(BackendAddr, u32)> {
    (0..n)
        .map(|i| {
            let b = (0x0a00_0000u32 + i).to_be_bytes();
            (
                BackendAddr {
                    addr: Ipv4Addr::from(b).into(),
                    port: 8080,
                    proto: 6,
                },
                i + 1,
            )
        })
        .collect()
}

fn write(table: &[u32]) -> Result<Duration> {
    let size = u32::try_from(table.len())
        .map_err(|_| Error::Setup(format!("a table of {} entries", table.len())))?;
    let mut map: Array<MapData, u32> = Array::create(size, 0)
        .map_err(|e| Error::Setup(format!("creating a {size}-entry array: {e}")))?;
    let started = Instant::now();
    for (i, id) in (0u32..).zip(table) {
        map.set(i, id, 0)
            .map_err(|e| Error::Setup(format!("BPF_MAP_UPDATE_ELEM: {e}")))?;
    }
    let took = started.elapsed();
    // Proof the writes landed (sampled: first, middle, last).
    for i in [0, size / 2, size - 1] {
        let found = map
            .get(&i, 0)
            .map_err(|e| Error::Setup(format!("reading entry {i} back: {e}")))?;
        if found != table[i as usize] {
            return Err(Error::Setup(format!(
                "entry {i} reads back as {found}, not {}",
                table[i as usize]
            )));
        }
    }
    Ok(took)
}

/// One rep: the build of a table of `size` entries over `n` backends, and the write of
/// that table (the baseline).
pub fn measure(n: u32, size: u32, rep: u32) -> Result<Vec<Row>> {
    signals::check()?;
    let members = backends(n);
    let started = Instant::now();
    let table = build_maglev_table(&members, size);
    let build = started.elapsed();
    if table.contains(&0) {
        return Err(Error::Setup(format!(
            "the table of {size} entries over {n} backends has empty entries"
        )));
    }
    let write = write(&table)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let row = |mode: &str, value: f64, ratio: Option<f64>| Row {
        bench: "bpf",
        mode: mode.into(),
        n: u64::from(n),
        rep: rep.to_string(),
        metric: metric(size),
        value,
        unit: "ms",
        ratio,
    };
    Ok(vec![
        row(MODE_WRITE, ms(write), None),
        row(
            MODE_BUILD,
            ms(build),
            (write > Duration::ZERO).then(|| ms(build) / ms(write)),
        ),
    ])
}
