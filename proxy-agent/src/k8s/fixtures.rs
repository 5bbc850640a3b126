// SPDX-License-Identifier: Apache-2.0
//! Small builders for Kubernetes objects in tests (linkerd policy-controller style).
//!
//! ```ignore
//! let svc = mk_service("ns1", "svc1").cluster_ip("172.30.0.41").port("http", 80, "TCP").build();
//! let slice = mk_endpointslice("ns1", "svc1-abc", "svc1", "IPv4")
//!     .port("http", 80, "TCP")
//!     .endpoint(mk_endpoint("10.180.0.1").node("test-node"))
//!     .build();
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec,
    NodeStatus, Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::convert::{LABEL_SERVICE_NAME, parse_ip_sloppy};

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: namespace.map(str::to_owned),
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

fn family_of(ip: &str) -> &'static str {
    match parse_ip_sloppy(ip) {
        Some(std::net::IpAddr::V6(_)) => "IPv6",
        _ => "IPv4",
    }
}

/// A ClusterIP service with no ports and no address yet.
pub fn mk_service(namespace: &str, name: &str) -> ServiceBuilder {
    ServiceBuilder {
        svc: Service {
            metadata: meta(Some(namespace), name),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                ..ServiceSpec::default()
            }),
            status: Some(ServiceStatus::default()),
        },
    }
}

#[derive(Clone, Debug)]
pub struct ServiceBuilder {
    svc: Service,
}

impl ServiceBuilder {
    /// Continues building from an existing Service.
    pub fn from_service(svc: Service) -> Self {
        Self { svc }
    }

    fn spec(&mut self) -> &mut ServiceSpec {
        self.svc.spec.get_or_insert_with(ServiceSpec::default)
    }

    /// Single-stack: sets clusterIP, clusterIPs and ipFamilies as the API server would.
    pub fn cluster_ip(self, ip: &str) -> Self {
        self.cluster_ips(&[ip])
    }

    /// clusterIPs (and clusterIP, ipFamilies) in the given order; the first is primary.
    pub fn cluster_ips(mut self, ips: &[&str]) -> Self {
        let spec = self.spec();
        spec.cluster_ip = ips.first().map(|ip| (*ip).to_owned());
        spec.cluster_ips = Some(ips.iter().map(|ip| (*ip).to_owned()).collect());
        spec.ip_families = Some(ips.iter().map(|ip| family_of(ip).to_owned()).collect());
        self
    }

    /// Only `clusterIP`, as objects written before dual-stack have it.
    pub fn legacy_cluster_ip(mut self, ip: &str) -> Self {
        let spec = self.spec();
        spec.cluster_ip = Some(ip.to_owned());
        spec.cluster_ips = None;
        spec.ip_families = None;
        self
    }

    pub fn ip_families(mut self, families: &[&str]) -> Self {
        self.spec().ip_families = Some(families.iter().map(|f| (*f).to_owned()).collect());
        self
    }

    /// clusterIP None.
    pub fn headless(self) -> Self {
        self.legacy_cluster_ip("None")
    }

    /// "ClusterIP", "NodePort", "LoadBalancer" or "ExternalName".
    pub fn type_(mut self, service_type: &str) -> Self {
        self.spec().type_ = Some(service_type.to_owned());
        self
    }

    pub fn external_name(mut self, name: &str) -> Self {
        let spec = self.spec();
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some(name.to_owned());
        self
    }

    pub fn port(self, name: &str, port: i32, protocol: &str) -> Self {
        self.port_with(name, port, protocol, None)
    }

    pub fn node_port(self, name: &str, port: i32, protocol: &str, node_port: i32) -> Self {
        self.port_with(name, port, protocol, Some(node_port))
    }

    fn port_with(mut self, name: &str, port: i32, protocol: &str, node_port: Option<i32>) -> Self {
        self.spec()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: Some(name.to_owned()),
                port,
                protocol: Some(protocol.to_owned()),
                node_port,
                target_port: Some(IntOrString::Int(port)),
                ..ServicePort::default()
            });
        self
    }

    /// Edits the last port added.
    pub fn with_last_port(mut self, edit: impl FnOnce(&mut ServicePort)) -> Self {
        if let Some(port) = self
            .spec()
            .ports
            .as_mut()
            .and_then(|ports| ports.last_mut())
        {
            edit(port);
        }
        self
    }

    pub fn external_ips(mut self, ips: &[&str]) -> Self {
        self.spec().external_ips = Some(ips.iter().map(|ip| (*ip).to_owned()).collect());
        self
    }

    /// Adds `status.loadBalancer.ingress[]` with this IP and ipMode ("VIP", "Proxy", or
    /// `None` for no ipMode).
    pub fn lb_ingress(mut self, ip: &str, ip_mode: Option<&str>) -> Self {
        let status = self.svc.status.get_or_insert_with(ServiceStatus::default);
        let lb = status
            .load_balancer
            .get_or_insert_with(LoadBalancerStatus::default);
        lb.ingress
            .get_or_insert_with(Vec::new)
            .push(LoadBalancerIngress {
                ip: Some(ip.to_owned()),
                ip_mode: ip_mode.map(str::to_owned),
                ..LoadBalancerIngress::default()
            });
        self
    }

    pub fn source_ranges(mut self, ranges: &[&str]) -> Self {
        self.spec().load_balancer_source_ranges =
            Some(ranges.iter().map(|r| (*r).to_owned()).collect());
        self
    }

    pub fn external_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().external_traffic_policy = Some(policy.to_owned());
        self
    }

    pub fn internal_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().internal_traffic_policy = Some(policy.to_owned());
        self
    }

    pub fn health_check_node_port(mut self, port: i32) -> Self {
        self.spec().health_check_node_port = Some(port);
        self
    }

    /// ClientIP affinity; `None` leaves `sessionAffinityConfig` out.
    pub fn session_affinity_client_ip(mut self, timeout_seconds: Option<i32>) -> Self {
        let spec = self.spec();
        spec.session_affinity = Some("ClientIP".into());
        spec.session_affinity_config = timeout_seconds.map(|timeout| SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(timeout),
            }),
        });
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.svc
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.svc
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Arbitrary edits the builder has no method for.
    pub fn with(mut self, edit: impl FnOnce(&mut Service)) -> Self {
        edit(&mut self.svc);
        self
    }

    pub fn build(self) -> Service {
        self.svc
    }
}

