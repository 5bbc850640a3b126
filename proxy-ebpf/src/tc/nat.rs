// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Address and port rewrites with correct checksums: the IPv4 header checksum, and the L4
//! checksum's pseudo-header (IPv4 and IPv6) and port words. A UDP/IPv4 checksum of zero
//! (none) stays zero. SCTP's CRC32c does not cover the IP header, so address rewrites need
//! no fix-up; its ports are never rewritten (see the callers).

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::{bpf_csum_diff, bpf_l3_csum_replace, bpf_l4_csum_replace},
    programs::TcContext,
};
use proxy_common::proto;

use super::TcFamily;
use crate::{
    lb::{V4, V6},
    parse::Packet,
};

/// Offset of the L4 checksum and extra flags for `bpf_l4_csum_replace`, when the protocol
/// has a ones'-complement checksum over a pseudo header.
#[inline(always)]
fn l4_csum(p: u8) -> Option<(usize, u64)> {
    match p {
        proto::TCP => Some((16, 0)),
        proto::UDP => Some((6, BPF_F_MARK_MANGLED_0 as u64)),
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
    fn rewrite_addr(ctx: &TcContext, p: &Packet<Self::Addr>, side: Side, new: Self::Addr) -> bool;
}

impl AddrRewrite for V4 {
    #[inline(always)]
    fn rewrite_addr(ctx: &TcContext, p: &Packet<u32>, side: Side, new: u32) -> bool {
        let (off, old) = match side {
            Side::Source => (p.l3_off + V4::SADDR_OFF, p.saddr),
            Side::Destination => (p.l3_off + V4::DADDR_OFF, p.daddr),
        };
        let skb = ctx.as_ptr().cast();
        let l3 = p.l3_off + 10;
        if unsafe { bpf_l3_csum_replace(skb, l3 as u32, old as u64, new as u64, 4) } != 0 {
            return false;
        }
        if !p.later_fragment
            && let Some((csum_off, extra)) = l4_csum(p.proto)
        {
            let flags = BPF_F_PSEUDO_HDR as u64 | 4 | extra;
            let off = (p.l4_off + csum_off) as u32;
            if unsafe { bpf_l4_csum_replace(skb, off, old as u64, new as u64, flags) } != 0 {
                return false;
            }
        }
        ctx.store(off, &new, 0).is_ok()
    }
}

impl AddrRewrite for V6 {
    #[inline(always)]
    fn rewrite_addr(ctx: &TcContext, p: &Packet<[u8; 16]>, side: Side, new: [u8; 16]) -> bool {
        let (off, mut old) = match side {
            Side::Source => (p.l3_off + V6::SADDR_OFF, p.saddr),
            Side::Destination => (p.l3_off + V6::DADDR_OFF, p.daddr),
        };
        let mut new_copy = new;
        if let Some((csum_off, extra)) = l4_csum(p.proto) {
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
            let csum = (p.l4_off + csum_off) as u32;
            let skb = ctx.as_ptr().cast();
            if unsafe { bpf_l4_csum_replace(skb, csum, 0, diff as u64, flags) } != 0 {
                return false;
            }
        }
        ctx.store(off, &new, 0).is_ok()
    }
}

/// Rewrites the source or destination port (network order values).
#[inline(always)]
pub fn rewrite_port<A>(ctx: &TcContext, p: &Packet<A>, side: Side, new: u16) -> bool {
    let (off, old) = match side {
        Side::Source => (p.l4_off, p.sport),
        Side::Destination => (p.l4_off + 2, p.dport),
    };
    if old == new {
        return true;
    }
    if let Some((csum_off, extra)) = l4_csum(p.proto) {
        let csum = (p.l4_off + csum_off) as u32;
        let skb = ctx.as_ptr().cast();
        if unsafe { bpf_l4_csum_replace(skb, csum, old as u64, new as u64, 2 | extra) } != 0 {
            return false;
        }
    }
    ctx.store(off, &new, 0).is_ok()
}
