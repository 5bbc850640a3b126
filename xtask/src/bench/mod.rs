// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask bench clusterip [--quick]`: builds the agent and the load generator in
//! release mode (the eBPF object required), runs the benchmark as root inside network
//! namespaces (`loadgen bench-clusterip`, see tests/src/bench), appends its rows to
//! target/bench/clusterip.csv and regenerates the ClusterIP section of
//! docs/benchmarks.md from that CSV. `--quick` (1 rep of 1 s, 1 and 100 services) writes
//! target/bench/clusterip-quick.csv and leaves the docs alone.

mod docs;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};

use crate::{
    setup,
    util::{cargo, is_root, run_cmd, status, step, workspace_root},
};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub bench: Bench,
}

#[derive(Subcommand)]
pub enum Bench {
    /// Connection rate and connect() latency through a ClusterIP (socket LB) against the
    /// same client connecting straight to the backend, with 1 and 10,000 services.
    Clusterip(ClusteripArgs),
}

#[derive(Args)]
pub struct ClusteripArgs {
    /// A tiny slice (1 rep of 1 s, 1 and 100 services) that proves the bench still works;
    /// its numbers mean nothing and the docs are left alone.
    #[arg(long)]
    pub quick: bool,
    /// Reps per route and service count (default 5).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Seconds per rep (default 3).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Service counts, comma-separated (default 1,10000).
    #[arg(long)]
    pub services: Option<String>,
    /// Only regenerate docs/benchmarks.md from the CSV; no build, no run.
    #[arg(long, conflicts_with = "quick")]
    pub report_only: bool,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn csv_path(quick: bool) -> PathBuf {
    let name = if quick {
        "clusterip-quick.csv"
    } else {
        "clusterip.csv"
    };
    target_dir().join("bench").join(name)
}

pub fn docs_path() -> PathBuf {
    workspace_root().join("docs").join("benchmarks.md")
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.bench {
        Bench::Clusterip(args) => clusterip(args),
    }
}

fn clusterip(args: &ClusteripArgs) -> anyhow::Result<()> {
    let csv = csv_path(args.quick);
    if !args.report_only {
        if !is_root() {
            bail!("the benchmark needs root (network namespaces, cgroups, eBPF): run it with sudo");
        }
        setup::ensure_ready()?;
        step("building the agent and the load generator (release, eBPF object required)");
        run_cmd(
            cargo()
                .args(["build", "--release", "-p", "proxy-agent", "-p", "tests"])
                .env("PROXY_REQUIRE_EBPF", "1"),
        )?;
        step("running the ClusterIP benchmark");
        run_bench(args, &csv)?;
    }
    if args.quick {
        return Ok(());
    }
    step("regenerating docs/benchmarks.md from the CSV");
    regenerate_docs(&csv, &docs_path())
}

fn run_bench(args: &ClusteripArgs, csv: &Path) -> anyhow::Result<()> {
    let release = target_dir().join("release");
    let mut cmd = Command::new(release.join("loadgen"));
    cmd.arg("bench-clusterip")
        .arg("--agent")
        .arg(release.join("proxy-agent"))
        .arg("--csv")
        .arg(csv);
    if args.quick {
        cmd.arg("--quick");
    }
    if let Some(reps) = args.reps {
        cmd.args(["--reps", &reps.to_string()]);
    }
    if let Some(seconds) = args.seconds {
        cmd.args(["--seconds", &seconds.to_string()]);
    }
    if let Some(services) = &args.services {
        cmd.args(["--services", services]);
    }
    let exit = status(&mut cmd)?;
    match exit.code() {
        Some(0) => Ok(()),
        Some(130) => bail!("the benchmark was interrupted (it cleaned up after itself)"),
        _ => bail!("the benchmark failed ({exit})"),
    }
}

fn regenerate_docs(csv: &Path, doc: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(csv)
        .with_context(|| format!("reading {} (run the benchmark first)", csv.display()))?;
    let section = docs::render_section(&docs::parse_csv(&text)?, csv)?;
    let current = std::fs::read_to_string(doc).unwrap_or_default();
    let updated = docs::splice(&current, &section);
    if let Some(dir) = doc.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(doc, updated).with_context(|| format!("writing {}", doc.display()))?;
    println!("    wrote {}", doc.display());
    Ok(())
}
