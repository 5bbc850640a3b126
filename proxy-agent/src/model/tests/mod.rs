// SPDX-License-Identifier: Apache-2.0
//! Model tests; objects come from [`crate::k8s::fixtures`].

mod bad_input;
mod endpoints;
mod interner;
mod scenarios;
mod service_tracker;
mod topology;
mod upstream_topology;

use crate::model::{NamespacedName, Protocol, ServicePortName};

fn nsn(namespace: &str, name: &str) -> NamespacedName {
    NamespacedName::new(namespace, name)
}

fn port_name(namespace: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(nsn(namespace, name), port, protocol)
}
