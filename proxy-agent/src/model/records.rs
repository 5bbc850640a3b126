// SPDX-License-Identifier: Apache-2.0
//! What the sources hand the model for each Service and EndpointSlice: the object as the
//! trackers take it in, already converted (the API object itself stops at the source).
//!
//! Why: converting an object is pure and needs nothing but the object, so a source does
//! it where it decodes, beside the event loop (the directory source on its decoding
//! threads, each watcher on its own task), and the loop only files what it gets. Converting
//! on the loop took a cold read of 100,000 services × 10 endpoints about 0.45 s on one
//! core while the other waited, and every decoded slice (some 3.5 KiB for ten endpoints)
//! stayed alive until the read's events were out.

use super::{InvalidObject, IpFamily, NamespacedName, ServicePorts, SliceInfo};

/// A Service: its name and, for each IP family the node serves, its ports as that
/// family's proxier sees them, or why the object is refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceRecord {
    pub name: NamespacedName,
    /// One entry per family converted for (none for a deletion, which needs only the name).
    pub ports: Vec<(IpFamily, Result<ServicePorts, InvalidObject>)>,
}

impl ServiceRecord {
    /// The ports for `family`, taken out of the record. A family the record was not
    /// converted for has none (the sources convert for every family the node serves).
    pub fn take_ports(&mut self, family: IpFamily) -> Result<ServicePorts, InvalidObject> {
        match self.ports.iter().position(|(f, _)| *f == family) {
            Some(at) => self.ports.swap_remove(at).1,
            None => Ok(ServicePorts::default()),
        }
    }
}

/// An EndpointSlice: who it is, whose it is, and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceRecord {
    /// The slice's own namespace and name.
    pub object: NamespacedName,
    /// From its address type; `None` for FQDN slices (and any unknown type).
    pub family: Option<IpFamily>,
    /// The service it belongs to and the slice's name (the cache's keys); `None` without
    /// a service name label.
    pub owner: Option<(NamespacedName, String)>,
    /// Its content: `Ok(None)` for a deletion and for a slice outside kube-proxy's label
    /// selector; `Err` for a slice the API server would have refused.
    pub info: Result<Option<SliceInfo>, InvalidObject>,
}
