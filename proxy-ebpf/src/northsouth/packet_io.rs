// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! What the north-south path needs from the context it runs in — tc (socket buffers) or XDP
//! (frames before the stack) — so that the translation logic is written once for both:
//! bounded loads and stores, checksum fix-ups, and how a translated packet leaves.
//!
//! XDP is an accelerator in front of tc: whatever it does not handle completely it passes
//! up untouched (`plan` answers `None`), and the tc program on the same device, which
//! handles everything, sees the packet next. So XDP only ever takes the simple, common
//! cases: transmit back out of the device it came in by, or deliver a DNATed packet to
//! the stack when the stack can route it as it is.

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_F_MARK_MANGLED_0, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_NOT_FWDED,
        BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, TC_ACT_SHOT, xdp_action,
    },
    helpers::generated::{
        bpf_l3_csum_replace, bpf_l4_csum_replace, bpf_redirect_neigh, bpf_xdp_load_bytes,
        bpf_xdp_store_bytes,
    },
    programs::{TcContext, XdpContext},
};

use super::{
    PacketFamily, icmp,
    nat::AddrRewrite,
    reject,
    route::{self, FibAddrs, Next},
};
use crate::{maps::FIB_SCRATCH, packet::Packet};

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

pub trait PacketIo {
    /// The verdict that hands the packet on unchanged in meaning (tc: to the stack; XDP:
    /// to the stack, through tc).
    const PASS: i32;
    const DROP: i32;

    fn load<T>(&self, off: usize) -> Option<T>;
    fn store<T>(&self, off: usize, value: &T) -> bool;
    /// Replaces `old` with `new` (raw words of `size` 2 or 4 bytes) in the IPv4 header
    /// checksum at `csum_off`.
    fn l3_csum_replace(&self, csum_off: usize, old: u32, new: u32, size: u64) -> bool;
    /// As `bpf_l4_csum_replace`: `flags` holds the size (2 or 4, or 0 when `new` is a
    /// `bpf_csum_diff` result), `BPF_F_PSEUDO_HDR` and `BPF_F_MARK_MANGLED_0`.
    fn l4_csum_replace(&self, csum_off: usize, old: u32, new: u32, flags: u64) -> bool;
    /// The device the packet arrived on.
    fn ifindex(&self) -> u32;
    fn raw(&self) -> *mut c_void;
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
    /// Answers a packet for a frontend without endpoints (upstream's REJECT).
    fn reject<F: PacketFamily>(&self, p: &Packet<F::Addr>) -> i32;
    /// Handles an ICMP(v6) packet: errors about tracked flows are translated.
    fn icmp<F: AddrRewrite>(&self, p: &Packet<F::Addr>) -> i32;
}

impl PacketIo for TcContext {
    const PASS: i32 = TC_ACT_OK;
    const DROP: i32 = TC_ACT_SHOT;

    #[inline(always)]
    fn load<T>(&self, off: usize) -> Option<T> {
        TcContext::load(self, off).ok()
    }
    #[inline(always)]
    fn store<T>(&self, off: usize, value: &T) -> bool {
        TcContext::store(self, off, value, 0).is_ok()
    }
    #[inline(always)]
    fn l3_csum_replace(&self, csum_off: usize, old: u32, new: u32, size: u64) -> bool {
        // SAFETY: the helper bounds-checks the offset against the socket buffer.
        unsafe {
            bpf_l3_csum_replace(
                self.as_ptr().cast(),
                csum_off as u32,
                old as u64,
                new as u64,
                size,
            ) == 0
        }
    }
    #[inline(always)]
    fn l4_csum_replace(&self, csum_off: usize, old: u32, new: u32, flags: u64) -> bool {
        // SAFETY: as above; the kernel also handles CHECKSUM_PARTIAL buffers correctly.
        unsafe {
            bpf_l4_csum_replace(
                self.as_ptr().cast(),
                csum_off as u32,
                old as u64,
                new as u64,
                flags,
            ) == 0
        }
    }
    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the context pointer is valid for the program's run.
        unsafe { (*self.skb.skb).ifindex }
    }
    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.as_ptr()
    }
    #[inline(always)]
    fn plan<F: FibAddrs>(
        &self,
        p: &Packet<F::Addr>,
        next: &Next<F::Addr>,
        _stack_ok: bool,
    ) -> Option<Plan> {
        // tc handles everything: when the FIB cannot tell, the stack decides.
        let rc = route::lookup::<Self, F>(self, p, next);
        Some(
            if rc == BPF_FIB_LKUP_RET_SUCCESS as i64 || rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
                Plan::redirect(route::out_ifindex())
            } else {
                Plan::STACK
            },
        )
    }
    #[inline(always)]
    fn send(&self, plan: Plan) -> i32 {
        if plan == Plan::STACK || plan == Plan::TRANSMIT {
            return TC_ACT_OK;
        }
        // SAFETY: a plain helper call; no neighbour parameters (the kernel resolves).
        unsafe { bpf_redirect_neigh(plan.0, core::ptr::null_mut(), 0, 0) as i32 }
    }
    #[inline(always)]
    fn reject<F: PacketFamily>(&self, p: &Packet<F::Addr>) -> i32 {
        reject::reject::<F>(self, p)
    }
    #[inline(always)]
    fn icmp<F: AddrRewrite>(&self, p: &Packet<F::Addr>) -> i32 {
        icmp::handle::<F>(self, p)
    }
}

