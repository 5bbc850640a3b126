// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask setup`: the verified toolchain recipe of ../shared/toolchain.md, made
//! idempotent. Every step first checks whether it is needed and says what it finds.

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};
use clap::Args;

use crate::util::{output, run_cmd, step};

/// Debian packages the build, the agent and the tests need.
const APT_PACKAGES: &[&str] = &[
    // bpf-linker is built against LLVM 22, the LLVM of rustc 1.95.
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    // The agent's dataplanes and the tests.
    "bpftool",
    "iproute2",
    "iptables",
    "ipset",
    "nftables",
    "conntrack",
    "curl",
    "iputils-ping",
    "kmod",
    // The benchmark report's PNG plots draw their text with DejaVu Sans.
    "fonts-dejavu-core",
    // The test VM with a kernel that has IPVS (`cargo xtask vm`, ../shared/ipvs-vm.md):
    // qemu under TCG, Debian's kernel (ip_vs as modules), the initramfs' busybox and cpio,
    // and ipvsadm to look at the guest's IPVS table.
    "qemu-system-x86",
    "linux-image-amd64",
    "busybox-static",
    "cpio",
    "ipvsadm",
    // The OCI image of `cargo xtask image --oci`: skopeo reads it back (tests/tests/image.rs)
    // and pushes it; mmdebstrap makes its Debian base.
    "skopeo",
    "mmdebstrap",
];

const BPF_LINKER_VERSION: &str = "0.13.0";
/// The test runner (`cargo xtask test` runs the suite with it: its test groups keep the
/// privileged tests one at a time). Built from source: crates.io is what these machines
/// reach; the newest release that builds on rustc 1.95.
const CARGO_NEXTEST_VERSION: &str = "0.9.151";
/// The Go toolchain upstream's v1.37 binaries are built with (their go.mod's `go` line).
const GO_MINOR_NEEDED: u32 = 26;
/// The unused-dependency check of `cargo xtask lint`. cargo-shear's current releases need a
/// newer rustc than 1.95 (rust-analyzer crates); cargo-machete 0.9.2 builds on it.
const CARGO_MACHETE_VERSION: &str = "0.9.2";
/// rustup components: `core`'s source for build-std (bpfel target), and the lint tools.
const RUST_COMPONENTS: &[&str] = &["rust-src", "clippy", "rustfmt"];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

