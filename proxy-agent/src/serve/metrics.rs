// SPDX-License-Identifier: Apache-2.0
//! Prometheus metrics on metricsBindAddress (default 127.0.0.1:10249), with upstream
//! kube-proxy's `kubeproxy_*` names, types and buckets, plus the dataplane's own.

use std::time::SystemTime;

use prometheus::{
    Encoder as _, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, Opts, Registry, TextEncoder, exponential_buckets,
};

const NS: &str = "kubeproxy";

/// Handles to every metric; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub sync_full_duration: Histogram,
    pub sync_partial_duration: Histogram,
    pub last_sync_timestamp: Gauge,
    pub last_queued_timestamp: Gauge,
    pub network_programming: Histogram,
    pub endpoint_changes_pending: IntGauge,
    pub endpoint_changes_total: IntCounter,
    pub service_changes_pending: IntGauge,
    pub service_changes_total: IntCounter,
    pub no_local_endpoints: GaugeVec,
    pub sync_failures_total: IntCounter,
    /// The stale UDP conntrack reconciler, by `ip_family` (ebpf mode: its BPF conntrack
    /// cleanup).
    pub conntrack_reconcile_duration: HistogramVec,
    pub conntrack_reconcile_deleted_total: IntCounterVec,
    healthz_total: IntCounterVec,
    livez_total: IntCounterVec,
    /// Ours: entries and capacity per BPF map, services left out of full maps, fallbacks
    /// taken, objects rejected.
    pub map_entries: GaugeVec,
    pub map_capacity: GaugeVec,
    pub services_not_programmed: IntGauge,
    pub fallbacks_total: IntCounterVec,
    pub objects_rejected_total: IntCounterVec,
    /// Ours: connected UDP sockets terminated because their backend left the Service,
    /// and the sweeps that looked for them, by result (ebpf mode).
    pub udp_sockets_terminated_total: IntCounter,
    pub udp_socket_sweeps_total: IntCounterVec,
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(
        HistogramOpts::new(name, help)
            .namespace(NS)
            .buckets(buckets),
    )
    .unwrap_or_else(|e| panic!("metric {name} is well-formed: {e}"));
    registry
        .register(Box::new(h.clone()))
        .unwrap_or_else(|e| panic!("metric {name} registered once: {e}"));
    h
}

macro_rules! register {
    ($registry:expr, $metric:expr) => {{
        let m = $metric.expect("metric options are well-formed");
        $registry
            .register(Box::new(m.clone()))
            .expect("each metric is registered once");
        m
    }};
}

