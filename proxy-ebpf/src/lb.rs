// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Service lookup and backend selection, shared by the socket and tc programs and written
//! once for both address families through [`Family`].

use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns};
use aya_ebpf::maps::lpm_trie::Key as LpmKey;
use proxy_common::{
    AffinityKey, AffinityValue, Backend4Value, Backend6Value, NodeAddr4Key, NodeAddr6Key,
    RevNat4Value, RevNat6Value, SCOPE_EXTERNAL, SCOPE_INTERNAL, SOURCE_RANGE_PREFIX_BITS,
    SourceRange4, SourceRange6, Svc4Key, Svc6Key, SvcValue, svc_flags,
};

use crate::maps::*;

/// An address family: its key and value types and the maps that hold them.
pub trait Family {
    /// Address in network byte order.
    type Addr: Copy + PartialEq + 'static;
    type SvcKey: Copy;
    type Backend: Copy;

    fn svc_key(addr: Self::Addr, port: u16, proto: u8, scope: u8, slot: u16) -> Self::SvcKey;
    fn set_slot(key: &mut Self::SvcKey, slot: u16);
    fn set_scope(key: &mut Self::SvcKey, scope: u8);
    fn svc(key: &Self::SvcKey) -> Option<SvcValue>;
    fn backend(id: u32) -> Option<Self::Backend>;
    fn backend_target(backend: &Self::Backend) -> (Self::Addr, u16);
    /// The frontend a rev_nat_id stands for.
    fn rev_nat(id: u32) -> Option<(Self::Addr, u16)>;
    fn is_nodeport_addr(addr: Self::Addr) -> bool;
    fn in_service_cidr(addr: Self::Addr) -> bool;
    /// Whether the local-traffic detector's CIDRs hold `addr` (a pod source).
    fn in_local_cidr(addr: Self::Addr) -> bool;
    fn source_allowed(rev_nat_id: u32, src: Self::Addr) -> bool;
    fn zero() -> Self::Addr;
    /// The address in 16 bytes (IPv4 in the first four), as map values that serve both
    /// families hold it.
    fn to16(a: Self::Addr) -> [u8; 16];
    fn from16(b: &[u8; 16]) -> Self::Addr;
    /// Affinity key bytes for a client address.
    fn affinity_client(addr: Self::Addr) -> ([u8; 16], u8);
}

pub enum V4 {}
pub enum V6 {}

impl Family for V4 {
    type Addr = u32;
    type SvcKey = Svc4Key;
    type Backend = Backend4Value;

    #[inline(always)]
    fn svc_key(addr: u32, port: u16, proto: u8, scope: u8, slot: u16) -> Svc4Key {
        Svc4Key {
            addr,
            dport: port,
            slot,
            proto,
            scope,
            _pad: [0; 2],
        }
    }
    #[inline(always)]
    fn set_slot(key: &mut Svc4Key, slot: u16) {
        key.slot = slot;
    }
    #[inline(always)]
    fn set_scope(key: &mut Svc4Key, scope: u8) {
        key.scope = scope;
    }
    #[inline(always)]
    fn svc(key: &Svc4Key) -> Option<SvcValue> {
        // SAFETY: the value is copied out before any other map operation.
        unsafe { SVC4_V2.get(key).copied() }
    }
    #[inline(always)]
    fn backend(id: u32) -> Option<Backend4Value> {
        // SAFETY: the value is copied out before any other map operation.
        unsafe { BACKENDS4_V1.get(id).copied() }
    }
    #[inline(always)]
    fn backend_target(b: &Backend4Value) -> (u32, u16) {
        (b.addr, b.port)
    }
    #[inline(always)]
    fn rev_nat(id: u32) -> Option<(u32, u16)> {
        // SAFETY: the value is copied out before any other map operation.
        unsafe { REV_NAT4_V2.get(id).map(|v: &RevNat4Value| (v.addr, v.port)) }
    }
    #[inline(always)]
    fn is_nodeport_addr(addr: u32) -> bool {
        // SAFETY: only whether the key is present is used.
        unsafe { NODEPORT_ADDRS4_V1.get(NodeAddr4Key { addr }).is_some() }
    }
    #[inline(always)]
    fn in_service_cidr(addr: u32) -> bool {
        SVC_CIDRS4_V1
            .get(&LpmKey::new(32, addr.to_ne_bytes()))
            .is_some()
    }
    #[inline(always)]
    fn in_local_cidr(addr: u32) -> bool {
        LOCAL_CIDRS4_V1
            .get(&LpmKey::new(32, addr.to_ne_bytes()))
            .is_some()
    }
    #[inline(always)]
    fn source_allowed(rev_nat_id: u32, src: u32) -> bool {
        let data = SourceRange4 {
            rev_nat_id: rev_nat_id.to_be(),
            addr: src,
        };
        SRC_RANGES4_V2
            .get(&LpmKey::new(SOURCE_RANGE_PREFIX_BITS + 32, data))
            .is_some()
    }
    #[inline(always)]
    fn zero() -> u32 {
        0
    }
    #[inline(always)]
    fn to16(a: u32) -> [u8; 16] {
        let b = a.to_ne_bytes();
        let mut out = [0u8; 16];
        out[0] = b[0];
        out[1] = b[1];
        out[2] = b[2];
        out[3] = b[3];
        out
    }
    #[inline(always)]
    fn from16(b: &[u8; 16]) -> u32 {
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }
    #[inline(always)]
    fn affinity_client(addr: u32) -> ([u8; 16], u8) {
        let mut client = [0u8; 16];
        let b = addr.to_ne_bytes();
        client[0] = b[0];
        client[1] = b[1];
        client[2] = b[2];
        client[3] = b[3];
        (client, proxy_common::AFFINITY_CLIENT_V4)
    }
}

