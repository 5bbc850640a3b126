// SPDX-License-Identifier: Apache-2.0
//! The eBPF object embedded at build time (see build.rs).

/// Bytes of the eBPF ELF object, 8-byte aligned as the ELF parser expects. Empty when the
/// build had no eBPF toolchain.
pub fn bytes() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf"))
}

/// Why ebpf mode cannot run with this build, if it cannot.
pub fn unavailable_reason() -> Option<&'static str> {
    let object = bytes();
    if object.is_empty() {
        Some("this build carries no eBPF object (built without bpf-linker or with AYA_BUILD_SKIP)")
    } else if !object.starts_with(b"\x7fELF") {
        Some("the embedded eBPF object is not an ELF file")
    } else {
        None
    }
}
