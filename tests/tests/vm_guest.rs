// SPDX-License-Identifier: Apache-2.0
//! Tests that boot the throw-away qemu guest of `cargo xtask vm` (a kernel with IPVS; this
//! host's kernel may have none):
//! - `guest::boots_with_ipvs_and_runs_host_binaries`: one cheap boot proving the machinery
//!   (the guest's own kernel, ip_vs loads and ipvsadm programs it, a host-built binary
//!   runs, writes stay in the guest, the exit status comes back).
//! - `guest::ipvs_scenarios`: ONE boot for all ipvs work: the scenario runner in ipvs mode
//!   over [`GUEST_SHARED_FILES`] and the main IPv6 variants ([`IPV6_FILES`]), then the
//!   privileged ipvs_kernel test binary, and the ipvs tests of the agent_restart,
//!   drift_repair and mode_switch_cleanup modules of the privileged binary
//!   ([`GUEST_TEST_BINARIES`]), each when
//!   built. Fails with the runner's FAIL lines and the failing binaries' output (a skipped
//!   ipvs test fails: the guest has IPVS). Skipped with the reason when this host runs ipvs itself
//!   (tests/tests/scenarios.rs and those binaries then do), or the agent has no ipvs
//!   proxier yet.
//! - `guest::sctp_scenarios`: ONE boot replaying the SCTP flows (`--only-proto sctp`; the
//!   host replays the rest) of every scenario file that has one (shared and own, but
//!   [`ci_files::MODEL_DECIDED`]) in ebpf mode (XDP off, and XDP generic for the files with
//!   a client outside the node), where this host's kernel cannot make SCTP sockets and
//!   the host replay reports those flows SKIP.
//!   Every flow must PASS; a SKIP in the guest fails. It also proves the eBPF programs load
//!   on an older kernel (Debian 12's 6.1), whose verifier is stricter about stack size.
//!
//! - `guest::ebpf_cleanup`: ONE boot running the privileged `ebpf_cleanup` test (issue 18's
//!   rollback acceptance) on Debian's 6.1, a kernel without TCX: tc programs attach as
//!   netlink filters there, which `--cleanup` and a switch to iptables mode must remove
//!   (`tc filter show`, `ip -d link` (XDP), the NodePort no longer translated by them). The
//!   host runs the same test on its own kernel (TCX), where only planted netlink
//!   attachments exercise that path. A test that skips in the guest fails.
//!
//! A host that cannot boot the guest (qemu, kernel or busybox-static missing: `cargo xtask
//! setup` installs them) skips both with the reason.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use libtest_mimic::{Arguments, Failed, Trial};
use tests::scenario::{
    ci_files,
    echo::sctp_supported,
    format::{Proto, Scenario},
    placement::Placement,
};
use xtask::vm::{self, VmOptions, VmOutcome, shell_quote};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

