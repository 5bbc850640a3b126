// SPDX-License-Identifier: Apache-2.0
//! What the sources keep of an object once it has been reported: enough to report its
//! deletion, nothing more.
//!
//! A source must notice deletions by itself in two places: a watch's relist (an object
//! that is no longer listed) and the directory source (an object no longer in any file).
//! Both used to keep every object they had reported, whole; with 50,000 Services and as
//! many EndpointSlices that was most of the agent's memory, while a deletion only needs
//! the object's identity: its namespace and name, and for an EndpointSlice the address
//! type and the service it belongs to (what the endpoints tracker keys slices by). A
//! [`Tombstone`] holds exactly that, and [`Buried::from_tombstone`] turns it back into an
//! object carrying those fields for the consumers of deletions.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
        networking::v1::ServiceCIDR,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::convert::LABEL_SERVICE_NAME;

/// The identity of a reported object, for reporting its deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tombstone {
    namespace: Option<Box<str>>,
    name: Box<str>,
    /// EndpointSlices only: the `kubernetes.io/service-name` label.
    service_name: Option<Box<str>>,
    /// EndpointSlices only.
    address_type: Option<Box<str>>,
}

impl Tombstone {
    /// The namespace ("" for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn of(meta: &ObjectMeta) -> Self {
        Self {
            namespace: meta.namespace.as_deref().map(Box::from),
            name: meta.name.as_deref().unwrap_or_default().into(),
            service_name: None,
            address_type: None,
        }
    }

    fn meta(&self) -> ObjectMeta {
        ObjectMeta {
            namespace: self.namespace.as_deref().map(str::to_owned),
            name: Some(self.name.to_string()),
            labels: self.service_name.as_deref().map(|service| {
                BTreeMap::from([(LABEL_SERVICE_NAME.to_owned(), service.to_owned())])
            }),
            ..ObjectMeta::default()
        }
    }
}

/// Objects that can be reduced to a [`Tombstone`] and rebuilt from one.
pub trait Buried: Sized {
    fn tombstone(&self) -> Tombstone;
    /// An object with the tombstone's fields and nothing else: what a deletion event
    /// carries when the source no longer has the object itself.
    fn from_tombstone(tombstone: &Tombstone) -> Self;
}

/// Objects whose deletion needs only their namespace and name.
macro_rules! buried_by_name {
    ($($kind:ty),*) => {$(
        impl Buried for $kind {
            fn tombstone(&self) -> Tombstone {
                Tombstone::of(&self.metadata)
            }

            fn from_tombstone(tombstone: &Tombstone) -> Self {
                Self {
                    metadata: tombstone.meta(),
                    ..Self::default()
                }
            }
        }
    )*};
}

buried_by_name!(Service, Node, ServiceCIDR);

impl Buried for EndpointSlice {
    fn tombstone(&self) -> Tombstone {
        Tombstone {
            service_name: self
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(LABEL_SERVICE_NAME))
                .map(|service| service.as_str().into()),
            address_type: Some(self.address_type.as_str().into()),
            ..Tombstone::of(&self.metadata)
        }
    }

    fn from_tombstone(tombstone: &Tombstone) -> Self {
        EndpointSlice {
            metadata: tombstone.meta(),
            address_type: tombstone
                .address_type
                .as_deref()
                .unwrap_or_default()
                .to_owned(),
            ..EndpointSlice::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        k8s::{convert, fixtures},
        model::{EndpointsChangeTracker, IpFamily},
    };

    #[test]
    fn a_slice_rebuilt_from_its_tombstone_deletes_what_the_slice_added() {
        let slice = fixtures::mk_endpointslice("ns", "web-abc", "web", "IPv4")
            .port("http", 8080, "TCP")
            .endpoint(fixtures::mk_endpoint("10.1.0.1"))
            .endpoint(fixtures::mk_endpoint("10.1.0.2"))
            .build();
        let rebuilt = EndpointSlice::from_tombstone(&slice.tombstone());
        assert_eq!(rebuilt.metadata.name.as_deref(), Some("web-abc"));
        assert_eq!(rebuilt.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(rebuilt.address_type, slice.address_type);
        assert_eq!(
            convert::endpoint_slice_keys(&rebuilt),
            convert::endpoint_slice_keys(&slice)
        );
        assert!(
            rebuilt.endpoints.as_ref().is_none_or(|e| e.is_empty()),
            "nothing but the identity is kept"
        );

        let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, "node-a");
        assert!(tracker.endpoint_slice_update(&slice, false));
        let mut applied = crate::model::EndpointsMap::new();
        applied.apply(&mut tracker);
        assert!(tracker.endpoint_slice_update(&rebuilt, true));
        let result = applied.apply(&mut tracker);
        assert!(applied.values().all(|e| e.is_empty()), "{applied:?}");
        assert_eq!(result.updated_services.len(), 1);
    }

    #[test]
    fn services_nodes_and_cidrs_keep_their_names() {
        let svc = fixtures::mk_service("ns", "web")
            .cluster_ip("10.96.0.10")
            .port("http", 80, "TCP")
            .build();
        let rebuilt = Service::from_tombstone(&svc.tombstone());
        assert_eq!(
            convert::object_name(&rebuilt.metadata),
            convert::object_name(&svc.metadata)
        );
        assert!(rebuilt.spec.is_none());

        let node = Node {
            metadata: ObjectMeta {
                name: Some("node-a".into()),
                labels: Some(BTreeMap::from([("zone".into(), "a".into())])),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let rebuilt = Node::from_tombstone(&node.tombstone());
        assert_eq!(rebuilt.metadata.name.as_deref(), Some("node-a"));
        assert_eq!(rebuilt.metadata.namespace, None);
        assert_eq!(rebuilt.metadata.labels, None);

        let cidr = ServiceCIDR {
            metadata: ObjectMeta {
                name: Some("kubernetes".into()),
                ..ObjectMeta::default()
            },
            ..ServiceCIDR::default()
        };
        let rebuilt = ServiceCIDR::from_tombstone(&cidr.tombstone());
        assert_eq!(rebuilt.metadata.name.as_deref(), Some("kubernetes"));
    }
}
