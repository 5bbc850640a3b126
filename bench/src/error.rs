// SPDX-License-Identifier: Apache-2.0
//! Errors of the benchmarks.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Scenario(#[from] ::tests::scenario::Error),
    #[error("{0}")]
    Setup(String),
    #[error("agent: {0}")]
    Agent(String),
    #[error("load generator: {0}")]
    Load(String),
    #[error("pinning to CPU {cpu}: {source}")]
    Affinity { cpu: usize, source: nix::Error },
    #[error("interrupted by {0}")]
    Interrupted(&'static str),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<::tests::scenario::netns::Error> for Error {
    fn from(err: ::tests::scenario::netns::Error) -> Self {
        Error::Scenario(err.into())
    }
}

impl Error {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
