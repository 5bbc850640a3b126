// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Ingress on the node's uplink devices: north-south load balancing. The same logic runs
//! in tc and, when enabled, in XDP before it (see [`super::forward`]).

use proxy_common::{
    CT_DIR_FORWARD, CT_F_CLOSING, CT_F_SNAT, CtValue, LB_CFG_HANDING_OVER,
    maps::{
        DROP_BACKEND_MISSING, DROP_CONNTRACK_FULL, DROP_FRAGMENT, DROP_NO_LOCAL_ENDPOINTS,
        DROP_REWRITE_FAILED, DROP_SNAT_PORTS_EXHAUSTED, DROP_SOURCE_RANGE,
        DROP_UNALLOCATED_SERVICE_IP, REJECT_NO_ENDPOINTS, REJECT_UNSERVED_PORT,
    },
    proto, svc_flags,
};

use super::{
    PacketFamily, ct,
    forward::Forward,
    nat::{AddrRewrite, Side, rewrite_port},
    parse::{self, ETH_P_IP, ETH_P_IPV6, TCP_ACK, TCP_SYN},
    reply,
    route::{Next, Plan},
};
use aya_ebpf::programs::TcContext;

use crate::{
    lb::{
        Client, ClientSide, Frontend, MaglevHash, V4, V6, flow_hash, lookup_frontend,
        masquerade_flow, pods_are_local, select_backend,
    },
    maps::{CT_SCRATCH, count_datapath},
    packet::Packet,
};

#[inline(always)]
pub fn handle<C: Forward>(ctx: &C) -> i32 {
    match parse::ethertype(ctx) {
        Some(ETH_P_IP) => run::<C, V4>(ctx),
        Some(ETH_P_IPV6) => run::<C, V6>(ctx),
        _ => C::PASS,
    }
}

/// The masquerade address of the family.
pub trait Masquerade: PacketFamily {
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
fn run<C: Forward, F: AddrRewrite + Masquerade>(ctx: &C) -> i32 {
    let Some(p) = super::parse_into::<C, F>(ctx) else {
        return C::PASS;
    };
    if p.proto == parse::IPPROTO_ICMP || p.proto == parse::IPPROTO_ICMPV6 {
        return ctx.icmp::<F>(p);
    }
    if p.proto != proto::TCP && p.proto != proto::UDP && p.proto != proto::SCTP {
        return C::PASS;
    }
    // Answers of remote backends to our SNAT address.
    if let Some(v) = reply_entry::<F>(p) {
        return reply::translate::<C, F>(ctx, p, v);
    }
    balance::<C, F>(ctx, p, ClientSide::Outside)
}

/// A packet towards a frontend: its flow's translation, or a new flow's.
#[inline(always)]
fn balance<C: Forward, F: AddrRewrite + Masquerade>(
    ctx: &C,
    p: &Packet<F::Addr>,
    side: ClientSide,
) -> i32 {
    if let Some(v) = forward_entry::<F>(p) {
        return match plan_forward::<C, F>(ctx, p, v) {
            Some(plan) => forward::<C, F>(ctx, p, v, plan),
            None => C::PASS,
        };
    }
    match new_flow::<C, F>(ctx, p, ct::config(), side) {
        NewFlow::Done(action) => action,
        NewFlow::Reject(reason) => ctx.reject::<F>(p, reason),
    }
}

/// Per-packet load balancing of what a pod sends that no socket program translated: SCTP,
/// for which the kernel runs no cgroup connect or sendmsg hook, and, with masqueradeAll,
/// the connections the socket programs leave here because their source must become the
/// node's (a socket program cannot change it). Frontends are looked up as the socket
/// programs do for pods (the internal scope of a frontend that has two, when pods count as
/// local). Replies come back through [`reply`], on the backend's device or the uplink.
#[inline(never)]
pub fn from_pod<F: AddrRewrite + Masquerade>(ctx: &TcContext, p: &Packet<F::Addr>) -> i32 {
    balance::<TcContext, F>(ctx, p, ClientSide::Pod)
}

/// A new flow's packet dropped and counted under `reason`. One frame for every drop of
/// new_flow, beside its deeper calls: inlined at each site, the counters' keys took
/// new_flow's frame a size class up and the pod-side chain over the verifier's limit.
#[inline(never)]
fn dropped<C: Forward>(reason: u32) -> NewFlow {
    count_datapath(reason);
    NewFlow::Done(C::DROP)
}

/// What became of a packet that belongs to no flow yet.
enum NewFlow {
    /// The program's return code.
    Done(i32),
    /// Answer it (TCP RST, ICMP unreachable). Built by the caller, so that the answer's frame
    /// sits beside new_flow's, not under it: nested, the two came to exactly the 512 bytes
    /// of combined stack the verifier allows. The reason is the counter slot.
    Reject(u32),
}

#[inline(never)]
fn reply_entry<F: PacketFamily>(p: &Packet<F::Addr>) -> Option<&'static CtValue> {
    reply::lookup::<F>(p)
}

