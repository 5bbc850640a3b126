// SPDX-License-Identifier: Apache-2.0
//! Cluster scenario files (`tests/multinode/*.yaml`): objects and flows for the three-node
//! cluster, where each endpoint and each client says which node it sits on.
//!
//! ```yaml
//! name: c1-cross-node
//! about: what the file shows
//! lbIPs: [198.51.100.10]          # routed by the router: ECMP, and one node per via-node-X client
//! pods: [10.1.0.10]               # clients that are pods (endpoints' pods are implied)
//! objects: [...]                  # Services and EndpointSlices; an endpoint's nodeName is its node
//! flows:
//! - {about: NodePort to a pod on another node, from: external, to: "node-a:30080",
//!    proto: udp, expect: "10.2.0.10:9000", source: node-a}
//! - {about: eTP=Local without a local endpoint, from: via-node-c, to: "198.51.100.20:80", expect: DROP}
//! health:                         # health-check node ports, as a load balancer sees them
//! - {node: node-b, port: 30990, status: 200}
//! ```
//!
//! Places: `node-a`, `node-b`, `node-c` (the node's namespace and cgroup, or its address);
//! `external` (the router's client, which takes the ECMP route to an LB IP); `via-node-X`
//! (an external client the router sends to node X); a pod's address (its node is the one
//! whose pod CIDR holds it, `10.<n+1>.0.0/24`, and must be its endpoints' `nodeName`).
//! `source` is what the backend must see (a place, or `any`); the client must always see
//! the address it dialled.

use std::{collections::BTreeSet, net::Ipv4Addr, path::Path};

use serde::Deserialize;
use serde_json::Value;

use super::{
    Cluster, at,
    net::{EXTERNAL_CLIENT, NODE_COUNT, node_address, node_name, pinned_client},
};
use crate::scenario::{Error, Result, outcome::Outcome};

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterScenario {
    pub name: String,
    pub about: String,
    #[serde(default, rename = "lbIPs")]
    pub lb_ips: Vec<Ipv4Addr>,
    #[serde(default)]
    pub pods: Vec<Ipv4Addr>,
    pub objects: Vec<Value>,
    pub flows: Vec<ClusterFlow>,
    #[serde(default)]
    pub health: Vec<HealthCheck>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFlow {
    pub about: String,
    pub from: String,
    /// `<place or ip>:<port>`.
    pub to: String,
    #[serde(default = "tcp")]
    pub proto: String,
    /// `<backend ip>:<port>`, or `DROP`.
    pub expect: String,
    /// What the backend must see as the source: a place, or `any`.
    #[serde(default)]
    pub source: Option<String>,
}

fn tcp() -> String {
    "tcp".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    pub node: String,
    pub port: u16,
    pub status: u16,
}

/// The node index of a name (`node-a` ...).
fn node_index(name: &str) -> Option<usize> {
    (0..NODE_COUNT).find(|i| node_name(*i) == name)
}

/// The address a place stands for.
pub fn resolve(place: &str) -> Result<Ipv4Addr> {
    if place == "external" {
        return Ok(EXTERNAL_CLIENT);
    }
    if let Some(node) = place.strip_prefix("via-").and_then(node_index) {
        return Ok(pinned_client(node));
    }
    if let Some(node) = node_index(place) {
        return Ok(node_address(node));
    }
    place
        .parse()
        .map_err(|_| Error::Invalid(format!("unknown place {place:?}")))
}

/// The node whose pod CIDR (`10.<n+1>.0.0/24`) holds `ip`, and the host part.
pub fn pod_slot(ip: Ipv4Addr) -> Option<(usize, u8)> {
    let [ten, n, zero, host] = ip.octets();
    let node = usize::from(n).checked_sub(1)?;
    (ten == 10 && zero == 0 && node < NODE_COUNT).then_some((node, host))
}

impl ClusterScenario {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        Ok(serde_yaml::from_str(&text)?)
    }

    /// The objects as one YAML list.
    pub fn objects_yaml(&self) -> Result<String> {
        Ok(serde_yaml::to_string(&self.objects)?)
    }

    fn slices(&self) -> impl Iterator<Item = &Value> {
        self.objects.iter().filter(|o| o["kind"] == "EndpointSlice")
    }

    /// Every pod `(node, host)`: the endpoints' and the listed clients'. An endpoint whose
    /// `nodeName` is not the node of its address is an error in the file.
    pub fn pods(&self) -> Result<Vec<(usize, u8)>> {
        let mut pods = BTreeSet::new();
        for endpoint in self
            .slices()
            .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
        {
            let node = endpoint["nodeName"].as_str().and_then(node_index);
            for address in endpoint["addresses"].as_array().into_iter().flatten() {
                let ip: Ipv4Addr = address
                    .as_str()
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| Error::Invalid(format!("endpoint address {address}")))?;
                let slot = pod_slot(ip)
                    .ok_or_else(|| Error::Invalid(format!("{ip} is in no node's pod CIDR")))?;
                if node != Some(slot.0) {
                    return Err(Error::Invalid(format!(
                        "{ip} sits on {} but its nodeName is {:?}",
                        node_name(slot.0),
                        endpoint["nodeName"]
                    )));
                }
                pods.insert(slot);
            }
        }
        for ip in &self.pods {
            pods.insert(
                pod_slot(*ip)
                    .ok_or_else(|| Error::Invalid(format!("{ip} is in no node's pod CIDR")))?,
            );
        }
        Ok(pods.into_iter().collect())
    }

    /// The listeners every pod runs: echo servers (TCP and UDP) on the endpoint ports.
    pub fn listeners(&self) -> Vec<String> {
        let ports: BTreeSet<u64> = self
            .slices()
            .flat_map(|s| s["ports"].as_array().into_iter().flatten())
            .filter_map(|p| p["port"].as_u64())
            .collect();
        ports
            .iter()
            .flat_map(|port| ["tcp", "udp"].map(|proto| format!("echo/{proto}/:{port}")))
            .collect()
    }
}

