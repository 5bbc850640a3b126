// SPDX-License-Identifier: Apache-2.0
//! The iptables mode's per-service chains: a kind prefix (`KUBE-SVC-`, `KUBE-SEP-`, ...)
//! and upstream's hash ([`crate::proxier::netfilter::names`]), so the names equal
//! kube-proxy's for the same service ports and endpoints.

use std::fmt;

use crate::proxier::netfilter::names::ChainHash;

/// The per-service chain kinds, by prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainKind {
    /// Endpoints for "Cluster" traffic policy.
    Svc,
    /// Endpoints for "Local" traffic policy.
    Svl,
    /// Entry for external destinations (NodePort, external IPs, LB IPs).
    Ext,
    /// loadBalancerSourceRanges.
    Fw,
    /// One endpoint.
    Sep,
}

impl ChainKind {
    pub const ALL: [ChainKind; 5] = [
        ChainKind::Svc,
        ChainKind::Svl,
        ChainKind::Ext,
        ChainKind::Fw,
        ChainKind::Sep,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            ChainKind::Svc => "KUBE-SVC-",
            ChainKind::Svl => "KUBE-SVL-",
            ChainKind::Ext => "KUBE-EXT-",
            ChainKind::Fw => "KUBE-FW-",
            ChainKind::Sep => "KUBE-SEP-",
        }
    }
}

/// Whether `name` is a per-service chain of this mode (what stale-chain cleanup may delete).
pub fn is_service_chain(name: &str) -> bool {
    ChainKind::ALL.iter().any(|k| name.starts_with(k.prefix()))
}

/// A per-service chain name; `Copy`, so writing rules never allocates for names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainName {
    pub kind: ChainKind,
    pub hash: ChainHash,
}

impl ChainName {
    pub fn new(kind: ChainKind, hash: ChainHash) -> Self {
        Self { kind, hash }
    }
}

impl fmt::Display for ChainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.prefix())?;
        f.write_str(self.hash.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::model::{NamespacedName, Protocol, ServicePortName};
    use crate::proxier::netfilter::names::{
        KUBE_SERVICES, endpoint_hash, service_port_hash, service_port_text,
    };

    fn port(ns: &str, name: &str, port: &str) -> String {
        service_port_text(&ServicePortName::new(
            NamespacedName::new(ns, name),
            port,
            Protocol::Tcp,
        ))
    }

    #[test]
    fn names_equal_upstreams_for_the_same_service_ports() {
        // Chain names from upstream's TestOverallIPTablesRules expected output.
        let cases = [
            ("ns1", "svc1", "KUBE-SVC-XPGD46QRK7WJZT7O"),
            ("ns2", "svc2", "KUBE-SVC-GNZBNJ2PO5MGZ6GT"),
            ("ns3", "svc3", "KUBE-SVC-X27LE4BHSL4DOUIK"),
            ("ns4", "svc4", "KUBE-SVC-4SW47YFZTEDKD3PK"),
            ("ns5", "svc5", "KUBE-SVC-NUKIZ6OKUXPJNT4C"),
        ];
        for (ns, name, expected) in cases {
            let hash = service_port_hash(&port(ns, name, "p80"), Protocol::Tcp);
            assert_eq!(ChainName::new(ChainKind::Svc, hash).to_string(), expected);
        }
        let fw = service_port_hash(&port("ns5", "svc5", "p80"), Protocol::Tcp);
        assert_eq!(
            ChainName::new(ChainKind::Fw, fw).to_string(),
            "KUBE-FW-NUKIZ6OKUXPJNT4C"
        );
    }

    #[test]
    fn endpoint_chain_names_equal_upstreams() {
        let cases = [
            ("ns1", "svc1", "10.180.0.1:80", "KUBE-SEP-SXIVWICOYRO3J4NJ"),
            ("ns4", "svc4", "10.180.0.5:80", "KUBE-SEP-C6EBXVWJJZMIWKLZ"),
            ("ns5", "svc5", "10.180.0.3:80", "KUBE-SEP-I77PXRDZVX7PMWMN"),
        ];
        for (ns, name, ep, expected) in cases {
            let ep: SocketAddr = ep.parse().unwrap();
            let hash = endpoint_hash(&port(ns, name, "p80"), Protocol::Tcp, &ep);
            assert_eq!(ChainName::new(ChainKind::Sep, hash).to_string(), expected);
        }
    }

    #[test]
    fn service_chain_prefixes_are_recognised() {
        assert!(is_service_chain("KUBE-SEP-SXIVWICOYRO3J4NJ"));
        assert!(is_service_chain("KUBE-FW-NUKIZ6OKUXPJNT4C"));
        assert!(!is_service_chain(KUBE_SERVICES));
        assert!(!is_service_chain("KUBE-MARK-MASQ"));
    }
}