/// Upstream's network-programming buckets: 0.25 s, 0.5 s, 1..59 s, 60..115 s, 2..5 min.
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let sync_buckets = || exponential_buckets(0.001, 2.0, 15).unwrap_or_default();
        Self {
            sync_duration: histogram(
                &r,
                "sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                sync_buckets(),
            ),
            sync_full_duration: histogram(
                &r,
                "sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                sync_buckets(),
            ),
            sync_partial_duration: histogram(
                &r,
                "sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                sync_buckets(),
            ),
            last_sync_timestamp: register!(
                r,
                Gauge::with_opts(
                    Opts::new(
                        "sync_proxy_rules_last_timestamp_seconds",
                        "The last time proxy rules were successfully synced"
                    )
                    .namespace(NS)
                )
            ),
            last_queued_timestamp: register!(
                r,
                Gauge::with_opts(
                    Opts::new(
                        "sync_proxy_rules_last_queued_timestamp_seconds",
                        "The last time a sync of proxy rules was queued"
                    )
                    .namespace(NS)
                )
            ),
            network_programming: histogram(
                &r,
                "network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                network_programming_buckets(),
            ),
            endpoint_changes_pending: register!(
                r,
                IntGauge::with_opts(
                    Opts::new(
                        "sync_proxy_rules_endpoint_changes_pending",
                        "Pending proxy rules Endpoint changes"
                    )
                    .namespace(NS)
                )
            ),
            endpoint_changes_total: register!(
                r,
                IntCounter::with_opts(
                    Opts::new(
                        "sync_proxy_rules_endpoint_changes_total",
                        "Cumulative proxy rules Endpoint changes"
                    )
                    .namespace(NS)
                )
            ),
            service_changes_pending: register!(
                r,
                IntGauge::with_opts(
                    Opts::new(
                        "sync_proxy_rules_service_changes_pending",
                        "Pending proxy rules Service changes"
                    )
                    .namespace(NS)
                )
            ),
            service_changes_total: register!(
                r,
                IntCounter::with_opts(
                    Opts::new(
                        "sync_proxy_rules_service_changes_total",
                        "Cumulative proxy rules Service changes"
                    )
                    .namespace(NS)
                )
            ),
            no_local_endpoints: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "sync_proxy_rules_no_local_endpoints_total",
                        "Number of services with a Local traffic policy and no endpoints"
                    )
                    .namespace(NS),
                    &["traffic_policy"]
                )
            ),
            sync_failures_total: register!(
                r,
                IntCounter::with_opts(
                    Opts::new(
                        "sync_proxy_rules_failures_total",
                        "Cumulative failed dataplane syncs"
                    )
                    .namespace(NS)
                )
            ),
            conntrack_reconcile_duration: register!(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "conntrack_reconciler_sync_duration_seconds",
                        "ReconcileConntrackFlowsLatency latency in seconds"
                    )
                    .namespace(NS)
                    .buckets(sync_buckets()),
                    &["ip_family"]
                )
            ),
            conntrack_reconcile_deleted_total: register!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "conntrack_reconciler_deleted_entries_total",
                        "Cumulative conntrack flows deleted by conntrack reconciler"
                    )
                    .namespace(NS),
                    &["ip_family"]
                )
            ),
            healthz_total: register!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "proxy_healthz_total",
                        "Cumulative proxy healthz HTTP status"
                    )
                    .namespace(NS),
                    &["code"]
                )
            ),
            livez_total: register!(
                r,
                IntCounterVec::new(
                    Opts::new("proxy_livez_total", "Cumulative proxy livez HTTP status")
                        .namespace(NS),
                    &["code"]
                )
            ),
            map_entries: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "ebpf_map_entries",
                        "Entries the agent keeps in each BPF map"
                    )
                    .namespace(NS),
                    &["map"]
                )
            ),
            map_capacity: register!(
                r,
                GaugeVec::new(
                    Opts::new(
                        "ebpf_map_capacity",
                        "Capacity (max_entries) of each BPF map"
                    )
                    .namespace(NS),
                    &["map"]
                )
            ),
            services_not_programmed: register!(
                r,
                IntGauge::with_opts(
                    Opts::new(
                        "ebpf_services_not_programmed",
                        "Services left out of the BPF maps because a map is full"
                    )
                    .namespace(NS)
                )
            ),
            fallbacks_total: register!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "proxy_mode_fallbacks_total",
                        "Proxy mode fallbacks taken at start-up"
                    )
                    .namespace(NS),
                    &["from", "to"]
                )
            ),
            objects_rejected_total: register!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "objects_rejected_total",
                        "Services and EndpointSlices skipped because they are invalid"
                    )
                    .namespace(NS),
                    &["kind"]
                )
            ),
            udp_sockets_terminated_total: register!(
                r,
                IntCounter::with_opts(
                    Opts::new(
                        "ebpf_udp_sockets_terminated_total",
                        "Connected UDP sockets destroyed because their backend no longer serves their Service"
                    )
                    .namespace(NS)
                )
            ),
            udp_socket_sweeps_total: register!(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "ebpf_udp_socket_sweeps_total",
                        "Searches for connected UDP sockets to removed backends, by result (complete, netns_unreachable, kernel_unsupported, failed)"
                    )
                    .namespace(NS),
                    &["result"]
                )
            ),
            registry: r,
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

    pub fn set_timestamp(gauge: &Gauge, t: SystemTime) {
        let secs = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        gauge.set(secs);
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
mod tests {
    use super::*;

    #[test]
    fn families_carry_upstream_names_and_types() {
        let m = Metrics::new();
        m.sync_duration.observe(0.01);
        m.endpoint_changes_total.inc();
        Metrics::set_timestamp(&m.last_sync_timestamp, SystemTime::UNIX_EPOCH);
        let page = m.render();
        for (name, kind) in [
            ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
            (
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_network_programming_duration_seconds",
                "histogram",
            ),
            ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
            (
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "gauge",
            ),
        ] {
            assert!(
                page.contains(&format!("# TYPE {name} {kind}")),
                "{name} {kind} missing:\n{page}"
            );
        }
        assert!(
            page.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"} 0")
        );
        assert!(
            page.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"16.384\"} 1")
        );
        assert!(page.contains("kubeproxy_sync_proxy_rules_endpoint_changes_total 1"));
    }

    #[test]
    fn conntrack_reconciler_metrics_carry_upstream_names() {
        let m = Metrics::new();
        m.conntrack_reconcile_duration
            .with_label_values(&["IPv4"])
            .observe(0.002);
        m.conntrack_reconcile_deleted_total
            .with_label_values(&["IPv4"])
            .inc_by(3);
        let page = m.render();
        assert!(
            page.contains("# TYPE kubeproxy_conntrack_reconciler_sync_duration_seconds histogram")
        );
        assert!(
            page.contains("# TYPE kubeproxy_conntrack_reconciler_deleted_entries_total counter")
        );
        assert!(page.contains(
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 3"
        ));
    }

    #[test]
    fn connected_udp_sweeps_are_counted_by_result() {
        use crate::proxier::{SocketSweep, SocketSweepUnsupported as Unsupported};
        let m = Metrics::new();
        m.connected_udp_sweep(&SocketSweep::default());
        m.connected_udp_sweep(&SocketSweep {
            swept: true,
            terminated: 2,
            ..Default::default()
        });
        m.connected_udp_sweep(&SocketSweep {
            swept: true,
            unsupported: Some(Unsupported::SockDestroy),
            ..Default::default()
        });
        let page = m.render();
        assert!(page.contains("# TYPE kubeproxy_ebpf_udp_sockets_terminated_total counter"));
        assert!(page.contains("kubeproxy_ebpf_udp_sockets_terminated_total 2"));
        assert!(page.contains("kubeproxy_ebpf_udp_socket_sweeps_total{result=\"complete\"} 1"));
        assert!(
            page.contains(
                "kubeproxy_ebpf_udp_socket_sweeps_total{result=\"kernel_unsupported\"} 1"
            )
        );
    }

    #[test]
    fn full_maps_are_visible() {
        let m = Metrics::new();
        m.services_not_programmed.set(3);
        m.map_entries.with_label_values(&["SVC4_V1"]).set(8.0);
        m.map_capacity.with_label_values(&["SVC4_V1"]).set(8.0);
        let page = m.render();
        assert!(page.contains("# TYPE kubeproxy_ebpf_services_not_programmed gauge"));
        assert!(page.contains("kubeproxy_ebpf_services_not_programmed 3"));
        assert!(page.contains("kubeproxy_ebpf_map_entries{map=\"SVC4_V1\"} 8"));
        assert!(page.contains("kubeproxy_ebpf_map_capacity{map=\"SVC4_V1\"} 8"));
    }

    #[test]
    fn network_programming_buckets_match_upstream() {
        let b = network_programming_buckets();
        assert_eq!(&b[..4], &[0.0, 0.25, 0.5, 1.0]);
        assert_eq!(b.iter().filter(|v| **v >= 60.0 && **v < 120.0).count(), 12);
        assert_eq!(b.last().copied(), Some(300.0));
        assert_eq!(b.len(), 1 + 2 + 59 + 12 + 7);
    }
}
