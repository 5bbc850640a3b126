// SPDX-License-Identifier: Apache-2.0
//! Where everything of a scenario lives (pure): which pods exist, on which node, and
//! what they listen on, where each client sits, which addresses the external namespace
//! owns or routes to the node, the external router's address, and the remote nodes'.
//!
//! Namespaces, addresses and echo servers exist for the whole file. Plain listeners (the
//! witnesses of UNTOUCHED flows) are planned per stage: the runner starts a stage's after
//! the agent synced that stage and stops them before the next change, so that a port the
//! proxy serves in one step (a health-check node port) is never held by the runner there.
//! A stage also keeps the other stages' listeners where they are free ([`Binding`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use ipnet::IpNet;

use super::{
    error::{Error, Result},
    format::{Expectation, Flow, NodeSpec, Proto, Scenario, Stage},
    objects::{endpoint_nodes, endpoint_ports, service_addresses},
};

/// A namespace of the run: where a client runs, and where a plain listener lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClientPlace {
    /// A node address or loopback: runs in the node namespace and cgroup.
    Node,
    /// Runs in the pod namespace of this address, in the node cgroup.
    Pod(IpAddr),
    /// Runs in the external namespace, outside the node cgroup.
    External,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub address: IpAddr,
    /// Ports with an echo server on every protocol.
    pub echo_ports: BTreeSet<u16>,
    /// The remote node (index into [`Placement::remote_nodes`]) this pod lives behind;
    /// `None`: behind the node the proxy runs on.
    pub remote: Option<usize>,
}

impl PodPlan {
    fn new(address: IpAddr) -> Self {
        PodPlan {
            address,
            echo_ports: BTreeSet::new(),
            remote: None,
        }
    }
}

/// A plain listener for an UNTOUCHED flow: bound to `addr` in the namespace of `home`.
/// A loopback destination is the loopback of the namespace the flow's client runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlainListener {
    pub home: ClientPlace,
    pub proto: Proto,
    pub addr: SocketAddr,
    pub binding: Binding,
}

/// How hard the runner tries to bind a stage's plain listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Binding {
    /// For an UNTOUCHED flow of the stage: retried while the address is in use (the proxy
    /// may still be closing a port it served in the stage before); reported if it never
    /// frees.
    Patient,
    /// For an UNTOUCHED flow of the stage at a port a LOCAL flow of the same stage has the
    /// proxy serve on the node: the proxy holds that port on purpose, on the addresses it
    /// chose, so binding is tried once (and reported when it fails).
    Once,
    /// For an UNTOUCHED flow of another stage, kept as a witness: what the proxy leaves
    /// untranslated there is answered instead of refused by the kernel, so a refusal the
    /// proxy never made cannot pass for a REJECT. Tried once; quietly absent when in use
    /// (no flow of the stage needs it).
    Witness,
}

/// Another node of the cluster, standing for the `nodeName` of endpoints that live
/// elsewhere. It sits on the node's uplink segment with one address in the subnet of
/// each family's first node address, routes its own pods, and reaches the node's pods
/// through the node, as nodes of a routed (non-overlay) cluster do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNodePlan {
    pub name: String,
    /// One per family the node has an address of, primary family first.
    pub addresses: Vec<IpNet>,
}

impl RemoteNodePlan {
    /// Its address of `ip`'s family: the gateway the node routes its pods through.
    pub fn address_for(&self, ip: IpAddr) -> Option<IpNet> {
        self.addresses
            .iter()
            .copied()
            .find(|a| a.addr().is_ipv4() == ip.is_ipv4())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Ordered by address; a pod's position is its index in names (`p<idx>`, `kp<idx>`).
    pub pods: Vec<PodPlan>,
    /// Endpoints that are node addresses (host-network endpoints): echo ports on the node.
    pub node_echo: BTreeMap<IpAddr, BTreeSet<u16>>,
    pub external_clients: BTreeSet<IpAddr>,
    /// UNTOUCHED destinations (of any stage) the external namespace owns: an untranslated
    /// packet is routed there and answered by the stage's plain listener, or refused.
    pub external_owned: BTreeSet<IpAddr>,
    /// Per stage (index = stage): the plain listeners its UNTOUCHED flows need.
    pub plain: Vec<BTreeSet<PlainListener>>,
    /// Service addresses the external namespace routes to the node (to its first address
    /// of the same family).
    pub routed_to_node: BTreeSet<IpAddr>,
    /// Of those, the ones the external namespace answers itself (TCP reset, ICMP port
    /// unreachable) when the node sends it traffic for them: the node forwards there only
    /// what the proxy left untranslated, and a DROP must not pass because such a packet
    /// vanished on the way. Not the destinations of UNTOUCHED flows, which may see silence
    /// but not a refusal.
    pub answered_outside: BTreeSet<IpAddr>,
    /// The external router's address in the subnet of the node's first address of each
    /// family the node has (primary family first).
    pub routers: Vec<IpNet>,
    /// Nodes named by endpoints that live only elsewhere, by name.
    pub remote_nodes: Vec<RemoteNodePlan>,
}

impl Placement {
    pub fn pod_index(&self, ip: IpAddr) -> Option<usize> {
        self.pods.iter().position(|p| p.address == ip)
    }

