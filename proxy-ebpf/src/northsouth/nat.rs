// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Address and port rewrites with correct checksums: the IPv4 header checksum, and the L4
//! checksum's pseudo-header (IPv4 and IPv6) and port words. A UDP/IPv4 checksum of zero
//! (none) stays zero. SCTP's CRC32c does not cover the IP header, so address rewrites need
//! no fix-up; it covers the ports, and a port rewrite patches it by the CRC's linearity
//! (`proxy_common::crc32c`).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_csum_diff,
};
use proxy_common::{crc32c::port_change_delta, proto};

use super::{PacketFamily, packet_io::PacketIo};
use crate::{
    lb::{V4, V6},
    packet::Packet,
};

/// Offset of the L4 checksum and extra flags for `bpf_l4_csum_replace`, when the protocol
/// has a ones'-complement checksum over a pseudo header.
#[inline(always)]
fn l4_csum(p: u8) -> Option<(usize, u64)> {
    match p {
        proto::TCP => Some((16, 0)),
        proto::UDP => Some((6, BPF_F_MARK_MANGLED_0 as u64)),
        // ICMPv6 (never seen in IPv4 packets) sums a pseudo header; ICMP does not.
        super::parse::IPPROTO_ICMPV6 => Some((2, 0)),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

/// Rewrites one address of the packet.
pub trait AddrRewrite: super::route::FibAddrs {
    fn rewrite_addr<C: PacketIo>(
        ctx: &C,
        p: &Packet<Self::Addr>,
        side: Side,
        new: Self::Addr,
    ) -> bool;
}

impl AddrRewrite for V4 {
    #[inline(always)]
    fn rewrite_addr<C: PacketIo>(ctx: &C, p: &Packet<u32>, side: Side, new: u32) -> bool {
        let (off, old) = match side {
            Side::Source => (p.l3_off + V4::SADDR_OFF, p.saddr),
            Side::Destination => (p.l3_off + V4::DADDR_OFF, p.daddr),
        };
        if !ctx.l3_csum_replace(p.l3_off + 10, old, new, 4) {
            return false;
        }
        if !p.later_fragment
            && let Some((csum_off, extra)) = l4_csum(p.proto)
        {
            let flags = BPF_F_PSEUDO_HDR as u64 | 4 | extra;
            if !ctx.l4_csum_replace(p.l4_off + csum_off, old, new, flags) {
                return false;
            }
        }
        ctx.store(off, &new)
    }
}

impl AddrRewrite for V6 {
    #[inline(always)]
    fn rewrite_addr<C: PacketIo>(ctx: &C, p: &Packet<[u8; 16]>, side: Side, new: [u8; 16]) -> bool {
        let (off, mut old) = match side {
            Side::Source => (p.l3_off + V6::SADDR_OFF, p.saddr),
            Side::Destination => (p.l3_off + V6::DADDR_OFF, p.daddr),
        };
        let mut new_copy = new;
        if !p.later_fragment
            && let Some((csum_off, extra)) = l4_csum(p.proto)
        {
            // SAFETY: both buffers are 16-byte locals, the sizes passed.
            let diff = unsafe {
                bpf_csum_diff(
                    old.as_mut_ptr().cast(),
                    16,
                    new_copy.as_mut_ptr().cast(),
                    16,
                    0,
                )
            };
            if diff < 0 {
                return false;
            }
            let flags = BPF_F_PSEUDO_HDR as u64 | extra;
            if !ctx.l4_csum_replace(p.l4_off + csum_off, 0, diff as u32, flags) {
                return false;
            }
        }
        ctx.store(off, &new)
    }
}

/// Rewrites the source or destination port (network order values).
#[inline(always)]
pub fn rewrite_port<C: PacketIo, A>(ctx: &C, p: &Packet<A>, side: Side, new: u16) -> bool {
    let (off, old) = match side {
        Side::Source => (p.l4_off, p.sport),
        Side::Destination => (p.l4_off + 2, p.dport),
    };
    // A later fragment has no L4 header: its ports live in the first.
    if old == new || p.later_fragment {
        return true;
    }
    if p.proto == proto::SCTP && !patch_sctp_crc(ctx, p, side, old ^ new) {
        return false;
    }
    if let Some((csum_off, extra)) = l4_csum(p.proto)
        && !ctx.l4_csum_replace(
            p.l4_off + csum_off,
            u32::from(old),
            u32::from(new),
            2 | extra,
        )
    {
        return false;
    }
    ctx.store(off, &new)
}

/// Patches an SCTP packet's CRC32c for a port that changed by `port_delta` (old XOR new,
/// network order). A fragment's CRC also covers the other fragments: it cannot be
/// patched from here.
#[inline(always)]
fn patch_sctp_crc<C: PacketIo, A>(ctx: &C, p: &Packet<A>, side: Side, port_delta: u16) -> bool {
    if p.fragment {
        return false;
    }
    let sctp_len = p.l3_len.saturating_sub((p.l4_off - p.l3_off) as u16);
    let d = port_delta.to_ne_bytes();
    let delta = match side {
        Side::Source => [d[0], d[1], 0, 0],
        Side::Destination => [0, 0, d[0], d[1]],
    };
    // The field holds the CRC little-endian (as Linux writes it); on this little-endian
    // target a native load reads the CRC's value.
    let Some(crc) = ctx.load::<u32>(p.l4_off + 8) else {
        return false;
    };
    ctx.store(p.l4_off + 8, &(crc ^ port_change_delta(delta, sctp_len)))
}