/// Splits `<place or ip>:<port>`.
fn destination(to: &str) -> Result<(Ipv4Addr, u16)> {
    let (host, port) = to
        .rsplit_once(':')
        .ok_or_else(|| Error::Invalid(format!("destination {to:?} has no port")))?;
    let port = port
        .parse()
        .map_err(|_| Error::Invalid(format!("destination {to:?}: bad port")))?;
    Ok((resolve(host)?, port))
}

/// Probes one flow; says what was wrong with it, if anything.
pub fn check_flow(cluster: &Cluster, flow: &ClusterFlow) -> Result<Option<String>> {
    let from = resolve(&flow.from)?;
    let (ip, port) = destination(&flow.to)?;
    let to = at(ip, port);
    let attempt = cluster.probe(from, to, &flow.proto)?;
    let seen = attempt.describe();
    eprintln!(
        "{}: {} {from} -> {to}: {seen}, client's peer {:?}",
        flow.about, flow.proto, attempt.peer
    );
    let what = format!("{} ({} {from} -> {to})", flow.about, flow.proto);
    if flow.expect == "DROP" {
        return Ok((attempt.outcome != Outcome::Timeout)
            .then(|| format!("{what}: expected a drop, got {seen}")));
    }
    let backend = crate::scenario::addr::parse_socket_addr(&flow.expect)?;
    let mut wrong = Vec::new();
    if attempt.backend != Some(backend) {
        wrong.push(format!("answered by {:?}, not {backend}", attempt.backend));
    }
    match flow.source.as_deref() {
        None | Some("any") => {}
        Some(source) => {
            let source = resolve(source)?;
            if attempt.seen_source != Some(source.into()) {
                wrong.push(format!(
                    "the backend saw {:?}, not {source}",
                    attempt.seen_source
                ));
            }
        }
    }
    // The reply path, seen from the client: its socket talked to what it dialled.
    if attempt.peer != Some(to) {
        wrong.push(format!(
            "the client's peer was {:?}, not {to}",
            attempt.peer
        ));
    }
    Ok((!wrong.is_empty()).then(|| format!("{what}: {} [{seen}]", wrong.join("; "))))
}

/// Every flow and health check of the file; returns what went wrong.
pub fn failures(cluster: &Cluster, scenario: &ClusterScenario) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    for flow in &scenario.flows {
        failures.extend(check_flow(cluster, flow)?);
    }
    for check in &scenario.health {
        let node = resolve(&check.node)?;
        let url = format!("http://{node}:{}/healthz", check.port);
        let got = cluster.external_get(&url);
        if got != Some(check.status) {
            failures.push(format!(
                "health-check node port {} of {}: {got:?}, expected {}",
                check.port, check.node, check.status
            ));
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_resolve_to_addresses() {
        assert_eq!(resolve("external").unwrap(), EXTERNAL_CLIENT);
        assert_eq!(resolve("node-b").unwrap(), node_address(1));
        assert_eq!(resolve("via-node-c").unwrap(), pinned_client(2));
        assert_eq!(resolve("10.2.0.10").unwrap(), Ipv4Addr::new(10, 2, 0, 10));
        assert!(resolve("node-d").is_err());
        assert_eq!(
            destination("node-a:30080").unwrap(),
            (node_address(0), 30080)
        );
        assert_eq!(pod_slot(Ipv4Addr::new(10, 3, 0, 11)), Some((2, 11)));
        assert_eq!(pod_slot(Ipv4Addr::new(10, 4, 0, 11)), None);
    }

    #[test]
    fn pods_come_from_endpoints_and_clients_and_must_sit_on_their_node() {
        let text = r#"
name: t
about: t
pods: [10.1.0.10]
objects:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s-1, namespace: ns1, labels: {kubernetes.io/service-name: s}}
  addressType: IPv4
  endpoints: [{addresses: [10.2.0.10], nodeName: node-b}]
  ports: [{name: p, port: 9000, protocol: TCP}]
flows: []
"#;
        let scenario: ClusterScenario = serde_yaml::from_str(text).unwrap();
        assert_eq!(scenario.pods().unwrap(), vec![(0, 10), (1, 10)]);
        assert_eq!(
            scenario.listeners(),
            vec!["echo/tcp/:9000", "echo/udp/:9000"]
        );
        let misplaced: ClusterScenario =
            serde_yaml::from_str(&text.replace("nodeName: node-b", "nodeName: node-c")).unwrap();
        assert!(misplaced.pods().is_err());
    }

    #[test]
    fn the_shipped_files_parse_and_place_every_pod() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("multinode");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let scenario = ClusterScenario::load(&path).unwrap();
                scenario.pods().unwrap();
                for flow in &scenario.flows {
                    resolve(&flow.from).unwrap();
                    destination(&flow.to).unwrap();
                }
                seen += 1;
            }
        }
        assert!(seen > 0, "no scenario in {}", dir.display());
    }
}
