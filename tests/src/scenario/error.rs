// SPDX-License-Identifier: Apache-2.0
//! Errors of the scenario runner.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("invalid scenario: {0}")]
    Invalid(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// Building or entering namespaces and cgroups, or a command run there.
    #[error(transparent)]
    Netns(#[from] netns_scaffold::Error),
    #[error("{0}")]
    Setup(String),
    #[error("agent: {reason}")]
    Agent { reason: String },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("yaml: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
