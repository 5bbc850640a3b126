// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask scenarios --mode <ebpf|iptables|ipvs|nftables> [--dir DIR]... [--filter NAME]`:
//! builds the agent and the scenario runner, then replays the scenario files on this host,
//! or, for ipvs on a kernel without IPVS, inside the test VM (one boot for every file).
//! `--mode upstream-iptables|upstream-nftables` replays them against upstream's kube-proxy
//! instead (the one `cargo xtask setup` built), through upstream's API server.
//! The binaries are the ones cargo reports (wherever its target directory is), the runner
//! is given the agent's path, and a checkout or target directory the guest cannot see
//! (under its own /tmp, /run, ...) is refused before anything is built or booted.
//! The runner checks the mode the agent really runs (/proxyMode), so a fallback's results
//! are never reported as the requested mode's.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Deserialize;
use xtask::vm::{self, VmOptions};

use crate::{
    setup,
    util::{cargo, describe, step, workspace_root},
    vm_cmd,
};

#[derive(Args)]
pub struct ScenariosArgs {
    /// The dataplane mode the agent runs and the flows are judged in; `upstream-X` runs
    /// upstream's kube-proxy in mode X instead, and judges the flows as X.
    #[arg(long, value_parser = MODES)]
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
    /// Also ask `proxy-agent trace` about every flow; its answer must agree with what the
    /// probes saw (ebpf, iptables and nftables modes).
    #[arg(long)]
    pub trace_check: bool,
    /// Where the agent reads each file's objects from: `test` (the home-made test API
    /// server), `dir` (a manifest directory, --source) or `real` (upstream's kube-apiserver
    /// v1.37 with its EndpointSlice controller, started for the run; this host only).
    /// Default: `test`; `real` for an upstream mode, the only one it can use.
    #[arg(long, value_parser = ["test", "dir", "real"])]
    pub api: Option<String>,
}

/// The modes a replay can run: ours, and upstream kube-proxy's.
const MODES: [&str; 7] = [
    "ebpf",
    "iptables",
    "ipvs",
    "nftables",
    "upstream-iptables",
    "upstream-nftables",
    "upstream-ipvs",
];

impl ScenariosArgs {
    fn upstream(&self) -> bool {
        self.mode.starts_with("upstream-")
    }

