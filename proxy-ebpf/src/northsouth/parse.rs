// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Bounds-checked header parsing for the tc and XDP programs (Ethernet, IPv4 with options,
//! IPv6 without extension-header walking, TCP/UDP/SCTP ports). Loads go through the
//! load-bytes helpers, so every read is checked by the kernel and works on non-linear
//! packets.

use proxy_common::proto;

use super::packet_io::PacketIo;
use crate::packet::Packet;

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
const IPV6_HLEN: usize = 40;
/// The IPv6 fragment extension header.
const IPPROTO_FRAGMENT: u8 = 44;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

#[inline(always)]
fn tcp_flags<C: PacketIo>(ctx: &C, p: u8, l4: usize, later_fragment: bool) -> u8 {
    if p == proto::TCP && !later_fragment {
        ctx.load::<u8>(l4 + 13).unwrap_or(0)
    } else {
        0
    }
}

#[inline(always)]
pub fn ethertype<C: PacketIo>(ctx: &C) -> Option<u16> {
    ctx.load::<u16>(12).map(u16::from_be)
}

#[inline(always)]
pub fn has_ports(p: u8) -> bool {
    p == proto::TCP || p == proto::UDP || p == proto::SCTP
}

#[inline(always)]
pub fn ipv4<C: PacketIo>(ctx: &C) -> Option<Packet<u32>> {
    ipv4_at(ctx, ETH_HLEN)
}

/// An IPv4 header at `l3` (a packet's own, or one an ICMP error quotes).
#[inline(always)]
pub fn ipv4_at<C: PacketIo>(ctx: &C, l3: usize) -> Option<Packet<u32>> {
    let ver_ihl: u8 = ctx.load(l3)?;
    if ver_ihl >> 4 != 4 {
        return None;
    }
    let ihl = ((ver_ihl & 0x0f) as usize) * 4;
    if ihl < 20 {
        return None;
    }
    let total: u16 = u16::from_be(ctx.load(l3 + 2)?);
    let frag: u16 = u16::from_be(ctx.load(l3 + 6)?);
    let later_fragment = frag & 0x1fff != 0;
    let fragment = later_fragment || frag & 0x2000 != 0;
    let frag_id = if fragment {
        u32::from(ctx.load::<u16>(l3 + 4)?)
    } else {
        0
    };
    let p: u8 = ctx.load(l3 + 9)?;
    let saddr: u32 = ctx.load(l3 + 12)?;
    let daddr: u32 = ctx.load(l3 + 16)?;
    let l4 = l3 + ihl;
    let (sport, dport) = if has_ports(p) && !later_fragment {
        (ctx.load::<u16>(l4)?, ctx.load::<u16>(l4 + 2)?)
    } else {
        (0, 0)
    };
    Some(Packet {
        saddr,
        daddr,
        sport,
        dport,
        proto: p,
        l3_off: l3,
        l4_off: l4,
        later_fragment,
        fragment,
        frag_id,
        tcp_flags: tcp_flags(ctx, p, l4, later_fragment),
        l3_len: total,
    })
}

#[inline(always)]
pub fn ipv6<C: PacketIo>(ctx: &C) -> Option<Packet<[u8; 16]>> {
    ipv6_at(ctx, ETH_HLEN)
}

/// An IPv6 header at `l3` (a packet's own, or one an ICMPv6 error quotes).
#[inline(always)]
pub fn ipv6_at<C: PacketIo>(ctx: &C, l3: usize) -> Option<Packet<[u8; 16]>> {
    let first: u8 = ctx.load(l3)?;
    if first >> 4 != 6 {
        return None;
    }
    let payload: u16 = u16::from_be(ctx.load(l3 + 4)?);
    let mut next: u8 = ctx.load(l3 + 6)?;
    let saddr: [u8; 16] = ctx.load(l3 + 8)?;
    let daddr: [u8; 16] = ctx.load(l3 + 24)?;
    let mut l4 = l3 + IPV6_HLEN;
    // A fragment header right after the fixed header (the usual place; other extension
    // headers are not walked): the upper layer follows it in the first fragment.
    let (mut fragment, mut later_fragment, mut frag_id) = (false, false, 0);
    if next == IPPROTO_FRAGMENT {
        let offset_flags = u16::from_be(ctx.load(l4 + 2)?);
        fragment = true;
        later_fragment = offset_flags >> 3 != 0;
        frag_id = ctx.load::<u32>(l4 + 4)?;
        next = ctx.load(l4)?;
        l4 += 8;
    }
    let (sport, dport) = if has_ports(next) && !later_fragment {
        (ctx.load::<u16>(l4)?, ctx.load::<u16>(l4 + 2)?)
    } else {
        (0, 0)
    };
    Some(Packet {
        saddr,
        daddr,
        sport,
        dport,
        proto: next,
        l3_off: l3,
        l4_off: l4,
        later_fragment,
        fragment,
        frag_id,
        tcp_flags: tcp_flags(ctx, next, l4, later_fragment),
        l3_len: payload.saturating_add(IPV6_HLEN as u16),
    })
}
