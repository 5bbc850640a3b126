// SPDX-License-Identifier: Apache-2.0
//! Rendering of a decoded state: text tables and stable JSON.

use std::collections::{HashMap, HashSet};

use proxy_common::{CT_F_SNAT, Ct4Key, CtValue, SCOPE_EXTERNAL, SvcValue, proto, svc_flags};

use super::*;
use crate::{
    model::PortRef,
    proxier::ebpf::{
        desired::{BackendAddr, FrontendKey},
        entries::{BackendEntry, Snapshot, SvcEntryKey},
    },
};

fn raw() -> live::RawMaps {
    let frontend = FrontendKey {
        addr: "172.30.0.41".parse().unwrap(),
        port: 80,
        proto: proto::TCP,
    };
    let mut svc = foldhash::HashMap::default();
    let key = |slot| SvcEntryKey {
        frontend,
        scope: SCOPE_EXTERNAL,
        slot,
    };
    svc.insert(
        key(0),
        SvcValue {
            backend_id: 0,
            count: 2,
            rev_nat_id: 7,
            flags: svc_flags::CLUSTER_IP,
            maglev_table: 0,
            _pad: 0,
        },
    );
    for (slot, id) in [(1, 3), (2, 4)] {
        svc.insert(
            key(slot),
            SvcValue {
                backend_id: id,
                rev_nat_id: 7,
                ..Default::default()
            },
        );
    }
    let backend = |addr: &str, local, terminating| BackendEntry {
        addr: BackendAddr {
            addr: addr.parse().unwrap(),
            port: 8080,
            proto: proto::TCP,
        },
        local,
        terminating,
    };
    let mut backends = foldhash::HashMap::default();
    backends.insert((false, 3), backend("10.180.0.1", true, false));
    backends.insert((false, 4), backend("10.180.1.1", false, true));
    let mut rev_nat = foldhash::HashMap::default();
    rev_nat.insert((false, 7), ("172.30.0.41".parse().unwrap(), 80));
    let mut ct = CtValue {
        frontend_port: 80u16.to_be(),
        backend_port: 8080u16.to_be(),
        client_port: 40000u16.to_be(),
        snat_port: 40000u16.to_be(),
        rev_nat_lo: 7,
        flags: CT_F_SNAT,
        expires: 1030,
        ..Default::default()
    };
    ct.frontend_addr[..4].copy_from_slice(&[172, 30, 0, 41]);
    ct.backend_addr[..4].copy_from_slice(&[10, 180, 1, 1]);
    ct.client_addr[..4].copy_from_slice(&[203, 0, 113, 9]);
    ct.snat_addr[..4].copy_from_slice(&[192, 168, 0, 2]);
    live::RawMaps {
        snapshot: Snapshot {
            svc,
            backends,
            rev_nat,
            nodeport_addrs: HashSet::from(["192.168.0.2".parse().unwrap()]),
            ..Default::default()
        },
        names: HashMap::from([(
            (false, 7),
            PortRef {
                namespace: "ns1".into(),
                name: "svc1".into(),
                port_name: "http".into(),
            },
        )]),
        ct4: vec![(Ct4Key::default(), ct)],
        now: 1000,
        ..Default::default()
    }
}

#[test]
fn services_text_names_the_service_and_lists_backends_with_state() {
    let state = live::decode(&raw());
    let text = render(Subject::Services, &state, Output::Text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("SERVICE"), "{text}");
    assert!(lines[1].starts_with("ns1/svc1:http"), "{text}");
    assert!(lines[1].contains("172.30.0.41:80/TCP"), "{text}");
    assert!(lines[1].contains("ClusterIP"), "{text}");
    assert!(
        lines[1].contains("10.180.0.1:8080 (local, active)"),
        "{text}"
    );
    assert!(
        lines[2].contains("10.180.1.1:8080 (remote, terminating)"),
        "{text}"
    );
    assert!(
        text.contains("NodePorts (*) are served on: 192.168.0.2"),
        "{text}"
    );
}

#[test]
fn json_is_stable_and_machine_readable() {
    let state = live::decode(&raw());
    let json: serde_json::Value =
        serde_json::from_str(&render(Subject::Services, &state, Output::Json).unwrap()).unwrap();
    let f = &json[0];
    assert_eq!(f["address"], "172.30.0.41");
    assert_eq!(f["port"], 80);
    assert_eq!(f["protocol"], "TCP");
    assert_eq!(f["kind"], "clusterip");
    assert_eq!(f["service"]["namespace"], "ns1");
    assert_eq!(f["service"]["port_name"], "http");
    assert_eq!(f["scopes"][0]["backend_ids"], serde_json::json!([3, 4]));
    let backends: serde_json::Value =
        serde_json::from_str(&render(Subject::Backends, &state, Output::Json).unwrap()).unwrap();
    assert_eq!(backends[1]["terminating"], true);
    let ct: serde_json::Value =
        serde_json::from_str(&render(Subject::Conntrack, &state, Output::Json).unwrap()).unwrap();
    assert_eq!(ct[0]["client"], "203.0.113.9:40000");
    assert_eq!(ct[0]["backend"], "10.180.1.1:8080");
    assert_eq!(ct[0]["snat"], "192.168.0.2:40000");
    assert_eq!(ct[0]["expires_in"], 30);
    assert_eq!(ct[0]["service"]["name"], "svc1");
}

#[test]
fn backends_and_conntrack_text() {
    let state = live::decode(&raw());
    let text = render(Subject::Backends, &state, Output::Text).unwrap();
    assert!(
        text.contains("3   10.180.0.1:8080  TCP    active"),
        "{text}"
    );
    let text = render(Subject::Conntrack, &state, Output::Text).unwrap();
    assert!(text.contains("203.0.113.9:40000"), "{text}");
    assert!(text.contains("ns1/svc1:http"), "{text}");
}
