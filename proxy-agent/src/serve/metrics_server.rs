// SPDX-License-Identifier: Apache-2.0
//! The metrics server (metricsBindAddress): `/metrics` in the Prometheus text format, plus
//! upstream's plain `/healthz`, `/proxyMode` and `/configz` on the same port.

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use tracing::info;

use super::{health::ProxyHealth, metrics::Metrics};
use crate::config::KubeProxyConfiguration;

/// The configuration group `/configz` keys the configuration by, as upstream registers it
/// (`configz.New(proxyconfigapi.GroupName)`).
pub const CONFIGZ_GROUP: &str = "kubeproxy.config.k8s.io";

/// `/configz`'s body: `{"kubeproxy.config.k8s.io": <the effective configuration>}`, the
/// defaulted, validated configuration the agent runs with, in the form upstream reports
/// it (`as_upstream_reports`). Computed once: the agent exits when its configuration
/// changes.
pub fn configz_body(config: &KubeProxyConfiguration) -> String {
    let mut body = serde_json::Map::new();
    let value = match serde_json::to_value(config) {
        Ok(mut value) => {
            as_upstream_reports(&mut value);
            value
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot render the configuration for /configz");
            serde_json::Value::Null
        }
    };
    body.insert(CONFIGZ_GROUP.to_string(), value);
    serde_json::Value::Object(body).to_string()
}

/// Upstream serves its internal configuration converted back to v1alpha1
/// (pkg/proxy/apis/config/v1alpha1/conversion.go), which keeps one sync period pair and one
/// masqueradeAll, the running mode's (ipvs, nftables, else iptables), and leaves the other
/// modes' at zero; Go writes an empty list as `null` and a whole float32 without a
/// fraction; and 1.37 has no `udpIdleTimeout` (the userspace proxy's, which this agent
/// still reads).
fn as_upstream_reports(value: &mut serde_json::Value) {
    use serde_json::Value;
    let Some(config) = value.as_object_mut() else {
        return;
    };
    let mode = config
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let periods_of = match mode {
        "ipvs" => "ipvs",
        "nftables" => "nftables",
        _ => "iptables",
    };
    let masquerade_of = if mode == "nftables" {
        "nftables"
    } else {
        "iptables"
    };
    for section in ["iptables", "ipvs", "nftables"] {
        let Some(fields) = config.get_mut(section).and_then(Value::as_object_mut) else {
            continue;
        };
        if section != periods_of {
            for period in ["syncPeriod", "minSyncPeriod"] {
                fields.insert(period.to_owned(), Value::from("0s"));
            }
        }
        if section != masquerade_of && fields.contains_key("masqueradeAll") {
            fields.insert("masqueradeAll".to_owned(), Value::Bool(false));
        }
        if let Some(list) = fields.get_mut("excludeCIDRs") {
            empty_list_as_null(list);
        }
    }
    if let Some(list) = config.get_mut("nodePortAddresses") {
        empty_list_as_null(list);
    }
    if let Some(qps) = config
        .get_mut("clientConnection")
        .and_then(|c| c.get_mut("qps"))
        && let Some(number) = qps.as_f64()
        && number.fract() == 0.0
        && number.abs() < 1e15
    {
        *qps = Value::from(number as i64);
    }
    config.remove("udpIdleTimeout");
}

fn empty_list_as_null(list: &mut serde_json::Value) {
    if list.as_array().is_some_and(Vec::is_empty) {
        *list = serde_json::Value::Null;
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: ProxyHealth,
    configz: Arc<String>,
}

async fn metrics_page(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
}

async fn healthz_plain(State(app): State<AppState>) -> impl IntoResponse {
    // The metrics server's /healthz is the generic "the process is up" check.
    let _ = &app.health;
    "ok"
}

async fn proxy_mode(State(app): State<AppState>) -> impl IntoResponse {
    app.health.proxy_mode()
}

async fn configz(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        app.configz.as_str().to_owned(),
    )
}

/// The server's routes.
pub fn router(metrics: Metrics, health: ProxyHealth, configz_json: String) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz_plain))
        .route("/proxyMode", get(proxy_mode))
        .route("/configz", get(configz))
        .with_state(AppState {
            metrics,
            health,
            configz: Arc::new(configz_json),
        })
}

pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: ProxyHealth,
    configz_json: String,
) -> std::io::Result<()> {
    let app = router(metrics, health, configz_json);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, "metrics server listening");
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configz_keys_the_configuration_by_its_group() {
        let config = KubeProxyConfiguration {
            mode: "iptables".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            ..Default::default()
        };
        let body: serde_json::Value = serde_json::from_str(&configz_body(&config)).unwrap();
        let object = body.as_object().unwrap();
        assert_eq!(object.len(), 1);
        let inner = &object[CONFIGZ_GROUP];
        assert_eq!(inner["mode"], "iptables");
        assert_eq!(inner["metricsBindAddress"], "127.0.0.1:10249");
    }

    /// What upstream's conversion round trip leaves, mode by mode; the whole file is
    /// compared with upstream's own /configz in real_apiserver.rs.
    #[test]
    fn configz_keeps_the_running_modes_periods_and_masquerade_all_only() {
        let mut config = KubeProxyConfiguration::default();
        crate::config::apply_v1alpha1_defaults(&mut config);
        config.iptables.masquerade_all = true;
        config.nftables.masquerade_all = true;
        config.client_connection.qps = 5.0;
        for (mode, periods, masquerade) in [
            ("iptables", "iptables", "iptables"),
            ("ebpf", "iptables", "iptables"),
            ("ipvs", "ipvs", "iptables"),
            ("nftables", "nftables", "nftables"),
        ] {
            config.mode = mode.into();
            let body: serde_json::Value = serde_json::from_str(&configz_body(&config)).unwrap();
            let inner = &body[CONFIGZ_GROUP];
            for section in ["iptables", "ipvs", "nftables"] {
                let zero = section != periods;
                assert_eq!(
                    inner[section]["syncPeriod"] == "0s",
                    zero,
                    "{mode} {section}"
                );
                // ipvs's minSyncPeriod defaults to 0 anyway.
                if zero {
                    assert_eq!(inner[section]["minSyncPeriod"], "0s", "{mode} {section}");
                }
                if section != "ipvs" {
                    assert_eq!(
                        inner[section]["masqueradeAll"],
                        section == masquerade,
                        "{mode} {section}"
                    );
                }
            }
            assert_eq!(inner["clientConnection"]["qps"].to_string(), "5");
            assert!(inner["nodePortAddresses"].is_null());
            assert!(inner["ipvs"]["excludeCIDRs"].is_null());
            assert!(inner.get("udpIdleTimeout").is_none());
        }
    }
}
