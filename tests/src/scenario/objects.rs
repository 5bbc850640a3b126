// SPDX-License-Identifier: Apache-2.0
//! Facts the runner needs from raw Kubernetes objects: identities, endpoint
//! addresses and ports, service addresses, and the node object.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde_json::{Value, json};

use super::{
    addr::parse_ip,
    error::{Error, Result},
    format::{NodeSpec, ObjectRef},
};

/// Kinds the runner knows to be cluster-scoped.
const CLUSTER_SCOPED: [&str; 2] = ["Node", "ServiceCIDR"];

pub fn api_version_of(kind: &str) -> Option<&'static str> {
    match kind {
        "Service" | "Node" | "Endpoints" => Some("v1"),
        "EndpointSlice" => Some("discovery.k8s.io/v1"),
        "ServiceCIDR" => Some("networking.k8s.io/v1"),
        _ => None,
    }
}

fn str_at<'a>(object: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(object, |v, key| v.get(key))
        .and_then(Value::as_str)
}

fn array_at<'a>(object: &'a Value, path: &[&str]) -> impl Iterator<Item = &'a Value> {
    path.iter()
        .try_fold(object, |v, key| v.get(key))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

pub fn kind(object: &Value) -> &str {
    str_at(object, &["kind"]).unwrap_or_default()
}

/// The reference a `delete:` entry would use for this object; namespaced objects
/// without a namespace live in `default`, as the API server puts them.
pub fn object_ref(object: &Value) -> Result<ObjectRef> {
    let kind = kind(object);
    let name = str_at(object, &["metadata", "name"]).unwrap_or_default();
    if kind.is_empty() || name.is_empty() {
        return Err(Error::Invalid(format!(
            "object without kind or metadata.name: {object}"
        )));
    }
    let namespace = if CLUSTER_SCOPED.contains(&kind) {
        None
    } else {
        Some(
            str_at(object, &["metadata", "namespace"])
                .unwrap_or("default")
                .to_string(),
        )
    };
    Ok(ObjectRef {
        kind: kind.to_string(),
        namespace,
        name: name.to_string(),
    })
}

/// Every endpoint address of every EndpointSlice, canonicalised, with the port
/// numbers its slice names (all protocols: the echo servers listen on each).
pub fn endpoint_ports<'a>(
    objects: impl IntoIterator<Item = &'a Value>,
) -> Result<BTreeMap<IpAddr, BTreeSet<u16>>> {
    let mut pods: BTreeMap<IpAddr, BTreeSet<u16>> = BTreeMap::new();
    for slice in objects.into_iter().filter(|o| kind(o) == "EndpointSlice") {
        if str_at(slice, &["addressType"]) == Some("FQDN") {
            continue;
        }
        let ports: Vec<u16> = array_at(slice, &["ports"])
            .filter_map(|p| p.get("port").and_then(Value::as_u64))
            .filter_map(|p| u16::try_from(p).ok())
            .collect();
        for endpoint in array_at(slice, &["endpoints"]) {
            for address in array_at(endpoint, &["addresses"]).filter_map(Value::as_str) {
                let ip = parse_ip(address)?;
                pods.entry(ip).or_default().extend(&ports);
            }
        }
    }
    Ok(pods)
}

/// The nodes every endpoint address is placed on, over all slices: `None` for an
/// endpoint without `nodeName`. An address may be named on several nodes (scenarios
/// move endpoints between steps).
pub fn endpoint_nodes<'a>(
    objects: impl IntoIterator<Item = &'a Value>,
) -> Result<BTreeMap<IpAddr, BTreeSet<Option<String>>>> {
    let mut nodes: BTreeMap<IpAddr, BTreeSet<Option<String>>> = BTreeMap::new();
    for slice in objects.into_iter().filter(|o| kind(o) == "EndpointSlice") {
        if str_at(slice, &["addressType"]) == Some("FQDN") {
            continue;
        }
        for endpoint in array_at(slice, &["endpoints"]) {
            let node = str_at(endpoint, &["nodeName"]).map(str::to_string);
            for address in array_at(endpoint, &["addresses"]).filter_map(Value::as_str) {
                nodes
                    .entry(parse_ip(address)?)
                    .or_default()
                    .insert(node.clone());
            }
        }
    }
    Ok(nodes)
}

/// ClusterIPs, external IPs and load-balancer addresses of every Service; addresses
/// that do not parse are left out (the proxy ignores them too).
pub fn service_addresses<'a>(objects: impl IntoIterator<Item = &'a Value>) -> BTreeSet<IpAddr> {
    let mut out = BTreeSet::new();
    for service in objects.into_iter().filter(|o| kind(o) == "Service") {
        let singles = [
            str_at(service, &["spec", "clusterIP"]),
            str_at(service, &["spec", "loadBalancerIP"]),
        ];
        let lists = array_at(service, &["spec", "clusterIPs"])
            .chain(array_at(service, &["spec", "externalIPs"]))
            .filter_map(Value::as_str);
        let ingress = array_at(service, &["status", "loadBalancer", "ingress"])
            .filter_map(|i| i.get("ip").and_then(Value::as_str));
        for text in singles.into_iter().flatten().chain(lists).chain(ingress) {
            if let Ok(ip) = parse_ip(text) {
                out.insert(ip);
            }
        }
    }
    out
}

pub fn has_node(objects: &[Value], name: &str) -> bool {
    objects
        .iter()
        .any(|o| kind(o) == "Node" && str_at(o, &["metadata", "name"]) == Some(name))
}

