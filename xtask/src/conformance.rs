// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask conformance --diff MODE [--dir DIR]... [--filter NAME]`: replays the same
//! files through one of our modes and through upstream's kube-proxy in the mode it is
//! judged against (iptables and nftables against themselves, ebpf against nftables), both
//! through upstream's API server, and prints the flows whose observed outcomes differ
//! outside the documented divergences (`scenario-runner diff`, tests/src/scenario/
//! conformance.rs). Exits non-zero on an undocumented difference.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;

use crate::{
    scenarios::{build_runner, default_dirs},
    util::{step, workspace_root},
};

#[derive(Args)]
pub struct ConformanceArgs {
    /// Our mode to compare with upstream's: iptables, nftables or ebpf (against upstream's
    /// nftables, which ebpf follows).
    #[arg(long, value_parser = ["iptables", "nftables", "ebpf", "ipvs"])]
    pub diff: String,
    /// Scenario directories (default: ../shared/scenarios and tests/scenarios).
    #[arg(long = "dir")]
    pub dirs: Vec<PathBuf>,
    /// Only files whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

/// Upstream's mode each of ours is judged against.
fn upstream_mode(ours: &str) -> anyhow::Result<&'static str> {
    Ok(match ours {
        "iptables" => "iptables",
        "nftables" | "ebpf" => "nftables",
        "ipvs" => bail!(
            "--diff ipvs needs IPVS, which this kernel lacks, and the test VM runs no upstream \
             API server yet"
        ),
        other => bail!("no upstream mode to compare {other} with"),
    })
}

pub fn run(args: &ConformanceArgs) -> anyhow::Result<()> {
    let upstream = upstream_mode(&args.diff)?;
    let built = build_runner()?;
    let dirs = if args.dirs.is_empty() {
        default_dirs()
    } else {
        args.dirs.clone()
    };
    let out = workspace_root().join("target/conformance");
    std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    let ours_file = out.join(format!("{}.jsonl", args.diff));
    let upstream_file = out.join(format!("upstream-{upstream}.jsonl"));
    let replay = |mode: &str, observations: &PathBuf, agent: bool| -> anyhow::Result<()> {
        let mut command = std::process::Command::new(&built.runner);
        command.args(["run", "--mode", mode, "--api", "real", "--observations"]);
        command.arg(observations);
        if agent {
            command.arg("--agent").arg(&built.agent);
        }
        for dir in &dirs {
            command.arg("--dir").arg(dir);
        }
        if let Some(filter) = &args.filter {
            command.args(["--filter", filter]);
        }
        let log = out.join(format!("{mode}.log"));
        let output = command
            .current_dir(workspace_root())
            .output()
            .with_context(|| format!("running the scenario runner in {mode} mode"))?;
        std::fs::write(&log, [&output.stdout[..], &output.stderr[..]].concat())
            .with_context(|| log.display().to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        println!(
            "    {mode}: {} (every flow's line in {})",
            stdout.lines().last().unwrap_or("no summary"),
            log.display()
        );
        Ok(())
    };
    step(&format!("replaying in {} mode (ours)", args.diff));
    replay(&args.diff, &ours_file, true)?;
    step(&format!(
        "replaying in upstream-{upstream} (upstream's kube-proxy)"
    ));
    replay(&format!("upstream-{upstream}"), &upstream_file, false)?;
    step(&format!(
        "comparing what each flow saw: {} against upstream-{upstream}",
        args.diff
    ));
    let status = crate::util::status(
        std::process::Command::new(&built.runner)
            .args(["diff", "--ours"])
            .arg(&ours_file)
            .arg("--upstream")
            .arg(&upstream_file)
            .args(["--upstream-mode", upstream])
            .current_dir(workspace_root()),
    )?;
    std::process::exit(status.code().unwrap_or(1));
}
