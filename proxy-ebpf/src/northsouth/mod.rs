// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! North-south load balancing with BPF conntrack: tc programs on the node's devices, and
//! the same translation in XDP on the uplinks as an accelerator (see [`forward`]).
//!
//! - uplink ingress (XDP, then tc): new flows to a NodePort / externalIP / LB IP from outside are
//!   translated (backend chosen, DNAT, SNAT to the node for eTP=Cluster), recorded in CT,
//!   and redirected straight to the backend's device; replies from remote backends to the
//!   node's SNAT address are translated back.
//! - pod ingress (every other device of the node): replies of local backends are
//!   translated back and redirected to the client.
//! - uplink egress: the same reply translation as a safety net, and the drops the socket
//!   programs leave to tc.
//!
//! tc fails closed: what upstream DROPs is dropped here.

pub mod ct;
pub mod egress;
pub mod forward;
pub mod icmp;
pub mod ingress;
pub mod nat;
pub mod packet_io;
pub mod parse;
pub mod pod;
pub mod reject;
pub mod reply;
pub mod route;

use proxy_common::{Ct4Key, Ct6Key, CtValue, Frag4Key, Frag6Key, FragPorts};

use crate::{
    lb::{Family, V4, V6},
    maps::{CT4_V1, CT6_V1, FRAG4_V1, FRAG6_V1, PKT4_SCRATCH, PKT6_SCRATCH},
    packet::Packet,
};
use packet_io::PacketIo;

/// The packet-level side of an address family.
pub trait PacketFamily: Family {
    type CtKey: Copy;
    const AF: u8;

    fn parse<C: PacketIo>(ctx: &C) -> Option<Packet<Self::Addr>>;
    /// Parses an IP header of this family at `l3` (e.g. the one an ICMP error quotes).
    fn parse_at<C: PacketIo>(ctx: &C, l3: usize) -> Option<Packet<Self::Addr>>;
    /// The per-CPU slot parsed packets of this family live in.
    /// Slot 0: the packet; slot 1: the packet an ICMP error quotes.
    fn packet_slot(slot: u32) -> Option<*mut Packet<Self::Addr>>;
    fn ct_key(
        s: Self::Addr,
        d: Self::Addr,
        sport: u16,
        dport: u16,
        proto: u8,
        dir: u8,
    ) -> Self::CtKey;
    fn ct_get(key: &Self::CtKey) -> Option<*mut CtValue>;
    fn ct_put(key: &Self::CtKey, value: &CtValue) -> bool;
    fn ct_del(key: &Self::CtKey);
    /// The ports the first fragment of `p`'s datagram carried.
    fn frag_get(p: &Packet<Self::Addr>) -> Option<FragPorts>;
    fn frag_put(p: &Packet<Self::Addr>);
    /// Offsets of the source and destination address in the L3 header.
    const SADDR_OFF: usize;
    const DADDR_OFF: usize;
}

impl PacketFamily for V4 {
    type CtKey = Ct4Key;
    const AF: u8 = 2;
    const SADDR_OFF: usize = 12;
    const DADDR_OFF: usize = 16;

    #[inline(always)]
    fn parse<C: PacketIo>(ctx: &C) -> Option<Packet<u32>> {
        parse::ipv4(ctx)
    }
    #[inline(always)]
    fn parse_at<C: PacketIo>(ctx: &C, l3: usize) -> Option<Packet<u32>> {
        parse::ipv4_at(ctx, l3)
    }
    #[inline(always)]
    fn packet_slot(slot: u32) -> Option<*mut Packet<u32>> {
        PKT4_SCRATCH.get_ptr_mut(slot)
    }
    #[inline(always)]
    fn ct_key(s: u32, d: u32, sport: u16, dport: u16, proto: u8, dir: u8) -> Ct4Key {
        Ct4Key {
            saddr: s,
            daddr: d,
            sport,
            dport,
            proto,
            dir,
            _pad: [0; 2],
        }
    }
    #[inline(always)]
    fn ct_get(key: &Ct4Key) -> Option<*mut CtValue> {
        CT4_V1.get_ptr_mut(key)
    }
    #[inline(always)]
    fn ct_put(key: &Ct4Key, value: &CtValue) -> bool {
        CT4_V1.insert(key, value, 0).is_ok()
    }
    #[inline(always)]
    fn ct_del(key: &Ct4Key) {
        let _ = CT4_V1.remove(key);
    }
    #[inline(always)]
    fn frag_get(p: &Packet<u32>) -> Option<FragPorts> {
        // SAFETY: the value is copied out at once.
        unsafe { FRAG4_V1.get(frag4_key(p)).copied() }
    }
    #[inline(always)]
    fn frag_put(p: &Packet<u32>) {
        let ports = FragPorts {
            sport: p.sport,
            dport: p.dport,
        };
        let _ = FRAG4_V1.insert(frag4_key(p), ports, 0);
    }
}

