// SPDX-License-Identifier: Apache-2.0
//! What the agent serves over HTTP: its health (healthzBindAddress), its metrics
//! (metricsBindAddress) and the per-service health checks of eTP=Local services. The
//! health state and the metrics registry do not know each other; the servers use both.

mod component_metrics;
mod health;
mod metrics;
mod metrics_server;
mod service_health;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod upstream_metrics;

pub use self::{
    health::{
        Family, ProxyHealth, TO_BE_DELETED_TAINT, router as healthz_router, serve as serve_healthz,
    },
    metrics::{Metrics, MetricsMode, PacketCountReader},
    metrics_server::{CONFIGZ_GROUP, configz_body, serve as serve_metrics},
    service_health::ServiceHealthServers,
};
