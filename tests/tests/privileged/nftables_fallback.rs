// SPDX-License-Identifier: Apache-2.0
//! nftables mode where `nft` is too old: an `nft` first on the agent's PATH that says it is
//! v0.9.8 (nftables mode needs 1.0.1). With `--strict-mode` the agent refuses to fall back
//! and exits 1 naming the version; without it, it falls back to iptables (the Node event,
//! the log line and its `/proxyMode` are `node_events::nftables_fallback_*`).
//!
//! Root (skipped otherwise): the agent runs in a network namespace of its own (`unshare
//! --net`), where its servers bind and nothing it might touch is the host's.

use std::{
    ffi::OsString,
    fs,
    io::Read as _,
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{node_harness::TestNode, require_root};

/// A directory holding an `nft` that prints an old version for every command (so the
/// agent's cleanup, `nft list tables`, sees no table either); removed when dropped.
pub(crate) struct OldNft {
    dir: PathBuf,
}

impl OldNft {
    pub(crate) const VERSION: &'static str = "0.9.8";

    pub(crate) fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kpe-old-nft-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let nft = dir.join("nft");
        fs::write(
            &nft,
            format!("#!/bin/sh\necho 'nftables v{} (E.D.S.)'\n", Self::VERSION),
        )
        .unwrap();
        fs::set_permissions(&nft, fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }

    /// This process's PATH with the old `nft` first.
    pub(crate) fn path(&self) -> OsString {
        let mut path = self.dir.clone().into_os_string();
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        path
    }
}

impl Drop for OldNft {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata:
  name: strict-nft-node
  labels: {kubernetes.io/hostname: strict-nft-node}
status:
  addresses: [{type: InternalIP, address: 192.168.0.2}]
";

#[test]
fn strict_nftables_mode_exits_1_naming_the_old_nft() {
    require_root!();
    let agent = TestNode::agent_binary();
    assert!(agent.is_file(), "{} not built", agent.display());
    let old_nft = OldNft::new("strict");
    let source = std::env::temp_dir().join(format!("nft-strict-{}", std::process::id()));
    let _ = fs::remove_dir_all(&source);
    fs::create_dir_all(&source).unwrap();
    fs::write(source.join("node.yaml"), NODE).unwrap();

    let mut child = Command::new("unshare")
        .arg("--net")
        .arg("--")
        .arg(&agent)
        .args(["--proxy-mode", "nftables", "--strict-mode"])
        .args(["--hostname-override", "strict-nft-node"])
        .arg("--source")
        .arg(&source)
        .env("PATH", old_nft.path())
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
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut output).unwrap();
    }
    if let Some(mut err) = child.stderr.take() {
        err.read_to_string(&mut output).unwrap();
    }
    let _ = fs::remove_dir_all(&source);

    assert_eq!(status.code(), Some(1), "exit status; output:\n{output}");
    let refusal = output
        .lines()
        .find(|l| l.contains("proxy mode nftables cannot run on this node"))
        .unwrap_or_else(|| panic!("no refusal naming nftables mode; output:\n{output}"));
    assert!(
        refusal.contains(&format!("nft {} is too old", OldNft::VERSION))
            && refusal.contains("1.0.1"),
        "the refusal does not name the old nft and the version needed: {refusal}"
    );
    assert!(
        !output.contains("PROXY MODE FALLBACK"),
        "strict mode fell back anyway:\n{output}"
    );
}
