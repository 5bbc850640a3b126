// SPDX-License-Identifier: Apache-2.0
//! Backends, keyed by a `u32` id the agent allocates (and reuses).

/// Backend flag: the endpoint is on this node.
pub const BACKEND_F_LOCAL: u8 = 1 << 0;
/// Backend flag: the endpoint is terminating (chosen only as a fallback by the model).
pub const BACKEND_F_TERMINATING: u8 = 1 << 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend4Value {
    pub addr: u32,
    pub port: u16,
    pub proto: u8,
    pub flags: u8,
}
const _: () = assert!(core::mem::size_of::<Backend4Value>() == 8);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend6Value {
    pub addr: [u8; 16],
    pub port: u16,
    pub proto: u8,
    pub flags: u8,
}
const _: () = assert!(core::mem::size_of::<Backend6Value>() == 20);
