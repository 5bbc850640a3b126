// SPDX-License-Identifier: Apache-2.0
//! The node's IPs: the primary IP per family (upstream's nodeIPs, from --bind-address or
//! the Node object's status, else loopback) and every address on the host's interfaces (for
//! nodePortAddresses and for "is this destination the node").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::core::v1::Node;
use tracing::warn;

/// Primary node IPs, at most one per family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddresses {
    pub v4: Option<IpAddr>,
    pub v6: Option<IpAddr>,
}

impl NodeAddresses {
    pub fn for_family(&self, v6: bool) -> Option<IpAddr> {
        if v6 { self.v6 } else { self.v4 }
    }

    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.v4.iter().chain(self.v6.iter()).copied()
    }
}

/// The Node object's addresses in upstream's order of preference: InternalIP, then
/// ExternalIP, one per family, the first of each family winning.
pub fn node_ips_from_node(node: &Node) -> Vec<IpAddr> {
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out: Vec<IpAddr> = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        for a in addresses.iter().filter(|a| a.type_ == wanted) {
            if let Ok(ip) = a.address.trim().parse::<IpAddr>()
                && !out.iter().any(|o| o.is_ipv4() == ip.is_ipv4())
            {
                out.push(ip);
            }
        }
    }
    out
}

/// Upstream's detection: the Node's IPs, with `--bind-address` (when set to a specific
/// address) overriding its family; loopback when nothing is known, with a warning.
pub fn primary_node_ips(bind_address: Option<IpAddr>, node_ips: &[IpAddr]) -> NodeAddresses {
    let mut out = NodeAddresses::default();
    for ip in node_ips {
        match ip {
            IpAddr::V4(_) if out.v4.is_none() => out.v4 = Some(*ip),
            IpAddr::V6(_) if out.v6.is_none() => out.v6 = Some(*ip),
            _ => {}
        }
    }
    if let Some(bind) = bind_address.filter(|b| !b.is_unspecified()) {
        match bind {
            IpAddr::V4(_) => out.v4 = Some(bind),
            IpAddr::V6(_) => out.v6 = Some(bind),
        }
    }
    if out.v4.is_none() && out.v6.is_none() {
        warn!(
            "can't determine this node's IP, assuming loopback; if this is incorrect, set --bind-address"
        );
        let v6 = bind_address.is_some_and(|b| b.is_ipv6());
        if v6 {
            out.v6 = Some(IpAddr::V6(Ipv6Addr::LOCALHOST));
        } else {
            out.v4 = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
    }
    out
}

/// The ipvs mode's dummy interface, which holds service addresses, not the node's.
pub const IPVS_DUMMY_DEVICE: &str = "kube-ipvs0";

/// Every address configured on the host's interfaces, in the agent's network namespace
/// (`getifaddrs`).
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            // The ipvs mode's dummy interface holds service addresses, not the node's.
            if ifa.interface_name == IPVS_DUMMY_DEVICE {
                continue;
            }
            let Some(addr) = ifa.address else { continue };
            if let Some(sin) = addr.as_sockaddr_in() {
                out.push(IpAddr::V4(sin.ip()));
            } else if let Some(sin6) = addr.as_sockaddr_in6() {
                out.push(IpAddr::V6(sin6.ip()));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    use super::*;

    fn node(addrs: &[(&str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                addresses: Some(
                    addrs
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: (*t).into(),
                            address: (*a).into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn internal_ips_win_over_external_one_per_family() {
        let n = node(&[
            ("Hostname", "node-a"),
            ("ExternalIP", "203.0.113.9"),
            ("InternalIP", "192.168.0.2"),
            ("InternalIP", "192.168.1.2"),
            ("InternalIP", "fd00::2"),
        ]);
        let ips = node_ips_from_node(&n);
        assert_eq!(
            ips,
            vec![
                "192.168.0.2".parse::<IpAddr>().unwrap(),
                "fd00::2".parse().unwrap()
            ]
        );
    }

    #[test]
    fn bind_address_overrides_its_family_and_unspecified_is_ignored() {
        let ips: Vec<IpAddr> = vec!["192.168.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let out = primary_node_ips(Some("10.1.1.1".parse().unwrap()), &ips);
        assert_eq!(out.v4, Some("10.1.1.1".parse().unwrap()));
        assert_eq!(out.v6, Some("fd00::2".parse().unwrap()));
        let out = primary_node_ips(Some("0.0.0.0".parse().unwrap()), &ips);
        assert_eq!(out.v4, Some("192.168.0.2".parse().unwrap()));
    }

    #[test]
    fn nothing_known_means_loopback_of_the_bind_family() {
        assert_eq!(
            primary_node_ips(None, &[]),
            NodeAddresses {
                v4: Some("127.0.0.1".parse().unwrap()),
                v6: None
            }
        );
        assert_eq!(
            primary_node_ips(Some("::".parse().unwrap()), &[]).v6,
            Some("::1".parse().unwrap())
        );
    }

    #[test]
    fn host_addresses_include_loopback() {
        let addrs = host_addresses();
        assert!(addrs.iter().any(|a| a.is_loopback()), "{addrs:?}");
    }
}
