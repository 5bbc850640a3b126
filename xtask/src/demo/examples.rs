// SPDX-License-Identifier: Apache-2.0
//! What the demo builds, read from the example manifests it applies to the control plane
//! (deploy/examples/): the Node's InternalIP becomes the sandbox node's address, every Pod
//! a pod namespace with a backend at its address and container ports, every Service
//! ClusterIP a target for requests, answered by the pods its selector picks. Editing the
//! manifests changes the demo; nothing is duplicated here.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use serde::Deserialize as _;
use serde_yaml::Value;

/// A pod of the demo: a network namespace with a backend answering with `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub address: Ipv4Addr,
    pub ports: Vec<u16>,
    /// Its Ready condition is True: the EndpointSlice controller lists it as ready and
    /// the proxy sends it traffic.
    pub ready: bool,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

/// A Service frontend the demo sends requests to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    /// namespace/name
    pub service: String,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// The pods behind it, by name, ready or not.
    pub pods: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Examples {
    pub dir: PathBuf,
    pub node_name: String,
    pub node_address: Ipv4Addr,
    pub pods: Vec<Pod>,
    pub frontends: Vec<Frontend>,
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |v, key| v.get(*key))
        .and_then(Value::as_str)
}

fn seq_at<'a>(value: &'a Value, path: &[&str]) -> &'a [Value] {
    path.iter()
        .try_fold(value, |v, key| v.get(*key))
        .and_then(Value::as_sequence)
        .map_or(&[], Vec::as_slice)
}

fn port_of(value: &Value, key: &str) -> Option<u16> {
    value
        .get(key)
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
}

fn labels_at(value: &Value, path: &[&str]) -> BTreeMap<String, String> {
    path.iter()
        .try_fold(value, |v, key| v.get(*key))
        .and_then(Value::as_mapping)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn namespaced(object: &Value) -> String {
    format!(
        "{}/{}",
        str_at(object, &["metadata", "namespace"]).unwrap_or("default"),
        str_at(object, &["metadata", "name"]).unwrap_or_default()
    )
}

/// Every object of every YAML file in `dir`, in file-name order.
fn objects_in(dir: &Path) -> anyhow::Result<Vec<Value>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .with_context(|| format!("parsing {}", file.display()))?;
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    Ok(objects)
}

/// Reads the examples and checks they describe something the demo can build: one Node
/// with an IPv4 InternalIP, and IPv4 ClusterIP Services selecting Pods with IPv4 addresses
/// and TCP container ports.
/// Returns the objects too, as they are applied.
pub fn load(dir: &Path) -> anyhow::Result<(Examples, Vec<Value>)> {
    let objects = objects_in(dir)?;
    Ok((parse(dir, &objects)?, objects))
}

fn parse(dir: &Path, objects: &[Value]) -> anyhow::Result<Examples> {
    let by_kind = |kind: &'static str| {
        objects
            .iter()
            .filter(move |o| o.get("kind").and_then(Value::as_str) == Some(kind))
    };
    let nodes: Vec<&Value> = by_kind("Node").collect();
    let [node] = nodes.as_slice() else {
        bail!(
            "{}: expected exactly one Node, found {}",
            dir.display(),
            nodes.len()
        );
    };
    let node_name = str_at(node, &["metadata", "name"])
        .context("the Node has no name")?
        .to_string();
    let node_address = seq_at(node, &["status", "addresses"])
        .iter()
        .filter(|a| str_at(a, &["type"]) == Some("InternalIP"))
        .find_map(|a| str_at(a, &["address"])?.parse::<Ipv4Addr>().ok())
        .context("the Node has no IPv4 InternalIP")?;

    let mut pods: Vec<Pod> = Vec::new();
    for pod in by_kind("Pod") {
        let name = str_at(pod, &["metadata", "name"])
            .context("a Pod has no name")?
            .to_string();
        let address: Ipv4Addr = str_at(pod, &["status", "podIP"])
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("Pod {}: no IPv4 status.podIP", namespaced(pod)))?;
        let ports: Vec<u16> = seq_at(pod, &["spec", "containers"])
            .iter()
            .flat_map(|c| seq_at(c, &["ports"]))
            .filter(|p| str_at(p, &["protocol"]).unwrap_or("TCP") == "TCP")
            .filter_map(|p| port_of(p, "containerPort"))
            .collect();
        let ready = seq_at(pod, &["status", "conditions"]).iter().any(|c| {
            str_at(c, &["type"]) == Some("Ready") && str_at(c, &["status"]) == Some("True")
        });
        pods.push(Pod {
            name,
            address,
            ports,
            ready,
            namespace: str_at(pod, &["metadata", "namespace"])
                .unwrap_or("default")
                .to_string(),
            labels: labels_at(pod, &["metadata", "labels"]),
        });
    }

    let mut frontends = Vec::new();
    for service in by_kind("Service") {
        let name = namespaced(service);
        let Some(cluster_ip) =
            str_at(service, &["spec", "clusterIP"]).and_then(|ip| ip.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        let port = seq_at(service, &["spec", "ports"])
            .iter()
            .filter(|p| str_at(p, &["protocol"]).unwrap_or("TCP") == "TCP")
            .find_map(|p| port_of(p, "port"))
            .with_context(|| format!("Service {name} has no TCP port"))?;
        let namespace = str_at(service, &["metadata", "namespace"]).unwrap_or("default");
        let selector = labels_at(service, &["spec", "selector"]);
        let selected: Vec<String> = pods
            .iter()
            .filter(|p| {
                !selector.is_empty()
                    && p.namespace == namespace
                    && selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
            })
            .map(|p| p.name.clone())
            .collect();
        if selected.is_empty() {
            bail!("Service {name} selects no Pod of the examples");
        }
        frontends.push(Frontend {
            pods: selected,
            service: name,
            cluster_ip,
            port,
        });
    }
    if frontends.is_empty() {
        bail!("{}: no Service with an IPv4 ClusterIP", dir.display());
    }
    Ok(Examples {
        dir: dir.to_path_buf(),
        node_name,
        node_address,
        pods,
        frontends,
    })
}

