// SPDX-License-Identifier: Apache-2.0
//! The one task that owns the model and the proxier (linkerd's pattern): cluster events
//! update the trackers and request a sync; the runner decides when; a sync applies the
//! pending changes and programs the dataplane.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::Node;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::{
    error::{AgentError, Result},
    mode::ModeChoice,
    node_facts::{NodeFacts, NodeSource},
};
use crate::{
    config::{ProxyMode, Resolved},
    k8s::{
        events::{EventSink, NodeEvent},
        watch::{Change, ClusterEvent, ResourceKind},
    },
    model::{BatchRoom, ClusterState, IpFamily, NamespacedName, StaleConntrack},
    node::host_addresses,
    proxier::{self, HostLayout, ModeSettings, NodeContext, Proxier, SyncRequest, SyncStats},
    runner::SyncRunner,
    serve::{Family as HealthFamily, Metrics, ProxyHealth, ServiceHealthServers},
};

/// A partial sync of at least this many services hands the memory it freed back at once
/// (see [`crate::sys::release_free_memory`]).
const RELEASE_MEMORY_AFTER_CHANGES: usize = 1_000;

pub struct EventLoop {
    rx: mpsc::Receiver<ClusterEvent>,
    cluster: ClusterState,
    families: Vec<IpFamily>,
    health: ProxyHealth,
    metrics: Metrics,
    runner: SyncRunner,
    node_name: String,
    resolved: Resolved,
    synced: HashSet<ResourceKind>,
    /// Changes applied to the model but not yet to the dataplane (kept across failures).
    pending_changed: HashSet<NamespacedName>,
    pending_stale: StaleConntrack,
    pending_trigger_times: Vec<(IpFamily, SystemTime)>,
    runner_sync_period: Duration,
    /// Events on the Node (fallbacks, refused objects, full maps).
    events: EventSink,
    /// The last sync left services out of full maps.
    not_programmed: bool,
    /// Services were left out while the same sync freed entries: another sync soon may fit
    /// them (a sync's deletions free room only for the next).
    follow_up: bool,
    /// Removes what the other modes left; run once, after this mode's first successful
    /// sync (see [`EventLoop::run`]).
    remove_other_modes: Option<Box<dyn FnOnce() + Send>>,
    /// The mode running, once chosen (for [`super::foreign`]'s probes).
    running: Option<ProxyMode>,
    foreign: super::foreign::ForeignProxyWatch,
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        resolved: &Resolved,
        node_name: String,
        families: &[IpFamily],
        health: ProxyHealth,
        metrics: Metrics,
        rx: mpsc::Receiver<ClusterEvent>,
        min_sync: Duration,
        sync: Duration,
    ) -> Self {
        Self {
            rx,
            cluster: ClusterState::new(families, &node_name),
            families: families.to_vec(),
            health,
            metrics,
            runner: SyncRunner::new(min_sync, sync),
            runner_sync_period: sync,
            events: EventSink::disabled(),
            not_programmed: false,
            follow_up: false,
            remove_other_modes: None,
            running: None,
            foreign: Default::default(),
            node_name,
            resolved: resolved.clone(),
            synced: HashSet::new(),
            pending_changed: HashSet::new(),
            pending_stale: StaleConntrack::default(),
            pending_trigger_times: Vec::new(),
        }
    }

    pub fn node_object(&self) -> Option<&Node> {
        self.cluster.node_object().map(|n| n.as_ref())
    }

    /// Applies one event to the model. Returns whether a sync is needed.
    fn handle(&mut self, event: ClusterEvent) -> bool {
        match event {
            ClusterEvent::Service(change) => {
                let (record, deleted) = change.into_owned();
                self.cluster.service_record(record, deleted)
            }
            ClusterEvent::EndpointSlice(change) => self.cluster.slice_record(change.into_owned().0),
            ClusterEvent::Node(c) => match c {
                Change::Upsert(n) => {
                    let taints: Vec<String> = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .map(|t| t.iter().map(|t| t.key.clone()).collect())
                        .unwrap_or_default();
                    let taint_refs: Vec<&str> = taints.iter().map(String::as_str).collect();
                    self.health
                        .sync_node(n.metadata.deletion_timestamp.is_some(), &taint_refs);
                    self.cluster.node(&n)
                }
                Change::Delete(_) => {
                    self.health.sync_node(true, &[]);
                    false
                }
            },
            ClusterEvent::ServiceCidr(c) => match c {
                Change::Upsert(s) => self.cluster.service_cidr(&s, false),
                Change::Delete(s) => self.cluster.service_cidr(&s, true),
            },
            ClusterEvent::Synced(kind) => {
                self.synced.insert(kind);
                false
            }
            ClusterEvent::Batch(events) => {
                let mut room = BatchRoom::default();
                for event in &events {
                    match event {
                        ClusterEvent::Service(Change::Upsert(service)) => room.add_service(service),
                        ClusterEvent::EndpointSlice(Change::Upsert(slice)) => room.add_slice(slice),
                        _ => {}
                    }
                }
                self.cluster.make_room(&room);
                // Services and slices are filed together (on two threads when there are
                // many); every event is handled, whatever the ones before returned.
                let (mut services, mut slices, mut others) = (Vec::new(), Vec::new(), Vec::new());
                for event in events {
                    match event {
                        ClusterEvent::Service(change) => services.push(change.into_owned()),
                        ClusterEvent::EndpointSlice(change) => slices.push(change.into_owned().0),
                        other => others.push(other),
                    }
                }
                let mut changed = self.cluster.take_records(services, slices);
                for event in others {
                    changed |= self.handle(event);
                }
                changed
            }
            ClusterEvent::Unreachable { kind, error } => {
                if kind == ResourceKind::ServiceCidr && !self.synced.contains(&kind) {
                    // Older API servers have no ServiceCIDR API: run without service CIDRs
                    // rather than wait forever.
                    warn!(%error, "ServiceCIDRs cannot be listed; service CIDRs are not policed");
                    self.synced.insert(kind);
                }
                false
            }
        }
    }

    /// Handles one event of the running loop and asks for the sync it needs: a full one
    /// when a Node change moved the topology labels (every service's endpoint choice may
    /// change). A batch that holds a changed Node asks for a full one even if only its
    /// other objects changed: a full sync does all a partial one would. Whether anything
    /// changed.
    fn take_in(&mut self, event: ClusterEvent, node: &mut NodeContext) -> bool {
        let labels_changed = event.touches_node();
        if !self.handle(event) {
            return false;
        }
        let now = Instant::now();
        if labels_changed {
            node.labels = self.cluster.node_labels().clone();
            self.runner.request_full(now);
        } else {
            self.runner.request(now);
        }
        true
    }

    async fn next_event(&mut self) -> Result<ClusterEvent> {
        self.rx.recv().await.ok_or(AgentError::SourcesStopped)
    }

    /// Processes events until every initial list is in (kube-proxy's isInitialized).
    pub async fn wait_for_initial_state(&mut self) -> Result<()> {
        let all = [
            ResourceKind::Service,
            ResourceKind::EndpointSlice,
            ResourceKind::Node,
            ResourceKind::ServiceCidr,
        ];
        while !all.iter().all(|k| self.synced.contains(k)) {
            let event = self.next_event().await?;
            self.handle(event);
        }
        info!("initial state of the cluster received");
        Ok(())
    }

    /// Processes events until this node's Node object satisfies `ready`.
    pub async fn wait_for_node(&mut self, ready: impl Fn(&Node) -> bool) -> Result<Arc<Node>> {
        let mut said = false;
        loop {
            if let Some(node) = self.cluster.node_object()
                && ready(node)
            {
                return Ok(node.clone());
            }
            if !said {
                // Said once: the wait lasts until the Node changes, possibly forever on a
                // cluster that does not allocate pod CIDRs to nodes.
                warn!(
                    "waiting for this node's Node object to have spec.podCIDRs \
                     (detectLocalMode NodeCIDR); they are set by kube-controller-manager \
                     --allocate-node-cidrs (kubeadm: --pod-network-cidr). Without them, set \
                     detectLocalMode: ClusterCIDR and clusterCIDR"
                );
                said = true;
            }
            let event = self.next_event().await?;
            self.handle(event);
        }
    }

    pub fn set_event_sink(&mut self, events: EventSink) {
        self.events = events;
    }

    pub fn record_fallback(&self, choice: &ModeChoice) {
        self.metrics
            .fallbacks_total
            .with_label_values(&[choice.requested.as_str(), choice.mode.as_str()])
            .inc();
        self.events.emit(NodeEvent::ModeFallback {
            requested: choice.requested.as_str().into(),
            running: choice.mode.as_str().into(),
            reason: choice.reason.clone().unwrap_or_default(),
        });
    }

    /// Creates the dataplane (falling back if it cannot start) and runs until a signal.
    pub async fn start(mut self, choice: ModeChoice, facts: NodeFacts) -> Result<()> {
        let config = &self.resolved.config;
        let localhost_gate = config
            .feature_gates
            .get(proxier::LOCALHOST_NODEPORTS_GATE)
            .copied()
            .unwrap_or(false);
        let mut node = NodeContext {
            name: self.node_name.clone(),
            labels: self.cluster.node_labels().clone(),
            primary_ips: facts.primary_ips.clone(),
            host_addresses: facts.host_addresses.clone(),
            nodeport_addresses: facts.nodeport_addresses.clone(),
            local_detector: facts.local_detector.clone(),
            masquerade_all: self.resolved.effective.masquerade_all,
            masquerade_bit: config.masquerade_bit(choice.mode),
            localhost_nodeports: config.iptables.localhost_node_ports.unwrap_or(true),
            loopback_nodeport_families: proxier::loopback_nodeport_families(
                localhost_gate,
                &self.resolved.effective.node_port_addresses,
            ),
            loopback_nodeports_gate: localhost_gate,
        };

        let layout = HostLayout::from_config(config);
        let settings = ModeSettings {
            config,
            layout: &layout,
            xdp: self.resolved.effective.xdp_mode,
            sync_period: self.runner_sync_period,
            devices: &facts.devices,
            node: &node,
        };
        let mut choice = choice;
        let mut proxier = match proxier::start(choice.mode, &settings) {
            Ok(p) => p,
            Err(reason) if proxier::fallback_of(choice.mode).is_some() => {
                choice = super::mode::fallback(
                    choice.mode,
                    reason,
                    self.resolved.options.strict_mode,
                    &layout,
                )?;
                self.record_fallback(&choice);
                proxier::start(choice.mode, &settings).map_err(|reason| AgentError::Dataplane {
                    mode: choice.mode.as_str(),
                    reason,
                })?
            }
            Err(reason) => {
                return Err(AgentError::Dataplane {
                    mode: choice.mode.as_str(),
                    reason,
                });
            }
        };
        self.health.set_proxy_mode(proxier.mode());
        self.metrics
            .register_mode(choice.mode.into(), &self.families);
        if choice.mode == crate::config::ProxyMode::Iptables {
            self.metrics.register_packet_counter(
                "iptables_ct_state_invalid_dropped_packets_total",
                "Packets dropped by iptables because conntrack marked them INVALID (the workaround for conntrack problems)",
                Box::new(proxier::iptables::ct_state_invalid_dropped_packets),
            );
            self.metrics.register_packet_counter(
                "iptables_localhost_nodeports_accepted_packets_total",
                "Packets accepted on NodePorts of the loopback addresses (127.0.0.0/8)",
                Box::new(proxier::iptables::localhost_nodeports_accepted_packets),
            );
        }
        if choice.mode == crate::config::ProxyMode::Ebpf {
            for (verdict, name, help) in [
                (
                    proxy_common::maps::DatapathVerdict::Drop,
                    "ebpf_datapath_drops_total",
                    "Packets and connections the eBPF programs dropped, by reason",
                ),
                (
                    proxy_common::maps::DatapathVerdict::Reject,
                    "ebpf_datapath_rejects_total",
                    "Packets and connections the eBPF programs refused (upstream's REJECT), by reason",
                ),
            ] {
                let maps_dir = proxier::ebpf::maps_dir(&layout.bpffs_root);
                self.metrics.register_labelled_packet_counter(
                    name,
                    help,
                    "reason",
                    Box::new(move || proxier::ebpf::counters::counts_of(&maps_dir, verdict)),
                );
            }
        }
        info!(
            mode = proxier.mode(),
            requested = choice.requested.as_str(),
            "proxier running"
        );
        // What another mode left goes only after this mode's first successful sync (and
        // before that sync is reported): until then the old mode's rules or programs keep
        // serving the node, so a mode switch leaves no moment in which new connections
        // find neither. Failures are logged per mode; the chosen mode runs regardless.
        let (running, bpffs_root, ipvs_exclude) = (
            choice.mode,
            layout.bpffs_root.clone(),
            layout.ipvs_exclude.clone(),
        );
        self.running = Some(running);
        self.remove_other_modes = Some(Box::new(move || {
            let _ = crate::cleanup::cleanup_other_modes(running, &bpffs_root, &ipvs_exclude);
        }));
        let mut service_health =
            ServiceHealthServers::new(self.health.clone(), node.nodeport_addresses.clone());

        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| AgentError::Dataplane {
                mode: "signals",
                reason: e.to_string(),
            })?;
        self.runner.request_full(Instant::now());
        // The first sync is queued too: upstream's initial objects queue it (Sync()), which
        // sets the queued timestamp before the first sync.
        for f in &self.families {
            Metrics::set_timestamp(&self.metrics.last_queued_timestamp, *f, SystemTime::now());
        }
        // Objects refused in the initial lists are reported now, not at the next event.
        self.report_rejected();
        let mut host_refresh = tokio::time::interval(Duration::from_secs(10));
        loop {
            let deadline = self.runner.next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = self.rx.recv() => {
                    let Some(event) = event else { return Err(AgentError::SourcesStopped) };
                    if self.take_in(event, &mut node) {
                        self.queued(SystemTime::now());
                    }
                    // Drain what is already queued before deciding to sync.
                    while let Ok(event) = self.rx.try_recv() {
                        self.take_in(event, &mut node);
                    }
                    self.report_rejected();
                }
                _ = sleep => {
                    let now = Instant::now();
                    if let Some(run) = self.runner.due(now) {
                        let ok = self.sync(proxier.as_mut(), &node, run.full, &mut service_health);
                        self.runner.completed(now, ok);
                        if std::mem::take(&mut self.follow_up) {
                            self.runner.request(Instant::now());
                        }
                    }
                }
                _ = host_refresh.tick() => {
                    proxier.maintain();
                    if proxier.needs_full_resync() {
                        warn!("the dataplane was changed behind our back (e.g. flushed); resyncing");
                        self.runner.request_full(Instant::now());
                    }
                    let addrs = host_addresses();
                    if addrs != node.host_addresses {
                        info!(addresses = ?addrs, "host addresses changed");
                        node.host_addresses = addrs;
                        self.runner.request_full(Instant::now());
                    }
                }
                _ = tokio::signal::ctrl_c() => {
                    info!("interrupted; leaving the dataplane in place");
                    return Ok(());
                }
                _ = sigterm.recv() => {
                    info!("terminated; leaving the dataplane in place");
                    return Ok(());
                }
            }
        }
    }

    fn queued(&self, now: SystemTime) {
        for f in &self.families {
            self.health.queued_update(health_family(*f), now);
        }
        for f in &self.families {
            Metrics::set_timestamp(&self.metrics.last_queued_timestamp, *f, now);
        }
        let (svc, eps) = self.cluster.pending_counts();
        self.metrics.service_changes_pending.set(svc as i64);
        self.metrics.endpoint_changes_pending.set(eps as i64);
    }

    fn report_rejected(&mut self) {
        for rejected in self.cluster.take_rejected() {
            warn!(
                kind = ?rejected.kind,
                namespace = %rejected.namespace,
                name = %rejected.name,
                reason = %rejected.reason,
                "skipping invalid object"
            );
            self.metrics
                .objects_rejected_total
                .with_label_values(&[&format!("{:?}", rejected.kind)])
                .inc();
            self.events.emit(NodeEvent::ObjectRejected(rejected));
        }
    }

    /// One sync; returns whether it succeeded.
    fn sync(
        &mut self,
        proxier: &mut dyn Proxier,
        node: &NodeContext,
        full: bool,
        service_health: &mut ServiceHealthServers,
    ) -> bool {
        let started = Instant::now();
        let applied = self.cluster.apply_pending();
        crate::model::union_into(&mut self.pending_changed, applied.changed);
        self.pending_stale.merge(applied.stale);
        self.pending_trigger_times.extend(applied.trigger_times);
        let (svc_total, ep_total) = self.cluster.changes_total();
        self.metrics
            .service_changes_total
            .inc_by(svc_total.saturating_sub(self.metrics.service_changes_total.get()));
        self.metrics
            .endpoint_changes_total
            .inc_by(ep_total.saturating_sub(self.metrics.endpoint_changes_total.get()));
        self.metrics.service_changes_pending.set(0);
        self.metrics.endpoint_changes_pending.set(0);

        let request = SyncRequest {
            families: self.cluster.families(),
            node,
            full,
            changed: &self.pending_changed,
            stale: &self.pending_stale,
        };
        let result = proxier.sync(&request);
        let elapsed = started.elapsed().as_secs_f64();
        match result {
            Ok(stats) => {
                let first_sync = match self.remove_other_modes.take() {
                    Some(remove_other_modes) => {
                        remove_other_modes();
                        true
                    }
                    None => false,
                };
                let now = SystemTime::now();
                // One sync programs every family together: each family's series gets it.
                let synced: Vec<IpFamily> = request.families.iter().map(|f| f.family).collect();
                for family in &synced {
                    let label = [family.as_api_str()];
                    self.metrics
                        .sync_duration
                        .with_label_values(&label)
                        .observe(elapsed);
                    let by_kind = if full {
                        &self.metrics.sync_full_duration
                    } else {
                        &self.metrics.sync_partial_duration
                    };
                    by_kind.with_label_values(&label).observe(elapsed);
                    Metrics::set_timestamp(&self.metrics.last_sync_timestamp, *family, now);
                }
                for reconcile in &stats.conntrack_reconciles {
                    let family = [reconcile.family.as_api_str()];
                    self.metrics
                        .conntrack_reconcile_duration
                        .with_label_values(&family)
                        .observe(reconcile.took.as_secs_f64());
                    self.metrics
                        .conntrack_reconcile_deleted_total
                        .with_label_values(&family)
                        .inc_by(reconcile.deleted as u64);
                }
                self.report_families(&stats, &synced);
                super::capacity::report(&stats, self.not_programmed, &self.metrics, &self.events);
                self.metrics.connected_udp_sweep(&stats.connected_udp);
                self.not_programmed = stats.not_programmed > 0;
                self.follow_up = stats.not_programmed > 0 && stats.deleted > 0;
                for (family, t) in self.pending_trigger_times.drain(..) {
                    if let Ok(d) = now.duration_since(t) {
                        self.metrics
                            .network_programming
                            .with_label_values(&[family.as_api_str()])
                            .observe(d.as_secs_f64());
                    }
                }
                for f in &self.families {
                    self.health.updated(health_family(*f), now);
                }
                // kube-proxy's V(2) line, which operators grep for; the counts are ours.
                let go_elapsed = crate::config::Duration::from_std(
                    std::time::Duration::from_secs_f64(elapsed.max(0.0)),
                )
                .map(|d| d.to_string())
                .unwrap_or_default();
                info!(
                    target: crate::telemetry::klog::V2,
                    elapsed = %go_elapsed,
                    full,
                    changed = self.pending_changed.len(),
                    written = stats.written,
                    deleted = stats.deleted,
                    "SyncProxyRules complete"
                );
                service_health.sync(self.cluster.families(), &self.pending_changed, full);
                proxier.after_sync(&request);
                if full
                    && !first_sync
                    && let Some(running) = self.running
                {
                    self.look_for_another_proxy(running);
                }
                let big = self.pending_changed.len() >= RELEASE_MEMORY_AFTER_CHANGES;
                if big {
                    // Not cleared: a cleared set keeps its room (a cold start's 50,000
                    // names: half a MiB) until the next cold start.
                    self.pending_changed = HashSet::new();
                } else {
                    self.pending_changed.clear();
                }
                self.pending_stale = StaleConntrack::default();
                if full || big {
                    // A full sync builds every mode's whole desired state (the ebpf mode
                    // also reads every map entry) and drops it; a big partial one (a cold
                    // start's objects arriving after the first sync) plans every entry of
                    // its services. Not after small ones: the purge is a system call per
                    // arena, and the allocator's background thread returns their little
                    // within seconds anyway.
                    crate::sys::release_free_memory();
                }
                true
            }
            Err(e) => {
                self.metrics.sync_failures_total.inc();
                if let Some(failure) = &e.restore_failed {
                    self.metrics.restore_failed(e.mode, failure);
                }
                error!(error = %e, full, "sync failed; retrying with a full sync");
                false
            }
        }
    }
}