    pub fn place_client(&self, node: &NodeSpec, ip: IpAddr) -> ClientPlace {
        place_client(node, |ip| self.pod_index(ip).is_some(), ip)
    }

    /// The plain listeners of stage `stage` (none for a stage the file does not have).
    pub fn plain_of(&self, stage: usize) -> impl Iterator<Item = &PlainListener> {
        self.plain.get(stage).into_iter().flatten()
    }

    /// The remote node a pod lives behind, if any.
    pub fn remote_node_of(&self, pod: &PodPlan) -> Option<&RemoteNodePlan> {
        pod.remote.and_then(|n| self.remote_nodes.get(n))
    }

    pub fn plan(scenario: &Scenario) -> Result<Self> {
        let node = &scenario.node;
        let endpoints = endpoint_ports(scenario.all_objects())?;
        let endpoint_nodes = endpoint_nodes(scenario.all_objects())?;
        let mut pods: BTreeMap<IpAddr, PodPlan> = BTreeMap::new();
        let mut node_echo: BTreeMap<IpAddr, BTreeSet<u16>> = BTreeMap::new();
        let mut add_echo = |ip: IpAddr, ports: &BTreeSet<u16>| {
            if node.owns(ip) {
                node_echo.entry(ip).or_default().extend(ports);
            } else if !ip.is_loopback() {
                let pod = pods.entry(ip).or_insert_with(|| PodPlan::new(ip));
                pod.echo_ports.extend(ports);
            }
        };
        for (ip, ports) in &endpoints {
            add_echo(*ip, ports);
        }
        for flow in scenario.flows() {
            if let Expectation::Backends(set) = &flow.expect {
                for backend in set {
                    add_echo(backend.ip(), &BTreeSet::from([backend.port()]));
                }
            }
        }
        let in_pods = |ip: IpAddr| !node.owns(ip) && !ip.is_loopback() && node.in_pod_cidrs(ip);
        for flow in scenario.flows() {
            if in_pods(flow.from) {
                pods.entry(flow.from)
                    .or_insert_with(|| PodPlan::new(flow.from));
            }
        }

        let is_client = |ip: IpAddr, pods: &BTreeMap<IpAddr, PodPlan>| {
            !node.owns(ip) && !ip.is_loopback() && !pods.contains_key(&ip) && !in_pods(ip)
        };
        let external_clients: BTreeSet<IpAddr> = scenario
            .flows()
            .map(|f| f.from)
            .filter(|ip| is_client(*ip, &pods))
            .collect();
        let external_targets: BTreeSet<IpAddr> = scenario
            .flows()
            .filter(|f| external_clients.contains(&f.from))
            .map(|f| f.to.ip())
            .collect();

        // Pods and addresses for the UNTOUCHED destinations of every stage: topology is
        // built once for the file.
        let mut external_owned = BTreeSet::new();
        for flow in scenario
            .flows()
            .filter(|f| f.expect == Expectation::Untouched)
        {
            let to = flow.to.ip();
            if to.is_loopback() || node.owns(to) {
                continue;
            }
            if pods.contains_key(&to) || in_pods(to) {
                pods.entry(to).or_insert_with(|| PodPlan::new(to));
            } else if !external_targets.contains(&to) {
                external_owned.insert(to);
            }
        }
        let plain = (0..scenario.stages.len())
            .map(|n| {
                stage_plain(
                    node,
                    &scenario.stages,
                    n,
                    &pods,
                    &node_echo,
                    &external_owned,
                )
            })
            .collect();

        let services = service_addresses(scenario.all_objects());
        let routed_to_node: BTreeSet<IpAddr> = services
            .iter()
            .copied()
            .filter(|ip| {
                !node.owns(*ip)
                    && !pods.contains_key(ip)
                    && !external_owned.contains(ip)
                    && !ip.is_loopback()
            })
            .collect();
        let untouched_targets: BTreeSet<IpAddr> = scenario
            .flows()
            .filter(|f| f.expect == Expectation::Untouched)
            .map(|f| f.to.ip())
            .collect();
        let answered_outside = routed_to_node
            .difference(&untouched_targets)
            .copied()
            .collect();

        let mut used: BTreeSet<IpAddr> = node.addresses.iter().map(|a| a.addr()).collect();
        used.extend(pods.keys());
        used.extend(&external_clients);
        used.extend(&external_owned);
        used.extend(&services);
        used.extend(scenario.flows().map(|f| f.to.ip()));
        let mut free_in = |subnet: IpNet| {
            let address = first_free(subnet, &used)?;
            used.insert(address.addr());
            Ok::<_, Error>(address)
        };
        let routers = node
            .family_primaries()
            .into_iter()
            .map(&mut free_in)
            .collect::<Result<Vec<_>>>()?;

        // A pod lives on a remote node when every slice naming it puts it on one other
        // node. An endpoint without nodeName, or one that is (in some step) on this node,
        // stays behind this node, as does a flow's client: only this node runs the proxy.
        let clients: BTreeSet<IpAddr> = scenario.flows().map(|f| f.from).collect();
        let mut remote_nodes: Vec<RemoteNodePlan> = Vec::new();
        for pod in pods.values_mut() {
            let Some(names) = endpoint_nodes.get(&pod.address) else {
                continue;
            };
            let elsewhere = names
                .iter()
                .all(|n| n.as_ref().is_some_and(|n| *n != node.name));
            let routable = node.primary_for(pod.address).is_some();
            let first = names.iter().flatten().next();
            let (true, true, false, Some(name)) =
                (elsewhere, routable, clients.contains(&pod.address), first)
            else {
                continue;
            };
            let index = match remote_nodes.iter().position(|r| r.name == *name) {
                Some(index) => index,
                None => {
                    let addresses = node
                        .family_primaries()
                        .into_iter()
                        .map(&mut free_in)
                        .collect::<Result<Vec<_>>>()?;
                    remote_nodes.push(RemoteNodePlan {
                        name: name.clone(),
                        addresses,
                    });
                    remote_nodes.len() - 1
                }
            };
            pod.remote = Some(index);
        }

        Ok(Placement {
            pods: pods.into_values().collect(),
            node_echo,
            external_clients,
            external_owned,
            plain,
            routed_to_node,
            answered_outside,
            routers,
            remote_nodes,
        })
    }

