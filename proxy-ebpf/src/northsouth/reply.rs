// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Translating a backend's answer back: its source becomes the frontend the client spoke
//! to, and for SNATed flows its destination becomes the client again.

use proxy_common::{CT_DIR_REPLY, CT_F_NETFILTER, CT_F_SNAT, CtValue};

use super::{
    PacketFamily, ct,
    forward::Forward,
    nat::{AddrRewrite, Side, rewrite_port},
    packet_io::PacketIo,
    route::Next,
};
use crate::packet::Packet;

/// The flow `p` answers, if it answers one of the programs' (refreshing its lifetime).
/// An answer of a flow netfilter translates is none of theirs (`CT_F_NETFILTER`).
#[inline(always)]
pub fn lookup<F: PacketFamily>(p: &Packet<F::Addr>) -> Option<&'static CtValue> {
    let key = F::ct_key(p.saddr, p.daddr, p.sport, p.dport, p.proto, CT_DIR_REPLY);
    let entry = F::ct_get(&key)?;
    // SAFETY: a map value, valid for this program run.
    if unsafe { (*entry).flags } & CT_F_NETFILTER != 0 {
        return None;
    }
    ct::touch(Some(entry), p, ct::config())
}

/// Where the answer goes once translated.
#[inline(always)]
pub fn next<F: PacketFamily>(p: &Packet<F::Addr>, v: &CtValue) -> Next<F::Addr> {
    let mut next = Next {
        saddr: F::from16(&v.frontend_addr),
        daddr: p.daddr,
        sport: v.frontend_port,
        dport: p.dport,
    };
    if v.flags & CT_F_SNAT != 0 {
        next.daddr = F::from16(&v.client_addr);
        next.dport = v.client_port;
    }
    next
}

/// Rewrites `p` as the frontend's answer, to `next`. False when a rewrite failed (the
/// caller drops). A frame of its own: inlined, the IPv6 rewrite's buffers would sit under
/// every call of the caller's chain.
#[inline(never)]
pub fn rewrite<C: PacketIo, F: AddrRewrite>(
    ctx: &C,
    p: &Packet<F::Addr>,
    next: &Next<F::Addr>,
) -> bool {
    if !F::rewrite_addr(ctx, p, Side::Source, next.saddr)
        || !rewrite_port(ctx, p, Side::Source, next.sport)
    {
        return false;
    }
    if (next.daddr != p.daddr || next.dport != p.dport)
        && (!F::rewrite_addr(ctx, p, Side::Destination, next.daddr)
            || !rewrite_port(ctx, p, Side::Destination, next.dport))
    {
        return false;
    }
    true
}

/// Rewrites and sends the answer towards the client; passes it up untouched when this
/// layer does not handle where it goes.
#[inline(never)]
pub fn translate<C: Forward, F: AddrRewrite>(ctx: &C, p: &Packet<F::Addr>, v: &CtValue) -> i32 {
    let next = next::<F>(p, v);
    // The new source is the frontend, often a node address: never handed to the stack.
    let Some(plan) = ctx.plan::<F>(p, &next, false) else {
        return C::PASS;
    };
    if !rewrite::<C, F>(ctx, p, &next) {
        crate::maps::count_datapath(proxy_common::maps::DROP_REWRITE_FAILED);
        return C::DROP;
    }
    ctx.send(plan)
}

/// Translates an answer already on its way out of the device that leads to its client (tc
/// egress): rewritten and let go, dropped when a rewrite failed.
#[inline(always)]
pub fn rewrite_in_place<F: AddrRewrite>(
    ctx: &aya_ebpf::programs::TcContext,
    p: &Packet<F::Addr>,
    v: &CtValue,
) -> i32 {
    let next = next::<F>(p, v);
    if rewrite::<aya_ebpf::programs::TcContext, F>(ctx, p, &next) {
        aya_ebpf::bindings::TC_ACT_OK
    } else {
        crate::maps::count_datapath(proxy_common::maps::DROP_REWRITE_FAILED);
        aya_ebpf::bindings::TC_ACT_SHOT
    }
}
