// SPDX-License-Identifier: Apache-2.0
//! Prometheus metrics on metricsBindAddress (default 127.0.0.1:10249): upstream kube-proxy's
//! `kubeproxy_*` families with its names, types, labels (the `ip_family` labels of 1.34
//! included) and buckets, registered per mode as upstream's `RegisterMetrics(mode)` does,
//! the process collector's `process_*`, and the dataplane's own families.
//!
//! [`Metrics::new`] registers what every mode has; [`Metrics::register_mode`] adds the
//! chosen mode's families once the mode is known (the server already runs then: the
//! registry is shared, so they appear on the next scrape). ebpf mode registers what
//! upstream's nftables mode would, minus the nftables counters nothing of ours increments.
//! Counters labelled by `ip_family` only start at 0 for the node's families, so that a
//! scrape shows them before the first failure (Prometheus' advice for known labels).
//!
//! iptables mode's two nfacct counters (`kubeproxy_iptables_ct_state_invalid_dropped_packets_total`
//! and `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`) are read from the
//! kernel at each scrape (`register_packet_counter`, readers in `proxier::iptables::counters`).
//! ebpf mode on a dual-stack node leaves `sync_proxy_rules_no_local_endpoints_total` out:
//! its maps count both families together.

use std::time::SystemTime;

use prometheus::{
    Encoder as _, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder, core::Collector, exponential_buckets,
};

use crate::config::ProxyMode;
use crate::model::IpFamily;
use crate::proxier::{FamilyReport, RestoreFailure};

const NS: &str = "kubeproxy";

/// Reads a packet counter at scrape time; `None` when it cannot be read (nothing is
/// reported then, as upstream reports nothing when its nfacct object is missing).
pub type PacketCountReader = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// Reads counters of one label at scrape time, as `(label value, count)`.
pub type LabelledCountReader = Box<dyn Fn() -> Option<Vec<(String, u64)>> + Send + Sync>;

/// Handles to every metric; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    // Every mode (upstream's common block).
    pub sync_duration: HistogramVec,
    pub last_sync_timestamp: GaugeVec,
    pub last_queued_timestamp: GaugeVec,
    pub network_programming: HistogramVec,
    pub endpoint_changes_pending: IntGauge,
    pub endpoint_changes_total: IntCounter,
    pub service_changes_pending: IntGauge,
    pub service_changes_total: IntCounter,
    pub no_local_endpoints: GaugeVec,
    healthz_total: IntCounterVec,
    livez_total: IntCounterVec,
    /// The stale UDP conntrack reconciler, by `ip_family` (ebpf mode: its BPF conntrack
    /// cleanup). It runs in every mode of ours.
    pub conntrack_reconcile_duration: HistogramVec,
    pub conntrack_reconcile_deleted_total: IntCounterVec,
    // iptables mode (and ipvs: the restore failures).
    pub sync_full_duration: HistogramVec,
    pub sync_partial_duration: HistogramVec,
    pub iptables_restore_failures_total: IntCounterVec,
    pub iptables_partial_restore_failures_total: IntCounterVec,
    pub iptables_rules_total: IntGaugeVec,
    pub iptables_rules_last: IntGaugeVec,
    // nftables mode (defined for it; no mode of ours registers them yet).
    pub nftables_sync_failures_total: IntCounterVec,
    pub nftables_cleanup_failures_total: IntCounterVec,
    /// Ours: dataplane syncs that failed (any mode).
    pub sync_failures_total: IntCounter,
    /// Ours: entries and capacity per BPF map, services left out of full maps, fallbacks
    /// taken, objects rejected.
    pub map_entries: GaugeVec,
    pub map_capacity: GaugeVec,
    pub services_not_programmed: IntGauge,
    /// Ours: BPF maps replaced by bigger ones as the cluster grew, by map.
    pub map_growths_total: IntCounterVec,
    pub fallbacks_total: IntCounterVec,
    /// 1 while another proxy's dataplane is found on the node (agent/foreign.rs).
    pub foreign_proxy_detected: IntGauge,
    /// component-base's `kubernetes_build_info` (no namespace), what dashboards key on.
    pub build_info: IntGaugeVec,
    /// The rest of component-base's families and the linked libraries' (`None` only if
    /// registering them failed, which is logged).
    component: Option<super::component_metrics::ComponentFamilies>,
    pub objects_rejected_total: IntCounterVec,
    /// Ours: connected UDP sockets terminated because their backend left the Service,
    /// and the sweeps that looked for them, by result (ebpf mode).
    pub udp_sockets_terminated_total: IntCounter,
    pub udp_socket_sweeps_total: IntCounterVec,
}