    /// The external router of `ip`'s family, if the node has an address of that family.
    pub fn router_for(&self, ip: IpAddr) -> Option<IpNet> {
        self.routers
            .iter()
            .copied()
            .find(|r| r.addr().is_ipv4() == ip.is_ipv4())
    }
}

/// Where a client of `ip` runs, given which addresses are pods.
fn place_client(node: &NodeSpec, is_pod: impl Fn(IpAddr) -> bool, ip: IpAddr) -> ClientPlace {
    if node.owns(ip) || ip.is_loopback() {
        ClientPlace::Node
    } else if is_pod(ip) {
        ClientPlace::Pod(ip)
    } else {
        ClientPlace::External
    }
}

/// The plain listeners of stage `stage`: those its UNTOUCHED flows need, and those of the
/// other stages as witnesses. None where an echo server at the destination (placed for
/// the whole file) holds the port already, none for a service address the external side
/// routes to the node (silence is the only untouched answer there), and no witness at a
/// port the proxy serves in this stage (a LOCAL flow's).
fn stage_plain(
    node: &NodeSpec,
    stages: &[Stage],
    stage: usize,
    pods: &BTreeMap<IpAddr, PodPlan>,
    node_echo: &BTreeMap<IpAddr, BTreeSet<u16>>,
    external_owned: &BTreeSet<IpAddr>,
) -> BTreeSet<PlainListener> {
    let served_by_proxy: BTreeSet<(Proto, u16)> = stages[stage]
        .flows
        .iter()
        .filter(|f| f.expect == Expectation::Local)
        .map(|f| (f.proto, f.to.port()))
        .collect();
    let listener_of = |flow: &Flow| -> Option<(ClientPlace, Proto, SocketAddr, bool)> {
        let (ip, port) = (flow.to.ip(), flow.to.port());
        let home = if ip.is_loopback() {
            place_client(node, |a| pods.contains_key(&a), flow.from)
        } else if node.owns(ip) {
            ClientPlace::Node
        } else if pods.contains_key(&ip) {
            ClientPlace::Pod(ip)
        } else if external_owned.contains(&ip) {
            ClientPlace::External
        } else {
            return None;
        };
        let echo_there = if ip.is_loopback() {
            false
        } else if home == ClientPlace::Node {
            node_echo
                .get(&ip)
                .is_some_and(|ports| ports.contains(&port))
        } else {
            pods.get(&ip).is_some_and(|p| p.echo_ports.contains(&port))
        };
        let proxy_port = home == ClientPlace::Node && served_by_proxy.contains(&(flow.proto, port));
        (!echo_there).then_some((home, flow.proto, flow.to, proxy_port))
    };
    let untouched = |n: usize| {
        stages[n]
            .flows
            .iter()
            .filter(|f| f.expect == Expectation::Untouched)
            .filter_map(listener_of)
    };
    let mut out = BTreeSet::new();
    let mut own = BTreeSet::new();
    for (home, proto, addr, proxy_port) in untouched(stage) {
        own.insert((home, proto, addr));
        let binding = if proxy_port {
            Binding::Once
        } else {
            Binding::Patient
        };
        out.insert(PlainListener {
            home,
            proto,
            addr,
            binding,
        });
    }
    for (home, proto, addr, proxy_port) in (0..stages.len())
        .filter(|n| *n != stage)
        .flat_map(untouched)
    {
        if !proxy_port && own.insert((home, proto, addr)) {
            out.insert(PlainListener {
                home,
                proto,
                addr,
                binding: Binding::Witness,
            });
        }
    }
    out
}

/// The first address of the node's subnet that nothing in the scenario uses (for the
/// external router and the remote nodes). IPv6's first address (all host bits zero) is
/// the Subnet-Router anycast address, which every forwarding node joins: as the router's
/// address it would point the node's default route at itself.
fn first_free(subnet: IpNet, used: &BTreeSet<IpAddr>) -> Result<IpNet> {
    let network = subnet.network();
    let router_ip = subnet
        .hosts()
        .filter(|ip| ip.is_ipv4() || *ip != network || subnet.prefix_len() >= 127)
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| {
            Error::Setup(format!(
                "no free address for the external router or a remote node in the node subnet {}",
                subnet.trunc()
            ))
        })?;
    IpNet::new(router_ip, subnet.prefix_len())
        .map_err(|e| Error::Setup(format!("router address: {e}")))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::scenario::format::RawScenario;

