// SPDX-License-Identifier: Apache-2.0
//! Building the API client the way kube-proxy does: an explicit kubeconfig and/or master URL
//! when given, otherwise the in-cluster service account; requests paced by
//! `clientConnection.qps`/`.burst` (the `rate_limit` module).

use std::path::Path;

use kube::{
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use tracing::{info, warn};

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
    let builder = ClientBuilder::try_from(config)?;
    let now = tokio::time::Instant::now();
    Ok(match TokenBucket::new(settings.qps, settings.burst, now) {
        Some(bucket) => {
            info!(
                qps = settings.qps,
                burst = settings.burst,
                "API requests rate-limited"
            );
            builder.with_layer(&RateLimitLayer::new(bucket)).build()
        }
        None => {
            info!(qps = settings.qps, "API requests not rate-limited");
            builder.build()
        }
    })
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
