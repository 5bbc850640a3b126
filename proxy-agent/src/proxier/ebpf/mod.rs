// SPDX-License-Identifier: Apache-2.0
//! The ebpf dataplane: socket-level load balancing (cgroup sock_addr programs) for traffic
//! from this node and tc programs for traffic from outside, over Cilium-style maps.
//!
//! loader (kernel: load, pin, attach) -> desired (pure: model -> frontends) -> apply
//! (ordered writes through the `maps` interface, diffed against what was written or, on
//! full syncs, against what the maps hold).

pub mod apply;
pub mod desired;
pub mod entries;
pub mod ids;
pub mod loader;
pub mod maps;

use proxy_common::LbConfig;
use tracing::info;

use self::{
    apply::ApplyState,
    loader::{LoadError, LoadOptions, Loaded},
};
use super::{Proxier, SyncError, SyncRequest, SyncStats};

/// The ebpf proxier: the loaded dataplane and the agent's memory of its maps.
pub struct EbpfProxier {
    loaded: Loaded,
    state: ApplyState,
}

impl EbpfProxier {
    /// Loads and attaches the programs (reusing pinned maps and replacing pinned links of a
    /// previous agent) and writes the runtime configuration.
    pub fn start(opts: &LoadOptions, host_netns_cookie: u64) -> Result<Self, LoadError> {
        let mut loaded = loader::load_and_attach(opts)?;
        loaded.write_config(LbConfig {
            host_netns_cookie,
            ..Default::default()
        })?;
        info!(
            bpffs_root = %opts.bpffs_root.display(),
            cgroup = %opts.cgroup.display(),
            devices = ?opts.devices,
            "ebpf dataplane ready"
        );
        Ok(Self {
            loaded,
            state: ApplyState::new(opts.map_sizes.backends, opts.map_sizes.rev_nat),
        })
    }
}

impl Proxier for EbpfProxier {
    fn mode(&self) -> &'static str {
        "ebpf"
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError> {
        self.state
            .sync(
                &mut self.loaded.maps,
                request.families,
                request.node,
                request.changed,
                request.full,
            )
            .map_err(|e| SyncError::new("ebpf", e))
    }
}

#[cfg(test)]
mod apply_tests;
