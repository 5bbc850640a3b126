// SPDX-License-Identifier: Apache-2.0
//! The desired state of one IP family, from the model alone (pure): the IPVS virtual
//! servers and their real servers, the ipset members, the addresses kube-ipvs0 holds, and
//! the few per-service filter rules. The iptables rules that use the sets are in
//! [`super::rules`].
//!
//! Endpoint selection is the model's (`categorize_endpoints`, as the iptables proxier
//! uses it). One virtual server serves both internal and external traffic of an address,
//! so where the policies differ this follows upstream's IPVS proxier: a ClusterIP uses the
//! internal policy's endpoints, every external address (externalIPs, load-balancer IPs,
//! NodePorts) the external policy's. Where upstream sends traffic of a Local policy
//! without local endpoints elsewhere, this mode follows the Service API instead (as the
//! shared scenarios require): the traffic is dropped by a filter rule, and the virtual
//! server of an external address keeps the cluster endpoints so that pods and the node
//! itself, which the API exempts from the external policy, still reach the service.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::sets::{SetEntry, SetKind};
use crate::model::{Endpoint, NamespacedName, Protocol, ServicePortName, categorize_endpoints};
use crate::proxier::{FamilyState, NodeContext};

/// The scheduler when none is configured.
pub const DEFAULT_SCHEDULER: &str = "rr";

/// What identifies a virtual server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub addr: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

/// "TCP 10.96.0.10:80", as ipvsadm lists it.
impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            self.protocol.as_str(),
            std::net::SocketAddr::new(self.addr, self.port)
        )
    }
}

/// A virtual server's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub key: ServiceKey,
    pub scheduler: String,
    /// ClientIP affinity: the persistence timeout in seconds.
    pub persistence_timeout: Option<u32>,
}

/// A real server of a virtual server (masquerading, weight 1 unless draining).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealServer {
    pub addr: IpAddr,
    pub port: u16,
}

impl fmt::Display for RealServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::net::SocketAddr::new(self.addr, self.port).fmt(f)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub server: VirtualServer,
    pub real_servers: BTreeSet<RealServer>,
    pub owner: ServicePortName,
}

/// Where a drop rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DropTarget {
    /// A service address.
    Address(IpAddr),
    /// A NodePort on any local address.
    NodePort,
}

/// Traffic a Local policy without local endpoints refuses to carry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DropRule {
    pub owner: ServicePortName,
    pub target: DropTarget,
    pub protocol: Protocol,
    pub port: u16,
    /// Only traffic from outside (external policy): pods and the node are exempt.
    pub external_only: bool,
}

/// Everything one family should have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilyDesired {
    pub services: BTreeMap<ServiceKey, DesiredService>,
    /// Every set of the family, empty ones included.
    pub sets: BTreeMap<SetKind, BTreeSet<SetEntry>>,
    /// The addresses kube-ipvs0 holds.
    pub addresses: BTreeSet<IpAddr>,
    pub drops: Vec<DropRule>,
    /// Load-balancer addresses with source ranges that exclude this node: the node may
    /// not reach them through IPVS either.
    pub lb_no_node_access: Vec<ServiceKey>,
    /// The virtual servers of each service, for partial syncs.
    pub keys_by_service: BTreeMap<NamespacedName, BTreeSet<ServiceKey>>,
    /// Services whose traffic policy is Local and that have no local endpoint.
    pub no_local_endpoints_internal: usize,
    pub no_local_endpoints_external: usize,
}

impl FamilyDesired {
    fn add_set(&mut self, kind: SetKind, entry: SetEntry) {
        self.sets.entry(kind).or_default().insert(entry);
    }

