// SPDX-License-Identifier: Apache-2.0
//! The services map in human terms, for the demo, from `bpftool --json map dump` of the
//! services and backends maps: BTF gives every entry a "formatted" form with named fields;
//! addresses and ports there are still in network byte order, as the programs keep them.

use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::Context as _;
use proxy_common::svc_flags;
use serde_yaml::Value;

/// Flag bits worth naming in the demo, with their names.
const FLAG_NAMES: &[(u16, &str)] = &[
    (svc_flags::CLUSTER_IP, "ClusterIP"),
    (svc_flags::NODE_PORT, "NodePort"),
    (svc_flags::EXTERNAL_IP, "externalIP"),
    (svc_flags::LOAD_BALANCER, "LoadBalancer"),
    (svc_flags::AFFINITY, "affinity"),
    (svc_flags::ETP_LOCAL, "eTP=Local"),
    (svc_flags::ITP_LOCAL, "iTP=Local"),
    (svc_flags::MASQUERADE, "masquerade"),
];

/// A u32 that holds an IPv4 address in network byte order, read as a native (little-endian
/// on the hosts the demo runs on) integer.
fn ipv4(raw: u64) -> Ipv4Addr {
    Ipv4Addr::from((u32::try_from(raw).unwrap_or_default()).to_le_bytes())
}

fn port(raw: u64) -> u16 {
    u16::from_be_bytes(u16::try_from(raw).unwrap_or_default().to_le_bytes())
}

fn field(entry: &Value, part: &str, name: &str) -> Option<u64> {
    entry.get("formatted")?.get(part)?.get(name)?.as_u64()
}

fn proto_name(proto: u64) -> String {
    match proto {
        6 => "TCP".into(),
        17 => "UDP".into(),
        132 => "SCTP".into(),
        other => format!("proto {other}"),
    }
}

fn entries(json: &str, what: &str) -> anyhow::Result<Vec<Value>> {
    let value: Value =
        serde_yaml::from_str(json).with_context(|| format!("parsing bpftool's dump of {what}"))?;
    let entries = value.as_sequence().cloned().unwrap_or_default();
    if entries.iter().any(|e| e.get("formatted").is_none()) {
        anyhow::bail!("bpftool printed {what} without BTF field names");
    }
    Ok(entries)
}

/// Sorts the lines: address, port, protocol, scope, slot.
type EntryOrder = (Ipv4Addr, u16, u64, u64, u64);

/// One line per services-map entry, ordered by frontend and slot. `pod_of` names the pod
/// behind a backend address.
pub fn describe(
    services_json: &str,
    backends_json: &str,
    pod_of: &dyn Fn(SocketAddrV4) -> Option<String>,
) -> anyhow::Result<Vec<String>> {
    let backends: Vec<(u64, SocketAddrV4)> = entries(backends_json, "the backends map")?
        .iter()
        .filter_map(|e| {
            let id = e.get("formatted")?.get("key")?.as_u64()?;
            let addr = ipv4(field(e, "value", "addr")?);
            Some((
                id,
                SocketAddrV4::new(addr, port(field(e, "value", "port")?)),
            ))
        })
        .collect();
    let mut rows: Vec<(EntryOrder, String)> = Vec::new();
    for entry in entries(services_json, "the services map")? {
        let key = |name| field(&entry, "key", name).unwrap_or_default();
        let value = |name| field(&entry, "value", name).unwrap_or_default();
        let (addr, dport, proto, scope, slot) = (
            ipv4(key("addr")),
            port(key("dport")),
            key("proto"),
            key("scope"),
            key("slot"),
        );
        let frontend = if dport == 0 {
            format!("{addr} (other ports)")
        } else {
            format!("{addr}:{dport}/{}", proto_name(proto))
        };
        let scope_note = if scope == 0 {
            ""
        } else {
            " (node-local scope)"
        };
        let text = if slot != 0 {
            let id = value("backend_id");
            let target = backends
                .iter()
                .find(|(b, _)| *b == id)
                .map(|(_, addr)| match pod_of(*addr) {
                    Some(pod) => format!(" = {addr} ({pod})"),
                    None => format!(" = {addr}"),
                })
                .unwrap_or_default();
            format!("slot {slot}: backend {id}{target}")
        } else if value("flags") & u64::from(svc_flags::WILDCARD) != 0 {
            "slot 0: no such port: refused".to_string()
        } else {
            let flags = value("flags");
            let names: Vec<&str> = FLAG_NAMES
                .iter()
                .filter(|(bit, _)| flags & u64::from(*bit) != 0)
                .map(|(_, name)| *name)
                .collect();
            format!(
                "slot 0: {} backends, {}, rev-NAT id {}",
                value("count"),
                names.join(" "),
                value("rev_nat_id")
            )
        };
        rows.push((
            (addr, dport, proto, scope, slot),
            format!("{frontend:<26}{text}{scope_note}"),
        ));
    }
    rows.sort();
    Ok(rows.into_iter().map(|(_, line)| line).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape bpftool --json prints for a BTF map (raw bytes elided, as they are unused).
    const SERVICES: &str = r#"[
      {"key": [], "value": [], "formatted": {
        "key": {"addr": 1342201866, "dport": 20480, "slot": 1, "proto": 6, "scope": 0, "_pad": [0, 0]},
        "value": {"backend_id": 7, "count": 0, "rev_nat_id": 1, "flags": 0, "_pad": 0}}},
      {"key": [], "value": [], "formatted": {
        "key": {"addr": 1342201866, "dport": 0, "slot": 0, "proto": 0, "scope": 0, "_pad": [0, 0]},
        "value": {"backend_id": 0, "count": 0, "rev_nat_id": 0, "flags": 512, "_pad": 0}}},
      {"key": [], "value": [], "formatted": {
        "key": {"addr": 1342201866, "dport": 20480, "slot": 0, "proto": 6, "scope": 0, "_pad": [0, 0]},
        "value": {"backend_id": 0, "count": 1, "rev_nat_id": 1, "flags": 1, "_pad": 0}}}
    ]"#;
    // 10.244.1.11:8080
    const BACKENDS: &str = r#"[{"key": [], "value": [], "formatted": {
        "key": 7, "value": {"addr": 184677386, "port": 36895, "proto": 6, "flags": 0}}}]"#;

    #[test]
    fn decodes_network_byte_order_and_names_the_pods() {
        let pod_of = |addr: SocketAddrV4| {
            (addr == SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 11), 8080))
                .then(|| "hello-1".to_string())
        };
        let lines = describe(SERVICES, BACKENDS, &pod_of).unwrap();
        assert_eq!(
            lines,
            [
                "10.96.0.80 (other ports)  slot 0: no such port: refused",
                "10.96.0.80:80/TCP         slot 0: 1 backends, ClusterIP, rev-NAT id 1",
                "10.96.0.80:80/TCP         slot 1: backend 7 = 10.244.1.11:8080 (hello-1)",
            ]
        );
    }

    #[test]
    fn refuses_a_dump_without_btf_names() {
        let raw = r#"[{"key": ["0x0a"], "value": ["0x00"]}]"#;
        assert!(describe(raw, "[]", &|_| None).is_err());
    }
}
