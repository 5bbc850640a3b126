// SPDX-License-Identifier: Apache-2.0
//! Connection tracking for north-south flows translated by tc/XDP. A new flow stores its
//! backend and frontend; replies are rewritten from the entry.

/// CT entry flags.
pub const CT_F_SNAT: u8 = 1 << 0;
pub const CT_F_REPLY_SEEN: u8 = 1 << 1;
pub const CT_F_CLOSING: u8 = 1 << 2;

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
    pub rev_nat_id: u16,
    pub flags: u8,
    pub _pad: u8,
    /// Expiry, seconds of `bpf_ktime_get_coarse_ns`.
    pub expires: u32,
    /// Interface the reply must leave through (ifindex of the client side), 0 if unknown.
    pub ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<CtValue>() == 88);

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