impl PacketFamily for V6 {
    type CtKey = Ct6Key;
    const AF: u8 = 10;
    const SADDR_OFF: usize = 8;
    const DADDR_OFF: usize = 24;

    #[inline(always)]
    fn parse<C: PacketIo>(ctx: &C) -> Option<Packet<[u8; 16]>> {
        parse::ipv6(ctx)
    }
    #[inline(always)]
    fn parse_at<C: PacketIo>(ctx: &C, l3: usize) -> Option<Packet<[u8; 16]>> {
        parse::ipv6_at(ctx, l3)
    }
    #[inline(always)]
    fn packet_slot(slot: u32) -> Option<*mut Packet<[u8; 16]>> {
        PKT6_SCRATCH.get_ptr_mut(slot)
    }
    #[inline(always)]
    fn ct_key(s: [u8; 16], d: [u8; 16], sport: u16, dport: u16, proto: u8, dir: u8) -> Ct6Key {
        Ct6Key {
            saddr: s,
            daddr: d,
            sport,
            dport,
            proto,
            dir,
            _pad: [0; 2],
        }
    }
    #[inline(always)]
    fn ct_get(key: &Ct6Key) -> Option<*mut CtValue> {
        CT6_V1.get_ptr_mut(key)
    }
    #[inline(always)]
    fn ct_put(key: &Ct6Key, value: &CtValue) -> bool {
        CT6_V1.insert(key, value, 0).is_ok()
    }
    #[inline(always)]
    fn ct_del(key: &Ct6Key) {
        let _ = CT6_V1.remove(key);
    }
    #[inline(always)]
    fn frag_get(p: &Packet<[u8; 16]>) -> Option<FragPorts> {
        // SAFETY: the value is copied out at once.
        unsafe { FRAG6_V1.get(frag6_key(p)).copied() }
    }
    #[inline(always)]
    fn frag_put(p: &Packet<[u8; 16]>) {
        let ports = FragPorts {
            sport: p.sport,
            dport: p.dport,
        };
        let _ = FRAG6_V1.insert(frag6_key(p), ports, 0);
    }
}

#[inline(always)]
fn frag4_key(p: &Packet<u32>) -> Frag4Key {
    Frag4Key {
        saddr: p.saddr,
        daddr: p.daddr,
        id: p.frag_id,
        proto: p.proto,
        _pad: [0; 3],
    }
}

#[inline(always)]
fn frag6_key(p: &Packet<[u8; 16]>) -> Frag6Key {
    Frag6Key {
        saddr: p.saddr,
        daddr: p.daddr,
        id: p.frag_id,
        proto: p.proto,
        _pad: [0; 3],
    }
}

/// Fragments: the first one's ports are remembered, and a later one takes them, so that
/// it is translated like the rest of its flow (`later_fragment` still says it has no L4
/// header to rewrite). False for a later fragment whose first was not seen.
#[inline(always)]
fn recover_ports<F: PacketFamily>(p: &mut Packet<F::Addr>) -> bool {
    if !p.fragment || !parse::has_ports(p.proto) {
        return true;
    }
    if !p.later_fragment {
        F::frag_put(p);
        return true;
    }
    match F::frag_get(p) {
        Some(ports) => {
            p.sport = ports.sport;
            p.dport = ports.dport;
            true
        }
        None => false,
    }
}

/// Parses the packet into the family's per-CPU slot (its own frame, released on return).
/// A later fragment whose ports are not known is not parsed (`None`).
#[inline(never)]
pub fn parse_into<C: PacketIo, F: PacketFamily>(ctx: &C) -> Option<&'static Packet<F::Addr>> {
    let slot = F::packet_slot(0)?;
    let p = F::parse(ctx)?;
    // SAFETY: a per-CPU slot; networking programs do not preempt each other on one CPU.
    let p = unsafe {
        *slot = p;
        &mut *slot
    };
    recover_ports::<F>(p).then_some(&*p)
}

/// Parses the packet an ICMP error at `l4` quotes into the family's second per-CPU slot.
#[inline(never)]
pub fn parse_quote_into<F: PacketFamily>(
    ctx: &aya_ebpf::programs::TcContext,
    l4: usize,
) -> Option<&'static mut Packet<F::Addr>> {
    let slot = F::packet_slot(1)?;
    let q = F::parse_at(ctx, l4 + 8)?;
    // SAFETY: a per-CPU slot; networking programs do not preempt each other on one CPU.
    unsafe {
        *slot = q;
        Some(&mut *slot)
    }
}
