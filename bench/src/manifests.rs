// SPDX-License-Identifier: Apache-2.0
//! The Services and EndpointSlices of the benchmark, as manifest text for the agent's
//! `--source` directory (pure). The measured service has the one real backend; the filler
//! services only occupy the maps (their addresses and backends are never contacted).

use std::{fmt::Write as _, net::Ipv4Addr};

pub const NAMESPACE: &str = "bench";
pub const MEASURED_NAME: &str = "measured";
/// The measured ClusterIP and its port.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const SERVICE_PORT: u16 = 80;
/// The backend's port (the server listens there).
pub const BACKEND_PORT: u16 = 8080;
/// Filler ClusterIPs count up from here, their backends from [`FILLER_BACKEND_BASE`].
const FILLER_IP_BASE: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 0);
const FILLER_BACKEND_BASE: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 0);
/// How many filler services the address ranges above hold without overlapping.
pub const MAX_FILLER: u32 = 1 << 20;

fn nth_after(base: Ipv4Addr, index: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + 1 + index)
}

/// The ClusterIP of filler service `index`.
pub fn filler_ip(index: u32) -> Ipv4Addr {
    nth_after(FILLER_IP_BASE, index)
}

/// The one backend of filler service `index`.
pub fn filler_backend(index: u32) -> Ipv4Addr {
    nth_after(FILLER_BACKEND_BASE, index)
}

/// Backend `endpoint` of filler service `index` when each has `per_service` backends
/// (`per_service` = 1: [`filler_backend`]).
pub fn filler_backend_of(index: u32, endpoint: u32, per_service: u32) -> Ipv4Addr {
    nth_after(FILLER_BACKEND_BASE, index * per_service + endpoint)
}

/// A ClusterIP Service with one TCP port and its EndpointSlice with one ready endpoint. The
/// slice's port carries its (empty) name explicitly, as the API server's defaulting does:
/// kube-proxy ignores slice ports without a name.
fn service_with_backend(out: &mut String, name: &str, ip: Ipv4Addr, backend: Ipv4Addr) {
    service_with_backends(out, name, ip, &[backend]);
}

/// [`service_with_backend`] with one ready endpoint per address of `backends`. JSON, one
/// object per line, as the API server sends objects (the agent's directory source reads a
/// `.json` file as a stream of JSON values).
fn service_with_backends(out: &mut String, name: &str, ip: Ipv4Addr, backends: &[Ipv4Addr]) {
    let endpoints: Vec<String> = backends
        .iter()
        .map(|b| format!(r#"{{"addresses":["{b}"],"conditions":{{"ready":true}}}}"#))
        .collect();
    let endpoints = endpoints.join(",");
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"{NAMESPACE}"}},"spec":{{"type":"ClusterIP","clusterIP":"{ip}","clusterIPs":["{ip}"],"ipFamilies":["IPv4"],"ports":[{{"port":{SERVICE_PORT},"targetPort":{BACKEND_PORT},"protocol":"TCP"}}]}}}}"#
    );
    let _ = writeln!(
        out,
        r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"{name}-1","namespace":"{NAMESPACE}","labels":{{"kubernetes.io/service-name":"{name}"}}}},"addressType":"IPv4","endpoints":[{endpoints}],"ports":[{{"name":"","port":{BACKEND_PORT},"protocol":"TCP"}}]}}"#
    );
}

/// The measured service, whose one endpoint is `backend`.
pub fn measured_service(backend: Ipv4Addr) -> String {
    let mut out = String::new();
    service_with_backend(&mut out, MEASURED_NAME, SERVICE_IP, backend);
    out
}

/// `count` filler services (at most [`MAX_FILLER`]) in one manifest (a `.json` file): one
/// file keeps the agent's directory polling cheap while the benchmark runs.
pub fn filler_services(count: u32) -> String {
    let count = count.min(MAX_FILLER);
    let mut out = String::with_capacity(count as usize * 520);
    for index in 0..count {
        service_with_backend(
            &mut out,
            &format!("filler-{index}"),
            filler_ip(index),
            filler_backend(index),
        );
    }
    out
}