/// The live flow this packet belongs to. A new connection reusing the tuple of one that is
/// closing starts afresh.
#[inline(never)]
fn forward_entry<F: PacketFamily>(p: &Packet<F::Addr>) -> Option<&'static CtValue> {
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
fn new_flow<C: Forward, F: AddrRewrite + Masquerade>(
    ctx: &C,
    p: &Packet<F::Addr>,
    cfg: &proxy_common::LbConfig,
    side: ClientSide,
) -> NewFlow {
    if cfg.flags & LB_CFG_HANDING_OVER != 0 {
        // A netfilter mode is taking the node over and its rules are in place: what starts
        // now is theirs, so that no flow is left that only the departing programs know.
        return NewFlow::Done(C::PASS);
    }
    if p.later_fragment {
        // Its first fragment made no flow: nothing to join.
        return dropped::<C>(DROP_FRAGMENT);
    }
    let internal = side == ClientSide::Pod && pods_are_local(cfg.flags);
    let (svc, key) = match lookup_frontend::<F>(p.daddr, p.dport, p.proto, internal) {
        Frontend::None => return NewFlow::Done(C::PASS),
        Frontend::Drop => return dropped::<C>(DROP_UNALLOCATED_SERVICE_IP),
        Frontend::Reject => return NewFlow::Reject(REJECT_UNSERVED_PORT),
        Frontend::Service { svc, key } => (svc, key),
    };
    let maglev = side == ClientSide::Outside && svc.flags & svc_flags::MAGLEV != 0;
    if p.proto == proto::TCP && p.tcp_flags & TCP_SYN == 0 && !maglev {
        // Not the start of a connection: one this conntrack does not know, e.g. translated
        // by the netfilter mode this node ran before (whose conntrack entry, kept on by the
        // agent's handover table, still translates it). Given a backend of its own now it
        // would only be reset there; the stack has the entry, or answers as a host does.
        // A Maglev frontend does take it: another node may have started the flow (an ECMP
        // router moved it), and the table picks the backend that node picked.
        return NewFlow::Done(C::PASS);
    }
    if svc.flags & svc_flags::SOURCE_RANGES != 0 && !F::source_allowed(svc.rev_nat_id, p.saddr) {
        return dropped::<C>(DROP_SOURCE_RANGE);
    }
    if svc.count == 0 {
        if svc.flags & svc_flags::DROP_NO_ENDPOINTS != 0 {
            return dropped::<C>(DROP_NO_LOCAL_ENDPOINTS);
        }
        return NewFlow::Reject(REJECT_NO_ENDPOINTS);
    }
    // Maglev applies to clients outside the node only: an ECMP router may send their packets
    // to any node, which must all pick the same backend.
    let maglev_hash = if maglev {
        MaglevHash::of(flow_hash::<F>(
            &p.saddr, &p.daddr, p.sport, p.dport, p.proto,
        ))
    } else {
        MaglevHash::NONE
    };
    let Some((backend_id, backend)) =
        select_backend::<F>(&svc, &key, Client::Addr(p.saddr), maglev_hash)
    else {
        return dropped::<C>(DROP_BACKEND_MISSING);
    };
    let (baddr, bport) = F::backend_target(&backend);
    if p.proto == proto::SCTP && bport != p.dport && p.fragment {
        // SCTP's CRC32c covers the ports and the whole packet: a fragment's cannot be
        // patched (whole packets are: proxy_common::crc32c).
        return dropped::<C>(DROP_FRAGMENT);
    }
    // Built in per-CPU scratch space: the stack is too small for it.
    let Some(v) = CT_SCRATCH.get_ptr_mut(0) else {
        return NewFlow::Done(C::DROP);
    };
    // SAFETY: a per-CPU slot; networking programs do not preempt each other on one CPU.
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
    v.set_rev_nat_id(svc.rev_nat_id);
    v.flags = 0;
    v.expires = ct::now() + ct::lifetime(cfg, p.proto, false);
    v.ifindex = 0;
    let masq = F::masq(cfg);
    // A pod reaching itself through the service (the hairpin) is masqueraded, as upstream's
    // endpoint chains do: with its own address as the source, what comes back to it would
    // be martian. (Socket-level load balancing needs none: the pod's own stack delivers.)
    let hairpin = baddr == p.saddr;
    if masq != F::zero() && (hairpin || masquerade_flow::<F>(&svc, cfg.flags, &p.saddr, side)) {
        let Some(port) = ct::snat_port::<F>(cfg, v, masq, p.proto) else {
            return dropped::<C>(DROP_SNAT_PORTS_EXHAUSTED);
        };
        if p.proto == proto::SCTP && port != p.sport && p.fragment {
            return dropped::<C>(DROP_FRAGMENT);
        }
        v.flags |= CT_F_SNAT;
        v.snat_addr = F::to16(masq);
        v.snat_port = port;
    }
    // Where it goes is settled before anything is recorded: a layer that does not take
    // the flow (XDP) leaves no trace of it.
    let Some(plan) = plan_forward::<C, F>(ctx, p, v) else {
        return NewFlow::Done(C::PASS);
    };
    if !ct::create::<F>(v, p.proto) {
        return dropped::<C>(DROP_CONNTRACK_FULL);
    }
    NewFlow::Done(forward::<C, F>(ctx, p, v, plan))
}