    fn scenario(yaml: &str) -> Scenario {
        let raw: RawScenario = serde_yaml::from_str(yaml).unwrap();
        Scenario::from_raw(raw, Path::new("t.yaml")).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A stage's plain listeners as `<home> <proto> <addr>`, in plan order.
    fn listeners(p: &Placement, stage: usize) -> Vec<String> {
        p.plain_of(stage)
            .map(|l| {
                let home = match l.home {
                    ClientPlace::Node => "node".to_string(),
                    ClientPlace::Pod(ip) => format!("pod {ip}"),
                    ClientPlace::External => "external".to_string(),
                };
                let mark = match l.binding {
                    Binding::Patient => "",
                    Binding::Once => " (once)",
                    Binding::Witness => " (witness)",
                };
                format!("{home} {} {}{mark}", l.proto, l.addr)
            })
            .collect()
    }

    const BASE: &str = r#"
name: t
node: {name: test-node, addresses: [192.168.0.2/24, 192.168.1.2/24, 1.2.3.4/32], podCIDR: 10.0.0.0/8}
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: s, namespace: ns}
  spec: {clusterIP: 172.30.0.41, externalIPs: [192.168.0.1, 192.168.99.33]}
  status: {loadBalancer: {ingress: [{ip: 5.6.7.8}]}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s-1, namespace: ns}
  addressType: IPv4
  endpoints: [{addresses: [10.180.00.001], nodeName: other}, {addresses: [192.168.1.2]}]
  ports: [{port: 80, protocol: TCP}]
flows:
- {from: 10.0.0.2, to: '10.0.0.3:80', expect: UNTOUCHED}
- {from: 10.180.0.1, to: '172.30.0.41:80', expect: ['10.180.0.1:80', '10.180.0.9:8080']}
- {from: 203.0.113.2, to: '5.6.7.8:80', expect: DROP}
- {from: 192.168.0.2, to: '172.30.0.41:443', expect: UNTOUCHED}
- {from: 1.2.3.4, to: '1.2.3.4:81', proto: udp, expect: UNTOUCHED}
- {from: 10.0.0.2, to: '172.30.0.42:80', proto: udp, expect: UNTOUCHED}
- {from: 10.0.0.2, to: '5.6.7.8:81', expect: UNTOUCHED}
- {from: 127.0.0.1, to: '127.0.0.1:10256', expect: LOCAL}
"#;

