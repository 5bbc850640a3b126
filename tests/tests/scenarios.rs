// SPDX-License-Identifier: Apache-2.0
//! Every behaviour scenario (../shared/scenarios and tests/scenarios) replayed with real
//! packets by the scenario runner, once per dataplane mode this machine can run: one test
//! per (mode, file), failing with the runner's FAIL lines. Needs root; without it each test
//! is ignored with the reason. Which files each mode replays here is [`Files`]' choice (the
//! CI time budget); `cargo xtask scenarios --mode <mode>` replays every file. Beside them,
//! one differential fuzzing test per pair of our mode and upstream's ([`FUZZ_PAIRS`]).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use libtest_mimic::{Arguments, Failed, Trial};
use tests::scenario::{
    Scenario, ci_files, placement::Placement, real_api::refused_by_real_api,
    upstream_outcomes::UpstreamOutcomes,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn scenario_dirs() -> Vec<PathBuf> {
    let ws = workspace();
    [ws.join("../shared/scenarios"), ws.join("tests/scenarios")]
        .into_iter()
        .filter(|d| d.is_dir())
        .collect()
}

fn scenario_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = scenario_dirs()
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Which files a mode replays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Files {
    /// Every file of both directories.
    All,
    /// The files in which a netfilter mode's own rules decide something: every file but
    /// the IPv6 twins of our own files and the files the model decides alike for every mode
    /// ([`ci_files::MODEL_DECIDED`], and their twins). The twins of the shared files
    /// replay these modes' IPv6 rules (golden- and kernel-tested in their unit tests too);
    /// ebpf replays every file. The whole CI run must stay well under 45 minutes on 2
    /// cores; `cargo xtask scenarios --mode <mode>` replays all.
    ModeSpecific,
    /// Only files with a client outside the node (and the runner replays only those
    /// clients' flows): XDP sits on the uplink and sees nothing else, so the other flows
    /// would replay the plain ebpf run. Only the shared files (../shared/scenarios): XDP's
    /// IPv6 path and our own north-south cases are tested by tests/tests/privileged
    /// (bpf_test_run.rs, northsouth.rs with XDP generic); the whole CI run must stay well
    /// under 45 minutes on 2 cores, and `cargo xtask scenarios --xdp-mode generic` replays
    /// every file.
    SharedWithExternalClients,
    /// Every file of ../shared/scenarios: for a variant of a mode whose plain run replays
    /// every file (`scenario-runner run` with the variant's arguments replays them all:
    /// 4m20s for `--agent-arg=--socket-lb-host-namespace-only`, every flow passing).
    Shared,
    /// Only [`FALLBACK_FILES`] of ../shared/scenarios: the fallback agent runs the iptables
    /// proxier, whose outcomes the `iptables` trial already judges on every file; what this
    /// mode adds is the fallback itself.
    Fallback,
    /// Only the files with a flow in tests/upstream-outcomes.yaml, for upstream's
    /// kube-proxy: each listed flow is judged by its stated upstream outcome, so the list
    /// cannot go stale in CI; `cargo xtask scenarios --mode upstream-<mode>` replays every
    /// file (six minutes a mode here).
    UpstreamListed,
}

/// The shared files the ipvs fallback replays: every kind of service address (ClusterIP,
/// NodePort, externalIP, LB IP), REJECT, eTP=Local and session affinity, so that the agent
/// that fell back is seen programming each of them. The whole CI run must stay well under 45
/// minutes on 2 cores; `cargo xtask scenarios --mode ipvs` replays every file.
const FALLBACK_FILES: &[&str] = &[
    "a1-overall.yaml",
    "b1-no-endpoints-reject.yaml",
    "f1-etp-local.yaml",
    "k1-session-affinity.yaml",
];

/// Modes replayed on this host, as (test name, runner arguments, files). In ebpf,
/// iptables and nftables modes every flow is also asked of `proxy-agent trace`, whose
/// answer must agree with what the probes saw (`--trace-check`). ebpf mode reads its
/// objects from upstream's API server ([`api_args`]), the others from the test API server;
/// upstream's kube-proxy (`upstream-*`) replays the files with upstream outcomes listed
/// ([`Files::UpstreamListed`]). `ebpf-xdp` is ebpf mode with XDP generic on the uplink in
/// front of tc. `ebpf-socket-lb-host-only` is ebpf mode with socket-level load balancing
/// limited to the node's namespace (`--socket-lb-host-namespace-only`): pods' flows then take
/// the per-packet tc path, and must keep every outcome. ipvs needs a kernel with IPVS: where this one has none,
/// `ipvs-fallback` starts the agent in ipvs mode, requires that it fell back to iptables
/// (its /proxyMode) and judges the flows as iptables; the real ipvs runs are in the guest of
/// tests/tests/vm_guest.rs.
fn modes() -> Vec<(&'static str, &'static [&'static str], Files)> {
    let ipvs: (&str, &[&str], Files) = if xtask::vm::host_kernel_has_ipvs() {
        ("ipvs", &["--mode", "ipvs"], Files::All)
    } else {
        (
            "ipvs-fallback",
            &["--mode", "ipvs", "--expect-fallback", "iptables"],
            Files::Fallback,
        )
    };
    vec![
        ("ebpf", &["--mode", "ebpf", "--trace-check"], Files::All),
        (
            "ebpf-xdp",
            &[
                "--mode",
                "ebpf",
                "--xdp-mode",
                "generic",
                "--only-external-clients",
            ],
            Files::SharedWithExternalClients,
        ),
        (
            "ebpf-socket-lb-host-only",
            &[
                "--mode",
                "ebpf",
                "--agent-arg=--socket-lb-host-namespace-only",
            ],
            Files::Shared,
        ),
        (
            "iptables",
            &["--mode", "iptables", "--trace-check"],
            Files::ModeSpecific,
        ),
        (
            "nftables",
            &["--mode", "nftables", "--trace-check"],
            Files::ModeSpecific,
        ),
        ipvs,
        (
            "upstream-iptables",
            &["--mode", "upstream-iptables"],
            Files::UpstreamListed,
        ),
        (
            "upstream-nftables",
            &["--mode", "upstream-nftables"],
            Files::UpstreamListed,
        ),
    ]
}

/// Whether `file` is one `files` selects. A file that does not load is always selected, so
/// that the runner reports why.
fn selected(files: Files, file: &Path) -> bool {
    match files {
        Files::All => true,
        Files::Shared => is_shared(file),
        Files::ModeSpecific => !twin_of_an_own_file(file) && !ci_files::model_decided(file),
        Files::Fallback => {
            is_shared(file)
                && file
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| FALLBACK_FILES.contains(&n))
        }
        Files::UpstreamListed => {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            upstream_listed().iter().any(|listed| listed == name)
        }
        Files::SharedWithExternalClients if !is_shared(file) => false,
        Files::SharedWithExternalClients => match Scenario::load(file) {
            Ok(scenario) => Placement::plan(&scenario)
                .map(|placement| !placement.external_clients.is_empty())
                .unwrap_or(true),
            Err(_) => true,
        },
    }
}

/// The files tests/upstream-outcomes.yaml names (none if it does not load: its unit test
/// says why).
fn upstream_listed() -> Vec<String> {
    UpstreamOutcomes::load(&workspace())
        .map(|list| list.0.into_iter().map(|entry| entry.file).collect())
        .unwrap_or_default()
}

/// Whether `file` is one of ../shared/scenarios.
fn is_shared(file: &Path) -> bool {
    file.starts_with(workspace().join("../shared/scenarios"))
}

/// Whether `file` is the IPv6 twin (`v6-NAME`) of a file of tests/scenarios (not of a
/// shared one).
fn twin_of_an_own_file(file: &Path) -> bool {
    let own = workspace().join("tests/scenarios");
    file.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("v6-"))
        .is_some_and(|v4| {
            own.join(v4).is_file() && !workspace().join("../shared/scenarios").join(v4).is_file()
        })
}

