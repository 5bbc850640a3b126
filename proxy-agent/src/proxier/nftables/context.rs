// SPDX-License-Identifier: Apache-2.0
//! The per-family settings the ruleset depends on besides the model, derived once per
//! sync from the shared [`NodeContext`] and the family's ServiceCIDRs.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::IpFamily;
use crate::proxier::NodeContext;
use crate::proxier::netfilter::matches::{LocalMatch, masquerade_mark};

/// Everything generation needs besides the model, for one family.
#[derive(Clone, Debug)]
pub struct NftContext<'a> {
    pub family: IpFamily,
    pub node_name: &'a str,
    pub node_labels: &'a BTreeMap<String, String>,
    /// This node's primary IP of the family (loadBalancerSourceRanges that contain it also
    /// admit the LB IPs as sources).
    pub node_ip: Option<IpAddr>,
    pub local: LocalMatch,
    pub masquerade_all: bool,
    /// The masquerade mark ("0x4000").
    pub mark: String,
    /// `None`: every local address except loopback.
    pub nodeport_addresses: Option<Vec<IpAddr>>,
    /// ServiceCIDRs of the family: traffic to addresses inside them that no Service holds
    /// is dropped.
    pub service_cidrs: Vec<IpNet>,
}

impl<'a> NftContext<'a> {
    pub fn new(node: &'a NodeContext, family: IpFamily, service_cidrs: &[IpNet]) -> Self {
        Self {
            family,
            node_name: &node.name,
            node_labels: &node.labels,
            node_ip: node.primary_ips.iter().find(|ip| family.contains(ip)),
            local: LocalMatch::of(&node.local_detector, family),
            masquerade_all: node.masquerade_all,
            mark: masquerade_mark(node.masquerade_bit),
            nodeport_addresses: node.nodeport_addresses_of(family),
            service_cidrs: service_cidrs
                .iter()
                .filter(|net| IpFamily::of_net(net) == family)
                .copied()
                .collect(),
        }
    }

    /// "ip" or "ip6": the table family and the address payload's protocol.
    pub fn ip(&self) -> &'static str {
        super::transport::family_keyword(self.family)
    }

    /// The address type of set keys.
    pub fn addr_type(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        }
    }

    /// The loopback destinations NodePorts are never served on.
    pub fn loopback(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1",
        }
    }

    /// Matches traffic from this node's pods (empty when there is no detector).
    pub fn if_local(&self) -> LocalNft<'_> {
        LocalNft {
            ip: self.ip(),
            local: &self.local,
            negate: false,
        }
    }

    /// Matches traffic not from this node's pods (empty when there is no detector).
    pub fn if_not_local(&self) -> LocalNft<'_> {
        LocalNft {
            ip: self.ip(),
            local: &self.local,
            negate: true,
        }
    }
}

/// The nft match of a [`LocalMatch`] ("ip saddr != 10.0.0.0/8", "iifname \"veth*\""),
/// with a leading space.
pub struct LocalNft<'a> {
    ip: &'static str,
    local: &'a LocalMatch,
    negate: bool,
}

impl fmt::Display for LocalNft<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.negate { "!= " } else { "" };
        match self.local {
            LocalMatch::None => Ok(()),
            LocalMatch::Source(cidr) => write!(f, " {} saddr {op}{cidr}", self.ip),
            // iptables writes a prefix as "veth+", nft as "veth*".
            LocalMatch::Interface(name) => match name.strip_suffix('+') {
                Some(prefix) => write!(f, " iifname {op}\"{prefix}*\""),
                None => write!(f, " iifname {op}\"{name}\""),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::LocalDetector;

    #[test]
    fn local_matches_in_nft_syntax() {
        let mut node = NodeContext {
            local_detector: LocalDetector::Cidrs(vec![
                "10.0.0.0/8".parse().unwrap(),
                "fd00::/64".parse().unwrap(),
            ]),
            ..Default::default()
        };
        let v4 = NftContext::new(&node, IpFamily::V4, &[]);
        assert_eq!(v4.if_not_local().to_string(), " ip saddr != 10.0.0.0/8");
        let v6 = NftContext::new(&node, IpFamily::V6, &[]);
        assert_eq!(v6.if_local().to_string(), " ip6 saddr fd00::/64");
        node.local_detector = LocalDetector::InterfaceNamePrefix("veth".into());
        let prefix = NftContext::new(&node, IpFamily::V4, &[]);
        assert_eq!(prefix.if_not_local().to_string(), " iifname != \"veth*\"");
        node.local_detector = LocalDetector::BridgeInterface("cbr0".into());
        let bridge = NftContext::new(&node, IpFamily::V4, &[]);
        assert_eq!(bridge.if_local().to_string(), " iifname \"cbr0\"");
        node.local_detector = LocalDetector::None;
        assert_eq!(
            NftContext::new(&node, IpFamily::V4, &[])
                .if_local()
                .to_string(),
            ""
        );
    }

    #[test]
    fn service_cidrs_of_the_family_only() {
        let node = NodeContext::default();
        let cidrs = [
            "10.96.0.0/12".parse().unwrap(),
            "fd00:96::/108".parse().unwrap(),
        ];
        let ctx = NftContext::new(&node, IpFamily::V6, &cidrs);
        assert_eq!(ctx.service_cidrs, vec![cidrs[1]]);
    }
}
