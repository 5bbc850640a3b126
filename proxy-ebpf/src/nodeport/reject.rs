// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! REJECT for traffic from outside: a TCP SYN is answered with a RST from the frontend
//! (the client sees "connection refused" at once, as with upstream's REJECT). Other
//! protocols are dropped for now (an ICMP port-unreachable is not generated).
//!
//! The new headers are built in per-CPU scratch space (the BPF stack is small), checksummed
//! there, and written over the trimmed packet, which goes back out of the device it came
//! in by with the MAC addresses swapped.

use aya_ebpf::{
    EbpfContext as _,
    bindings::TC_ACT_SHOT,
    helpers::generated::{bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use proxy_common::proto;

use super::{
    PacketFamily,
    parse::{ETH_HLEN, Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};
use crate::maps::RST_SCRATCH;

/// Ones'-complement sum of the 16-bit words of `buf[from..to]` (even bounds), added to `sum`.
#[inline(always)]
fn add_words(mut sum: u32, buf: &[u8; 64], from: usize, to: usize) -> u32 {
    let mut i = from;
    while i + 1 < to && i + 1 < 64 {
        sum += u32::from(u16::from_be_bytes([buf[i], buf[i + 1]]));
        i += 2;
    }
    sum
}

#[inline(always)]
fn fold(mut sum: u32) -> [u8; 2] {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}

#[inline(never)]
pub fn reject<F: PacketFamily>(ctx: &TcContext, p: &Packet<F::Addr>) -> i32 {
    if p.proto != proto::TCP || p.tcp_flags & TCP_RST != 0 {
        return TC_ACT_SHOT;
    }
    let v6 = F::AF != 2;
    let l3_len = if v6 { 40 } else { 20 };
    if p.l4_off != p.l3_off + l3_len {
        return TC_ACT_SHOT; // IP options or extension headers: not worth answering
    }
    let args = RstArgs {
        l3: p.l3_off,
        l4: p.l4_off,
        total: p.l3_len,
        flags: p.tcp_flags,
        v6,
    };
    rst(ctx, &args).unwrap_or(TC_ACT_SHOT)
}

/// What the RST needs to know of the segment it answers (a BPF call takes at most five
/// arguments).
struct RstArgs {
    l3: usize,
    l4: usize,
    total: u16,
    flags: u8,
    v6: bool,
}

#[inline(never)]
fn rst(ctx: &TcContext, a: &RstArgs) -> Option<i32> {
    let (l3, l4, total, flags, v6) = (a.l3, a.l4, a.total, a.flags, a.v6);
    let buf = RST_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a per-CPU slot; tc programs do not preempt each other on one CPU.
    let buf = unsafe { &mut *buf };
    *buf = [0; 64];

    // RFC 793's reset: answer an ACK with its ack number as sequence, anything else with
    // ACK of everything the segment occupied.
    let doff: u8 = ctx.load(l4 + 12).ok()?;
    let hdr = if v6 { 40 } else { 20 };
    let payload = (total as u32).saturating_sub(hdr + ((doff >> 4) as u32) * 4);
    let seq = u32::from_be(ctx.load::<u32>(l4 + 4).ok()?);
    let ack = u32::from_be(ctx.load::<u32>(l4 + 8).ok()?);
    let (rseq, rack, rflags) = if flags & TCP_ACK != 0 {
        (ack, 0u32, TCP_RST)
    } else {
        let mut len = payload;
        if flags & TCP_SYN != 0 {
            len += 1;
        }
        if flags & TCP_FIN != 0 {
            len += 1;
        }
        (0u32, seq.wrapping_add(len), TCP_RST | TCP_ACK)
    };
    let sport: [u8; 2] = ctx.load(l4).ok()?;
    let dport: [u8; 2] = ctx.load(l4 + 2).ok()?;

    let t = hdr as usize; // TCP header offset in the buffer
    if v6 {
        buf[0] = 0x60;
        buf[5] = 20;
        buf[6] = proto::TCP;
        buf[7] = 64;
        // Swapped addresses: our source is the packet's destination.
        let src: [u8; 16] = ctx.load(l3 + 24).ok()?;
        let dst: [u8; 16] = ctx.load(l3 + 8).ok()?;
        buf[8..24].copy_from_slice(&src);
        buf[24..40].copy_from_slice(&dst);
    } else {
        buf[0] = 0x45;
        buf[3] = 40;
        buf[6] = 0x40;
        buf[8] = 64;
        buf[9] = proto::TCP;
        let src: [u8; 4] = ctx.load(l3 + 16).ok()?;
        let dst: [u8; 4] = ctx.load(l3 + 12).ok()?;
        buf[12..16].copy_from_slice(&src);
        buf[16..20].copy_from_slice(&dst);
        let c = fold(add_words(0, buf, 0, 20));
        buf[10] = c[0];
        buf[11] = c[1];
    }
    buf[t] = dport[0];
    buf[t + 1] = dport[1];
    buf[t + 2] = sport[0];
    buf[t + 3] = sport[1];
    buf[t + 4..t + 8].copy_from_slice(&rseq.to_be_bytes());
    buf[t + 8..t + 12].copy_from_slice(&rack.to_be_bytes());
    buf[t + 12] = 5 << 4;
    buf[t + 13] = rflags;
    // Pseudo header: the addresses, the protocol and the TCP length.
    let (addr_from, addr_to) = if v6 { (8, 40) } else { (12, 20) };
    let mut sum = add_words(0, buf, addr_from, addr_to);
    sum += u32::from(proto::TCP) + 20;
    let c = fold(add_words(sum, buf, t, t + 20));
    buf[t + 16] = c[0];
    buf[t + 17] = c[1];

    let len = (ETH_HLEN + t + 20) as u32;
    if unsafe { bpf_skb_change_tail(ctx.as_ptr().cast(), len, 0) } != 0 {
        return None;
    }
    let mac_dst: [u8; 6] = ctx.load(0).ok()?;
    let mac_src: [u8; 6] = ctx.load(6).ok()?;
    ctx.store(0, &mac_src, 0).ok()?;
    ctx.store(6, &mac_dst, 0).ok()?;
    if v6 {
        let out: &[u8; 60] = buf[..60].try_into().ok()?;
        ctx.store(ETH_HLEN, out, 0).ok()?;
    } else {
        let out: &[u8; 40] = buf[..40].try_into().ok()?;
        ctx.store(ETH_HLEN, out, 0).ok()?;
    }
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    Some(unsafe { bpf_redirect(ifindex, 0) } as i32)
}
