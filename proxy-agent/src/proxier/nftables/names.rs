// SPDX-License-Identifier: Apache-2.0
//! Names in `table ip kube-proxy` / `table ip6 kube-proxy`: the fixed chains, sets and
//! maps (upstream's, so operators and tools see the same table), and the per-service
//! chain names, built as upstream builds them (`service-<hash>-ns/name/tcp/port`), so a
//! chain names the service port it serves.

use std::net::SocketAddr;

use crate::model::{Protocol, ServicePortName};
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
/// Ours (not upstream's): the prefix of the maps from a policy chain's endpoint slot to the
/// endpoint's address and port (see [`SlotKey`]), which replace upstream's endpoint chains
/// for services without ClientIP affinity.
pub const ENDPOINT_SLOTS: &str = "endpoint-slots";
/// Ours: `endpoint . endpoint` for every endpoint of those services, so that postrouting
/// masquerades an endpoint reaching itself through its service (hairpin), the job of
/// upstream's rule `ip saddr <endpoint> jump mark-for-masquerade` in each endpoint chain.
pub const HAIRPIN_ENDPOINTS: &str = "hairpin-endpoints";

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
        port.service.namespace(),
        port.service.name(),
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

/// The first `chars` characters of the hash of `text` as a number (the hash text is
/// base32: 5 bits a character; at most 25 characters, 125 bits).
fn hash_bits(text: &str, chars: usize) -> u128 {
    text_hash(text)
        .as_str()
        .bytes()
        .take(chars.min(25))
        .fold(0u128, |acc, c| {
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'2'..=b'7' => c - b'2' + 26,
                _ => 0,
            };
            (acc << 5) | u128::from(v)
        })
}

/// The affinity slot of one endpoint of one service port: 32 bits of the hash of its chain
/// name. Deterministic, so affinity survives a restart of the agent as upstream's sets do.
/// Two endpoints sharing a slot can only make a client stick to an endpoint of the right
/// service it did not pick (the lookup happens in that service's own chain).
pub fn affinity_slot(endpoint_chain: &str) -> u32 {
    // 7 characters hold 35 bits: the top 32.
    (hash_bits(endpoint_chain, 7) >> 3) as u32
}

/// How many `endpoint-slots-<protocol>-<n>` maps a family has per protocol. Every rule
/// that looks up a map is a binding the kernel walks for each element added to it, so one
/// map for every service would cost (services × endpoints) at a cold load; one map per
/// service would make 50,000 set objects, which the kernel finds by a list walk. 256 maps
/// keep both small: at 50,000 services, about 200 rules and 800 elements each. (One set of
/// maps per protocol: nft 1.0.6 cannot list a rule matching `meta l4proto tcp` that looks
/// up a map whose data is typed `th dport`, and a restarted agent must read its table.)
pub const ENDPOINT_SLOT_MAPS: u32 = 256;

/// The map `endpoint-slots-<protocol>-<n>` of one bucket.
pub fn endpoint_slot_map(protocol: Protocol, bucket: u32) -> String {
    format!("{ENDPOINT_SLOTS}-{}-{bucket}", protocol_lower(protocol))
}

/// Where a policy chain's endpoints are in the slot maps: the bucket (which
/// `endpoint-slots-<protocol>-<n>` map of its protocol) and two 31-bit numbers that, with the endpoint's index, key
/// its element (`hi . lo . index`). All from the hash of the chain's name: deterministic
/// without any record (a restart or another agent writes the same keys), and 62 bits make
/// two chains of one bucket sharing a key as unlikely as two chains sharing a name hash.
/// 31 bits each because nft lists a numgen offset of 2^31 or more as a negative number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotKey {
    pub bucket: u32,
    pub hi: u32,
    pub lo: u32,
}

impl SlotKey {
    pub fn of_chain(policy_chain: &str) -> Self {
        // 15 characters: 75 bits, of which 8 + 31 + 31 are used.
        let bits = hash_bits(policy_chain, 15);
        let mask31 = (1u128 << 31) - 1;
        SlotKey {
            bucket: ((bits >> 62) as u32) % ENDPOINT_SLOT_MAPS,
            hi: ((bits >> 31) & mask31) as u32,
            lo: (bits & mask31) as u32,
        }
    }

    /// The element key of endpoint `index`.
    pub fn element(&self, index: usize) -> String {
        format!("{} . {} . {index}", self.hi, self.lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NamespacedName;

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
    fn slot_keys_are_deterministic_spread_and_below_2_31() {
        let a = SlotKey::of_chain("service-X-ns/a/tcp/p");
        assert_eq!(a, SlotKey::of_chain("service-X-ns/a/tcp/p"));
        assert_ne!(a, SlotKey::of_chain("local-X-ns/a/tcp/p"));
        let keys: Vec<SlotKey> = (0..20_000)
            .map(|i| SlotKey::of_chain(&format!("service-{i}")))
            .collect();
        let distinct: std::collections::HashSet<(u32, u32)> =
            keys.iter().map(|k| (k.hi, k.lo)).collect();
        assert_eq!(distinct.len(), keys.len());
        assert!(keys.iter().all(|k| k.hi < 1 << 31 && k.lo < 1 << 31));
        let buckets: std::collections::HashSet<u32> = keys.iter().map(|k| k.bucket).collect();
        assert_eq!(buckets.len(), ENDPOINT_SLOT_MAPS as usize);
        assert_eq!(a.element(3), format!("{} . {} . 3", a.hi, a.lo));
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
