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
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName(Arc<NameParts>);

/// Compared, ordered and hashed as (namespace, name), in that order.
#[derive(Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct NameParts {
    namespace: Arc<str>,
    name: Box<str>,
}

impl NamespacedName {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self(Arc::new(NameParts {
            namespace: super::interner::shared_key_part(namespace.as_ref()),
            name: Box::from(name.as_ref()),
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
    }
}