#[derive(Args, Default)]
pub struct SetupArgs {
    /// Only report what is missing; change nothing.
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: &SetupArgs) -> anyhow::Result<()> {
    let missing = missing_packages();
    step("apt packages");
    if missing.is_empty() {
        println!("    all {} packages installed", APT_PACKAGES.len());
    } else if args.check {
        println!("    missing: {}", missing.join(" "));
    } else {
        install_packages(&missing)?;
    }

    step("rustup components (rust-src for build-std on the bpfel target, clippy, rustfmt)");
    let missing = missing_components();
    if missing.is_empty() {
        println!("    installed");
    } else if args.check {
        println!("    missing: {}", missing.join(" "));
    } else {
        run_cmd(
            Command::new("rustup")
                .args(["component", "add"])
                .args(&missing),
        )?;
    }

    step(&format!("bpf-linker {BPF_LINKER_VERSION} against LLVM 22"));
    match bpf_linker_state() {
        LinkerState::Good => println!("    installed"),
        state if args.check => println!("    {state:?}"),
        state => {
            println!("    {state:?}: building it (about a minute on 2 cores)");
            run_cmd(
                crate::util::cargo()
                    .args([
                        "install",
                        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                        "--locked",
                    ])
                    .args(["--no-default-features", "--features", "llvm-22", "--force"])
                    .env("LLVM_PREFIX", LLVM_PREFIX),
            )?;
            if bpf_linker_state() != LinkerState::Good {
                bail!("bpf-linker still not usable after installing it");
            }
        }
    }

    step(&format!("cargo-machete {CARGO_MACHETE_VERSION}"));
    if has_cargo_machete() {
        println!("    installed");
    } else if args.check {
        println!("    missing");
    } else {
        run_cmd(crate::util::cargo().args([
            "install",
            &format!("cargo-machete@{CARGO_MACHETE_VERSION}"),
            "--locked",
            "--force",
        ]))?;
        if !has_cargo_machete() {
            bail!("cargo-machete still not usable after installing it");
        }
    }

    step(&format!("cargo-nextest {CARGO_NEXTEST_VERSION}"));
    if has_cargo_nextest() {
        println!("    installed");
    } else if args.check {
        println!("    missing");
    } else {
        println!("    building it (about 5 minutes on 2 cores)");
        run_cmd(crate::util::cargo().args([
            "install",
            &format!("cargo-nextest@{CARGO_NEXTEST_VERSION}"),
            "--locked",
            "--force",
            // Without self-update (and its HTTP and TLS stack): crates.io builds it, and
            // setup updates it.
            "--no-default-features",
            "--features",
            "default-no-update",
        ]))?;
        if !has_cargo_nextest() {
            bail!("cargo-nextest still not usable after installing it");
        }
    }

    step(
        "upstream's etcd, kube-apiserver, kube-controller-manager, kube-proxy and kubeadm (testbed/k8s)",
    );
    match upstream_binaries_state()? {
        UpstreamState::UpToDate => println!("    built, sources unchanged"),
        state if args.check => println!("    {state:?}"),
        state => {
            println!("    {state:?}: building them (10-15 minutes cold; Go's caches make it 1-2)");
            build_upstream_binaries()?;
        }
    }

    step("bpffs at /sys/fs/bpf");
    if bpffs_mounted() {
        println!("    mounted");
    } else if args.check {
        println!("    not mounted");
    } else if crate::util::is_root() {
        run_cmd(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    } else {
        println!("    not mounted and not root: the privileged tests will mount it or skip");
    }
    Ok(())
}

/// Runs setup only when something is missing (fast path: a few checks).
pub fn ensure_ready() -> anyhow::Result<()> {
    if missing_packages().is_empty()
        && missing_components().is_empty()
        && bpf_linker_state() == LinkerState::Good
        && has_cargo_machete()
        && has_cargo_nextest()
        && matches!(upstream_binaries_state(), Ok(UpstreamState::UpToDate))
        && bpffs_mounted()
    {
        return Ok(());
    }
    run(&SetupArgs::default())
}

fn missing_packages() -> Vec<&'static str> {
    APT_PACKAGES
        .iter()
        .copied()
        .filter(|pkg| {
            let status = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]));
            !status.is_some_and(|s| s.contains("install ok installed"))
        })
        .collect()
}

fn install_packages(missing: &[&str]) -> anyhow::Result<()> {
    println!("    installing: {}", missing.join(" "));
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("apt-get install (are you root?)")
}

fn missing_components() -> Vec<&'static str> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"]))
        .unwrap_or_default();
    RUST_COMPONENTS
        .iter()
        .copied()
        .filter(|c| !installed.lines().any(|l| l.starts_with(c)))
        .collect()
}

/// cargo's list of the binaries it installed tells cargo-machete's version.
fn has_cargo_machete() -> bool {
    output(crate::util::cargo().args(["install", "--list"])).is_some_and(|list| {
        list.lines()
            .any(|l| l.starts_with(&format!("cargo-machete v{CARGO_MACHETE_VERSION}:")))
    })
}

fn has_cargo_nextest() -> bool {
    output(crate::util::cargo().args(["nextest", "--version"]))
        .is_some_and(|v| v.contains(CARGO_NEXTEST_VERSION))
}

#[derive(Debug, PartialEq, Eq)]
enum UpstreamState {
    UpToDate,
    NotBuilt,
    SourcesChanged,
}

/// The files the upstream binaries are built from (the Go module of testbed/k8s).
fn upstream_sources() -> anyhow::Result<Vec<std::path::PathBuf>> {
    let module = crate::util::workspace_root().join("testbed/k8s");
    let mut files: Vec<std::path::PathBuf> = ["go.mod", "go.sum", "build.sh"]
        .iter()
        .map(|f| module.join(f))
        .collect();
    let cmd = module.join("cmd");
    for entry in std::fs::read_dir(&cmd).with_context(|| format!("reading {}", cmd.display()))? {
        let main = entry?.path().join("main.go");
        if main.is_file() {
            files.push(main);
        }
    }
    files.sort();
    Ok(files)
}

