// SPDX-License-Identifier: Apache-2.0
//! Identifiers shared by the whole model: object names, protocols, address families.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

/// A namespaced object name ("ns/name"), the key of services and their endpoints.
///
/// One pointer to shared parts: every layer keys its records by service (the trackers,
/// the model's ports and endpoints, each proxier's state), and each of those tables holds
/// a key per service, 50,000 of them in a big cluster. Two shared strings made every key
/// 32 bytes; the pointer makes it 8, and a clone is one reference count. The namespace is
/// itself shared by all the names of that namespace.
///
/// A table hashes one word, the name's foldhash, not both strings: a cold sync of 100,000
/// services looks each name up in a dozen tables, and feeding both strings to each
/// table's SipHash showed as a tenth of the model's time. The word is computed at each
/// hash, not stored: a stored word moved the parts from jemalloc's 48-byte class to its
/// 64-byte one, several MiB at 50,000 services.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NamespacedName(Arc<NameParts>);

/// Compared and ordered as (namespace, name), in that order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct NameParts {
    namespace: Arc<str>,
    name: Box<str>,
}

/// The word a name hashes as. foldhash with a seed drawn once per process: equal names
/// hash alike within a run (nothing keeps these hashes across runs), and names chosen in
/// the cluster cannot be made to collide without knowing the seed.
fn name_hash(namespace: &str, name: &str) -> u64 {
    use std::hash::BuildHasher as _;
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default)
        .hash_one((namespace, name))
}

impl std::hash::Hash for NamespacedName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(name_hash(&self.0.namespace, &self.0.name));
    }
}

impl Default for NamespacedName {
    fn default() -> Self {
        Self::new("", "")
    }
}

impl NamespacedName {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        let (namespace, name) = (namespace.as_ref(), name.as_ref());
        Self(Arc::new(NameParts {
            namespace: super::interner::shared_key_part(namespace),
            name: Box::from(name),
        }))
    }

    /// The namespace ("" for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        &self.0.namespace
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }
}

impl fmt::Debug for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamespacedName")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .finish()
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.name())
    }
}

/// Transport protocol of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The spelling the Kubernetes API uses ("TCP", "UDP", "SCTP").
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// Parses the API spelling; the API is case-sensitive, and so is this.
    pub fn from_api(value: &str) -> Option<Self> {
        match value {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IP address family. Each tracker and map is single-family, as each upstream proxier is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNet) -> Self {
        match net {
            IpNet::V4(_) => IpFamily::V4,
            IpNet::V6(_) => IpFamily::V6,
        }
    }

    pub fn contains(self, ip: &IpAddr) -> bool {
        IpFamily::of(ip) == self
    }

    /// The spelling of `Service.spec.ipFamilies` and `EndpointSlice.addressType`.
    pub fn as_api_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    pub fn from_api(value: &str) -> Option<Self> {
        match value {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_api_str())
    }
}

/// Names one port of one service: the key of [`super::ServicePortMap`] and
/// [`super::EndpointsMap`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub service: NamespacedName,
    /// The port's `name` ("" for a single unnamed port); one shared copy per distinct name
    /// (a cluster's services use a few port names over and over).
    pub port_name: Arc<str>,
    pub protocol: Protocol,
}

impl ServicePortName {
    pub fn new(service: NamespacedName, port_name: impl AsRef<str>, protocol: Protocol) -> Self {
        Self {
            service,
            port_name: super::interner::shared_key_part(port_name.as_ref()),
            protocol,
        }
    }
}

/// "ns/name:port", or "ns/name" for an unnamed port, as upstream prints it (the protocol
/// is not part of the text; rule comments and logs use this form).
impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port_name.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port_name)
        }
    }
}

/// A service port by its names, as the dataplanes label what they hold (the ebpf names
/// table, iptables rule comments) and as `inspect` and `trace` show it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct PortRef {
    pub namespace: String,
    pub name: String,
    /// "" for a single unnamed port.
    pub port_name: String,
}

impl std::fmt::Display for PortRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port_name.is_empty() {
            write!(f, ":{}", self.port_name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_one_namespace_share_its_string_and_still_compare_by_value() {
        let web = NamespacedName::new("shop", "web");
        let db = NamespacedName::new(String::from("shop"), "db");
        assert!(Arc::ptr_eq(&web.0.namespace, &db.0.namespace));
        assert_eq!(web, NamespacedName::new("shop", "web"));
        assert_ne!(web, NamespacedName::new("shop2", "web"));
        assert_eq!(web.to_string(), "shop/web");
        assert_eq!((web.namespace(), web.name()), ("shop", "web"));
        assert!(
            NamespacedName::new("a", "z") < NamespacedName::new("b", "a"),
            "ordered by namespace first"
        );
        // A key of every per-service table.
        assert_eq!(std::mem::size_of::<NamespacedName>(), 8);
        // With the Arc's counts, 48 bytes: jemalloc's 48-byte class, not its 64-byte one.
        assert_eq!(std::mem::size_of::<NameParts>() + 16, 48);
    }

    #[test]
    fn a_name_hashes_and_compares_as_its_parts() {
        use std::collections::{BTreeSet, HashSet};
        let a = NamespacedName::new("ns", "web");
        let b = NamespacedName::new(String::from("ns"), String::from("web"));
        assert!(!Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, b);
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(
            std::hash::BuildHasher::hash_one(&state, &a),
            std::hash::BuildHasher::hash_one(&state, &b),
            "equal names made apart hash alike"
        );
        // The split point is part of the name: "a/bc" and "ab/c" differ in hash and value.
        let split = [
            NamespacedName::new("a", "bc"),
            NamespacedName::new("ab", "c"),
        ];
        assert_ne!(split[0], split[1]);
        assert_ne!(
            name_hash(split[0].namespace(), split[0].name()),
            name_hash(split[1].namespace(), split[1].name())
        );
        let set: HashSet<NamespacedName> =
            [a.clone(), b, split[0].clone(), split[1].clone()].into();
        assert_eq!(set.len(), 3);
        assert!(set.contains(&NamespacedName::new("ns", "web")));
        // Order ignores the hash: by namespace, then name.
        let sorted: Vec<String> = [
            NamespacedName::new("b", "a"),
            NamespacedName::new("a", "z"),
            NamespacedName::new("a", "b"),
            NamespacedName::default(),
        ]
        .into_iter()
        .collect::<BTreeSet<_>>()
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(sorted, ["/", "a/b", "a/z", "b/a"]);
        assert_eq!(NamespacedName::default(), NamespacedName::new("", ""));
    }
}
