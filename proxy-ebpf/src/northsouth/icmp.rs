// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! ICMP errors about translated flows, translated like the flow (what conntrack's RELATED
//! handling does for upstream's rules). An error quotes the packet that caused it; both
//! the quote and the error's own addresses are rewritten to what the receiver knows:
//!
//! - about a forward packet (from the backend, or a router on the way to it: port
//!   unreachable, fragmentation needed): the quote becomes client -> frontend, and the
//!   error goes to the client, from the frontend when the backend sent it;
//! - about a reply (from the client or a router on its side): the quote becomes
//!   backend -> SNAT address (or the client), and the error goes to the backend.
//!
//! Only tc does this (XDP hands ICMP on). The quote's own L4 checksum is left alone: the
//! quote is often truncated before it and nobody checks it.

use aya_ebpf::{
    EbpfContext as _, bindings::TC_ACT_SHOT, helpers::generated::bpf_csum_diff,
    helpers::generated::bpf_skb_load_bytes, programs::TcContext,
};
use proxy_common::{CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_NETFILTER, CT_F_SNAT, CtValue, proto};

use super::{
    PacketFamily,
    nat::{AddrRewrite, Side},
    packet_io::PacketIo,
    parse::{IPPROTO_ICMP, IPPROTO_ICMPV6},
    route::{self, Next},
};
use crate::{
    maps::{REPLY_SCRATCH, REPLY_SCRATCH_LEN},
    packet::Packet,
};

/// Bytes of the quoted headers whose checksum effect is taken as a whole: the IP header
/// and the ports (a multiple of 4, as `bpf_csum_diff` wants).
const QUOTE4: usize = 24;
const QUOTE6: usize = 44;
/// Where the old and new quoted headers go in the scratch buffer.
const OLD: usize = 0;
const NEW: usize = 48;
const _: () = assert!(NEW + QUOTE6 <= REPLY_SCRATCH_LEN && OLD + QUOTE6 <= NEW);

/// Whether `p` (ICMP or ICMPv6) is an error that quotes a packet.
#[inline(always)]
fn is_error<F: PacketFamily>(ctx: &TcContext, p: &Packet<F::Addr>) -> bool {
    let Ok(kind) = ctx.load::<u8>(p.l4_off) else {
        return false;
    };
    if F::AF == 2 {
        // Destination unreachable, time exceeded, parameter problem.
        p.proto == IPPROTO_ICMP && (kind == 3 || kind == 11 || kind == 12)
    } else {
        // Destination unreachable, packet too big, time exceeded, parameter problem.
        p.proto == IPPROTO_ICMPV6 && (1..=4).contains(&kind)
    }
}

/// Translates `p` if it is an error about a tracked flow and sends it on; anything else
/// passes.
#[inline(never)]
pub fn handle<F: AddrRewrite>(ctx: &TcContext, p: &Packet<F::Addr>) -> i32 {
    if p.later_fragment || !is_error::<F>(ctx, p) {
        return TcContext::PASS;
    }
    let Some(quote) = super::parse_quote_into::<F>(ctx, p.l4_off) else {
        return TcContext::PASS;
    };
    let tracked =
        quote.proto == proto::TCP || quote.proto == proto::UDP || quote.proto == proto::SCTP;
    if !tracked || quote.later_fragment {
        return TcContext::PASS;
    }
    // The quote is a packet of the flow as one side saw it, so its reversed tuple is that
    // side's key: the backend's (reply) or the client's (forward).
    let (toward_client, v) = match lookup::<F>(quote, CT_DIR_REPLY) {
        Some(v) => (true, v),
        None => match lookup::<F>(quote, CT_DIR_FORWARD) {
            Some(v) => (false, v),
            None => return TcContext::PASS,
        },
    };
    // The quote's L4 checksum is not maintained (see the module comment).
    quote.proto = 0;
    translate::<F>(ctx, p, quote, v, toward_client)
}

#[inline(always)]
fn lookup<F: PacketFamily>(q: &Packet<F::Addr>, dir: u8) -> Option<&'static CtValue> {
    let key = F::ct_key(q.daddr, q.saddr, q.dport, q.sport, q.proto, dir);
    // SAFETY: a map value, valid for this program run.
    let v = F::ct_get(&key).map(|v| unsafe { &*v })?;
    // A flow netfilter translates: its errors are netfilter's to translate.
    (v.flags & CT_F_NETFILTER == 0).then_some(v)
}

