// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Map definitions. BTF maps (`.maps` section) so that `bpftool map dump` shows field names;
//! the agent pins them and overrides `max_entries` from its configuration at load time.
//! The static names are the pinned names (see `proxy_common::maps`).

use crate::packet::Packet;
use aya_ebpf::{
    bindings::bpf_fib_lookup,
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, SkStorage},
    macros::btf_map,
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend4Value, Backend6Value, Ct4Key, Ct6Key, CtValue, Frag4Key,
    Frag6Key, FragPorts, LbConfig, NodeAddr4Key, NodeAddr6Key, RevNat4Value, RevNat6Value,
    SockFrontend, SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value, SourceRange4,
    SourceRange6, Svc4Key, Svc6Key, SvcValue, maps::*,
};

#[btf_map]
pub static SVC4_V2: HashMap<Svc4Key, SvcValue, DEFAULT_SVC_ENTRIES> = HashMap::new();
#[btf_map]
pub static SVC6_V2: HashMap<Svc6Key, SvcValue, DEFAULT_SVC_ENTRIES> = HashMap::new();

#[btf_map]
pub static BACKENDS4_V1: HashMap<u32, Backend4Value, DEFAULT_BACKEND_ENTRIES> = HashMap::new();
#[btf_map]
pub static BACKENDS6_V1: HashMap<u32, Backend6Value, DEFAULT_BACKEND_ENTRIES> = HashMap::new();

#[btf_map]
pub static REV_NAT4_V2: HashMap<u32, RevNat4Value, DEFAULT_REV_NAT_ENTRIES> = HashMap::new();
#[btf_map]
pub static REV_NAT6_V2: HashMap<u32, RevNat6Value, DEFAULT_REV_NAT_ENTRIES> = HashMap::new();

#[btf_map]
pub static SOCK_REV_NAT4_V2: LruHashMap<
    SockRevNat4Key,
    SockRevNat4Value,
    DEFAULT_SOCK_REV_NAT_ENTRIES,
> = LruHashMap::new();
#[btf_map]
pub static SOCK_REV_NAT6_V2: LruHashMap<
    SockRevNat6Key,
    SockRevNat6Value,
    DEFAULT_SOCK_REV_NAT_ENTRIES,
> = LruHashMap::new();

#[btf_map]
pub static SOCK_FRONTEND_V1: SkStorage<SockFrontend> = SkStorage::new();

#[btf_map]
pub static AFFINITY_V2: LruHashMap<AffinityKey, AffinityValue, DEFAULT_AFFINITY_ENTRIES> =
    LruHashMap::new();

#[btf_map]
pub static SVC_CIDRS4_V1: LpmTrie<[u8; 4], u8, DEFAULT_CIDR_ENTRIES> = LpmTrie::new();
#[btf_map]
pub static SVC_CIDRS6_V1: LpmTrie<[u8; 16], u8, DEFAULT_CIDR_ENTRIES> = LpmTrie::new();

/// What the local-traffic detector calls local (see `proxy_common::LB_CFG_LOCAL_DETECTOR`).
#[btf_map]
pub static LOCAL_CIDRS4_V1: LpmTrie<[u8; 4], u8, DEFAULT_CIDR_ENTRIES> = LpmTrie::new();
#[btf_map]
pub static LOCAL_CIDRS6_V1: LpmTrie<[u8; 16], u8, DEFAULT_CIDR_ENTRIES> = LpmTrie::new();

#[btf_map]
pub static NODEPORT_ADDRS4_V1: HashMap<NodeAddr4Key, u8, DEFAULT_NODE_ADDR_ENTRIES> =
    HashMap::new();
#[btf_map]
pub static NODEPORT_ADDRS6_V1: HashMap<NodeAddr6Key, u8, DEFAULT_NODE_ADDR_ENTRIES> =
    HashMap::new();

#[btf_map]
pub static SRC_RANGES4_V2: LpmTrie<SourceRange4, u8, DEFAULT_SRC_RANGE_ENTRIES> = LpmTrie::new();
#[btf_map]
pub static SRC_RANGES6_V2: LpmTrie<SourceRange6, u8, DEFAULT_SRC_RANGE_ENTRIES> = LpmTrie::new();

