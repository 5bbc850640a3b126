// SPDX-License-Identifier: Apache-2.0
//! Putting objects into the control plane as a test means them: any object as JSON
//! (server-side apply, its `status` through the status subresource, as a kubelet or a
//! cloud controller would write it), Nodes and Pods with the status no kubelet sets here,
//! and ServiceAccount tokens.

use std::collections::HashMap;

use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Namespace, Node, Pod, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
    discovery::{ApiCapabilities, ApiResource, Scope},
};
use serde_json::{Value, json};

use crate::error::{ControlPlaneError, Result};

/// The field manager of everything the harness writes.
pub const FIELD_MANAGER: &str = "testbed";

fn other(context: &str, err: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::Other(format!("{context}: {err}"))
}

/// `namespace/name` (or `name`) of a JSON object, with its kind.
pub fn describe(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("?");
    let name = object["metadata"]["name"].as_str().unwrap_or("?");
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// Applies JSON objects of any kind, resolving each kind once.
pub struct Applier {
    client: kube::Client,
    kinds: HashMap<(String, String), (ApiResource, ApiCapabilities)>,
}

impl Applier {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            kinds: HashMap::new(),
        }
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    async fn resolve(
        &mut self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, ApiCapabilities)> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.kinds.get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let found = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        self.kinds.insert(key, found.clone());
        Ok(found)
    }

    async fn api_for(&mut self, object: &Value) -> Result<(Api<DynamicObject>, String)> {
        let api_version = object["apiVersion"]
            .as_str()
            .ok_or_else(|| other(&describe(object), "no apiVersion"))?;
        let kind = object["kind"]
            .as_str()
            .ok_or_else(|| other(&describe(object), "no kind"))?;
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or_else(|| other(&describe(object), "no metadata.name"))?
            .to_string();
        let (resource, caps) = self.resolve(api_version, kind).await?;
        let api = match (caps.scope, object["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(self.client.clone(), ns, &resource)
            }
            (Scope::Namespaced, None) => {
                Api::default_namespaced_with(self.client.clone(), &resource)
            }
            (Scope::Cluster, _) => Api::all_with(self.client.clone(), &resource),
        };
        Ok((api, name))
    }

    /// Creates or updates the object (server-side apply, forced, as the harness's field
    /// manager), then its `status` if it has one; returns the object as stored.
    pub async fn apply(&mut self, object: &Value) -> Result<DynamicObject> {
        let (api, name) = self.api_for(object).await?;
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            ensure_namespace(&self.client, ns).await?;
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut body = object.clone();
        let status = body.as_object_mut().and_then(|o| o.remove("status"));
        let stored = api
            .patch(&name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| other(&format!("applying {}", describe(object)), e))?;
        match status {
            Some(status) if !status.is_null() => {
                // The status replaces the stored one whole (a PUT of the status
                // subresource): server-side apply would merge lists by key, and a Node's
                // `addresses` legitimately repeat their key (two InternalIPs).
                let mut current = stored;
                current.data["status"] = status;
                api.replace_status(&name, &PostParams::default(), &current)
                    .await
                    .map_err(|e| other(&format!("writing the status of {}", describe(object)), e))
            }
            _ => Ok(stored),
        }
    }

    /// Deletes the object (at once: no grace period); a missing one is not an error.
    pub async fn delete(&mut self, object: &Value) -> Result<()> {
        let (api, name) = self.api_for(object).await?;
        match api
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(other(&format!("deleting {}", describe(object)), e)),
        }
    }
}

/// The manifests of deploy/ that give the agent its identity and permissions, as deployed
/// (ServiceAccount `kube-system/kube-proxy-ebpf`, its ClusterRole and binding).
pub const AGENT_IDENTITY_MANIFESTS: &[&str] = &["deploy/serviceaccount.yaml", "deploy/rbac.yaml"];
pub const AGENT_NAMESPACE: &str = "kube-system";
pub const AGENT_SERVICE_ACCOUNT: &str = "kube-proxy-ebpf";

/// Every object of the YAML files (multi-document) at these paths, in order.
pub fn read_manifests(paths: &[std::path::PathBuf]) -> Result<Vec<Value>> {
    let mut documents = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| other(&format!("reading {}", path.display()), e))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(document)
                .map_err(|e| other(&format!("parsing {}", path.display()), e))?;
            if !value.is_null() {
                documents.push(value);
            }
        }
    }
    Ok(documents)
}

/// Applies the agent's identity from deploy/ ([`AGENT_IDENTITY_MANIFESTS`]).
pub async fn apply_agent_identity(applier: &mut Applier) -> Result<()> {
    let root = crate::binaries::workspace_root();
    let paths: Vec<std::path::PathBuf> = AGENT_IDENTITY_MANIFESTS
        .iter()
        .map(|m| root.join(m))
        .collect();
    for document in read_manifests(&paths)? {
        applier.apply(&document).await?;
    }
    Ok(())
}

/// Upstream's kube-proxy as kubeadm deploys it: ServiceAccount `kube-system/kube-proxy`,
/// bound to the API server's bootstrap ClusterRole `system:node-proxier` by the
/// ClusterRoleBinding kubeadm names `kubeadm:node-proxier`.
pub const UPSTREAM_NAMESPACE: &str = "kube-system";
pub const UPSTREAM_SERVICE_ACCOUNT: &str = "kube-proxy";

