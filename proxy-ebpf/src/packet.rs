// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! The parsed form of a packet that the north-south programs work on. Its own module, below
//! the maps (whose per-CPU scratch slots hold it) and the parser (which fills it).

/// One parsed packet, addresses and ports in network byte order.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Packet<A> {
    pub saddr: A,
    pub daddr: A,
    /// Ports (0 when the protocol has none or this is a non-first fragment).
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// Offset of the L3 header.
    pub l3_off: usize,
    /// Offset of the L4 header.
    pub l4_off: usize,
    /// A non-first fragment: no L4 header.
    pub later_fragment: bool,
    /// A fragment (first or later) of a datagram: `frag_id` identifies it.
    pub fragment: bool,
    /// The datagram's identification (IPv4: the 16-bit IP id; IPv6: the fragment header's).
    pub frag_id: u32,
    /// TCP flags (0 for other protocols).
    pub tcp_flags: u8,
    /// Length of the L3 packet (header and payload), host order.
    pub l3_len: u16,
}
