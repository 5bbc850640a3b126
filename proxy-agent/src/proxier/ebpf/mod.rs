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
pub mod counters;
mod desired;
mod entries;
mod growth;
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
mod status;
mod trace;
mod upgrade;
mod xdp;

/// What the integration tests and benchmarks load, pin and clean up with.
pub use self::{
    apply::ApplyState,
    desired::BackendAddr,
    handover::{PinnedReservations, Reservations, leave_new_flows_to_netfilter},
    loader::{LoadError, LoadOptions, Loaded, detect_cgroup2_root, load_and_attach},
    maglev::build_table as build_maglev_table,
    names::read_pinned as read_names,
    pins::{MapSizes, links_dir, maps_dir, unpin_all},
    sockets::Unsupported as SocketSweepUnsupported,
};
use std::time::Instant;

use proxy_common::LbConfig;
use tracing::{debug, info, warn};

use self::{apply::PlannedSync, budget::PerMap, growth::Ceilings};
use super::{MapGrowth, Proxier, SyncError, SyncRequest, SyncStats};
use crate::config::MapSizeLimits;

/// Why the maps could not grow.
#[derive(Debug, thiserror::Error)]
pub enum GrowError {
    #[error(transparent)]
    Load(Box<LoadError>),
    #[error(transparent)]
    Map(#[from] maps::MapOpError),
    #[error("resized maps of the start still wait for the programs")]
    ResizePending,
}

impl From<LoadError> for GrowError {
    fn from(e: LoadError) -> Self {
        GrowError::Load(Box::new(e))
    }
}

/// A sync naming this many services or more writes the names table after it is
/// reported ([`Proxier::after_sync`]) instead of during it: the table is for people reading
/// the maps (`inspect`, `trace`), the programs never read it, and at 100,000 services it
/// took as long as the kernel took the service entries (0.6 s), on the other core.
const NAMES_AFTER_MIN: usize = 4_096;

/// The names a sync left for after it: those of the services it was asked to sync
/// (`SyncRequest::changed`, which `after_sync` gets again) and of `retried` ones.
struct NamesDue {
    /// Services refused before, tried again by that sync.
    retried: Vec<crate::model::NamespacedName>,
    full: bool,
}

/// The ebpf proxier: the loaded dataplane and the agent's memory of its maps.
pub struct EbpfProxier {
    loaded: Loaded,
    state: ApplyState,
    /// Service names of the frontends, for `inspect` and `trace` (None: could not be
    /// created; the dataplane works without it).
    names: Option<names::NamesTable>,
    /// The names a big sync left for [`Proxier::after_sync`] (see [`NAMES_AFTER_MIN`]).
    names_due: Option<NamesDue>,
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
    /// How the dataplane was loaded: growing loads it again with bigger maps.
    opts: LoadOptions,
    /// What the maps may grow to (see [`growth`]); None once growing failed.
    ceilings: Option<Ceilings>,
}

impl EbpfProxier {
    /// Loads and attaches the programs (reusing pinned maps and replacing pinned links of a
    /// previous agent) and writes the runtime configuration. `algorithm` is how flows from
    /// outside pick backends where a service does not say (its annotation). The maps keep
    /// the sizes of `opts` (callers that size them for a known load: the benchmarks, the
    /// tests); the agent lets them grow ([`EbpfProxier::start_with_limits`]).
    pub fn start(
        opts: &LoadOptions,
        config: LbConfig,
        algorithm: crate::model::LoadBalancerAlgorithm,
    ) -> Result<Self, LoadError> {
        Self::start_sized(opts, None, config, algorithm)
    }

    /// [`EbpfProxier::start`], with the maps services fill growing up to `limits` (see
    /// the `growth` module) from the sizes of `opts`; maps a previous agent grew keep their size
    /// within them.
    pub fn start_with_limits(
        opts: &LoadOptions,
        limits: &MapSizeLimits,
        config: LbConfig,
        algorithm: crate::model::LoadBalancerAlgorithm,
    ) -> Result<Self, LoadError> {
        Self::start_sized(opts, Some(Ceilings::from_config(limits)), config, algorithm)
    }

