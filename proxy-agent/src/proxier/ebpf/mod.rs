// SPDX-License-Identifier: Apache-2.0
//! The ebpf dataplane: socket-level load balancing (cgroup sock_addr programs) for traffic
//! from this node and tc programs for traffic from outside, over Cilium-style maps.
//!
//! loader (kernel: load, pin, attach) -> desired (pure: model -> frontends) -> apply
//! (ordered writes through the `maps` interface, diffed against what was written or, on
//! full syncs, against what the maps hold).

mod apply;
mod attached;
mod budget;
mod desired;
mod entries;
pub(super) mod handover;
mod ids;
mod inspect;
mod kernel;
mod loader;
mod maglev;
mod maps;
pub(super) mod mode;
mod names;
mod node_settings;
pub(super) mod pins;
mod resize;
pub mod sockets;
mod stale_ct;
mod trace;
mod upgrade;
mod xdp;

/// What the integration tests and benchmarks load, pin and clean up with.
pub use self::{
    apply::ApplyState,
    desired::BackendAddr,
    loader::{LoadError, LoadOptions, Loaded, detect_cgroup2_root, load_and_attach},
    maglev::build_table as build_maglev_table,
    pins::{MapSizes, links_dir, maps_dir, unpin_all},
    sockets::Unsupported as SocketSweepUnsupported,
};
use proxy_common::LbConfig;
use tracing::{debug, info, warn};

use super::{Proxier, SyncError, SyncRequest, SyncStats};

/// The ebpf proxier: the loaded dataplane and the agent's memory of its maps.
pub struct EbpfProxier {
    loaded: Loaded,
    state: ApplyState,
    /// Service names of the frontends, for `inspect` and `trace` (None: could not be
    /// created; the dataplane works without it).
    names: Option<names::NamesTable>,
    /// The runtime configuration as given at start; syncs add the node settings' flags.
    config: LbConfig,
    /// The configuration last written with the node settings (None before the first sync).
    written_config: Option<LbConfig>,
    /// Connected UDP sockets whose backend went away (see [`sockets`]).
    connected_udp: sockets::ConnectedUdpTerminator,
    /// Stale UDP flows in the conntrack maps (see [`stale_ct`]).
    stale_flows: stale_ct::StaleBpfFlows,
    /// The flows a previous netfilter mode translated (see [`handover`]).
    handover: handover::NetfilterHandover,
}

impl EbpfProxier {
    /// Loads and attaches the programs (reusing pinned maps and replacing pinned links of a
    /// previous agent) and writes the runtime configuration. `algorithm` is how flows from
    /// outside pick backends where a service does not say (its annotation).
    pub fn start(
        opts: &LoadOptions,
        config: LbConfig,
        algorithm: crate::model::LoadBalancerAlgorithm,
    ) -> Result<Self, LoadError> {
        let mut loaded = loader::load_and_attach(opts)?;
        loaded.write_config(config)?;
        info!(
            bpffs_root = %opts.bpffs_root.display(),
            cgroup = %opts.cgroup.display(),
            devices = ?opts.devices,
            xdp_devices = ?loaded.xdp_devices,
            "ebpf dataplane ready"
        );
        // Both families' ids share the table.
        let names_capacity = 2 * opts.map_sizes.rev_nat.min(u32::from(u16::MAX));
        let names = match names::open_or_create(&loader::maps_dir(&opts.bpffs_root), names_capacity)
        {
            Ok(table) => Some(table),
            Err(e) => {
                warn!(error = %e, "service names table unavailable: inspect will show ids only");
                None
            }
        };
        // Before the first sync, so before the previous mode's rules go (see [`handover`]).
        let mut handover = handover::NetfilterHandover::new(
            Box::new(crate::proxier::conntrack::NetlinkConntrack::new()),
            Box::new(handover::NftCommand),
        );
        handover.begin(&[crate::model::IpFamily::V4, crate::model::IpFamily::V6]);
        let max_backends = id_space(loaded.maps.backends4.capacity(), opts.map_sizes.backends);
        let max_rev_nat = id_space(loaded.maps.rev_nat4.capacity(), opts.map_sizes.rev_nat);
        // As many tables as the map holds (it is sized for the configured number).
        let maglev_tables = loaded
            .maps
            .maglev
            .capacity()
            .ok()
            .and_then(|entries| {
                u32::try_from(entries / opts.maglev_table_size.max(1) as usize).ok()
            })
            .unwrap_or(0)
            .min(opts.map_sizes.maglev_tables);
        let state = ApplyState::new(max_backends, max_rev_nat).with_maglev(
            algorithm,
            opts.maglev_table_size,
            maglev_tables,
        );
        Ok(Self {
            loaded,
            state,
            names,
            config,
            written_config: None,
            connected_udp: sockets::ConnectedUdpTerminator::for_node(&loader::maps_dir(
                &opts.bpffs_root,
            )),
            stale_flows: stale_ct::StaleBpfFlows::default(),
            handover,
        })
    }
}

