// SPDX-License-Identifier: Apache-2.0
//! What the running kernel offers the ebpf mode, asked once where it decides how to
//! attach. See docs/kernel-requirements.md for the versions.

use aya::util::KernelVersion;

/// The running kernel's version, `None` when it cannot be read.
pub fn version() -> Option<KernelVersion> {
    KernelVersion::current().ok()
}

/// Whether tc programs attach as TCX links (6.6+), by the same rule aya's
/// `SchedClassifier::attach` follows; otherwise they are netlink filters.
pub fn has_tcx() -> bool {
    version().is_some_and(|v| v >= KernelVersion::new(6, 6, 0))
}

/// Whether XDP programs attach as bpf_links (5.9+), which the pins hold; aya attaches
/// through netlink otherwise, and such a program outlives the pins.
pub fn has_xdp_links() -> bool {
    version().is_some_and(|v| v >= KernelVersion::new(5, 9, 0))
}
