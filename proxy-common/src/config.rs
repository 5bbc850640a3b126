// SPDX-License-Identifier: Apache-2.0
//! Small keys for LPM tries and address sets, and the runtime configuration slot.

/// LPM trie key for an IPv4 prefix (the kernel's `bpf_lpm_trie_key` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cidr4Key {
    pub prefix_len: u32,
    pub addr: u32,
}
const _: () = assert!(core::mem::size_of::<Cidr4Key>() == 8);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cidr6Key {
    pub prefix_len: u32,
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<Cidr6Key>() == 20);

/// loadBalancerSourceRanges: LPM key (rev_nat_id, source prefix). The prefix length counts the
/// 16 bits of the id too, so one trie serves every LB frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceRange4Key {
    pub prefix_len: u32,
    /// Network byte order so that the trie matches the id first, then the address bits.
    pub rev_nat_id: u16,
    pub _pad: u16,
    pub addr: u32,
}
const _: () = assert!(core::mem::size_of::<SourceRange4Key>() == 12);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceRange6Key {
    pub prefix_len: u32,
    pub rev_nat_id: u16,
    pub _pad: u16,
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<SourceRange6Key>() == 24);

/// Bits of the source-range trie key before the address: the id and the padding.
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
    /// Address that DROP verdicts of the socket programs redirect connections to; the agent
    /// routes it into a discard device so the client sees silence, as with a dropped packet.
    pub blackhole4: u32,
    pub blackhole6: [u8; 16],
    /// Node address used as masquerade source (IPv4 / IPv6).
    pub masq4: u32,
    pub masq6: [u8; 16],
    /// Bit set of `LB_CFG_*`.
    pub flags: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<LbConfig>() == 48);

/// The configuration slot has been written (programs pass traffic through until it is).
pub const LB_CFG_READY: u32 = 1 << 0;
