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
    /// Replay random clusters instead of the scenario files (differential fuzzing,
    /// tests/src/scenario/fuzz.rs): each undocumented difference is saved as a scenario
    /// file reproducing it under target/fuzz/<run>/found/.
    #[arg(long, conflicts_with_all = ["dirs", "filter"])]
    pub fuzz: bool,
    /// With --fuzz: how many random clusters.
    #[arg(long, default_value_t = 40, requires = "fuzz")]
    pub cases: usize,
    /// With --fuzz: the seed (the same seed, the same clusters).
    #[arg(long, default_value_t = 1, requires = "fuzz")]
    pub seed: u64,
    /// With --fuzz: clusters per scenario file (one topology, one proxy start each).
    #[arg(long, default_value_t = 10, requires = "fuzz")]
    pub cases_per_file: usize,
}

/// Per attempt in a fuzzed replay: the namespaces are on one machine, and a DROP costs
/// a whole timeout.
const FUZZ_TIMEOUT_MS: &str = "500";

/// Names what the generated files hold, for reusing upstream's replay of them.
fn cases_digest(dir: &std::path::Path) -> anyhow::Result<String> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort();
    let mut hasher = DefaultHasher::new();
    for name in &names {
        std::fs::read(name)
            .with_context(|| name.display().to_string())?
            .hash(&mut hasher);
    }
    Ok(format!("{} files {:016x}", names.len(), hasher.finish()))
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
    let (out, dirs) = if args.fuzz {
        let out = workspace_root().join(format!(
            "target/fuzz/seed-{}-cases-{}-per-{}",
            args.seed, args.cases, args.cases_per_file
        ));
        let cases = out.join("cases");
        step(&format!(
            "generating {} random clusters (seed {}) in {}",
            args.cases,
            args.seed,
            cases.display()
        ));
        let _ = std::fs::remove_dir_all(&cases);
        crate::util::run_cmd(
            std::process::Command::new(&built.runner)
                .args(["fuzz-generate", "--seed", &args.seed.to_string()])
                .args(["--cases", &args.cases.to_string()])
                .args(["--cases-per-file", &args.cases_per_file.to_string()])
                .arg("--out")
                .arg(&cases),
        )?;
        (out, vec![cases])
    } else if args.dirs.is_empty() {
        (workspace_root().join("target/conformance"), default_dirs())
    } else {
        (
            workspace_root().join("target/conformance"),
            args.dirs.clone(),
        )
    };
    std::fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    let ours_file = out.join(format!("{}.jsonl", args.diff));
    let upstream_file = out.join(format!("upstream-{upstream}.jsonl"));
    let replay = |mode: &str, observations: &PathBuf, agent: bool| -> anyhow::Result<()> {
        // Observations are appended: a replay starts from none.
        let _ = std::fs::remove_file(observations);
        let mut command = std::process::Command::new(&built.runner);
        command.args(["run", "--mode", mode, "--api", "real", "--observations"]);
        command.arg(observations);
        if args.fuzz {
            command.args(["--timeout-ms", FUZZ_TIMEOUT_MS]);
        }
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
    let started = std::time::Instant::now();
    step(&format!("replaying in {} mode (ours)", args.diff));
    replay(&args.diff, &ours_file, true)?;
    println!("    took {:.0?}", started.elapsed());
    let started = std::time::Instant::now();
    step(&format!(
        "replaying in upstream-{upstream} (upstream's kube-proxy)"
    ));
    // Upstream's replay of the same random files serves every pair judged against it.
    let stamp = out.join(format!("upstream-{upstream}.cases"));
    let digest = if args.fuzz {
        Some(cases_digest(&dirs[0])?)
    } else {
        None
    };
    let fresh = digest.is_some()
        && std::fs::read_to_string(&stamp).ok() == digest
        && upstream_file.is_file();
    if fresh {
        println!("    reusing {} (the same files)", upstream_file.display());
    } else {
        let _ = std::fs::remove_file(&stamp);
        replay(&format!("upstream-{upstream}"), &upstream_file, false)?;
        println!("    took {:.0?}", started.elapsed());
        if let Some(digest) = &digest {
            std::fs::write(&stamp, digest).with_context(|| stamp.display().to_string())?;
        }
    }
    step(&format!(
        "comparing what each flow saw: {} against upstream-{upstream}",
        args.diff
    ));
    let mut diff = std::process::Command::new(&built.runner);
    diff.args(["diff", "--ours"])
        .arg(&ours_file)
        .arg("--upstream")
        .arg(&upstream_file)
        .args(["--ours-mode", &args.diff, "--upstream-mode", upstream])
        .current_dir(workspace_root());
    if args.fuzz {
        diff.arg("--cases-dir")
            .arg(&dirs[0])
            .arg("--repro-dir")
            .arg(out.join("found"));
    }
    let status = crate::util::status(&mut diff)?;
    std::process::exit(status.code().unwrap_or(1));
}
