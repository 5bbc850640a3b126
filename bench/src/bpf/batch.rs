// SPDX-License-Identifier: Apache-2.0
//! The batched map update the benchmark compares with one update per element: the agent's
//! own (`proxy_agent::sys::map_update_batch`, which its full syncs use), with the count of
//! elements written before a failure dropped, as the benchmark only needs to know that
//! the whole batch went in.

use std::io;

/// `BPF_MAP_UPDATE_BATCH`: writes `keys[i] -> values[i]` for every `i` in one system
/// call; returns how many elements the kernel wrote (all of them on success).
pub fn map_update_batch<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::MapData,
    keys: &[K],
    values: &[V],
) -> io::Result<u32> {
    proxy_agent::sys::map_update_batch(map, keys, values).map_err(|(error, _written)| error)
}
