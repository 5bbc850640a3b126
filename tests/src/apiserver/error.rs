// SPDX-License-Identifier: Apache-2.0
//! Errors of the test API server, and their `metav1.Status` form on the wire.

use std::path::PathBuf;

use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the test API server listener: {0}")]
    Bind(#[source] std::io::Error),

    #[error("writing kubeconfig {path}: {source}")]
    WriteKubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("building a kube client: {0}")]
    Client(#[source] kube::Error),

    #[error("the server does not serve {api_version} {kind}")]
    UnknownKind { api_version: String, kind: String },

    #[error("{0}")]
    BadRequest(String),

    #[error("{0}")]
    Invalid(String),

    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },

    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },

    #[error(
        "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict { resource: String, name: String },

    #[error("{0}")]
    Expired(String),

    #[error("the server could not find the requested resource")]
    NoRoute,

    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },

    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,

    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(&'static str),

    #[error("the server is unavailable")]
    Unavailable,

    #[error("decoding or encoding an object: {0}")]
    Json(#[from] serde_json::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP code and Status `reason` the real apiserver uses for this failure.
    pub fn code_and_reason(&self) -> (u16, &'static str) {
        match self {
            Self::BadRequest(_) | Self::Json(_) => (400, "BadRequest"),
            Self::NotFound { .. } | Self::UnknownKind { .. } | Self::NoRoute => (404, "NotFound"),
            Self::MethodNotAllowed => (405, "MethodNotAllowed"),
            Self::AlreadyExists { .. } => (409, "AlreadyExists"),
            Self::Conflict { .. } => (409, "Conflict"),
            Self::Expired(_) => (410, "Expired"),
            Self::UnsupportedMediaType(_) => (415, "UnsupportedMediaType"),
            Self::Invalid(_) => (422, "Invalid"),
            Self::Unavailable => (503, "ServiceUnavailable"),
            Self::TooLargeResourceVersion { .. } => (504, "Timeout"),
            Self::Bind(_) | Self::WriteKubeconfig { .. } | Self::Client(_) => {
                (500, "InternalError")
            }
        }
    }

    /// A `metav1.Status` object describing this failure.
    pub fn to_status(&self) -> Value {
        let (code, reason) = self.code_and_reason();
        let mut status = status_object(code, reason, &self.to_string());
        let details = match self {
            Self::NotFound { resource, name }
            | Self::AlreadyExists { resource, name }
            | Self::Conflict { resource, name } => Some(json!({"name": name, "kind": resource})),
            Self::TooLargeResourceVersion { .. } => Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1
            })),
            _ => None,
        };
        if let (Some(details), Some(obj)) = (details, status.as_object_mut()) {
            obj.insert("details".into(), details);
        }
        status
    }
}

/// A failed `metav1.Status`.
pub fn status_object(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code
    })
}
