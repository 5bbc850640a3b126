// SPDX-License-Identifier: Apache-2.0
//! The resource types the test API server knows, and the discovery documents built from them.

use serde_json::{Value, json};

/// One served resource type: where it lives in the URL space and what its objects look like.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceKind {
    /// API group; empty for the core (legacy `/api/v1`) group.
    pub group: &'static str,
    pub version: &'static str,
    /// Lower-case plural used in URLs (`services`).
    pub plural: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub namespaced: bool,
    /// Field selector labels the real apiserver accepts for this type, beyond
    /// `metadata.name` and `metadata.namespace` which every type accepts.
    pub extra_field_labels: &'static [&'static str],
}

impl ResourceKind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `services` for core types, `endpointslices.discovery.k8s.io` otherwise, as the
    /// apiserver names resources in Status messages.
    pub fn qualified_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn supports_field_label(&self, label: &str) -> bool {
        matches!(label, "metadata.name" | "metadata.namespace")
            || self.extra_field_labels.contains(&label)
    }
}

pub static SERVICES: ResourceKind = ResourceKind {
    group: "",
    version: "v1",
    plural: "services",
    kind: "Service",
    list_kind: "ServiceList",
    namespaced: true,
    extra_field_labels: &["spec.clusterIP", "spec.type"],
};

pub static NODES: ResourceKind = ResourceKind {
    group: "",
    version: "v1",
    plural: "nodes",
    kind: "Node",
    list_kind: "NodeList",
    namespaced: false,
    extra_field_labels: &["spec.unschedulable"],
};

pub static CORE_EVENTS: ResourceKind = ResourceKind {
    group: "",
    version: "v1",
    plural: "events",
    kind: "Event",
    list_kind: "EventList",
    namespaced: true,
    extra_field_labels: &[
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "reason",
        "source",
        "type",
    ],
};

pub static ENDPOINT_SLICES: ResourceKind = ResourceKind {
    group: "discovery.k8s.io",
    version: "v1",
    plural: "endpointslices",
    kind: "EndpointSlice",
    list_kind: "EndpointSliceList",
    namespaced: true,
    extra_field_labels: &[],
};

pub static SERVICE_CIDRS: ResourceKind = ResourceKind {
    group: "networking.k8s.io",
    version: "v1",
    plural: "servicecidrs",
    kind: "ServiceCIDR",
    list_kind: "ServiceCIDRList",
    namespaced: false,
    extra_field_labels: &[],
};

pub static EVENTS: ResourceKind = ResourceKind {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    list_kind: "EventList",
    namespaced: true,
    extra_field_labels: &[
        "reason",
        "type",
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
    ],
};

/// Every served type. The core and events.k8s.io Events are kept apart (no conversion
/// between them), unlike the real apiserver where both views share one storage.
pub static ALL: [&ResourceKind; 6] = [
    &SERVICES,
    &NODES,
    &CORE_EVENTS,
    &ENDPOINT_SLICES,
    &SERVICE_CIDRS,
    &EVENTS,
];

pub fn by_path(group: &str, version: &str, plural: &str) -> Option<&'static ResourceKind> {
    ALL.iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

pub fn by_type(api_version: &str, kind: &str) -> Option<&'static ResourceKind> {
    ALL.iter()
        .copied()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// `GET /version`.
pub fn version_document() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "gitVersion": "v1.35.0-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `GET /api`.
pub fn core_versions_document() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
    })
}

fn groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&'static str, &'static str)> = ALL
        .iter()
        .filter(|r| !r.group.is_empty())
        .map(|r| (r.group, r.version))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// `GET /apis`.
pub fn group_list_document() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|(group, version)| {
            let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`, or `None` when the group is not served.
pub fn group_document(group: &str) -> Option<Value> {
    let (_, version) = groups().into_iter().find(|(g, _)| *g == group)?;
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    Some(json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [gv.clone()],
        "preferredVersion": gv
    }))
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`, or `None` when nothing is served there.
pub fn resource_list_document(group: &str, version: &str) -> Option<Value> {
    let resources: Vec<Value> = ALL
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            json!({
                "name": r.plural,
                "singularName": r.kind.to_lowercase(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
            })
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources
    }))
}