/// How long the guest's scenario-runner invocations may run: far above what they take
/// (ipvs: about 4 min here; SCTP: about 1 min per mode; CI's machine takes 2.4 times as
/// long). A run past its limit is hung and stops with a report of where (see [`bounded`]).
const IPVS_RUNNER_LIMIT: Duration = Duration::from_secs(15 * 60);
const SCTP_RUNNER_LIMIT: Duration = Duration::from_secs(8 * 60);

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// A results directory shared with the guest, fresh for this test.
fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vm-guest-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn read(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn boot(script: &str, out: &Path, timeout: Duration) -> Result<VmOutcome, Failed> {
    let options = VmOptions {
        out_dir: Some(out.to_path_buf()),
        cwd: workspace(),
        timeout,
        echo_console: false,
        ..VmOptions::default()
    };
    vm::run_script(script, &options).map_err(|e| Failed::from(e.to_string()))
}

fn boots_with_ipvs_and_runs_host_binaries() -> Result<(), Failed> {
    let pre = vm::prerequisites().map_err(Failed::from)?;
    let out = out_dir("smoke");
    // Written in the guest outside the results directory: must never reach the host.
    let stray = PathBuf::from(format!("/etc/vm-guest-stray-{}", std::process::id()));
    let script = format!(
        r#"set -e
o={out}
uname -r > $o/uname
cat /proc/mounts > $o/mounts
modprobe -a ip_vs ip_vs_rr
ipvsadm -A -t 10.96.0.10:80 -s rr
ipvsadm -a -t 10.96.0.10:80 -r 10.0.0.2:8080 -m
ipvsadm -a -t 10.96.0.10:80 -r 10.0.0.3:8080 -m
ipvsadm -Ln > $o/ipvsadm
{runner} probe --from 127.0.0.1 --to 127.0.0.1:9 --proto tcp > $o/probe
echo written-in-the-guest > {stray}
cat {stray} > $o/stray
exit 42
"#,
        out = shell_quote(&out.display().to_string()),
        runner = shell_quote(RUNNER),
        stray = stray.display(),
    );
    let outcome = boot(&script, &out, Duration::from_secs(300))?;
    let console = &outcome.console;
    eprintln!(
        "guest ran for {:.1} s (boot included)",
        outcome.elapsed.as_secs_f64()
    );
    assert_eq!(outcome.status, 42, "exit status; console:\n{console}");

    let host_release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest_release = read(&out, "uname");
    assert_eq!(guest_release.trim(), pre.kernel.release);
    assert_ne!(guest_release.trim(), host_release.trim(), "not our kernel");

    let mounts = read(&out, "mounts");
    for (fs_type, point) in [
        ("cgroup2", "/sys/fs/cgroup"),
        ("bpf", "/sys/fs/bpf"),
        ("tmpfs", "/tmp"),
        ("overlay", "/"),
    ] {
        assert!(
            mounts.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.get(1) == Some(&point) && f.get(2) == Some(&fs_type)
            }),
            "{fs_type} at {point} in the guest:\n{mounts}"
        );
    }

    // The guest kernel's IPVS table, as ipvsadm lists it.
    let table = read(&out, "ipvsadm");
    let service = table
        .lines()
        .position(|l| l.split_whitespace().collect::<Vec<_>>() == ["TCP", "10.96.0.10:80", "rr"])
        .unwrap_or_else(|| panic!("virtual server missing:\n{table}"));
    let real: Vec<&str> = table.lines().skip(service + 1).take(2).collect();
    for backend in ["10.0.0.2:8080", "10.0.0.3:8080"] {
        assert!(
            real.iter()
                .any(|l| l.contains(backend) && l.contains("Masq")),
            "real server {backend}:\n{table}"
        );
    }

    // The host-built runner ran in the guest, over the guest's loopback.
    let probe: serde_json::Value = serde_json::from_str(read(&out, "probe").trim())
        .unwrap_or_else(|e| panic!("probe output: {e}; console:\n{console}"));
    assert_eq!(probe["outcome"], "refused");

    assert_eq!(read(&out, "stray").trim(), "written-in-the-guest");
    assert!(!stray.exists(), "{} leaked to the host", stray.display());
    let _ = fs::remove_dir_all(&out);
    Ok(())
}

/// Whether the agent has an ipvs proxier to test (until it lands, the agent falls back or
/// cannot program IPVS, and the guest scenarios would only say so).
fn ipvs_proxier_reason() -> Option<String> {
    let dir = workspace().join("proxy-agent/src/proxier/ipvs");
    (!dir.is_dir()).then(|| {
        format!(
            "the agent has no ipvs proxier yet ({} missing)",
            dir.display()
        )
    })
}

/// The newest build of the ipvs_kernel test binary beside this one, if any.
fn ipvs_kernel_binary() -> Option<PathBuf> {
    test_binary("ipvs_kernel")
}

/// The tests (beside ipvs_kernel) the guest runs, as (name of their log, test binary,
/// filter selecting them): they skip on a host without IPVS.
const GUEST_TEST_BINARIES: &[(&str, &str, &str)] = &[
    ("agent_restart", "privileged", "agent_restart::ipvs_"),
    ("drift_repair", "privileged", "drift_repair::ipvs_"),
    // ipvs -> nftables -> ipvs: each start removes the other mode's state (issue 17).
    (
        "mode_switch_cleanup",
        "privileged",
        "mode_switch_cleanup::ipvs_",
    ),
];

