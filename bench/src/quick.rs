// SPDX-License-Identifier: Apache-2.0
//! What the benchmarks' quick slices need when the test suite runs them: root, the eBPF
//! object and the release or debug binaries beside the test binary. Without them a slice
//! skips with the reason, unless PROXY_REQUIRE_EBPF=1 (as `cargo xtask test` sets) says
//! they must be there.

use std::path::PathBuf;

/// The binaries a slice runs.
#[derive(Debug, Clone)]
pub struct Built {
    pub agent: PathBuf,
    pub loadgen: PathBuf,
}

/// `target/<profile>/<name>` beside the test binary (`target/<profile>/deps/...`).
fn built(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join(name);
    path.is_file().then_some(path)
}

/// The binaries for the quick slice `what`, or None after printing why it skips (no root,
/// no eBPF object, a binary not built). Panics instead of skipping for a missing object or
/// binary when PROXY_REQUIRE_EBPF=1.
pub fn prerequisites(what: &str) -> Option<Built> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP quick {what} bench: needs root");
        return None;
    }
    let agent = built("proxy-agent");
    let loadgen = built("loadgen");
    let missing = proxy_agent::ebpf_object::unavailable_reason()
        .map(str::to_string)
        .or_else(|| agent.is_none().then(|| "proxy-agent is not built".into()))
        .or_else(|| loadgen.is_none().then(|| "loadgen is not built".into()));
    if let Some(reason) = missing {
        let required = std::env::var("PROXY_REQUIRE_EBPF").is_ok_and(|v| v == "1");
        assert!(!required, "quick {what} bench cannot run: {reason}");
        eprintln!("SKIP quick {what} bench: {reason}");
        return None;
    }
    Some(Built {
        agent: agent?,
        loadgen: loadgen?,
    })
}
