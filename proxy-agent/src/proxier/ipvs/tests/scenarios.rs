// SPDX-License-Identifier: Apache-2.0
//! The desired state of the behaviour scenarios (../shared/scenarios), replayed through
//! the real trackers as the iptables golden tests do: concrete virtual servers, real
//! servers, set members, addresses and drop rules for the scenarios whose services
//! exercise each part, and invariants for every state of every scenario.

use std::collections::BTreeSet;
use std::path::Path;

use super::{has_every_set, render};
use crate::model::IpFamily;
use crate::proxier::iptables::tests::scenario::{Scenario, scenario_files, scenarios_dir};
use crate::proxier::ipvs::desired::{self, FamilyDesired};

/// The IPv4 desired state of each state of scenario `file`.
fn states(file: &str) -> Vec<FamilyDesired> {
    let scenario = Scenario::load(&scenarios_dir().join(file));
    let mut replay = scenario.replay();
    scenario
        .states
        .iter()
        .map(|objects| {
            replay.apply(objects);
            desired::build(&replay.families[0], &replay.node, "")
        })
        .collect()
}

fn lines(desired: &FamilyDesired) -> BTreeSet<String> {
    render(desired, IpFamily::V4)
}

#[track_caller]
fn assert_has(rendered: &BTreeSet<String>, expected: &[&str]) {
    for line in expected {
        assert!(
            rendered.contains(*line),
            "missing {line:?} in:\n{}",
            rendered.iter().cloned().collect::<Vec<_>>().join("\n")
        );
    }
}

fn count(rendered: &BTreeSet<String>, prefix: &str) -> usize {
    rendered.iter().filter(|l| l.starts_with(prefix)).count()
}

#[test]
fn clusterip_general_every_port_and_protocol() {
    let got = lines(&states("c1-clusterip-general.yaml")[0]);
    assert_has(
        &got,
        &[
            "VS TCP 172.30.0.41:80 rr persist=- -> 10.180.0.1:80",
            "VS TCP 172.30.0.42:80 rr persist=- -> 10.180.0.1:80,10.180.2.1:80",
            "VS TCP 172.30.0.42:443 rr persist=- -> 10.180.0.1:8443,10.180.2.1:8443",
            "VS UDP 172.30.0.42:53 rr persist=- -> 10.180.0.1:53,10.180.2.1:53",
            "VS TCP 172.30.0.42:53 rr persist=- -> 10.180.0.1:5353,10.180.2.1:5353",
            "VS SCTP 172.30.0.42:53 rr persist=- -> 10.180.0.1:53,10.180.2.1:53",
            "SET KUBE-CLUSTER-IP 172.30.0.41,tcp:80",
            "SET KUBE-CLUSTER-IP 172.30.0.42,sctp:53",
            "SET KUBE-CLUSTER-IP 172.30.0.42,udp:53",
            "SET KUBE-LOOP-BACK 10.180.2.1,tcp:5353,10.180.2.1",
            "SET KUBE-IPVS-IPS 172.30.0.41",
            "ADDR 172.30.0.41",
            "ADDR 172.30.0.42",
        ],
    );
    assert_eq!(count(&got, "VS "), 6, "ClusterIP services only");
    assert_eq!(count(&got, "ADDR "), 2);
    assert_eq!(count(&got, "DROP "), 0);
    assert_eq!(count(&got, "SET KUBE-NODE-PORT"), 0);
}

#[test]
fn no_endpoints_keep_empty_virtual_servers() {
    // IPVS answers a virtual server without real servers with ICMP port unreachable:
    // upstream's REJECT. The external IP is a node address, so it is not bound.
    let got = lines(&states("b1-no-endpoints-reject.yaml")[0]);
    assert_has(
        &got,
        &[
            "VS TCP 172.30.0.41:80 rr persist=- -> ",
            "VS TCP 192.168.99.11:80 rr persist=- -> ",
            "VS TCP 1.2.3.4:80 rr persist=- -> ",
            "VS TCP 192.168.0.2:3001 rr persist=- -> ",
            "VS TCP 192.168.1.2:3001 rr persist=- -> ",
            "VS TCP 192.168.99.11:3001 rr persist=- -> ",
            "SET KUBE-EXTERNAL-IP 192.168.99.11,tcp:80",
            "SET KUBE-LOAD-BALANCER 1.2.3.4,tcp:80",
            "SET KUBE-NODE-PORT-TCP 3001",
            "ADDR 1.2.3.4",
            "ADDR 172.30.0.41",
        ],
    );
    assert!(!got.contains("ADDR 192.168.99.11"));
    assert_eq!(count(&got, "DROP "), 0, "no endpoints is REJECT, not DROP");
}

