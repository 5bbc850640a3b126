// SPDX-License-Identifier: Apache-2.0
//! One port of one service, seen by a single-family proxier.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;

use super::Protocol;

/// How a load balancer delivers traffic for an ingress IP (`status.loadBalancer.ingress[].ipMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoadBalancerIpMode {
    /// Packets arrive with the LB IP as destination: the proxy must handle that IP.
    Vip,
    /// The load balancer proxies: packets arrive addressed to the node, so the proxy
    /// programs nothing for the IP.
    Proxy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    pub ip_mode: LoadBalancerIpMode,
}

/// ClientIP session affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionAffinity {
    pub timeout_seconds: u32,
}

impl SessionAffinity {
    /// The API server's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
    pub const DEFAULT_TIMEOUT_SECONDS: u32 = 10_800;

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(u64::from(self.timeout_seconds))
    }
}

/// How a new flow picks a service's backend, where a mode lets it choose (ebpf mode, for
/// flows from outside the node; the other modes have their own settings and ignore it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadBalancerAlgorithm {
    /// Uniformly at random.
    #[default]
    Random,
    /// Maglev consistent hashing of the flow's 5-tuple: every node picks the same backend
    /// for the same flow, and a change of backends moves few flows.
    Maglev,
}

impl LoadBalancerAlgorithm {
    /// The configuration's and the annotation's spelling.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "random" => Some(Self::Random),
            "maglev" => Some(Self::Maglev),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Maglev => "maglev",
        }
    }

    pub const NAMES: &[&str] = &["random", "maglev"];
}

/// One service port for one IP family: a dual-stack service yields one `ServicePort` per
/// family, each tracked by that family's tracker. Every address here is of that family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServicePort {
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// Every ingress IP of this family with its mode. Only the VIP-mode ones are
    /// programmed (see [`ServicePort::load_balancer_vips`]); Proxy-mode entries are kept so
    /// a change of mode is a change of the service.
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    /// Whitespace-trimmed, masked to their prefix, this family only.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// externalTrafficPolicy is Local and the service is of a type that accepts external
    /// traffic (NodePort, LoadBalancer, or ClusterIP with external IPs).
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    /// Set only for LoadBalancer services with externalTrafficPolicy Local.
    pub health_check_node_port: Option<u16>,
    pub session_affinity: Option<SessionAffinity>,
    /// The service's own load-balancing algorithm (its annotation); `None` follows the
    /// configuration.
    pub load_balancer_algorithm: Option<LoadBalancerAlgorithm>,
}

impl ServicePort {
    /// A port reachable on its ClusterIP only: no NodePort, external or LB addresses,
    /// Cluster traffic policies, no affinity (what the others are built from).
    pub fn cluster_ip_only(cluster_ip: IpAddr, port: u16, protocol: Protocol) -> Self {
        ServicePort {
            cluster_ip,
            port,
            protocol,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ingress: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            session_affinity: None,
            load_balancer_algorithm: None,
        }
    }

    /// The ingress IPs the proxy handles: those whose mode is VIP (an absent `ipMode`
    /// means VIP).
    pub fn load_balancer_vips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.load_balancer_ingress
            .iter()
            .filter(|ingress| ingress.ip_mode == LoadBalancerIpMode::Vip)
            .map(|ingress| ingress.ip)
    }

    /// Reachable through something other than its ClusterIP (NodePort, external IP, LB VIP).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || self.load_balancer_vips().next().is_some()
    }

    /// Ever sends traffic to endpoints chosen by the "Cluster" policy: internal traffic
    /// under iTP=Cluster, and any external traffic (eTP=Local still short-circuits
    /// traffic from pods to all endpoints).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Ever sends traffic to endpoints chosen by the "Local" policy.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }

    pub fn cluster_addr(&self) -> SocketAddr {
        SocketAddr::new(self.cluster_ip, self.port)
    }
}

/// "clusterIP:port/PROTO" (brackets around IPv6 addresses).
impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.cluster_addr(), self.protocol)
    }
}
