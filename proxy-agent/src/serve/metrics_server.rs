// SPDX-License-Identifier: Apache-2.0
//! The metrics server (metricsBindAddress): `/metrics` in the Prometheus text format, plus
//! upstream's plain `/healthz` and `/proxyMode` on the same port.

use std::net::SocketAddr;

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use tracing::info;

use super::{health::ProxyHealth, metrics::Metrics};

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: ProxyHealth,
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

pub async fn serve(addr: SocketAddr, metrics: Metrics, health: ProxyHealth) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz_plain))
        .route("/proxyMode", get(proxy_mode))
        .with_state(AppState { metrics, health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, "metrics server listening");
    axum::serve(listener, app).await
}