#[test]
fn load_balancer_source_ranges_fill_the_firewall_sets() {
    let got = lines(&states("d1-loadbalancer-source-ranges.yaml")[0]);
    assert_has(
        &got,
        &[
            "VS TCP 1.2.3.4:80 rr persist=- -> 10.180.0.1:80",
            "VS TCP 5.6.7.8:80 rr persist=- -> 10.180.0.1:80",
            "SET KUBE-LOAD-BALANCER-FW 1.2.3.4,tcp:80",
            "SET KUBE-LOAD-BALANCER-FW 5.6.7.8,tcp:80",
            "SET KUBE-LOAD-BALANCER-SOURCE-CIDR 1.2.3.4,tcp:80,192.168.0.0/24",
            "SET KUBE-LOAD-BALANCER-SOURCE-CIDR 1.2.3.4,tcp:80,203.0.113.0/25",
            "SET KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,203.0.113.0/25",
            // The node's primary IP is inside a range: the node reaches the LB IPs.
            "SET KUBE-LOAD-BALANCER-SOURCE-IP 1.2.3.4,tcp:80,1.2.3.4",
            "SET KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.8,tcp:80,5.6.7.8",
        ],
    );
    assert_eq!(count(&got, "NO-NODE-ACCESS"), 0);
}

#[test]
fn external_traffic_policy_local_uses_local_endpoints_outside() {
    let got = lines(&states("f1-etp-local.yaml")[0]);
    assert_has(
        &got,
        &[
            "VS TCP 172.30.0.41:80 rr persist=- -> 10.180.0.1:80,10.180.2.1:80",
            "VS TCP 192.168.99.11:80 rr persist=- -> 10.180.2.1:80",
            "VS TCP 1.2.3.4:80 rr persist=- -> 10.180.2.1:80",
            "VS TCP 192.168.0.2:3001 rr persist=- -> 10.180.2.1:80",
            "SET KUBE-EXTERNAL-IP-LOCAL 192.168.99.11,tcp:80",
            "SET KUBE-LOAD-BALANCER-LOCAL 1.2.3.4,tcp:80",
            "SET KUBE-NODE-PORT-LOCAL-TCP 3001",
            "SET KUBE-NODE-PORT-TCP 3001",
            "SET KUBE-HEALTH-CHECK-NODE-PORT 30000",
        ],
    );
    assert_eq!(count(&got, "SET KUBE-EXTERNAL-IP "), 0);
    assert_eq!(count(&got, "DROP "), 0, "there is a local endpoint");
}

#[test]
fn session_affinity_is_persistence() {
    let got = lines(&states("k1-session-affinity.yaml")[0]);
    assert_has(
        &got,
        &[
            "VS TCP 172.30.0.45:80 rr persist=10800 -> 10.180.0.3:80,10.180.1.3:80,10.180.2.3:80",
            "VS TCP 50.60.70.81:80 rr persist=10800 -> 10.180.0.3:80,10.180.1.3:80,10.180.2.3:80",
            "VS TCP 5.6.7.8:80 rr persist=10800 -> 10.180.0.3:80,10.180.1.3:80,10.180.2.3:80",
            "ADDR 50.60.70.81",
            // The range excludes the node: IPVS must not serve the node either.
            "NO-NODE-ACCESS TCP 5.6.7.8:80",
        ],
    );
}

