// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Translating a backend's answer back: its source becomes the frontend the client spoke
//! to, and for SNATed flows its destination becomes the client again.

use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{CT_DIR_REPLY, CT_F_SNAT, CtValue};

use super::{
    TcFamily, ct,
    nat::{AddrRewrite, Side, rewrite_port},
    route::{self, Next},
};
use crate::parse::Packet;

/// The flow `p` answers, if it answers one (refreshing its lifetime).
#[inline(always)]
pub fn lookup<F: TcFamily>(p: &Packet<F::Addr>) -> Option<&'static CtValue> {
    let key = F::ct_key(p.saddr, p.daddr, p.sport, p.dport, p.proto, CT_DIR_REPLY);
    ct::touch(F::ct_get(&key), p, ct::config())
}

/// Rewrites `p` as the frontend's answer. Returns where it now goes, or `None` when a
/// rewrite failed (the caller drops).
#[inline(always)]
pub fn rewrite<F: AddrRewrite>(
    ctx: &TcContext,
    p: &Packet<F::Addr>,
    v: &CtValue,
) -> Option<Next<F::Addr>> {
    let mut next = Next {
        saddr: F::from16(&v.frontend_addr),
        daddr: p.daddr,
        sport: v.frontend_port,
        dport: p.dport,
    };
    if !F::rewrite_addr(ctx, p, Side::Source, next.saddr)
        || !rewrite_port(ctx, p, Side::Source, next.sport)
    {
        return None;
    }
    if v.flags & CT_F_SNAT != 0 {
        next.daddr = F::from16(&v.client_addr);
        next.dport = v.client_port;
        if !F::rewrite_addr(ctx, p, Side::Destination, next.daddr)
            || !rewrite_port(ctx, p, Side::Destination, next.dport)
        {
            return None;
        }
    }
    Some(next)
}

/// Rewrites and sends the answer towards the client.
#[inline(never)]
pub fn translate<F: AddrRewrite>(ctx: &TcContext, p: &Packet<F::Addr>, v: &CtValue) -> i32 {
    match rewrite::<F>(ctx, p, v) {
        Some(next) => route::redirect::<F>(ctx, p, &next),
        None => TC_ACT_SHOT,
    }
}
