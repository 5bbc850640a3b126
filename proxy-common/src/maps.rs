// SPDX-License-Identifier: Apache-2.0
//! Map names and default sizes. The `_V1` suffix is the layout version: aya reuses an
//! existing pin without checking its layout, so a layout change must change the name.
//! Layout 2 widened reverse-NAT ids from 16 to 32 bits (the maps keyed by them or holding
//! them in a slot with no spare bytes). `CT*` and `SOCK_FRONTEND` kept layout 1: their ids
//! grew into padding that earlier agents wrote as zero.

/// Frontends: (address, port, protocol, scope, slot) -> slot 0 = service, slot n = backend n.
pub const SVC4: &str = "SVC4_V2";
pub const SVC6: &str = "SVC6_V2";
/// Backend id -> address and port.
pub const BACKENDS4: &str = "BACKENDS4_V1";
pub const BACKENDS6: &str = "BACKENDS6_V1";
/// rev_nat_id -> the service frontend, used to undo a translation.
pub const REV_NAT4: &str = "REV_NAT4_V2";
pub const REV_NAT6: &str = "REV_NAT6_V2";
/// Socket-local storage of connected sockets' translations (connect()).
pub const SOCK_FRONTEND: &str = "SOCK_FRONTEND_V1";
/// (socket cookie, backend) -> frontend of UDP sockets, LRU: unconnected ones per datagram
/// (sendmsg()), connected ones at connect() (the agent finds those whose backend went away
/// by it).
pub const SOCK_REV_NAT4: &str = "SOCK_REV_NAT4_V2";
pub const SOCK_REV_NAT6: &str = "SOCK_REV_NAT6_V2";
/// (client, rev_nat_id) -> backend id and last use, for sessionAffinity ClientIP (LRU).
pub const AFFINITY: &str = "AFFINITY_V2";
/// Service CIDRs (LPM): packets to an address inside them that is no frontend are dropped.
pub const SVC_CIDRS4: &str = "SVC_CIDRS4_V1";
pub const SVC_CIDRS6: &str = "SVC_CIDRS6_V1";
/// Source prefixes the local-traffic detector calls local (the cluster or node pod CIDRs),
/// LPM keyed by address like `SVC_CIDRS*`: off-cluster traffic to a ClusterIP, whose source
/// is outside them, is masqueraded.
pub const LOCAL_CIDRS4: &str = "LOCAL_CIDRS4_V1";
pub const LOCAL_CIDRS6: &str = "LOCAL_CIDRS6_V1";
/// Node addresses on which NodePorts are served (nodePortAddresses applied).
pub const NODEPORT_ADDRS4: &str = "NODEPORT_ADDRS4_V1";
pub const NODEPORT_ADDRS6: &str = "NODEPORT_ADDRS6_V1";
/// Per-LB-frontend loadBalancerSourceRanges (LPM keyed by rev_nat_id + source prefix).
pub const SRC_RANGES4: &str = "SRC_RANGES4_V2";
pub const SRC_RANGES6: &str = "SRC_RANGES6_V2";
/// Connection tracking of translated north-south flows (LRU, 5-tuple).
pub const CT4: &str = "CT4_V1";
pub const CT6: &str = "CT6_V1";
/// Ports of fragmented datagrams, by (addresses, IP id, protocol), for their later
/// fragments (LRU).
pub const FRAG4: &str = "FRAG4_V1";
pub const FRAG6: &str = "FRAG6_V1";
/// Single-slot array holding [`crate::LbConfig`].
pub const LB_CONFIG: &str = "LB_CONFIG_V1";
/// Maglev lookup tables, one array of backend ids: table `t` is the entries
/// `t * size .. (t + 1) * size`, `size` being the value of [`MAGLEV_CONFIG`]. A frontend's
/// slot 0 names its table (`SvcValue::maglev_table`). Entry 0 (no backend) means "not
/// written": the programs then pick at random.
pub const MAGLEV: &str = "MAGLEV_V1";
/// Single-slot array holding the entries of one Maglev table (u32). A map of its own, not a
/// field of [`crate::LbConfig`]: a new map starts at 0, which turns Maglev off (random
/// choice) until the loader has written the size, whereas a new `LbConfig` layout would
/// start as an all-zero configuration under running programs.
pub const MAGLEV_CONFIG: &str = "MAGLEV_CONFIG_V1";
/// Per-CPU counters of the XDP program's verdicts (index: the XDP action, 1 drop, 2 pass,
/// 3 transmit) and of packets it translated and passed up ([`XDP_STAT_TRANSLATED_PASS`]):
/// what XDP handled and what it left to tc.
pub const XDP_STATS: &str = "XDP_STATS_V1";
pub const XDP_STAT_SLOTS: u32 = 5;
pub const XDP_STAT_DROP: u32 = 1;
pub const XDP_STAT_PASS: u32 = 2;
pub const XDP_STAT_TX: u32 = 3;
pub const XDP_STAT_TRANSLATED_PASS: u32 = 4;

