// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask bench [suite] [--quick]`: builds the agent and the load generator (the
//! bench crate) in release mode (the eBPF object required) and launches the suite as root
//! (`loadgen bench-<suite>`, or `loadgen bench-report-suites` for the report's suites; the
//! measuring is all in bench/src), which appends its rows to target/bench/<suite>.csv.
//! A full (not `--quick`) run then publishes its rows as docs/bench/<suite>.csv and
//! regenerates every generated section of docs/benchmarks.md, and the plots, from
//! docs/bench/*.csv alone: the committed CSVs are the only source of the page's numbers.
//! `--quick` runs a small slice, writes target/bench/<suite>-quick.csv and leaves the docs
//! alone.
//!
//! Without a suite, the report's five suites run one after the other — `dataplane`,
//! `sync`, `latency`, `bpf`, `memory` — and each one's latest run replaces
//! docs/bench/<suite>.csv. The suites with sections of their own — `clusterip` (socket
//! LB), `nodeport` (external traffic through tc / XDP), `sync-iptables` (the iptables
//! proxier against the raw restore of the very same text) — add their latest run to
//! docs/bench/<suite>.csv, whose earlier runs fill the sections' history tables.
//! `--report-only` (with or without a suite) only regenerates, from docs/bench.

#[cfg(test)]
mod doc_numbers;
mod docs;
mod docs_nodeport;
mod docs_sync;
pub mod plots;
mod publish;
mod report;
mod stats;
mod targets;

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
    pub bench: Option<Bench>,
    /// Without a suite: the quick slice of each of the report's suites (the docs are left
    /// alone).
    #[arg(long)]
    pub quick: bool,
    /// Without a suite: only regenerate the report (docs/benchmarks.md, the plots) from
    /// docs/bench/*.csv; no build, no run.
    #[arg(long, conflicts_with = "quick")]
    pub report_only: bool,
}

/// One of the report's suites: its own options pass through to `loadgen bench-<suite>`.
#[derive(Args)]
pub struct SuiteArgs {
    /// A small slice that proves the suite works; the docs are left alone.
    #[arg(long)]
    pub quick: bool,
    /// Options for the load generator's suite (see `loadgen bench-<suite> --help`).
    #[arg(last = true)]
    pub extra: Vec<String>,
}

#[derive(Subcommand)]
pub enum Bench {
    /// Connection rate and connect() latency through a ClusterIP (socket LB) against the
    /// same client connecting straight to the backend, with 1 and 10,000 services.
    Clusterip(ClusteripArgs),
    /// UDP packets/s and TCP connection rate from an external namespace through a
    /// NodePort (tc, XDP generic, XDP native) against direct-to-backend, local and remote
    /// backend.
    Nodeport(NodeportArgs),
    /// Full and one-service-change sync time of the iptables proxier against the raw
    /// restore of the very same rules, at 1,000 and 10,000 services x 4 endpoints.
    SyncIptables(SyncArgs),
    /// Connection rate, connect() and request/response latency and throughput at 1 to
    /// 100,000 services (the slow modes capped lower): ebpf, iptables, nftables,
    /// kube-proxy-shaped iptables and nftables, and direct-ct (the noise floor). Each rep
    /// is one client alternating in 100 ms slices (ABBA) between the mode's ClusterIP and
    /// the direct route to the same backends in the same namespaces; reported as the
    /// median per-rep ratio with its spread.
    Dataplane(SuiteArgs),
    /// Cold full sync and one-change syncs at 1,000 to 50,000 services x 4: ebpf, iptables,
    /// ipvs-fallback against the raw restore of kube-proxy-shaped iptables rules, nftables
    /// against the raw `nft -f` of kube-proxy-shaped nftables rules. Options after `--`
    /// (`--sides nftables,kube-proxy-nft`, `--services`, `--reps`) run a slice, which
    /// replaces only its own rows in docs/bench/sync.csv.
    Sync(SuiteArgs),
    /// From a Service's creation in the API server to the first connection through it,
    /// at 100 changes/s with 10,000 services.
    Latency(SuiteArgs),
    /// connect() with the socket programs attached against detached (ABBA in one client,
    /// at 1 and 100,000 services); ns per packet of the agent's tc and XDP programs by
    /// BPF_PROG_TEST_RUN (0 and 1,000,000 conntrack flows); run-time statistics' ns per
    /// call less their own cost; single against batched map updates; Maglev tables.
    Bpf(SuiteArgs),
    /// Agent RSS and BPF map memory at 1,000 to 50,000 services x 4; then the scale run:
    /// 100,000 services x 10 added at once to an ebpf agent with the default
    /// configuration while a prober connects to a service it already had (cold sync time,
    /// failed probes, RSS, map memory; `-- --scale-services N --scale-reps R`, 0 reps
    /// leaves it out).
    Memory(SuiteArgs),
}

