// SPDX-License-Identifier: Apache-2.0
//! The kernel accepts the texts (root with `nft`, else skipped with a message): a few
//! thousand services of every kind pass `nft -c`, and for every scenario the first full
//! sync, the partial ones and the stale-chain deletions load into a private network
//! namespace (`unshare -n`, gone with the process) and leave the table a fresh full load
//! of the last state gives; a restarted agent's full sync over it changes nothing.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use super::golden::{all_scenarios, render};
use super::mixed_services;
use crate::model::IpFamily;
use crate::proxier::nftables::{DesiredState, NftContext};

/// Why these tests cannot run here, if they cannot.
pub(in crate::proxier::nftables) fn unavailable() -> Option<&'static str> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root");
    }
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !works("nft", &["--version"]) {
        return Some("needs the nft binary");
    }
    if !works("unshare", &["-n", "true"]) {
        return Some("needs unshare -n (network namespaces)");
    }
    None
}

/// Runs `script` (sh) in a private network namespace; its stdout, or a panic with stderr.
pub(in crate::proxier::nftables) fn in_private_netns(script: &str) -> String {
    let mut child = Command::new("unshare")
        .args(["-n", "sh", "-e", "-s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{script}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A scratch directory, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("nft-groundwork-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A listing's lines, sorted, without handles and trailing commas: what two tables
/// holding the same rules and elements have in common whatever their history.
fn normalized(listing: &str) -> Vec<String> {
    let mut lines: Vec<String> = listing
        .lines()
        .map(|l| l.trim().trim_end_matches(',').to_string())
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    lines
}

use crate::proxier::nftables::transport::family_keyword as family_word;

#[test]
fn nft_checks_thousands_of_services() {
    if let Some(why) = unavailable() {
        eprintln!("SKIP nftables kernel test: {why}");
        return;
    }
    let dir = Scratch::new("check");
    let node = super::node();
    for (family, v6) in [(IpFamily::V4, false), (IpFamily::V6, true)] {
        let cidrs = [if v6 { "fd00:100::/64" } else { "10.100.0.0/16" }
            .parse()
            .unwrap()];
        let ctx = NftContext::new(&node, family, &cidrs);
        let ports = mixed_services(3000, 4, v6);
        let desired =
            DesiredState::from_ports(ports.iter().map(|(n, s, e)| (n, s, e.as_slice())), &ctx);
        let file = write_file(dir.path(), "check.nft", &desired.cold_load(&ctx));
        in_private_netns(&format!("nft -c -f {file}\n"));
    }
}

#[test]
fn scenario_transactions_load_and_converge() {
    if let Some(why) = unavailable() {
        eprintln!("SKIP nftables kernel test: {why}");
        return;
    }
    let dir = Scratch::new("scenarios");
    for scenario in all_scenarios() {
        let rendered = render(&scenario);
        for (family, texts) in &rendered.steps {
            let word = family_word(*family);
            let list = format!("nft list table {word} kube-proxy\n");
            let mut stepwise = String::new();
            for (i, text) in texts.iter().enumerate() {
                let file = write_file(
                    dir.path(),
                    &format!("{}-{word}-{i}.nft", rendered.name),
                    text,
                );
                stepwise.push_str(&format!("nft -f {file}\n"));
            }
            let Some((_, fresh, restart)) = rendered.last_full.iter().find(|(f, _, _)| f == family)
            else {
                continue;
            };
            let fresh = write_file(
                dir.path(),
                &format!("{}-{word}-fresh.nft", rendered.name),
                fresh,
            );
            let restart = write_file(
                dir.path(),
                &format!("{}-{word}-restart.nft", rendered.name),
                restart,
            );
            let after_steps = in_private_netns(&format!("{stepwise}{list}"));
            let expected = in_private_netns(&format!("nft -f {fresh}\n{list}"));
            assert_eq!(
                normalized(&after_steps),
                normalized(&expected),
                "{} {word}: the partial transactions left another table than a full load",
                rendered.name
            );
            let restarted = in_private_netns(&format!("{stepwise}nft -f {restart}\n{list}"));
            assert_eq!(
                normalized(&restarted),
                normalized(&expected),
                "{} {word}: a restarted agent's full sync changed the table",
                rendered.name
            );
        }
    }
}