/// The mode whose families [`Metrics::register_mode`] adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsMode {
    Iptables,
    Ipvs,
    Nftables,
    Ebpf,
}

impl From<ProxyMode> for MetricsMode {
    fn from(mode: ProxyMode) -> Self {
        match mode {
            ProxyMode::Ebpf => Self::Ebpf,
            ProxyMode::Iptables => Self::Iptables,
            ProxyMode::Ipvs => Self::Ipvs,
            ProxyMode::Nftables => Self::Nftables,
        }
    }
}

/// Options are fixed strings: a failure here is a programming error caught by every test.
fn built<T>(what: &str, metric: prometheus::Result<T>) -> T {
    metric.unwrap_or_else(|e| panic!("metric {what} is well-formed: {e}"))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    built(
        name,
        IntCounterVec::new(Opts::new(name, help).namespace(NS), labels),
    )
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    built(
        name,
        GaugeVec::new(Opts::new(name, help).namespace(NS), labels),
    )
}

fn int_gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    built(
        name,
        IntGaugeVec::new(Opts::new(name, help).namespace(NS), labels),
    )
}

fn histogram_vec(name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]) -> HistogramVec {
    built(
        name,
        HistogramVec::new(
            HistogramOpts::new(name, help)
                .namespace(NS)
                .buckets(buckets),
            labels,
        ),
    )
}

fn counter(name: &str, help: &str) -> IntCounter {
    built(
        name,
        IntCounter::with_opts(Opts::new(name, help).namespace(NS)),
    )
}

fn gauge(name: &str, help: &str) -> IntGauge {
    built(
        name,
        IntGauge::with_opts(Opts::new(name, help).namespace(NS)),
    )
}

/// `kubernetes_build_info`'s labels, as component-base names them.
const BUILD_INFO_LABELS: [&str; 9] = [
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
];

/// This agent's values for [`BUILD_INFO_LABELS`]: its version (no Go toolchain, so an
/// empty `go_version`), `rustc`, the platform as Go spells it.
fn build_info_labels() -> [String; 9] {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    [
        env!("CARGO_PKG_VERSION_MAJOR").to_string(),
        env!("CARGO_PKG_VERSION_MINOR").to_string(),
        format!("v{}", env!("CARGO_PKG_VERSION")),
        option_env!("KPE_GIT_COMMIT")
            .unwrap_or_default()
            .to_string(),
        option_env!("KPE_GIT_TREE_STATE")
            .unwrap_or_default()
            .to_string(),
        option_env!("KPE_BUILD_DATE")
            .unwrap_or_default()
            .to_string(),
        String::new(),
        "rustc".to_string(),
        format!("{}/{arch}", std::env::consts::OS),
    ]
}

/// The prometheus crate's process collector, with `process_cpu_seconds_total` in
/// fractions of a second (its own counts whole seconds; client_golang's, which kube-proxy
/// exports, does not), and the three families client_golang's has and it lacks: the
/// network namespace's bytes received and sent (client_golang sums /proc/PID/net/dev) and
/// the address-space limit (unlimited: 2^64 - 1, as client_golang reports it).
struct ProcessMetrics {
    inner: prometheus::process_collector::ProcessCollector,
    network_receive: prometheus::Counter,
    network_transmit: prometheus::Counter,
    virtual_memory_max: prometheus::Gauge,
}

impl ProcessMetrics {
    fn new() -> Self {
        fn made<T>(result: prometheus::Result<T>) -> T {
            result.unwrap_or_else(|e| unreachable!("a valid process family: {e}"))
        }
        Self {
            inner: prometheus::process_collector::ProcessCollector::for_self(),
            network_receive: made(prometheus::Counter::new(
                "process_network_receive_bytes_total",
                "Number of bytes received by the process over the network.",
            )),
            network_transmit: made(prometheus::Counter::new(
                "process_network_transmit_bytes_total",
                "Number of bytes sent by the process over the network.",
            )),
            virtual_memory_max: made(prometheus::Gauge::new(
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
            )),
        }
    }
}

/// Bytes received and sent over every interface of this process's network namespace.
fn network_bytes() -> Option<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/self/net/dev").ok()?;
    Some(parse_net_dev(&text))
}

