// SPDX-License-Identifier: Apache-2.0
//! Behaviour scenarios (../shared/scenarios/*.yaml) as sync inputs: the node, the
//! configuration and each state's objects, fed through the real trackers. Each state
//! yields the two families' models, the services changed since the previous state and the
//! conntrack report: what the agent would hand the proxier.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_yaml::Value;

use crate::k8s::convert::{ClusterObject, objects_from_value};
use crate::model::{
    EndpointsChangeTracker, IpFamily, NamespacedName, ObjectKind, ServiceChangeTracker,
};
use crate::node::{LocalDetector, NodeAddresses, local::Mode};
use crate::proxier::{
    FamilyState, NodeContext, StaleConntrack, SyncRequest, resolve_nodeport_addresses,
};

/// The scenarios directory: `../shared/scenarios` from the workspace root.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/scenarios")
        .canonicalize()
        .unwrap_or_else(|_| {
            panic!(
                "the behaviour scenarios are missing: expected ../shared/scenarios next to the \
                 workspace root ({}/../../shared/scenarios)",
                env!("CARGO_MANIFEST_DIR")
            )
        })
}

pub fn scenario_files() -> Vec<PathBuf> {
    let dir = scenarios_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scenario files in {}", dir.display());
    files
}

/// What changed from one state to the next, as the agent would report it.
pub struct Step {
    pub changed: HashSet<NamespacedName>,
    pub stale: StaleConntrack,
}

/// Replays a scenario's states through one tracker pair per family; after
/// [`Replay::apply`], `families` and `node` are the sync inputs of that state.
pub struct Replay {
    pub node: NodeContext,
    pub families: Vec<FamilyState>,
    services: HashMap<NamespacedName, Service>,
    slices: HashMap<NamespacedName, EndpointSlice>,
    trackers: Vec<(ServiceChangeTracker, EndpointsChangeTracker)>,
}

/// A scenario file: its name, node and configuration, and the complete object set of
/// every state (`objects`, then each step).
pub struct Scenario {
    pub name: String,
    doc: Value,
    pub states: Vec<Vec<ClusterObject>>,
}

impl Scenario {
    pub fn load(path: &Path) -> Self {
        Self::parse(&std::fs::read_to_string(path).unwrap())
    }

    /// A scenario in the files' format.
    pub fn parse(text: &str) -> Self {
        let doc: Value = serde_yaml::from_str(text).unwrap();
        let name = doc["name"].as_str().unwrap().to_string();
        let mut objects = objects_from_value(doc["objects"].clone()).unwrap();
        let mut states = vec![objects.clone()];
        if let Some(steps) = doc["steps"].as_sequence() {
            for step in steps {
                if let Some(list) = step.get("objects") {
                    objects = objects_from_value(list.clone()).unwrap();
                }
                if let Some(deletes) = step.get("delete").and_then(Value::as_sequence) {
                    for delete in deletes {
                        let mut parts = delete.as_str().unwrap().splitn(3, '/');
                        let (kind, ns, name) = (
                            parts.next().unwrap(),
                            parts.next().unwrap(),
                            parts.next().unwrap(),
                        );
                        objects.retain(|o| {
                            !(o.kind().to_string() == kind
                                && o.name() == NamespacedName::new(ns, name))
                        });
                    }
                }
                states.push(objects.clone());
            }
        }
        Self { name, doc, states }
    }

    pub fn replay(&self) -> Replay {
        Replay::new(&self.doc)
    }
}

fn config_str<'a>(config: &'a Value, key: &str) -> Option<&'a str> {
    config.get(key).and_then(Value::as_str)
}

