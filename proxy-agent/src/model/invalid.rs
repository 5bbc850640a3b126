// SPDX-License-Identifier: Apache-2.0
//! Objects the model refuses, and the bookkeeping that reports each refusal once.

use std::collections::HashMap;
use std::fmt;

use super::NamespacedName;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Service => "Service",
            ObjectKind::EndpointSlice => "EndpointSlice",
            ObjectKind::Node => "Node",
            ObjectKind::ServiceCidr => "ServiceCIDR",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object the proxy cannot use (the API server would not have accepted it). The
/// object contributes nothing to the model; every other object still syncs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {namespace}/{name}: {reason}")]
pub struct InvalidObject {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

impl InvalidObject {
    pub fn new(
        kind: ObjectKind,
        namespace: impl Into<String>,
        name: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            reason: reason.into(),
        }
    }

    pub fn object_name(&self) -> NamespacedName {
        NamespacedName::new(self.namespace.clone(), self.name.clone())
    }
}

/// Objects currently refused, so that an object resent unchanged (resyncs, relists) is
/// reported once, and again only when its reason changes.
#[derive(Debug, Default)]
pub struct Rejections {
    active: HashMap<(ObjectKind, NamespacedName), String>,
    fresh: Vec<InvalidObject>,
}

impl Rejections {
    /// Records a refusal; returns true when it is new (not yet reported with this reason).
    pub fn record(&mut self, invalid: InvalidObject) -> bool {
        let key = (invalid.kind, invalid.object_name());
        if self.active.get(&key) == Some(&invalid.reason) {
            return false;
        }
        self.active.insert(key, invalid.reason.clone());
        self.fresh.push(invalid);
        true
    }

    /// The object is valid again or gone.
    pub fn clear(&mut self, kind: ObjectKind, name: &NamespacedName) {
        if !self.active.is_empty() {
            self.active.remove(&(kind, name.clone()));
        }
    }

    /// Refusals recorded since the last call, for the caller to log and turn into events.
    pub fn take_fresh(&mut self) -> Vec<InvalidObject> {
        std::mem::take(&mut self.fresh)
    }

    /// How many objects are refused right now.
    pub fn active_count(&self) -> usize {
        self.active.len()
    }

    pub fn is_rejected(&self, kind: ObjectKind, name: &NamespacedName) -> bool {
        self.active.contains_key(&(kind, name.clone()))
    }
}
