// SPDX-License-Identifier: Apache-2.0
//! Small keys for LPM tries and address sets, and the runtime configuration slot.

/// loadBalancerSourceRanges trie data (the LPM key is `(prefix_len, SourceRange4)`): the
/// prefix length counts the 32 bits of the id too, so one trie serves every LB
/// frontend and a lookup matches the frontend first, then the address bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceRange4 {
    /// Network byte order, so that the trie compares it most significant byte first.
    pub rev_nat_id: u32,
    pub addr: u32,
}
const _: () = assert!(core::mem::size_of::<SourceRange4>() == 8);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceRange6 {
    /// Network byte order.
    pub rev_nat_id: u32,
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<SourceRange6>() == 20);

/// Bits of the source-range trie data before the address: the id.
pub const SOURCE_RANGE_PREFIX_BITS: u32 = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeAddr4Key {
    pub addr: u32,
}
const _: () = assert!(core::mem::size_of::<NodeAddr4Key>() == 4);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeAddr6Key {
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<NodeAddr6Key>() == 16);

/// Runtime settings of the dataplane (array slot 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LbConfig {
    /// Cookie of the node's own network namespace: socket programs tell node processes from
    /// pods with it.
    pub host_netns_cookie: u64,
    /// Node address used as masquerade (SNAT) source for north-south traffic.
    pub masq4: u32,
    pub masq6: [u8; 16],
    /// Bit set of `LB_CFG_*`.
    pub flags: u32,
    /// Connection-tracking lifetimes in seconds: established TCP, UDP/SCTP, and a closing
    /// TCP flow (after FIN or RST).
    pub ct_tcp_lifetime: u32,
    pub ct_udp_lifetime: u32,
    pub ct_closing_lifetime: u32,
    /// The ports north-south SNAT picks from (host order), outside the kernel's ephemeral
    /// range: a masqueraded flow never holds a port a node socket may get.
    pub snat_port_min: u16,
    pub snat_port_max: u16,
}
const _: () = assert!(core::mem::size_of::<LbConfig>() == 48);

/// The configuration slot has been written.
pub const LB_CFG_READY: u32 = 1 << 0;
/// `masqueradeAll`: every connection to a ClusterIP is masqueraded to the node, pods'
/// included (so socket programs leave those of pods to the pod-side tc program, which can
/// rewrite the source).
pub const LB_CFG_MASQUERADE_ALL: u32 = 1 << 1;
/// A local-traffic detector is configured: pods of this node count as local traffic (they
/// short-circuit to the cluster-wide endpoints of external destinations, as upstream's
/// KUBE-EXT chains send them to the cluster chain), and traffic to a ClusterIP from a
/// source the detector does not call local is masqueraded. The sources it calls local are
/// in the `LOCAL_CIDRS` tries (empty for interface-based detectors: nothing arriving on an
/// uplink comes from a local pod interface).
pub const LB_CFG_LOCAL_DETECTOR: u32 = 1 << 2;
/// A netfilter mode is taking the node over (its rules are in place): the programs start no
/// new flow, and leave what they would have translated to the stack and its rules, while
/// the flows they already translate keep their translation until the programs go. Without
/// it, a flow the programs start between the copy of their conntrack into netfilter's and
/// their removal would meet the rules' choice of a backend at its next packet.
pub const LB_CFG_HANDING_OVER: u32 = 1 << 3;
/// `ebpf.socketLBHostNamespaceOnly`: socket programs translate only what the node's own
/// namespace connects to. Pods' connections keep the service address their sockets asked
/// for (a sidecar that redirects them reads it as the original destination), and the
/// pod-side tc program load-balances them per packet, with conntrack; the pod-side egress
/// program then translates the answers of backends on the node itself.
pub const LB_CFG_SOCKET_LB_HOST_NETNS_ONLY: u32 = 1 << 4;
/// Upstream 1.37's KubeProxyNFTablesLocalhostNodePorts gate is on but nodePortAddresses lists
/// no loopback range of the family: the node's connections to a NodePort on a loopback
/// address (127.0.0.0/8; ::1) are refused, as nftables mode's `localhost-nodeport-reject`
/// rules refuse them.
pub const LB_CFG_LOOPBACK_NODEPORTS_REJECT4: u32 = 1 << 5;
pub const LB_CFG_LOOPBACK_NODEPORTS_REJECT6: u32 = 1 << 6;