/// The newest build of test binary `name` beside this one, if any.
fn test_binary(name: &str) -> Option<PathBuf> {
    let deps = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let prefix = format!("{name}-");
    fs::read_dir(deps)
        .ok()?
        .flatten()
        .filter(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            file.strip_prefix(&prefix)
                .is_some_and(|hash| hash.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, path)| path)
}

/// The shared files the CI guest replays in ipvs mode: each costs 15-50 s under emulation
/// (against 2-4 s on the host) and the whole CI run must stay well under 45 minutes on 2
/// cores. Together they program every kind of ipvs virtual server once: ClusterIP,
/// NodePort, externalIPs and LB IPs (a1), REJECT (b1), source ranges (d1), eTP=Local (f1)
/// and persistence (k1); the rest vary the model's choice of endpoints or the addresses of
/// the same paths, and the guest's ipvs_kernel tests program them on the kernel too.
/// `cargo xtask scenarios --mode ipvs` replays every file.
const GUEST_SHARED_FILES: &[&str] = &[
    "a1-overall.yaml",
    "b1-no-endpoints-reject.yaml",
    "d1-loadbalancer-source-ranges.yaml",
    "f1-etp-local.yaml",
    "k1-session-affinity.yaml",
];

/// The IPv6 variant (tests/scenarios) the CI guest replays besides [`GUEST_SHARED_FILES`]:
/// the ipvs paths IPv6 adds (ClusterIP, NodePort, externalIPs and LB IPs in one file).
const IPV6_FILES: &[&str] = &["v6-a1-overall.yaml"];

/// The shared scenario files the CI guest replays in ipvs mode, sorted (a missing one
/// fails the replay).
fn guest_shared_files() -> Vec<PathBuf> {
    let Ok(dir) = workspace().join("../shared/scenarios").canonicalize() else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = GUEST_SHARED_FILES
        .iter()
        .map(|name| dir.join(name))
        .collect();
    files.sort();
    files
}

/// Shell lines running `command` in the guest with its stdout in `$o/NAME.log`, its stderr
/// in `$o/NAME.err` and its exit status in `$o/NAME.rc`, stopped after `limit`. A run still
/// going then leaves in `$o/NAME.hang` what every user process of the guest was waiting in
/// (its command line; each thread's state, wait channel and kernel stack) and the tail of
/// each log under the runner's directory, so that one occurrence of a hang shows its cause
/// instead of ending as a silent boot timeout.
fn bounded(command: &str, name: &str, limit: Duration) -> String {
    let limit = limit.as_secs();
    format!(
        r#"{command} > $o/{name}.log 2> $o/{name}.err &
pid=$!
waited=0
while kill -0 $pid 2>/dev/null && [ $waited -lt {limit} ]; do sleep 2; waited=$((waited + 2)); done
if kill -0 $pid 2>/dev/null; then
  {{
    echo "{name}: still running after {limit} s"
    for p in /proc/[0-9]*; do
      cmd=$(tr '\0' ' ' < $p/cmdline 2>/dev/null)
      [ -n "$cmd" ] || continue
      echo "== ${{p#/proc/}} $cmd"
      for t in $p/task/*; do
        echo "-- thread ${{t##*/}} state $(cut -d' ' -f3 $t/stat 2>/dev/null) wchan $(cat $t/wchan 2>/dev/null)"
        cat $t/stack 2>/dev/null
      done
    done
    for f in $(find /tmp/scenario-runner -name '*.log' 2>/dev/null); do
      echo "== tail of $f"; tail -n 40 "$f"
    done
  }} > $o/{name}.hang 2>&1
  kill -TERM $pid; sleep 20; kill -KILL $pid 2>/dev/null
fi
wait $pid; echo $? > $o/{name}.rc
"#
    )
}

