// SPDX-License-Identifier: Apache-2.0
//! What the guest boots: Debian's `linux-image-amd64` kernel from /boot (it ships IPVS as
//! modules) and a tiny initramfs of busybox-static, the 9p/virtio/overlay modules and
//! `init.sh`, built once per kernel release (and init script) and cached.

use std::{
    fs,
    hash::{Hash as _, Hasher as _},
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// The guest's PID 1 (a busybox shell script).
pub const INIT_SCRIPT: &str = include_str!("init.sh");

/// Modules the initramfs loads before it can mount the host's root (the Debian kernel has
/// them all as `=m`); their dependencies come from `modprobe --show-depends`.
const BOOT_MODULES: &[&str] = &["9p", "9pnet_virtio", "virtio_pci", "overlay"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub image: PathBuf,
    /// `uname -r` of the guest, e.g. `6.1.0-56-amd64`.
    pub release: String,
}

/// Version-aware ordering key: `6.1.0-56-amd64` sorts after `6.1.0-9-amd64`.
fn version_key(release: &str) -> Vec<u64> {
    release
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The newest `vmlinuz-*-amd64` among `names` (file names in /boot). The ABI number in
/// the name changes with Debian's kernel updates, so it is never hard-coded.
pub fn newest_kernel_release<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    names
        .into_iter()
        .filter_map(|n| n.strip_prefix("vmlinuz-"))
        .filter(|r| r.ends_with("-amd64"))
        .max_by_key(|r| version_key(r))
        .map(str::to_string)
}

/// The guest kernel: `explicit` or the newest Debian amd64 kernel in /boot, readable and
/// with its modules under /lib/modules (the guest loads them from the host's tree).
pub fn find_kernel(explicit: Option<&Path>) -> Result<Kernel, String> {
    let image = match explicit {
        Some(path) => path.to_path_buf(),
        None => {
            let names: Vec<String> = fs::read_dir("/boot")
                .map_err(|e| format!("reading /boot: {e}"))?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            let release = newest_kernel_release(names.iter().map(String::as_str)).ok_or(
                "no /boot/vmlinuz-*-amd64: Debian's linux-image-amd64 is not installed \
                 (run `cargo xtask setup`)",
            )?;
            PathBuf::from(format!("/boot/vmlinuz-{release}"))
        }
    };
    let release = image
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .ok_or_else(|| format!("{}: not named vmlinuz-<release>", image.display()))?
        .to_string();
    fs::File::open(&image).map_err(|e| format!("cannot read {}: {e}", image.display()))?;
    let modules = Path::new("/lib/modules").join(&release);
    if !modules.join("modules.dep").is_file() {
        return Err(format!(
            "{} has no modules.dep: the kernel's modules are missing",
            modules.display()
        ));
    }
    Ok(Kernel { image, release })
}

/// Whether the ELF file at `path` is statically linked (has no PT_INTERP program header).
pub fn is_static_elf(path: &Path) -> Result<bool, String> {
    let data = fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    elf_has_no_interpreter(&data).ok_or_else(|| format!("{} is not a 64-bit ELF", path.display()))
}

fn elf_has_no_interpreter(data: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if data.get(..5)? != b"\x7fELF\x02" || *data.get(5)? != 1 {
        return None; // not ELF64 little-endian
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?);
        if p_type == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// busybox from busybox-static (a dynamic busybox cannot run in the initramfs).
pub fn find_busybox() -> Result<PathBuf, String> {
    let path = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("busybox is not installed (apt package busybox-static; `cargo xtask setup`)")?;
    if !is_static_elf(&path)? {
        return Err(format!(
            "{} is dynamically linked: the initramfs needs busybox-static",
            path.display()
        ));
    }
    Ok(path)
}

/// `.ko` files to insmod, in order, from `modprobe --show-depends` output.
pub fn insmod_order(show_depends: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in show_depends.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("insmod")
            && let Some(path) = words.next()
        {
            let path = PathBuf::from(path);
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("kube-proxy-ebpf").join("vm")
}

/// The cached initramfs for `kernel`, built first when missing (about a second). The name
/// carries the kernel release and a hash of what goes in, so a new kernel or a changed
/// init script builds a new one.
pub fn initramfs(kernel: &Kernel, busybox: &Path) -> anyhow::Result<PathBuf> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    INIT_SCRIPT.hash(&mut hasher);
    BOOT_MODULES.hash(&mut hasher);
    fs::metadata(busybox)
        .map(|m| m.len())
        .unwrap_or_default()
        .hash(&mut hasher);
    let dir = cache_dir();
    let path = dir.join(format!(
        "initrd-{}-{:016x}.cpio",
        kernel.release,
        hasher.finish()
    ));
    if path.is_file() {
        return Ok(path);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let staging = dir.join(format!("staging-{}", std::process::id()));
    let result = build(kernel, busybox, &staging, &path);
    let _ = fs::remove_dir_all(&staging);
    result.map(|()| path)
}

fn build(kernel: &Kernel, busybox: &Path, staging: &Path, dest: &Path) -> anyhow::Result<()> {
    let _ = fs::remove_dir_all(staging);
    for sub in ["bin", "sbin", "proc", "sys", "dev", "newroot", "mods"] {
        fs::create_dir_all(staging.join(sub))?;
    }
    fs::copy(busybox, staging.join("bin/busybox")).context("copying busybox")?;

    let depends = Command::new("modprobe")
        .args(["-S", &kernel.release, "--show-depends", "-a"])
        .args(BOOT_MODULES)
        .output()
        .context("running modprobe --show-depends (apt package kmod)")?;
    if !depends.status.success() {
        bail!(
            "modprobe --show-depends for {}: {}",
            kernel.release,
            String::from_utf8_lossy(&depends.stderr).trim()
        );
    }
    let mut order = String::new();
    for module in insmod_order(&String::from_utf8_lossy(&depends.stdout)) {
        let name = module
            .file_name()
            .context("module path without a file name")?;
        fs::copy(&module, staging.join("mods").join(name))
            .with_context(|| format!("copying {}", module.display()))?;
        order.push_str(&format!("/mods/{}\n", name.to_string_lossy()));
    }
    fs::write(staging.join("mods/order"), order)?;
    let init = staging.join("init");
    fs::write(&init, INIT_SCRIPT)?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;

    // An uncompressed newc archive: the kernel unpacks it as it is, faster than gunzip
    // under emulation.
    let mut entries = Vec::new();
    list_tree(staging, Path::new(""), &mut entries)?;
    let tmp = dest.with_extension(format!("tmp{}", std::process::id()));
    let mut cpio = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(staging)
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&tmp)?)
        .spawn()
        .context("running cpio (apt package cpio)")?;
    {
        let mut stdin = cpio.stdin.take().context("cpio stdin")?;
        for entry in &entries {
            writeln!(stdin, "{}", entry.display())?;
        }
    }
    if !cpio.wait()?.success() {
        let _ = fs::remove_file(&tmp);
        bail!("cpio failed building the initramfs");
    }
    fs::rename(&tmp, dest)?;
    Ok(())
}

/// Relative paths of everything under `root`, parents before children.
fn list_tree(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(root.join(rel))?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let child = rel.join(&name);
        out.push(child.clone());
        if root.join(&child).is_dir() {
            list_tree(root, &child, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_kernel_by_version_not_by_text() {
        let names = [
            "config-6.1.0-56-amd64",
            "vmlinuz-6.1.0-9-amd64",
            "vmlinuz-6.1.0-56-amd64",
            "vmlinuz-6.1.0-10-cloud-amd64",
            "vmlinuz-6.1.0-56-arm64",
            "initrd.img-6.1.0-60-amd64",
        ];
        assert_eq!(
            newest_kernel_release(names).as_deref(),
            Some("6.1.0-56-amd64")
        );
        assert_eq!(newest_kernel_release(["System.map"]), None);
    }

    #[test]
    fn insmod_order_skips_builtins_and_duplicates() {
        let out = "builtin virtio\n\
                   insmod /lib/modules/r/kernel/net/9p/9pnet.ko \n\
                   insmod /lib/modules/r/kernel/fs/9p/9p.ko\n\
                   insmod /lib/modules/r/kernel/net/9p/9pnet.ko\n\
                   insmod /lib/modules/r/kernel/fs/overlayfs/overlay.ko redirect_dir=1\n";
        let order: Vec<String> = insmod_order(out)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            order,
            [
                "/lib/modules/r/kernel/net/9p/9pnet.ko",
                "/lib/modules/r/kernel/fs/9p/9p.ko",
                "/lib/modules/r/kernel/fs/overlayfs/overlay.ko",
            ]
        );
    }

    #[test]
    fn static_and_dynamic_elves_are_told_apart() {
        // This test binary is dynamically linked (glibc): it has an interpreter.
        let me = std::env::current_exe().unwrap();
        assert_eq!(is_static_elf(&me), Ok(false));
        assert_eq!(elf_has_no_interpreter(b"#!/bin/sh\n"), None);
        // A minimal ELF64 header with no program headers has no interpreter.
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        assert_eq!(elf_has_no_interpreter(&header), Some(true));
    }
}
