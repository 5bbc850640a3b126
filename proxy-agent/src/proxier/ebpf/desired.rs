// SPDX-License-Identifier: Apache-2.0
//! What the LB maps must hold for one service, computed purely from the model: its
//! frontends (ClusterIP, NodePort, externalIPs, LB VIPs), for each the backend set of each
//! scope with upstream's endpoint choice, and the verdict flags the programs act on.

use std::net::IpAddr;

use ipnet::IpNet;
use proxy_common::{proto, svc_flags};

use crate::{
    model::{
        CategorizedEndpoints, Endpoint, FamilyState, IpFamily, LoadBalancerAlgorithm,
        NamespacedName, Protocol, ServicePort, categorize_endpoints,
    },
    proxier::NodeContext,
};

/// A frontend's identity: what a client addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    /// The unspecified address of the family for the NodePort entry.
    pub addr: IpAddr,
    pub port: u16,
    pub proto: u8,
}

/// A backend's identity (backends are shared between frontends and services).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredBackend {
    pub addr: BackendAddr,
    pub local: bool,
    pub terminating: bool,
}

/// One scope of a frontend: its flags and backends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub flags: u16,
    pub backends: Vec<DesiredBackend>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub key: FrontendKey,
    /// For clients from outside the node (tc); also for local clients unless `internal`.
    pub external: Scope,
    /// For clients on this node (socket programs) when their backend set differs.
    pub internal: Option<Scope>,
    /// sessionAffinity ClientIP timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// loadBalancerSourceRanges (with the LB IP itself added when a node IP is inside them).
    pub source_ranges: Vec<IpNet>,
    /// The service's own algorithm for flows from outside (None: the configured one).
    pub load_balancer_algorithm: Option<LoadBalancerAlgorithm>,
}

/// Everything one service needs in one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredService {
    pub frontends: Vec<DesiredFrontend>,
    /// ClusterIPs whose other ports and protocols are rejected.
    pub wildcards: Vec<IpAddr>,
    /// Traffic policy Local without a local endpoint (for the metric).
    pub no_local_internal: bool,
    pub no_local_external: bool,
}

impl DesiredService {
    /// Backend slots over all its frontends and scopes (a backend in two scopes counts
    /// twice, as it takes two slots).
    pub fn backend_slots(&self) -> usize {
        self.frontends
            .iter()
            .map(|f| {
                f.external.backends.len() + f.internal.as_ref().map_or(0, |s| s.backends.len())
            })
            .sum()
    }
}

pub fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => proto::TCP,
        Protocol::Udp => proto::UDP,
        Protocol::Sctp => proto::SCTP,
    }
}

