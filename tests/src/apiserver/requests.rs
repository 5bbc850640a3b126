// SPDX-License-Identifier: Apache-2.0
//! The log of requests the server answered, for tests to assert on (a relist shows
//! up as one more `List` of the type).

/// The API verb of a request, as the apiserver's audit log would name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    List,
    Watch,
    Get,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// Discovery (`/api`, `/apis`, `/version`) and anything not aimed at a resource.
    Other,
}

/// One answered request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query as received.
    pub uri: String,
    pub verb: Verb,
    /// API group of the target resource; empty for core.
    pub group: String,
    /// Plural resource name (`services`); empty for non-resource requests.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// HTTP status of the response.
    pub status: u16,
    /// For a watch: it was answered with a single `410 Expired` ERROR event.
    pub expired: bool,
}

impl RecordedRequest {
    /// Whether this is a `verb` on `resource` (the plural; any group).
    pub fn is(&self, verb: Verb, resource: &str) -> bool {
        self.verb == verb && self.resource == resource
    }
}
