// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Egress on the node's uplink devices. Connections from this node and its pods are
//! translated at the socket layer; what the socket programs deliberately left alone because
//! upstream drops it (traffic-policy Local with endpoints elsewhere only, a source outside
//! loadBalancerSourceRanges, an address inside a service CIDR that no service holds) leaves
//! through here, and is dropped.

use aya_ebpf::{bindings::TC_ACT_OK, bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::svc_flags;

use crate::{
    lb::{Family, Frontend, V4, V6, lookup_frontend},
    parse::{self, ETH_P_IP, ETH_P_IPV6, Packet},
};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> i32 {
    match parse::ethertype(ctx) {
        Some(ETH_P_IP) => match parse::ipv4(ctx) {
            Some(p) => verdict::<V4>(&p),
            None => TC_ACT_OK,
        },
        Some(ETH_P_IPV6) => match parse::ipv6(ctx) {
            Some(p) => verdict::<V6>(&p),
            None => TC_ACT_OK,
        },
        _ => TC_ACT_OK,
    }
}

#[inline(always)]
fn verdict<F: Family>(p: &Packet<F::Addr>) -> i32 {
    if p.later_fragment {
        return TC_ACT_OK;
    }
    match lookup_frontend::<F>(p.daddr, p.dport, p.proto, true) {
        Frontend::None => TC_ACT_OK,
        Frontend::Drop | Frontend::Reject => TC_ACT_SHOT,
        Frontend::Service { svc, .. } => {
            if svc.flags & svc_flags::SOURCE_RANGES != 0
                && !F::source_allowed(svc.rev_nat_id, p.saddr)
            {
                return TC_ACT_SHOT;
            }
            if svc.count == 0 {
                return TC_ACT_SHOT;
            }
            TC_ACT_OK
        }
    }
}