impl PacketIo for XdpContext {
    const PASS: i32 = xdp_action::XDP_PASS as i32;
    const DROP: i32 = xdp_action::XDP_DROP as i32;

    #[inline(always)]
    fn load<T>(&self, off: usize) -> Option<T> {
        let mut out = MaybeUninit::<T>::uninit();
        // SAFETY: the helper writes exactly size_of::<T>() bytes or fails.
        let rc = unsafe {
            bpf_xdp_load_bytes(
                self.ctx,
                off as u32,
                out.as_mut_ptr().cast(),
                core::mem::size_of::<T>() as u32,
            )
        };
        // SAFETY: initialised by the successful helper call.
        (rc == 0).then(|| unsafe { out.assume_init() })
    }
    #[inline(always)]
    fn store<T>(&self, off: usize, value: &T) -> bool {
        // SAFETY: the helper bounds-checks the offset against the frame.
        unsafe {
            bpf_xdp_store_bytes(
                self.ctx,
                off as u32,
                (value as *const T).cast_mut().cast(),
                core::mem::size_of::<T>() as u32,
            ) == 0
        }
    }
    #[inline(always)]
    fn l3_csum_replace(&self, csum_off: usize, old: u32, new: u32, size: u64) -> bool {
        let Some(csum) = self.load::<u16>(csum_off) else {
            return false;
        };
        self.store(csum_off, &csum_replace(csum, old, new, size))
    }
    #[inline(always)]
    fn l4_csum_replace(&self, csum_off: usize, old: u32, new: u32, flags: u64) -> bool {
        let Some(csum) = self.load::<u16>(csum_off) else {
            return false;
        };
        // A frame before the stack always carries a complete checksum; for UDP over IPv4,
        // zero means "none" and stays so.
        let mangled_0 = flags & BPF_F_MARK_MANGLED_0 as u64 != 0;
        if mangled_0 && csum == 0 {
            return true;
        }
        let mut out = csum_replace(csum, old, new, flags & 0xf);
        if mangled_0 && out == 0 {
            out = 0xffff;
        }
        // BPF_F_PSEUDO_HDR needs no special case: in a complete checksum an address of
        // the pseudo header is summed like any other word.
        self.store(csum_off, &out)
    }
    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the context pointer is valid for the program's run.
        unsafe { (*self.ctx).ingress_ifindex }
    }
    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.as_ptr()
    }
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
    fn reject<F: PacketFamily>(&self, _p: &Packet<F::Addr>) -> i32 {
        // tc, next on the same device, answers it.
        Self::PASS
    }
    #[inline(always)]
    fn icmp<F: AddrRewrite>(&self, _p: &Packet<F::Addr>) -> i32 {
        // Rare and intricate: tc handles it.
        Self::PASS
    }
}

/// Folds a ones'-complement sum to 16 bits.
#[inline(always)]
fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// RFC 1624 incremental update of the checksum `csum` (raw, as stored) for `old` → `new`
/// (raw words of `size` 2 or 4 bytes; size 0: `new` is a 32-bit sum difference). The
/// words are summed in the same byte order as the checksum, so no swapping is needed.
#[inline(always)]
fn csum_replace(csum: u16, old: u32, new: u32, size: u64) -> u16 {
    let mut sum = u64::from(!csum);
    match size {
        0 => sum += u64::from(new),
        2 => sum += u64::from(!(old as u16)) + u64::from(new as u16),
        _ => {
            let old = !old;
            sum += u64::from(old & 0xffff) + u64::from(old >> 16);
            sum += u64::from(new & 0xffff) + u64::from(new >> 16);
        }
    }
    !fold(sum)
}