/// What the guest runs for `ipvs_scenarios`; every part leaves its exit status and output
/// in the results directory. `other_tests`: (name, binary, filter) of [`GUEST_TEST_BINARIES`].
fn ipvs_script(
    out: &Path,
    kernel_tests: Option<&Path>,
    other_tests: &[(&str, PathBuf, &str)],
) -> String {
    let o = shell_quote(&out.display().to_string());
    let mut script = format!("o={o}\n");
    let mut runner = vec![
        RUNNER.to_string(),
        "run".into(),
        "--mode".into(),
        "ipvs".into(),
        "--ready-timeout-s".into(),
        "90".into(),
    ];
    for file in guest_shared_files() {
        runner.extend(["--file".into(), file.display().to_string()]);
    }
    let own = workspace().join("tests/scenarios");
    for file in IPV6_FILES {
        if own.join(file).is_file() {
            runner.extend(["--file".into(), own.join(file).display().to_string()]);
        }
    }
    script.push_str(&bounded(
        &vm::shell_words(&runner),
        "scenarios",
        IPVS_RUNNER_LIMIT,
    ));
    if let Some(binary) = kernel_tests {
        script.push_str(&format!(
            "{} --test-threads=1 > $o/ipvs_kernel.log 2>&1; echo $? > $o/ipvs_kernel.rc\n",
            shell_quote(&binary.display().to_string())
        ));
    }
    for (name, binary, filter) in other_tests {
        script.push_str(&format!(
            "{} {} --test-threads=1 > $o/{name}.log 2>&1; echo $? > $o/{name}.rc\n",
            shell_quote(&binary.display().to_string()),
            shell_quote(filter)
        ));
    }
    script
}

/// Why the guest's run of test binary `name` (its log and exit status in `out`) failed,
/// if it did: a nonzero exit, or a test that skipped (the guest has what it needs) or
/// never ran.
fn guest_test_problem(out: &Path, name: &str, binary: &Path) -> Option<String> {
    let log = read(out, &format!("{name}.log"));
    let result = log
        .lines()
        .rev()
        .find(|l| l.contains("test result"))
        .unwrap_or_default();
    let why = if read(out, &format!("{name}.rc")).trim() != "0" {
        "failed"
    } else if log.lines().any(|l| l.starts_with("SKIP")) {
        "skipped a test"
    } else if result.is_empty() || result.contains(" 0 passed") {
        "ran no test"
    } else {
        eprintln!("{name} in the guest: {result}");
        return None;
    };
    Some(format!("{} in the guest {why}:\n{log}", binary.display()))
}

fn ipvs_scenarios() -> Result<(), Failed> {
    let kernel_tests = ipvs_kernel_binary();
    let other_tests: Vec<(&str, PathBuf, &str)> = GUEST_TEST_BINARIES
        .iter()
        .filter_map(|(name, target, filter)| match test_binary(target) {
            Some(binary) => Some((*name, binary, *filter)),
            None => {
                eprintln!(
                    "{target} is not built: the ipvs tests of {name} do not run in the guest"
                );
                None
            }
        })
        .collect();
    let out = out_dir("ipvs");
    let script = ipvs_script(&out, kernel_tests.as_deref(), &other_tests);
    let outcome = boot(&script, &out, Duration::from_secs(40 * 60))?;
    eprintln!(
        "guest ran for {:.1} s (boot included)",
        outcome.elapsed.as_secs_f64()
    );
    let mut problems = Vec::new();
    let log = read(&out, "scenarios.log");
    let summary = log.lines().last().unwrap_or_default().to_string();
    eprintln!("ipvs scenarios in the guest: {summary}");
    if read(&out, "scenarios.rc").trim() != "0" {
        let fails: Vec<&str> = log.lines().filter(|l| l.starts_with("FAIL")).collect();
        problems.push(format!(
            "scenario-runner --mode ipvs in the guest: {summary}\n{}\n{}\n{}",
            fails.join("\n"),
            read(&out, "scenarios.err"),
            read(&out, "scenarios.hang")
        ));
    }
    if let Some(binary) = &kernel_tests {
        let log = read(&out, "ipvs_kernel.log");
        if read(&out, "ipvs_kernel.rc").trim() != "0" {
            problems.push(format!("{} in the guest failed:\n{log}", binary.display()));
        } else {
            eprintln!(
                "ipvs_kernel in the guest: {}",
                log.lines()
                    .rev()
                    .find(|l| l.contains("test result"))
                    .unwrap_or("passed")
            );
        }
    }
    for (name, binary, _) in &other_tests {
        problems.extend(guest_test_problem(&out, name, binary));
    }
    let _ = fs::remove_dir_all(&out);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Failed::from(problems.join("\n\n")))
    }
}

