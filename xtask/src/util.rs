// SPDX-License-Identifier: Apache-2.0
//! Small helpers for running commands and finding the workspace.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
};

use anyhow::{Context as _, bail};

/// The workspace root (the parent of xtask's manifest directory). `cargo xtask` (cargo
/// run) sets CARGO_MANIFEST_DIR for this process: the checkout it was started in. The
/// value compiled in is only the fallback: checkouts that share a target directory share
/// this binary (cargo's unit hashes do not depend on where a checkout lies, and a fresh
/// one is not rebuilt), so it may name another checkout.
pub fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Prints a step header the way every task reports its progress.
pub fn step(msg: &str) {
    println!("==> {msg}");
}

/// Runs `cmd`, echoing it first; fails with the command line when it exits non-zero.
pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let status = status(cmd)?;
    if !status.success() {
        bail!("command failed ({status}): {}", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` and returns its exit status (echoing the command line).
pub fn status(cmd: &mut Command) -> anyhow::Result<ExitStatus> {
    println!("    $ {}", describe(cmd));
    cmd.status()
        .with_context(|| format!("starting {}", describe(cmd)))
}

/// Runs `cmd` quietly and returns its stdout when it succeeds.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// `cargo` as invoked by the current toolchain, in the workspace root. A relative
/// `CARGO_TARGET_DIR` names a directory below where `cargo xtask` was started (this
/// process's working directory, which `cargo run` keeps): it is passed on absolute, so
/// that the builds here land where the user's cargo put xtask itself.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from)
        && dir.is_relative()
        && !dir.as_os_str().is_empty()
        && let Ok(cwd) = std::env::current_dir()
    {
        cmd.env("CARGO_TARGET_DIR", cwd.join(dir));
    }
    cmd
}

/// Builds the default members and all their targets with the eBPF object required.
pub fn build_workspace(release: bool) -> anyhow::Result<()> {
    step("building the workspace (eBPF object required)");
    let mut cmd = cargo();
    cmd.args(["build", "--all-targets"])
        .env("PROXY_REQUIRE_EBPF", "1");
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)
}

/// Whether the process runs as root (privileged tests need it).
pub fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|uid| uid.trim() == "0")
}