    fn add_service(
        &mut self,
        owner: &ServicePortName,
        key: ServiceKey,
        settings: &Settings,
        real_servers: &[Arc<Endpoint>],
    ) {
        if let Some(existing) = self.services.get(&key) {
            tracing::warn!(address = %key, first = %existing.owner, second = %owner, "two services claim one virtual server; keeping the first");
            return;
        }
        self.keys_by_service
            .entry(owner.service.clone())
            .or_default()
            .insert(key);
        self.services.insert(
            key,
            DesiredService {
                server: VirtualServer {
                    key,
                    scheduler: settings.scheduler.to_string(),
                    persistence_timeout: settings.persistence_timeout,
                },
                real_servers: real_servers
                    .iter()
                    .map(|ep| RealServer {
                        addr: ep.ip,
                        port: ep.port,
                    })
                    .collect(),
                owner: owner.clone(),
            },
        );
    }
}

struct Settings<'a> {
    scheduler: &'a str,
    persistence_timeout: Option<u32>,
}

/// The desired state of `state`'s family. `scheduler` is ipvs.scheduler (empty: rr).
pub fn build(state: &FamilyState, node: &NodeContext, scheduler: &str) -> FamilyDesired {
    let family = state.family;
    let scheduler = if scheduler.is_empty() {
        DEFAULT_SCHEDULER
    } else {
        scheduler
    };
    let mut desired = FamilyDesired {
        sets: SetKind::ALL
            .into_iter()
            .map(|k| (k, BTreeSet::new()))
            .collect(),
        ..Default::default()
    };
    let mut ports: Vec<_> = state.services.iter().collect();
    ports.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let node_ips = nodeport_ips(state, node);
    let node_ip = node.primary_ips.iter().find(|ip| family.contains(ip));

    for (name, svc) in ports {
        let endpoints = state.endpoints.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let sets = categorize_endpoints(endpoints, svc, &node.name, &node.labels);
        let settings = Settings {
            scheduler,
            persistence_timeout: svc.session_affinity.map(|a| a.timeout_seconds),
        };
        let internal = if svc.internal_policy_local {
            &sets.local
        } else {
            &sets.cluster
        };
        let external_drops =
            sets.has_any_endpoints && svc.external_policy_local && sets.local.is_empty();
        let external = if svc.external_policy_local && !sets.local.is_empty() {
            &sets.local
        } else {
            &sets.cluster
        };
        let internal_drops =
            sets.has_any_endpoints && svc.internal_policy_local && sets.local.is_empty();
        desired.no_local_endpoints_internal += usize::from(internal_drops);
        desired.no_local_endpoints_external +=
            usize::from(external_drops && svc.externally_accessible());
        let p = svc.protocol;

        // ClusterIP.
        let key = ServiceKey {
            addr: svc.cluster_ip,
            protocol: p,
            port: svc.port,
        };
        desired.add_service(name, key, &settings, internal);
        desired.addresses.insert(svc.cluster_ip);
        desired.add_set(SetKind::IpvsIps, SetEntry::Ip(svc.cluster_ip));
        desired.add_set(
            SetKind::ClusterIp,
            SetEntry::IpPort(svc.cluster_ip, p, svc.port),
        );
        if internal_drops {
            desired.drops.push(DropRule {
                owner: name.clone(),
                target: DropTarget::Address(svc.cluster_ip),
                protocol: p,
                port: svc.port,
                external_only: false,
            });
        }

        // Hairpin: an endpoint reaching itself through the service is masqueraded.
        for ep in internal.iter().chain(external.iter()) {
            desired.add_set(
                SetKind::LoopBack,
                SetEntry::IpPortIp(ep.ip, p, ep.port, ep.ip),
            );
        }

        let mut external_addresses = Vec::new();
        for &ip in &svc.external_ips {
            let key = ServiceKey {
                addr: ip,
                protocol: p,
                port: svc.port,
            };
            desired.add_service(name, key, &settings, external);
            let kind = if svc.external_policy_local {
                SetKind::ExternalIpLocal
            } else {
                SetKind::ExternalIp
            };
            desired.add_set(kind, SetEntry::IpPort(ip, p, svc.port));
            if !node.is_node_address(&ip) {
                desired.addresses.insert(ip);
                desired.add_set(SetKind::IpvsIps, SetEntry::Ip(ip));
            }
            external_addresses.push(ip);
        }

        for ip in svc.load_balancer_vips() {
            let key = ServiceKey {
                addr: ip,
                protocol: p,
                port: svc.port,
            };
            desired.add_service(name, key, &settings, external);
            desired.addresses.insert(ip);
            desired.add_set(SetKind::IpvsIps, SetEntry::Ip(ip));
            let entry = SetEntry::IpPort(ip, p, svc.port);
            desired.add_set(SetKind::LoadBalancer, entry);
            if svc.external_policy_local {
                desired.add_set(SetKind::LoadBalancerLocal, entry);
            }
            if !svc.load_balancer_source_ranges.is_empty() {
                desired.add_set(SetKind::LoadBalancerFw, entry);
                let mut from_node = false;
                for cidr in &svc.load_balancer_source_ranges {
                    desired.add_set(
                        SetKind::LoadBalancerSourceCidr,
                        SetEntry::IpPortNet(ip, p, svc.port, *cidr),
                    );
                    from_node |= node_ip.is_some_and(|n| cidr.contains(&n));
                }
                if from_node {
                    // The node reaches an LB IP it holds with that IP as the source.
                    desired.add_set(
                        SetKind::LoadBalancerSourceIp,
                        SetEntry::IpPortIp(ip, p, svc.port, ip),
                    );
                } else {
                    desired.lb_no_node_access.push(key);
                }
            }
            external_addresses.push(ip);
        }

        if let Some(node_port) = svc.node_port {
            for &ip in &node_ips {
                let key = ServiceKey {
                    addr: ip,
                    protocol: p,
                    port: node_port,
                };
                desired.add_service(name, key, &settings, external);
            }
            let local = svc.external_policy_local;
            match p {
                Protocol::Tcp | Protocol::Udp => {
                    let (all, local_kind) = if p == Protocol::Tcp {
                        (SetKind::NodePortTcp, SetKind::NodePortLocalTcp)
                    } else {
                        (SetKind::NodePortUdp, SetKind::NodePortLocalUdp)
                    };
                    desired.add_set(all, SetEntry::Port(node_port));
                    if local {
                        desired.add_set(local_kind, SetEntry::Port(node_port));
                    }
                }
                Protocol::Sctp => {
                    for &ip in &node_ips {
                        let entry = SetEntry::IpPort(ip, p, node_port);
                        desired.add_set(SetKind::NodePortSctp, entry);
                        if local {
                            desired.add_set(SetKind::NodePortLocalSctp, entry);
                        }
                    }
                }
            }
            if external_drops {
                desired.drops.push(DropRule {
                    owner: name.clone(),
                    target: DropTarget::NodePort,
                    protocol: p,
                    port: node_port,
                    external_only: true,
                });
            }
        }
        if external_drops {
            for ip in external_addresses {
                desired.drops.push(DropRule {
                    owner: name.clone(),
                    target: DropTarget::Address(ip),
                    protocol: p,
                    port: svc.port,
                    external_only: true,
                });
            }
        }

        if let Some(hc) = svc.health_check_node_port {
            desired.add_set(SetKind::HealthCheckNodePort, SetEntry::Port(hc));
        }
    }
    desired
}

/// The addresses NodePorts are served on: nodePortAddresses, or every address of the
/// family on the node except loopback and IPv6 link-local ones, as upstream's IPVS proxier
/// picks them (an IPv4 link-local address is a valid ipset entry and gets NodePorts; the
/// node's addresses never include kube-ipvs0's, see [`crate::node::host_addresses`]).
pub fn nodeport_ips(state: &FamilyState, node: &NodeContext) -> Vec<IpAddr> {
    let family = state.family;
    let mut ips: Vec<IpAddr> = match node.nodeport_addresses_of(family) {
        Some(addresses) => addresses,
        None => node
            .host_addresses
            .iter()
            .filter(|ip| family.contains(ip) && !is_ipv6_link_local(ip))
            .copied()
            .collect(),
    };
    // NodePorts on loopback would need route_localnet, which the ipvs mode never sets.
    ips.retain(|ip| !ip.is_loopback());
    ips.sort();
    ips.dedup();
    ips
}

fn is_ipv6_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => false,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}
