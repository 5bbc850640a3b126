// SPDX-License-Identifier: Apache-2.0
//! The kernel's tools accept the shapes (root only): the full texts and each partial text
//! load into a fresh namespace, and after the partials the namespace holds what a full
//! load of the final services holds.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
};

use ::tests::scenario::netns::{self, Place};

use crate::net;

use super::*;

/// Runs `program args` in namespace `ns` with `input` on stdin; its stdout, or a panic
/// with its stderr.
fn run_in(ns: &str, program: &str, args: &[&str], input: &str) -> String {
    let place = Place {
        netns: ns.to_string(),
        cgroup: None,
    };
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut cmd: Command = place.command(Path::new(program), &args);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{program} {args:?}: {stderr}\ninput:\n{input}"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A dump's lines, sorted, without counters, comments and the generated-by lines: what
/// two namespaces holding the same rules have in common.
fn normalized(dump: &str) -> Vec<String> {
    let mut lines: Vec<String> = dump
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            if let Some(chain) = l.strip_prefix(':') {
                chain.split(' ').next().unwrap_or("").to_string()
            } else {
                l.trim().to_string()
            }
        })
        .collect();
    lines.sort();
    lines
}

/// Namespaces named after a run id, deleted on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = netns::delete_netns(ns);
        }
    }
}

#[test]
fn tools_accept_full_and_partial_texts() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP shaped rules load test: needs root");
        return;
    }
    let id = net::new_run_id();
    let names = Namespaces(vec![format!("{id}-step"), format!("{id}-full")]);
    for ns in &names.0 {
        netns::add_netns(ns).unwrap();
    }
    let (step, full) = (&names.0[0], &names.0[1]);
    let opts = ShapedOptions {
        cluster_cidr: Some("10.0.0.0/8".parse().unwrap()),
    };
    let s0 = fillers(10, 4);
    let extra = ShapedService {
        namespace: "ns".into(),
        name: "added".into(),
        port_name: String::new(),
        cluster_ip: "10.99.0.1".parse().unwrap(),
        port: 443,
        endpoints: vec!["10.98.0.1:8443".parse().unwrap()],
    };
    let s1 = Change::AddService(extra).apply(&s0);
    let s2 = Change::RemoveEndpoint { service: 4 }.apply(&s1);
    let s3 = Change::ScaleTo {
        service: 2,
        endpoints: 40,
    }
    .apply(&s2);
    let s4 = s3[1..].to_vec();
    let steps = [&s0, &s1, &s2, &s3, &s4];

    let restore = "iptables-legacy-restore";
    let save = |ns: &str| run_in(ns, "iptables-legacy-save", &["-t", "nat"], "");
    run_in(step, restore, &["--noflush"], &iptables_full(&s0, &opts));
    for pair in steps.windows(2) {
        run_in(
            step,
            restore,
            &["--noflush"],
            &iptables_partial(pair[0], pair[1], &opts),
        );
    }
    run_in(full, restore, &["--noflush"], &iptables_full(&s4, &opts));
    assert_eq!(normalized(&save(step)), normalized(&save(full)));

    let list = |ns: &str| run_in(ns, "nft", &["list", "table", "ip", "kube-proxy"], "");
    run_in(step, "nft", &["-f", "-"], &nft_full(&s0, &opts));
    for pair in steps.windows(2) {
        run_in(
            step,
            "nft",
            &["-f", "-"],
            &nft_update(pair[0], pair[1], &opts),
        );
    }
    run_in(full, "nft", &["-f", "-"], &nft_full(&s4, &opts));
    assert_eq!(normalized(&list(step)), normalized(&list(full)));
    // A full load over an existing table replaces its rules (upstream's full resync).
    run_in(full, "nft", &["-f", "-"], &nft_full(&s4, &opts));
    assert_eq!(normalized(&list(step)), normalized(&list(full)));

    drop(names);
    let left = net::leftovers(&id).unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}
