// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Where a translated packet goes: a FIB lookup for its new addresses. tc then redirects to
//! that device with the neighbour filled in (bypassing the stack matters after SNAT to a
//! node address: a forwarded packet whose source is local would be dropped as martian);
//! XDP transmits when the answer is the device the packet came in by.

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, bpf_fib_lookup},
    helpers::generated::{bpf_fib_lookup as fib_lookup, bpf_redirect_neigh},
    programs::TcContext,
};

use super::{PacketFamily, packet_io::PacketIo};
use crate::{
    lb::{V4, V6},
    maps::FIB_SCRATCH,
    packet::Packet,
};

/// Where a rewritten packet goes: its new addresses and ports.
#[derive(Clone, Copy)]
pub struct Next<A> {
    pub saddr: A,
    pub daddr: A,
    pub sport: u16,
    pub dport: u16,
}

/// How a translated packet leaves: up the stack as it is now (which routes it), back out
/// of the device it came in by with the MAC addresses of the FIB lookup (XDP), or (tc) to
/// a device, the neighbour resolved by the kernel. One integer rather than an enum with
/// data: the verifier rejects the undefined payload bytes of the other variants when such
/// an enum is spilled.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Plan(u32);

impl Plan {
    pub const STACK: Plan = Plan(0);
    pub const TRANSMIT: Plan = Plan(u32::MAX);

    /// To device `ifindex` (never 0 for a real device).
    #[inline(always)]
    pub fn redirect(ifindex: u32) -> Plan {
        Plan(ifindex)
    }
}

/// Returned when the lookup could not even be made.
pub const NO_LOOKUP: i64 = -1;

/// Looks up the route of the translated packet and returns the helper's code (a plain
/// integer: BPF calls return one register). The answer — output device, MAC addresses —
/// stays in the per-CPU scratch for this run ([`out_ifindex`]).
#[inline(never)]
pub fn lookup<C: PacketIo, F: FibAddrs>(ctx: &C, p: &Packet<F::Addr>, next: &Next<F::Addr>) -> i64 {
    let Some(params) = FIB_SCRATCH.get_ptr_mut(0) else {
        return NO_LOOKUP;
    };
    // SAFETY: a per-CPU slot; networking programs do not preempt each other on one CPU.
    let params = unsafe { &mut *params };
    // SAFETY: the struct is plain data; all-zero is its neutral value.
    *params = unsafe { core::mem::zeroed() };
    params.family = F::AF;
    params.l4_protocol = p.proto;
    params.sport = next.sport;
    params.dport = next.dport;
    params.__bindgen_anon_1.tot_len = p.l3_len;
    params.ifindex = ctx.ifindex();
    F::fib_addrs(params, &next.saddr, &next.daddr);
    // SAFETY: the parameters live in a map value of the right size.
    unsafe {
        fib_lookup(
            ctx.raw(),
            params,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    }
}

/// The output device of this run's last lookup.
#[inline(always)]
pub fn out_ifindex() -> u32 {
    // SAFETY: per-CPU scratch; read right after this run's lookup.
    FIB_SCRATCH
        .get_ptr(0)
        .map_or(0, |p| unsafe { (*p).ifindex })
}

/// tc's way out for a packet translated to `next`: tc handles everything, so when the FIB
/// cannot tell, the stack decides.
#[inline(always)]
pub fn tc_plan<F: FibAddrs>(ctx: &TcContext, p: &Packet<F::Addr>, next: &Next<F::Addr>) -> Plan {
    let rc = lookup::<TcContext, F>(ctx, p, next);
    if rc == BPF_FIB_LKUP_RET_SUCCESS as i64 || rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
        Plan::redirect(out_ifindex())
    } else {
        Plan::STACK
    }
}

/// Sends a packet from tc the way [`tc_plan`] chose.
#[inline(always)]
pub fn tc_send(plan: Plan) -> i32 {
    if plan == Plan::STACK || plan == Plan::TRANSMIT {
        return TC_ACT_OK;
    }
    // SAFETY: a plain helper call; no neighbour parameters (the kernel resolves).
    unsafe { bpf_redirect_neigh(plan.0, core::ptr::null_mut(), 0, 0) as i32 }
}

/// Writes a family's addresses into the FIB lookup parameters.
pub trait FibAddrs: PacketFamily {
    fn fib_addrs(params: &mut bpf_fib_lookup, saddr: &Self::Addr, daddr: &Self::Addr);
}

impl FibAddrs for V4 {
    #[inline(always)]
    fn fib_addrs(params: &mut bpf_fib_lookup, saddr: &u32, daddr: &u32) {
        params.__bindgen_anon_3.ipv4_src = *saddr;
        params.__bindgen_anon_4.ipv4_dst = *daddr;
    }
}

impl FibAddrs for V6 {
    #[inline(always)]
    fn fib_addrs(params: &mut bpf_fib_lookup, saddr: &[u8; 16], daddr: &[u8; 16]) {
        // SAFETY: both union members are plain 16-byte arrays of u32.
        unsafe {
            core::ptr::copy_nonoverlapping(
                saddr.as_ptr(),
                params.__bindgen_anon_3.ipv6_src.as_mut_ptr().cast(),
                16,
            );
            core::ptr::copy_nonoverlapping(
                daddr.as_ptr(),
                params.__bindgen_anon_4.ipv6_dst.as_mut_ptr().cast(),
                16,
            );
        }
    }
}