/// How many ids to hand out for a map: its configured size, or the size it was loaded with
/// when larger (a map kept at its old size keeps the ids of all its entries).
fn id_space(loaded: maps::Result<usize>, configured: u32) -> u32 {
    loaded
        .ok()
        .and_then(|c| u32::try_from(c).ok())
        .unwrap_or(configured)
        .max(configured)
}

/// Seconds of CLOCK_MONOTONIC_COARSE, the clock of `bpf_ktime_get_coarse_ns`.
pub(super) fn monotonic_coarse_secs() -> u32 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(|t| t.tv_sec() as u32)
        .unwrap_or(0)
}

impl EbpfProxier {
    /// Brings the configuration flags and the local-traffic detector's CIDRs in line with
    /// the node's settings (on full syncs; they change only with a restart of the agent).
    fn sync_node_settings(&mut self, node: &super::NodeContext) -> Result<(), SyncError> {
        let mut wanted = self.config;
        wanted.flags =
            (wanted.flags & !node_settings::NODE_FLAGS) | node_settings::config_flags(node);
        if self.written_config != Some(wanted) {
            self.loaded
                .write_config(wanted)
                .map_err(|e| SyncError::new("ebpf", e))?;
            self.written_config = Some(wanted);
        }
        self.loaded
            .local_cidrs
            .sync(&node_settings::local_cidrs(node))
            .map_err(|e| SyncError::new("ebpf", e))?;
        Ok(())
    }

    /// Deletes connection-tracking entries whose lifetime is over (the LRU maps would
    /// evict them only under pressure). Returns how many went.
    pub fn collect_conntrack(&mut self) -> usize {
        let now = monotonic_coarse_secs();
        let mut removed = 0;
        let expired4: Vec<_> = self
            .loaded
            .ct4
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| v.expires < now)
            .map(|(k, _)| k)
            .collect();
        for k in expired4 {
            removed += usize::from(self.loaded.ct4.remove(&k).is_ok());
        }
        let expired6: Vec<_> = self
            .loaded
            .ct6
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| v.expires < now)
            .map(|(k, _)| k)
            .collect();
        for k in expired6 {
            removed += usize::from(self.loaded.ct6.remove(&k).is_ok());
        }
        removed
    }
}

impl Proxier for EbpfProxier {
    fn mode(&self) -> &'static str {
        "ebpf"
    }

    fn maintain(&mut self) {
        // Only during a handover: a conntrack listing per round is not free.
        if self.handover.active() {
            self.handover.maintain();
        }
        match self.loaded.refresh_pod_devices() {
            Ok(added) if !added.is_empty() => info!(devices = ?added, "pod-side program attached"),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "attaching the pod-side program"),
        }
        let removed = self.collect_conntrack();
        if removed > 0 {
            debug!(removed, "expired conntrack entries deleted");
        }
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError> {
        // Services refused before are tried again: their names must follow if they get in.
        let mut touched = request.changed.clone();
        touched.extend(self.state.deferred().cloned());
        if request.full {
            // Before the services: a frontend must never be served under the defaults.
            self.sync_node_settings(request.node)?;
        }
        let mut stats = self
            .state
            .sync(
                &mut self.loaded.maps,
                request.families,
                request.node,
                request.changed,
                request.full,
            )
            .map_err(|e| SyncError::new("ebpf", e))?;
        if request.full && self.loaded.programs_pending() {
            // A layout upgrade: the new maps hold every service now.
            self.loaded
                .attach_pending()
                .map_err(|e| SyncError::new("ebpf", e))?;
            info!(xdp_devices = ?self.loaded.xdp_devices, "programs of the new map layout attached");
        }
        if let Some(names) = &mut self.names
            && let Err(e) = names.sync(request.families, &self.state, &touched, request.full)
        {
            // Names are for people reading the maps; the dataplane is in place. The next
            // full sync writes them again.
            warn!(error = %e, "writing the service names table");
        }
        // After the maps: a socket connecting meanwhile already gets a live backend.
        stats.connected_udp = self.connected_udp.after_sync(request);
        // After the maps too: a flow deleted earlier could be recreated from the old ones.
        stats.conntrack_reconciles =
            self.stale_flows
                .after_sync(&mut self.loaded.ct4, &mut self.loaded.ct6, request);
        if request.full {
            // A full sync read every map entry into memory and dropped it again.
            crate::sys::trim_heap();
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod apply_capacity_tests;
#[cfg(test)]
mod apply_maglev_tests;
#[cfg(test)]
mod apply_tests;
