// SPDX-License-Identifier: Apache-2.0
//! The ipsets of the ipvs mode: upstream's names, types and purposes, and their entries
//! as typed values. The text form of an entry is the one `ipset save` prints, so desired
//! and actual entries compare as strings.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{IpFamily, Protocol};
use crate::proxier::netfilter::names::protocol_lower;

/// How a set's members are typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetType {
    HashIp,
    HashIpPort,
    HashIpPortIp,
    HashIpPortNet,
    BitmapPort,
}

impl SetType {
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

/// Every set this mode uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    LoopBack,
    ClusterIp,
    ExternalIp,
    ExternalIpLocal,
    LoadBalancer,
    LoadBalancerLocal,
    LoadBalancerFw,
    LoadBalancerSourceIp,
    LoadBalancerSourceCidr,
    NodePortTcp,
    NodePortLocalTcp,
    NodePortUdp,
    NodePortLocalUdp,
    NodePortSctp,
    NodePortLocalSctp,
    HealthCheckNodePort,
    IpvsIps,
}

impl SetKind {
    pub const ALL: [SetKind; 17] = [
        SetKind::LoopBack,
        SetKind::ClusterIp,
        SetKind::ExternalIp,
        SetKind::ExternalIpLocal,
        SetKind::LoadBalancer,
        SetKind::LoadBalancerLocal,
        SetKind::LoadBalancerFw,
        SetKind::LoadBalancerSourceIp,
        SetKind::LoadBalancerSourceCidr,
        SetKind::NodePortTcp,
        SetKind::NodePortLocalTcp,
        SetKind::NodePortUdp,
        SetKind::NodePortLocalUdp,
        SetKind::NodePortSctp,
        SetKind::NodePortLocalSctp,
        SetKind::HealthCheckNodePort,
        SetKind::IpvsIps,
    ];

    /// The IPv4 name (upstream's).
    pub fn base_name(self) -> &'static str {
        match self {
            SetKind::LoopBack => "KUBE-LOOP-BACK",
            SetKind::ClusterIp => "KUBE-CLUSTER-IP",
            SetKind::ExternalIp => "KUBE-EXTERNAL-IP",
            SetKind::ExternalIpLocal => "KUBE-EXTERNAL-IP-LOCAL",
            SetKind::LoadBalancer => "KUBE-LOAD-BALANCER",
            SetKind::LoadBalancerLocal => "KUBE-LOAD-BALANCER-LOCAL",
            SetKind::LoadBalancerFw => "KUBE-LOAD-BALANCER-FW",
            SetKind::LoadBalancerSourceIp => "KUBE-LOAD-BALANCER-SOURCE-IP",
            SetKind::LoadBalancerSourceCidr => "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            SetKind::NodePortTcp => "KUBE-NODE-PORT-TCP",
            SetKind::NodePortLocalTcp => "KUBE-NODE-PORT-LOCAL-TCP",
            SetKind::NodePortUdp => "KUBE-NODE-PORT-UDP",
            SetKind::NodePortLocalUdp => "KUBE-NODE-PORT-LOCAL-UDP",
            SetKind::NodePortSctp => "KUBE-NODE-PORT-SCTP-HASH",
            SetKind::NodePortLocalSctp => "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            SetKind::HealthCheckNodePort => "KUBE-HEALTH-CHECK-NODE-PORT",
            SetKind::IpvsIps => "KUBE-IPVS-IPS",
        }
    }

    /// The set's name in `family`: IPv6 sets are "KUBE-6-...", cut to ipset's 31
    /// characters, so both families' sets coexist.
    pub fn name(self, family: IpFamily) -> String {
        let base = self.base_name();
        match family {
            IpFamily::V4 => base.to_string(),
            IpFamily::V6 => {
                let mut name = base.replacen("KUBE-", "KUBE-6-", 1);
                name.truncate(31);
                name
            }
        }
    }

    pub fn set_type(self) -> SetType {
        match self {
            SetKind::LoopBack | SetKind::LoadBalancerSourceIp => SetType::HashIpPortIp,
            SetKind::LoadBalancerSourceCidr => SetType::HashIpPortNet,
            SetKind::NodePortTcp
            | SetKind::NodePortLocalTcp
            | SetKind::NodePortUdp
            | SetKind::NodePortLocalUdp
            | SetKind::HealthCheckNodePort => SetType::BitmapPort,
            SetKind::IpvsIps => SetType::HashIp,
            _ => SetType::HashIpPort,
        }
    }

    /// What the set is for (upstream's comments, used in the rules that match it).
    pub fn comment(self) -> &'static str {
        match self {
            SetKind::LoopBack => {
                "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"
            }
            SetKind::ClusterIp => "Kubernetes service cluster ip + port for masquerade purpose",
            SetKind::ExternalIp => {
                "Kubernetes service external ip + port for masquerade and filter purpose"
            }
            SetKind::ExternalIpLocal => {
                "Kubernetes service external ip + port with externalTrafficPolicy=local"
            }
            SetKind::LoadBalancer => "Kubernetes service lb portal",
            SetKind::LoadBalancerLocal => {
                "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
            }
            SetKind::LoadBalancerFw => {
                "Kubernetes service load balancer ip + port for load balancer with sourceRange"
            }
            SetKind::LoadBalancerSourceIp => {
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
            }
            SetKind::LoadBalancerSourceCidr => {
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
            }
            SetKind::NodePortTcp => "Kubernetes nodeport TCP port for masquerade purpose",
            SetKind::NodePortLocalTcp => {
                "Kubernetes nodeport TCP port with externalTrafficPolicy=local"
            }
            SetKind::NodePortUdp => "Kubernetes nodeport UDP port for masquerade purpose",
            SetKind::NodePortLocalUdp => {
                "Kubernetes nodeport UDP port with externalTrafficPolicy=local"
            }
            SetKind::NodePortSctp => {
                "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"
            }
            SetKind::NodePortLocalSctp => {
                "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"
            }
            SetKind::HealthCheckNodePort => "Kubernetes health check node port",
            SetKind::IpvsIps => "Kubernetes service IP list",
        }
    }

    /// The `--match-set` direction flags of rules that match this set.
    pub fn match_flags(self) -> &'static str {
        match self.set_type() {
            SetType::BitmapPort | SetType::HashIp => "dst",
            SetType::HashIpPort => "dst,dst",
            SetType::HashIpPortIp | SetType::HashIpPortNet => "dst,dst,src",
        }
    }

    /// The `create` arguments after name and type (family and sizes for hash sets,
    /// the port range for bitmaps).
    pub fn create_options(self, family: IpFamily) -> &'static str {
        match (self.set_type(), family) {
            (SetType::BitmapPort, _) => "range 0-65535",
            (_, IpFamily::V4) => "family inet hashsize 1024 maxelem 65536",
            (_, IpFamily::V6) => "family inet6 hashsize 1024 maxelem 65536",
        }
    }

    /// The kind named `name` in `family`, if it is one of ours.
    pub fn from_name(name: &str, family: IpFamily) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name(family) == name)
    }
}