    #[test]
    fn pods_clients_and_listeners() {
        let s = scenario(BASE);
        let p = Placement::plan(&s).unwrap();
        let addrs: Vec<String> = p.pods.iter().map(|p| p.address.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.2", "10.0.0.3", "10.180.0.1", "10.180.0.9"]);
        let hairpin = &p.pods[p.pod_index(ip("10.180.0.1")).unwrap()];
        assert_eq!(hairpin.echo_ports, BTreeSet::from([80]));
        assert_eq!(
            p.pods[p.pod_index(ip("10.180.0.9")).unwrap()].echo_ports,
            BTreeSet::from([8080])
        );
        assert!(p.pods[0].echo_ports.is_empty());

        // A host-network endpoint on a node address gets its echo server on the node.
        assert_eq!(p.node_echo[&ip("192.168.1.2")], BTreeSet::from([80]));

        assert_eq!(p.external_clients, BTreeSet::from([ip("203.0.113.2")]));
        // 5.6.7.8 is an external client's destination, so it stays routed to the node.
        assert_eq!(
            p.external_owned,
            BTreeSet::from([ip("172.30.0.41"), ip("172.30.0.42")])
        );
        // One stage: a plain listener in the pod 10.0.0.3, on the node, and two outside;
        // none for 5.6.7.8:81, which the external side routes to the node.
        assert_eq!(p.plain.len(), 1);
        assert_eq!(
            listeners(&p, 0),
            [
                "node udp 1.2.3.4:81",
                "pod 10.0.0.3 tcp 10.0.0.3:80",
                "external tcp 172.30.0.41:443",
                "external udp 172.30.0.42:80",
            ]
        );
        assert_eq!(
            p.routed_to_node,
            BTreeSet::from([ip("192.168.0.1"), ip("192.168.99.33"), ip("5.6.7.8")])
        );
        // 5.6.7.8:81 is an UNTOUCHED destination: silence is fine there, a refusal is not.
        assert_eq!(
            p.answered_outside,
            BTreeSet::from([ip("192.168.0.1"), ip("192.168.99.33")])
        );
        // .1 is an external IP of the service, so the router takes the next free one.
        assert_eq!(p.routers, ["192.168.0.3/24".parse::<IpNet>().unwrap()]);

        let node = &s.node;
        assert_eq!(p.place_client(node, ip("1.2.3.4")), ClientPlace::Node);
        assert_eq!(p.place_client(node, ip("127.0.0.1")), ClientPlace::Node);
        assert_eq!(
            p.place_client(node, ip("10.0.0.2")),
            ClientPlace::Pod(ip("10.0.0.2"))
        );
        assert_eq!(
            p.place_client(node, ip("203.0.113.2")),
            ClientPlace::External
        );
    }

    const STEPS: &str = r#"
name: t
node:
  name: test-node
  addresses: [192.168.0.2/24, 'fd00:168::2/64']
  podCIDR: [10.0.0.0/8, 'fd00:10::/64']
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: hc, namespace: ns}
  spec: {type: LoadBalancer, clusterIP: 172.30.0.41, externalTrafficPolicy: Local, healthCheckNodePort: 30000,
    ports: [{port: 80, nodePort: 3001, protocol: TCP}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: hc-1, namespace: ns, labels: {kubernetes.io/service-name: hc}}
  addressType: IPv4
  endpoints: [{addresses: [10.180.0.1], nodeName: test-node}]
  ports: [{port: 80, protocol: TCP}]
flows:
- {from: 192.168.0.2, to: '192.168.0.2:30000', expect: LOCAL}
- {from: 192.168.0.2, to: '192.168.0.2:30001', expect: UNTOUCHED}
- {from: 192.168.0.2, to: '192.168.0.2:30000', proto: udp, expect: UNTOUCHED}
- {from: 127.0.0.1, to: '127.0.0.1:5555', expect: UNTOUCHED}
- {from: 192.168.0.2, to: '127.0.0.1:5555', proto: udp, expect: UNTOUCHED}
- {from: '::1', to: '[::1]:5555', expect: UNTOUCHED}
- {from: 10.0.0.2, to: '127.0.0.1:5555', expect: UNTOUCHED}
- {from: 'fd00:10::2', to: '[::1]:5555', expect: UNTOUCHED}
- {from: 203.0.113.2, to: '127.0.0.1:5556', expect: UNTOUCHED}
- {from: 10.0.0.2, to: '10.180.0.1:80', expect: UNTOUCHED}
steps:
- delete: [Service/ns/hc]
  flows:
  - {from: 192.168.0.2, to: '192.168.0.2:30000', expect: UNTOUCHED}
- objects:
  - apiVersion: v1
    kind: Service
    metadata: {name: hc, namespace: ns}
    spec: {type: LoadBalancer, clusterIP: 172.30.0.41, externalTrafficPolicy: Local, healthCheckNodePort: 30001,
      ports: [{port: 80, nodePort: 3001, protocol: TCP}]}
  flows:
  - {from: 192.168.0.2, to: '192.168.0.2:30001', expect: LOCAL}
  - {from: 192.168.0.2, to: '192.168.0.2:30000', expect: UNTOUCHED}
  - {from: 127.0.0.1, to: '127.0.0.1:30001', expect: UNTOUCHED}
"#;

    #[test]
    fn loopback_destinations_get_a_listener_where_the_client_runs() {
        let p = Placement::plan(&scenario(STEPS)).unwrap();
        let stage0 = listeners(&p, 0);
        for expected in [
            "node tcp 127.0.0.1:5555",
            "node tcp [::1]:5555",
            "node udp 127.0.0.1:5555",
            "pod 10.0.0.2 tcp 127.0.0.1:5555",
            "pod fd00:10::2 tcp [::1]:5555",
            "external tcp 127.0.0.1:5556",
        ] {
            assert!(
                stage0.iter().any(|l| l == expected),
                "{expected}: {stage0:?}"
            );
        }
        // Loopback is never an address the external side owns (it has its own).
        assert!(p.external_owned.is_empty(), "{:?}", p.external_owned);
        assert_eq!(p.external_clients, BTreeSet::from([ip("203.0.113.2")]));
    }

    #[test]
    fn plain_listeners_are_planned_per_stage() {
        let p = Placement::plan(&scenario(STEPS)).unwrap();
        assert_eq!(p.plain.len(), 3);
        // Step 0: the health-check node port 30000 is the proxy's (LOCAL, TCP); the runner
        // listens on 30001, and on UDP 30000 (no LOCAL flow is UDP). The endpoint
        // 10.180.0.1:80 answers for itself: its echo server holds the port. Step 2's
        // 127.0.0.1:30001 is a witness here.
        assert_eq!(
            listeners(&p, 0),
            [
                "node tcp 127.0.0.1:5555",
                "node tcp 127.0.0.1:30001 (witness)",
                "node tcp 192.168.0.2:30001",
                "node tcp [::1]:5555",
                "node udp 127.0.0.1:5555",
                "node udp 192.168.0.2:30000",
                "pod 10.0.0.2 tcp 127.0.0.1:5555",
                "pod fd00:10::2 tcp [::1]:5555",
                "external tcp 127.0.0.1:5556",
            ]
        );
        // Step 1: the service is gone, 30000 is untouched and the runner's (once free);
        // step 0's listeners stay as witnesses.
        assert_eq!(
            listeners(&p, 1),
            [
                "node tcp 127.0.0.1:5555 (witness)",
                "node tcp 127.0.0.1:30001 (witness)",
                "node tcp 192.168.0.2:30000",
                "node tcp 192.168.0.2:30001 (witness)",
                "node tcp [::1]:5555 (witness)",
                "node udp 127.0.0.1:5555 (witness)",
                "node udp 192.168.0.2:30000 (witness)",
                "pod 10.0.0.2 tcp 127.0.0.1:5555 (witness)",
                "pod fd00:10::2 tcp [::1]:5555 (witness)",
                "external tcp 127.0.0.1:5556 (witness)",
            ]
        );
        // Step 2: 30001 became the proxy's: the runner tries its loopback address once (a flow
        // says it is untouched there), without waiting for the proxy to free it,
        // and keeps no witness on 30001 (192.168.0.2:30001 of step 0).
        let step2 = listeners(&p, 2);
        assert_eq!(
            step2[..3],
            [
                "node tcp 127.0.0.1:5555 (witness)",
                "node tcp 127.0.0.1:30001 (once)",
                "node tcp 192.168.0.2:30000",
            ]
        );
        assert!(
            !step2.iter().any(|l| l.contains("192.168.0.2:30001")),
            "{step2:?}"
        );
        assert_eq!(p.plain_of(3).count(), 0);
    }

    const DUAL: &str = r#"
name: t
node:
  name: test-node
  addresses: [192.168.0.2/24, 'fd00:168::2/64', 'fd00:168:1::2/64']
  podCIDR: [10.0.0.0/8, 'fd00:10::/64']
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: s, namespace: ns}
  spec: {clusterIP: 172.30.0.41, clusterIPs: [172.30.0.41, 'fd00:30::41'], externalIPs: ['fd00:168::1']}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s-6, namespace: ns}
  addressType: IPv6
  endpoints: [{addresses: ['fd00:10::180:0:1']}]
  ports: [{port: 80, protocol: TCP}]
