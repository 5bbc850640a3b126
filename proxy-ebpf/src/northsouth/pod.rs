// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Ingress on the node's other devices (pods): answers of local backends to translated
//! flows are translated back and sent to the client; SCTP to a frontend is load-balanced
//! per packet (no socket program sees SCTP), and so, with masqueradeAll, is everything the
//! socket programs left untranslated so that its source can become the node's, and with
//! socketLBHostNamespaceOnly everything pods send to a frontend. Without a
//! local-traffic detector, what the socket programs left untranslated because upstream
//! drops it (pods count as outside clients then, so an eTP=Local frontend without local
//! endpoints drops them) is dropped here: such a packet may be for a node address, which no
//! uplink program sees. Everything else passes.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use proxy_common::{LB_CFG_MASQUERADE_ALL, LB_CFG_SOCKET_LB_HOST_NETNS_ONLY, proto};

use super::{
    ct, egress, icmp,
    ingress::{self, Masquerade},
    nat::AddrRewrite,
    parse::{self, ETH_P_IP, ETH_P_IPV6},
    reply,
};
use crate::{
    lb::{V4, V6, pods_are_local},
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
fn run<F: AddrRewrite + Masquerade>(ctx: &TcContext) -> i32 {
    let Some(p) = super::parse_into::<TcContext, F>(ctx) else {
        return TC_ACT_OK;
    };
    if p.proto == parse::IPPROTO_ICMP || p.proto == parse::IPPROTO_ICMPV6 {
        return icmp::handle::<F>(ctx, p);
    }
    if p.proto != proto::TCP && p.proto != proto::UDP && p.proto != proto::SCTP {
        return TC_ACT_OK;
    }
    match reply::lookup::<F>(p) {
        Some(v) => reply::translate::<TcContext, F>(ctx, p, v),
        None if p.proto == proto::SCTP => ingress::from_pod::<F>(ctx, p),
        // Only then do socket programs leave TCP and UDP of pods to this program: otherwise
        // a connection's packets already go to its backend.
        None if ct::config().flags & (LB_CFG_MASQUERADE_ALL | LB_CFG_SOCKET_LB_HOST_NETNS_ONLY)
            != 0 =>
        {
            ingress::from_pod::<F>(ctx, p)
        }
        // A packet still addressed to a frontend was left so on purpose (see the module's
        // notes); a translated one is addressed to its backend and passes.
        None if !pods_are_local(ct::config().flags) => dropped_as_outside::<F>(p),
        None => TC_ACT_OK,
    }
}

/// The verdict for a pod taken as an outside client. Its own frame, beside from_pod's call
/// chain rather than under run's: inlined, its frontend keys would count against the
/// verifier's combined stack of the load-balancing path.
#[inline(never)]
fn dropped_as_outside<F: AddrRewrite>(p: &Packet<F::Addr>) -> i32 {
    egress::verdict::<F>(p, false, ct::config().flags)
}

/// Egress on the pod devices (towards the pod), attached only with
/// socketLBHostNamespaceOnly: answers that the node's own stack sends to a pod, from a
/// backend on the node (a host-network endpoint) of a flow [`ingress::from_pod`]
/// translated, reach no other program. They are translated back on their way in.
#[inline(always)]
pub fn handle_egress(ctx: &TcContext) -> i32 {
    match parse::ethertype(ctx) {
        Some(ETH_P_IP) => answer_to_pod::<V4>(ctx),
        Some(ETH_P_IPV6) => answer_to_pod::<V6>(ctx),
        _ => TC_ACT_OK,
    }
}

#[inline(never)]
fn answer_to_pod<F: AddrRewrite>(ctx: &TcContext) -> i32 {
    let Some(p) = super::parse_into::<TcContext, F>(ctx) else {
        return TC_ACT_OK;
    };
    match reply::lookup::<F>(p) {
        Some(v) => reply::rewrite_in_place::<F>(ctx, p, v),
        None => TC_ACT_OK,
    }
}