/// Sums `/proc/net/dev`'s receive and transmit byte columns (the first and ninth number
/// after each interface name).
fn parse_net_dev(text: &str) -> (f64, f64) {
    let mut totals = (0.0, 0.0);
    for line in text.lines().skip(2) {
        let Some((_, counters)) = line.split_once(':') else {
            continue;
        };
        let numbers: Vec<f64> = counters
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        if let (Some(rx), Some(tx)) = (numbers.first(), numbers.get(8)) {
            totals.0 += rx;
            totals.1 += tx;
        }
    }
    totals
}

/// The soft RLIMIT_AS, unlimited as u64::MAX.
fn virtual_memory_max() -> Option<f64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS).ok()?;
    Some(soft as f64)
}

/// User and system CPU time of this process, in seconds.
fn cpu_seconds() -> Option<f64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok()?;
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Some(seconds(usage.user_time()) + seconds(usage.system_time()))
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut descs = self.inner.desc();
        descs.extend(self.network_receive.desc());
        descs.extend(self.network_transmit.desc());
        descs.extend(self.virtual_memory_max.desc());
        descs
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.inner.collect();
        if let Some((received, sent)) = network_bytes() {
            for (counter, value) in [
                (&self.network_receive, received),
                (&self.network_transmit, sent),
            ] {
                counter.reset();
                counter.inc_by(value);
                families.extend(counter.collect());
            }
        }
        if let Some(limit) = virtual_memory_max() {
            self.virtual_memory_max.set(limit);
            families.extend(self.virtual_memory_max.collect());
        }
        if let Some(seconds) = cpu_seconds() {
            for family in &mut families {
                if family.name() == "process_cpu_seconds_total" {
                    for metric in family.mut_metric() {
                        let mut counter = prometheus::proto::Counter::default();
                        counter.set_value(seconds);
                        metric.set_counter(counter);
                    }
                }
            }
        }
        families
    }
}

fn register(registry: &Registry, metric: &(impl Collector + Clone + 'static)) {
    // Registering the same family twice is a programming error (register_mode runs once).
    if let Err(e) = registry.register(Box::new(metric.clone())) {
        tracing::error!(error = %e, "metric registered twice");
    }
}

/// Upstream's sync buckets: 1 ms doubling 15 times.
fn sync_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 15).unwrap_or_default()
}

/// Upstream's network-programming buckets: 0.25 s, 0.5 s, 1..59 s, 60..115 s, 2..5 min.
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

const FAMILY: &[&str] = &["ip_family"];
const FAMILY_TABLE: &[&str] = &["ip_family", "table"];

/// A counter read from the kernel at scrape time (upstream reads nfacct objects so).
struct PacketCounter {
    counter: IntCounter,
    read: PacketCountReader,
}

impl Collector for PacketCounter {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.counter.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        match (self.read)() {
            Some(packets) => {
                self.counter.reset();
                self.counter.inc_by(packets);
                self.counter.collect()
            }
            None => Vec::new(),
        }
    }
}

/// Counters of one label read from the kernel at scrape time (ebpf mode's datapath drops).
struct LabelledPacketCounter {
    counters: IntCounterVec,
    read: LabelledCountReader,
}

impl Collector for LabelledPacketCounter {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.counters.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Some(counts) = (self.read)() else {
            return Vec::new();
        };
        self.counters.reset();
        for (label, count) in counts {
            self.counters.with_label_values(&[&label]).inc_by(count);
        }
        self.counters.collect()
    }
}

