// SPDX-License-Identifier: Apache-2.0
//! The objects of the latency benchmark, as the API server stores them (pure): the Node,
//! the filler services (4 endpoints each, never contacted) and the measured changes (a new
//! Service with its EndpointSlice whose one endpoint is the real backend).

use std::net::{Ipv4Addr, SocketAddr};

use serde_json::{Value, json};

use crate::{agent::NODE_NAME, manifests::BACKEND_PORT};

pub const NAMESPACE: &str = "latency";
/// The port of every frontend.
pub const SERVICE_PORT: u16 = 80;
/// Where the ClusterIPs of the run come from: the prober's namespace routes this range
/// nowhere, so a connect the agent did not translate fails at once (see `mod.rs`).
pub const CLUSTER_RANGE: &str = "10.96.0.0/12";
/// Fillers count up from 10.100.0.1, their endpoints from 10.200.0.1 (never contacted).
const FILLER_IP_BASE: u32 = u32::from_be_bytes([10, 100, 0, 0]);
const FILLER_BACKEND_BASE: u32 = u32::from_be_bytes([10, 200, 0, 0]);
/// New services count up from 10.97.0.1 (fresh ClusterIPs, never used before the change).
const NEW_IP_BASE: u32 = u32::from_be_bytes([10, 97, 0, 0]);
/// The highest index of a new service or filler: the new ones stay below 10.100.0.0, the
/// fillers below 10.103.0.0, both inside [`CLUSTER_RANGE`] and apart from [`CONTROL_IP`].
pub const MAX_INDEX: u32 = 3 * 65_536 - 2;
/// Never created: the prober's control frontend, whose every success would be false.
pub const CONTROL_IP: Ipv4Addr = Ipv4Addr::new(10, 111, 255, 254);
pub const ENDPOINTS_PER_FILLER: u32 = 4;

pub fn filler_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(FILLER_IP_BASE + 1 + index.min(MAX_INDEX))
}

/// The ClusterIP of change `index`.
pub fn new_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(NEW_IP_BASE + 1 + index.min(MAX_INDEX))
}

pub fn frontend(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::from((ip, SERVICE_PORT))
}

pub fn control_frontend() -> SocketAddr {
    frontend(CONTROL_IP)
}

pub fn node(address: Ipv4Addr) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE_NAME},
        "status": {"addresses": [{"type": "InternalIP", "address": address.to_string()}]},
    })
}

pub fn service(name: &str, ip: Ipv4Addr) -> Value {
    let ip = ip.to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
            "ports": [{"name": "p", "port": SERVICE_PORT, "targetPort": BACKEND_PORT,
                       "protocol": "TCP"}],
        },
    })
}

/// The service's slice; ports carry the service port's name, as the controller writes them.
pub fn endpoint_slice(service: &str, backends: &[Ipv4Addr]) -> Value {
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|b| json!({"addresses": [b.to_string()], "conditions": {"ready": true}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{service}-1"), "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "p", "port": BACKEND_PORT, "protocol": "TCP"}],
    })
}

/// Filler `index`: its Service and a slice with [`ENDPOINTS_PER_FILLER`] endpoints.
pub fn filler(index: u32) -> [Value; 2] {
    let name = format!("filler-{index}");
    let first = FILLER_BACKEND_BASE + 1 + index.min(MAX_INDEX / ENDPOINTS_PER_FILLER) * 4;
    let backends: Vec<Ipv4Addr> = (0..ENDPOINTS_PER_FILLER)
        .map(|i| Ipv4Addr::from(first + i))
        .collect();
    [
        service(&name, filler_ip(index)),
        endpoint_slice(&name, &backends),
    ]
}

/// Change `index`: a new Service and its slice with `backend` as the one endpoint.
pub fn change(index: u32, backend: Ipv4Addr) -> [Value; 2] {
    let name = format!("new-{index}");
    [
        service(&name, new_ip(index)),
        endpoint_slice(&name, &[backend]),
    ]
}

#[cfg(test)]
mod tests {
    use ipnet::Ipv4Net;
    use proxy_agent::k8s::convert::objects::{ClusterObject, parse_objects};

    use super::*;

    #[test]
    fn addresses_stay_in_their_ranges_and_apart() {
        let range: Ipv4Net = CLUSTER_RANGE.parse().unwrap();
        for index in [0, 1, 9_999, MAX_INDEX] {
            assert!(range.contains(&filler_ip(index)));
            assert!(range.contains(&new_ip(index)));
            assert_ne!(filler_ip(index), new_ip(index));
        }
        assert!(range.contains(&CONTROL_IP));
        assert_ne!(new_ip(MAX_INDEX), CONTROL_IP);
        assert_ne!(filler_ip(MAX_INDEX), CONTROL_IP);
        assert_eq!(new_ip(0), Ipv4Addr::new(10, 97, 0, 1));
        assert_eq!(filler_ip(0), Ipv4Addr::new(10, 100, 0, 1));
    }

    #[test]
    fn the_agent_parses_fillers_and_changes() {
        let mut text = String::new();
        for value in filler(3)
            .into_iter()
            .chain(change(7, Ipv4Addr::new(10, 244, 1, 2)))
        {
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(&value).unwrap());
        }
        let objects = parse_objects(&text).unwrap();
        assert_eq!(objects.len(), 4);
        let mut slices = Vec::new();
        for object in &objects {
            if let ClusterObject::EndpointSlice(slice) = object {
                slices.push(slice.endpoints.as_ref().map_or(0, Vec::len));
            }
        }
        assert_eq!(slices, [4, 1]);
    }
}
