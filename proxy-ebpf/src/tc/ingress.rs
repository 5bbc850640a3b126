// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Ingress on the node's uplink devices: north-south load balancing.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use proxy_common::{CT_DIR_FORWARD, CT_F_CLOSING, CT_F_SNAT, CtValue, proto, svc_flags};

use super::{
    TcFamily, ct,
    nat::{AddrRewrite, Side, rewrite_port},
    reject, reply,
    route::{self, Next},
};
use crate::{
    lb::{Client, Frontend, V4, V6, lookup_frontend, select_backend},
    maps::CT_SCRATCH,
    parse::{self, ETH_P_IP, ETH_P_IPV6, Packet, TCP_ACK, TCP_SYN},
};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> i32 {
    match parse::ethertype(ctx) {
        Some(ETH_P_IP) => run::<V4>(ctx),
        Some(ETH_P_IPV6) => run::<V6>(ctx),
        _ => TC_ACT_OK,
    }
}

/// The masquerade address of the family.
pub trait Masquerade: TcFamily {
    fn masq(cfg: &proxy_common::LbConfig) -> Self::Addr;
}

impl Masquerade for V4 {
    #[inline(always)]
    fn masq(cfg: &proxy_common::LbConfig) -> u32 {
        cfg.masq4
    }
}

impl Masquerade for V6 {
    #[inline(always)]
    fn masq(cfg: &proxy_common::LbConfig) -> [u8; 16] {
        cfg.masq6
    }
}

// One frame per family: inlining both into the program would add their stacks up. The
// frame is kept small (it sits under every other call of the chain).
#[inline(never)]
fn run<F: AddrRewrite + Masquerade>(ctx: &TcContext) -> i32 {
    let Some(p) = super::parse_into::<F>(ctx) else {
        return TC_ACT_OK;
    };
    if p.later_fragment
        || (p.proto != proto::TCP && p.proto != proto::UDP && p.proto != proto::SCTP)
    {
        return TC_ACT_OK;
    }
    // Answers of remote backends to our SNAT address.
    if let Some(v) = reply_entry::<F>(p) {
        return reply::translate::<F>(ctx, p, v);
    }
    if let Some(v) = forward_entry::<F>(p) {
        return forward::<F>(ctx, p, v);
    }
    new_flow::<F>(ctx, p, ct::config())
}

#[inline(never)]
fn reply_entry<F: TcFamily>(p: &Packet<F::Addr>) -> Option<&'static CtValue> {
    reply::lookup::<F>(p)
}

/// The live flow this packet belongs to. A new connection reusing the tuple of one that is
/// closing starts afresh.
#[inline(never)]
fn forward_entry<F: TcFamily>(p: &Packet<F::Addr>) -> Option<&'static CtValue> {
    let key = F::ct_key(p.saddr, p.daddr, p.sport, p.dport, p.proto, CT_DIR_FORWARD);
    let v = ct::touch(F::ct_get(&key), p, ct::config())?;
    let new_connection = p.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    if new_connection && v.flags & CT_F_CLOSING != 0 {
        ct::forget::<F>(v, p.proto);
        return None;
    }
    Some(v)
}

#[inline(never)]
fn new_flow<F: AddrRewrite + Masquerade>(
    ctx: &TcContext,
    p: &Packet<F::Addr>,
    cfg: &proxy_common::LbConfig,
) -> i32 {
    let (svc, key) = match lookup_frontend::<F>(p.daddr, p.dport, p.proto, false) {
        Frontend::None => return TC_ACT_OK,
        Frontend::Drop => return TC_ACT_SHOT,
        Frontend::Reject => return reject::reject::<F>(ctx, p),
        Frontend::Service { svc, key } => (svc, key),
    };
    if svc.flags & svc_flags::SOURCE_RANGES != 0 && !F::source_allowed(svc.rev_nat_id, p.saddr) {
        return TC_ACT_SHOT;
    }
    if svc.count == 0 {
        if svc.flags & svc_flags::DROP_NO_ENDPOINTS != 0 {
            return TC_ACT_SHOT;
        }
        return reject::reject::<F>(ctx, p);
    }
    let Some((backend_id, backend)) = select_backend::<F>(&svc, &key, Client::Addr(p.saddr)) else {
        return TC_ACT_SHOT;
    };
    let (baddr, bport) = F::backend_target(&backend);
    if p.proto == proto::SCTP && bport != p.dport {
        // SCTP's CRC32c covers the ports and cannot be patched incrementally.
        return TC_ACT_SHOT;
    }
    // Built in per-CPU scratch space: the stack is too small for it.
    let Some(v) = CT_SCRATCH.get_ptr_mut(0) else {
        return TC_ACT_SHOT;
    };
    // SAFETY: a per-CPU slot; tc programs do not preempt each other on one CPU.
    let v = unsafe { &mut *v };
    v.frontend_addr = F::to16(p.daddr);
    v.backend_addr = F::to16(baddr);
    v.client_addr = F::to16(p.saddr);
    v.snat_addr = [0; 16];
    v.frontend_port = p.dport;
    v.backend_port = bport;
    v.client_port = p.sport;
    v.snat_port = 0;
    v.backend_id = backend_id;
    v.rev_nat_id = svc.rev_nat_id;
    v.flags = 0;
    v._pad = 0;
    v.expires = ct::now() + ct::lifetime(cfg, p.proto, false);
    v.ifindex = 0;
    let masq = F::masq(cfg);
    if svc.flags & svc_flags::MASQUERADE != 0 && masq != F::zero() {
        let Some(port) = ct::snat_port::<F>(cfg, v, masq, p.proto) else {
            return TC_ACT_SHOT;
        };
        if p.proto == proto::SCTP && port != p.sport {
            return TC_ACT_SHOT;
        }
        v.flags |= CT_F_SNAT;
        v.snat_addr = F::to16(masq);
        v.snat_port = port;
    }
    if !ct::create::<F>(v, p.proto) {
        return TC_ACT_SHOT;
    }
    forward::<F>(ctx, p, v)
}

/// Applies a flow's translation to one of its forward packets and sends it on.
#[inline(never)]
fn forward<F: AddrRewrite>(ctx: &TcContext, p: &Packet<F::Addr>, v: &CtValue) -> i32 {
    let mut next = Next {
        saddr: p.saddr,
        daddr: F::from16(&v.backend_addr),
        sport: p.sport,
        dport: v.backend_port,
    };
    if !F::rewrite_addr(ctx, p, Side::Destination, next.daddr)
        || !rewrite_port(ctx, p, Side::Destination, next.dport)
    {
        return TC_ACT_SHOT;
    }
    if v.flags & CT_F_SNAT != 0 {
        next.saddr = F::from16(&v.snat_addr);
        next.sport = v.snat_port;
        if !F::rewrite_addr(ctx, p, Side::Source, next.saddr)
            || !rewrite_port(ctx, p, Side::Source, next.sport)
        {
            return TC_ACT_SHOT;
        }
    }
    route::redirect::<F>(ctx, p, &next)
}
