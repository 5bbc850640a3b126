// SPDX-License-Identifier: Apache-2.0
//! The list of upstream kube-proxy's flags the agent must accept
//! (proxy-agent/tests/data/upstream-kube-proxy-flags.txt, read by the agent's
//! `every_flag_of_upstream_kube_proxy_is_accepted`) is the --help of the kube-proxy the
//! testbed builds (`cargo xtask setup`): a flag upstream adds or drops fails here until the
//! list follows.

use std::process::Command;

use testbed::binaries::{Binaries, workspace_root};

/// `name type` per flag of a kube-proxy --help, as the list writes them.
fn flags_of_help(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let Some(rest) = trimmed
            .strip_prefix("-v, --")
            .or_else(|| trimmed.strip_prefix("--"))
        else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(name) = words.next() else { continue };
        if name == "help" {
            continue;
        }
        // The second column is the value's type, or the description of a bool flag.
        let kind = match words.next() {
            Some(word)
                if word.starts_with(|c: char| c.is_ascii_lowercase())
                    || ["LocalMode", "ProxyMode", "Level"].contains(&word) =>
            {
                word
            }
            _ => "bool",
        };
        out.push(format!("{name} {kind}"));
    }
    out
}

#[test]
fn the_committed_flag_list_is_upstreams_help() {
    let binaries = Binaries::locate()
        .unwrap_or_else(|e| panic!("upstream's binaries (cargo xtask setup builds them): {e}"));
    let output = Command::new(binaries.kube_proxy())
        .arg("--help")
        .output()
        .expect("running kube-proxy --help");
    let help = String::from_utf8_lossy(&output.stdout);
    let upstream = flags_of_help(&help);
    assert!(upstream.len() > 50, "{help}");
    let path = workspace_root().join("proxy-agent/tests/data/upstream-kube-proxy-flags.txt");
    let committed: Vec<String> = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(
        committed,
        upstream,
        "{} is not the --help of kube-proxy {}",
        path.display(),
        binaries.version()
    );
}