/// Per-CPU counters (u64) of what the programs dropped or refused themselves, one slot per
/// reason ([`DATAPATH_REASONS`]). A packet XDP drops is counted there; one it leaves to tc
/// (a reject, which tc answers) is counted by tc; a connection a socket program refuses, by
/// that program.
pub const DATAPATH_STATS: &str = "DATAPATH_STATS_V1";
/// A frontend whose traffic policy is Local has endpoints on other nodes only.
pub const DROP_NO_LOCAL_ENDPOINTS: u32 = 0;
/// The source is outside the frontend's loadBalancerSourceRanges.
pub const DROP_SOURCE_RANGE: u32 = 1;
/// An address of a service CIDR that no service holds.
pub const DROP_UNALLOCATED_SERVICE_IP: u32 = 2;
/// A fragment that cannot be translated (its first fragment made no flow, or SCTP's
/// checksum would need the whole packet).
pub const DROP_FRAGMENT: u32 = 3;
/// No free SNAT port for a masqueraded flow.
pub const DROP_SNAT_PORTS_EXHAUSTED: u32 = 4;
/// The conntrack map refused the new flow's entries.
pub const DROP_CONNTRACK_FULL: u32 = 5;
/// Rewriting the packet failed (the kernel refused the helper).
pub const DROP_REWRITE_FAILED: u32 = 6;
/// The frontend's backend slot names no backend (a sync in progress).
pub const DROP_BACKEND_MISSING: u32 = 7;
/// A frontend without endpoints (upstream's REJECT).
pub const REJECT_NO_ENDPOINTS: u32 = 8;
/// A ClusterIP's port that no service port serves.
pub const REJECT_UNSERVED_PORT: u32 = 9;
/// A NodePort on a loopback address the configuration refuses.
pub const REJECT_LOOPBACK_NODEPORT: u32 = 10;
pub const DATAPATH_STAT_SLOTS: u32 = 11;

/// Whether a datapath counter slot counts drops or rejects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatapathVerdict {
    Drop,
    Reject,
}

/// Every slot of [`DATAPATH_STATS`]: its verdict and the `reason` label of its metric.
pub const DATAPATH_REASONS: &[(u32, DatapathVerdict, &str)] = &[
    (
        DROP_NO_LOCAL_ENDPOINTS,
        DatapathVerdict::Drop,
        "no_local_endpoints",
    ),
    (DROP_SOURCE_RANGE, DatapathVerdict::Drop, "source_range"),
    (
        DROP_UNALLOCATED_SERVICE_IP,
        DatapathVerdict::Drop,
        "unallocated_service_ip",
    ),
    (DROP_FRAGMENT, DatapathVerdict::Drop, "fragment"),
    (
        DROP_SNAT_PORTS_EXHAUSTED,
        DatapathVerdict::Drop,
        "snat_ports_exhausted",
    ),
    (DROP_CONNTRACK_FULL, DatapathVerdict::Drop, "conntrack_full"),
    (DROP_REWRITE_FAILED, DatapathVerdict::Drop, "rewrite_failed"),
    (
        DROP_BACKEND_MISSING,
        DatapathVerdict::Drop,
        "backend_missing",
    ),
    (REJECT_NO_ENDPOINTS, DatapathVerdict::Reject, "no_endpoints"),
    (
        REJECT_UNSERVED_PORT,
        DatapathVerdict::Reject,
        "unserved_port",
    ),
    (
        REJECT_LOOPBACK_NODEPORT,
        DatapathVerdict::Reject,
        "loopback_nodeport",
    ),
];
const _: () = assert!(DATAPATH_REASONS.len() == DATAPATH_STAT_SLOTS as usize);

/// Every map the programs define, for pinning, inspection and cleanup.
pub const ALL: &[&str] = &[
    SVC4,
    SVC6,
    BACKENDS4,
    BACKENDS6,
    REV_NAT4,
    REV_NAT6,
    SOCK_REV_NAT4,
    SOCK_REV_NAT6,
    SOCK_FRONTEND,
    AFFINITY,
    SVC_CIDRS4,
    SVC_CIDRS6,
    LOCAL_CIDRS4,
    LOCAL_CIDRS6,
    NODEPORT_ADDRS4,
    NODEPORT_ADDRS6,
    SRC_RANGES4,
    SRC_RANGES6,
    CT4,
    CT6,
    FRAG4,
    FRAG6,
    LB_CONFIG,
    MAGLEV,
    MAGLEV_CONFIG,
    XDP_STATS,
    DATAPATH_STATS,
];

/// Compile-time capacities; the agent overrides them from its configuration at load time.
/// Datagrams in flight whose later fragments can be translated.
pub const DEFAULT_FRAG_ENTRIES: usize = 8_192;
pub const DEFAULT_SVC_ENTRIES: usize = 65_536;
pub const DEFAULT_BACKEND_ENTRIES: usize = 65_536;
pub const DEFAULT_REV_NAT_ENTRIES: usize = 65_536;
pub const DEFAULT_SOCK_REV_NAT_ENTRIES: usize = 131_072;
pub const DEFAULT_AFFINITY_ENTRIES: usize = 65_536;
pub const DEFAULT_CT_ENTRIES: usize = 131_072;
pub const DEFAULT_CIDR_ENTRIES: usize = 64;
pub const DEFAULT_NODE_ADDR_ENTRIES: usize = 256;
pub const DEFAULT_SRC_RANGE_ENTRIES: usize = 16_384;
/// Maglev tables of the default size; the agent sizes the map to `maglevTables` tables of
/// `maglevTableSize` entries.
pub const DEFAULT_MAGLEV_TABLES: usize = 64;
pub const DEFAULT_MAGLEV_ENTRIES: usize =
    DEFAULT_MAGLEV_TABLES * crate::maglev::DEFAULT_TABLE_SIZE as usize;
