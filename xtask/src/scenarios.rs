// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask scenarios --mode <ebpf|iptables|ipvs|nftables> [--dir DIR]... [--filter NAME]`:
//! builds the agent and the scenario runner, then replays the scenario files on this host,
//! or, for ipvs on a kernel without IPVS, inside the test VM (one boot for every file).
//! The runner checks the mode the agent really runs (/proxyMode), so a fallback's results
//! are never reported as the requested mode's.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::Args;
use xtask::vm::{self, VmOptions};

use crate::{
    setup,
    util::{cargo, run_cmd, step, target_dir, workspace_root},
    vm_cmd,
};

#[derive(Args)]
pub struct ScenariosArgs {
    /// The dataplane mode the agent runs and the flows are judged in (`nftables` is a
    /// mode scenario flows may name; the agent does not have it yet, and the runner says so).
    #[arg(long, value_parser = ["ebpf", "iptables", "ipvs", "nftables"])]
    pub mode: String,
    /// Scenario directories (default: ../shared/scenarios and tests/scenarios).
    #[arg(long = "dir")]
    pub dirs: Vec<PathBuf>,
    /// Only files whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// ebpf mode: XDP acceleration on the node's uplink.
    #[arg(long, value_parser = ["off", "generic", "native"])]
    pub xdp_mode: Option<String>,
    /// Start the agent in --mode, require that it fell back to this mode and judge the
    /// flows as this mode (e.g. `--mode ipvs --expect-fallback iptables` on a kernel
    /// without IPVS). Runs on this host.
    #[arg(long, value_parser = ["iptables"])]
    pub expect_fallback: Option<String>,
    /// Run inside the test VM even when this host could run the mode itself.
    #[arg(long)]
    pub vm: bool,
    /// Seconds before the test VM is killed (every file takes 30-90 s under emulation).
    #[arg(long, default_value_t = 7200)]
    pub vm_timeout: u64,
    /// Keep namespaces, cgroup, pins and files afterwards (on this host only).
    #[arg(long)]
    pub keep: bool,
}

/// How long the agent may take to sync a change inside the VM: everything runs 10-20
/// times slower under TCG than on the host.
const GUEST_READY_TIMEOUT_S: u64 = 90;
/// One probe attempt's connect and answer timeout inside the VM.
const GUEST_PROBE_TIMEOUT_MS: u64 = 1000;

/// The default scenario directories that exist, absolute (the guest sees the same paths).
pub fn default_dirs() -> Vec<PathBuf> {
    let ws = workspace_root();
    [ws.join("../shared/scenarios"), ws.join("tests/scenarios")]
        .into_iter()
        .filter(|d| d.is_dir())
        .filter_map(|d| d.canonicalize().ok())
        .collect()
}

/// Where the run happens, or why the mode cannot run here at all.
fn in_vm(args: &ScenariosArgs) -> anyhow::Result<bool> {
    let ipvs_needs_vm =
        args.mode == "ipvs" && args.expect_fallback.is_none() && !vm::host_kernel_has_ipvs();
    if !(args.vm || ipvs_needs_vm) {
        return Ok(false);
    }
    if args.expect_fallback.is_some() {
        bail!("--expect-fallback judges the fallback on this host; it does not combine with --vm");
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let pre = vm::prerequisites().map_err(|why| {
        if ipvs_needs_vm {
            anyhow::anyhow!(
                "cannot run the ipvs scenarios: this kernel ({}) has no IPVS, and the test VM \
                 that has it cannot boot: {why}",
                release.trim()
            )
        } else {
            anyhow::anyhow!("cannot run the scenarios in the test VM: {why}")
        }
    })?;
    if ipvs_needs_vm {
        step(&format!(
            "this kernel ({}) has no IPVS: the ipvs scenarios run in the test VM (kernel {} \
             under qemu TCG, one boot for every file)",
            release.trim(),
            pre.kernel.release
        ));
    } else {
        step(&format!(
            "running in the test VM (kernel {} under qemu TCG)",
            pre.kernel.release
        ));
    }
    Ok(true)
}

/// Builds the agent (eBPF object required) and the scenario runner; the runner's path.
pub fn build_runner() -> anyhow::Result<PathBuf> {
    setup::ensure_ready()?;
    step("building proxy-agent and scenario-runner (eBPF object required)");
    run_cmd(
        cargo()
            .args(["build", "-p", "proxy-agent", "-p", "tests"])
            .args(["--bin", "proxy-agent", "--bin", "scenario-runner"])
            .env("PROXY_REQUIRE_EBPF", "1"),
    )?;
    let runner = target_dir().join("debug/scenario-runner");
    runner
        .canonicalize()
        .with_context(|| format!("no scenario runner at {}", runner.display()))
}

pub fn run(args: &ScenariosArgs) -> anyhow::Result<()> {
    if args.mode == "nftables" {
        bail!(
            "the agent has no nftables mode yet (`--proxy-mode nftables` is refused at \
             validation): scenario flows that list nftables are parsed and ignored in the other \
             modes; replay ebpf, iptables or ipvs"
        );
    }
    let guest = in_vm(args)?;
    let runner = build_runner()?;
    let dirs = if args.dirs.is_empty() {
        default_dirs()
    } else {
        args.dirs
            .iter()
            .map(|d| d.canonicalize().with_context(|| d.display().to_string()))
            .collect::<anyhow::Result<_>>()?
    };
    let mut words = vec![
        runner.display().to_string(),
        "run".into(),
        "--mode".into(),
        args.mode.clone(),
    ];
    for dir in &dirs {
        words.extend(["--dir".into(), dir.display().to_string()]);
    }
    let optional = [
        ("--filter", &args.filter),
        ("--xdp-mode", &args.xdp_mode),
        ("--expect-fallback", &args.expect_fallback),
    ];
    for (flag, value) in optional {
        if let Some(value) = value {
            words.extend([flag.to_string(), value.clone()]);
        }
    }
    if !guest {
        if args.keep {
            words.push("--keep".into());
        }
        step(&format!(
            "scenario-runner, {} mode, on this host",
            args.mode
        ));
        let status = crate::util::status(
            std::process::Command::new(&words[0])
                .args(&words[1..])
                .current_dir(workspace_root()),
        )?;
        std::process::exit(status.code().unwrap_or(1));
    }
    words.extend([
        "--ready-timeout-s".into(),
        GUEST_READY_TIMEOUT_S.to_string(),
        "--timeout-ms".into(),
        GUEST_PROBE_TIMEOUT_MS.to_string(),
    ]);
    let script = format!("exec {} 2>&1\n", vm::shell_words(&words));
    let options = VmOptions {
        timeout: Duration::from_secs(args.vm_timeout),
        cwd: workspace_root(),
        ..VmOptions::default()
    };
    std::process::exit(vm_cmd::run_in_guest(&script, &options));
}
