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
///
/// Its parts (namespace, name, and for an EndpointSlice the service name and address type)
/// are one string, one after the other: a source keeps one of these for every object it
/// reported (100,000 at 50,000 services), and four separate strings cost four allocations
/// and 64 bytes of pointers each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tombstone {
    /// The present parts, in the order of [`Part`].
    text: Box<str>,
    /// Where each part but the last ends in `text` (the last ends with it).
    ends: [u32; 3],
    /// Bit `1 << part` is set when that part is present.
    present: u8,
}

/// The parts of a [`Tombstone`], in the order they are stored.
#[derive(Clone, Copy)]
enum Part {
    Namespace = 0,
    Name = 1,
    ServiceName = 2,
    AddressType = 3,
}

impl Tombstone {
    fn new(
        namespace: Option<&str>,
        name: &str,
        service_name: Option<&str>,
        address_type: Option<&str>,
    ) -> Self {
        let parts = [namespace, Some(name), service_name, address_type];
        let mut text = String::with_capacity(parts.iter().flatten().map(|p| p.len()).sum());
        let mut ends = [0u32; 3];
        let mut present = 0u8;
        for (i, part) in parts.iter().enumerate() {
            if let Some(part) = part {
                text.push_str(part);
                present |= 1 << i;
            }
            if let Some(end) = ends.get_mut(i) {
                // An object's text is far below 4 GiB (the API server's limit is a few
                // MiB); a longer one reads back shorter, never out of bounds.
                *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
            }
        }
        Self {
            text: text.into_boxed_str(),
            ends,
            present,
        }
    }

    fn part(&self, part: Part) -> Option<&str> {
        let i = part as usize;
        if self.present & (1 << i) == 0 {
            return None;
        }
        let start = i
            .checked_sub(1)
            .map_or(0, |before| self.ends[before] as usize);
        let end = self
            .ends
            .get(i)
            .map_or(self.text.len(), |&end| end as usize);
        Some(self.text.get(start..end).unwrap_or_default())
    }

    /// The namespace ("" for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.part(Part::Namespace).unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.part(Part::Name).unwrap_or_default()
    }

    fn of(meta: &ObjectMeta) -> Self {
        Self::new(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
            None,
            None,
        )
    }

    fn meta(&self) -> ObjectMeta {
        ObjectMeta {
            namespace: self.part(Part::Namespace).map(str::to_owned),
            name: Some(self.name().to_owned()),
            labels: self.part(Part::ServiceName).map(|service| {
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
        Tombstone::new(
            self.metadata.namespace.as_deref(),
            self.metadata.name.as_deref().unwrap_or_default(),
            self.metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(LABEL_SERVICE_NAME))
                .map(String::as_str),
            Some(&self.address_type),
        )
    }

    fn from_tombstone(tombstone: &Tombstone) -> Self {
        EndpointSlice {
            metadata: tombstone.meta(),
            address_type: tombstone
                .part(Part::AddressType)
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
    fn each_part_reads_back_as_stored_and_an_absent_part_stays_absent() {
        let slice = Tombstone::new(Some("ns"), "web-abc", Some(""), Some("IPv4"));
        assert_eq!(slice.part(Part::Namespace), Some("ns"));
        assert_eq!(slice.name(), "web-abc");
        assert_eq!(
            slice.part(Part::ServiceName),
            Some(""),
            "empty is not absent"
        );
        assert_eq!(slice.part(Part::AddressType), Some("IPv4"));

        let node = Tombstone::new(None, "node-a", None, None);
        assert_eq!(node.part(Part::Namespace), None);
        assert_eq!(node.namespace(), "");
        assert_eq!(node.name(), "node-a");
        assert_eq!(node.part(Part::ServiceName), None);
        assert_eq!(node.part(Part::AddressType), None);

        let unnamed = Tombstone::new(Some(""), "", None, Some("IPv6"));
        assert_eq!(unnamed.part(Part::Namespace), Some(""));
        assert_eq!(unnamed.name(), "");
        assert_eq!(unnamed.part(Part::AddressType), Some("IPv6"));
        assert_ne!(
            Tombstone::new(Some("a"), "bc", None, None),
            Tombstone::new(Some("ab"), "c", None, None),
            "the boundary between the parts is part of the identity"
        );
        // One is kept per object a source reported.
        assert_eq!(std::mem::size_of::<Tombstone>(), 32);
    }

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
