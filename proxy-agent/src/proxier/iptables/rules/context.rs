// SPDX-License-Identifier: Apache-2.0
//! The per-family settings rule generation needs, derived once per sync from the shared
//! [`NodeContext`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::IpFamily;
use crate::node::LocalDetector;
use crate::proxier::NodeContext;

/// Host facts that shape the rules but are not part of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleOptions {
    /// iptables supports `MASQUERADE --random-fully` (1.6.2 and later).
    pub random_fully: bool,
    /// net.netfilter.nf_conntrack_tcp_be_liberal is set: INVALID packets are not dropped.
    pub conntrack_tcp_be_liberal: bool,
}

impl Default for RuleOptions {
    fn default() -> Self {
        Self {
            random_fully: true,
            conntrack_tcp_be_liberal: false,
        }
    }
}

/// How this family tells traffic from local pods from the rest (detectLocalMode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalMatch {
    /// No detector for this family.
    None,
    Source(IpNet),
    /// An interface name, `+`-terminated for a prefix.
    Interface(String),
}

impl LocalMatch {
    pub fn of(detector: &LocalDetector, family: IpFamily) -> Self {
        match detector {
            LocalDetector::None => LocalMatch::None,
            // Like upstream, one CIDR per family: iptables cannot negate a list.
            LocalDetector::Cidrs(_) => detector
                .cidrs(family == IpFamily::V6)
                .first()
                .map_or(LocalMatch::None, |cidr| LocalMatch::Source(*cidr)),
            LocalDetector::BridgeInterface(name) => LocalMatch::Interface(name.clone()),
            LocalDetector::InterfaceNamePrefix(prefix) => {
                LocalMatch::Interface(format!("{prefix}+"))
            }
        }
    }

    pub fn is_implemented(&self) -> bool {
        !matches!(self, LocalMatch::None)
    }

    /// Matches local traffic (" -s 10.0.0.0/8").
    pub fn if_local(&self) -> Matcher<'_> {
        Matcher {
            local: self,
            negate: false,
        }
    }

    /// Matches non-local traffic (" ! -s 10.0.0.0/8").
    pub fn if_not_local(&self) -> Matcher<'_> {
        Matcher {
            local: self,
            negate: true,
        }
    }
}

/// The match arguments of a [`LocalMatch`], with a leading space (empty for none).
pub struct Matcher<'a> {
    local: &'a LocalMatch,
    negate: bool,
}

impl fmt::Display for Matcher<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let not = if self.negate { " !" } else { "" };
        match self.local {
            LocalMatch::None => Ok(()),
            LocalMatch::Source(cidr) => write!(f, "{not} -s {cidr}"),
            LocalMatch::Interface(name) => write!(f, "{not} -i {name}"),
        }
    }
}

/// Everything generation needs besides the model, for one family.
#[derive(Clone, Debug)]
pub struct FamilyContext<'a> {
    pub family: IpFamily,
    pub node_name: &'a str,
    pub node_labels: &'a BTreeMap<String, String>,
    /// This node's primary IP of the family (loadBalancerSourceRanges that contain it also
    /// admit the LB IPs as sources).
    pub node_ip: Option<IpAddr>,
    pub local: LocalMatch,
    pub masquerade_all: bool,
    /// The masquerade mark, as upstream writes it ("0x4000").
    pub mark: String,
    /// Localhost NodePorts are in effect: IPv4, enabled, and loopback among the NodePort
    /// addresses.
    pub localhost_nodeports: bool,
    /// `None`: every local address.
    pub nodeport_addresses: Option<Vec<IpAddr>>,
    pub options: RuleOptions,
}

impl<'a> FamilyContext<'a> {
    pub fn new(node: &'a NodeContext, family: IpFamily, options: RuleOptions) -> Self {
        let nodeport_addresses = node.nodeport_addresses_of(family);
        Self {
            family,
            node_name: &node.name,
            node_labels: &node.labels,
            node_ip: node.primary_ips.iter().find(|ip| family.contains(ip)),
            local: LocalMatch::of(&node.local_detector, family),
            masquerade_all: node.masquerade_all,
            mark: masquerade_mark(node.masquerade_bit),
            localhost_nodeports: localhost_nodeports_in_effect(node, family),
            nodeport_addresses,
            options,
        }
    }
}

/// The mark value of masquerade bit `bit` (bits above 31 are clamped to 31).
pub fn masquerade_mark(bit: u32) -> String {
    format!("{:#x}", 1u32 << bit.min(31))
}

/// Upstream turns localhost NodePorts off when the NodePort addresses exclude loopback, and
/// never has them on IPv6.
pub fn localhost_nodeports_in_effect(node: &NodeContext, family: IpFamily) -> bool {
    family == IpFamily::V4
        && node.localhost_nodeports
        && node.nodeport_addresses_of(family).is_none_or(|addrs| {
            addrs
                .iter()
                .any(|ip| matches!(ip, IpAddr::V4(v4) if v4.is_loopback()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_matchers() {
        let cidr = LocalMatch::Source("10.0.0.0/8".parse().unwrap());
        assert_eq!(cidr.if_local().to_string(), " -s 10.0.0.0/8");
        assert_eq!(cidr.if_not_local().to_string(), " ! -s 10.0.0.0/8");
        let prefix = LocalMatch::of(
            &LocalDetector::InterfaceNamePrefix("veth".into()),
            IpFamily::V4,
        );
        assert_eq!(prefix.if_not_local().to_string(), " ! -i veth+");
        let bridge = LocalMatch::of(&LocalDetector::BridgeInterface("cbr0".into()), IpFamily::V6);
        assert_eq!(bridge.if_local().to_string(), " -i cbr0");
        let v4_only = LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(LocalMatch::of(&v4_only, IpFamily::V6), LocalMatch::None);
        assert_eq!(LocalMatch::None.if_local().to_string(), "");
    }

    #[test]
    fn marks_and_localhost_nodeports() {
        assert_eq!(masquerade_mark(14), "0x4000");
        assert_eq!(masquerade_mark(0), "0x1");
        let mut node = NodeContext {
            localhost_nodeports: true,
            ..Default::default()
        };
        assert!(localhost_nodeports_in_effect(&node, IpFamily::V4));
        assert!(!localhost_nodeports_in_effect(&node, IpFamily::V6));
        node.nodeport_addresses = Some(vec!["192.168.0.2".parse().unwrap()]);
        assert!(!localhost_nodeports_in_effect(&node, IpFamily::V4));
        node.nodeport_addresses = Some(vec!["127.0.0.1".parse().unwrap()]);
        assert!(localhost_nodeports_in_effect(&node, IpFamily::V4));
    }
}
