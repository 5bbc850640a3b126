// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! How a translated packet leaves, and what each context leaves to the other: the part of
//! the north-south path where tc and XDP differ (their packet access is
//! [`super::packet_io`]).
//!
//! XDP is an accelerator in front of tc: whatever it does not handle completely it passes
//! up untouched (`plan` answers `None`), and the tc program on the same device, which
//! handles everything, sees the packet next. So XDP only ever takes the simple, common
//! cases: transmit back out of the device it came in by, or deliver a DNATed packet to
//! the stack when the stack can route it as it is.

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NOT_FWDED, BPF_FIB_LKUP_RET_SUCCESS, xdp_action},
    programs::{TcContext, XdpContext},
};

use super::{
    PacketFamily, icmp,
    nat::AddrRewrite,
    packet_io::PacketIo,
    reject,
    route::{self, FibAddrs, Next, Plan},
};
use crate::{maps::FIB_SCRATCH, packet::Packet};

/// The way out of a translated packet, per context.
pub trait Forward: PacketIo {
    /// How the packet leaves once it is translated to `next`, decided before anything is
    /// rewritten. `None`: not this layer's job; the caller passes the packet up untouched.
    /// `stack_ok`: the translated packet may go up the stack (its new source is not one
    /// of the node's addresses, which the stack would drop as martian).
    fn plan<F: FibAddrs>(
        &self,
        p: &Packet<F::Addr>,
        next: &Next<F::Addr>,
        stack_ok: bool,
    ) -> Option<Plan>;
    fn send(&self, plan: Plan) -> i32;
    /// Answers a packet for a frontend without endpoints (upstream's REJECT), counted under
    /// `reason` by the layer that answers.
    fn reject<F: PacketFamily>(&self, p: &Packet<F::Addr>, reason: u32) -> i32;
    /// Handles an ICMP(v6) packet: errors about tracked flows are translated.
    fn icmp<F: AddrRewrite>(&self, p: &Packet<F::Addr>) -> i32;
}

impl Forward for TcContext {
    #[inline(always)]
    fn plan<F: FibAddrs>(
        &self,
        p: &Packet<F::Addr>,
        next: &Next<F::Addr>,
        _stack_ok: bool,
    ) -> Option<Plan> {
        Some(route::tc_plan::<F>(self, p, next))
    }
    #[inline(always)]
    fn send(&self, plan: Plan) -> i32 {
        route::tc_send(plan)
    }
    #[inline(always)]
    fn reject<F: PacketFamily>(&self, p: &Packet<F::Addr>, reason: u32) -> i32 {
        crate::maps::count_datapath(reason);
        reject::reject::<F>(self, p)
    }
    #[inline(always)]
    fn icmp<F: AddrRewrite>(&self, p: &Packet<F::Addr>) -> i32 {
        icmp::handle::<F>(self, p)
    }
}

impl Forward for XdpContext {
    #[inline(always)]
    fn plan<F: FibAddrs>(
        &self,
        p: &Packet<F::Addr>,
        next: &Next<F::Addr>,
        stack_ok: bool,
    ) -> Option<Plan> {
        let rc = route::lookup::<Self, F>(self, p, next);
        if rc == BPF_FIB_LKUP_RET_SUCCESS as i64 && route::out_ifindex() == self.ifindex() {
            return Some(Plan::TRANSMIT);
        }
        // A local backend (another device, or the node itself): the stack routes the
        // DNATed packet, unless its source is now the node's own address.
        let local =
            rc == BPF_FIB_LKUP_RET_SUCCESS as i64 || rc == BPF_FIB_LKUP_RET_NOT_FWDED as i64;
        (local && stack_ok).then_some(Plan::STACK)
    }
    #[inline(always)]
    fn send(&self, plan: Plan) -> i32 {
        if plan != Plan::TRANSMIT {
            crate::maps::count_xdp(proxy_common::maps::XDP_STAT_TRANSLATED_PASS);
            return Self::PASS;
        }
        let Some(params) = FIB_SCRATCH.get_ptr(0) else {
            return Self::DROP;
        };
        // SAFETY: per-CPU scratch filled by this run's FIB lookup.
        let (dmac, smac) = unsafe { ((*params).dmac, (*params).smac) };
        if !self.store(0, &dmac) || !self.store(6, &smac) {
            return Self::DROP;
        }
        xdp_action::XDP_TX as i32
    }
    #[inline(always)]
    fn reject<F: PacketFamily>(&self, _p: &Packet<F::Addr>, _reason: u32) -> i32 {
        // tc, next on the same device, answers (and counts) it.
        Self::PASS
    }
    #[inline(always)]
    fn icmp<F: AddrRewrite>(&self, _p: &Packet<F::Addr>) -> i32 {
        // Rare and intricate: tc handles it.
        Self::PASS
    }
}
