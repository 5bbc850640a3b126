// SPDX-License-Identifier: Apache-2.0
//! Building the API client the way kube-proxy does: an explicit kubeconfig and/or master URL
//! when given, otherwise the in-cluster service account; requests paced by
//! `clientConnection.qps`/`.burst` (the `rate_limit` module).
//!
//! A connection that dies without a reset (an API VIP that fails over, a NAT or firewall
//! that forgets the flow) must not leave the watches waiting forever: client-go pings its
//! HTTP/2 connections (30 s idle, then 15 s for the answer). kube's client speaks HTTP/1.1
//! and sets no TCP keepalive, so the connection stack is built here (as kube's own, with
//! TCP keepalive and a user timeout on each socket): a silent connection is closed within
//! [`DEAD_CONNECTION_BOUND`] of the last byte from the server, and the watchers reconnect
//! and resume or relist.

use std::{path::Path, time::Duration};

use http_body_util::BodyExt as _;
use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioExecutor};
use kube::{
    client::{Body, ClientBuilder, ConfigExt as _, DynBody},
    config::{KubeConfigOptions, Kubeconfig},
};
use tower::{BoxError, ServiceBuilder, ServiceExt as _, util::BoxService};
use tracing::{info, warn};

use super::client_metrics::RestClientMetricsLayer;
use super::rate_limit::{RateLimitLayer, TokenBucket};
use crate::config::DEFAULT_CONTENT_TYPE;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error("invalid --master URL {url:?}: {reason}")]
    Master { url: String, reason: String },
    #[error("creating the API client: {0}")]
    Client(#[from] kube::Error),
    #[error("the API client's TLS: {0}")]
    Tls(#[from] kube::client::RustlsTlsError),
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Connection settings (clientConnection in the configuration, plus --master).
#[derive(Clone, Debug, Default)]
pub struct ConnectionSettings {
    pub kubeconfig: Option<String>,
    pub master: Option<String>,
    /// Requests per second; not positive: no limit.
    pub qps: f32,
    pub burst: i32,
    pub content_type: String,
    pub accept_content_types: String,
}

/// The one media type the API client (kube-rs) reads and writes.
const JSON: &str = "application/json";

/// What to say about `clientConnection.contentType` and `.acceptContentTypes`: the client
/// speaks JSON only. Protobuf, upstream's default, is replaced quietly (every kube-proxy
/// configuration carries it); any other choice is refused with a warning, not an exit, as
/// the API serves the same objects either way.
fn content_type_notes(settings: &ConnectionSettings) -> Vec<(bool, String)> {
    let mut notes = Vec::new();
    let wanted = settings.content_type.as_str();
    if wanted != JSON {
        let explicit = wanted != DEFAULT_CONTENT_TYPE;
        notes.push((
            explicit,
            format!(
                "clientConnection.contentType {wanted:?} is not supported by this agent's API \
                 client, which speaks {JSON} only; using {JSON}"
            ),
        ));
    }
    let accepted = settings.accept_content_types.as_str();
    if !accepted.is_empty() && !accepted.split(',').any(|t| t.trim() == JSON) {
        notes.push((
            true,
            format!(
                "clientConnection.acceptContentTypes {accepted:?} does not include {JSON}, the \
                 only type this agent's API client reads; accepting {JSON}"
            ),
        ));
    }
    notes
}

pub async fn make_client(settings: &ConnectionSettings) -> Result<kube::Client> {
    let mut config = match (&settings.kubeconfig, &settings.master) {
        (None, None) => {
            info!("neither kubeconfig nor master URL given, using the in-cluster configuration");
            kube::Config::incluster()?
        }
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(Path::new(path)).map_err(|source| {
                ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        (None, Some(master)) => kube::Config::new(parse_master(master)?),
    };
    if let (Some(_), Some(master)) = (&settings.kubeconfig, &settings.master) {
        // --master overrides the kubeconfig's server, as upstream's ConfigOverrides does.
        config.cluster_url = parse_master(master)?;
    }
    // Watches are long-lived; let the server end them (timeoutSeconds), not a read timeout.
    config.read_timeout = None;
    for (explicit, note) in content_type_notes(settings) {
        if explicit {
            warn!("{note}");
        } else {
            info!("{note}");
        }
    }
    let host = config
        .cluster_url
        .authority()
        .map(|authority| authority.to_string())
        .unwrap_or_default();
    let builder = connection_stack(config)?;
    let now = tokio::time::Instant::now();
    Ok(match TokenBucket::new(settings.qps, settings.burst, now) {
        Some(bucket) => {
            info!(
                qps = settings.qps,
                burst = settings.burst,
                "API requests rate-limited"
            );
            builder
                .with_layer(&RateLimitLayer::new(bucket))
                .with_layer(&RestClientMetricsLayer::new(host, true))
                .build()
        }
        None => {
            info!(qps = settings.qps, "API requests not rate-limited");
            builder
                .with_layer(&RestClientMetricsLayer::new(host, false))
                .build()
        }
    })
}

/// Idle time before the first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Between unanswered probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;
/// How long sent data (a request, a keepalive probe) may go unacknowledged before the
/// kernel closes the connection; with the keepalive above it also bounds a silent idle
/// connection (TCP_USER_TIMEOUT overrides the probe count once probes are out).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(45);
/// The longest a connection whose peer went silent stays open: the first keepalive probe
/// after the user timeout has passed closes it, so 45 s after the last byte from the server
/// and at most one probe interval more (client-go's HTTP/2 health check takes 30 s + 15 s;
/// measured against the real API server behind a silent drop: 46 s).
pub const DEAD_CONNECTION_BOUND: Duration = Duration::from_secs(50);

/// kube's client service, type-erased as kube's own builder erases it.
type ApiService = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// kube's default stack (base URI, authentication with token refresh, extra headers,
/// retries of 429/503/504, TLS, timeouts) over connections with TCP keepalive and a user
/// timeout. A proxy in the kubeconfig keeps kube's own stack, which speaks to proxies.
fn connection_stack(config: kube::Config) -> Result<ClientBuilder<ApiService>> {
    if config.proxy_url.is_some() {
        info!("the kubeconfig names a proxy: connections get no TCP keepalive of ours");
        return Ok(ClientBuilder::try_from(config)?);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http_client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client)
        .map_response(|response| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        });
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace.clone(),
    ))
}

fn parse_master(master: &str) -> Result<http::Uri> {
    master
        .parse()
        .map_err(|e: http::uri::InvalidUri| ClientError::Master {
            url: master.to_string(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(content_type: &str, accept: &str) -> ConnectionSettings {
        ConnectionSettings {
            content_type: content_type.into(),
            accept_content_types: accept.into(),
            ..ConnectionSettings::default()
        }
    }

    #[test]
    fn json_needs_no_note() {
        assert!(content_type_notes(&settings(JSON, "")).is_empty());
        assert!(content_type_notes(&settings(JSON, "application/json, */*")).is_empty());
    }

    #[test]
    fn upstream_default_protobuf_is_replaced_quietly() {
        let notes = content_type_notes(&settings(DEFAULT_CONTENT_TYPE, ""));
        assert_eq!(notes.len(), 1);
        assert!(!notes[0].0, "the default is not warned about");
        assert!(
            notes[0].1.contains("using application/json"),
            "{}",
            notes[0].1
        );
    }

    #[test]
    fn other_choices_are_refused_with_the_reason() {
        let notes = content_type_notes(&settings("application/yaml", "application/yaml"));
        assert_eq!(notes.len(), 2);
        assert!(notes.iter().all(|(warned, _)| *warned));
        assert!(notes[0].1.contains("\"application/yaml\" is not supported"));
        assert!(notes[1].1.contains("does not include application/json"));
    }
}