impl Family for V6 {
    type Addr = [u8; 16];
    type SvcKey = Svc6Key;
    type Backend = Backend6Value;

    #[inline(always)]
    fn svc_key(addr: [u8; 16], port: u16, proto: u8, scope: u8, slot: u16) -> Svc6Key {
        Svc6Key {
            addr,
            dport: port,
            slot,
            proto,
            scope,
            _pad: [0; 2],
        }
    }
    #[inline(always)]
    fn set_slot(key: &mut Svc6Key, slot: u16) {
        key.slot = slot;
    }
    #[inline(always)]
    fn set_scope(key: &mut Svc6Key, scope: u8) {
        key.scope = scope;
    }
    #[inline(always)]
    fn svc(key: &Svc6Key) -> Option<SvcValue> {
        // SAFETY: the value is copied out before any other map operation.
        unsafe { SVC6_V2.get(key).copied() }
    }
    #[inline(always)]
    fn backend(id: u32) -> Option<Backend6Value> {
        // SAFETY: the value is copied out before any other map operation.
        unsafe { BACKENDS6_V1.get(id).copied() }
    }
    #[inline(always)]
    fn backend_target(b: &Backend6Value) -> ([u8; 16], u16) {
        (b.addr, b.port)
    }
    #[inline(always)]
    fn rev_nat(id: u32) -> Option<([u8; 16], u16)> {
        // SAFETY: the value is copied out before any other map operation.
        unsafe { REV_NAT6_V2.get(id).map(|v: &RevNat6Value| (v.addr, v.port)) }
    }
    #[inline(always)]
    fn is_nodeport_addr(addr: [u8; 16]) -> bool {
        // SAFETY: only whether the key is present is used.
        unsafe { NODEPORT_ADDRS6_V1.get(NodeAddr6Key { addr }).is_some() }
    }
    #[inline(always)]
    fn in_service_cidr(addr: [u8; 16]) -> bool {
        SVC_CIDRS6_V1.get(&LpmKey::new(128, addr)).is_some()
    }
    #[inline(always)]
    fn in_local_cidr(addr: [u8; 16]) -> bool {
        LOCAL_CIDRS6_V1.get(&LpmKey::new(128, addr)).is_some()
    }
    #[inline(always)]
    fn source_allowed(rev_nat_id: u32, src: [u8; 16]) -> bool {
        let data = SourceRange6 {
            rev_nat_id: rev_nat_id.to_be(),
            addr: src,
        };
        SRC_RANGES6_V2
            .get(&LpmKey::new(SOURCE_RANGE_PREFIX_BITS + 128, data))
            .is_some()
    }
    #[inline(always)]
    fn zero() -> [u8; 16] {
        [0; 16]
    }
    #[inline(always)]
    fn to16(a: [u8; 16]) -> [u8; 16] {
        a
    }
    #[inline(always)]
    fn from16(b: &[u8; 16]) -> [u8; 16] {
        *b
    }
    #[inline(always)]
    fn affinity_client(addr: [u8; 16]) -> ([u8; 16], u8) {
        (addr, proxy_common::AFFINITY_CLIENT_V6)
    }
}