/// The Node object a scenario without one gets: its addresses as InternalIPs and the
/// pod CIDRs (the first also as `podCIDR`, as the API serves a dual-stack node).
pub fn synthesized_node(node: &NodeSpec) -> Value {
    let mut addresses: Vec<Value> = node
        .addresses
        .iter()
        .map(|a| json!({"type": "InternalIP", "address": a.addr().to_string()}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": node.name}));
    let cidrs: Vec<String> = node.pod_cidrs.iter().map(ToString::to_string).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux"},
        },
        "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs},
        "status": {"addresses": addresses},
    })
}

/// The objects as the cluster should hold them: the scenario's, plus the node object
/// when they have none for this node.
pub fn with_node(objects: &[Value], node: &NodeSpec) -> Vec<Value> {
    let mut out = objects.to_vec();
    if !has_node(objects, &node.name) {
        out.push(synthesized_node(node));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::addr::parse_cidr;

    fn node() -> NodeSpec {
        NodeSpec {
            name: "test-node".into(),
            addresses: vec![
                parse_cidr("192.168.0.2/24").unwrap(),
                parse_cidr("1.2.3.4/32").unwrap(),
            ],
            pod_cidrs: vec![parse_cidr("10.0.0.0/8").unwrap()],
        }
    }

    #[test]
    fn endpoints_are_canonicalised_and_collect_ports() {
        let objects: Vec<Value> = serde_yaml::from_str(
            r#"
- kind: EndpointSlice
  metadata: {name: a, namespace: ns}
  addressType: IPv4
  endpoints: [{addresses: [10.180.00.001]}, {addresses: [10.180.0.2]}]
  ports: [{port: 80, protocol: TCP}, {port: 53, protocol: UDP}, {name: noport}]
- kind: EndpointSlice
  metadata: {name: b, namespace: ns}
  addressType: IPv4
  endpoints: [{addresses: [10.180.0.1]}]
  ports: [{port: 8443}]
- kind: EndpointSlice
  metadata: {name: c, namespace: ns}
  addressType: FQDN
  endpoints: [{addresses: [example.com]}]
"#,
        )
        .unwrap();
        let pods = endpoint_ports(&objects).unwrap();
        let ip: IpAddr = "10.180.0.1".parse().unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[&ip], BTreeSet::from([53, 80, 8443]));
    }

    #[test]
    fn endpoint_nodes_over_every_slice() {
        let objects: Vec<Value> = serde_yaml::from_str(
            r#"
- kind: EndpointSlice
  metadata: {name: a, namespace: ns}
  addressType: IPv4
  endpoints: [{addresses: [10.180.00.001], nodeName: node2}, {addresses: [10.180.0.2]}]
- kind: EndpointSlice
  metadata: {name: b, namespace: ns}
  addressType: IPv4
  endpoints: [{addresses: [10.180.0.1], nodeName: test-node}]
- kind: EndpointSlice
  metadata: {name: c, namespace: ns}
  addressType: FQDN
  endpoints: [{addresses: [example.com], nodeName: node3}]
"#,
        )
        .unwrap();
        let nodes = endpoint_nodes(&objects).unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            nodes[&"10.180.0.1".parse::<IpAddr>().unwrap()],
            BTreeSet::from([Some("node2".to_string()), Some("test-node".to_string())])
        );
        assert_eq!(
            nodes[&"10.180.0.2".parse::<IpAddr>().unwrap()],
            BTreeSet::from([None])
        );
    }

    #[test]
    fn service_addresses_cover_every_kind() {
        let objects: Vec<Value> = serde_yaml::from_str(
            r#"
- kind: Service
  metadata: {name: a, namespace: ns}
  spec: {clusterIP: 172.30.0.041, clusterIPs: [172.30.0.041], externalIPs: [192.168.099.022]}
  status: {loadBalancer: {ingress: [{ip: 1.2.3.004}, {hostname: x}]}}
- kind: Service
  metadata: {name: h, namespace: ns}
  spec: {clusterIP: None, clusterIPs: [None]}
"#,
        )
        .unwrap();
        let got: Vec<String> = service_addresses(&objects)
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(got, ["1.2.3.4", "172.30.0.41", "192.168.99.22"]);
    }

    #[test]
    fn refs_and_node() {
        let svc = json!({"kind": "Service", "metadata": {"name": "s"}});
        assert_eq!(object_ref(&svc).unwrap().to_string(), "Service/default/s");
        let cidr = json!({"kind": "ServiceCIDR", "metadata": {"name": "kubernetes"}});
        assert_eq!(
            object_ref(&cidr).unwrap().to_string(),
            "ServiceCIDR/kubernetes"
        );
        assert!(object_ref(&json!({"kind": "Service"})).is_err());

        let objects = with_node(std::slice::from_ref(&svc), &node());
        assert_eq!(objects.len(), 2);
        assert_eq!(objects[1]["status"]["addresses"][1]["address"], "1.2.3.4");
        assert_eq!(objects[1]["spec"]["podCIDR"], "10.0.0.0/8");
        assert_eq!(objects[1]["spec"]["podCIDRs"], json!(["10.0.0.0/8"]));
        assert_eq!(with_node(&objects, &node()).len(), 2);

        let mut dual = node();
        dual.addresses.push(parse_cidr("fd00:168::2/64").unwrap());
        dual.pod_cidrs.push(parse_cidr("fd00:10::/64").unwrap());
        let node_object = synthesized_node(&dual);
        assert_eq!(node_object["spec"]["podCIDR"], "10.0.0.0/8");
        assert_eq!(
            node_object["spec"]["podCIDRs"],
            json!(["10.0.0.0/8", "fd00:10::/64"])
        );
        assert_eq!(
            node_object["status"]["addresses"][2]["address"],
            "fd00:168::2"
        );
    }
}