    /// Where each file's objects come from (see [`ScenariosArgs::api`]).
    fn api(&self) -> &str {
        match &self.api {
            Some(api) => api,
            None if self.upstream() => "real",
            None => "test",
        }
    }
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
    let ipvs = args.mode == "ipvs" || args.mode == "upstream-ipvs";
    let ipvs_needs_vm = ipvs && args.expect_fallback.is_none() && !vm::host_kernel_has_ipvs();
    if !(args.vm || ipvs_needs_vm) {
        return Ok(false);
    }
    if args.upstream() {
        bail!(
            "{} needs IPVS, which this kernel lacks, and upstream's kube-proxy runs against \
             upstream's API server, which the test VM does not run yet",
            args.mode
        );
    }
    if args.api() == "real" {
        // The guest has no network device and no Go toolchain's binaries of its own.
        bail!("--api real runs on this host only; the test VM replays through the test API server");
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

/// The binaries a replay runs, where cargo really put them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub runner: PathBuf,
    pub agent: PathBuf,
}

/// The part of a cargo `--message-format=json` line this needs.
#[derive(Debug, Deserialize)]
struct CargoMessage {
    reason: String,
    #[serde(default)]
    target: Option<CargoTarget>,
    #[serde(default)]
    executable: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct CargoTarget {
    name: String,
}

/// The executables cargo reports building (or finding fresh) in its JSON messages, by
/// target name. Cargo knows its target directory (CARGO_TARGET_DIR, relative or not,
/// `build.target-dir` in any config file); guessing it here could point at stale or
/// missing binaries.
fn executables(messages: &str) -> BTreeMap<String, PathBuf> {
    messages
        .lines()
        // Only artifact lines: diagnostics are rendered to stderr, and this parser (YAML,
        // a superset of JSON) need not read anything else.
        .filter(|line| line.contains(r#""reason":"compiler-artifact""#))
        .filter_map(|line| serde_yaml::from_str::<CargoMessage>(line).ok())
        .filter(|m| m.reason == "compiler-artifact")
        .filter_map(|m| Some((m.target?.name, m.executable?)))
        .collect()
}

/// Builds the agent (eBPF object required) and the scenario runner; their paths, as cargo
/// reports them.
pub fn build_runner() -> anyhow::Result<Built> {
    setup::ensure_ready()?;
    step("building proxy-agent and scenario-runner (eBPF object required)");
    let mut build = cargo();
    build
        .args(["build", "-p", "proxy-agent", "-p", "tests"])
        .args(["--bin", "proxy-agent", "--bin", "scenario-runner"])
        .arg("--message-format=json-render-diagnostics")
        .env("PROXY_REQUIRE_EBPF", "1")
        .stdout(Stdio::piped());
    println!("    $ {}", describe(&build));
    let output = build
        .output()
        .with_context(|| format!("starting {}", describe(&build)))?;
    if !output.status.success() {
        bail!("command failed ({}): {}", output.status, describe(&build));
    }
    let built = executables(&String::from_utf8_lossy(&output.stdout));
    let path = |name: &str| -> anyhow::Result<PathBuf> {
        let path = built
            .get(name)
            .with_context(|| format!("cargo reported no {name} executable"))?;
        path.canonicalize()
            .with_context(|| format!("no {name} at {}", path.display()))
    };
    Ok(Built {
        runner: path("scenario-runner")?,
        agent: path("proxy-agent")?,
    })
}

/// Refuses paths the test VM cannot see (its own /tmp, /run, ...), naming the first.
fn check_seen_by_guest(paths: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (what, path) in paths {
        vm::check_visible_in_guest(what, path)
            .map_err(|why| anyhow::anyhow!("cannot run the scenarios in the test VM: {why}"))?;
    }
    Ok(())
}

pub fn run(args: &ScenariosArgs) -> anyhow::Result<()> {
    let guest = in_vm(args)?;
    let dirs: Vec<PathBuf> = if args.dirs.is_empty() {
        default_dirs()
    } else {
        args.dirs
            .iter()
            .map(|d| d.canonicalize().with_context(|| d.display().to_string()))
            .collect::<anyhow::Result<_>>()?
    };
    let ws = workspace_root();
    let mut seen_by_guest: Vec<(&str, &Path)> = vec![("the checkout", ws.as_path())];
    seen_by_guest.extend(dirs.iter().map(|d| ("the scenario directory", d.as_path())));
    if guest {
        // Before building: a checkout the guest cannot see is refused at once.
        check_seen_by_guest(&seen_by_guest)?;
    }
    let built = build_runner()?;
    if guest {
        check_seen_by_guest(&[
            ("the scenario runner", built.runner.as_path()),
            ("the agent", built.agent.as_path()),
        ])?;
    }
    let mut words = vec![
        built.runner.display().to_string(),
        "run".into(),
        "--mode".into(),
        args.mode.clone(),
    ];
    if !args.upstream() {
        words.extend(["--agent".into(), built.agent.display().to_string()]);
    }
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
    if args.trace_check {
        words.push("--trace-check".into());
    }
    words.extend(["--api".into(), args.api().to_string()]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_come_from_cargos_artifact_messages() {
        let messages = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"scenario-runner","src_path":"/w/tests/src/bin/scenario-runner.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":false},"features":[],"filenames":["/t/debug/scenario-runner"],"executable":"/t/debug/scenario-runner","fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests#0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"tests","src_path":"/w/tests/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":false},"features":[],"filenames":["/t/debug/libtests.rlib"],"executable":null,"fresh":true}
{"reason":"build-script-executed","package_id":"path+file:///w/proxy-agent#0.1.0","linked_libs":[],"linked_paths":[],"cfgs":[],"env":[],"out_dir":"/t/debug/build/proxy-agent-1/out"}
{"reason":"compiler-artifact","package_id":"path+file:///w/proxy-agent#0.1.0","manifest_path":"/w/proxy-agent/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"proxy-agent","src_path":"/w/proxy-agent/src/main.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":false},"features":[],"filenames":["/t/debug/proxy-agent"],"executable":"/t/debug/proxy-agent","fresh":false}
{"reason":"build-finished","success":true}
"#;
        let found = executables(messages);
        assert_eq!(
            found,
            BTreeMap::from([
                (
                    "proxy-agent".to_string(),
                    PathBuf::from("/t/debug/proxy-agent")
                ),
                (
                    "scenario-runner".to_string(),
                    PathBuf::from("/t/debug/scenario-runner")
                ),
            ])
        );
        assert!(executables("not json\n{\"reason\":\"compiler-artifact\"").is_empty());
    }

    #[test]
    fn a_checkout_the_guest_cannot_see_is_refused_before_building() {
        let err = check_seen_by_guest(&[
            ("the checkout", Path::new("/work/main")),
            (
                "the scenario runner",
                Path::new("/tmp/clone/target/debug/scenario-runner"),
            ),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "cannot run the scenarios in the test VM: the scenario runner \
                 /tmp/clone/target/debug/scenario-runner is under /tmp"
            ),
            "{err}"
        );
        assert!(check_seen_by_guest(&[("the checkout", Path::new("/work/main"))]).is_ok());
    }
}