#[test]
fn internal_policy_local_without_local_endpoints_drops() {
    let states = states("h1-internal-traffic-policy.yaml");
    let dropping: Vec<BTreeSet<String>> = states
        .iter()
        .map(lines)
        .filter(|l| l.iter().any(|line| line.starts_with("DROP ns1/svc1")))
        .collect();
    assert!(!dropping.is_empty(), "some state has no local endpoint");
    for got in &dropping {
        assert_has(
            got,
            &["DROP ns1/svc1 Address(172.30.1.1) TCP 80 external_only=false"],
        );
        assert!(
            got.iter()
                .any(|l| l.starts_with("VS TCP 172.30.1.1:80 rr persist=- -> "))
        );
    }
    // A state with local endpoints uses only them.
    let local = states
        .iter()
        .map(lines)
        .find(|l| l.contains("VS TCP 172.30.1.1:80 rr persist=- -> 10.0.1.1:80,10.0.1.2:80"));
    assert!(local.is_some(), "the two-local-endpoint state");
}

#[test]
fn every_scenario_state_is_consistent() {
    for file in scenario_files() {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let scenario = Scenario::load(Path::new(&file));
        let mut replay = scenario.replay();
        for (index, objects) in scenario.states.iter().enumerate() {
            replay.apply(objects);
            for state in &replay.families {
                let family = state.family;
                let d = desired::build(state, &replay.node, "wrr");
                let context = format!("{name} state {index} {family}");
                assert!(has_every_set(&d), "{context}");
                for (key, svc) in &d.services {
                    assert!(family.contains(&key.addr), "{context}: {key}");
                    assert_eq!(svc.server.scheduler, "wrr", "{context}");
                    let endpoints = state.endpoints.get(&svc.owner).cloned().unwrap_or_default();
                    for rs in &svc.real_servers {
                        assert!(
                            endpoints
                                .iter()
                                .any(|ep| ep.ip == rs.addr && ep.port == rs.port),
                            "{context}: {key} -> {rs} is an endpoint of {}",
                            svc.owner
                        );
                    }
                }
                // Every bound address is a service address listed in KUBE-IPVS-IPS.
                let ipvs_ips = &d.sets[&crate::proxier::ipvs::sets::SetKind::IpvsIps];
                for ip in &d.addresses {
                    assert!(
                        ipvs_ips.contains(&crate::proxier::ipvs::sets::SetEntry::Ip(*ip)),
                        "{context}: {ip}"
                    );
                    assert!(d.services.keys().any(|k| k.addr == *ip), "{context}: {ip}");
                }
                // Exactly one ClusterIP set member per ClusterIP virtual server.
                let cluster_ips = &d.sets[&crate::proxier::ipvs::sets::SetKind::ClusterIp];
                assert_eq!(cluster_ips.len(), state.services.len(), "{context}");
            }
        }
    }
}

#[test]
fn terminating_endpoints_with_external_policy_local() {
    let states = states("i1-terminating-etp-local.yaml");
    let first = lines(&states[0]);
    assert_has(
        &first,
        &[
            // Ready endpoints first: the cluster set inside, the local ones outside.
            "VS TCP 172.30.1.1:80 rr persist=- -> 10.0.1.1:80,10.0.1.2:80,10.0.1.5:80",
            "VS TCP 1.2.3.4:80 rr persist=- -> 10.0.1.1:80,10.0.1.2:80",
        ],
    );
    // The slice deleted: empty virtual servers (IPVS rejects).
    assert_has(
        &lines(&states[1]),
        &[
            "VS TCP 172.30.1.1:80 rr persist=- -> ",
            "VS TCP 1.2.3.4:80 rr persist=- -> ",
        ],
    );
    let second = lines(&states[2]);
    assert_has(
        &second,
        &[
            "VS TCP 172.30.1.1:80 rr persist=- -> 10.0.1.5:80",
            // No ready local endpoint: the serving, terminating local ones; never the
            // one that is not serving.
            "VS TCP 1.2.3.4:80 rr persist=- -> 10.0.1.2:80,10.0.1.3:80",
        ],
    );
    assert_eq!(count(&second, "DROP "), 0);
}

#[test]
fn topology_hints_filter_the_cluster_endpoints() {
    let got = lines(&states("m1-topology-hints-auto.yaml")[0]);
    assert_has(
        &got,
        &["VS TCP 172.30.0.41:80 rr persist=- -> 10.1.2.3:80,10.1.2.6:80"],
    );
}
