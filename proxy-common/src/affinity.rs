// SPDX-License-Identifier: Apache-2.0
//! sessionAffinity ClientIP. Socket programs do not know the client address at connect()
//! time, so they key by network-namespace cookie (one per pod, one for the host), as Cilium
//! does; tc keys by the client address.

pub const AFFINITY_CLIENT_NETNS: u8 = 0;
pub const AFFINITY_CLIENT_V4: u8 = 4;
pub const AFFINITY_CLIENT_V6: u8 = 6;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// Netns cookie (first 8 bytes, native order), or the client address.
    pub client: [u8; 16],
    pub rev_nat_id: u32,
    /// One of the `AFFINITY_CLIENT_*` kinds.
    pub kind: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 24);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityValue {
    pub backend_id: u32,
    /// Seconds of `bpf_ktime_get_coarse_ns` at the last use.
    pub last_used: u32,
}
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 8);