/// A fingerprint of the sources (FNV-1a over names and contents): the build is redone
/// exactly when it changes.
fn sources_fingerprint() -> anyhow::Result<String> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for path in upstream_sources()? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let contents =
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        for byte in name.as_bytes().iter().chain(&contents) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{hash:016x}"))
}

fn upstream_bin_dir() -> std::path::PathBuf {
    crate::util::workspace_root().join("target/k8s-testbed")
}

const FINGERPRINT_FILE: &str = "SOURCES";

fn upstream_binaries_state() -> anyhow::Result<UpstreamState> {
    let dir = upstream_bin_dir();
    // One binary per command of the module (`cmd/NAME/main.go` builds `NAME`).
    let built = upstream_sources()?
        .iter()
        .filter(|source| source.ends_with("main.go"))
        .filter_map(|main| main.parent()?.file_name())
        .all(|name| dir.join(name).is_file());
    if !built {
        return Ok(UpstreamState::NotBuilt);
    }
    let recorded = std::fs::read_to_string(dir.join(FINGERPRINT_FILE)).unwrap_or_default();
    Ok(if recorded.trim() == sources_fingerprint()? {
        UpstreamState::UpToDate
    } else {
        UpstreamState::SourcesChanged
    })
}

/// Go `1.N.x` as N, from `go version`.
fn go_minor() -> Option<u32> {
    let version = output(Command::new("go").arg("version"))?;
    let number = version.split_whitespace().nth(2)?.strip_prefix("go1.")?;
    number.split('.').next()?.parse().ok()
}

fn build_upstream_binaries() -> anyhow::Result<()> {
    match go_minor() {
        Some(minor) if minor >= GO_MINOR_NEEDED => {}
        Some(minor) => bail!(
            "Go 1.{minor} is installed; upstream's v1.37 binaries need Go 1.{GO_MINOR_NEEDED} \
             or newer (testbed/k8s/go.mod)"
        ),
        None => bail!(
            "no Go toolchain on PATH: upstream's control plane and kube-proxy (testbed/k8s) \
             are built with Go 1.{GO_MINOR_NEEDED}"
        ),
    }
    let fingerprint = sources_fingerprint()?;
    let dir = upstream_bin_dir();
    run_cmd(
        Command::new(crate::util::workspace_root().join("testbed/k8s/build.sh")).env("OUT", &dir),
    )?;
    std::fs::write(dir.join(FINGERPRINT_FILE), fingerprint)
        .with_context(|| format!("writing {}", dir.join(FINGERPRINT_FILE).display()))?;
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum LinkerState {
    Good,
    Missing,
    WrongVersion(String),
    WrongLlvm,
}

fn bpf_linker_state() -> LinkerState {
    let Ok(path) = which_bpf_linker() else {
        return LinkerState::Missing;
    };
    let version = output(Command::new(&path).arg("--version")).unwrap_or_default();
    if !version.contains(BPF_LINKER_VERSION) {
        return LinkerState::WrongVersion(version.trim().to_string());
    }
    // A linker built against another LLVM than rustc's fails with "Invalid record".
    let ldd = output(Command::new("ldd").arg(&path)).unwrap_or_default();
    if ldd.contains("LLVM") && !ldd.contains("LLVM.so.22") && !ldd.contains("LLVM-22") {
        return LinkerState::WrongLlvm;
    }
    LinkerState::Good
}

fn which_bpf_linker() -> anyhow::Result<String> {
    let out = output(Command::new("sh").args(["-c", "command -v bpf-linker"]))
        .context("bpf-linker not on PATH")?;
    Ok(out.trim().to_string())
}

fn bpffs_mounted() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("bpf"))
        })
        .unwrap_or(false)
        && Path::new("/sys/fs/bpf").is_dir()
}