#[derive(Args)]
pub struct NodeportArgs {
    /// 1 rep of 0.5 s per route, tc and XDP generic: proves the bench still works; its
    /// numbers mean nothing and the docs are left alone.
    #[arg(long)]
    pub quick: bool,
    /// Reps (default 5).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Seconds per route and client run (default 2).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Attachments, comma-separated (default tc,xdp-generic,xdp-native).
    #[arg(long)]
    pub attach: Option<String>,
    /// Only regenerate docs/benchmarks.md from the CSV; no build, no run.
    #[arg(long, conflicts_with = "quick")]
    pub report_only: bool,
}

#[derive(Args)]
pub struct SyncArgs {
    /// The proxier measured (iptables; the others are not measured yet).
    #[arg(long, default_value = "iptables")]
    pub mode: String,
    /// 1 rep at 1,000 services with 2 changes; the docs are left alone.
    #[arg(long)]
    pub quick: bool,
    /// Reps (default 5).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Service counts, comma-separated (default 1000,10000).
    #[arg(long)]
    pub services: Option<String>,
    /// The iptables commands both sides run: path (PATH's, as the agent), legacy, nft.
    #[arg(long)]
    pub iptables: Option<String>,
    /// Only regenerate docs/benchmarks.md from the CSV; no build, no run.
    #[arg(long, conflicts_with = "quick")]
    pub report_only: bool,
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

/// target/bench/<suite>.csv, or <suite>-quick.csv.
pub fn csv_path(suite: &str, quick: bool) -> PathBuf {
    let name = if quick {
        format!("{suite}-quick.csv")
    } else {
        format!("{suite}.csv")
    };
    target_dir().join("bench").join(name)
}

pub fn docs_path() -> PathBuf {
    workspace_root().join("docs").join("benchmarks.md")
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.bench {
        None => all_suites(args.quick, args.report_only),
        Some(Bench::Clusterip(args)) => clusterip(args),
        Some(Bench::Nodeport(args)) => nodeport(args),
        Some(Bench::SyncIptables(args)) => sync(args),
        Some(Bench::Dataplane(args)) => suite("dataplane", args),
        Some(Bench::Sync(args)) => suite("sync", args),
        Some(Bench::Latency(args)) => suite("latency", args),
        Some(Bench::Bpf(args)) => suite("bpf", args),
        Some(Bench::Memory(args)) => suite("memory", args),
    }
}

/// Runs report suites (all when `suites` is empty) with `loadgen bench-report-suites`,
/// which appends to target/bench and, unless quick, publishes this run's rows to
/// docs/bench; then, unless quick, regenerates the report.
fn run_report_suites(suites: &[&str], quick: bool, extra: &[String]) -> anyhow::Result<()> {
    prepare()?;
    let dir = report::docs_bench_dir(&docs_path());
    let mut cmd = Command::new(target_dir().join("release").join("loadgen"));
    cmd.arg("bench-report-suites")
        .arg("--csv-dir")
        .arg(target_dir().join("bench"))
        .arg("--publish")
        .arg(&dir);
    for suite in suites {
        cmd.args(["--suite", suite]);
    }
    if quick {
        cmd.arg("--quick");
    }
    if !extra.is_empty() {
        cmd.arg("--").args(extra);
    }
    run_loadgen(&mut cmd)?;
    if quick {
        return Ok(());
    }
    regenerate_report()
}

/// One report suite, then the report.
fn suite(name: &str, args: &SuiteArgs) -> anyhow::Result<()> {
    run_report_suites(&[name], args.quick, &args.extra)
}

/// Every report suite (under 40 minutes on a 2-core machine), then the report; or only
/// the report, from the published CSVs.
fn all_suites(quick: bool, report_only: bool) -> anyhow::Result<()> {
    if report_only {
        return regenerate_report();
    }
    run_report_suites(&[], quick, &[])
}

/// Regenerates every generated section of docs/benchmarks.md (the report's and the three
/// of the suites with sections of their own) and the plots in docs/bench, from
/// docs/bench/*.csv only; a section whose CSV is missing says the suite has not run.
fn regenerate_report() -> anyhow::Result<()> {
    let doc = docs_path();
    let dir = report::docs_bench_dir(&doc);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    step("regenerating docs/benchmarks.md and the plots in docs/bench from docs/bench/*.csv");
    let mut all = Vec::new();
    for name in report::SUITES {
        let path = dir.join(format!("{name}.csv"));
        let rows = match std::fs::read_to_string(&path) {
            Ok(text) => docs::parse_csv(&text)?,
            Err(_) => Vec::new(),
        };
        all.push(stats::SuiteRows { suite: name, rows });
    }
    for (file, title, panels) in report::plots(&all) {
        let path = dir.join(file);
        plots::draw(&path, title, &panels)?;
        println!("    wrote {}", path.display());
    }
    let mut updated = std::fs::read_to_string(&doc).unwrap_or_default();
    let section = report::render(&all);
    updated = docs::splice_between(&updated, report::BEGIN, report::END, &section);
    for own in OWN_SECTIONS {
        let csv = dir.join(format!("{}.csv", own.suite));
        let section = match std::fs::read_to_string(&csv) {
            Ok(text) => (own.render)(&docs::parse_csv(&text)?, &csv)
                .with_context(|| format!("rendering the {} section", own.suite))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => own.not_run(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", csv.display())),
        };
        updated = docs::splice_between(&updated, own.begin, own.end, &section);
    }
    std::fs::write(&doc, updated).with_context(|| format!("writing {}", doc.display()))?;
    println!("    wrote {}", doc.display());
    Ok(())
}

type RenderSection = fn(&[docs::Row], &Path) -> anyhow::Result<String>;

/// A suite with a section of its own in docs/benchmarks.md, generated from
/// docs/bench/<suite>.csv.
struct OwnSection {
    suite: &'static str,
    begin: &'static str,
    end: &'static str,
    render: RenderSection,
}

const OWN_SECTIONS: [OwnSection; 3] = [
    OwnSection {
        suite: "clusterip",
        begin: docs::BEGIN,
        end: docs::END,
        render: docs::render_section,
    },
    OwnSection {
        suite: "nodeport",
        begin: docs_nodeport::BEGIN,
        end: docs_nodeport::END,
        render: docs_nodeport::render_section,
    },
    OwnSection {
        suite: "sync-iptables",
        begin: docs_sync::BEGIN,
        end: docs_sync::END,
        render: docs_sync::render_section,
    },
];

impl OwnSection {
    /// The section while no run is published: it says so and states no numbers.
    fn not_run(&self) -> String {
        let suite = self.suite;
        format!(
            "{}\n<!-- Generated by `cargo xtask bench` from docs/bench/{suite}.csv; edits here are overwritten. -->\n\n\
             **Not run** (no published rows): docs/bench/{suite}.csv does not exist, so this section\n\
             states no numbers.\n\
             `sudo cargo xtask bench {suite}` runs the suite and publishes its rows there.\n{}\n",
            self.begin, self.end
        )
    }
}

/// Adds the latest run in target/bench/<suite>.csv to docs/bench/<suite>.csv, then
/// regenerates the page from docs/bench.
fn publish_and_regenerate(suite: &str) -> anyhow::Result<()> {
    let raw_path = csv_path(suite, false);
    let raw = std::fs::read_to_string(&raw_path)
        .with_context(|| format!("reading {}", raw_path.display()))?;
    let dir = report::docs_bench_dir(&docs_path());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let published_path = dir.join(format!("{suite}.csv"));
    let published = match std::fs::read_to_string(&published_path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", published_path.display())),
    };
    let text = publish::publish_latest_run(&raw, published.as_deref())
        .with_context(|| format!("publishing {}", raw_path.display()))?;
    std::fs::write(&published_path, text)
        .with_context(|| format!("writing {}", published_path.display()))?;
    println!("    published {}", published_path.display());
    regenerate_report()
}

/// Root, the toolchain, and a release build of the agent (with its eBPF object) and of
/// the load generator.
fn prepare() -> anyhow::Result<()> {
    if !is_root() {
        bail!("the benchmark needs root (network namespaces, cgroups, eBPF): run it with sudo");
    }
    setup::ensure_ready()?;
    step("building the agent and the load generator (release, eBPF object required)");
    run_cmd(
        cargo()
            .args(["build", "--release", "-p", "proxy-agent", "-p", "bench"])
            .env("PROXY_REQUIRE_EBPF", "1"),
    )
}

/// `loadgen <subcommand> --csv <csv>` from the release build.
fn loadgen(subcommand: &str, csv: &Path) -> Command {
    let release = target_dir().join("release");
    let mut cmd = Command::new(release.join("loadgen"));
    cmd.arg(subcommand).arg("--csv").arg(csv);
    cmd
}

/// Runs a benchmark command; exit status 130 means it was interrupted (and cleaned up).
fn run_loadgen(cmd: &mut Command) -> anyhow::Result<()> {
    let exit = status(cmd)?;
    match exit.code() {
        Some(0) => Ok(()),
        Some(130) => bail!("the benchmark was interrupted (it cleaned up after itself)"),
        _ => bail!("the benchmark failed ({exit})"),
    }
}

fn clusterip(args: &ClusteripArgs) -> anyhow::Result<()> {
    let csv = csv_path("clusterip", args.quick);
    if !args.report_only {
        prepare()?;
        step("running the ClusterIP benchmark");
        run_bench(args, &csv)?;
    }
    if args.quick {
        return Ok(());
    }
    publish_or_regenerate("clusterip", args.report_only)
}

/// After a full run: publish it and regenerate; with `--report-only`: regenerate.
fn publish_or_regenerate(suite: &str, report_only: bool) -> anyhow::Result<()> {
    if report_only {
        return regenerate_report();
    }
    publish_and_regenerate(suite)
}

fn nodeport(args: &NodeportArgs) -> anyhow::Result<()> {
    let csv = csv_path("nodeport", args.quick);
    if !args.report_only {
        prepare()?;
        step("running the NodePort benchmark");
        let release = target_dir().join("release");
        let mut cmd = loadgen("bench-nodeport", &csv);
        cmd.arg("--agent").arg(release.join("proxy-agent"));
        if args.quick {
            cmd.arg("--quick");
        }
        if let Some(reps) = args.reps {
            cmd.args(["--reps", &reps.to_string()]);
        }
        if let Some(seconds) = args.seconds {
            cmd.args(["--seconds", &seconds.to_string()]);
        }
        if let Some(attach) = &args.attach {
            cmd.args(["--attach", attach]);
        }
        run_loadgen(&mut cmd)?;
    }
    if args.quick {
        return Ok(());
    }
    publish_or_regenerate("nodeport", args.report_only)
}

fn sync(args: &SyncArgs) -> anyhow::Result<()> {
    if args.mode != "iptables" {
        bail!(
            "`bench sync --mode {}`: only iptables mode is measured so far",
            args.mode
        );
    }
    let csv = csv_path("sync-iptables", args.quick);
    if !args.report_only {
        prepare()?;
        step("running the sync-iptables benchmark (iptables mode against raw iptables-restore)");
        let mut cmd = loadgen("bench-sync", &csv);
        cmd.args(["--mode", &args.mode]);
        if args.quick {
            cmd.arg("--quick");
        }
        if let Some(reps) = args.reps {
            cmd.args(["--reps", &reps.to_string()]);
        }
        if let Some(services) = &args.services {
            cmd.args(["--services", services]);
        }
        if let Some(iptables) = &args.iptables {
            cmd.args(["--iptables", iptables]);
        }
        run_loadgen(&mut cmd)?;
    }
    if args.quick {
        return Ok(());
    }
    publish_or_regenerate("sync-iptables", args.report_only)
}

fn run_bench(args: &ClusteripArgs, csv: &Path) -> anyhow::Result<()> {
    let release = target_dir().join("release");
    let mut cmd = loadgen("bench-clusterip", csv);
    cmd.arg("--agent").arg(release.join("proxy-agent"));
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
    run_loadgen(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_without_its_csv_says_so_and_states_no_numbers() {
        for own in OWN_SECTIONS {
            let text = own.not_run();
            assert!(text.starts_with(own.begin) && text.trim_end().ends_with(own.end));
            assert!(text.contains(&format!("docs/bench/{}.csv does not exist", own.suite)));
            assert!(text.contains(&format!("cargo xtask bench {}`", own.suite)));
            // Splicing it into a page that had numbers there leaves none of them.
            let page = format!(
                "# B\n\n{}\nold 41.0 µs\n{}\n\n## After\n",
                own.begin, own.end
            );
            let spliced = docs::splice_between(&page, own.begin, own.end, &text);
            assert!(!spliced.contains("41.0") && spliced.ends_with("\n## After\n"));
            assert_eq!(
                docs::splice_between(&spliced, own.begin, own.end, &text),
                spliced
            );
        }
    }
}
