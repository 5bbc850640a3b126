// SPDX-License-Identifier: Apache-2.0
//! Connection tracking for north-south flows translated by tc/XDP. A new flow stores its
//! backend and frontend; replies are rewritten from the entry.

/// CT entry flags.
pub const CT_F_SNAT: u8 = 1 << 0;
pub const CT_F_REPLY_SEEN: u8 = 1 << 1;
pub const CT_F_CLOSING: u8 = 1 << 2;
/// A reply entry that is no flow of the programs: the answer tuple of a connection
/// netfilter's conntrack translates (the netfilter mode the node ran before started it),
/// written by the agent for as long as that entry lives. Its answers are left to the stack,
/// where netfilter translates them, and it keeps the SNAT port of that answer from being
/// given to a new flow to the same backend, which would take over its packets. Its fields
/// describe no translation (frontend = backend), so a program that does not know the flag
/// rewrites nothing.
pub const CT_F_NETFILTER: u8 = 1 << 3;

/// Direction of the key.
pub const CT_DIR_FORWARD: u8 = 0;
pub const CT_DIR_REPLY: u8 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ct4Key {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<Ct4Key>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ct6Key {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<Ct6Key>() == 40);

/// The translation a flow received. Addresses are 16 bytes so one value type serves both
/// families (IPv4 uses the first four bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtValue {
    /// Original destination (the frontend) and the address/port it was translated to.
    pub frontend_addr: [u8; 16],
    pub backend_addr: [u8; 16],
    /// Source address after SNAT (the node), when `CT_F_SNAT`.
    pub snat_addr: [u8; 16],
    /// Original client address (reply direction restores it).
    pub client_addr: [u8; 16],
    pub frontend_port: u16,
    pub backend_port: u16,
    pub snat_port: u16,
    pub client_port: u16,
    pub backend_id: u32,
    /// Low 16 bits of the frontend's reverse-NAT id (see [`CtValue::rev_nat_id`]).
    pub rev_nat_lo: u16,
    pub flags: u8,
    /// Bits 16..24 of the reverse-NAT id. Layout 1 had a 16-bit id and a zero padding byte
    /// here, so entries written by an earlier agent read as the same id and this map keeps
    /// its name across the widening: north-south flows survive that upgrade.
    pub rev_nat_hi: u8,
    /// Expiry, seconds of `bpf_ktime_get_coarse_ns`.
    pub expires: u32,
    /// Interface the reply must leave through (ifindex of the client side), 0 if unknown.
    pub ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<CtValue>() == 88);
// Where layout 1 had its 16-bit id, its flags and its zero padding byte.
const _: () = assert!(core::mem::offset_of!(CtValue, rev_nat_lo) == 76);
const _: () = assert!(core::mem::offset_of!(CtValue, flags) == 78);
const _: () = assert!(core::mem::offset_of!(CtValue, rev_nat_hi) == 79);

impl CtValue {
    /// The frontend's reverse-NAT id (24 bits: [`crate::MAX_REV_NAT_ID`]). Only the agent's
    /// inspection reads it; the programs rewrite replies from the addresses above.
    #[inline(always)]
    pub fn rev_nat_id(&self) -> u32 {
        u32::from(self.rev_nat_lo) | (u32::from(self.rev_nat_hi) << 16)
    }

    /// Stores `id`; bits above [`crate::MAX_REV_NAT_ID`] are dropped (the agent never hands
    /// out such ids).
    #[inline(always)]
    pub fn set_rev_nat_id(&mut self, id: u32) {
        self.rev_nat_lo = id as u16;
        self.rev_nat_hi = (id >> 16) as u8;
    }
}

/// A fragmented datagram, as its fragments arrive at one hook: later fragments carry no
/// L4 header, so the ports its first fragment carried are kept under this key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frag4Key {
    pub saddr: u32,
    pub daddr: u32,
    /// The IP identification (network order, widened).
    pub id: u32,
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<Frag4Key>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frag6Key {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// The fragment header's identification (network order).
    pub id: u32,
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<Frag6Key>() == 40);

/// The ports of a fragmented datagram (network order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragPorts {
    pub sport: u16,
    pub dport: u16,
}
const _: () = assert!(core::mem::size_of::<FragPorts>() == 4);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_of_layout_1_reads_as_the_same_id_and_wide_ids_round_trip() {
        // Layout 1 wrote its 16-bit id where `rev_nat_lo` is (the offsets are asserted
        // above) and zero where `rev_nat_hi` is.
        let mut v = CtValue {
            rev_nat_lo: 40_000,
            flags: CT_F_SNAT,
            rev_nat_hi: 0,
            ..CtValue::default()
        };
        assert_eq!(v.rev_nat_id(), 40_000);
        assert_eq!(v.flags, CT_F_SNAT);
        for id in [1, 65_535, 65_536, 100_000, crate::MAX_REV_NAT_ID] {
            v.set_rev_nat_id(id);
            assert_eq!(v.rev_nat_id(), id);
            assert_eq!(v.flags, CT_F_SNAT, "the flags are untouched");
        }
    }
}