/// The objects of upstream kube-proxy's identity ([`UPSTREAM_SERVICE_ACCOUNT`]).
pub fn upstream_identity() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"namespace": UPSTREAM_NAMESPACE, "name": UPSTREAM_SERVICE_ACCOUNT},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:node-proxier"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node-proxier",
            },
            "subjects": [{
                "kind": "ServiceAccount",
                "namespace": UPSTREAM_NAMESPACE,
                "name": UPSTREAM_SERVICE_ACCOUNT,
            }],
        }),
    ]
}

/// Applies upstream kube-proxy's identity ([`upstream_identity`]).
pub async fn apply_upstream_identity(applier: &mut Applier) -> Result<()> {
    for object in upstream_identity() {
        applier.apply(&object).await?;
    }
    Ok(())
}

/// Creates the namespace unless it exists (namespaces are never deleted here: without
/// the namespace controller a deleted one would stay Terminating).
pub async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api = Api::<Namespace>::all(client.clone());
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))
        .map_err(|e| other("a namespace", e))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A Pod as no kubelet runs it: bound to `node`, Running and Ready (or not) at `ips`.
pub fn pod(
    namespace: &str,
    name: &str,
    labels: &Value,
    node: &str,
    ips: &[String],
    ready: bool,
) -> Value {
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let ready = if ready { "True" } else { "False" };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "testbed.invalid/none:0"}],
        },
        "status": {
            "phase": "Running",
            "podIP": ips.first(),
            "podIPs": pod_ips,
            "conditions": [
                {"type": "Ready", "status": ready},
                {"type": "ContainersReady", "status": ready},
            ],
        },
    })
}

/// A Node as no kubelet reports it: these InternalIPs, Ready, with these labels (the
/// EndpointSlice controller skips pods whose Node does not exist, and takes the zone
/// from its labels).
pub fn node(name: &str, internal_ips: &[String], labels: &Value) -> Value {
    let mut addresses: Vec<Value> = internal_ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    })
}

/// A token of ServiceAccount `namespace/name` from the TokenRequest API, valid for a day.
pub async fn service_account_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<String> {
    let api = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 86_400},
    }))
    .map_err(|e| other("a TokenRequest", e))?;
    let answer: TokenRequest = api
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .map_err(|e| other(&format!("a token for ServiceAccount {namespace}/{name}"), e))?;
    answer
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| other("TokenRequest", "answered without a token"))
}

/// The controllers' smoke test: a Service selecting one ready Pod, in a namespace of its
/// own.
pub struct Smoke {
    namespace: String,
}

const SMOKE_NAMESPACE: &str = "testbed-smoke";
const SMOKE_NODE: &str = "testbed-smoke-node";

impl Smoke {
    pub async fn create(client: &kube::Client) -> Result<Self> {
        let mut applier = Applier::new(client.clone());
        let labels = json!({"app": "smoke"});
        applier
            .apply(&json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "smoke", "namespace": SMOKE_NAMESPACE},
                "spec": {"selector": labels, "ports": [{"port": 80}]},
            }))
            .await?;
        applier
            .apply(&node(SMOKE_NODE, &["192.0.2.11".into()], &json!({})))
            .await?;
        applier
            .apply(&pod(
                SMOKE_NAMESPACE,
                "smoke",
                &labels,
                SMOKE_NODE,
                &["192.0.2.10".into()],
                true,
            ))
            .await?;
        Ok(Self {
            namespace: SMOKE_NAMESPACE.to_string(),
        })
    }

    pub async fn has_slice(&self, client: &kube::Client) -> Result<bool> {
        let slices = Api::<EndpointSlice>::namespaced(client.clone(), &self.namespace)
            .list(&ListParams::default().labels("kubernetes.io/service-name=smoke"))
            .await?;
        Ok(slices.items.iter().any(|s| {
            s.endpoints
                .iter()
                .flatten()
                .any(|e| e.addresses.iter().any(|a| a == "192.0.2.10"))
        }))
    }

    pub async fn remove(self, client: &kube::Client) -> Result<()> {
        let dp = DeleteParams::default().grace_period(0);
        let _ = Api::<Service>::namespaced(client.clone(), &self.namespace)
            .delete("smoke", &dp)
            .await;
        let _ = Api::<Pod>::namespaced(client.clone(), &self.namespace)
            .delete("smoke", &dp)
            .await;
        let _ = Api::<Node>::all(client.clone())
            .delete(SMOKE_NODE, &dp)
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_described_by_kind_and_name() {
        let svc = json!({"kind": "Service", "metadata": {"name": "a", "namespace": "ns"}});
        assert_eq!(describe(&svc), "Service/ns/a");
        let node = json!({"kind": "Node", "metadata": {"name": "n"}});
        assert_eq!(describe(&node), "Node/n");
    }

    #[test]
    fn a_pod_carries_its_status() {
        let p = pod(
            "ns",
            "p",
            &json!({"a": "b"}),
            "n1",
            &["10.0.0.1".into(), "fd00::1".into()],
            true,
        );
        assert_eq!(p["status"]["podIP"], "10.0.0.1");
        assert_eq!(p["status"]["podIPs"][1]["ip"], "fd00::1");
        assert_eq!(p["status"]["conditions"][0]["status"], "True");
        assert_eq!(p["spec"]["nodeName"], "n1");
    }
}
