// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Rebuild the eBPF object when bpf-linker changes (it is not a cargo dependency).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
