// SPDX-License-Identifier: Apache-2.0
//! Building the API client the way kube-proxy does: an explicit kubeconfig and/or master URL
//! when given, otherwise the in-cluster service account.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::info;

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
    Ok(kube::Client::try_from(config)?)
}

fn parse_master(master: &str) -> Result<http::Uri> {
    master
        .parse()
        .map_err(|e: http::uri::InvalidUri| ClientError::Master {
            url: master.to_string(),
            reason: e.to_string(),
        })
}
