// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask lint`: the gate CI runs before the tests. Formatting, clippy with warnings
//! denied for the host crates and for the eBPF crate on its own target, the docs with
//! warnings denied, unused dependencies (cargo-machete), and import cycles between the
//! files of each crate. Every check runs, then the failed ones are named.

mod import_cycles;

use std::{path::Path, process::Command};

use anyhow::bail;
use clap::Args;

use crate::{
    setup,
    util::{cargo, status, step, workspace_root},
};

#[derive(Args, Default)]
pub struct LintArgs {
    /// Run only the checks whose name contains this word (e.g. `cycles`, `clippy`).
    #[arg(long)]
    only: Option<String>,
}

/// The eBPF crate: built only for the BPF target, never with the host crates.
const EBPF_CRATE: &str = "proxy-ebpf";
/// The BPF target of this (little-endian) host, as aya-build builds the object.
const EBPF_TARGET: &str = "bpfel-unknown-none";

/// One check: whether it passed (its command's own output says why not).
type Check = fn() -> anyhow::Result<bool>;

pub fn run(args: &LintArgs) -> anyhow::Result<()> {
    setup::ensure_ready()?;
    let checks: [(&str, Check); 6] = [
        ("rustfmt", fmt),
        ("clippy (host crates)", clippy_host),
        ("clippy (eBPF crate, bpfel target)", clippy_ebpf),
        ("rustdoc", doc),
        ("unused dependencies", unused_dependencies),
        ("import cycles", import_cycles),
    ];
    let mut failed = Vec::new();
    let chosen = checks
        .into_iter()
        .filter(|(name, _)| args.only.as_deref().is_none_or(|word| name.contains(word)));
    for (name, check) in chosen {
        step(&format!("lint: {name}"));
        if !check()? {
            failed.push(name);
        }
    }
    if !failed.is_empty() {
        bail!("lint failed: {}", failed.join(", "));
    }
    step("lint: all checks passed");
    Ok(())
}

fn succeeds(cmd: &mut Command) -> anyhow::Result<bool> {
    Ok(status(cmd)?.success())
}

fn fmt() -> anyhow::Result<bool> {
    succeeds(cargo().args(["fmt", "--all", "--check"]))
}

/// PROXY_REQUIRE_EBPF=1 as in the build that `cargo xtask test` runs next: the agent's
/// build script reruns when it changes, and the agent with it.
fn clippy_host() -> anyhow::Result<bool> {
    succeeds(
        cargo()
            .args([
                "clippy",
                "--workspace",
                "--exclude",
                EBPF_CRATE,
                "--all-targets",
            ])
            .args(["--", "-D", "warnings"])
            .env("PROXY_REQUIRE_EBPF", "1"),
    )
}

/// The eBPF crate the way aya-build compiles it (proxy-agent/build.rs): the BPF target,
/// `core` built from source (`-Z build-std`, allowed on stable by RUSTC_BOOTSTRAP=1),
/// release profile. Only checked, so no bpf-linker run.
fn clippy_ebpf() -> anyhow::Result<bool> {
    succeeds(
        cargo()
            .args(["clippy", "--package", EBPF_CRATE, "--target", EBPF_TARGET])
            .args(["-Z", "build-std=core", "--release"])
            .args(["--", "-D", "warnings"])
            .env("RUSTC_BOOTSTRAP", "1"),
    )
}

/// The host crates' docs, broken links and bad markup denied.
fn doc() -> anyhow::Result<bool> {
    succeeds(
        cargo()
            .args(["doc", "--workspace", "--exclude", EBPF_CRATE, "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings")
            .env("PROXY_REQUIRE_EBPF", "1"),
    )
}

/// cargo-machete's source search, not `--with-metadata`: that mode counts the agent's
/// build-dependencies (used by build.rs) as unused.
fn unused_dependencies() -> anyhow::Result<bool> {
    succeeds(Command::new("cargo-machete").arg(workspace_root()))
}

fn import_cycles() -> anyhow::Result<bool> {
    let root = workspace_root();
    let mut clean = true;
    for crate_dir in workspace_crates(&root)? {
        let name = crate_dir
            .strip_prefix(&root)
            .unwrap_or(&crate_dir)
            .display()
            .to_string();
        let cycles = import_cycles::check_crate_dir(&crate_dir)?;
        if cycles.is_empty() {
            println!("    {name}: no import cycle");
            continue;
        }
        clean = false;
        println!("    {name}: {} import cycle(s)", cycles.len());
        for cycle in cycles {
            print!("{cycle}");
        }
    }
    Ok(clean)
}

/// The directories below the workspace root that hold a crate (a Cargo.toml of their own).
fn workspace_crates(root: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut crates: Vec<_> = std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|dir| dir.join("Cargo.toml").is_file() && dir.join("src").is_dir())
        .collect();
    crates.sort();
    Ok(crates)
}