/// What a destination is, as far as load balancing goes.
pub enum Frontend<F: Family> {
    /// Not a service address (or a service port of another protocol on a non-ClusterIP
    /// address): leave it alone.
    None,
    /// A frontend: its slot-0 value and the key of the scope that was chosen.
    Service { svc: SvcValue, key: F::SvcKey },
    /// A live ClusterIP on a port or protocol it does not serve.
    Reject,
    /// An address inside a service CIDR that no service holds.
    Drop,
}

/// Looks `addr:port/proto` up the way the programs agree on: the exact frontend (scope
/// external, then internal when the frontend has two scopes and `internal` is asked for), then
/// the NodePort entry when `addr` is a NodePort address, then the ClusterIP wildcard, then the
/// service CIDRs.
#[inline(always)]
pub fn lookup_frontend<F: Family>(
    addr: F::Addr,
    port: u16,
    proto: u8,
    internal: bool,
) -> Frontend<F> {
    let mut key = F::svc_key(addr, port, proto, SCOPE_EXTERNAL, 0);
    let mut found = F::svc(&key);
    if found.is_none() && F::is_nodeport_addr(addr) {
        key = F::svc_key(F::zero(), port, proto, SCOPE_EXTERNAL, 0);
        found = F::svc(&key);
    }
    match found {
        Some(svc) => {
            if internal && svc.flags & svc_flags::TWO_SCOPES != 0 {
                let mut internal_key = key;
                F::set_scope(&mut internal_key, SCOPE_INTERNAL);
                if let Some(internal_svc) = F::svc(&internal_key) {
                    return Frontend::Service {
                        svc: internal_svc,
                        key: internal_key,
                    };
                }
            }
            Frontend::Service { svc, key }
        }
        None => {
            let wildcard = F::svc_key(addr, 0, 0, SCOPE_EXTERNAL, 0);
            if let Some(w) = F::svc(&wildcard)
                && w.flags & svc_flags::WILDCARD != 0
            {
                return Frontend::Reject;
            }
            if F::in_service_cidr(addr) {
                Frontend::Drop
            } else {
                Frontend::None
            }
        }
    }
}

/// Whether `port`/`proto` is a NodePort of some service (its frontend on every NodePort
/// address).
#[inline(always)]
pub fn is_node_port<F: Family>(port: u16, proto: u8) -> bool {
    F::svc(&F::svc_key(F::zero(), port, proto, SCOPE_EXTERNAL, 0)).is_some()
}

/// Where a client of the per-packet path sits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ClientSide {
    /// Arrived on an uplink: outside the node (or a pod of another node routed here).
    Outside,
    /// A pod of this node (the pod-side program).
    Pod,
}

/// Whether pods of this node count as local traffic, i.e. short-circuit to the internal
/// scope of external frontends (a local-traffic detector is configured, as upstream's
/// KUBE-EXT chains jump to the cluster chain for local sources only then).
#[inline(always)]
pub fn pods_are_local(cfg_flags: u32) -> bool {
    cfg_flags & proxy_common::LB_CFG_LOCAL_DETECTOR != 0
}

/// Whether a new flow to the frontend `svc` (its chosen scope's slot 0) is masqueraded to
/// the node, following upstream's rules: external frontends of eTP=Cluster always
/// (`MASQUERADE`); a ClusterIP with masqueradeAll, or when the local-traffic detector says
/// the source is not local ("masquerade off-cluster traffic to services", which lets a
/// cluster route its service CIDR to any node); never otherwise. Pods of this node are
/// local whenever a detector exists; other sources when its CIDRs hold them.
#[inline(never)]
pub fn masquerade_flow<F: Family>(
    svc: &SvcValue,
    cfg_flags: u32,
    src: &F::Addr,
    side: ClientSide,
) -> bool {
    if svc.flags & svc_flags::MASQUERADE != 0 {
        return true;
    }
    if svc.flags & svc_flags::CLUSTER_IP == 0 {
        return false;
    }
    if cfg_flags & proxy_common::LB_CFG_MASQUERADE_ALL != 0 {
        return true;
    }
    if !pods_are_local(cfg_flags) {
        return false;
    }
    match side {
        ClientSide::Pod => false,
        ClientSide::Outside => !F::in_local_cidr(*src),
    }
}

/// Who the client is, for sessionAffinity ClientIP.
#[derive(Clone, Copy)]
pub enum Client<A> {
    /// A network namespace (socket programs: one per pod, one for the node).
    Netns(u64),
    Addr(A),
}