/// Where a forward packet of the flow goes once translated.
#[inline(always)]
fn forward_next<F: PacketFamily>(p: &Packet<F::Addr>, v: &CtValue) -> Next<F::Addr> {
    let snat = v.flags & CT_F_SNAT != 0;
    Next {
        saddr: if snat {
            F::from16(&v.snat_addr)
        } else {
            p.saddr
        },
        daddr: F::from16(&v.backend_addr),
        sport: if snat { v.snat_port } else { p.sport },
        dport: v.backend_port,
    }
}

#[inline(never)]
fn plan_forward<C: Forward, F: AddrRewrite>(
    ctx: &C,
    p: &Packet<F::Addr>,
    v: &CtValue,
) -> Option<Plan> {
    let next = forward_next::<F>(p, v);
    ctx.plan::<F>(p, &next, v.flags & CT_F_SNAT == 0)
}

/// Applies a flow's translation to one of its forward packets and sends it on.
#[inline(never)]
fn forward<C: Forward, F: AddrRewrite>(
    ctx: &C,
    p: &Packet<F::Addr>,
    v: &CtValue,
    plan: Plan,
) -> i32 {
    let next = forward_next::<F>(p, v);
    if !F::rewrite_addr(ctx, p, Side::Destination, next.daddr)
        || !rewrite_port(ctx, p, Side::Destination, next.dport)
    {
        count_datapath(DROP_REWRITE_FAILED);
        return C::DROP;
    }
    if v.flags & CT_F_SNAT != 0
        && (!F::rewrite_addr(ctx, p, Side::Source, next.saddr)
            || !rewrite_port(ctx, p, Side::Source, next.sport))
    {
        count_datapath(DROP_REWRITE_FAILED);
        return C::DROP;
    }
    ctx.send(plan)
}
