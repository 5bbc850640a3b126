// SPDX-License-Identifier: Apache-2.0
//! Why the agent stops.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("determining the node name: {0}")]
    NodeName(std::io::Error),
    #[error(transparent)]
    Client(#[from] crate::k8s::client::ClientError),
    #[error("proxy mode {requested} cannot run on this node: {reason}")]
    ModeUnavailable {
        requested: &'static str,
        reason: String,
    },
    #[error("starting the {mode} dataplane: {reason}")]
    Dataplane { mode: &'static str, reason: String },
    #[error("invalid {what} {value:?}: {reason}")]
    Address {
        what: &'static str,
        value: String,
        reason: String,
    },
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the event sources stopped")]
    SourcesStopped,
    #[error("{0}")]
    LocalDetector(#[from] crate::node::LocalDetectorError),
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;
