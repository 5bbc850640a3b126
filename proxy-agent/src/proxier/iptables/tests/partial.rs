// SPDX-License-Identifier: Apache-2.0
//! Partial syncs: what they write, and that a chain of partial syncs leaves the kernel
//! exactly as a full sync of the same state would.

use std::collections::{BTreeSet, HashSet};

use super::scenario::{Replay, Scenario, Step, scenario_files};
use crate::model::{IpFamily, NamespacedName, Protocol, ServicePortName};
use crate::proxier::Proxier;
use crate::proxier::conntrack::fake::FakeConntrack;
use crate::proxier::iptables::fake::SharedFake;
use crate::proxier::iptables::names::{ChainKind, ChainName};
use crate::proxier::iptables::{IptablesConfig, IptablesProxier, RuleOptions};
use crate::proxier::netfilter::Table;
use crate::proxier::netfilter::names::{endpoint_hash, service_port_hash, service_port_text};

pub fn new_proxier(fake: &SharedFake) -> (IptablesProxier, FakeConntrack) {
    let conntrack = FakeConntrack::default();
    let proxier = IptablesProxier::with_parts(
        Box::new(fake.clone()),
        Box::new(conntrack.clone()),
        RuleOptions::default(),
        IptablesConfig::default(),
    );
    (proxier, conntrack)
}

pub fn sync(proxier: &mut IptablesProxier, replay: &Replay, step: &Step, full: bool) {
    let request = replay.request(step, full);
    proxier.sync(&request).unwrap();
}

pub fn service_yaml(name: &str, ip: &str, protocol: &str) -> String {
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: ns}}
  spec:
    type: ClusterIP
    clusterIP: {ip}
    clusterIPs: [{ip}]
    ipFamilies: [IPv4]
    ports: [{{name: p, port: 80, protocol: {protocol}, targetPort: 80}}]
"
    )
}

pub fn slice_yaml(name: &str, ips: &[&str], protocol: &str) -> String {
    let endpoints: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{addresses: [{ip}], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {name}-1, namespace: ns, labels: {{kubernetes.io/service-name: {name}}}}}
  addressType: IPv4
  endpoints: [{}]
  ports: [{{name: p, port: 80, protocol: {protocol}}}]
",
        endpoints.join(", ")
    )
}

pub fn scenario_yaml(states: &[String]) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let mut yaml = format!(
        "name: test
node: {{name: test-node, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}}
config: {{clusterCIDR: 10.0.0.0/8}}
objects:
{}",
        states[0]
    );
    if states.len() > 1 {
        yaml.push_str("steps:\n");
        for state in &states[1..] {
            yaml.push_str("  - objects:\n");
            yaml.push_str(&indent(state));
        }
    }
    yaml
}

fn port(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(NamespacedName::new("ns", name), "p", protocol)
}

fn svc_chain(name: &str) -> String {
    let text = service_port_text(&port(name, Protocol::Tcp));
    ChainName::new(ChainKind::Svc, service_port_hash(&text, Protocol::Tcp)).to_string()
}

fn sep_chain(name: &str, endpoint: &str) -> String {
    let text = service_port_text(&port(name, Protocol::Tcp));
    let hash = endpoint_hash(&text, Protocol::Tcp, &endpoint.parse().unwrap());
    ChainName::new(ChainKind::Sep, hash).to_string()
}

