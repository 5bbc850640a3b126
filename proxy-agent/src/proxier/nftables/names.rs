// SPDX-License-Identifier: Apache-2.0
//! Names in `table ip kube-proxy` / `table ip6 kube-proxy`: the fixed chains, sets and
//! maps (upstream's, so operators and tools see the same table), and the per-service
//! chain names, built as upstream builds them (`service-<hash>-ns/name/tcp/port`), so a
//! chain names the service port it serves.

use std::net::SocketAddr;

use crate::model::ServicePortName;
use crate::proxier::netfilter::names::{protocol_lower, text_hash};

pub const TABLE: &str = "kube-proxy";

// Base chains: "<type>-<hook>".
pub const FILTER_PREROUTING: &str = "filter-prerouting";
pub const FILTER_INPUT: &str = "filter-input";
pub const FILTER_FORWARD: &str = "filter-forward";
pub const FILTER_OUTPUT: &str = "filter-output";
pub const FILTER_OUTPUT_POST_DNAT: &str = "filter-output-post-dnat";
pub const NAT_PREROUTING: &str = "nat-prerouting";
pub const NAT_OUTPUT: &str = "nat-output";
pub const NAT_POSTROUTING: &str = "nat-postrouting";

// Regular top-level chains.
pub const SERVICES: &str = "services";
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// Ours (not upstream's): the eTP=Local drop for external IPs and LB IPs without a local
/// endpoint, checked for traffic from elsewhere only (see `ruleset::base`).
pub const EXTERNAL_ENDPOINTS_CHECK: &str = "external-endpoints-check";
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const REJECT_CHAIN: &str = "reject-chain";
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
pub const FIREWALL_CHECK: &str = "firewall-check";
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
pub const MASQUERADING: &str = "masquerading";

// Sets and maps.
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NODEPORT_IPS: &str = "nodeport-ips";
pub const CLUSTER_IPS: &str = "cluster-ips";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_LOCAL_ENDPOINT_EXTERNAL: &str = "no-local-endpoint-external";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";
/// The one ClientIP affinity set of the family (upstream: one set per endpoint).
pub const AFFINITY: &str = "affinity";

/// Longest name nft accepts, and the room left for the hash-and-readable part after the
/// longest prefix ("external-" and the like; 16 as upstream reserves).
const NAME_LENGTH_MAX: usize = 256;
const BASE_LENGTH_MAX: usize = NAME_LENGTH_MAX - 16;

/// Per-service chain kinds, by their name prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortChain {
    /// Endpoints for the Cluster traffic policy.
    Cluster,
    /// Endpoints for the Local traffic policy.
    Local,
    /// External destinations (NodePort, external IPs, LB IPs).
    External,
    /// loadBalancerSourceRanges.
    Firewall,
}

impl PortChain {
    fn prefix(self) -> &'static str {
        match self {
            PortChain::Cluster => "service-",
            PortChain::Local => "local-",
            PortChain::External => "external-",
            PortChain::Firewall => "firewall-",
        }
    }
}

/// `<hash>-<readable>`, the hash being of the readable part (distinguishes names that
/// differ only near the end, and keeps truncated names unique).
fn hashed(readable: &str) -> String {
    let hash = text_hash(readable);
    let mut name = format!("{}-{readable}", &hash.as_str()[..8]);
    if name.len() > BASE_LENGTH_MAX {
        // Only ASCII can occur (names, protocols, addresses, digits).
        name.truncate(BASE_LENGTH_MAX - 3);
        name.push_str("...");
    }
    name
}

/// "ns/name/tcp/port": "/" separates the parts (it cannot occur in them), and is never in
/// a fixed chain's name, which is how a per-service chain is recognised.
fn readable(port: &ServicePortName) -> String {
    format!(
        "{}/{}/{}/{}",
        port.service.namespace,
        port.service.name,
        protocol_lower(port.protocol),
        port.port_name
    )
}

/// The names of one service port's chains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortNames {
    readable: String,
    base: String,
}

impl PortNames {
    pub fn new(port: &ServicePortName) -> Self {
        let readable = readable(port);
        Self {
            base: hashed(&readable),
            readable,
        }
    }

    pub fn chain(&self, kind: PortChain) -> String {
        format!("{}{}", kind.prefix(), self.base)
    }

    /// `endpoint-<hash>-ns/name/tcp/port__ip/port` (IPv6 colons become dots: nft names
    /// cannot hold colons).
    pub fn endpoint(&self, endpoint: &SocketAddr) -> String {
        let ip = endpoint.ip().to_string().replace(':', ".");
        let readable = format!("{}__{ip}/{}", self.readable, endpoint.port());
        format!("endpoint-{}", hashed(&readable))
    }
}

/// Whether a chain of the table is a per-service one (upstream's test: a "/" in it).
pub fn is_port_chain(name: &str) -> bool {
    name.contains('/')
}

/// The affinity slot of one endpoint of one service port: 32 bits of the hash of its chain
/// name. Deterministic, so affinity survives a restart of the agent as upstream's sets do.
/// Two endpoints sharing a slot can only make a client stick to an endpoint of the right
/// service it did not pick (the lookup happens in that service's own chain).
pub fn affinity_slot(endpoint_chain: &str) -> u32 {
    let hash = text_hash(endpoint_chain);
    // The hash text is base32: 5 bits a character, 6 characters hold 30 bits, 7 hold 35.
    hash.as_str()
        .bytes()
        .take(7)
        .fold(0u64, |acc, c| {
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'2'..=b'7' => c - b'2' + 26,
                _ => 0,
            };
            (acc << 5) | u64::from(v)
        })
        .wrapping_shr(3) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamespacedName, Protocol};

    #[test]
    fn names_as_upstreams() {
        // Upstream's TestOverallNFTablesRules: service-ULMVA6XW-ns1/svc1/tcp/p80 and
        // endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80.
        let port = ServicePortName::new(NamespacedName::new("ns1", "svc1"), "p80", Protocol::Tcp);
        let names = PortNames::new(&port);
        assert_eq!(
            names.chain(PortChain::Cluster),
            "service-ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            names.endpoint(&"10.180.0.1:80".parse().unwrap()),
            "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        assert!(is_port_chain(&names.chain(PortChain::External)));
        assert!(!is_port_chain(SERVICES));
        let v6 = names.endpoint(&"[fd00::1]:80".parse().unwrap());
        assert!(v6.ends_with("__fd00..1/80"), "{v6}");
    }

    #[test]
    fn long_names_are_truncated_with_their_hash() {
        let long = "x".repeat(300);
        let name = hashed(&long);
        assert_eq!(name.len(), BASE_LENGTH_MAX);
        assert!(name.ends_with("..."));
        assert_ne!(hashed(&format!("{long}a")), hashed(&format!("{long}b")));
    }

    #[test]
    fn affinity_slots_are_deterministic_and_spread() {
        let a = affinity_slot("endpoint-X-ns/a/tcp/p__10.0.0.1/80");
        assert_eq!(a, affinity_slot("endpoint-X-ns/a/tcp/p__10.0.0.1/80"));
        let slots: std::collections::HashSet<u32> = (0..1000)
            .map(|i| affinity_slot(&format!("endpoint-{i}")))
            .collect();
        assert_eq!(slots.len(), 1000);
    }
}
