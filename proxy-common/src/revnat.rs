// SPDX-License-Identifier: Apache-2.0
//! Reverse NAT: from a rev_nat_id back to the frontend, and per-socket entries that let
//! recvmsg and getpeername show the frontend instead of the backend.

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNat4Value {
    pub addr: u32,
    pub port: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<RevNat4Value>() == 8);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNat6Value {
    pub addr: [u8; 16],
    pub port: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<RevNat6Value>() == 20);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevNat4Key {
    pub cookie: u64,
    /// The backend the socket was sent to.
    pub addr: u32,
    pub port: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<SockRevNat4Key>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevNat4Value {
    /// The frontend the application asked for.
    pub addr: u32,
    pub port: u16,
    pub _pad: u16,
    /// Checked against [`RevNat4Value`] before restoring, so a reused id never leaks an
    /// unrelated frontend.
    pub rev_nat_id: u32,
}
const _: () = assert!(core::mem::size_of::<SockRevNat4Value>() == 12);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevNat6Key {
    pub cookie: u64,
    pub addr: [u8; 16],
    pub port: u16,
    pub _pad: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<SockRevNat6Key>() == 32);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevNat6Value {
    pub addr: [u8; 16],
    pub port: u16,
    pub _pad: u16,
    pub rev_nat_id: u32,
}
const _: () = assert!(core::mem::size_of::<SockRevNat6Value>() == 24);

/// Per-socket record of a connected socket's translation (socket-local storage: it lives
/// and dies with the socket, so nothing fills up or needs collecting).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockFrontend {
    /// The frontend the application asked for (IPv4 in the first four bytes).
    pub frontend_addr: [u8; 16],
    /// The backend the socket was connected to.
    pub backend_addr: [u8; 16],
    pub frontend_port: u16,
    pub backend_port: u16,
    /// 32 bits where layout 1 had a 16-bit id and 16 bits of zero padding: on little-endian
    /// machines the same bytes read as the same id, so sockets connected under an earlier
    /// agent keep their record (the storage lives with the socket and cannot be migrated).
    pub rev_nat_id: u32,
}
const _: () = assert!(core::mem::size_of::<SockFrontend>() == 40);
// Where layout 1 had its 16-bit id followed by 16 bits of zero padding.
const _: () = assert!(core::mem::offset_of!(SockFrontend, rev_nat_id) == 36);