/// The Maglev hash of a flow (`proxy_common::maglev::flow_hash`), in a frame of its own so
/// that the 16-byte copies of the addresses do not sit on the caller's stack.
#[inline(never)]
pub fn flow_hash<F: Family>(
    saddr: &F::Addr,
    daddr: &F::Addr,
    sport: u16,
    dport: u16,
    proto: u8,
) -> u32 {
    proxy_common::maglev::flow_hash(&F::to16(*saddr), &F::to16(*daddr), sport, dport, proto)
}

/// A flow's Maglev hash, or none, in one register: `select_backend` has no argument to spare
/// for an `Option` (BPF calls pass at most five, in registers).
#[derive(Clone, Copy)]
pub struct MaglevHash(u64);

impl MaglevHash {
    pub const NONE: Self = Self(u64::MAX);

    #[inline(always)]
    pub fn of(hash: u32) -> Self {
        Self(u64::from(hash))
    }

    #[inline(always)]
    fn get(self) -> Option<u32> {
        u32::try_from(self.0).ok()
    }
}

/// The backend entry `hash % size` of Maglev table `table` names; None when there is none
/// (no table size configured, an entry not written yet, a backend gone): the caller then
/// picks at random rather than failing the flow.
#[inline(always)]
fn maglev_pick<F: Family>(table: u16, hash: u32) -> Option<(u32, F::Backend)> {
    let size = *MAGLEV_CONFIG_V1.get(0)?;
    if size == 0 {
        return None;
    }
    // The agent keeps tables * size within the map (and u32).
    let index = u32::from(table)
        .wrapping_mul(size)
        .wrapping_add(hash % size);
    let backend_id = MAGLEV_V1.get(index).copied()?;
    if backend_id == 0 {
        return None;
    }
    Some((backend_id, F::backend(backend_id)?))
}

/// Picks a backend for the frontend (`svc` is its slot 0 under `key`), honouring affinity.
/// `maglev_hash` is the flow's hash when the frontend uses Maglev for this client (a new
/// flow from outside the node): the backend is then the table's, the same on every node;
/// otherwise (or when the table has no entry yet) a random slot. Returns the backend id and
/// the backend.
#[inline(never)]
pub fn select_backend<F: Family>(
    svc: &SvcValue,
    key: &F::SvcKey,
    client: Client<F::Addr>,
    maglev_hash: MaglevHash,
) -> Option<(u32, F::Backend)> {
    let count = svc.count as u32;
    if count == 0 {
        return None;
    }
    let affinity = svc.flags & svc_flags::AFFINITY != 0;
    // SAFETY: a helper without pointer arguments.
    let now = (unsafe { bpf_ktime_get_coarse_ns() } / 1_000_000_000) as u32;
    let mut akey = AffinityKey::default();
    if affinity {
        match client {
            Client::Netns(cookie) => {
                let b = cookie.to_ne_bytes();
                let mut i = 0;
                while i < 8 {
                    akey.client[i] = b[i];
                    i += 1;
                }
                akey.kind = proxy_common::AFFINITY_CLIENT_NETNS;
            }
            Client::Addr(addr) => {
                let (bytes, kind) = F::affinity_client(addr);
                akey.client = bytes;
                akey.kind = kind;
            }
        }
        akey.rev_nat_id = svc.rev_nat_id;
        // SAFETY: the value is copied out before any other map operation.
        if let Some(prev) = unsafe { AFFINITY_V2.get(akey).copied() } {
            // slot 0's backend_id holds the affinity timeout in seconds.
            if now.wrapping_sub(prev.last_used) <= svc.backend_id
                && let Some(backend) = F::backend(prev.backend_id)
            {
                let _ = AFFINITY_V2.insert(
                    akey,
                    AffinityValue {
                        backend_id: prev.backend_id,
                        last_used: now,
                    },
                    0,
                );
                return Some((prev.backend_id, backend));
            }
        }
    }
    let picked = match maglev_hash.get() {
        Some(hash) if svc.flags & svc_flags::MAGLEV != 0 => {
            maglev_pick::<F>(svc.maglev_table, hash)
        }
        _ => None,
    };
    let (backend_id, backend) = match picked {
        Some(picked) => picked,
        None => {
            // SAFETY: a helper without pointer arguments.
            let slot = (unsafe { bpf_get_prandom_u32() } % count) + 1;
            let mut slot_key = *key;
            F::set_slot(&mut slot_key, slot as u16);
            let backend_id = F::svc(&slot_key)?.backend_id;
            (backend_id, F::backend(backend_id)?)
        }
    };
    if affinity {
        let _ = AFFINITY_V2.insert(
            akey,
            AffinityValue {
                backend_id,
                last_used: now,
            },
            0,
        );
    }
    Some((backend_id, backend))
}