impl Examples {
    /// Where the backends listen.
    pub fn listen_addresses(pod: &Pod) -> Vec<SocketAddr> {
        pod.ports
            .iter()
            .map(|port| SocketAddr::from((pod.address, *port)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_examples_describe_a_demo() {
        let dir = crate::util::workspace_root().join("deploy/examples");
        let (examples, _) = load(&dir).unwrap();
        assert_eq!(examples.node_name, "demo-node");
        assert_eq!(examples.node_address, Ipv4Addr::new(192, 168, 77, 2));
        let hello = examples
            .frontends
            .iter()
            .find(|f| f.service == "demo/hello")
            .unwrap();
        assert_eq!(hello.cluster_ip, Ipv4Addr::new(10, 96, 0, 80));
        assert_eq!(hello.port, 80);
        assert_eq!(hello.pods, ["hello-1", "hello-2", "hello-3"]);
        let hello_1 = examples.pods.iter().find(|p| p.name == "hello-1").unwrap();
        assert_eq!(
            Examples::listen_addresses(hello_1),
            [SocketAddr::from(([10, 244, 1, 11], 8080))]
        );
        let not_ready: Vec<&str> = examples
            .pods
            .iter()
            .filter(|p| !p.ready)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(not_ready, ["greeter-3"]);
    }

    #[test]
    fn services_get_the_pods_their_selector_picks_and_headless_ones_are_skipped() {
        let yaml = "
kind: Node
metadata: {name: n}
status: {addresses: [{type: Hostname, address: n}, {type: InternalIP, address: 10.0.0.1}]}
---
kind: Service
metadata: {name: a, namespace: x}
spec: {clusterIP: 10.96.0.1, selector: {app: a}, ports: [{port: 53, protocol: UDP}, {port: 80}]}
---
kind: Service
metadata: {name: headless, namespace: x}
spec: {clusterIP: None, selector: {app: a}, ports: [{port: 80}]}
---
kind: Pod
metadata: {name: p, namespace: x, labels: {app: a, tier: web}}
spec: {containers: [{name: c, ports: [{containerPort: 8080}, {containerPort: 53, protocol: UDP}]}]}
status: {podIP: 10.1.0.5, conditions: [{type: Ready, status: 'False'}]}
---
kind: Pod
metadata: {name: other, namespace: y, labels: {app: a}}
spec: {containers: [{name: c, ports: [{containerPort: 8080}]}]}
status: {podIP: 10.1.0.6, conditions: [{type: Ready, status: 'True'}]}
";
        let objects: Vec<Value> = serde_yaml::Deserializer::from_str(yaml)
            .map(|d| Value::deserialize(d).unwrap())
            .collect();
        let examples = parse(Path::new("x"), &objects).unwrap();
        assert_eq!(examples.node_address, Ipv4Addr::new(10, 0, 0, 1));
        let p = &examples.pods[0];
        assert_eq!(
            (p.address, p.ports.clone(), p.ready),
            (Ipv4Addr::new(10, 1, 0, 5), vec![8080], false)
        );
        assert!(examples.pods[1].ready);
        assert_eq!(
            examples.frontends,
            [Frontend {
                service: "x/a".into(),
                cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
                port: 80,
                pods: vec!["p".into()],
            }]
        );
    }
}