impl Metrics {
    /// The registry with the families every mode has, `process_*` included.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::new(),
            sync_duration: histogram_vec(
                "sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                sync_buckets(),
                FAMILY,
            ),
            last_sync_timestamp: gauge_vec(
                "sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
                FAMILY,
            ),
            last_queued_timestamp: gauge_vec(
                "sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
                FAMILY,
            ),
            network_programming: histogram_vec(
                "network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                network_programming_buckets(),
                FAMILY,
            ),
            endpoint_changes_pending: gauge(
                "sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules Endpoint changes",
            ),
            endpoint_changes_total: counter(
                "sync_proxy_rules_endpoint_changes_total",
                "Cumulative proxy rules Endpoint changes",
            ),
            service_changes_pending: gauge(
                "sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
            ),
            service_changes_total: counter(
                "sync_proxy_rules_service_changes_total",
                "Cumulative proxy rules Service changes",
            ),
            no_local_endpoints: gauge_vec(
                "sync_proxy_rules_no_local_endpoints_total",
                "Number of services with a Local traffic policy and no endpoints",
                &["ip_family", "traffic_policy"],
            ),
            healthz_total: counter_vec(
                "proxy_healthz_total",
                "Cumulative proxy healthz HTTP status",
                &["code"],
            ),
            livez_total: counter_vec(
                "proxy_livez_total",
                "Cumulative proxy livez HTTP status",
                &["code"],
            ),
            conntrack_reconcile_duration: histogram_vec(
                "conntrack_reconciler_sync_duration_seconds",
                "Time one reconcile of stale conntrack flows took, in seconds",
                sync_buckets(),
                FAMILY,
            ),
            conntrack_reconcile_deleted_total: counter_vec(
                "conntrack_reconciler_deleted_entries_total",
                "Cumulative conntrack flows deleted by conntrack reconciler",
                FAMILY,
            ),
            sync_full_duration: histogram_vec(
                "sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                sync_buckets(),
                FAMILY,
            ),
            sync_partial_duration: histogram_vec(
                "sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                sync_buckets(),
                FAMILY,
            ),
            iptables_restore_failures_total: counter_vec(
                "sync_proxy_rules_iptables_restore_failures_total",
                "Cumulative proxy iptables restore failures",
                FAMILY,
            ),
            iptables_partial_restore_failures_total: counter_vec(
                "sync_proxy_rules_iptables_partial_restore_failures_total",
                "Cumulative proxy iptables partial restore failures",
                FAMILY,
            ),
            iptables_rules_total: int_gauge_vec(
                "sync_proxy_rules_iptables_total",
                "Total number of iptables rules owned by kube-proxy",
                FAMILY_TABLE,
            ),
            iptables_rules_last: int_gauge_vec(
                "sync_proxy_rules_iptables_last",
                "Number of iptables rules written by kube-proxy in last sync",
                FAMILY_TABLE,
            ),
            nftables_sync_failures_total: counter_vec(
                "sync_proxy_rules_nftables_sync_failures_total",
                "Cumulative proxy nftables sync failures",
                FAMILY,
            ),
            nftables_cleanup_failures_total: counter_vec(
                "sync_proxy_rules_nftables_cleanup_failures_total",
                "Cumulative proxy nftables cleanup failures",
                FAMILY,
            ),
            sync_failures_total: counter(
                "sync_proxy_rules_failures_total",
                "Cumulative failed dataplane syncs",
            ),
            map_entries: gauge_vec(
                "ebpf_map_entries",
                "Entries the agent keeps in each BPF map",
                &["map"],
            ),
            map_capacity: gauge_vec(
                "ebpf_map_capacity",
                "Capacity (max_entries) of each BPF map",
                &["map"],
            ),
            services_not_programmed: gauge(
                "ebpf_services_not_programmed",
                "Services left out of the BPF maps because a map is full",
            ),
            map_growths_total: counter_vec(
                "ebpf_map_growths_total",
                "BPF maps replaced by bigger ones holding the same entries, by map",
                &["map"],
            ),
            foreign_proxy_detected: gauge(
                "foreign_proxy_detected",
                "1 while another proxy's rules or tables (kube-proxy's) are on this node",
            ),
            build_info: built(
                "kubernetes_build_info",
                IntGaugeVec::new(
                    Opts::new(
                        "kubernetes_build_info",
                        "A metric with a constant '1' value labeled by the version and build of this agent (component-base's labels)",
                    ),
                    &BUILD_INFO_LABELS,
                ),
            ),
            fallbacks_total: counter_vec(
                "proxy_mode_fallbacks_total",
                "Proxy mode fallbacks taken at start-up",
                &["from", "to"],
            ),
            objects_rejected_total: counter_vec(
                "objects_rejected_total",
                "Services and EndpointSlices skipped because they are invalid",
                &["kind"],
            ),
            udp_sockets_terminated_total: counter(
                "ebpf_udp_sockets_terminated_total",
                "Connected UDP sockets destroyed because their backend no longer serves their Service",
            ),
            udp_socket_sweeps_total: counter_vec(
                "ebpf_udp_socket_sweeps_total",
                "Searches for connected UDP sockets to removed backends, by result (complete, netns_unreachable, kernel_unsupported, failed)",
                &["result"],
            ),
            component: None,
        };
        m.component = super::component_metrics::register(&m.registry)
            .inspect_err(
                |e| tracing::error!(error = %e, "cannot register component-base's metrics"),
            )
            .ok();
        let r = &m.registry;
        register(r, &m.sync_duration);
        register(r, &m.last_queued_timestamp);
        register(r, &m.last_sync_timestamp);
        register(r, &m.endpoint_changes_pending);
        register(r, &m.endpoint_changes_total);
        register(r, &m.service_changes_pending);
        register(r, &m.service_changes_total);
        register(r, &m.healthz_total);
        register(r, &m.livez_total);
        register(r, &m.network_programming);
        register(r, &m.no_local_endpoints);
        register(r, &m.sync_failures_total);
        register(r, &m.map_entries);
        register(r, &m.map_capacity);
        register(r, &m.services_not_programmed);
        register(r, &m.map_growths_total);
        register(r, &m.fallbacks_total);
        register(r, &m.objects_rejected_total);
        register(r, &m.udp_sockets_terminated_total);
        register(r, &m.udp_socket_sweeps_total);
        // process_cpu_seconds_total, process_resident_memory_bytes, process_start_time_seconds,
        // ... as client_golang's process collector exports them for kube-proxy.
        if let Err(e) = r.register(Box::new(ProcessMetrics::new())) {
            tracing::error!(error = %e, "cannot register the process metrics");
        }
        if let Err(e) = crate::k8s::client_metrics::register(r) {
            tracing::error!(error = %e, "cannot register the rest_client metrics");
        }
        register(r, &m.build_info);
        register(r, &m.foreign_proxy_detected);
        let labels = build_info_labels();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        m.build_info.with_label_values(&labels).set(1);
        m.count_registered();
        m
    }

    /// `kubernetes_feature_enabled` from the configuration's `featureGates`.
    pub fn set_feature_gates(&self, feature_gates: &std::collections::BTreeMap<String, bool>) {
        if let Some(component) = &self.component {
            component.set_feature_gates(feature_gates);
        }
    }

    fn count_registered(&self) {
        if let Some(component) = &self.component {
            component.count_registered(&self.registry);
        }
    }

    /// Shows the node's families in the sync timestamps before the first sync, at 0
    /// ("never"), as the unlabelled gauges showed it: a reader that waits for the first
    /// sync tells "not yet" from "no such gauge". Called before the servers start.
    pub fn start_families(&self, families: &[IpFamily]) {
        for family in families {
            let label = [family.as_api_str()];
            self.last_sync_timestamp.with_label_values(&label).set(0.0);
            self.last_queued_timestamp
                .with_label_values(&label)
                .set(0.0);
        }
    }

    /// Adds the families of `mode`, as upstream's `RegisterMetrics(mode)`, with the
    /// counters labelled by `ip_family` started at 0 for `families` (the node's). Called
    /// once, when the mode is chosen.
    pub fn register_mode(&self, mode: MetricsMode, families: &[IpFamily]) {
        let r = &self.registry;
        // The conntrack reconciler runs after the syncs of every mode of ours.
        register(r, &self.conntrack_reconcile_duration);
        register(r, &self.conntrack_reconcile_deleted_total);
        let mut family_counters = vec![&self.conntrack_reconcile_deleted_total];
        match mode {
            MetricsMode::Iptables => {
                register(r, &self.sync_full_duration);
                register(r, &self.sync_partial_duration);
                register(r, &self.iptables_restore_failures_total);
                register(r, &self.iptables_partial_restore_failures_total);
                register(r, &self.iptables_rules_total);
                register(r, &self.iptables_rules_last);
                family_counters.push(&self.iptables_restore_failures_total);
                family_counters.push(&self.iptables_partial_restore_failures_total);
            }
            MetricsMode::Ipvs => {
                register(r, &self.iptables_restore_failures_total);
                family_counters.push(&self.iptables_restore_failures_total);
            }
            MetricsMode::Nftables => {
                register(r, &self.nftables_sync_failures_total);
                register(r, &self.nftables_cleanup_failures_total);
                family_counters.push(&self.nftables_sync_failures_total);
                family_counters.push(&self.nftables_cleanup_failures_total);
            }
            // Upstream's nftables mode without its nftables counters: nothing of ours
            // would ever increment them.
            MetricsMode::Ebpf => {}
        }
        for family in families {
            let label = [family.as_api_str()];
            for counter in &family_counters {
                counter.with_label_values(&label).inc_by(0);
            }
        }
        self.count_registered();
    }

    /// Adds a counter read from the kernel at each scrape (iptables mode's upstream nfacct
    /// counters); no sample while `read` has no value. `name` is without the `kubeproxy_`
    /// namespace.
    pub fn register_packet_counter(&self, name: &str, help: &str, read: PacketCountReader) {
        let collector = PacketCounter {
            counter: counter(name, help),
            read,
        };
        if let Err(e) = self.registry.register(Box::new(collector)) {
            tracing::error!(error = %e, name, "packet counter registered twice");
        }
        self.count_registered();
    }

    /// Adds counters of one `label` read at each scrape (every value `read` gives, zeros
    /// included, so that a rate query sees the series from the start); no sample while
    /// `read` has no value. `name` is without the `kubeproxy_` namespace.
    pub fn register_labelled_packet_counter(
        &self,
        name: &str,
        help: &str,
        label: &str,
        read: LabelledCountReader,
    ) {
        let collector = LabelledPacketCounter {
            counters: counter_vec(name, help, &[label]),
            read,
        };
        if let Err(e) = self.registry.register(Box::new(collector)) {
            tracing::error!(error = %e, name, "packet counter registered twice");
        }
        self.count_registered();
    }

    /// Counts a failed rules transaction of `mode`: an iptables-restore (iptables and ipvs
    /// modes) or an `nft` transaction (nftables mode).
    pub fn restore_failed(&self, mode: &str, failure: &RestoreFailure) {
        let label = [failure.family.as_api_str()];
        if mode == crate::proxier::nftables::MODE {
            self.nftables_sync_failures_total
                .with_label_values(&label)
                .inc();
            return;
        }
        self.iptables_restore_failures_total
            .with_label_values(&label)
            .inc();
        if failure.partial {
            self.iptables_partial_restore_failures_total
                .with_label_values(&label)
                .inc();
        }
    }

    /// Services without local endpoints, by family and traffic policy.
    pub fn set_no_local_endpoints(&self, family: IpFamily, internal: usize, external: usize) {
        let family = family.as_api_str();
        self.no_local_endpoints
            .with_label_values(&[family, "internal"])
            .set(internal as f64);
        self.no_local_endpoints
            .with_label_values(&[family, "external"])
            .set(external as f64);
    }

    /// The per-family gauges of a successful sync: services without local endpoints and
    /// (iptables mode) the rules of each table.
    pub fn family_reports(&self, reports: &[FamilyReport]) {
        for report in reports {
            self.set_no_local_endpoints(
                report.family,
                report.no_local_endpoints_internal,
                report.no_local_endpoints_external,
            );
            if report.nftables_cleanup_failed {
                self.nftables_cleanup_failures_total
                    .with_label_values(&[report.family.as_api_str()])
                    .inc();
            }
            for rules in &report.iptables_rules {
                let labels = [report.family.as_api_str(), rules.table];
                self.iptables_rules_total
                    .with_label_values(&labels)
                    .set(i64::try_from(rules.total).unwrap_or(i64::MAX));
                self.iptables_rules_last
                    .with_label_values(&labels)
                    .set(i64::try_from(rules.last).unwrap_or(i64::MAX));
            }
        }
    }

    /// Counts one sync's sweep for connected UDP sockets (nothing when it did not sweep).
    pub fn connected_udp_sweep(&self, sweep: &crate::proxier::SocketSweep) {
        if !sweep.swept {
            return;
        }
        self.udp_socket_sweeps_total
            .with_label_values(&[sweep.result()])
            .inc();
        self.udp_sockets_terminated_total
            .inc_by(u64::try_from(sweep.terminated).unwrap_or(u64::MAX));
    }

    pub fn healthz_total(&self, healthy: bool) {
        let code = if healthy { "200" } else { "503" };
        self.healthz_total.with_label_values(&[code]).inc();
    }

    pub fn livez_total(&self, healthy: bool) {
        let code = if healthy { "200" } else { "503" };
        self.livez_total.with_label_values(&[code]).inc();
    }

    /// Sets a per-family timestamp gauge to `t` (seconds since the epoch).
    pub fn set_timestamp(gauge: &GaugeVec, family: IpFamily, t: SystemTime) {
        let secs = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        gauge.with_label_values(&[family.as_api_str()]).set(secs);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