#[btf_map]
pub static CT4_V1: LruHashMap<Ct4Key, CtValue, DEFAULT_CT_ENTRIES> = LruHashMap::new();
#[btf_map]
pub static CT6_V1: LruHashMap<Ct6Key, CtValue, DEFAULT_CT_ENTRIES> = LruHashMap::new();

#[btf_map]
pub static FRAG4_V1: LruHashMap<Frag4Key, FragPorts, DEFAULT_FRAG_ENTRIES> = LruHashMap::new();
#[btf_map]
pub static FRAG6_V1: LruHashMap<Frag6Key, FragPorts, DEFAULT_FRAG_ENTRIES> = LruHashMap::new();

#[btf_map]
pub static LB_CONFIG_V1: Array<LbConfig, 1> = Array::new();

/// Maglev tables (see `proxy_common::maps::MAGLEV`); the agent sets the size.
#[btf_map]
pub static MAGLEV_V1: Array<u32, DEFAULT_MAGLEV_ENTRIES> = Array::new();

/// The entries of one Maglev table; 0: no Maglev (see `proxy_common::maps::MAGLEV_CONFIG`).
#[btf_map]
pub static MAGLEV_CONFIG_V1: Array<u32, 1> = Array::new();

#[btf_map]
pub static XDP_STATS_V1: PerCpuArray<u64, { XDP_STAT_SLOTS as usize }> = PerCpuArray::new();

/// Counts one event in [`XDP_STATS_V1`].
#[inline(always)]
pub fn count_xdp(slot: u32) {
    if let Some(counter) = XDP_STATS_V1.get_ptr_mut(slot) {
        // SAFETY: a per-CPU slot; only this CPU's programs touch it.
        unsafe { *counter += 1 };
    }
}

#[btf_map]
pub static DATAPATH_STATS_V1: PerCpuArray<u64, { DATAPATH_STAT_SLOTS as usize }> =
    PerCpuArray::new();

/// Counts one drop or reject in [`DATAPATH_STATS_V1`] (`reason`: a `proxy_common::maps`
/// `DROP_*` / `REJECT_*` slot). Inlined: a frame of its own under `forward` took the
/// longest chain (`tc_pod_ingress`) over the verifier's 512 bytes, while its key fits in
/// the callers' frames as the kernel rounds them (to 32 bytes;
/// `ebpf_object::stack_budget` checks every chain).
#[inline(always)]
pub fn count_datapath(reason: u32) {
    if let Some(counter) = DATAPATH_STATS_V1.get_ptr_mut(reason) {
        // SAFETY: a per-CPU slot; only this CPU's programs touch it.
        unsafe { *counter += 1 };
    }
}

/// Per-CPU scratch space for FIB lookups: the parameters are too big for the BPF stack of
/// the longest call chain. Not pinned (nothing persists in it).
#[btf_map]
pub static FIB_SCRATCH: PerCpuArray<bpf_fib_lookup, 1> = PerCpuArray::new();

/// Per-CPU scratch space for a new CT entry being built (too big for the stack).
#[btf_map]
pub static CT_SCRATCH: PerCpuArray<CtValue, 1> = PerCpuArray::new();

/// Bytes of [`REPLY_SCRATCH`]: the largest generated answer after the Ethernet header, an
/// ICMPv6 error quoting an IPv6 header and 8 bytes (40 + 8 + 40 + 8).
pub const REPLY_SCRATCH_LEN: usize = 96;

/// Per-CPU scratch space for a generated answer (TCP RST, ICMP port unreachable).
#[btf_map]
pub static REPLY_SCRATCH: PerCpuArray<[u8; REPLY_SCRATCH_LEN], 1> = PerCpuArray::new();

/// Per-CPU scratch space for the parsed packet of the tc and XDP programs (slot 0) and the
/// packet an ICMP error quotes (slot 1), so that they do not sit on the stack under every
/// call of the chain.
#[btf_map]
pub static PKT4_SCRATCH: PerCpuArray<Packet<u32>, 2> = PerCpuArray::new();
#[btf_map]
pub static PKT6_SCRATCH: PerCpuArray<Packet<[u8; 16]>, 2> = PerCpuArray::new();
