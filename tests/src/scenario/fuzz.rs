// SPDX-License-Identifier: Apache-2.0
//! Differential fuzzing (pure): random valid clusters, and the flows they imply, written
//! as ordinary scenario files for `cargo xtask conformance --fuzz`, which replays them
//! through one of our modes and through upstream's kube-proxy and compares what each flow
//! saw (conformance.rs).
//!
//! A case is one random cluster: one to three Services (ClusterIP, NodePort or
//! LoadBalancer; one or two ports of TCP or UDP, named or numeric targetPorts; traffic
//! policies; ClientIP affinity; trafficDistribution with zone hints; single- and
//! dual-stack families; externalIPs; load-balancer ingress in VIP or Proxy mode with
//! source ranges) with one or two EndpointSlices per family whose endpoints are ready,
//! serving-terminating or neither, on this node, another or none. Its flows are sampled
//! from every frontend (ClusterIP, NodePort on each node address, external IP, LB IP, a
//! port the Service does not serve) and every client (a pod, the node, an outside client
//! inside and outside the source ranges, an endpoint reaching its own Service). A file
//! holds several cases, each a step replacing the previous one's objects (addresses,
//! names and node ports never repeat within a file, so no conntrack entry of one case
//! meets another's), under one configuration drawn per file (masqueradeAll, the
//! local-traffic detector, nodePortAddresses, families).
//!
//! A flow's `expect` only bounds the random choice of endpoints, so that two replays
//! choosing differently inside it agree: the endpoints either traffic policy could pick
//! (ready ones, else serving-terminating ones; of this node for a Local policy, of the
//! cluster otherwise; every serving one where zone hints apply), or `DROP` (one attempt)
//! where none could. The flow's note carries `fuzz:` tags naming the classes of
//! [`KNOWN_CLASSES`](super::upstream_outcomes::KNOWN_CLASSES), the documented differences a fuzzed flow may show.
//!
//! The same seed gives the same files (fastrand's generator, seeded per file).

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use serde_json::{Value, json};

use super::{
    Scenario,
    conformance::Observation,
    format::{Change, Flow, Mode},
};

/// What one fuzzing run generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuzzOptions {
    pub seed: u64,
    /// Random clusters in all.
    pub cases: usize,
    /// Cases per scenario file (each after the first a step).
    pub cases_per_file: usize,
    /// Flows sampled per case, at most.
    pub flows_per_case: usize,
}

impl Default for FuzzOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            cases: 100,
            cases_per_file: 10,
            flows_per_case: 6,
        }
    }
}

/// One generated scenario file.
#[derive(Debug, Clone, PartialEq)]
pub struct FuzzFile {
    /// `fuzz-<seed>-<n>.yaml`.
    pub name: String,
    pub text: String,
    pub cases: usize,
}