/// How much of the runner's and agent's log a failure shows.
const AGENT_LOG_LINES: usize = 200;

/// Where a mode's replay of `file` takes its objects from: ebpf mode from upstream's API
/// server (the run's shared control plane, `KPE_CONTROL_PLANE`, or one the runner starts),
/// except for the files it refuses (`REFUSED_BY_REAL_API`, replayed through the test API
/// server); every other mode from the test API server.
fn api_args(mode: &str, file: &Path) -> &'static [&'static str] {
    match mode {
        "ebpf" if refused_by_real_api(file).is_none() => &["--api", "real"],
        upstream if upstream.starts_with("upstream-") => &["--api", "real"],
        _ => &["--api", "test"],
    }
}

fn run(mode_args: &[&str], api: &[&str], file: &Path) -> Result<(), Failed> {
    let dir = file.parent().unwrap_or(file);
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string();
    let out = Command::new(RUNNER)
        .arg("run")
        .args(mode_args)
        .args(api)
        .arg("--dir")
        .arg(dir)
        .args(["--filter", &format!("{name}.yaml")])
        .output()
        .map_err(|e| Failed::from(format!("starting the runner: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout.lines().last().unwrap_or_default().to_string();
    if out.status.success() {
        let skips: Vec<&str> = stdout.lines().filter(|l| l.starts_with("SKIP")).collect();
        if !skips.is_empty() {
            eprintln!("{}", skips.join("\n"));
        }
        return Ok(());
    }
    let fails: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL") || l.starts_with("ERROR"))
        .collect();
    // The failing flows come first and again after the agent's log, whose tail is what
    // a truncated CI report keeps.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log: Vec<&str> = stderr.lines().collect();
    let log_tail = &log[log.len().saturating_sub(AGENT_LOG_LINES)..];
    Err(Failed::from(format!(
        "{summary}\n{fails}\n--- runner and agent log (last {} of {} lines) ---\n{}\n--- failing flows ---\n{fails}\n{summary}",
        log_tail.len(),
        log.len(),
        log_tail.join("\n"),
        fails = fails.join("\n"),
    )))
}

/// The differential fuzzing CI runs: a fixed seed (so a run judges the same clusters as the
/// one before it), each pair on its own; `cargo xtask conformance --diff MODE --fuzz
/// --cases N --seed S` runs more.
const FUZZ_SEED: u64 = 1;
const FUZZ_CASES: usize = 10;

/// Our mode and upstream's mode it is judged against, per fuzzing trial.
const FUZZ_PAIRS: &[(&str, &str)] = &[
    ("iptables", "iptables"),
    ("nftables", "nftables"),
    ("ebpf", "nftables"),
];

/// Replays [`FUZZ_CASES`] random clusters through our `ours` mode and upstream's
/// `upstream` mode (both through upstream's API server) and fails on any undocumented
/// difference, naming the scenario files that reproduce each.
fn fuzz(ours: &str, upstream: &str) -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("kpe-fuzz-{ours}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cases = dir.join("cases");
    let runner = |args: &[&std::ffi::OsStr]| -> Result<(bool, String, String), Failed> {
        let out = Command::new(RUNNER)
            .args(args)
            .output()
            .map_err(|e| Failed::from(format!("starting the runner: {e}")))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    let (ok, _, err) = runner(&[
        &os("fuzz-generate"),
        &os("--seed"),
        &os(&FUZZ_SEED.to_string()),
        &os("--cases"),
        &os(&FUZZ_CASES.to_string()),
        &os("--out"),
        cases.as_os_str(),
    ])?;
    if !ok {
        return Err(format!("generating the cases: {err}").into());
    }
    let mut replays = Vec::new();
    for (mode, name) in [
        (ours.to_string(), "ours.jsonl"),
        (format!("upstream-{upstream}"), "upstream.jsonl"),
    ] {
        let observations = dir.join(name);
        let (_, stdout, stderr) = runner(&[
            &os("run"),
            &os("--mode"),
            &os(&mode),
            &os("--api"),
            &os("real"),
            &os("--timeout-ms"),
            &os("500"),
            &os("--dir"),
            cases.as_os_str(),
            &os("--observations"),
            observations.as_os_str(),
        ])?;
        // The runner's own verdicts do not matter here (the fuzzed expectations only bound
        // random choices); a replay that set nothing up does.
        if !observations.is_file() {
            let tail: Vec<&str> = stderr.lines().rev().take(AGENT_LOG_LINES).collect();
            return Err(format!(
                "{mode} observed nothing: {}\n{}",
                stdout.lines().last().unwrap_or_default(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
            .into());
        }
        replays.push(observations);
    }
    let found = dir.join("found");
    let (ok, stdout, stderr) = runner(&[
        &os("diff"),
        &os("--ours"),
        replays[0].as_os_str(),
        &os("--upstream"),
        replays[1].as_os_str(),
        &os("--ours-mode"),
        &os(ours),
        &os("--upstream-mode"),
        &os(upstream),
        &os("--cases-dir"),
        cases.as_os_str(),
        &os("--repro-dir"),
        found.as_os_str(),
    ])?;
    if ok {
        println!("{}", stdout.lines().last().unwrap_or_default());
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    Err(format!(
        "{stdout}{stderr}(cases, replays and reproducing files kept in {})",
        dir.display()
    )
    .into())
}

fn main() {
    let args = Arguments::from_args();
    let root = nix::unistd::Uid::effective().is_root();
    let mut trials = Vec::new();
    for &(ours, upstream) in FUZZ_PAIRS {
        let name = format!("fuzz::{ours}-vs-upstream-{upstream}");
        trials.push(Trial::test(name, move || fuzz(ours, upstream)).with_ignored_flag(!root));
    }
    for (mode, mode_args, files) in modes() {
        for file in scenario_files().into_iter().filter(|f| selected(files, f)) {
            let stem = file
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let name = format!("{mode}::{stem}");
            let api = api_args(mode, &file);
            let trial =
                Trial::test(name, move || run(mode_args, api, &file)).with_ignored_flag(!root);
            trials.push(trial);
        }
    }
    if !root {
        eprintln!("scenario tests need root (run `cargo xtask test` as root): ignored");
    }
    libtest_mimic::run(&args, trials).exit();
}