/// One member of a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetEntry {
    Ip(IpAddr),
    IpPort(IpAddr, Protocol, u16),
    IpPortIp(IpAddr, Protocol, u16, IpAddr),
    IpPortNet(IpAddr, Protocol, u16, IpNet),
    Port(u16),
}

/// `ipset save`'s spelling: "10.0.0.1,tcp:80", "fd00::1,udp:53,fd00::2",
/// "1.2.3.4,tcp:80,203.0.113.0/25" (a host-length net without its prefix), "30001".
impl fmt::Display for SetEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetEntry::Ip(ip) => write!(f, "{ip}"),
            SetEntry::IpPort(ip, p, port) => write!(f, "{ip},{}:{port}", protocol_lower(*p)),
            SetEntry::IpPortIp(ip, p, port, ip2) => {
                write!(f, "{ip},{}:{port},{ip2}", protocol_lower(*p))
            }
            SetEntry::IpPortNet(ip, p, port, net) => {
                write!(f, "{ip},{}:{port},", protocol_lower(*p))?;
                if net.prefix_len() == net.max_prefix_len() {
                    write!(f, "{}", net.addr())
                } else {
                    write!(f, "{net}")
                }
            }
            SetEntry::Port(port) => write!(f, "{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_types_and_spellings() {
        assert_eq!(SetKind::ClusterIp.name(IpFamily::V4), "KUBE-CLUSTER-IP");
        assert_eq!(SetKind::ClusterIp.name(IpFamily::V6), "KUBE-6-CLUSTER-IP");
        let long = SetKind::NodePortLocalSctp.name(IpFamily::V6);
        assert_eq!(long, "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS");
        assert_eq!(long.len(), 31);
        assert_eq!(
            SetKind::from_name("KUBE-6-LOOP-BACK", IpFamily::V6),
            Some(SetKind::LoopBack)
        );
        assert_eq!(SetKind::from_name("KUBE-LOOP-BACK", IpFamily::V6), None);
        assert_eq!(SetKind::NodePortTcp.set_type().as_str(), "bitmap:port");
        assert_eq!(SetKind::LoadBalancerSourceCidr.match_flags(), "dst,dst,src");
        let ip: IpAddr = "1.2.3.4".parse().unwrap();
        assert_eq!(
            SetEntry::IpPort(ip, Protocol::Sctp, 80).to_string(),
            "1.2.3.4,sctp:80"
        );
        assert_eq!(
            SetEntry::IpPortNet(ip, Protocol::Tcp, 80, "203.0.113.0/25".parse().unwrap())
                .to_string(),
            "1.2.3.4,tcp:80,203.0.113.0/25"
        );
        assert_eq!(
            SetEntry::IpPortNet(ip, Protocol::Tcp, 80, "203.0.113.7/32".parse().unwrap())
                .to_string(),
            "1.2.3.4,tcp:80,203.0.113.7"
        );
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            SetEntry::IpPortIp(v6, Protocol::Udp, 53, v6).to_string(),
            "fd00::1,udp:53,fd00::1"
        );
    }
}