fn unspecified(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

fn backends(endpoints: &[std::sync::Arc<Endpoint>], proto: u8) -> Vec<DesiredBackend> {
    endpoints
        .iter()
        .map(|ep| DesiredBackend {
            addr: BackendAddr {
                addr: ep.ip,
                port: ep.port,
                proto,
            },
            local: ep.is_local,
            terminating: !ep.ready,
        })
        .collect()
}

/// The scope for a backend set: no backends means DROP when the service has endpoints
/// elsewhere (a Local policy on a node without local ones), REJECT when it has none.
fn scope(flags: u16, backends: Vec<DesiredBackend>, has_any: bool) -> Scope {
    let mut flags = flags;
    if backends.is_empty() && has_any {
        flags |= svc_flags::DROP_NO_ENDPOINTS;
    }
    Scope { flags, backends }
}

/// Flags for the socket programs' view of source ranges (they see no source address for
/// an unbound socket): are the node's own addresses, and this node's pods, allowed?
fn source_range_flags(ranges: &[IpNet], family: IpFamily, node: &NodeContext) -> u16 {
    let mut flags = 0;
    let node_ips: Vec<IpAddr> = node
        .primary_ips
        .iter()
        .filter(|ip| family.contains(ip))
        .collect();
    if node_ips
        .iter()
        .any(|ip| ranges.iter().any(|r| r.contains(ip)))
    {
        flags |= svc_flags::SRC_RANGE_HOST_ALLOWED;
    }
    let pod_cidrs = node.local_detector.cidrs(family == IpFamily::V6);
    if pod_cidrs.is_empty() {
        flags |= svc_flags::SRC_RANGE_PODS_DEFER;
    } else if pod_cidrs.iter().all(|p| {
        ranges
            .iter()
            .any(|r| r.contains(&p.network()) && r.prefix_len() <= p.prefix_len())
    }) {
        flags |= svc_flags::SRC_RANGE_PODS_ALLOWED;
    } else if pod_cidrs.iter().any(|p| {
        ranges
            .iter()
            .any(|r| r.contains(&p.network()) || p.contains(&r.network()))
    }) {
        flags |= svc_flags::SRC_RANGE_PODS_DEFER;
    }
    flags
}

/// Computes the desired state of `service` in `state`'s family.
pub fn desired_service(
    service: &NamespacedName,
    state: &FamilyState,
    node: &NodeContext,
) -> DesiredService {
    let mut out = DesiredService::default();
    for (name, port) in state.services.ports_of(service) {
        let endpoints = state
            .endpoints
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let cat = categorize_endpoints(endpoints, port, &node.name, &node.labels);
        add_port_frontends(&mut out, port, &cat, state.family, node);
        if !out.wildcards.contains(&port.cluster_ip) {
            out.wildcards.push(port.cluster_ip);
        }
    }
    out
}

fn add_port_frontends(
    out: &mut DesiredService,
    port: &ServicePort,
    cat: &CategorizedEndpoints,
    family: IpFamily,
    node: &NodeContext,
) {
    let p = proto_number(port.protocol);
    let affinity_timeout = port.session_affinity.map(|a| a.timeout_seconds);
    let affinity_flag = if affinity_timeout.is_some() {
        svc_flags::AFFINITY
    } else {
        0
    };
    let cluster = backends(&cat.cluster, p);
    let local = backends(&cat.local, p);

    // ClusterIP: the internal traffic policy decides, for every client.
    let (internal_set, itp_flag) = if port.internal_policy_local {
        (local.clone(), svc_flags::ITP_LOCAL)
    } else {
        (cluster.clone(), 0)
    };
    out.no_local_internal |= port.internal_policy_local && local.is_empty();
    out.frontends.push(DesiredFrontend {
        key: FrontendKey {
            addr: port.cluster_ip,
            port: port.port,
            proto: p,
        },
        external: scope(
            svc_flags::CLUSTER_IP | itp_flag | affinity_flag,
            internal_set,
            cat.has_any_endpoints,
        ),
        internal: None,
        affinity_timeout,
        source_ranges: Vec::new(),
        load_balancer_algorithm: port.load_balancer_algorithm,
    });

    // External destinations: the external policy decides for clients from outside; clients
    // on this node (pods, the node itself) short-circuit to the cluster set, as upstream's
    // KUBE-EXT chains send pod and local traffic to the cluster chain.
    let (external_set, external_flags) = if port.external_policy_local {
        (local.clone(), svc_flags::ETP_LOCAL)
    } else {
        (cluster.clone(), svc_flags::MASQUERADE)
    };
    if port.externally_accessible() {
        out.no_local_external |= port.external_policy_local && local.is_empty();
    }
    let make = |kind: u16, addr: IpAddr, port_number: u16, ranges: Vec<IpNet>| {
        let mut flags = kind | external_flags | affinity_flag;
        if !ranges.is_empty() {
            flags |= svc_flags::SOURCE_RANGES | source_range_flags(&ranges, family, node);
        }
        let external = scope(flags, external_set.clone(), cat.has_any_endpoints);
        let internal = (external_set != cluster).then(|| {
            scope(
                flags & !(svc_flags::ETP_LOCAL | svc_flags::MASQUERADE),
                cluster.clone(),
                cat.has_any_endpoints,
            )
        });
        let mut external = external;
        if internal.is_some() {
            external.flags |= svc_flags::TWO_SCOPES;
        }
        DesiredFrontend {
            key: FrontendKey {
                addr,
                port: port_number,
                proto: p,
            },
            external,
            internal,
            affinity_timeout,
            source_ranges: ranges,
            load_balancer_algorithm: port.load_balancer_algorithm,
        }
    };
    if let Some(node_port) = port.node_port {
        out.frontends.push(make(
            svc_flags::NODE_PORT,
            unspecified(family),
            node_port,
            Vec::new(),
        ));
    }
    for ip in &port.external_ips {
        out.frontends
            .push(make(svc_flags::EXTERNAL_IP, *ip, port.port, Vec::new()));
    }
    let mut ranges = port.load_balancer_source_ranges.clone();
    let primary_allowed = node
        .primary_ips
        .iter()
        .any(|ip| family.contains(&ip) && ranges.iter().any(|r| r.contains(&ip)));
    if !ranges.is_empty() && primary_allowed {
        // The node may reach its LB IPs, and VIP-style load balancers often make the VIP a
        // local address, so the node's requests arrive with the VIP as source: upstream
        // then allows the VIPs themselves.
        ranges.extend(port.load_balancer_vips().map(IpNet::from));
    }
    for vip in port.load_balancer_vips() {
        out.frontends.push(make(
            svc_flags::LOAD_BALANCER,
            vip,
            port.port,
            ranges.clone(),
        ));
    }
}