/// Every file of a run.
pub fn generate(options: &FuzzOptions) -> Vec<FuzzFile> {
    let per_file = options.cases_per_file.max(1);
    let files = options.cases.div_ceil(per_file);
    (0..files)
        .map(|n| {
            let cases = per_file.min(options.cases - n * per_file);
            let seed = options
                .seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(n as u64);
            let name = format!("fuzz-{}-{n:03}", options.seed);
            let text = FileGen::new(seed, &name, options.flows_per_case).file(cases);
            FuzzFile {
                name: format!("{name}.yaml"),
                text,
                cases,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// Which node an endpoint's `nodeName` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeName {
    This,
    Other,
    Unset,
}

#[derive(Debug, Clone)]
struct Endpoint {
    family: Family,
    ip: IpAddr,
    node: NodeName,
    ready: bool,
    serving: bool,
    terminating: bool,
    zone: &'static str,
    /// Indices of the Service ports its slice carries.
    ports: Vec<usize>,
}

#[derive(Debug, Clone)]
struct Port {
    name: String,
    port: u16,
    udp: bool,
    /// The port number endpoints serve (what the EndpointSlice carries).
    target: u16,
    node_port: u16,
}

#[derive(Debug, Clone)]
struct Service {
    name: String,
    kind: ServiceType,
    families: Vec<Family>,
    cluster_ips: Vec<IpAddr>,
    ports: Vec<Port>,
    external_ips: Vec<IpAddr>,
    lb_ips: Vec<IpAddr>,
    lb_proxy_mode: bool,
    source_ranges: bool,
    etp_local: bool,
    itp_local: bool,
    affinity: bool,
    hints: bool,
    endpoints: Vec<Endpoint>,
}

/// Who sends a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Pod,
    Node,
    /// Outside the node, inside the source ranges.
    Outside,
    /// Outside, outside the source ranges.
    OutsideDenied,
    /// An endpoint of the Service itself.
    Endpoint(usize),
}

/// Where a flow goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frontend {
    ClusterIp,
    UnservedPort,
    NodePort { secondary: bool },
    ExternalIp,
    LoadBalancer,
}

struct FileGen {
    rng: fastrand::Rng,
    name: String,
    flows_per_case: usize,
    dual: bool,
    detector: bool,
    masquerade_all: bool,
    node_port_addresses: bool,
    /// Services so far in the file: every address and port derives from it.
    services: u32,
}

const NODE: &str = "test-node";
const ZONE: &str = "zone-a";

impl FileGen {
    fn new(seed: u64, name: &str, flows_per_case: usize) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        Self {
            dual: rng.u8(..10) < 4,
            detector: rng.u8(..10) < 8,
            masquerade_all: rng.u8(..10) < 1,
            node_port_addresses: rng.u8(..10) < 3,
            rng,
            name: name.to_string(),
            flows_per_case,
            services: 0,
        }
    }

    fn chance(&mut self, percent: u8) -> bool {
        self.rng.u8(..100) < percent
    }

    fn file(mut self, cases: usize) -> String {
        let mut addresses = vec!["192.168.0.2/24", "192.168.1.2/24"];
        let mut pod_cidrs = vec!["10.0.0.0/8"];
        if self.dual {
            addresses.extend(["fd00:168::2/64", "fd00:168:1::2/64"]);
            pod_cidrs.push("fd00:10::/64");
        }
        let mut config = serde_json::Map::new();
        config.insert(
            "clusterCIDR".into(),
            json!(if self.detector {
                pod_cidrs.join(",")
            } else {
                String::new()
            }),
        );
        if self.masquerade_all {
            config.insert("iptables".into(), json!({"masqueradeAll": true}));
            config.insert("nftables".into(), json!({"masqueradeAll": true}));
        }
        if self.node_port_addresses {
            let mut cidrs = vec!["192.168.0.0/24"];
            if self.dual {
                cidrs.push("fd00:168::/64");
            }
            config.insert("nodePortAddresses".into(), json!(cidrs));
        }
        let node = json!({"name": NODE, "addresses": addresses, "podCIDR": pod_cidrs});
        let mut stages: Vec<(Vec<Value>, Vec<Value>)> = Vec::new();
        for case in 0..cases {
            stages.push(self.case(case, &node));
        }
        let mut stages = stages.into_iter();
        let (objects, flows) = stages.next().unwrap_or_default();
        let steps: Vec<Value> = stages
            .map(|(objects, flows)| json!({"objects": objects, "flows": flows}))
            .collect();
        let file = json!({
            "name": self.name,
            "about": "random clusters for differential replays (cargo xtask conformance --fuzz)",
            "upstream": "none: judged by upstream's kube-proxy itself",
            "node": node,
            "config": config,
            "objects": objects,
            "flows": flows,
            "steps": steps,
        });
        serde_yaml::to_string(&file).unwrap_or_default()
    }

    fn case(&mut self, case: usize, node: &Value) -> (Vec<Value>, Vec<Value>) {
        let count = 1 + self.rng.usize(..3);
        let services: Vec<Service> = (0..count).map(|_| self.service()).collect();
        let mut objects = Vec::new();
        if services.iter().any(|s| s.hints) {
            objects.push(zoned_node(node));
        }
        let mut flows = Vec::new();
        for service in &services {
            objects.extend(service_objects(service));
            for (client, frontend, family, port) in self.candidate_flows(service) {
                if let Some(flow) = self.flow(case, service, client, frontend, family, port) {
                    flows.push(flow);
                }
            }
        }
        self.rng.shuffle(&mut flows);
        flows.truncate(self.flows_per_case.max(1));
        (objects, flows)
    }

    fn service(&mut self) -> Service {
        self.services += 1;
        let g = self.services;
        let kind = match self.rng.u8(..10) {
            0..4 => ServiceType::ClusterIp,
            4..7 => ServiceType::NodePort,
            _ => ServiceType::LoadBalancer,
        };
        let families = if !self.dual {
            vec![Family::V4]
        } else {
            match self.rng.u8(..4) {
                0 => vec![Family::V4],
                1 => vec![Family::V6],
                2 => vec![Family::V4, Family::V6],
                _ => vec![Family::V6, Family::V4],
            }
        };
        let cluster_ips = families
            .iter()
            .map(|f| match f {
                Family::V4 => {
                    IpAddr::V4(Ipv4Addr::new(172, 30, (g / 200) as u8, (g % 200 + 1) as u8))
                }
                Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x30, 0, 0, 0, 0, 0, g as u16)),
            })
            .collect();
        let port_count = 1 + self.rng.usize(..2);
        let base = [80u16, 53, 443, 8080][self.rng.usize(..4)];
        let ports = (0..port_count)
            .map(|i| {
                let udp = self.chance(35);
                let port = base + i as u16 * 1000;
                let target = if self.chance(50) {
                    port
                } else {
                    8000 + i as u16
                };
                Port {
                    name: format!("p{i}"),
                    port,
                    udp,
                    target,
                    node_port: 30000 + (g as u16) * 2 + i as u16,
                }
            })
            .collect();
        let external = kind != ServiceType::ClusterIp;
        let external_ips = if self.chance(20) {
            families
                .iter()
                .map(|f| match f {
                    Family::V4 => IpAddr::V4(Ipv4Addr::new(198, 51, 100, g as u8)),
                    Family::V6 => {
                        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x198, 0x51, 0x100, 0, 0, 0, g as u16))
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let lb_ips = if kind == ServiceType::LoadBalancer {
            families
                .iter()
                .map(|f| match f {
                    Family::V4 => IpAddr::V4(Ipv4Addr::new(1, 2, g as u8, 4)),
                    Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 1, 2, g as u16, 0, 0, 0, 4)),
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut service = Service {
            name: format!("fz{g}"),
            kind,
            lb_proxy_mode: kind == ServiceType::LoadBalancer && self.chance(15),
            source_ranges: kind == ServiceType::LoadBalancer && self.chance(30),
            etp_local: (external || !external_ips.is_empty()) && self.chance(35),
            itp_local: self.chance(20),
            affinity: self.chance(15),
            hints: self.chance(10),
            families,
            cluster_ips,
            ports,
            external_ips,
            lb_ips,
            endpoints: Vec::new(),
        };
        service.endpoints = self.endpoints(g, &service);
        service
    }

    fn endpoints(&mut self, g: u32, service: &Service) -> Vec<Endpoint> {
        let mut out = Vec::new();
        for &family in &service.families {
            let count = self.rng.usize(..4);
            let slices = if count > 1 && self.chance(40) { 2 } else { 1 };
            let mut slice_ports: Vec<Vec<usize>> = Vec::new();
            for _ in 0..slices {
                let mut ports: Vec<usize> = (0..service.ports.len()).collect();
                if ports.len() > 1 && self.chance(15) {
                    ports.remove(self.rng.usize(..ports.len()));
                }
                slice_ports.push(ports);
            }
            for k in 0..count {
                let ip = match family {
                    Family::V4 => IpAddr::V4(Ipv4Addr::new(
                        10,
                        100 + (g / 250) as u8,
                        (g % 250) as u8,
                        k as u8 + 1,
                    )),
                    Family::V6 => IpAddr::V6(Ipv6Addr::new(
                        0xfd00,
                        0x10,
                        0,
                        0,
                        0,
                        0x100 + g as u16,
                        0,
                        k as u16 + 1,
                    )),
                };
                let node = match self.rng.u8(..10) {
                    0..6 => NodeName::This,
                    6..9 => NodeName::Other,
                    _ => NodeName::Unset,
                };
                let (ready, serving, terminating) = if self.chance(65) {
                    (true, true, false)
                } else {
                    match self.rng.u8(..3) {
                        0 => (false, true, true),
                        1 => (false, false, true),
                        _ => (false, false, false),
                    }
                };
                out.push(Endpoint {
                    family,
                    ip,
                    node,
                    ready,
                    serving,
                    terminating,
                    zone: if self.chance(50) { ZONE } else { "zone-b" },
                    ports: slice_ports[k % slices].clone(),
                });
            }
        }
        out
    }

    fn candidate_flows(&mut self, service: &Service) -> Vec<(Client, Frontend, Family, usize)> {
        let mut out = Vec::new();
        let node_ports = service.kind != ServiceType::ClusterIp;
        for &family in &service.families {
            for port in 0..service.ports.len() {
                let mut add = |client, frontend| out.push((client, frontend, family, port));
                add(Client::Pod, Frontend::ClusterIp);
                add(Client::Node, Frontend::ClusterIp);
                if port == 0 {
                    add(Client::Pod, Frontend::UnservedPort);
                }
                if node_ports {
                    add(Client::Outside, Frontend::NodePort { secondary: false });
                    add(Client::Outside, Frontend::NodePort { secondary: true });
                    add(Client::Pod, Frontend::NodePort { secondary: false });
                    add(Client::Node, Frontend::NodePort { secondary: false });
                }
                if !service.external_ips.is_empty() {
                    add(Client::Outside, Frontend::ExternalIp);
                    add(Client::Pod, Frontend::ExternalIp);
                }
                if !service.lb_ips.is_empty() {
                    add(Client::Outside, Frontend::LoadBalancer);
                    add(Client::Pod, Frontend::LoadBalancer);
                    if service.source_ranges {
                        add(Client::OutsideDenied, Frontend::LoadBalancer);
                    }
                }
            }
        }
        // Hairpin: a serving endpoint reaching its own Service's ClusterIP.
        for (i, endpoint) in service.endpoints.iter().enumerate() {
            if endpoint.serving && !endpoint.ports.is_empty() && self.chance(50) {
                let port = endpoint.ports[0];
                out.push((
                    Client::Endpoint(i),
                    Frontend::ClusterIp,
                    endpoint.family,
                    port,
                ));
            }
        }
        out
    }

    fn flow(
        &mut self,
        case: usize,
        service: &Service,
        client: Client,
        frontend: Frontend,
        family: Family,
        port: usize,
    ) -> Option<Value> {
        let spec = &service.ports[port];
        let index = service.families.iter().position(|f| *f == family)?;
        let v4 = family == Family::V4;
        let from: IpAddr = match client {
            Client::Pod => ip(v4, "10.0.0.2", "fd00:10::2"),
            Client::Node => ip(v4, "192.168.0.2", "fd00:168::2"),
            Client::Outside => ip(v4, "203.0.113.2", "fd00:203:113::2"),
            Client::OutsideDenied => ip(v4, "203.0.113.130", "fd00:203:113::82"),
            Client::Endpoint(i) => service.endpoints[i].ip,
        };
        let (to_ip, to_port) = match frontend {
            Frontend::ClusterIp => (service.cluster_ips[index], spec.port),
            Frontend::UnservedPort => (service.cluster_ips[index], spec.port + 1),
            Frontend::NodePort { secondary } => (
                match (secondary, v4) {
                    (false, true) => ip(v4, "192.168.0.2", ""),
                    (true, true) => ip(v4, "192.168.1.2", ""),
                    (false, false) => ip(v4, "", "fd00:168::2"),
                    (true, false) => ip(v4, "", "fd00:168:1::2"),
                },
                spec.node_port,
            ),
            Frontend::ExternalIp => (service.external_ips[index], spec.port),
            Frontend::LoadBalancer => (service.lb_ips[index], spec.port),
        };
        let to = SocketAddr::new(to_ip, to_port);
        let candidates = self.candidates(service, client, frontend, family, port);
        let sticky = service.affinity
            && candidates.len() > 1
            && matches!(client, Client::Pod | Client::Node)
            && frontend == Frontend::ClusterIp;
        let expect = if candidates.is_empty() {
            json!("DROP")
        } else {
            json!(
                candidates
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            )
        };
        let mut tags = Vec::new();
        if let Client::Endpoint(i) = client {
            tags.push("fuzz:hairpin");
            if service.endpoints[i].node != NodeName::This {
                tags.push("fuzz:hairpin-not-local");
            }
        }
        let external_frontend = matches!(
            frontend,
            Frontend::NodePort { .. } | Frontend::ExternalIp | Frontend::LoadBalancer
        );
        if client == Client::Pod && external_frontend && !self.masquerade_all {
            tags.push("fuzz:socket-lb-external");
        }
        let note = format!(
            "case {case}: {} {:?} port {} from {client:?} to {frontend:?} {}",
            service.name,
            service.kind,
            spec.name,
            tags.join(" ")
        );
        let mut flow = json!({
            "from": from.to_string(),
            "to": to.to_string(),
            "proto": if spec.udp { "udp" } else { "tcp" },
            "expect": expect,
            "note": note.trim_end(),
        });
        if sticky {
            flow["sticky"] = json!(true);
        }
        Some(flow)
    }

    /// The endpoints either policy could send the flow to (see the module doc); empty
    /// where the Service cannot serve it at all.
    fn candidates(
        &self,
        service: &Service,
        client: Client,
        frontend: Frontend,
        family: Family,
        port: usize,
    ) -> BTreeSet<SocketAddr> {
        if frontend == Frontend::UnservedPort
            || (frontend == Frontend::LoadBalancer && service.lb_proxy_mode)
            || client == Client::OutsideDenied
        {
            return BTreeSet::new();
        }
        let target = service.ports[port].target;
        let with_port: Vec<&Endpoint> = service
            .endpoints
            .iter()
            .filter(|e| e.family == family && e.ports.contains(&port))
            .collect();
        let usable = |local_only: bool| -> Vec<&Endpoint> {
            let pool: Vec<&Endpoint> = with_port
                .iter()
                .copied()
                .filter(|e| !local_only || e.node == NodeName::This)
                .collect();
            let ready: Vec<&Endpoint> = pool.iter().copied().filter(|e| e.ready).collect();
            if !ready.is_empty() {
                return ready;
            }
            pool.into_iter()
                .filter(|e| e.serving && e.terminating)
                .collect()
        };
        let external_frontend = !matches!(frontend, Frontend::ClusterIp);
        let local_policy = if external_frontend {
            service.etp_local
        } else {
            service.itp_local
        };
        let mut chosen: Vec<&Endpoint> = if !local_policy {
            usable(false)
        } else if external_frontend && matches!(client, Client::Outside) {
            usable(true)
        } else {
            // Traffic from this node or its pods to an external frontend of a Local
            // Service may be short-circuited to every endpoint; for a ClusterIP with
            // internalTrafficPolicy Local only this node's count, but either bounds it.
            usable(true).into_iter().chain(usable(false)).collect()
        };
        if service.hints {
            chosen.extend(with_port.iter().copied().filter(|e| e.serving));
        }
        chosen
            .into_iter()
            .map(|e| SocketAddr::new(e.ip, target))
            .collect()
    }
}

fn ip(v4: bool, four: &str, six: &str) -> IpAddr {
    let text = if v4 { four } else { six };
    text.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// This node with its zone label (for zone hints).
fn zoned_node(node: &Value) -> Value {
    let addresses: Vec<Value> = node["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|a| json!({"type": "InternalIP", "address": a.split('/').next().unwrap_or(a)}))
        .chain([json!({"type": "Hostname", "address": NODE})])
        .collect();
    let cidrs = node["podCIDR"].clone();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {
                "kubernetes.io/hostname": NODE,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": ZONE,
            },
        },
        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
        "status": {"addresses": addresses},
    })
}

