// SPDX-License-Identifier: Apache-2.0
//! The proxier against the in-memory iptables: jump rules, flush detection, stale chains,
//! conntrack cleanup, cleanup, large clusters, IPv6.

use super::partial::{new_proxier, scenario_yaml, service_yaml, slice_yaml, sync};
use super::scenario::Scenario;
use crate::model::IpFamily;
use crate::proxier::Proxier;
use crate::proxier::conntrack::IPPROTO_TCP;
use crate::proxier::conntrack::fake::{entry, udp_entry};
use crate::proxier::iptables::cleanup_with;
use crate::proxier::iptables::fake::SharedFake;
use crate::proxier::iptables::jumps::JUMPS;
use crate::proxier::netfilter::{IptablesBackend, Table};

fn simple() -> Scenario {
    let objects = [
        service_yaml("svc1", "172.30.0.41", "TCP"),
        slice_yaml("svc1", &["10.180.0.1"], "TCP"),
    ]
    .concat();
    Scenario::parse(&scenario_yaml(&[objects.clone(), objects]))
}

fn kube_chains(fake: &SharedFake, family: IpFamily) -> Vec<String> {
    let mut found = Vec::new();
    for table in [Table::Filter, Table::Nat, Table::Mangle] {
        let mut lock = fake.lock();
        for (chain, rules) in &lock.table(family, table).chains {
            if chain.starts_with("KUBE-") {
                found.push(format!("{table}/{chain}"));
            }
            found.extend(
                rules
                    .iter()
                    .filter(|r| r.contains("KUBE-"))
                    .map(|r| format!("{table}/{chain}: {r}")),
            );
        }
    }
    found
}

#[test]
fn jumps_are_inserted_once_in_upstreams_order() {
    let scenario = simple();
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    sync(&mut proxier, &replay, &step, true);
    let mut lock = fake.lock();
    let input = lock
        .chain(IpFamily::V4, Table::Filter, "INPUT")
        .unwrap()
        .clone();
    // Each jump was prepended in list order: the last one of a chain comes first; the
    // localnet chain's jump (localhost NodePorts are on by default) comes last of all.
    let targets: Vec<&str> = input
        .iter()
        .map(|r| r.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "KUBE-FIREWALL",
            "KUBE-PROXY-FIREWALL",
            "KUBE-NODEPORTS",
            "KUBE-EXTERNAL-SERVICES"
        ]
    );
    for jump in JUMPS {
        let rules = lock.table(IpFamily::V4, jump.table).chains[jump.from].clone();
        let count = rules
            .iter()
            .filter(|r| jump.matches(&format!("-A {} {r}", jump.from)))
            .count();
        assert_eq!(count, 1, "{jump:?}");
    }
    assert!(
        lock.chain(IpFamily::V4, Table::Mangle, "KUBE-PROXY-CANARY")
            .is_some()
    );
}

#[test]
fn a_flushed_nat_table_is_noticed_and_the_next_sync_repairs_it() {
    let scenario = simple();
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    let synced = fake.lock().table(IpFamily::V4, Table::Nat).clone();
    assert!(!proxier.check_flushed(), "nothing happened yet");

    // `iptables -t nat -F`: chains stay (the canary too), every rule is gone.
    fake.lock().flush(IpFamily::V4, Table::Nat);
    assert!(proxier.needs_full_resync());
    // Even asked for a partial sync, the proxier syncs fully.
    let step = replay.apply(&scenario.states[1]);
    sync(&mut proxier, &replay, &step, false);
    assert_eq!(fake.lock().table(IpFamily::V4, Table::Nat).clone(), synced);
    assert!(!proxier.check_flushed());

    // A firewall reload: every chain deleted, canary included.
    fake.lock().wipe(IpFamily::V4, Table::Mangle);
    fake.lock().wipe(IpFamily::V4, Table::Nat);
    fake.lock().wipe(IpFamily::V4, Table::Filter);
    assert!(proxier.check_flushed());
    sync(&mut proxier, &replay, &step, false);
    assert_eq!(fake.lock().table(IpFamily::V4, Table::Nat).clone(), synced);
    assert!(!proxier.check_flushed());
}

