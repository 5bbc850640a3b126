// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Sending a translated packet on: a FIB lookup for its new destination and a redirect to
//! that device with the neighbour filled in. Bypassing the stack matters after SNAT to a
//! node address: a forwarded packet whose source is local would be dropped as martian.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, bpf_fib_lookup},
    helpers::generated::{bpf_fib_lookup as fib_lookup, bpf_redirect_neigh},
    programs::TcContext,
};

use super::TcFamily;
use crate::{
    lb::{V4, V6},
    maps::FIB_SCRATCH,
    parse::Packet,
};

/// Where a rewritten packet goes: its new addresses and ports.
#[derive(Clone, Copy)]
pub struct Next<A> {
    pub saddr: A,
    pub daddr: A,
    pub sport: u16,
    pub dport: u16,
}

/// Redirects to the device the route to `next.daddr` leaves by; TC_ACT_OK (the stack
/// decides) when the lookup cannot tell.
#[inline(never)]
pub fn redirect<F: FibAddrs>(ctx: &TcContext, p: &Packet<F::Addr>, next: &Next<F::Addr>) -> i32 {
    let Some(params) = FIB_SCRATCH.get_ptr_mut(0) else {
        return TC_ACT_OK;
    };
    // SAFETY: a per-CPU slot; tc programs do not preempt each other on one CPU.
    let params = unsafe { &mut *params };
    // SAFETY: the struct is plain data; all-zero is its neutral value.
    *params = unsafe { core::mem::zeroed() };
    params.family = F::AF;
    params.l4_protocol = p.proto;
    params.sport = next.sport;
    params.dport = next.dport;
    params.__bindgen_anon_1.tot_len = p.l3_len;
    params.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    F::fib_addrs(params, &next.saddr, &next.daddr);
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            params,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    if rc == BPF_FIB_LKUP_RET_SUCCESS as i64 || rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
        return unsafe { bpf_redirect_neigh(params.ifindex, core::ptr::null_mut(), 0, 0) } as i32;
    }
    TC_ACT_OK
}

/// Writes a family's addresses into the FIB lookup parameters.
pub trait FibAddrs: TcFamily {
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