flows:
- {from: 'fd00:10::2', to: '[fd00:30::41]:80', expect: ['[fd00:10::180:0:1]:80']}
- {from: 10.0.0.2, to: '172.30.0.41:80', expect: REJECT}
- {from: 'fd00:168::2', to: '[fd00:168::1]:80', expect: ['[fd00:10::180:0:1]:80']}
"#;

    #[test]
    fn one_router_per_family_never_the_subnet_router_anycast() {
        let s = scenario(DUAL);
        let p = Placement::plan(&s).unwrap();
        let routers: Vec<String> = p.routers.iter().map(ToString::to_string).collect();
        // fd00:168:: is the Subnet-Router anycast address and fd00:168::1 a service's.
        assert_eq!(routers, ["192.168.0.1/24", "fd00:168::3/64"]);
        assert_eq!(
            p.router_for(ip("fd00:30::41")).map(|r| r.addr()),
            Some(ip("fd00:168::3"))
        );
        assert_eq!(
            p.router_for(ip("10.1.2.3")).map(|r| r.addr()),
            Some(ip("192.168.0.1"))
        );
        let addrs: Vec<String> = p.pods.iter().map(|p| p.address.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.2", "fd00:10::2", "fd00:10::180:0:1"]);
        assert!(p.external_clients.is_empty());
        assert_eq!(
            p.routed_to_node,
            BTreeSet::from([ip("172.30.0.41"), ip("fd00:30::41"), ip("fd00:168::1")])
        );
        assert_eq!(
            p.place_client(&s.node, ip("fd00:10::2")),
            ClientPlace::Pod(ip("fd00:10::2"))
        );
        assert_eq!(p.place_client(&s.node, ip("::1")), ClientPlace::Node);

        let v6_only = DUAL
            .replace("192.168.0.2/24, ", "")
            .replace("10.0.0.0/8, ", "");
        let p = Placement::plan(&scenario(&v6_only)).unwrap();
        assert_eq!(p.routers, ["fd00:168::3/64".parse::<IpNet>().unwrap()]);
        assert_eq!(p.router_for(ip("10.1.2.3")), None);
        // 10.0.0.2 is outside every pod CIDR now: an external client.
        assert_eq!(p.external_clients, BTreeSet::from([ip("10.0.0.2")]));
    }

    const REMOTE: &str = r#"
name: t
node:
  name: test-node
  addresses: [192.168.0.2/24, 192.168.1.2/24, 'fd00:168::2/64']
  podCIDR: [10.0.0.0/8, 'fd00:10::/64']
objects:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s-1, namespace: ns}
  addressType: IPv4
  endpoints:
  - {addresses: [10.180.0.1], nodeName: node2}
  - {addresses: [10.180.0.2]}
  - {addresses: [10.180.0.3], nodeName: test-node}
  - {addresses: [10.180.0.4], nodeName: node1}
  - {addresses: [10.180.0.5], nodeName: node2}
  - {addresses: [10.180.0.6], nodeName: node2}
  - {addresses: [10.180.0.7], nodeName: node3}
  ports: [{port: 80, protocol: TCP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s-6, namespace: ns}
  addressType: IPv6
  endpoints: [{addresses: ['fd00:10::180:0:1'], nodeName: node2}]
  ports: [{port: 80, protocol: TCP}]
flows:
- {from: 10.180.0.6, to: '172.30.0.41:80', expect: ['10.180.0.1:80']}
steps:
- objects:
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata: {name: s-1, namespace: ns}
    addressType: IPv4
    endpoints: [{addresses: [10.180.0.4], nodeName: test-node}]
    ports: [{port: 80, protocol: TCP}]
  flows:
  - {from: 10.0.0.2, to: '172.30.0.41:80', expect: ['10.180.0.4:80']}
"#;

    #[test]
    fn endpoints_only_on_other_nodes_live_behind_remote_nodes() {
        let s = scenario(REMOTE);
        let p = Placement::plan(&s).unwrap();
        let remote_of = |a: &str| {
            let pod = &p.pods[p.pod_index(ip(a)).unwrap()];
            p.remote_node_of(pod).map(|r| r.name.as_str())
        };
        assert_eq!(remote_of("10.180.0.1"), Some("node2"));
        assert_eq!(remote_of("10.180.0.5"), Some("node2"));
        assert_eq!(remote_of("fd00:10::180:0:1"), Some("node2"));
        assert_eq!(remote_of("10.180.0.7"), Some("node3"));
        // No nodeName, this node, on this node in a later step, a flow's client.
        for local in [
            "10.180.0.2",
            "10.180.0.3",
            "10.180.0.4",
            "10.180.0.6",
            "10.0.0.2",
        ] {
            assert_eq!(remote_of(local), None, "{local}");
        }
        let nodes: Vec<(&str, Vec<String>)> = p
            .remote_nodes
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.addresses.iter().map(ToString::to_string).collect(),
                )
            })
            .collect();
        // After the routers (.1 and ::1), in the subnets of each family's first address.
        assert_eq!(
            nodes,
            [
                (
                    "node2",
                    vec!["192.168.0.3/24".into(), "fd00:168::3/64".into()]
                ),
                (
                    "node3",
                    vec!["192.168.0.4/24".into(), "fd00:168::4/64".into()]
                ),
            ]
        );
        assert_eq!(
            p.remote_nodes[0].address_for(ip("fd00:10::180:0:1")),
            Some("fd00:168::3/64".parse().unwrap())
        );
        // Clients never run on remote nodes.
        for flow in s.flows() {
            if let ClientPlace::Pod(a) = p.place_client(&s.node, flow.from) {
                assert_eq!(p.pods[p.pod_index(a).unwrap()].remote, None);
            }
        }
    }

    #[test]
    fn a_host_route_subnet_may_use_its_only_address() {
        let used = BTreeSet::new();
        let only: IpNet = "fd00::5/128".parse().unwrap();
        assert_eq!(first_free(only, &used).unwrap().to_string(), "fd00::5/128");
        let pair: IpNet = "fd00::4/127".parse().unwrap();
        assert_eq!(first_free(pair, &used).unwrap().to_string(), "fd00::4/127");
        let full = BTreeSet::from([ip("fd00::4"), ip("fd00::5")]);
        assert!(first_free(pair, &full).is_err());
    }

    /// The shared scenarios and this crate's own (the IPv6 and dual-stack ones).
    fn scenario_files() -> Vec<std::path::PathBuf> {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        [
            crate_dir.join("../../shared/scenarios"),
            crate_dir.join("scenarios"),
        ]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("yaml"))
        .collect()
    }

    #[test]
    fn every_scenario_places_every_client() {
        for path in scenario_files() {
            let s = Scenario::load(&path).unwrap();
            let p = Placement::plan(&s).unwrap();
            for flow in s.flows() {
                match p.place_client(&s.node, flow.from) {
                    ClientPlace::Pod(ip) => assert!(p.pod_index(ip).is_some()),
                    ClientPlace::External => assert!(p.external_clients.contains(&flow.from)),
                    ClientPlace::Node => assert!(s.node.owns(flow.from) || flow.from.is_loopback()),
                }
                if let Expectation::Backends(set) = &flow.expect {
                    for b in set {
                        let pod = p.pod_index(b.ip()).map(|i| &p.pods[i]);
                        assert!(
                            pod.is_some_and(|pod| pod.echo_ports.contains(&b.port())),
                            "{b}"
                        );
                    }
                }
            }
            let subnets = s.node.family_primaries();
            assert_eq!(p.routers.len(), subnets.len(), "{}", path.display());
            for (router, subnet) in p.routers.iter().zip(subnets) {
                assert!(subnet.contains(&router.addr()));
                assert!(!s.node.owns(router.addr()));
                assert!(router.addr() != subnet.network() || subnet.addr().is_ipv4());
            }
        }
    }
}