fn service_objects(service: &Service) -> Vec<Value> {
    let ns = "fuzz";
    let ports: Vec<Value> = service
        .ports
        .iter()
        .map(|p| {
            let mut port = json!({
                "name": p.name,
                "port": p.port,
                "protocol": if p.udp { "UDP" } else { "TCP" },
                // Named targetPorts resolve through the slices, which carry the number.
                "targetPort": if p.target == p.port { json!(p.port) } else { json!(format!("t{}", p.target)) },
            });
            if service.kind != ServiceType::ClusterIp {
                port["nodePort"] = json!(p.node_port);
            }
            port
        })
        .collect();
    let families: Vec<&str> = service.families.iter().map(|f| f.name()).collect();
    let cluster_ips: Vec<String> = service
        .cluster_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut spec = json!({
        "type": match service.kind {
            ServiceType::ClusterIp => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        },
        "clusterIP": cluster_ips[0],
        "clusterIPs": cluster_ips,
        "ipFamilies": families,
        "ipFamilyPolicy": if families.len() > 1 { "RequireDualStack" } else { "SingleStack" },
        "ports": ports,
        "sessionAffinity": if service.affinity { "ClientIP" } else { "None" },
        "internalTrafficPolicy": if service.itp_local { "Local" } else { "Cluster" },
    });
    if service.kind != ServiceType::ClusterIp || !service.external_ips.is_empty() {
        spec["externalTrafficPolicy"] = json!(if service.etp_local {
            "Local"
        } else {
            "Cluster"
        });
    }
    if service.affinity {
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
    }
    if !service.external_ips.is_empty() {
        let ips: Vec<String> = service
            .external_ips
            .iter()
            .map(ToString::to_string)
            .collect();
        spec["externalIPs"] = json!(ips);
    }
    if service.hints {
        spec["trafficDistribution"] = json!("PreferClose");
    }
    if service.source_ranges {
        let mut ranges = Vec::new();
        if service.families.contains(&Family::V4) {
            ranges.push("203.0.113.0/25");
        }
        if service.families.contains(&Family::V6) {
            ranges.push("fd00:203:113::/121");
        }
        spec["loadBalancerSourceRanges"] = json!(ranges);
    }
    let mut status = json!({"loadBalancer": {}});
    if service.kind == ServiceType::LoadBalancer {
        spec["allocateLoadBalancerNodePorts"] = json!(true);
        let mode = if service.lb_proxy_mode {
            "Proxy"
        } else {
            "VIP"
        };
        let ingress: Vec<Value> = service
            .lb_ips
            .iter()
            .map(|ip| json!({"ip": ip.to_string(), "ipMode": mode}))
            .collect();
        status = json!({"loadBalancer": {"ingress": ingress}});
    }
    let mut out = vec![json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service.name, "namespace": ns},
        "spec": spec,
        "status": status,
    })];
    for &family in &service.families {
        let members: Vec<&Endpoint> = service
            .endpoints
            .iter()
            .filter(|e| e.family == family)
            .collect();
        // Endpoints sharing a port list share a slice; an empty family still gets one.
        let mut groups: Vec<(Vec<usize>, Vec<&Endpoint>)> = Vec::new();
        for endpoint in members {
            match groups
                .iter_mut()
                .find(|(ports, _)| *ports == endpoint.ports)
            {
                Some((_, list)) => list.push(endpoint),
                None => groups.push((endpoint.ports.clone(), vec![endpoint])),
            }
        }
        if groups.is_empty() {
            groups.push(((0..service.ports.len()).collect(), Vec::new()));
        }
        for (n, (port_indices, endpoints)) in groups.into_iter().enumerate() {
            let ports: Vec<Value> = port_indices
                .iter()
                .map(|&i| {
                    let p = &service.ports[i];
                    json!({"name": p.name, "port": p.target, "protocol": if p.udp { "UDP" } else { "TCP" }})
                })
                .collect();
            let endpoints: Vec<Value> = endpoints
                .iter()
                .map(|e| {
                    let mut endpoint = json!({
                        "addresses": [e.ip.to_string()],
                        "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
                    });
                    match e.node {
                        NodeName::This => endpoint["nodeName"] = json!(NODE),
                        NodeName::Other => endpoint["nodeName"] = json!("other-node"),
                        NodeName::Unset => {}
                    }
                    if service.hints {
                        endpoint["zone"] = json!(e.zone);
                        endpoint["hints"] = json!({"forZones": [{"name": e.zone}]});
                    }
                    endpoint
                })
                .collect();
            let suffix = match family {
                Family::V4 => "v4",
                Family::V6 => "v6",
            };
            out.push(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{}-{suffix}-{n}", service.name),
                    "namespace": ns,
                    "labels": {"kubernetes.io/service-name": service.name},
                },
                "addressType": family.name(),
                "endpoints": endpoints,
                "ports": ports,
            }));
        }
    }
    out
}