    fn start_sized(
        opts: &LoadOptions,
        ceilings: Option<Ceilings>,
        config: LbConfig,
        algorithm: crate::model::LoadBalancerAlgorithm,
    ) -> Result<Self, LoadError> {
        let maps_dir = loader::maps_dir(&opts.bpffs_root);
        let mut capacities = resize::Capacities::new();
        for kind in budget::MapKind::ALL {
            let start = growth::start_size(&opts.map_sizes, kind);
            let ceiling = ceilings.map_or(start, |c| c.of(kind));
            for family in [crate::model::IpFamily::V4, crate::model::IpFamily::V6] {
                let name = kind.map_name(family);
                let pinned = resize::pinned_capacity(&maps_dir, name);
                capacities.insert(name, growth::load_size(pinned, start, ceiling));
            }
        }
        let mut loaded = loader::load_and_attach_sized(opts, &capacities, false)?;
        loaded.write_config(config)?;
        info!(
            bpffs_root = %opts.bpffs_root.display(),
            cgroup = %opts.cgroup.display(),
            devices = ?opts.devices,
            xdp_devices = ?loaded.xdp_devices,
            "ebpf dataplane ready"
        );
        // Both families' ids share the table.
        let names = open_names(&maps_dir, &loaded.maps);
        // Before the first sync, so before the previous mode's rules go (see [`handover`]).
        let mut handover = handover::NetfilterHandover::new(
            Box::new(crate::proxier::conntrack::NetlinkConntrack::new()),
            Box::new(handover::NftCommand),
            Box::new(handover::PinnedReservations::new(&maps_dir)),
        );
        handover.begin(&[crate::model::IpFamily::V4, crate::model::IpFamily::V6]);
        // Ids are keys of hash maps, not indexes: they may go up to what the maps can grow
        // to, and admission keeps the entries within the maps' capacity.
        let id_ceiling =
            |kind| ceilings.map_or(growth::start_size(&opts.map_sizes, kind), |c| c.of(kind));
        let max_backends = id_space(
            loaded.maps.backends4.capacity(),
            id_ceiling(budget::MapKind::Backends),
        );
        let max_rev_nat = id_space(
            loaded.maps.rev_nat4.capacity(),
            id_ceiling(budget::MapKind::RevNat),
        );
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
        let mut state = ApplyState::new(max_backends, max_rev_nat).with_maglev(
            algorithm,
            opts.maglev_table_size,
            maglev_tables,
        );
        if let Some(ceilings) = ceilings {
            state = state.with_ceilings(ceilings);
        }
        state.inherit_rev_nat_ids(upgrade::previous_rev_nat_ids(&maps_dir));
        Ok(Self {
            loaded,
            state,
            names,
            names_due: None,
            config,
            written_config: None,
            connected_udp: sockets::ConnectedUdpTerminator::for_node(&loader::maps_dir(
                &opts.bpffs_root,
            )),
            stale_flows: stale_ct::StaleBpfFlows::default(),
            handover,
            opts: opts.clone(),
            ceilings,
        })
    }
}

/// Opens the service names table with room for the ids of both families (it grows with
/// the rev_nat maps).
fn open_names(maps_dir: &std::path::Path, maps: &maps::LbMaps) -> Option<names::NamesTable> {
    let rev_nat = maps.rev_nat4.capacity().unwrap_or(0) + maps.rev_nat6.capacity().unwrap_or(0);
    let capacity = u32::try_from(rev_nat)
        .unwrap_or(u32::MAX)
        .clamp(1, 2 * proxy_common::MAX_REV_NAT_ID);
    match names::open_or_create(maps_dir, capacity) {
        Ok(table) => Some(table),
        Err(e) => {
            warn!(error = %e, "service names table unavailable: inspect will show ids only");
            None
        }
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

impl EbpfProxier {
    /// Grows the maps a sync filling them to `peak` needs bigger (see [`growth`]).
    /// On failure, also says whether the sync cannot be written without the growth.
    fn grow_for(&mut self, peak: &PerMap) -> Result<Vec<MapGrowth>, (GrowError, bool)> {
        let Some(ceilings) = &self.ceilings else {
            return Ok(Vec::new());
        };
        let capacity = PerMap::capacities(&self.loaded.maps).map_err(|e| (e.into(), true))?;
        let steps = growth::plan(&capacity, peak, ceilings);
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        self.grow(&capacity, &steps)
            .map_err(|e| (e, growth::required(&steps, peak)))
    }

    /// Replaces the maps `steps` name by bigger ones holding the same entries, under the
    /// running programs: the dataplane is loaded again with the new sizes, which moves the
    /// entries and swaps the programs as a restart with bigger `ebpf.mapSizes` would (see
    /// [`resize`]); the other maps are reused as they are.
    fn grow(
        &mut self,
        capacity: &PerMap,
        steps: &[growth::Step],
    ) -> Result<Vec<MapGrowth>, GrowError> {
        grow_maps(
            &self.opts,
            &mut self.loaded,
            &mut self.names,
            capacity,
            steps,
        )
    }

    /// Plans the sync; when it is big enough to grow the maps, they grow on another
    /// thread meanwhile. Loading the programs against bigger maps takes the kernel a
    /// few tenths of a second for a cold start of 100,000 services (map allocation,
    /// the verifier), and admitting the services keeps one core busy as long: growing
    /// only after the plan added the two. The growth is sized from the estimate, and
    /// starts as soon as that is known, before the services are put in admission order
    /// (see [`ApplyState::prepare_read`]); the plan's own peak is checked after (see
    /// [`EbpfProxier::grow_for`]). A partial sync of many services also writes its
    /// backend and reverse-NAT entries on that thread as they are admitted, after the
    /// growth (see `apply::ahead`).
    fn plan_growing(
        &mut self,
        request: &SyncRequest<'_>,
    ) -> Result<(PlannedSync, Vec<MapGrowth>), SyncError> {
        let read = self
            .state
            .read_maps(&self.loaded.maps, request.full)
            .map_err(|e| SyncError::new("ebpf", e))?;
        let Self {
            state,
            loaded,
            names,
            opts,
            ceilings,
            ..
        } = self;
        std::thread::scope(|scope| {
            let mut helper = None;
            let mut sender = None;
            let prepared = state.prepare_read(
                read,
                request.families,
                request.node,
                request.changed,
                |estimated_peak, writes_ahead| {
                    let growth = growth_ahead(ceilings.as_ref(), &loaded.maps, estimated_peak);
                    if growth.is_none() && !writes_ahead {
                        return;
                    }
                    let writer = writes_ahead.then(|| {
                        let (to_writer, writer) = apply::ahead::channel();
                        sender = Some(to_writer);
                        writer
                    });
                    let began = Instant::now();
                    helper = Some((
                        began,
                        scope.spawn(move || {
                            let grown = growth.map(|(capacity, steps)| {
                                let grown = grow_maps(opts, loaded, names, &capacity, &steps);
                                (grown, began.elapsed())
                            });
                            // Into the grown maps only: after a failed growth the sync
                            // writes them, once it has grown the maps again.
                            let ahead = writer.map(|writer| match &grown {
                                Some((Err(_), _)) => writer.give_back(),
                                _ => writer.write(&mut loaded.maps),
                            });
                            (grown, ahead, began.elapsed())
                        }),
                    ));
                },
            );
            let Some((began, helper)) = helper else {
                let planned = state.admit_prepared(prepared, request.families, request.node);
                return Ok((planned, Vec::new()));
            };
            let admission_began = began.elapsed();
            let mut planned =
                state.admit_writing_ahead(prepared, request.families, request.node, sender);
            let admitted = began.elapsed();
            let (grown, ahead, helped) = match helper.join() {
                Ok(done) => done,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            // Which of the two bounds the plan (the times count from the helper's start).
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            debug!(
                head_start_ms = ms(admission_began),
                admit_ms = ms(admitted - admission_began),
                grow_ms = grown.as_ref().map(|(_, took)| ms(*took)),
                helper_ms = ms(helped),
                "services admitted while the maps grew and took writes ahead"
            );
            if let Some(ahead) = ahead {
                planned.take_back(ahead);
            }
            match grown.map(|(grown, _)| grown) {
                None => Ok((planned, Vec::new())),
                Some(Ok(grown)) => Ok((planned, grown)),
                Some(Err(e)) => {
                    // The plan did not count on it: the growth after the plan tries again
                    // (and, failing, reports it) for what the plan itself needs.
                    warn!(error = %e, "growing the BPF maps beside the plan failed; trying again after it");
                    Ok((planned, Vec::new()))
                }
            }
        })
    }
}

/// The growth `estimated_peak` (a prepared sync's, see [`ApplyState::prepare_read`]) asks
/// of `maps` within `ceilings`: their capacity and the steps, or None (nothing to grow, or
/// not allowed).
fn growth_ahead(
    ceilings: Option<&Ceilings>,
    maps: &maps::LbMaps,
    estimated_peak: &PerMap,
) -> Option<(PerMap, Vec<growth::Step>)> {
    let ceilings = ceilings?;
    let capacity = PerMap::capacities(maps).ok()?;
    let steps = growth::plan(&capacity, estimated_peak, ceilings);
    (!steps.is_empty()).then_some((capacity, steps))
}

/// Replaces the maps `steps` name by bigger ones holding the same entries, under the
/// running programs (see [`EbpfProxier::grow`]).
fn grow_maps(
    opts: &LoadOptions,
    loaded: &mut Loaded,
    names: &mut Option<names::NamesTable>,
    capacity: &PerMap,
    steps: &[growth::Step],
) -> Result<Vec<MapGrowth>, GrowError> {
    if loaded.resize_pending() {
        return Err(GrowError::ResizePending);
    }
    let began = Instant::now();
    let mut capacities = resize::Capacities::new();
    for kind in budget::MapKind::ALL {
        for family in [crate::model::IpFamily::V4, crate::model::IpFamily::V6] {
            let size = u32::try_from(capacity.get(kind, family)).unwrap_or(u32::MAX);
            capacities.insert(kind.map_name(family), size);
        }
    }
    for step in steps {
        capacities.insert(step.map(), step.to);
    }
    // During a layout upgrade the new programs still wait for the first full sync.
    let defer = loaded.programs_pending();
    let reloaded = loader::load_and_attach_sized(opts, &capacities, defer)?;
    // The programs run against the new maps now (their links were replaced); the old
    // object's programs and maps go with its handles.
    *loaded = reloaded;
    let took = began.elapsed();
    if steps.iter().any(|s| s.kind == budget::MapKind::RevNat) {
        *names = open_names(&loader::maps_dir(&opts.bpffs_root), &loaded.maps);
    }
    Ok(steps
        .iter()
        .map(|step| {
            info!(
                map = step.map(),
                from = step.from,
                to = step.to,
                took_ms = took.as_millis() as u64,
                "BPF map grown under the running programs"
            );
            MapGrowth {
                map: step.map(),
                from: step.from as usize,
                to: step.to as usize,
                took,
            }
        })
        .collect())
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

    /// Writes the names a big sync left for after it was reported (4,096 services or
    /// more: the names table is not the dataplane).
    fn after_sync(&mut self, request: &SyncRequest<'_>) {
        let Some(due) = self.names_due.take() else {
            return;
        };
        let Some(names) = self.names.as_mut() else {
            return;
        };
        let began = Instant::now();
        let touched = changed_and(request.changed, due.retried);
        let written = names.sync(request.families, &self.state, &touched, due.full);
        log_names_written(Some(written), began.elapsed());
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, SyncError> {
        // Services refused before are tried again: their names must follow if they get in.
        // (Without any, the changed ones as they are: a cold start changes 100,000.)
        let retried: Vec<crate::model::NamespacedName> = self.state.deferred().cloned().collect();
        let touched = changed_and(request.changed, retried.iter().cloned());
        // Names an earlier sync left for `after_sync`, which was not called (a caller
        // other than the agent): this sync writes every name.
        let names_full = request.full || self.names_due.take().is_some();
        if request.full {
            // Before the services: a frontend must never be served under the defaults.
            self.sync_node_settings(request.node)?;
        }
        let began = Instant::now();
        let (planned, mut grown) = self.plan_growing(request)?;
        // Between planning and writing: maps the plan fills past their high-water mark
        // grow first (unless they did while it was made), so that nothing is written
        // twice and nothing is refused for room the maps can still take.
        let planned_at = began.elapsed();
        match self.grow_for(planned.peak()) {
            Ok(more) => grown.extend(more),
            Err((e, required)) => {
                warn!(error = %e, "BPF maps cannot grow: they keep their size from now on (services that do not fit are refused and reported); restart the agent to try again");
                self.ceilings = None;
                self.state.stop_growing();
                if required {
                    // The plan counted on room the maps do not have: the next sync, full,
                    // plans within their capacity.
                    self.state.abandon(planned);
                    return Err(SyncError::new("ebpf", e));
                }
            }
        }
        let grown_at = began.elapsed();
        let named = if request.full {
            request.families.iter().map(|f| f.services.len()).sum()
        } else {
            touched.len()
        };
        let executed = if named >= NAMES_AFTER_MIN {
            let executed = self.state.execute(&mut self.loaded.maps, planned);
            if executed.is_ok() {
                self.names_due = Some(NamesDue {
                    retried,
                    full: names_full,
                });
            }
            executed
        } else {
            // The names are written while the kernel takes the service entries (they need
            // only the ids the plan handed out).
            let names = &mut self.names;
            let (executed, named) =
                self.state
                    .execute_alongside(&mut self.loaded.maps, planned, |state| {
                        let began = Instant::now();
                        let written = names
                            .as_mut()
                            .map(|names| names.sync(request.families, state, &touched, names_full));
                        (written, began.elapsed())
                    });
            let (names_written, names_took) = named;
            log_names_written(names_written, names_took);
            executed
        };
        let mut stats = executed.map_err(|e| SyncError::new("ebpf", e))?;
        let written_at = began.elapsed();
        stats.map_growth = grown;
        if request.full && self.loaded.programs_pending() {
            // A layout upgrade: the new maps hold every service now.
            self.loaded
                .attach_pending()
                .map_err(|e| SyncError::new("ebpf", e))?;
            info!(xdp_devices = ?self.loaded.xdp_devices, "programs of the new map layout attached");
        }
        // After the maps: a socket connecting meanwhile already gets a live backend.
        stats.connected_udp = self.connected_udp.after_sync(request);
        // After the maps too: a flow deleted earlier could be recreated from the old ones.
        stats.conntrack_reconciles =
            self.stale_flows
                .after_sync(&mut self.loaded.ct4, &mut self.loaded.ct6, request);
        let swept_at = began.elapsed();
        // Where a sync's time goes (a cold sync of a big cluster is the one to watch).
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        debug!(
            full = request.full,
            plan_ms = ms(planned_at),
            grow_ms = ms(grown_at - planned_at),
            write_ms = ms(written_at - grown_at),
            sweeps_ms = ms(swept_at - written_at),
            trim_ms = ms(began.elapsed() - swept_at),
            "ebpf sync phases"
        );
        Ok(stats)
    }
}

/// The services a sync names: the `changed` ones and `more` (services refused before and
/// tried again). Without any more, `changed` as it is: a cold start changes 100,000.
fn changed_and<'a>(
    changed: &'a std::collections::HashSet<crate::model::NamespacedName>,
    more: impl IntoIterator<Item = crate::model::NamespacedName>,
) -> std::borrow::Cow<'a, std::collections::HashSet<crate::model::NamespacedName>> {
    let mut more = more.into_iter().peekable();
    if more.peek().is_none() {
        return std::borrow::Cow::Borrowed(changed);
    }
    let mut touched = changed.clone();
    touched.extend(more);
    std::borrow::Cow::Owned(touched)
}

/// Reports a write of the names table (`None`: there is no table).
fn log_names_written(written: Option<Result<(), maps::MapOpError>>, took: std::time::Duration) {
    match written {
        // Names are for people reading the maps, not for the dataplane. The next full
        // sync writes them again.
        Some(Err(e)) => warn!(error = %e, "writing the service names table"),
        Some(Ok(())) => debug!(ms = took.as_secs_f64() * 1e3, "service names written"),
        None => {}
    }
}

#[cfg(test)]
mod apply_capacity_tests;
#[cfg(test)]
mod apply_maglev_tests;
#[cfg(test)]
mod apply_tests;