fn node_context(doc: &Value) -> NodeContext {
    let node = &doc["node"];
    let config = &doc["config"];
    let addresses: Vec<IpAddr> = node["addresses"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().parse::<IpNet>().unwrap().addr())
        .collect();
    let primary = NodeAddresses {
        v4: addresses.iter().copied().find(IpAddr::is_ipv4),
        v6: addresses.iter().copied().find(IpAddr::is_ipv6),
    };
    let mut host = addresses.clone();
    host.extend(["127.0.0.1", "::1"].map(|a| a.parse::<IpAddr>().unwrap()));

    let cluster_cidrs: Vec<IpNet> = config_str(config, "clusterCIDR")
        .unwrap_or_default()
        .split(',')
        .filter(|c| !c.trim().is_empty())
        .map(|c| c.trim().parse().unwrap())
        .collect();
    let pod_cidrs: Vec<IpNet> = node["podCIDR"]
        .as_str()
        .map(|c| vec![c.parse().unwrap()])
        .unwrap_or_default();
    let detect = &config["detectLocal"];
    let mode = match config_str(config, "detectLocalMode").unwrap_or("ClusterCIDR") {
        "NodeCIDR" => Mode::NodeCidr(&pod_cidrs),
        "BridgeInterface" => Mode::BridgeInterface(config_str(detect, "bridgeInterface").unwrap()),
        "InterfaceNamePrefix" => {
            Mode::InterfaceNamePrefix(config_str(detect, "interfaceNamePrefix").unwrap())
        }
        _ => Mode::ClusterCidr(&cluster_cidrs),
    };
    let (mut np_cidrs, mut np_primary) = (Vec::new(), false);
    for entry in config["nodePortAddresses"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        match entry.as_str().unwrap() {
            "primary" => np_primary = true,
            cidr => np_cidrs.push(cidr.parse().unwrap()),
        }
    }
    let iptables = &config["iptables"];
    let listed = crate::config::NodePortAddresses {
        entries: config["nodePortAddresses"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|e| crate::config::NodePortAddress::parse(e.as_str()?))
            .collect(),
    };
    let gate = config["featureGates"][crate::proxier::LOCALHOST_NODEPORTS_GATE]
        .as_bool()
        .unwrap_or(false);
    NodeContext {
        name: node["name"].as_str().unwrap().to_string(),
        labels: Default::default(),
        nodeport_addresses: resolve_nodeport_addresses(&np_cidrs, np_primary, &primary, &host),
        primary_ips: primary,
        host_addresses: host,
        local_detector: LocalDetector::new(mode).unwrap(),
        masquerade_all: config["masqueradeAll"].as_bool().unwrap_or(false),
        masquerade_bit: iptables["masqueradeBit"].as_u64().unwrap_or(14) as u32,
        localhost_nodeports: iptables["localhostNodePorts"].as_bool().unwrap_or(true),
        loopback_nodeport_families: crate::proxier::loopback_nodeport_families(gate, &listed),
        loopback_nodeports_gate: gate,
    }
}

impl Replay {
    /// The sync of the state `step` came from (after [`Replay::apply`]).
    pub fn request<'a>(&'a self, step: &'a Step, full: bool) -> SyncRequest<'a> {
        SyncRequest {
            families: &self.families,
            node: &self.node,
            full,
            changed: &step.changed,
            stale: &step.stale,
        }
    }

    fn new(doc: &Value) -> Self {
        let node = node_context(doc);
        let trackers = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|f| {
                (
                    ServiceChangeTracker::new(f),
                    EndpointsChangeTracker::new(f, node.name.clone()),
                )
            })
            .collect();
        Self {
            node,
            families: vec![
                FamilyState::new(IpFamily::V4),
                FamilyState::new(IpFamily::V6),
            ],
            services: HashMap::new(),
            slices: HashMap::new(),
            trackers,
        }
    }

    /// Makes `objects` the complete set of objects, then applies the changes.
    pub fn apply(&mut self, objects: &[ClusterObject]) -> Step {
        let mut seen = HashSet::new();
        for object in objects {
            let name = object.name();
            seen.insert((object.kind(), name.clone()));
            match object {
                ClusterObject::Node(node) if *name.name() == *self.node.name => {
                    self.node.labels = node.metadata.labels.clone().unwrap_or_default();
                }
                ClusterObject::Service(svc) => {
                    let previous = self.services.insert(name, svc.clone());
                    for (services, _) in &mut self.trackers {
                        services.update(previous.as_ref(), Some(svc));
                    }
                }
                ClusterObject::EndpointSlice(slice) => {
                    self.slices.insert(name, slice.clone());
                    for (_, endpoints) in &mut self.trackers {
                        endpoints.endpoint_slice_update(slice, false);
                    }
                }
                _ => {}
            }
        }
        let gone: Vec<_> = self
            .services
            .keys()
            .filter(|n| !seen.contains(&(ObjectKind::Service, (*n).clone())))
            .cloned()
            .collect();
        for name in gone {
            let svc = self.services.remove(&name).unwrap();
            for (services, _) in &mut self.trackers {
                services.update(Some(&svc), None);
            }
        }
        let gone: Vec<_> = self
            .slices
            .keys()
            .filter(|n| !seen.contains(&(ObjectKind::EndpointSlice, (*n).clone())))
            .cloned()
            .collect();
        for name in gone {
            let slice = self.slices.remove(&name).unwrap();
            for (_, endpoints) in &mut self.trackers {
                endpoints.endpoint_slice_update(&slice, true);
            }
        }

        let mut changed = HashSet::new();
        let mut stale = StaleConntrack::default();
        for (state, (services, endpoints)) in self.families.iter_mut().zip(&mut self.trackers) {
            let svc_result = state.services.apply(services);
            let ep_result = state.endpoints.apply(endpoints);
            assert!(services.take_rejected().is_empty());
            assert!(endpoints.take_rejected().is_empty());
            stale.record(&svc_result, &ep_result);
            changed.extend(svc_result.updated_services);
            changed.extend(ep_result.updated_services);
        }
        Step { changed, stale }
    }
}