#[test]
fn stale_chains_left_in_the_kernel_are_deleted_by_a_full_sync() {
    let scenario = simple();
    let fake = SharedFake::default();
    fake.lock()
        .restore(
            IpFamily::V4,
            "*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:OTHER - [0:0]\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\nCOMMIT\n",
        )
        .unwrap();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    let mut lock = fake.lock();
    let nat = lock.table(IpFamily::V4, Table::Nat);
    assert!(!nat.chains.contains_key("KUBE-SVC-AAAAAAAAAAAAAAAA"));
    assert!(!nat.chains.contains_key("KUBE-SEP-BBBBBBBBBBBBBBBB"));
    assert!(nat.chains.contains_key("OTHER"), "chains not ours stay");
}

#[test]
fn udp_endpoint_changes_clean_conntrack_after_the_sync() {
    let before = [
        service_yaml("dns", "172.30.0.10", "UDP"),
        slice_yaml("dns", &["10.180.0.1", "10.180.0.2"], "UDP"),
    ]
    .concat();
    let after = [
        service_yaml("dns", "172.30.0.10", "UDP"),
        slice_yaml("dns", &["10.180.0.2"], "UDP"),
    ]
    .concat();
    let scenario = Scenario::parse(&scenario_yaml(&[
        service_yaml("dns", "172.30.0.10", "UDP"),
        before,
        after,
    ]));
    let fake = SharedFake::default();
    let (mut proxier, conntrack) = new_proxier(&fake);
    let mut replay = scenario.replay();
    // A flow from before the agent started, translated to an endpoint the service no
    // longer has, and a TCP one.
    let old = udp_entry("10.0.0.2:40000", "172.30.0.10:80", "10.180.0.9:80");
    let tcp = entry(
        IPPROTO_TCP,
        "10.0.0.2:40001",
        "172.30.0.10:80",
        "10.180.0.1:80",
    );
    conntrack.table().entries = vec![old, tcp];
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    assert_eq!(conntrack.table().lists, 1, "the first sync reconciles");
    assert_eq!(conntrack.entries(), vec![tcp]);

    // First endpoints: a flow left untranslated meanwhile goes, so that its next datagram
    // is balanced.
    let untranslated = udp_entry("10.0.0.2:40004", "172.30.0.10:80", "172.30.0.10:80");
    conntrack.table().entries.push(untranslated);
    let step = replay.apply(&scenario.states[1]);
    sync(&mut proxier, &replay, &step, false);
    assert_eq!(conntrack.entries(), vec![tcp]);

    // An endpoint gone: the flows translated to it go, the others stay.
    let via_1 = udp_entry("10.0.0.2:40002", "172.30.0.10:80", "10.180.0.1:80");
    let via_2 = udp_entry("10.0.0.2:40003", "172.30.0.10:80", "10.180.0.2:80");
    conntrack.table().entries.extend([via_1, via_2]);
    let step = replay.apply(&scenario.states[2]);
    sync(&mut proxier, &replay, &step, false);
    let mut expected = vec![tcp, via_2];
    expected.sort();
    assert_eq!(conntrack.entries(), expected);
    assert_eq!(conntrack.table().lists, 3);
}

#[test]
fn cleanup_removes_everything_and_can_run_twice() {
    let scenario = Scenario::parse(
        &std::fs::read_to_string(super::scenario::scenarios_dir().join("a1-overall.yaml")).unwrap(),
    );
    let fake = SharedFake::default();
    // Someone else's rules survive.
    fake.lock()
        .restore(
            IpFamily::V4,
            "*filter\n:OTHER - [0:0]\n-A INPUT -j OTHER\nCOMMIT\n",
        )
        .unwrap();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    assert!(!kube_chains(&fake, IpFamily::V4).is_empty());

    let mut backend = fake.clone();
    let report = cleanup_with(&mut backend, &[IpFamily::V4, IpFamily::V6]).unwrap();
    assert!(report.chains_deleted > 10 && report.rules_deleted >= JUMPS.len());
    assert_eq!(kube_chains(&fake, IpFamily::V4), Vec::<String>::new());
    assert_eq!(
        fake.lock()
            .chain(IpFamily::V4, Table::Filter, "INPUT")
            .unwrap(),
        &vec!["-j OTHER".to_string()]
    );
    let again = cleanup_with(&mut backend, &[IpFamily::V4, IpFamily::V6]).unwrap();
    assert_eq!(again.chains_deleted, 0);
}

