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
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("no cgroup2 mount in /proc/mounts")]
    NoCgroup2,
    #[error("entering network namespace {name}: {source}")]
    Setns { name: String, source: nix::Error },
    #[error("{0}")]
    Setup(String),
    #[error("agent: {reason}")]
    Agent { reason: String },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("yaml: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

impl From<netns_scaffold::Error> for Error {
    fn from(err: netns_scaffold::Error) -> Self {
        use netns_scaffold::Error as E;
        match err {
            E::Io { context, source } => Error::Io { context, source },
            E::Command {
                command,
                status,
                stderr,
            } => Error::Command {
                command,
                status,
                stderr,
            },
            E::NoCgroup2 => Error::NoCgroup2,
            E::Setns { name, source } => Error::Setns { name, source },
            E::Setup(reason) => Error::Setup(reason),
            E::Json(err) => Error::Json(err),
        }
    }
}

impl Error {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
