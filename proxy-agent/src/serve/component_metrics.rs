// SPDX-License-Identifier: Apache-2.0
//! The families upstream's kube-proxy binary exposes beside its own `kubeproxy_*`, so that
//! a dashboard or alert written against a kube-proxy scrape finds each of them here:
//!
//! - component-base's: `kubernetes_feature_enabled{name,stage}` for the feature gates
//!   that steer what this agent does (upstream lists every gate of Kubernetes; a gate the
//!   configuration sets takes its value), `registered_metrics_total` by stability level,
//!   and the metric framework's own counters (`disabled_metrics_total`,
//!   `hidden_metrics_total`, `cardinality_enforcement_unexpected_categorizations_total`),
//!   which stay 0 here as there.
//! - the families of apiserver libraries the binary links (audit, envelope encryption,
//!   declarative validation, webhook certificates, discovery aggregation): idle in a
//!   proxy, upstream's always read 0, and so do these.
//!
//! The list and the HELP texts are upstream 1.37's, compared by the test that scrapes
//! upstream's kube-proxy beside the agent (tests, real_apiserver.rs).

use std::collections::BTreeMap;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    exponential_buckets,
};

/// The gates that change what kube-proxy 1.37 does, with their stage and default.
const GATES: &[(&str, &str, bool)] = &[
    ("ContextualLogging", "BETA", true),
    ("KubeProxyIPVS", "DEPRECATED", true),
    ("KubeProxyNFTablesLocalhostNodePorts", "ALPHA", false),
    ("LoggingAlphaOptions", "ALPHA", false),
    ("LoggingBetaOptions", "BETA", true),
    ("MultiCIDRServiceAllocator", "", true),
    ("NFTablesProxyMode", "", true),
    ("PreferSameTrafficDistribution", "", true),
    ("RelaxedServiceNameValidation", "", true),
];

/// Counters of linked apiserver libraries, idle in a proxy: name and upstream's HELP.
const IDLE_COUNTERS: &[(&str, &str)] = &[
    (
        "aggregator_discovery_aggregation_count_total",
        "[ALPHA] Counter of number of times discovery was aggregated",
    ),
    (
        "apiserver_audit_event_total",
        "[ALPHA] Counter of audit events generated and sent to the audit backend.",
    ),
    (
        "apiserver_audit_requests_rejected_total",
        "[ALPHA] Counter of apiserver requests rejected due to an error in audit logging backend.",
    ),
    (
        "apiserver_storage_data_key_generation_failures_total",
        "[ALPHA] Total number of failed data encryption key(DEK) generation operations.",
    ),
    (
        "apiserver_storage_envelope_transformation_cache_misses_total",
        "[ALPHA] Total number of cache misses while accessing key decryption key(KEK).",
    ),
    (
        "apiserver_validation_declarative_validation_mismatch_total",
        "[BETA] Number of times declarative validation results differed from handwritten validation results for core types.",
    ),
    (
        "apiserver_validation_declarative_validation_panic_total",
        "[BETA] Number of times declarative validation has panicked during validation.",
    ),
    (
        "apiserver_validation_duplicate_validation_error_total",
        "[INTERNAL] Number of duplicate validation errors during validation.",
    ),
    (
        "apiserver_webhooks_x509_insecure_sha1_total",
        "[BETA] Counts the number of requests to servers with insecure SHA1 signatures in their serving certificate OR the number of connection failures due to the insecure SHA1 signatures (either/or, based on the runtime environment)",
    ),
    (
        "apiserver_webhooks_x509_missing_san_total",
        "[BETA] Counts the number of requests to servers missing SAN extension in their serving certificate OR the number of connection failures due to the lack of x509 certificate SAN extension missing (either/or, based on the runtime environment)",
    ),
    (
        "cardinality_enforcement_unexpected_categorizations_total",
        "[ALPHA] The count of unexpected categorizations during cardinality enforcement.",
    ),
    (
        "disabled_metrics_total",
        "[BETA] The count of disabled metrics.",
    ),
    (
        "hidden_metrics_total",
        "[BETA] The count of hidden metrics.",
    ),
];

/// The families that follow the agent's state: which gates are on, how many families
/// are registered.
#[derive(Clone)]
pub struct ComponentFamilies {
    enabled: IntGaugeVec,
    registered: IntCounterVec,
}

impl ComponentFamilies {
    /// The gates' values: `feature_gates` (the configuration's) over their defaults.
    pub fn set_feature_gates(&self, feature_gates: &BTreeMap<String, bool>) {
        for (name, stage, default) in GATES {
            let on = feature_gates.get(*name).copied().unwrap_or(*default);
            self.enabled
                .with_label_values(&[name, stage])
                .set(i64::from(on));
        }
    }

    /// Counts the families `registry` holds now (all of this agent's are alpha).
    pub fn count_registered(&self, registry: &Registry) {
        let count = registry.gather().len() as u64;
        let counter = self.registered.with_label_values(&["", "ALPHA"]);
        counter.reset();
        counter.inc_by(count);
    }
}

/// Registers the families (see the module doc), the gates at their defaults.
pub fn register(registry: &Registry) -> prometheus::Result<ComponentFamilies> {
    let enabled = IntGaugeVec::new(
        Opts::new(
            "kubernetes_feature_enabled",
            "[BETA] This metric records the data about the stage and enablement of a k8s feature.",
        ),
        &["name", "stage"],
    )?;
    registry.register(Box::new(enabled.clone()))?;
    let registered = IntCounterVec::new(
        Opts::new(
            "registered_metrics_total",
            "[BETA] The count of registered metrics broken by stability level and deprecation version.",
        ),
        &["deprecated_version", "stability_level"],
    )?;
    registry.register(Box::new(registered.clone()))?;
    for (name, help) in IDLE_COUNTERS {
        registry.register(Box::new(IntCounter::new(*name, *help)?))?;
    }
    registry.register(Box::new(IntGauge::new(
        "apiserver_envelope_encryption_dek_cache_fill_percent",
        "[ALPHA] Percent of the cache slots currently occupied by cached DEKs.",
    )?))?;
    registry.register(Box::new(Histogram::with_opts(
        HistogramOpts::new(
            "apiserver_storage_data_key_generation_duration_seconds",
            "[ALPHA] Latencies in seconds of data encryption key(DEK) generation operations.",
        )
        .buckets(exponential_buckets(5e-6, 2.0, 14)?),
    )?))?;
    let families = ComponentFamilies {
        enabled,
        registered,
    };
    families.set_feature_gates(&BTreeMap::new());
    families.count_registered(registry);
    Ok(families)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_gate_takes_its_value_and_the_rest_their_default() {
        let registry = Registry::new();
        let gates = BTreeMap::from([("KubeProxyNFTablesLocalhostNodePorts".to_owned(), true)]);
        let families = register(&registry).unwrap();
        families.set_feature_gates(&gates);
        families.count_registered(&registry);
        let mut page = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut page,
        )
        .unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains(
            "kubernetes_feature_enabled{name=\"KubeProxyNFTablesLocalhostNodePorts\",stage=\"ALPHA\"} 1"
        ));
        assert!(page.contains(
            "kubernetes_feature_enabled{name=\"LoggingAlphaOptions\",stage=\"ALPHA\"} 0"
        ));
        assert!(page.contains("apiserver_audit_event_total 0"));
        let registered = format!(
            "registered_metrics_total{{deprecated_version=\"\",stability_level=\"ALPHA\"}} {}",
            registry.gather().len()
        );
        assert!(page.contains(&registered), "{page}");
    }
}
