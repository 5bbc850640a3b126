// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! What the north-south path needs from the context it runs in — tc (socket buffers) or XDP
//! (frames before the stack) — so that the translation logic is written once for both:
//! bounded loads and stores, and checksum fix-ups. How a translated packet leaves differs
//! more between the two: see [`super::forward`].

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_MARK_MANGLED_0, TC_ACT_OK, TC_ACT_SHOT, xdp_action},
    helpers::generated::{
        bpf_l3_csum_replace, bpf_l4_csum_replace, bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    programs::{TcContext, XdpContext},
};

/// Bounded packet access and checksum fix-ups, for tc and XDP alike.
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