/// `count` filler services with `endpoints` ready backends each (1 to 64; at most
/// [`MAX_FILLER`] backends in all), as [`filler_services`] writes them.
pub fn filler_services_with(count: u32, endpoints: u32) -> String {
    let endpoints = endpoints.clamp(1, 64);
    let count = count.min(MAX_FILLER / endpoints);
    let mut out = String::with_capacity(count as usize * (480 + 48 * endpoints as usize));
    let mut backends = Vec::with_capacity(endpoints as usize);
    for index in 0..count {
        backends.clear();
        backends.extend((0..endpoints).map(|e| filler_backend_of(index, e, endpoints)));
        service_with_backends(
            &mut out,
            &format!("filler-{index}"),
            filler_ip(index),
            &backends,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proxy_agent::k8s::convert::objects::{ClusterObject, parse_json_objects_fingerprinted};

    use super::*;

    /// What the agent's directory source makes of a `.json` manifest.
    fn parse_objects(text: &str) -> Vec<ClusterObject> {
        parse_json_objects_fingerprinted(text, |object, _| object).unwrap()
    }

    #[test]
    fn the_agent_parses_every_service_and_slice() {
        let text = format!(
            "{}{}",
            measured_service(Ipv4Addr::new(10, 244, 1, 2)),
            filler_services(300)
        );
        let objects = parse_objects(&text);
        let mut ips = BTreeSet::new();
        let mut slices = 0;
        for object in &objects {
            match object {
                ClusterObject::Service(svc) => {
                    let spec = svc.spec.as_ref().unwrap();
                    assert!(ips.insert(spec.cluster_ip.clone().unwrap()));
                    assert_eq!(
                        spec.ports.as_ref().unwrap()[0].port,
                        i32::from(SERVICE_PORT)
                    );
                }
                ClusterObject::EndpointSlice(slice) => {
                    slices += 1;
                    let owner =
                        &slice.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"];
                    assert_eq!(slice.metadata.name.as_deref(), Some(&*format!("{owner}-1")));
                    assert_eq!(slice.endpoints.as_ref().map(Vec::len), Some(1));
                    let port = &slice.ports.as_ref().unwrap()[0];
                    assert_eq!(port.name.as_deref(), Some(""));
                    assert_eq!(port.port, Some(i32::from(BACKEND_PORT)));
                }
                other => panic!("unexpected object {other:?}"),
            }
        }
        assert_eq!(ips.len(), 301);
        assert_eq!(slices, 301);
        assert!(ips.contains(&SERVICE_IP.to_string()));
    }

    #[test]
    fn filler_addresses_stay_clear_of_the_measured_ones() {
        let last = MAX_FILLER - 1;
        assert_eq!(filler_ip(0), Ipv4Addr::new(10, 100, 0, 1));
        assert_eq!(filler_ip(last), Ipv4Addr::new(10, 116, 0, 0));
        assert_eq!(filler_backend(last), Ipv4Addr::new(10, 216, 0, 0));
        for ip in [
            filler_ip(0),
            filler_ip(last),
            filler_backend(0),
            filler_backend(last),
        ] {
            assert_ne!(ip, SERVICE_IP);
            assert_ne!(ip.octets()[..2], [10, 244]);
        }
        assert_eq!(filler_services(0), "");
    }

    #[test]
    fn four_endpoint_fillers_parse_with_distinct_backends() {
        assert_eq!(filler_services_with(50, 1), filler_services(50));
        let objects = parse_objects(&filler_services_with(100, 4));
        let mut backends = BTreeSet::new();
        let mut services = 0;
        for object in &objects {
            match object {
                ClusterObject::Service(_) => services += 1,
                ClusterObject::EndpointSlice(slice) => {
                    let endpoints = slice.endpoints.as_ref().unwrap();
                    assert_eq!(endpoints.len(), 4);
                    for endpoint in endpoints {
                        assert!(backends.insert(endpoint.addresses[0].clone()));
                    }
                }
                other => panic!("unexpected object {other:?}"),
            }
        }
        assert_eq!(services, 100);
        assert_eq!(backends.len(), 400);
        assert_eq!(filler_backend_of(1, 0, 4), Ipv4Addr::new(10, 200, 0, 5));
    }
}