impl EventLoop {
    /// The per-family gauges of a successful sync.
    /// After a full sync: whether another proxy's dataplane appeared on the node (or went),
    /// said once per change (agent/foreign.rs).
    fn look_for_another_proxy(&mut self, running: ProxyMode) {
        use super::foreign::ForeignChange;
        match self
            .foreign
            .observe(super::foreign::written_beside(running))
        {
            Some(ForeignChange::Found(found)) => {
                warn!(
                    found = %found.join(", "),
                    "another proxy is programming this node: two proxies fight over its rules; stop the other one"
                );
                self.events.emit(NodeEvent::ForeignProxy { found });
            }
            Some(ForeignChange::Gone) => {
                info!("the other proxy's rules and tables are gone from this node");
            }
            None => {}
        }
        self.metrics
            .foreign_proxy_detected
            .set(i64::from(self.foreign.detected()));
    }

    fn report_families(&self, stats: &SyncStats, synced: &[IpFamily]) {
        self.metrics.family_reports(&stats.per_family);
        // ebpf mode's maps hold both families: its totals belong to a family only when
        // the node has one. On a dual-stack node the gauge is left out rather than
        // attributed to a family it was not counted for.
        if let ([family], true) = (synced, stats.per_family.is_empty()) {
            self.metrics.set_no_local_endpoints(
                *family,
                stats.no_local_endpoints_internal,
                stats.no_local_endpoints_external,
            );
        }
    }
}

impl NodeSource for EventLoop {
    fn node_object(&self) -> Option<&Node> {
        EventLoop::node_object(self)
    }

    async fn wait_for_node(&mut self, ready: impl Fn(&Node) -> bool) -> Result<Arc<Node>> {
        EventLoop::wait_for_node(self, ready).await
    }
}

fn health_family(f: IpFamily) -> HealthFamily {
    match f {
        IpFamily::V4 => HealthFamily::V4,
        IpFamily::V6 => HealthFamily::V6,
    }
}
