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

/// Names of the sections of an ELF64 little-endian object (enough to check for BTF).
pub fn section_names(elf: &[u8]) -> Option<Vec<String>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    let shstrndx = usize::from(u16_at(0x3e)?);
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let strtab = section(shstrndx)?;
    let str_off = usize::try_from(u64_at(strtab + 0x18)?).ok()?;
    let mut names = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let name_off = usize::try_from(u32_at(section(i)?)?).ok()?;
        let start = str_off.checked_add(name_off)?;
        let rest = elf.get(start..)?;
        let end = rest.iter().position(|b| *b == 0)?;
        names.push(String::from_utf8_lossy(&rest[..end]).into_owned());
    }
    Some(names)
}

/// ELF machine number of BPF.
pub const EM_BPF: u16 = 247;

#[cfg(test)]
mod stack_budget;

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo xtask test` and CI build with PROXY_REQUIRE_EBPF=1: then the embedded object
    /// must be the real thing. Elsewhere an empty object is allowed (and reported).
    #[test]
    fn the_embedded_object_is_a_bpf_elf_with_btf() {
        let object = bytes();
        if object.is_empty() {
            assert_ne!(
                std::env::var("PROXY_REQUIRE_EBPF").as_deref(),
                Ok("1"),
                "the eBPF object is required but empty"
            );
            eprintln!("no eBPF object in this build (built without bpf-linker)");
            return;
        }
        assert_eq!(unavailable_reason(), None);
        assert_eq!(u16::from_le_bytes([object[18], object[19]]), EM_BPF);
        let names = section_names(object).expect("a well-formed ELF64");
        assert!(names.iter().any(|n| n == ".BTF"), "{names:?}");
        assert!(names.iter().any(|n| n == ".BTF.ext"), "{names:?}");
        assert!(names.iter().any(|n| n == ".maps"), "BTF maps: {names:?}");
        for program in [
            "cgroup/connect4",
            "cgroup/sendmsg6",
            "cgroup/recvmsg4",
            "cgroup/getpeername6",
        ] {
            assert!(
                names.iter().any(|n| n == program),
                "{program} missing: {names:?}"
            );
        }
    }
}
