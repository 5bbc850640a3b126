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
/// configuration in its `KubeProxyConfiguration` wire form (the defaulted, validated one
/// the agent runs with). Computed once: the agent exits when its configuration changes.
pub fn configz_body(config: &KubeProxyConfiguration) -> String {
    let mut body = serde_json::Map::new();
    let value = serde_json::to_value(config).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot render the configuration for /configz");
        serde_json::Value::Null
    });
    body.insert(CONFIGZ_GROUP.to_string(), value);
    serde_json::Value::Object(body).to_string()
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
}
