// SPDX-License-Identifier: Apache-2.0
//! Upstream kube-proxy's metric list, for the tests that compare the agent's `/metrics`
//! with it (the registry's unit tests and the test that scrapes a running agent).

use super::metrics::MetricsMode;

/// Upstream kube-proxy's metrics, as the Kubernetes Metrics Reference for v1.36 lists them
/// (<https://kubernetes.io/docs/reference/instrumentation/metrics/>, the `kubeproxy_*`
/// entries: name, type, labels; the two nfacct counters are "Custom" there and exposed
/// as counters), grouped by the mode that registers them as
/// kubernetes/kubernetes pkg/proxy/metrics/metrics.go `RegisterMetrics(mode)` does
/// (common block; `ProxyModeIPTables`; `ProxyModeIPVS`; `ProxyModeNFTables`). The
/// conntrack reconciler's two families are registered by every Linux mode (the reconciler
/// runs after each mode's syncs). Buckets: metrics.go's `ExponentialBuckets(0.001, 2, 15)`
/// for the sync and reconcile histograms and the merged linear buckets of
/// `network_programming_duration_seconds`.
/// Written out here from those pages, not derived from our registry.
pub const UPSTREAM: &[(&str, &str, &[&str], Group)] = &[
    (
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "histogram",
        &["ip_family"],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "gauge",
        &["ip_family"],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "gauge",
        &["ip_family"],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "gauge",
        &[],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "counter",
        &[],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "gauge",
        &[],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "counter",
        &[],
        Group::Common,
    ),
    (
        "kubeproxy_proxy_healthz_total",
        "counter",
        &["code"],
        Group::Common,
    ),
    (
        "kubeproxy_proxy_livez_total",
        "counter",
        &["code"],
        Group::Common,
    ),
    (
        "kubeproxy_network_programming_duration_seconds",
        "histogram",
        &["ip_family"],
        Group::Common,
    ),
    (
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "gauge",
        &["ip_family", "traffic_policy"],
        Group::Common,
    ),
    (
        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
        "histogram",
        &["ip_family"],
        Group::Common,
    ),
    (
        "kubeproxy_conntrack_reconciler_deleted_entries_total",
        "counter",
        &["ip_family"],
        Group::Common,
    ),
    (
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
        "counter",
        &[],
        Group::Iptables,
    ),
    (
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        "counter",
        &[],
        Group::Iptables,
    ),
    (
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "histogram",
        &["ip_family"],
        Group::Iptables,
    ),
    (
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "histogram",
        &["ip_family"],
        Group::Iptables,
    ),
    (
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "counter",
        &["ip_family"],
        Group::IptablesAndIpvs,
    ),
    (
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        "counter",
        &["ip_family"],
        Group::Iptables,
    ),
    (
        "kubeproxy_sync_proxy_rules_iptables_total",
        "gauge",
        &["ip_family", "table"],
        Group::Iptables,
    ),
    (
        "kubeproxy_sync_proxy_rules_iptables_last",
        "gauge",
        &["ip_family", "table"],
        Group::Iptables,
    ),
    (
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
        "counter",
        &["ip_family"],
        Group::Nftables,
    ),
    (
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
        "counter",
        &["ip_family"],
        Group::Nftables,
    ),
];

/// Upstream metrics the agent does not export, with the reason: none any more (the
/// localhost NodePort counter is read from nfacct, as upstream's).
pub const NOT_EXPORTED: &[(&str, &str)] = &[];

/// Which modes register a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Common,
    Iptables,
    IptablesAndIpvs,
    Nftables,
}

impl Group {
    pub fn in_mode(self, mode: MetricsMode) -> bool {
        match self {
            Group::Common => true,
            Group::Iptables => mode == MetricsMode::Iptables,
            Group::IptablesAndIpvs => matches!(mode, MetricsMode::Iptables | MetricsMode::Ipvs),
            Group::Nftables => mode == MetricsMode::Nftables,
        }
    }
}
