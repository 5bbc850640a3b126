// SPDX-License-Identifier: Apache-2.0
//! nftables mode where `nft` is too old: an `nft` first on the agent's PATH that says it is
//! v0.9.8 (nftables mode needs 1.0.1). With `--strict-mode` the agent refuses to fall back
//! and exits 1 naming the version; without it, it falls back to iptables (the Node event,
//! the log line and its `/proxyMode` are `node_events::nftables_fallback_*`).
//!
//! Root (skipped otherwise): the agent runs in a network namespace of its own (`unshare
//! --net`), where its servers bind and nothing it might touch is the host's.

use std::{ffi::OsString, fs, os::unix::fs::PermissionsExt as _, path::PathBuf, time::Duration};

use tests::{node_harness::TestNode, privileged::run_agent_to_exit, require_root};

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
    let (status, output) = run_agent_to_exit(
        &agent,
        &[
            "--proxy-mode",
            "nftables",
            "--strict-mode",
            "--hostname-override",
            "strict-nft-node",
        ],
        NODE,
        Some(&old_nft.path()),
        Duration::from_secs(60),
    );
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
