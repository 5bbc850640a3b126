// SPDX-License-Identifier: Apache-2.0
//! Service frontends, Cilium-style: one hash map keyed by
//! (address, port, protocol, scope, slot). Slot 0 describes the frontend (backend count,
//! flags, rev_nat_id, affinity timeout); slots 1..=count hold backend ids. A lookup reads slot 0
//! first and then one slot, so writers fill backends and slots before publishing a new count.

/// Scope of a frontend entry. Every frontend has an [`SCOPE_EXTERNAL`] entry; when the backend
/// set for clients on this node differs (eTP=Local short-circuit, see the `TWO_SCOPES` flag),
/// a second entry with [`SCOPE_INTERNAL`] holds that set.
pub const SCOPE_EXTERNAL: u8 = 0;
pub const SCOPE_INTERNAL: u8 = 1;

/// Frontend flags (slot 0, `flags`).
pub mod svc_flags {
    /// A ClusterIP frontend.
    pub const CLUSTER_IP: u16 = 1 << 0;
    /// A NodePort frontend (address 0 = every address in the NodePort address map).
    pub const NODE_PORT: u16 = 1 << 1;
    /// An externalIP frontend.
    pub const EXTERNAL_IP: u16 = 1 << 2;
    /// A LoadBalancer ingress IP frontend.
    pub const LOAD_BALANCER: u16 = 1 << 3;
    /// sessionAffinity ClientIP; `backend_id` of slot 0 holds the timeout in seconds.
    pub const AFFINITY: u16 = 1 << 4;
    /// externalTrafficPolicy Local: the external scope holds only local endpoints and the
    /// client address is preserved.
    pub const ETP_LOCAL: u16 = 1 << 5;
    /// internalTrafficPolicy Local.
    pub const ITP_LOCAL: u16 = 1 << 6;
    /// A separate [`super::SCOPE_INTERNAL`] entry exists for clients on this node.
    pub const TWO_SCOPES: u16 = 1 << 7;
    /// loadBalancerSourceRanges apply to this frontend.
    pub const SOURCE_RANGES: u16 = 1 << 8;
    /// Wildcard entry (port 0, protocol 0) of a ClusterIP: any port or protocol that has no
    /// frontend of its own is rejected.
    pub const WILDCARD: u16 = 1 << 9;
    /// No usable endpoint in this scope, but the service has endpoints elsewhere
    /// (traffic-policy Local): drop instead of reject.
    pub const DROP_NO_ENDPOINTS: u16 = 1 << 10;
    /// Traffic from outside the cluster must be masqueraded to reach the backends
    /// (eTP=Cluster on external frontends).
    pub const MASQUERADE: u16 = 1 << 11;
    /// Source ranges: clients in the host network namespace are allowed (the node address
    /// they would use is inside the ranges). Used by socket programs, which see no source
    /// address for an unbound socket.
    pub const SRC_RANGE_HOST_ALLOWED: u16 = 1 << 12;
    /// Source ranges: every pod address of this node is inside the ranges.
    pub const SRC_RANGE_PODS_ALLOWED: u16 = 1 << 13;
    /// Source ranges: some but not all pod addresses of this node are inside the ranges;
    /// socket programs leave the connection to tc, which sees the real source.
    pub const SRC_RANGE_PODS_DEFER: u16 = 1 << 14;
    /// A new flow from outside the node picks its backend from the Maglev table
    /// `maglev_table` of [`crate::maps::MAGLEV`] by its 5-tuple's hash, so that every node
    /// picks the same one (external scope only; socket programs ignore it).
    pub const MAGLEV: u16 = 1 << 15;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Svc4Key {
    /// Frontend address, network byte order. 0 for the NodePort wildcard.
    pub addr: u32,
    /// Frontend port, network byte order; 0 in the ClusterIP wildcard entry.
    pub dport: u16,
    /// 0 = the service entry, 1..=count = backend slots.
    pub slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<Svc4Key>() == 12);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Svc6Key {
    pub addr: [u8; 16],
    pub dport: u16,
    pub slot: u16,
    pub proto: u8,
    pub scope: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<Svc6Key>() == 24);

/// Value of both slot 0 (the frontend) and slots 1..=count (one backend each). Layout 2:
/// the reverse-NAT id is 32 bits wide (layout 1 had 16, which capped a node at 65,535
/// frontends).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SvcValue {
    /// Slot n: the backend id. Slot 0: the affinity timeout in seconds (when AFFINITY).
    pub backend_id: u32,
    /// The frontend's reverse-NAT id (same in every slot of the frontend), at most
    /// [`crate::MAX_REV_NAT_ID`].
    pub rev_nat_id: u32,
    /// Slot 0: number of backend slots. Slot n: 0.
    pub count: u16,
    /// Slot 0: [`svc_flags`].
    pub flags: u16,
    /// Slot 0 with [`svc_flags::MAGLEV`]: the index of the frontend's table in
    /// [`crate::maps::MAGLEV`]. 0 otherwise.
    pub maglev_table: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<SvcValue>() == 16);

/// [`SvcValue`] of layout 1 (`SVC4_V1`, `SVC6_V1`), read once when an agent of layout 2
/// takes over from one of layout 1, to keep the frontends' reverse-NAT ids (conntrack
/// entries and connected sockets hold them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SvcValueV1 {
    pub backend_id: u32,
    pub count: u16,
    pub rev_nat_id: u16,
    pub flags: u16,
    pub maglev_table: u16,
}
const _: () = assert!(core::mem::size_of::<SvcValueV1>() == 12);

/// The largest reverse-NAT id: ids are 32 bits in the maps keyed by them, but connection
/// tracking keeps them in 24 bits (see [`crate::CtValue::rev_nat_id`]), which is far more
/// frontends than any map is sized for.
pub const MAX_REV_NAT_ID: u32 = 0x00ff_ffff;