#[inline(never)]
fn translate<F: AddrRewrite>(
    ctx: &TcContext,
    p: &Packet<F::Addr>,
    q: &Packet<F::Addr>,
    v: &CtValue,
    toward_client: bool,
) -> i32 {
    let snat = v.flags & CT_F_SNAT != 0;
    let frontend = F::from16(&v.frontend_addr);
    let backend = F::from16(&v.backend_addr);
    let client = F::from16(&v.client_addr);
    // The quote as the receiver sent it, and where the error goes.
    let (src, sport, dst, dport, to) = if toward_client {
        (client, v.client_port, frontend, v.frontend_port, client)
    } else if snat {
        (
            backend,
            v.backend_port,
            F::from16(&v.snat_addr),
            v.snat_port,
            backend,
        )
    } else {
        (backend, v.backend_port, client, v.client_port, backend)
    };
    let from = if toward_client && p.saddr == backend {
        frontend
    } else {
        p.saddr
    };
    let quoted = if F::AF == 2 { QUOTE4 } else { QUOTE6 };
    let Some(buf) = REPLY_SCRATCH.get_ptr_mut(0) else {
        return TC_ACT_SHOT;
    };
    // SAFETY: a per-CPU slot; networking programs do not preempt each other on one CPU.
    let buf = unsafe { &mut *buf };
    if !copy_quote(ctx, q.l3_off, &mut buf[OLD..OLD + QUOTE6], quoted)
        || !F::rewrite_addr(ctx, q, Side::Source, src)
        || !F::rewrite_addr(ctx, q, Side::Destination, dst)
        || !PacketIo::store(ctx, q.l4_off, &sport)
        || !PacketIo::store(ctx, q.l4_off + 2, &dport)
        || !copy_quote(ctx, q.l3_off, &mut buf[NEW..NEW + QUOTE6], quoted)
        || !fix_icmp_csum(ctx, p.l4_off + 2, buf, quoted)
    {
        return TC_ACT_SHOT;
    }
    // The error's own addresses (ICMPv6 has them in its checksum's pseudo header; ICMP's
    // checksum does not cover them).
    if (from != p.saddr && !F::rewrite_addr(ctx, p, Side::Source, from))
        || (to != p.daddr && !F::rewrite_addr(ctx, p, Side::Destination, to))
    {
        return TC_ACT_SHOT;
    }
    let next = Next {
        saddr: from,
        daddr: to,
        sport: 0,
        dport: 0,
    };
    route::tc_send(route::tc_plan::<F>(ctx, p, &next))
}

/// Copies the first `len` (QUOTE4 or QUOTE6) bytes of the quote into `dst`.
#[inline(always)]
fn copy_quote(ctx: &TcContext, off: usize, dst: &mut [u8], len: usize) -> bool {
    let len = if len == QUOTE4 { QUOTE4 } else { QUOTE6 };
    if dst.len() < len {
        return false;
    }
    // SAFETY: the helper writes at most `len` bytes, which `dst` holds.
    unsafe {
        bpf_skb_load_bytes(
            ctx.as_ptr().cast(),
            off as u32,
            dst.as_mut_ptr().cast(),
            len as u32,
        ) == 0
    }
}

/// Carries the change of the quoted headers (old and new copies in `buf`) into the ICMP
/// checksum at `csum_off`.
#[inline(always)]
fn fix_icmp_csum(
    ctx: &TcContext,
    csum_off: usize,
    buf: &mut [u8; REPLY_SCRATCH_LEN],
    len: usize,
) -> bool {
    let len = if len == QUOTE4 { QUOTE4 } else { QUOTE6 } as u32;
    // SAFETY: both ranges lie inside the scratch buffer (see the assertion on the offsets).
    let diff = unsafe {
        bpf_csum_diff(
            buf.as_mut_ptr().add(OLD).cast(),
            len,
            buf.as_mut_ptr().add(NEW).cast(),
            len,
            0,
        )
    };
    diff >= 0 && PacketIo::l4_csum_replace(ctx, csum_off, 0, diff as u32, 0)
}
