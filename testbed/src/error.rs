// SPDX-License-Identifier: Apache-2.0
//! What can go wrong with a control plane and the objects put into it.

use std::{path::PathBuf, time::Duration};

use crate::{binaries::BinariesError, pki::PkiError, process::ProcessError};

#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error(transparent)]
    Binaries(#[from] BinariesError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{component} did not become ready within {waited:?}: {why}\n--- last lines of {log} ---\n{tail}"
    )]
    NotReady {
        component: String,
        waited: Duration,
        why: String,
        log: PathBuf,
        tail: String,
    },
    #[error("the API client: {0}")]
    Kube(#[from] kube::Error),
    #[error("the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("{path}: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = ControlPlaneError> = std::result::Result<T, E>;
