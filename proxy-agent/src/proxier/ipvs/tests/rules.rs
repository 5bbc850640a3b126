// SPDX-License-Identifier: Apache-2.0
//! The iptables rules and the ipset batches of the ipvs mode.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::IpFamily;
use crate::proxier::ipvs::desired::FamilyDesired;
use crate::proxier::ipvs::ipset::{diff, our_sets, parse_save};
use crate::proxier::ipvs::rules::{RuleContext, assemble, generate, ipvs_only_chain};
use crate::proxier::ipvs::sets::{SetEntry, SetKind};
use crate::proxier::netfilter::Table;
use crate::proxier::netfilter::matches::LocalMatch;

fn context(family: IpFamily, local: LocalMatch) -> RuleContext {
    RuleContext {
        family,
        mark: "0x4000".into(),
        local,
        masquerade_all: false,
        random_fully: true,
    }
}

fn desired_with(entries: &[(SetKind, SetEntry)]) -> FamilyDesired {
    let mut d = FamilyDesired {
        sets: SetKind::ALL
            .into_iter()
            .map(|k| (k, BTreeSet::new()))
            .collect(),
        ..Default::default()
    };
    for (kind, entry) in entries {
        d.sets.get_mut(kind).unwrap().insert(*entry);
    }
    d
}

#[test]
fn rules_match_the_sets_in_use() {
    let ip = "10.96.0.10".parse().unwrap();
    let d = desired_with(&[
        (
            SetKind::ClusterIp,
            SetEntry::IpPort(ip, crate::model::Protocol::Tcp, 80),
        ),
        (SetKind::NodePortTcp, SetEntry::Port(30080)),
    ]);
    let (filter, nat) = generate(
        &d,
        &context(
            IpFamily::V4,
            LocalMatch::Source("10.0.0.0/8".parse().unwrap()),
        ),
    );
    let nat_lines: Vec<&str> = nat.lines().collect();
    assert!(nat_lines.contains(&"-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN"));
    assert!(nat_lines.contains(&"-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"));
    assert!(nat_lines.contains(&"-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ"));
    assert!(
        !nat.contains("KUBE-LOAD-BALANCER-LOCAL"),
        "empty sets are not matched"
    );
    assert_eq!(
        nat_lines.iter().rfind(|l| l.ends_with("-j ACCEPT")),
        Some(&"-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT")
    );
    assert!(nat.contains("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"));
    assert!(filter.contains("-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT"));
    assert!(filter.contains("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP"));

    // IPv6 and no detector: the KUBE-6 sets, and node-originated VIP traffic masqueraded.
    let v6 = "fd00::10".parse().unwrap();
    let d = desired_with(&[(
        SetKind::ClusterIp,
        SetEntry::IpPort(v6, crate::model::Protocol::Tcp, 80),
    )]);
    let (filter, nat) = generate(&d, &context(IpFamily::V6, LocalMatch::None));
    assert!(nat.contains("-A KUBE-SERVICES -s ::1/128 -j RETURN"));
    assert!(nat.contains("--match-set KUBE-6-CLUSTER-IP src,dst -j KUBE-MARK-MASQ"));
    assert!(filter.contains("--match-set KUBE-6-IPVS-IPS dst -j REJECT"));
    let input = assemble(&filter, &nat, "", "-I OUTPUT -j KUBE-SERVICES\n");
    assert!(input.starts_with("*filter\n:KUBE-FORWARD - [0:0]\n"));
    assert!(input.ends_with("-I OUTPUT -j KUBE-SERVICES\nCOMMIT\n"));
    assert!(ipvs_only_chain(Table::Filter, "KUBE-IPVS-FILTER"));
    assert!(
        !ipvs_only_chain(Table::Nat, "KUBE-SERVICES"),
        "shared with iptables mode"
    );
}

#[test]
fn ipset_batches_diff_against_the_saved_sets() {
    let saved = parse_save(
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1\n\
         add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n\
         add KUBE-CLUSTER-IP 10.96.0.99,udp:53\n\
         create KUBE-NODE-PORT-TCP hash:ip,port family inet\n\
         create other-set hash:ip family inet\n\
         add other-set 1.1.1.1\n",
    );
    assert_eq!(saved["KUBE-CLUSTER-IP"].1.len(), 2);
    assert_eq!(
        our_sets(&saved),
        vec!["KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP"]
    );
    let ip = "10.96.0.10".parse().unwrap();
    let mut desired = BTreeMap::new();
    desired.insert(
        SetKind::ClusterIp,
        [
            SetEntry::IpPort(ip, crate::model::Protocol::Tcp, 80),
            SetEntry::IpPort(ip, crate::model::Protocol::Tcp, 443),
        ]
        .into_iter()
        .collect(),
    );
    desired.insert(
        SetKind::NodePortTcp,
        [SetEntry::Port(30080)].into_iter().collect(),
    );
    desired.insert(SetKind::LoopBack, BTreeSet::new());
    let changes = diff(IpFamily::V4, &desired, &saved);
    let lines: Vec<&str> = changes.input.lines().collect();
    assert_eq!(
        lines,
        vec![
            "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536",
            "del KUBE-CLUSTER-IP 10.96.0.99,udp:53",
            "add KUBE-CLUSTER-IP 10.96.0.10,tcp:443",
            // An older, differently typed set of ours is replaced.
            "destroy KUBE-NODE-PORT-TCP",
            "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535",
            "add KUBE-NODE-PORT-TCP 30080",
        ]
    );
    assert_eq!((changes.created, changes.added, changes.deleted), (2, 2, 1));
    let v6 = diff(IpFamily::V6, &desired, &saved);
    assert!(
        v6.input
            .contains("create KUBE-6-CLUSTER-IP hash:ip,port family inet6")
    );
}
