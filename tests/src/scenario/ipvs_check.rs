// SPDX-License-Identifier: Apache-2.0
//! In ipvs mode, what `ipvsadm -Ln` shows after each stage: every ClusterIP and externalIP
//! port of the stage's Services must be a virtual server. Read from the kernel's own tool,
//! not the agent's netlink code, and expected from the scenario's objects, not the agent's
//! model, by the rules upstream's IPVS proxier follows (which real servers a virtual server
//! gets is what the flows judge):
//! - a Service labelled `service.kubernetes.io/service-proxy-name` or
//!   `service.kubernetes.io/headless` is not watched at all (the label selector of
//!   kube-proxy's informer), an ExternalName or headless one (no ClusterIP) is skipped;
//! - each IP family's proxier serves a Service only through a ClusterIP of its family, and
//!   takes only the externalIPs of that family: an externalIP of a family the Service has
//!   no ClusterIP of gets no virtual server, even on a dual-stack node.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use serde_json::Value;

/// The labels whose Services kube-proxy does not watch: one handing the Service to another
/// proxy, and the one the control plane puts on headless Services.
const UNWATCHED_LABELS: [&str; 2] = [
    "service.kubernetes.io/service-proxy-name",
    "service.kubernetes.io/headless",
];

/// `PROTO address:port` of every virtual server the stage's Services should have, for a
/// node of the given address families (`true` = IPv6).
pub fn expected_virtual_servers(objects: &[Value], families: &BTreeSet<bool>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for svc in objects.iter().filter(|o| o["kind"] == "Service") {
        let spec = &svc["spec"];
        let labels = &svc["metadata"]["labels"];
        if spec["type"] == "ExternalName"
            || UNWATCHED_LABELS.iter().any(|l| labels.get(l).is_some())
        {
            continue;
        }
        let cluster_ips: Vec<IpAddr> = match spec["clusterIPs"].as_array() {
            Some(ips) => ips.iter().collect(),
            None => vec![&spec["clusterIP"]],
        }
        .into_iter()
        .filter_map(|v| v.as_str()?.parse().ok())
        .collect();
        // The families this node's proxiers serve the Service in: those of its ClusterIPs.
        let served: BTreeSet<bool> = cluster_ips
            .iter()
            .map(IpAddr::is_ipv6)
            .filter(|v6| families.contains(v6))
            .collect();
        let external = spec["externalIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str()?.parse::<IpAddr>().ok());
        let addresses: Vec<IpAddr> = cluster_ips
            .iter()
            .copied()
            .chain(external)
            .filter(|ip| served.contains(&ip.is_ipv6()))
            .collect();
        for port in spec["ports"].as_array().into_iter().flatten() {
            let Some(number) = port["port"].as_u64().and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let proto = port["protocol"].as_str().unwrap_or("TCP");
            if !matches!(proto, "TCP" | "UDP" | "SCTP") {
                continue;
            }
            for ip in &addresses {
                out.insert(format!("{proto} {}", SocketAddr::new(*ip, number)));
            }
        }
    }
    out
}

/// The virtual servers in `ipvsadm -Ln` output, as `PROTO address:port`.
pub fn parse_ipvsadm(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let proto = words.next()?;
            if !matches!(proto, "TCP" | "UDP" | "SCTP") {
                return None;
            }
            let addr: SocketAddr = words.next()?.parse().ok()?;
            Some(format!("{proto} {addr}"))
        })
        .collect()
}

/// What a stage lacks: expected virtual servers `ipvsadm -Ln` does not show.
pub fn missing(expected: &BTreeSet<String>, shown: &BTreeSet<String>) -> Vec<String> {
    expected.difference(shown).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> Vec<Value> {
        serde_yaml::from_str(
            r#"
- kind: Service
  metadata: {name: a, namespace: ns1}
  spec:
    clusterIP: 172.30.0.41
    externalIPs: [192.168.99.11, "fd00::99"]
    ports: [{port: 80}, {port: 53, protocol: UDP}]
- kind: Service
  metadata: {name: dual, namespace: ns1}
  spec:
    clusterIPs: [172.30.0.42, "fd00:30::42"]
    ports: [{port: 53, protocol: SCTP}]
- kind: Service
  metadata: {name: headless, namespace: ns1}
  spec: {clusterIP: None, ports: [{port: 80}]}
- kind: Service
  metadata: {name: other, namespace: ns1, labels: {service.kubernetes.io/service-proxy-name: foo}}
  spec: {clusterIP: 172.30.0.43, ports: [{port: 80}]}
- kind: Service
  metadata: {name: name, namespace: ns1}
  spec: {type: ExternalName, externalName: example.com}
- kind: Service
  metadata: {name: labelled-headless, namespace: ns1, labels: {service.kubernetes.io/headless: ""}}
  spec: {clusterIP: 172.30.0.44, ports: [{port: 80}]}
- kind: Service
  metadata: {name: headless-with-external, namespace: ns1}
  spec: {clusterIP: None, externalIPs: [192.168.99.12], ports: [{port: 80}]}
- kind: EndpointSlice
  metadata: {name: a-1, namespace: ns1}
"#,
        )
        .unwrap()
    }

    #[test]
    fn expects_cluster_and_external_ips_of_the_nodes_families() {
        let v4 = expected_virtual_servers(&objects(), &BTreeSet::from([false]));
        assert_eq!(
            v4.into_iter().collect::<Vec<_>>(),
            [
                "SCTP 172.30.0.42:53",
                "TCP 172.30.0.41:80",
                "TCP 192.168.99.11:80",
                "UDP 172.30.0.41:53",
                "UDP 192.168.99.11:53",
            ]
        );
        let dual = expected_virtual_servers(&objects(), &BTreeSet::from([false, true]));
        assert!(dual.contains("SCTP [fd00:30::42]:53"));
        // Service `a` is IPv4 only: its IPv6 externalIP is no proxier's, even here.
        assert!(!dual.iter().any(|vs| vs.contains("fd00::99")), "{dual:?}");
        assert_eq!(dual.len(), 6, "{dual:?}");
    }

    #[test]
    fn parses_ipvsadm_and_names_what_is_missing() {
        let text = "IP Virtual Server version 1.2.1 (size=4096)\n\
                    Prot LocalAddress:Port Scheduler Flags\n  \
                    -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
                    TCP  172.30.0.41:80 rr\n  \
                    -> 10.180.0.1:80                Masq    1      0          0\n\
                    UDP  [fd00:30::42]:53 rr\n";
        let shown = parse_ipvsadm(text);
        assert_eq!(
            shown.iter().collect::<Vec<_>>(),
            ["TCP 172.30.0.41:80", "UDP [fd00:30::42]:53"]
        );
        let expected = BTreeSet::from([
            "TCP 172.30.0.41:80".to_string(),
            "SCTP 172.30.0.42:53".to_string(),
        ]);
        assert_eq!(missing(&expected, &shown), ["SCTP 172.30.0.42:53"]);
    }
}