/// The privileged test that `ebpf_cleanup` runs in the guest.
const CLEANUP_TEST: (&str, &str, &str) = (
    "ebpf_cleanup",
    "privileged",
    "ebpf_cleanup::cleanup_and_a_switch_to_iptables_leave_no_tc_filter_or_xdp",
);

/// Runs the rollback acceptance on the guest's kernel (no TCX: netlink tc filters).
fn ebpf_cleanup() -> Result<(), Failed> {
    let (name, target, filter) = CLEANUP_TEST;
    let binary = test_binary(target)
        .ok_or_else(|| Failed::from(format!("the {target} test binary is not built")))?;
    let out = out_dir(name);
    let o = shell_quote(&out.display().to_string());
    let script = format!(
        "o={o}\nuname -r > $o/uname\n{} {} --exact --test-threads=1 > $o/{name}.log 2>&1; echo $? > $o/{name}.rc\n",
        shell_quote(&binary.display().to_string()),
        shell_quote(filter),
    );
    let outcome = boot(&script, &out, Duration::from_secs(10 * 60))?;
    eprintln!(
        "guest ran for {:.1} s (boot included) on {}",
        outcome.elapsed.as_secs_f64(),
        read(&out, "uname").trim()
    );
    let problem = guest_test_problem(&out, name, &binary);
    let _ = fs::remove_dir_all(&out);
    match problem {
        None => Ok(()),
        Some(problem) => Err(Failed::from(problem)),
    }
}