/// A scenario file reproducing a difference a fuzzed flow showed: the objects of its case
/// and the flow alone, expecting what upstream's kube-proxy did (`None` when upstream's
/// answers were mixed, which no expectation states), for tests/scenarios once the cause is
/// fixed or understood.
pub fn repro(
    scenario: &Scenario,
    flow: &Flow,
    upstream: &Observation,
    what: &str,
    ours_mode: Mode,
) -> Option<String> {
    let expect = match upstream
        .kinds
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()[..]
    {
        ["echo"] => json!(
            upstream
                .backends
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ),
        ["refused"] => json!("REJECT"),
        ["timeout"] => json!("DROP"),
        _ => return None,
    };
    let Change::Replace(objects) = &scenario.stages.get(flow.step)?.change else {
        return None;
    };
    let mut repro = json!({
        "from": flow.from.to_string(),
        "to": flow.to.to_string(),
        "proto": flow.proto.as_str(),
        "expect": expect,
        "note": format!("upstream's outcome; {ours_mode} saw otherwise: {what} ({})", flow.note),
    });
    if let [masq] = upstream.masq.iter().collect::<Vec<_>>()[..] {
        repro["masq"] = json!(masq);
    }
    if flow.sticky {
        repro["sticky"] = json!(true);
    }
    let addresses: Vec<String> = scenario
        .node
        .addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    let pod_cidrs: Vec<String> = scenario
        .node
        .pod_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    let file = json!({
        "name": format!("{}-flow{}", scenario.name, flow.index),
        "about": format!("a difference the differential fuzzer found ({} #{})", scenario.name, flow.index),
        "upstream": "upstream kube-proxy v1.37 itself (cargo xtask conformance --fuzz)",
        "node": {"name": scenario.node.name, "addresses": addresses, "podCIDR": pod_cidrs},
        "config": scenario.config,
        "objects": objects,
        "flows": [repro],
    });
    serde_yaml::to_string(&file).ok()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::scenario::{
        Scenario,
        format::{Expectation, RawScenario},
    };

    fn parse(file: &FuzzFile) -> Scenario {
        let raw: RawScenario = serde_yaml::from_str(&file.text).unwrap();
        Scenario::from_raw(raw, Path::new(&file.name)).unwrap()
    }

    #[test]
    fn a_seed_gives_the_same_files_and_another_seed_others() {
        let options = FuzzOptions {
            cases: 25,
            ..FuzzOptions::default()
        };
        let first = generate(&options);
        assert_eq!(first, generate(&options));
        assert_eq!(first.len(), 3);
        assert_eq!(first.iter().map(|f| f.cases).sum::<usize>(), 25);
        let other = generate(&FuzzOptions { seed: 2, ..options });
        assert_ne!(first[0].text, other[0].text);
    }

    /// Many seeds: every file is a valid scenario with a stage per case and flows in
    /// each, and the generator reaches every kind of frontend and client it knows.
    #[test]
    fn generated_files_are_valid_scenarios_that_cover_the_space() {
        let mut seen = BTreeSet::new();
        for seed in 0..40 {
            for file in generate(&FuzzOptions {
                seed,
                cases: 10,
                ..FuzzOptions::default()
            }) {
                let scenario = parse(&file);
                assert_eq!(scenario.stages.len(), file.cases, "{}", file.text);
                for flow in scenario.flows() {
                    assert!(flow.modes.is_none());
                    let what = flow.note.split(" from ").nth(1).unwrap_or_default();
                    seen.insert(
                        what.split_whitespace()
                            .take(3)
                            .collect::<Vec<_>>()
                            .join(" "),
                    );
                    if let Expectation::Backends(set) = &flow.expect {
                        assert!(set.iter().all(|b| b.is_ipv4() == flow.to.is_ipv4()));
                    }
                }
                assert!(file.text.contains("kind: EndpointSlice"));
            }
        }
        for wanted in [
            "Pod to ClusterIp",
            "Node to ClusterIp",
            "Pod to UnservedPort",
            "Outside to NodePort",
            "Outside to ExternalIp",
            "Outside to LoadBalancer",
            "OutsideDenied to LoadBalancer",
        ] {
            assert!(
                seen.iter().any(|s| s.starts_with(wanted)),
                "no {wanted} flow in {seen:?}"
            );
        }
        assert!(seen.iter().any(|s| s.starts_with("Endpoint(")));
    }

    /// The socket-level exception is tagged on a pod's flows to external frontends,
    /// and only where the file does not ask for masqueradeAll.
    #[test]
    fn pod_flows_to_external_frontends_carry_the_socket_lb_tag() {
        let (mut tagged, mut untagged_pod_external) = (0, 0);
        for seed in 0..40 {
            for file in generate(&FuzzOptions {
                seed,
                cases: 10,
                ..FuzzOptions::default()
            }) {
                let masquerade_all = file.text.contains("masqueradeAll: true");
                for flow in parse(&file).flows() {
                    let pod_external = ["NodePort", "ExternalIp", "LoadBalancer"]
                        .iter()
                        .any(|f| flow.note.contains(&format!("from Pod to {f}")));
                    let has_tag = flow.note.contains("fuzz:socket-lb-external");
                    assert_eq!(has_tag, pod_external && !masquerade_all, "{}", flow.note);
                    tagged += usize::from(has_tag);
                    untagged_pod_external += usize::from(pod_external && !has_tag);
                }
            }
        }
        assert!(tagged > 0 && untagged_pod_external > 0);
    }

    #[test]
    fn addresses_and_node_ports_never_repeat_within_a_file() {
        for file in generate(&FuzzOptions {
            seed: 7,
            cases: 30,
            cases_per_file: 30,
            ..FuzzOptions::default()
        }) {
            let scenario = parse(&file);
            let mut names = BTreeSet::new();
            for object in scenario.all_objects() {
                if object["kind"] == "Service" {
                    assert!(names.insert(object["metadata"]["name"].to_string()));
                }
            }
            assert!(names.len() >= 30);
        }
    }

    #[test]
    fn candidates_follow_readiness_and_local_policies() {
        let mut generator = FileGen::new(1, "t", 6);
        let mut service = generator.service();
        service.families = vec![Family::V4];
        service.kind = ServiceType::NodePort;
        service.hints = false;
        service.etp_local = true;
        service.itp_local = false;
        let endpoint = |last: u8, node, ready, serving, terminating| Endpoint {
            family: Family::V4,
            ip: IpAddr::V4(Ipv4Addr::new(10, 100, 1, last)),
            node,
            ready,
            serving,
            terminating,
            zone: ZONE,
            ports: vec![0],
        };
        service.endpoints = vec![
            endpoint(1, NodeName::Other, true, true, false),
            endpoint(2, NodeName::This, false, true, true),
            endpoint(3, NodeName::This, false, false, true),
        ];
        let target = service.ports[0].target;
        let at = |last: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 100, 1, last)), target);
        let np = Frontend::NodePort { secondary: false };
        // Cluster policy: the ready one; Local from outside: the serving-terminating local one.
        assert_eq!(
            generator.candidates(&service, Client::Pod, Frontend::ClusterIp, Family::V4, 0),
            BTreeSet::from([at(1)])
        );
        assert_eq!(
            generator.candidates(&service, Client::Outside, np, Family::V4, 0),
            BTreeSet::from([at(2)])
        );
        // From a pod, a Local external frontend may be short-circuited: either bounds it.
        assert_eq!(
            generator.candidates(&service, Client::Pod, np, Family::V4, 0),
            BTreeSet::from([at(1), at(2)])
        );
        assert!(
            generator
                .candidates(&service, Client::Pod, Frontend::UnservedPort, Family::V4, 0)
                .is_empty()
        );
    }

    #[test]
    fn a_repro_holds_the_case_and_the_flow_with_upstreams_outcome() {
        let file = &generate(&FuzzOptions {
            seed: 3,
            cases: 3,
            ..FuzzOptions::default()
        })[0];
        let scenario = parse(file);
        let flow = scenario.stages[1].flows[0].clone();
        let upstream = Observation {
            kinds: BTreeSet::from(["refused".to_string()]),
            ..Observation::default()
        };
        let text = repro(&scenario, &flow, &upstream, "answers", Mode::Ebpf).unwrap();
        let raw: RawScenario = serde_yaml::from_str(&text).unwrap();
        let again = Scenario::from_raw(raw, Path::new("r.yaml")).unwrap();
        assert_eq!(again.stages.len(), 1);
        let only: Vec<&Flow> = again.flows().collect();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].expect, Expectation::Reject);
        assert_eq!((only[0].from, only[0].to), (flow.from, flow.to));
        let Change::Replace(objects) = &again.stages[0].change else {
            panic!()
        };
        let Change::Replace(case) = &scenario.stages[1].change else {
            panic!()
        };
        assert_eq!(objects, case);
        let mixed = Observation {
            kinds: BTreeSet::from(["refused".to_string(), "echo".to_string()]),
            ..Observation::default()
        };
        assert!(repro(&scenario, &flow, &mixed, "answers", Mode::Ebpf).is_none());
    }
}
