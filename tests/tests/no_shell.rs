// SPDX-License-Identifier: Apache-2.0
//! No shell command is ever built from API-supplied strings. The agent starts three kinds of
//! external programs, by fixed name and with each argument its own argv entry, never through
//! a shell: `ipset` (ipvs mode, its input on stdin), `nft` (nftables mode, its transactions
//! on stdin) and the iptables commands (`iptables`,
//! `iptables-save`, `iptables-restore` and the ip6tables ones, names fixed when iptables is
//! detected: PATH's, or the `-legacy`/`-nft` ones of the backend the host's rules are in,
//! read with the fixed `*-save` commands of host_backend.rs), all through the netfilter
//! layer's one runner (`run_program`). Checked on the agent's sources: a new place that
//! starts a process, a new caller of the runner, or a shell, fails this test until it is
//! reviewed and listed here.

use std::{
    fs,
    path::{Path, PathBuf},
};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `Command::new(...)` of the agent that starts a process (clap's `Command` builds
/// the command line parser and is left out), as `file: argument`.
fn process_spawns(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        // Test modules (`tests/` folders, compiled under cfg(test) only) are not in the
        // binary; the nftables ones run `nft` in a private namespace.
        let relative = file.strip_prefix(src).unwrap();
        if relative.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        if !text.contains("process::") {
            continue;
        }
        let name = file.strip_prefix(src).unwrap().display().to_string();
        for (at, _) in text.match_indices("Command::new(") {
            let rest = &text[at + "Command::new(".len()..];
            let arg: String = rest.chars().take_while(|c| *c != ')').collect();
            out.push(format!("{name}: {}", arg.trim()));
        }
    }
    out
}

/// The first argument (the program) of every call of the netfilter runner, as
/// `file: argument`, sorted.
fn runner_calls(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(src).unwrap().display().to_string();
        for (at, _) in text.match_indices("run_program(") {
            // The definition (`fn run_program(`) is not a call.
            if text[..at].ends_with("fn ") {
                continue;
            }
            let rest = &text[at + "run_program(".len()..];
            let arg: String = rest.chars().take_while(|c| *c != ',').collect();
            out.push(format!("{name}: {}", arg.trim()));
        }
    }
    out.sort();
    out
}

#[test]
fn the_agent_starts_only_ipset_nft_and_iptables_and_never_a_shell() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proxy-agent/src");
    assert_eq!(process_spawns(&src), ["proxier/netfilter/exec.rs: program"]);
    // The runner's callers: ipset and nft by their fixed names, exec.rs's iptables commands, and
    // the iptables mode's counter reader (`iptables-save`/`ip6tables-save` by fixed name,
    // for kubeproxy_iptables_ct_state_invalid_dropped_packets_total).
    assert_eq!(
        runner_calls(&src),
        [
            "proxier/iptables/counters.rs: program",
            "proxier/ipvs/ipset.rs: \"ipset\"",
            "proxier/netfilter/exec.rs: &tools.iptables",
            "proxier/netfilter/exec.rs: &tools.restore",
            "proxier/netfilter/exec.rs: &tools.save",
            "proxier/netfilter/exec.rs: iptables",
            "proxier/netfilter/host_backend.rs: dump.program()",
            "proxier/nftables/transport.rs: \"nft\"",
        ]
    );
    // exec.rs's `tools` and `iptables` are the names fixed at detection: host_backend.rs's
    // constants (PATH's, or one backend's), and its dumps name fixed save commands.
    let exec = fs::read_to_string(src.join("proxier/netfilter/exec.rs")).unwrap();
    for fixed in [
        "save: format!(\"{prefix}-save\")",
        "restore: format!(\"{prefix}-restore\")",
    ] {
        assert!(exec.contains(fixed), "exec.rs no longer has {fixed}");
    }
    let host_backend = fs::read_to_string(src.join("proxier/netfilter/host_backend.rs")).unwrap();
    for fixed in [
        "let (iptables, ip6tables) = commands();",
        "pub const PATH_COMMANDS: (&str, &str) = (\"iptables\", \"ip6tables\");",
        "Variant::Legacy => Some((\"iptables-legacy\", \"ip6tables-legacy\")),",
        "Variant::Nft => Some((\"iptables-nft\", \"ip6tables-nft\")),",
        "pub fn program(self) -> &'static str {",
        "=> \"iptables-legacy-save\",",
    ] {
        assert!(
            host_backend.contains(fixed),
            "host_backend.rs no longer has {fixed}"
        );
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let named: usize = files
        .iter()
        .map(|f| {
            fs::read_to_string(f)
                .unwrap()
                .matches("detect_named(")
                .count()
        })
        .sum();
    assert_eq!(named, 2, "the agent names no iptables commands but PATH's");
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        for shell in ["\"/bin/sh\"", "\"sh\")", "\"bash\"", "\"-c\""] {
            assert!(
                !text.contains(shell),
                "{} mentions {shell}: the agent never runs a shell",
                file.display()
            );
        }
    }
}