impl From<ServiceBuilder> for Service {
    fn from(builder: ServiceBuilder) -> Self {
        builder.build()
    }
}

/// An EndpointSlice of `service` (sets the `kubernetes.io/service-name` label) with the
/// given addressType ("IPv4", "IPv6", "FQDN").
pub fn mk_endpointslice(
    namespace: &str,
    name: &str,
    service: &str,
    address_type: &str,
) -> EndpointSliceBuilder {
    let mut metadata = meta(Some(namespace), name);
    metadata.labels = Some(BTreeMap::from([(
        LABEL_SERVICE_NAME.to_owned(),
        service.to_owned(),
    )]));
    EndpointSliceBuilder {
        slice: EndpointSlice {
            address_type: address_type.to_owned(),
            endpoints: Some(Vec::new()),
            metadata,
            ports: Some(Vec::new()),
        },
    }
}

#[derive(Clone, Debug)]
pub struct EndpointSliceBuilder {
    slice: EndpointSlice,
}

impl EndpointSliceBuilder {
    /// Continues building from an existing EndpointSlice.
    pub fn from_slice(slice: EndpointSlice) -> Self {
        Self { slice }
    }

    pub fn port(mut self, name: &str, port: i32, protocol: &str) -> Self {
        self.slice
            .ports
            .get_or_insert_with(Vec::new)
            .push(EndpointPort {
                name: Some(name.to_owned()),
                port: Some(port),
                protocol: Some(protocol.to_owned()),
                app_protocol: None,
            });
        self
    }

    pub fn endpoint(mut self, endpoint: impl Into<Endpoint>) -> Self {
        self.slice
            .endpoints
            .get_or_insert_with(Vec::new)
            .push(endpoint.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.slice
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.slice
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn with(mut self, edit: impl FnOnce(&mut EndpointSlice)) -> Self {
        edit(&mut self.slice);
        self
    }

    pub fn build(self) -> EndpointSlice {
        self.slice
    }
}

impl From<EndpointSliceBuilder> for EndpointSlice {
    fn from(builder: EndpointSliceBuilder) -> Self {
        builder.build()
    }
}

/// A ready endpoint (ready, serving, not terminating) at `address`.
pub fn mk_endpoint(address: &str) -> EndpointBuilder {
    EndpointBuilder {
        endpoint: Endpoint {
            addresses: vec![address.to_owned()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Endpoint::default()
        },
    }
}

#[derive(Clone, Debug)]
pub struct EndpointBuilder {
    endpoint: Endpoint,
}

impl EndpointBuilder {
    pub fn node(mut self, node_name: &str) -> Self {
        self.endpoint.node_name = Some(node_name.to_owned());
        self
    }

    /// Replaces the addresses (only the first one is used by the proxy).
    pub fn with_addresses(mut self, addresses: &[&str]) -> Self {
        self.endpoint.addresses = addresses.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    pub fn zone(mut self, zone: &str) -> Self {
        self.endpoint.zone = Some(zone.to_owned());
        self
    }

    /// Sets ready, serving and terminating explicitly.
    pub fn conditions(mut self, ready: bool, serving: bool, terminating: bool) -> Self {
        self.endpoint.conditions = Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        });
        self
    }

    /// Removes every condition (each takes its API default).
    pub fn no_conditions(mut self) -> Self {
        self.endpoint.conditions = None;
        self
    }

    pub fn zone_hints(mut self, zones: &[&str]) -> Self {
        let hints = self
            .endpoint
            .hints
            .get_or_insert_with(EndpointHints::default);
        hints.for_zones = Some(
            zones
                .iter()
                .map(|z| ForZone {
                    name: (*z).to_owned(),
                })
                .collect(),
        );
        self
    }

    pub fn node_hints(mut self, nodes: &[&str]) -> Self {
        let hints = self
            .endpoint
            .hints
            .get_or_insert_with(EndpointHints::default);
        hints.for_nodes = Some(
            nodes
                .iter()
                .map(|n| ForNode {
                    name: (*n).to_owned(),
                })
                .collect(),
        );
        self
    }

    pub fn build(self) -> Endpoint {
        self.endpoint
    }
}

impl From<EndpointBuilder> for Endpoint {
    fn from(builder: EndpointBuilder) -> Self {
        builder.build()
    }
}

/// A Node with these labels, podCIDRs (the first also as podCIDR) and InternalIP
/// addresses.
pub fn mk_node(
    name: &str,
    labels: &[(&str, &str)],
    pod_cidrs: &[&str],
    addresses: &[&str],
) -> Node {
    let mut metadata = meta(None, name);
    metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    Node {
        metadata,
        spec: Some(NodeSpec {
            pod_cidr: pod_cidrs.first().map(|cidr| (*cidr).to_owned()),
            pod_cidrs: Some(pod_cidrs.iter().map(|cidr| (*cidr).to_owned()).collect()),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|address| NodeAddress {
                        address: (*address).to_owned(),
                        type_: "InternalIP".into(),
                    })
                    .collect(),
            ),
            ..NodeStatus::default()
        }),
    }
}
