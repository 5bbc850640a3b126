// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Egress on the node's uplink devices.
//!
//! - Answers of local backends that reached the uplink without passing a pod-side program
//!   (e.g. a pod device created after the agent looked) are translated back here.
//! - Connections from this node and its pods are translated at the socket layer; what the
//!   socket programs deliberately left alone because upstream drops it (traffic-policy
//!   Local with endpoints elsewhere only, a source outside loadBalancerSourceRanges, an
//!   address inside a service CIDR that no service holds) leaves through here, and is
//!   dropped. Which scope of a two-scope frontend judges it follows the socket programs:
//!   the internal one for the node's own traffic (never forwarded: no ingress device), and
//!   for pods' only when a local-traffic detector is configured; without one, upstream takes
//!   pods for outside clients (externalTrafficPolicy applies to them).

use aya_ebpf::{bindings::TC_ACT_OK, bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{
    LB_CFG_HANDING_OVER,
    maps::{
        DROP_NO_LOCAL_ENDPOINTS, DROP_SOURCE_RANGE, DROP_UNALLOCATED_SERVICE_IP,
        REJECT_UNSERVED_PORT,
    },
    svc_flags,
};

use super::{
    PacketFamily, ct,
    nat::AddrRewrite,
    parse::{self, ETH_P_IP, ETH_P_IPV6},
    reply,
};
use crate::{
    lb::{Frontend, V4, V6, lookup_frontend, pods_are_local},
    maps::count_datapath,
    packet::Packet,
};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> i32 {
    match parse::ethertype(ctx) {
        Some(ETH_P_IP) => run::<V4>(ctx),
        Some(ETH_P_IPV6) => run::<V6>(ctx),
        _ => TC_ACT_OK,
    }
}

// One frame per family: inlining both into the program would add their stacks up.
#[inline(never)]
fn run<F: AddrRewrite>(ctx: &TcContext) -> i32 {
    let Some(p) = super::parse_into::<TcContext, F>(ctx) else {
        return TC_ACT_OK;
    };
    if let Some(v) = reply::lookup::<F>(p) {
        return reply::rewrite_in_place::<F>(ctx, p, v);
    }
    // SAFETY: the context pointer is valid for the program's run.
    let forwarded = unsafe { (*ctx.skb.skb).ingress_ifindex } != 0;
    let flags = ct::config().flags;
    verdict::<F>(p, !forwarded || pods_are_local(flags), flags)
}

/// The verdict on a packet to a frontend that no socket program translated: dropped where
/// upstream drops (no endpoints in the scope that applies, a source outside the ranges, an
/// unallocated service address), passed otherwise, and always while a netfilter mode takes
/// the node over. `internal`: judge by the internal scope of a two-scope frontend;
/// `flags`: the configuration's, as the caller read them.
#[inline(always)]
pub fn verdict<F: PacketFamily>(p: &Packet<F::Addr>, internal: bool, flags: u32) -> i32 {
    if flags & LB_CFG_HANDING_OVER != 0 {
        // The socket programs leave every new connection to the netfilter mode taking the
        // node over: its rules, not these, decide what is dropped.
        return TC_ACT_OK;
    }
    let reason = match lookup_frontend::<F>(p.daddr, p.dport, p.proto, internal) {
        Frontend::None => return TC_ACT_OK,
        // The socket programs refuse these themselves; what reaches here was sent before
        // the frontend changed.
        Frontend::Drop => DROP_UNALLOCATED_SERVICE_IP,
        Frontend::Reject => REJECT_UNSERVED_PORT,
        Frontend::Service { svc, .. } => {
            if svc.flags & svc_flags::SOURCE_RANGES != 0
                && !F::source_allowed(svc.rev_nat_id, p.saddr)
            {
                DROP_SOURCE_RANGE
            } else if svc.count == 0 {
                DROP_NO_LOCAL_ENDPOINTS
            } else {
                return TC_ACT_OK;
            }
        }
    };
    count_datapath(reason);
    TC_ACT_SHOT
}