#[test]
fn one_changed_endpoint_rewrites_only_its_service_and_the_top_level_chains() {
    let before = [
        service_yaml("svc1", "172.30.0.41", "TCP"),
        service_yaml("svc2", "172.30.0.42", "TCP"),
        service_yaml("svc3", "172.30.0.43", "TCP"),
        slice_yaml("svc1", &["10.180.0.1", "10.180.0.2"], "TCP"),
        slice_yaml("svc2", &["10.180.0.4"], "TCP"),
        slice_yaml("svc3", &["10.180.0.5", "10.180.0.6"], "TCP"),
    ]
    .concat();
    let mut after_objects = before.clone();
    after_objects = after_objects.replace("[10.180.0.2]", "[10.180.0.3]");
    let scenario = Scenario::parse(&scenario_yaml(&[before, after_objects]));
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);

    let step = replay.apply(&scenario.states[1]);
    assert_eq!(
        step.changed,
        HashSet::from([NamespacedName::new("ns", "svc1")])
    );
    sync(&mut proxier, &replay, &step, false);
    let input = proxier
        .last_restore_input(IpFamily::V4)
        .unwrap()
        .to_string();

    let declared: BTreeSet<&str> = input
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let expected: BTreeSet<String> = [
        // filter, always
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
        // filter, with localhost NodePorts (on by default, as upstream)
        "KUBE-FIREWALL",
        // nat, always
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ]
    .into_iter()
    .map(String::from)
    .chain([
        svc_chain("svc1"),
        sep_chain("svc1", "10.180.0.1:80"),
        sep_chain("svc1", "10.180.0.3:80"),
        // Declared to flush it before deleting it.
        sep_chain("svc1", "10.180.0.2:80"),
    ])
    .collect();
    let expected: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(declared, expected, "input:\n{input}");

    // Per-service rules only for svc1; svc2 and svc3 appear only in KUBE-SERVICES.
    for line in input.lines().filter(|l| l.starts_with("-A KUBE-S")) {
        let chain = line.split(' ').nth(1).unwrap();
        if chain == "KUBE-SERVICES" {
            continue;
        }
        assert!(
            expected.contains(chain),
            "rule of an unchanged chain written: {line}"
        );
    }
    for other in ["svc2", "svc3"] {
        let jump = format!("-j {}", svc_chain(other));
        assert!(
            input
                .lines()
                .any(|l| l.starts_with("-A KUBE-SERVICES") && l.ends_with(&jump)),
            "KUBE-SERVICES must keep jumping to {other}"
        );
    }
    assert!(input.contains(&format!("-X {}\n", sep_chain("svc1", "10.180.0.2:80"))));
    assert!(!input.contains("*mangle") && !input.contains("\n-I "));

    // The kernel now holds what a full sync would have written.
    let fresh = SharedFake::default();
    let (mut full, _) = new_proxier(&fresh);
    sync(&mut full, &replay, &step, true);
    for table in [Table::Nat, Table::Filter] {
        assert_eq!(
            fake.lock().table(IpFamily::V4, table).clone(),
            fresh.lock().table(IpFamily::V4, table).clone(),
            "{table} differs"
        );
    }
}

#[test]
fn partial_syncs_through_every_scenario_converge_to_the_full_state() {
    for path in scenario_files() {
        let scenario = Scenario::load(&path);
        let fake = SharedFake::default();
        let (mut proxier, _) = new_proxier(&fake);
        let mut replay = scenario.replay();
        for (index, objects) in scenario.states.iter().enumerate() {
            let step = replay.apply(objects);
            sync(&mut proxier, &replay, &step, index == 0);
            let fresh = SharedFake::default();
            let (mut full, _) = new_proxier(&fresh);
            sync(&mut full, &replay, &step, true);
            for family in [IpFamily::V4, IpFamily::V6] {
                for table in [Table::Nat, Table::Filter, Table::Mangle] {
                    assert_eq!(
                        fake.lock().table(family, table).clone(),
                        fresh.lock().table(family, table).clone(),
                        "{}: state {index}: {family} {table} after partial syncs differs from a full sync",
                        scenario.name
                    );
                }
            }
        }
    }
}

#[test]
fn a_failed_sync_makes_the_next_one_full() {
    let objects = [
        service_yaml("svc1", "172.30.0.41", "TCP"),
        slice_yaml("svc1", &["10.180.0.1"], "TCP"),
    ]
    .concat();
    let scenario = Scenario::parse(&scenario_yaml(&[objects.clone(), objects]));
    let fake = SharedFake::default();
    let (mut proxier, conntrack) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    fake.lock().fail_next_restore = true;
    let request = replay.request(&step, true);
    let err = proxier.sync(&request).unwrap_err();
    assert_eq!(err.mode, "iptables");
    assert_eq!(conntrack.table().lists, 0, "no cleanup after a failed sync");

    // The runner may ask for a partial sync; the proxier still does a full one.
    let step = replay.apply(&scenario.states[1]);
    assert!(step.changed.is_empty());
    sync(&mut proxier, &replay, &step, false);
    let input = proxier.last_restore_input(IpFamily::V4).unwrap();
    assert!(input.starts_with("*mangle\n:KUBE-PROXY-CANARY"));
    assert!(input.contains(&format!(":{} - [0:0]", svc_chain("svc1"))));
}
