// SPDX-License-Identifier: Apache-2.0
//! Reading the pinned maps back, as every full sync does (and drift repair with it): in
//! batches of 8,192 entries per system call (`BPF_MAP_LOOKUP_BATCH`) where the kernel has
//! them, one entry at a time otherwise. What a read returns is exactly what was written:
//! more entries than a batch holds, in a hash map and in an LRU hash map, and nothing from
//! an empty map.

use proxy_agent::proxier::ebpf::load_and_attach;
use proxy_common::{AffinityKey, AffinityValue, Backend4Value, proto};
use tests::{
    privileged::{TempBpffs, TempCgroup, load_options},
    require_root,
};

#[test]
fn a_read_returns_every_entry_written_and_nothing_else() {
    require_root!();
    let bpffs = TempBpffs::new("kpe-mapreads");
    let cgroup = TempCgroup::new("kpe-mapreads");
    let mut loaded = match load_and_attach(&load_options(&bpffs, &cgroup)) {
        Ok(loaded) => loaded,
        Err(e) if std::env::var_os("PROXY_REQUIRE_EBPF").is_none() => {
            eprintln!("SKIP map reads: {e} (build with PROXY_REQUIRE_EBPF=1)");
            return;
        }
        Err(e) => panic!("loading the eBPF object: {e}"),
    };
    let maps = &mut loaded.maps;

    // Two batches and part of a third.
    let backends: Vec<(u32, Backend4Value)> = (1..=20_000u32)
        .map(|id| {
            let value = Backend4Value {
                addr: (0x0a00_0000 | id).to_be(),
                port: 8080u16.to_be(),
                proto: proto::TCP,
                flags: 0,
            };
            (id, value)
        })
        .collect();
    maps.backends4
        .put_many(&backends)
        .expect("writing backends");
    let mut read = maps.backends4.entries().expect("reading backends");
    read.sort_by_key(|(id, _)| *id);
    assert_eq!(read.len(), backends.len());
    assert!(read == backends, "the backends read back differ");

    let affinity: Vec<(AffinityKey, AffinityValue)> = (1..=9_000u32)
        .map(|n| {
            let mut client = [0u8; 16];
            client[..4].copy_from_slice(&n.to_be_bytes());
            let key = AffinityKey {
                client,
                rev_nat_id: n % 7,
                ..Default::default()
            };
            let value = AffinityValue {
                backend_id: n,
                last_used: 1,
            };
            (key, value)
        })
        .collect();
    maps.affinity.put_many(&affinity).expect("writing affinity");
    let mut read = maps.affinity.entries().expect("reading affinity");
    read.sort_by_key(|(_, v)| v.backend_id);
    assert!(read == affinity, "the affinity entries read back differ");

    assert!(
        maps.rev_nat6
            .entries()
            .expect("reading an empty map")
            .is_empty(),
        "an empty map reads empty"
    );
}
