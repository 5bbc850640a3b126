// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! REJECT for traffic from outside, as upstream's REJECT rules answer: a TCP segment gets
//! a RST from the frontend (the client sees "connection refused" at once); UDP and SCTP get
//! an ICMP (ICMPv6) port unreachable quoting the packet, which a connected UDP socket
//! reports as ECONNREFUSED.
//!
//! The answer's headers are built in per-CPU scratch space (the BPF stack is small),
//! checksummed there, and written over the packet, resized to fit, which goes back out of
//! the device it came in by with the MAC addresses swapped.

use aya_ebpf::{
    EbpfContext as _,
    bindings::TC_ACT_SHOT,
    helpers::generated::{bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes},
    programs::TcContext,
};
use proxy_common::proto;

use super::{
    PacketFamily,
    parse::{ETH_HLEN, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};
use crate::{
    maps::{REPLY_SCRATCH, REPLY_SCRATCH_LEN},
    packet::Packet,
};

type Buf = [u8; REPLY_SCRATCH_LEN];

/// ICMP destination unreachable / port unreachable, and the ICMPv6 equivalents.
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PORT_UNREACH: u8 = 4;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
/// Bytes of the offending packet's payload an ICMP error quotes after its IP header.
const QUOTED_L4: usize = 8;

/// Ones'-complement sum of the 16-bit words of `buf[from..to]` (even bounds), added to `sum`.
#[inline(always)]
fn add_words(mut sum: u32, buf: &Buf, from: usize, to: usize) -> u32 {
    let mut i = from;
    // `get`, not indexing: a bounds check LLVM cannot prove would leave a panic call,
    // which the loader refuses.
    while i + 1 < to {
        let (Some(hi), Some(lo)) = (buf.get(i), buf.get(i + 1)) else {
            break;
        };
        sum += u32::from(u16::from_be_bytes([*hi, *lo]));
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
    let v6 = F::AF != 2;
    let l3_len = if v6 { 40 } else { 20 };
    if p.l4_off != p.l3_off + l3_len || p.later_fragment {
        return TC_ACT_SHOT; // IP options or extension headers: not worth answering
    }
    let args = Args {
        l3: p.l3_off,
        l4: p.l4_off,
        total: p.l3_len,
        flags: p.tcp_flags,
        v6,
    };
    let answered = match p.proto {
        proto::TCP if p.tcp_flags & TCP_RST == 0 => rst(ctx, &args),
        proto::UDP | proto::SCTP => port_unreachable(ctx, &args),
        _ => None,
    };
    answered.unwrap_or(TC_ACT_SHOT)
}

/// What an answer needs to know of the packet it answers (a BPF call takes at most five
/// arguments).
struct Args {
    l3: usize,
    l4: usize,
    total: u16,
    flags: u8,
    v6: bool,
}

/// The scratch buffer, zeroed, with the answer's IP header: from the packet's destination
/// to its source, carrying `l4_len` bytes of protocol `next`.
#[inline(always)]
fn ip_header(ctx: &TcContext, a: &Args, next: u8, l4_len: u16) -> Option<&'static mut Buf> {
    let buf = REPLY_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a per-CPU slot; networking programs do not preempt each other on one CPU.
    let buf = unsafe { &mut *buf };
    *buf = [0; REPLY_SCRATCH_LEN];
    if a.v6 {
        buf[0] = 0x60;
        buf[4..6].copy_from_slice(&l4_len.to_be_bytes());
        buf[6] = next;
        buf[7] = 64;
        let src: [u8; 16] = ctx.load(a.l3 + 24).ok()?;
        let dst: [u8; 16] = ctx.load(a.l3 + 8).ok()?;
        buf[8..24].copy_from_slice(&src);
        buf[24..40].copy_from_slice(&dst);
    } else {
        buf[0] = 0x45;
        buf[2..4].copy_from_slice(&(20 + l4_len).to_be_bytes());
        buf[6] = 0x40;
        buf[8] = 64;
        buf[9] = next;
        let src: [u8; 4] = ctx.load(a.l3 + 16).ok()?;
        let dst: [u8; 4] = ctx.load(a.l3 + 12).ok()?;
        buf[12..16].copy_from_slice(&src);
        buf[16..20].copy_from_slice(&dst);
        let c = fold(add_words(0, buf, 0, 20));
        buf[10] = c[0];
        buf[11] = c[1];
    }
    Some(buf)
}

/// Sum of the pseudo header of the answer in `buf` (addresses, protocol, length).
#[inline(always)]
fn pseudo_sum(buf: &Buf, v6: bool, next: u8, l4_len: u16) -> u32 {
    let (from, to) = if v6 { (8, 40) } else { (12, 20) };
    add_words(0, buf, from, to) + u32::from(next) + u32::from(l4_len)
}

#[inline(never)]
fn rst(ctx: &TcContext, a: &Args) -> Option<i32> {
    // RFC 793's reset: answer an ACK with its ack number as sequence, anything else with
    // ACK of everything the segment occupied.
    let doff: u8 = ctx.load(a.l4 + 12).ok()?;
    let hdr = if a.v6 { 40 } else { 20 };
    let payload = (a.total as u32).saturating_sub(hdr + ((doff >> 4) as u32) * 4);
    let seq = u32::from_be(ctx.load::<u32>(a.l4 + 4).ok()?);
    let ack = u32::from_be(ctx.load::<u32>(a.l4 + 8).ok()?);
    let (rseq, rack, rflags) = if a.flags & TCP_ACK != 0 {
        (ack, 0u32, TCP_RST)
    } else {
        let mut len = payload;
        if a.flags & TCP_SYN != 0 {
            len += 1;
        }
        if a.flags & TCP_FIN != 0 {
            len += 1;
        }
        (0u32, seq.wrapping_add(len), TCP_RST | TCP_ACK)
    };
    let sport: [u8; 2] = ctx.load(a.l4).ok()?;
    let dport: [u8; 2] = ctx.load(a.l4 + 2).ok()?;

    let buf = ip_header(ctx, a, proto::TCP, 20)?;
    let t = hdr as usize; // TCP header offset in the buffer
    buf[t] = dport[0];
    buf[t + 1] = dport[1];
    buf[t + 2] = sport[0];
    buf[t + 3] = sport[1];
    buf[t + 4..t + 8].copy_from_slice(&rseq.to_be_bytes());
    buf[t + 8..t + 12].copy_from_slice(&rack.to_be_bytes());
    buf[t + 12] = 5 << 4;
    buf[t + 13] = rflags;
    let c = fold(add_words(
        pseudo_sum(buf, a.v6, proto::TCP, 20),
        buf,
        t,
        t + 20,
    ));
    buf[t + 16] = c[0];
    buf[t + 17] = c[1];
    if a.v6 {
        emit::<60>(ctx, buf)
    } else {
        emit::<40>(ctx, buf)
    }
}

/// ICMP(v6) port unreachable quoting the packet's IP header and the first bytes after it.
#[inline(never)]
fn port_unreachable(ctx: &TcContext, a: &Args) -> Option<i32> {
    let hdr = if a.v6 { 40 } else { 20 };
    let quoted = hdr + QUOTED_L4;
    let l4_len = (8 + quoted) as u16;
    let next = if a.v6 { IPPROTO_ICMPV6 } else { IPPROTO_ICMP };
    let buf = ip_header(ctx, a, next, l4_len)?;
    // Constant offsets per family, so that every index is provably in bounds. The quote
    // goes straight from the packet into the buffer (the stack has no room for it).
    if a.v6 {
        buf[40] = ICMPV6_DEST_UNREACH;
        buf[41] = ICMPV6_PORT_UNREACH;
        load_into(ctx, a.l3, &mut buf[48..96])?;
    } else {
        buf[20] = ICMP_DEST_UNREACH;
        buf[21] = ICMP_PORT_UNREACH;
        load_into(ctx, a.l3, &mut buf[28..56])?;
    }
    let t = hdr;
    // ICMPv6 covers a pseudo header; ICMP only its own message.
    let start = if a.v6 {
        pseudo_sum(buf, true, next, l4_len)
    } else {
        0
    };
    let c = fold(add_words(start, buf, t, t + l4_len as usize));
    if a.v6 {
        buf[42] = c[0];
        buf[43] = c[1];
        emit::<96>(ctx, buf)
    } else {
        buf[22] = c[0];
        buf[23] = c[1];
        emit::<56>(ctx, buf)
    }
}

/// Copies `dst.len()` bytes of the packet at `off` into `dst` (all of them or nothing: the
/// length is a constant for the verifier).
#[inline(always)]
fn load_into(ctx: &TcContext, off: usize, dst: &mut [u8]) -> Option<()> {
    // SAFETY: the helper writes at most `dst.len()` bytes into `dst`.
    let rc = unsafe {
        bpf_skb_load_bytes(
            ctx.as_ptr().cast(),
            off as u32,
            dst.as_mut_ptr().cast(),
            dst.len() as u32,
        )
    };
    (rc == 0).then_some(())
}

/// Replaces the packet after its Ethernet header with the first `N` bytes of `buf` and
/// sends it back out of the device it came in by.
#[inline(always)]
fn emit<const N: usize>(ctx: &TcContext, buf: &Buf) -> Option<i32> {
    let len = (ETH_HLEN + N) as u32;
    // SAFETY: plain helper call on this program's socket buffer.
    if unsafe { bpf_skb_change_tail(ctx.as_ptr().cast(), len, 0) } != 0 {
        return None;
    }
    let mac_dst: [u8; 6] = ctx.load(0).ok()?;
    let mac_src: [u8; 6] = ctx.load(6).ok()?;
    ctx.store(0, &mac_src, 0).ok()?;
    ctx.store(6, &mac_dst, 0).ok()?;
    let out: &[u8; N] = buf[..N].try_into().ok()?;
    ctx.store(ETH_HLEN, out, 0).ok()?;
    // SAFETY: the context pointer is valid for the program's run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: plain helper call.
    Some(unsafe { bpf_redirect(ifindex, 0) } as i32)
}
