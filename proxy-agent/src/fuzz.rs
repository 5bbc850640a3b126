// SPDX-License-Identifier: Apache-2.0
//! Entry points for fuzzing: untrusted bytes -> the agent's parsers and model.
//!
//! The cargo-fuzz targets in `tests/fuzz/` call these, and so does a short deterministic
//! test in the normal suite (`tests/tests/fuzz_smoke.rs`). Each function accepts any bytes,
//! runs the same path the agent runs on an object or a configuration file, and panics only
//! when an invariant of that path breaks — which is what a fuzzer reports as a crash.

use std::path::Path;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::config;
use crate::k8s::convert;
use crate::model::{
    EndpointsChangeTracker, EndpointsMap, IpFamily, ServiceChangeTracker, ServicePortMap,
};

const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// What the agent made of one input, so that tests can check seeds do what they should.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not UTF-8, not JSON/YAML, or not of the expected type.
    Undecodable,
    /// Decoded, but refused (invalid object or configuration).
    Rejected,
    /// Decoded and accepted: for objects, the number of model entries it produced over
    /// both families (service ports, or service ports with endpoints); 1 for a
    /// configuration.
    Accepted(usize),
}

/// A Service as JSON -> each family's [`ServiceChangeTracker`] and [`ServicePortMap`]:
/// added, applied, deleted, applied.
pub fn service_json(data: &[u8]) -> Outcome {
    let Ok(svc) = serde_json::from_slice::<Service>(data) else {
        return Outcome::Undecodable;
    };
    service(&svc)
}

/// The object form of [`service_json`].
pub fn service(svc: &Service) -> Outcome {
    let mut rejected = false;
    let mut entries = 0;
    for family in FAMILIES {
        let converted = convert::service_ports(svc, family);
        if let Ok(ports) = &converted {
            check_service_ports(ports, family);
        }
        let mut tracker = ServiceChangeTracker::new(family);
        let mut map = ServicePortMap::new();
        tracker.update(None, Some(svc));
        map.apply(&mut tracker);
        match &converted {
            Ok(ports) => {
                assert_eq!(map.len(), ports.len(), "every converted port is in the map");
                assert_eq!(tracker.rejected_count(), 0);
                entries += ports.len();
            }
            Err(invalid) => {
                assert!(map.is_empty(), "a refused service adds nothing: {invalid}");
                assert_eq!(tracker.take_rejected(), std::slice::from_ref(invalid));
                rejected = true;
            }
        }
        // An unchanged resend is no change and no new report.
        assert!(!tracker.update(Some(svc), Some(svc)));
        assert!(tracker.take_rejected().is_empty());
        tracker.update(Some(svc), None);
        map.apply(&mut tracker);
        assert!(map.is_empty(), "a deleted service leaves nothing");
        assert_eq!(map.services().count(), 0);
        assert_eq!(tracker.rejected_count(), 0);
    }
    if rejected {
        Outcome::Rejected
    } else {
        Outcome::Accepted(entries)
    }
}

fn check_service_ports(
    ports: &[(crate::model::ServicePortName, crate::model::ServicePort)],
    family: IpFamily,
) {
    let mut names = std::collections::HashSet::new();
    for (name, port) in ports {
        assert!(names.insert(name), "port names are unique: {name}");
        assert!(
            family.contains(&port.cluster_ip),
            "{name}: clusterIP family"
        );
        assert_ne!(port.port, 0, "{name}: port 0");
        assert_ne!(port.node_port, Some(0), "{name}: nodePort 0");
        assert_ne!(port.health_check_node_port, Some(0), "{name}: hc port 0");
        assert!(port.external_ips.iter().all(|ip| family.contains(ip)));
        assert!(
            port.load_balancer_ingress
                .iter()
                .all(|ingress| family.contains(&ingress.ip))
        );
        assert!(
            port.load_balancer_source_ranges
                .iter()
                .all(|net| IpFamily::of_net(net) == family)
        );
        let _ = name.to_string();
    }
}

/// An EndpointSlice as JSON -> each family's [`EndpointsChangeTracker`] and
/// [`EndpointsMap`]: added, applied, deleted, applied.
pub fn endpoint_slice_json(data: &[u8]) -> Outcome {
    let Ok(slice) = serde_json::from_slice::<EndpointSlice>(data) else {
        return Outcome::Undecodable;
    };
    endpoint_slice(&slice)
}

/// The object form of [`endpoint_slice_json`].
pub fn endpoint_slice(slice: &EndpointSlice) -> Outcome {
    let converted = convert::endpoint_slice_info(slice);
    if let Ok(Some(info)) = &converted {
        for endpoint in &info.endpoints {
            assert!(
                info.address_family.contains(&endpoint.ip),
                "endpoint family"
            );
        }
        assert!(info.ports.iter().all(|port| port.port != 0), "port 0");
    }
    let mut entries = 0;
    for family in FAMILIES {
        let mut tracker = EndpointsChangeTracker::new(family, "node-a");
        let mut map = EndpointsMap::new();
        tracker.endpoint_slice_update(slice, false);
        map.apply(&mut tracker);
        for (name, endpoints) in map.iter() {
            assert!(!endpoints.is_empty(), "{name}: no empty endpoint lists");
            for endpoint in endpoints {
                assert!(family.contains(&endpoint.ip), "{name}: endpoint family");
                assert_ne!(endpoint.port, 0, "{name}: endpoint port 0");
                let _ = endpoint.to_string();
            }
        }
        let _ = map.local_ready_endpoints();
        entries += map.len();
        if converted.is_err() {
            assert!(map.is_empty(), "a refused slice adds nothing");
        }
        tracker.endpoint_slice_update(slice, true);
        map.apply(&mut tracker);
        assert!(map.is_empty(), "a deleted slice leaves nothing");
        assert_eq!(
            tracker.rejected_count(),
            0,
            "a deleted slice is not refused"
        );
    }
    match converted {
        Err(_) => Outcome::Rejected,
        Ok(_) => Outcome::Accepted(entries),
    }
}

/// A configuration file's text -> decoded, defaulted, validated; a configuration that
/// validates must have a typed view and survive `--write-config-to` and a reload unchanged.
pub fn config_text(data: &[u8]) -> Outcome {
    let Ok(text) = std::str::from_utf8(data) else {
        return Outcome::Undecodable;
    };
    let origin = Path::new("fuzz.yaml");
    let Ok(mut parsed) = config::parse_str(text, origin) else {
        return Outcome::Undecodable;
    };
    config::apply_defaults(&mut parsed);
    config::apply_platform_defaults(&mut parsed);
    let errors = config::validate(&parsed);
    for error in &errors {
        let _ = error.to_string();
    }
    if !errors.is_empty() {
        return Outcome::Rejected;
    }
    let effective = config::effective(&parsed);
    assert!(
        effective.is_ok(),
        "a validated configuration has a typed view: {effective:?}"
    );
    let written = config::to_yaml(&parsed);
    let Ok(written) = written else {
        panic!("a validated configuration serializes: {written:?}");
    };
    let reloaded = config::parse_str(&written, origin);
    let Ok(reloaded) = reloaded else {
        panic!("the written configuration reloads: {reloaded:?}\n{written}");
    };
    assert_eq!(
        reloaded, parsed,
        "the written configuration reloads unchanged"
    );
    Outcome::Accepted(1)
}
