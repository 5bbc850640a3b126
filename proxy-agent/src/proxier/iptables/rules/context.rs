// SPDX-License-Identifier: Apache-2.0
//! The per-family settings rule generation needs, derived once per sync from the shared
//! [`NodeContext`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::IpFamily;
use crate::proxier::NodeContext;
use crate::proxier::netfilter::matches::{LocalMatch, masquerade_mark};

/// Host facts that shape the rules but are not part of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleOptions {
    /// iptables supports `MASQUERADE --random-fully` (1.6.2 and later).
    pub random_fully: bool,
    /// net.netfilter.nf_conntrack_tcp_be_liberal is set: INVALID packets are not dropped.
    pub conntrack_tcp_be_liberal: bool,
    /// The nfacct objects created at start, which rules may then feed.
    pub nfacct: NfacctCounters,
}

impl Default for RuleOptions {
    fn default() -> Self {
        Self {
            random_fully: true,
            conntrack_tcp_be_liberal: false,
            nfacct: NfacctCounters::default(),
        }
    }
}

/// Which of upstream's nfacct objects exist (see `proxier::netfilter::nfacct`): a rule
/// names an object only if it exists, or iptables-restore would refuse the whole input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfacctCounters {
    /// `ct_state_invalid_dropped_pkts`, fed by the KUBE-FORWARD INVALID-drop rule.
    pub ct_state_invalid_dropped: bool,
    /// `localhost_nps_accepted_pkts`, fed by the KUBE-NODEPORTS rules for 127.0.0.0/8.
    pub localhost_nodeports_accepted: bool,
}

impl NfacctCounters {
    /// Both objects exist.
    pub const ALL: Self = Self {
        ct_state_invalid_dropped: true,
        localhost_nodeports_accepted: true,
    };
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
