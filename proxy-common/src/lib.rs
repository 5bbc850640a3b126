// SPDX-License-Identifier: Apache-2.0
//! Keys and values of the BPF maps, shared by the eBPF programs (`no_std`) and the agent.
//!
//! Layout rules (after Cilium's `bpf/lib/lb.h`): every struct is `#[repr(C)]`, every hole is an
//! explicit `_pad` field that writers zero, and every size is asserted at compile time, because
//! the kernel compares keys byte by byte and both sides must agree on the layout. Addresses and
//! ports are kept in network byte order, exactly as they sit in packets and socket addresses.
//! A layout change bumps the version suffix of the map names in [`maps`].
#![no_std]
#![deny(unsafe_code)]

pub mod affinity;
pub mod backend;
pub mod config;
pub mod crc32c;
pub mod ct;
pub mod maglev;
pub mod maps;
pub mod revnat;
pub mod service;

pub use affinity::*;
pub use backend::*;
pub use config::*;
pub use ct::*;
pub use revnat::*;
pub use service::*;

/// IANA protocol numbers used in keys.
pub mod proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const SCTP: u8 = 132;
}

/// Implements `aya::Pod` for the userspace side. Sound because every listed type is
/// `#[repr(C)]`, `Copy`, made only of integers and has no implicit padding (checked by the
/// size assertions next to each type).
#[cfg(feature = "user")]
macro_rules! impl_pod {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: as the macro's doc says: `#[repr(C)]`, `Copy`, integers only, no
            // padding.
            #[allow(unsafe_code)]
            unsafe impl aya::Pod for $t {}
        )*
    };
}

#[cfg(feature = "user")]
impl_pod!(
    Svc4Key,
    Svc6Key,
    SvcValue,
    SvcValueV1,
    Backend4Value,
    Backend6Value,
    RevNat4Value,
    RevNat6Value,
    SockRevNat4Key,
    SockRevNat4Value,
    SockRevNat6Key,
    SockRevNat6Value,
    SockFrontend,
    AffinityKey,
    AffinityValue,
    Ct4Key,
    Ct6Key,
    CtValue,
    Frag4Key,
    Frag6Key,
    FragPorts,
    NodeAddr4Key,
    NodeAddr6Key,
    LbConfig,
    SourceRange4,
    SourceRange6,
);