#[test]
fn large_clusters_drop_endpoint_comments() {
    let ips: Vec<String> = (0..1001)
        .map(|i| format!("10.181.{}.{}", i / 250, i % 250 + 1))
        .collect();
    let ip_refs: Vec<&str> = ips.iter().map(String::as_str).collect();
    let objects = [
        service_yaml("big", "172.30.0.41", "TCP"),
        slice_yaml("big", &ip_refs, "TCP"),
    ]
    .concat();
    let scenario = Scenario::parse(&scenario_yaml(&[objects]));
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    let input = proxier.last_restore_input(IpFamily::V4).unwrap();
    let sep_rules: Vec<&str> = input
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SEP-"))
        .collect();
    assert_eq!(sep_rules.len(), 2002);
    assert!(sep_rules.iter().all(|l| !l.contains("--comment")));
    // Top-level rules keep theirs.
    assert!(input.contains("--comment \"ns/big:p cluster IP\""));
    // 1/1001 .. 1/2: upstream's ten-digit probabilities.
    assert!(input.contains("--probability 0.0009990010 "));
    assert!(input.contains("--probability 0.5000000000 "));
}

#[test]
fn ipv6_uses_its_own_family_and_never_localhost_nodeports() {
    let yaml = "name: v6
node: {name: test-node, addresses: ['fd00:1::2/64'], podCIDR: 'fd00:10::/64'}
config: {clusterCIDR: 'fd00:10::/64'}
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: svc1, namespace: ns1}
  spec:
    type: NodePort
    clusterIP: fd00:30::41
    clusterIPs: [fd00:30::41]
    ipFamilies: [IPv6]
    ports: [{name: p80, port: 80, protocol: TCP, targetPort: 80, nodePort: 3001}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-1, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv6
  endpoints: [{addresses: ['fd00:10::1'], conditions: {ready: true}}]
  ports: [{name: p80, port: 80, protocol: TCP}]
";
    let scenario = Scenario::parse(yaml);
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    let input = proxier.last_restore_input(IpFamily::V6).unwrap();
    assert!(input.contains("-j DNAT --to-destination [fd00:10::1]:80"));
    assert!(input.contains("-s fd00:10::1 -j KUBE-MARK-MASQ"));
    assert!(input.contains("! -s fd00:10::/64 -j KUBE-MARK-MASQ"));
    assert!(input.contains("-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS"));
    assert!(!input.contains("KUBE-FIREWALL"));
    let v4 = proxier.last_restore_input(IpFamily::V4).unwrap();
    assert!(!v4.contains("fd00"), "IPv4 rules carry no IPv6 service");
    assert!(fake.lock().restores.iter().any(|(f, _)| *f == IpFamily::V6));
}

#[test]
fn a_full_sync_reads_nat_jumps_from_its_own_save() {
    let scenario = simple();
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    fake.lock().calls.clear();
    // A flush of the nat jumps: the next full sync must see it in the table it saved.
    fake.lock()
        .table(IpFamily::V4, Table::Nat)
        .chains
        .insert("PREROUTING".into(), Vec::new());
    sync(&mut proxier, &replay, &step, true);
    let lock = fake.lock();
    assert!(
        !lock
            .calls
            .iter()
            .any(|c| c.starts_with("list") && c.contains("nat")),
        "nat chains listed again after the save: {:?}",
        lock.calls
    );
    assert!(
        lock.calls
            .iter()
            .any(|c| c.starts_with("save") && c.contains("nat")),
        "{:?}",
        lock.calls
    );
    drop(lock);
    let prerouting = fake
        .lock()
        .chain(IpFamily::V4, Table::Nat, "PREROUTING")
        .cloned()
        .unwrap_or_default();
    assert!(
        prerouting.iter().any(|r| r.contains("-j KUBE-SERVICES")),
        "the flushed jump is back: {prerouting:?}"
    );
}