/// Scenario files (shared, then own) with at least one SCTP flow, as (file, whether one
/// comes from a client outside the node), but [`ci_files::MODEL_DECIDED`]: no mode
/// programs their SCTP ports either (headless), and each file costs 10-30 s a mode under
/// emulation.
fn sctp_scenario_files() -> Vec<(PathBuf, bool)> {
    let ws = workspace();
    let mut files = Vec::new();
    for dir in [ws.join("../shared/scenarios"), ws.join("tests/scenarios")] {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        let mut found: Vec<(PathBuf, bool)> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .filter(|p| !ci_files::model_decided(p))
            .filter_map(|p| {
                let scenario = Scenario::load(&p).ok()?;
                let outside = Placement::plan(&scenario)
                    .map(|placement| placement.external_clients)
                    .unwrap_or_default();
                let mut sctp = scenario
                    .flows()
                    .filter(|f| f.proto == Proto::Sctp)
                    .peekable();
                sctp.peek()?;
                let from_outside = sctp.any(|f| outside.contains(&f.from));
                Some((p, from_outside))
            })
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// The modes `sctp_scenarios` replays, as (name, runner arguments, whether it replays only
/// files with an SCTP client outside the node): the programs, whose SCTP paths (no socket
/// hook, CRC32c instead of a checksum) are our code. ebpf-xdp replays only flows from
/// outside (XDP sees nothing else). The netfilter modes' SCTP rules differ from their TCP
/// ones only in the protocol they match (golden-tested); each mode costs 60-150 s here, and
/// `scenario-runner run --mode iptables --only-proto sctp` under `cargo xtask vm` replays them.
const SCTP_MODES: &[(&str, &[&str], bool)] = &[
    ("ebpf", &["--mode", "ebpf", "--trace-check"], false),
    (
        "ebpf-xdp",
        &[
            "--mode",
            "ebpf",
            "--xdp-mode",
            "generic",
            "--only-external-clients",
        ],
        true,
    ),
];

fn sctp_script(out: &Path, files: &[(PathBuf, bool)]) -> String {
    let o = shell_quote(&out.display().to_string());
    // Loaded up front so that a missing module shows as such, not as SKIPped flows.
    let mut script = format!("o={o}\nmodprobe sctp > $o/modprobe.log 2>&1\n");
    for (name, args, only_from_outside) in SCTP_MODES {
        let mut runner = vec![RUNNER.to_string(), "run".into()];
        runner.extend(args.iter().map(|a| a.to_string()));
        // The host replays every other flow of these files: the guest only those it cannot.
        runner.extend([
            "--ready-timeout-s".into(),
            "90".into(),
            "--only-proto".into(),
            "sctp".into(),
        ]);
        for (file, _) in files
            .iter()
            .filter(|(_, from_outside)| *from_outside || !only_from_outside)
        {
            runner.extend(["--file".into(), file.display().to_string()]);
        }
        script.push_str(&bounded(&vm::shell_words(&runner), name, SCTP_RUNNER_LIMIT));
    }
    script
}

fn sctp_scenarios() -> Result<(), Failed> {
    let files = sctp_scenario_files();
    if files.is_empty() {
        return Err("no scenario file has an SCTP flow: nothing for this test to show".into());
    }
    let out = out_dir("sctp");
    // Every mode's run is bounded: what boot and modprobe take comes on top.
    let limit = SCTP_RUNNER_LIMIT * SCTP_MODES.len() as u32 + Duration::from_secs(4 * 60);
    let outcome = boot(&sctp_script(&out, &files), &out, limit)?;
    eprintln!(
        "guest ran for {:.1} s (boot included), {} files",
        outcome.elapsed.as_secs_f64(),
        files.len()
    );
    let mut problems = Vec::new();
    for (name, _, _) in SCTP_MODES {
        let log = read(&out, &format!("{name}.log"));
        let summary = log.lines().last().unwrap_or_default().to_string();
        let sctp_passed = log
            .lines()
            .filter(|l| l.starts_with("PASS") && l.contains("/sctp:"))
            .count();
        eprintln!("{name} in the guest: {summary}; SCTP flows passed: {sctp_passed}");
        let not_passed: Vec<&str> = log
            .lines()
            .filter(|l| l.starts_with("FAIL") || l.starts_with("SKIP"))
            .collect();
        if read(&out, &format!("{name}.rc")).trim() != "0" || !not_passed.is_empty() {
            problems.push(format!(
                "scenario-runner {name} in the guest: {summary}\n{}\n{}\nmodprobe sctp: {}\n{}",
                not_passed.join("\n"),
                read(&out, &format!("{name}.err")),
                read(&out, "modprobe.log"),
                read(&out, &format!("{name}.hang"))
            ));
        } else if sctp_passed == 0 {
            problems.push(format!("{name}: no SCTP flow passed in the guest:\n{log}"));
        }
    }
    let _ = fs::remove_dir_all(&out);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Failed::from(problems.join("\n\n")))
    }
}

fn main() {
    let args = Arguments::from_args();
    let unavailable = vm::prerequisites().err();
    let ipvs_skip = if vm::host_kernel_has_ipvs() {
        Some("this host's kernel has IPVS: tests/tests/scenarios.rs runs ipvs mode here".into())
    } else {
        unavailable.clone().or_else(ipvs_proxier_reason)
    };
    if let Some(why) = &unavailable {
        eprintln!("guest tests skipped: {why}");
    }
    if let Some(why) = &ipvs_skip {
        eprintln!("guest::ipvs_scenarios skipped: {why}");
    }
    let sctp_skip = if sctp_supported() {
        Some("this host's kernel makes SCTP sockets: tests/tests/scenarios.rs replays them".into())
    } else {
        unavailable.clone()
    };
    if let Some(why) = &sctp_skip {
        eprintln!("guest::sctp_scenarios skipped: {why}");
    }
    let trials = vec![
        Trial::test(
            "guest::boots_with_ipvs_and_runs_host_binaries",
            boots_with_ipvs_and_runs_host_binaries,
        )
        .with_ignored_flag(unavailable.is_some()),
        Trial::test("guest::ipvs_scenarios", ipvs_scenarios).with_ignored_flag(ipvs_skip.is_some()),
        Trial::test("guest::sctp_scenarios", sctp_scenarios).with_ignored_flag(sctp_skip.is_some()),
        Trial::test("guest::ebpf_cleanup", ebpf_cleanup).with_ignored_flag(unavailable.is_some()),
    ];
    libtest_mimic::run(&args, trials).exit();
}
