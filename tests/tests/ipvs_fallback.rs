// SPDX-License-Identifier: Apache-2.0
//! ipvs mode on a kernel without IPVS (this host): with `--strict-mode` the agent refuses
//! to fall back and exits 1 naming the missing kernel support. (Without it the agent
//! falls back to iptables: the `ipvs-fallback::*` scenario tests show that, judging every
//! flow as iptables after checking the agent's /proxyMode.)
//!
//! Needs root (the agent runs in a fresh network namespace, where its servers bind); on a
//! kernel with IPVS there is nothing to fall back from, and the test says so and returns.

use std::{
    fs,
    io::Read as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

fn agent_binary() -> PathBuf {
    tests::node_harness::TestNode::agent_binary()
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata:
  name: strict-node
  labels: {kubernetes.io/hostname: strict-node}
status:
  addresses: [{type: InternalIP, address: 192.168.0.2}]
";

#[test]
fn strict_ipvs_mode_exits_1_naming_the_missing_kernel_support() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a fresh network namespace for the agent)");
        return;
    }
    if xtask::vm::host_kernel_has_ipvs() {
        eprintln!("skipped: this kernel has IPVS, so ipvs mode has no reason to fall back");
        return;
    }
    let agent = agent_binary();
    assert!(agent.is_file(), "{} not built", agent.display());
    let source = std::env::temp_dir().join(format!("ipvs-strict-{}", std::process::id()));
    let _ = fs::remove_dir_all(&source);
    fs::create_dir_all(&source).unwrap();
    fs::write(source.join("node.yaml"), NODE).unwrap();

    // `unshare --net`: the agent's healthz and metrics servers bind in a namespace of
    // their own, and nothing it might touch is the host's.
    let mut child = Command::new("unshare")
        .arg("--net")
        .arg("--")
        .arg(&agent)
        .args(["--proxy-mode", "ipvs", "--strict-mode"])
        .args(["--hostname-override", "strict-node"])
        .arg("--source")
        .arg(&source)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the agent under unshare");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = fs::remove_dir_all(&source);
            panic!("the agent still runs after 60 s: strict mode did not stop it");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut output = String::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut stream = stream;
        stream.read_to_string(&mut output).unwrap();
    }
    let _ = fs::remove_dir_all(&source);

    assert_eq!(status.code(), Some(1), "exit status; output:\n{output}");
    let refusal = output
        .lines()
        .find(|l| l.contains("proxy mode ipvs cannot run on this node"))
        .unwrap_or_else(|| panic!("no refusal naming ipvs mode; output:\n{output}"));
    let reason = refusal
        .split_once("cannot run on this node")
        .map(|(_, r)| r)
        .unwrap_or_default();
    assert!(
        reason.contains("IPVS") || reason.contains("ip_vs"),
        "the refusal does not name the missing kernel support (IPVS): {refusal}"
    );
    assert!(
        !output.contains("PROXY MODE FALLBACK"),
        "strict mode fell back anyway:\n{output}"
    );
}
