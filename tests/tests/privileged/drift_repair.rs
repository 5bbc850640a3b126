// SPDX-License-Identifier: Apache-2.0
//! Dataplane state deleted or altered behind the agent's back is repaired within one sync
//! period (issue: reliability, "drift"): with `syncPeriod: 2s`,
//! - ebpf: a frontend's slot 0 and its backend deleted with `bpftool map delete`, and a
//!   second frontend's backend count rewritten with `bpftool map update`, come back
//!   exactly as they were;
//! - iptables: a service's jump in KUBE-SERVICES deleted and its endpoint chain flushed
//!   with `iptables` come back exactly as they were;
//! - ipvs (`ipvs.syncPeriod`, stretched by `SCENARIO_TIME_SCALE` where the machine is
//!   slow): a real server deleted with `ipvsadm -d` and a whole virtual server deleted
//!   with `ipvsadm -D` come back exactly as they were. Where the kernel has no IPVS it
//!   skips with the reason; the qemu guest (tests/tests/vm_guest.rs,
//!   `guest::ipvs_scenarios`) runs it.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use tests::{
    node_harness::{
        MapEntry, TestNode, bpftool, node_yaml, scenario_header, service_yaml, time_scale,
    },
    require_root,
    scenario::Mode,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");
const SYNC_PERIOD: Duration = Duration::from_secs(2);
/// A sync takes a little time of its own, and the poll is not instantaneous.
const SLACK: Duration = Duration::from_secs(2);

fn node(name: &str) -> TestNode {
    let objects = [
        node_yaml("drift-node", "192.168.0.2"),
        service_yaml(
            "svc0",
            "172.30.0.61",
            "TCP",
            "10.182.0.1",
            "drift-node",
            None,
        ),
        service_yaml(
            "svc1",
            "172.30.0.62",
            "TCP",
            "10.182.0.2",
            "drift-node",
            None,
        ),
    ]
    .concat();
    TestNode::build(
        name,
        &scenario_header(name, "drift-node"),
        &objects,
        "- {from: 10.0.0.2, to: \"172.30.0.61:80\", expect: [\"10.182.0.1:9000\"]}\n\
         - {from: 10.0.0.2, to: \"172.30.0.62:80\", expect: [\"10.182.0.2:9000\"]}",
    )
    .unwrap()
}

fn fast_periodic_sync() -> Map<String, Value> {
    periodic_sync("iptables", SYNC_PERIOD)
}

/// `section.syncPeriod: period` (the mode's own section: ebpf mode reads iptables').
fn periodic_sync(section: &str, period: Duration) -> Map<String, Value> {
    let mut overrides = Map::new();
    overrides.insert(
        section.into(),
        json!({"syncPeriod": format!("{}s", period.as_secs()), "minSyncPeriod": "0s"}),
    );
    overrides
}

/// Polls `read` until it returns `want`, for at most one sync period plus slack; returns
/// how long it took.
fn wait_for<T: PartialEq + std::fmt::Debug>(want: &T, read: impl FnMut() -> T) -> Duration {
    wait_within(SYNC_PERIOD + SLACK, want, read)
}

fn wait_within<T: PartialEq + std::fmt::Debug>(
    limit: Duration,
    want: &T,
    mut read: impl FnMut() -> T,
) -> Duration {
    let start = Instant::now();
    loop {
        let seen = read();
        if &seen == want {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!("not repaired within {limit:?}:\nwant {want:#?}\nseen {seen:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn formatted(node: &TestNode, map: &str) -> BTreeSet<String> {
    node.map_entries(map)
        .unwrap()
        .iter()
        .map(MapEntry::formatted)
        .collect()
}

/// Runs `bpftool map <verb> pinned <map> key hex <key> [value hex <value>]`.
fn map_op(verb: &str, map: &str, key: &[String], value: Option<&[String]>) {
    let mut args = vec!["map", verb, "pinned", map, "key", "hex"];
    args.extend(key.iter().map(String::as_str));
    if let Some(value) = value {
        args.extend(["value", "hex"]);
        args.extend(value.iter().map(String::as_str));
    }
    bpftool(&args);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebpf_map_entries_deleted_or_altered_are_repaired() {
    require_root!();
    let node = node("drift-ebpf");
    let _agent = node
        .start_agent(Mode::Ebpf, fast_periodic_sync(), false, Path::new(RUNNER))
        .await
        .unwrap();
    let svc_map = node.pinned_map("SVC4_V2").display().to_string();
    let backend_map = node.pinned_map("BACKENDS4_V1").display().to_string();
    let services = node.map_entries("SVC4_V2").unwrap();
    let before = (
        formatted(&node, "SVC4_V2"),
        formatted(&node, "BACKENDS4_V1"),
    );
    assert!(before.1.len() >= 2, "{before:#?}");

    // Keys hold addresses and ports in network byte order: BTF prints them as native
    // integers. Port 0 entries are the ClusterIP wildcards; the service port is 80.
    let entry = |vip: [u8; 4], slot: u64| {
        let addr = u64::from(u32::from_ne_bytes(vip));
        let port = u64::from(80u16.to_be());
        services
            .iter()
            .find(|e| e.key["slot"] == slot && e.key["addr"] == addr && e.key["dport"] == port)
            .unwrap_or_else(|| panic!("slot {slot} of {vip:?} in {services:#?}"))
            .clone()
    };
    // Frontend 1 loses its slot 0 and its backend; frontend 2's slot 0 is overwritten.
    let first_slot0 = entry([172, 30, 0, 61], 0).raw_key;
    let first_slot1 = entry([172, 30, 0, 61], 1).value;
    let second_slot0 = entry([172, 30, 0, 62], 0).raw_key;
    let backend_id = u32::try_from(first_slot1["backend_id"].as_u64().unwrap()).unwrap();
    let backend_key: Vec<String> = backend_id
        .to_ne_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    map_op("delete", &svc_map, &first_slot0, None);
    map_op("delete", &backend_map, &backend_key, None);
    let garbage = vec!["ff".to_string(); raw_value_len(&node, &svc_map)];
    map_op("update", &svc_map, &second_slot0, Some(&garbage));
    let broken = (
        formatted(&node, "SVC4_V2"),
        formatted(&node, "BACKENDS4_V1"),
    );
    assert_ne!(broken.0, before.0);
    assert_ne!(broken.1, before.1);

    let took = wait_for(&before, || {
        (
            formatted(&node, "SVC4_V2"),
            formatted(&node, "BACKENDS4_V1"),
        )
    });
    eprintln!("ebpf maps repaired after {took:?}");
}

/// The value size of a pinned map, from `bpftool map show`.
fn raw_value_len(node: &TestNode, pinned: &str) -> usize {
    let text = node
        .output("bpftool", &["-j", "map", "show", "pinned", pinned])
        .unwrap();
    let info: Value = serde_json::from_str(&text).unwrap();
    info["bytes_value"].as_u64().unwrap_or(0) as usize
}

fn kube_rules(node: &TestNode) -> BTreeSet<String> {
    node.output("iptables-save", &["-t", "nat"])
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("-A KUBE-") || l.starts_with(":KUBE-"))
        .map(|l| {
            // Chain declarations carry packet counters; the rules are what matter.
            l.split(" [").next().unwrap_or(l).to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_rules_deleted_behind_the_agents_back_are_repaired() {
    require_root!();
    let node = node("drift-ipt");
    let _agent = node
        .start_agent(
            Mode::Iptables,
            fast_periodic_sync(),
            false,
            Path::new(RUNNER),
        )
        .await
        .unwrap();
    let rules = kube_rules(&node);
    let jump = rules
        .iter()
        .find(|r| r.starts_with("-A KUBE-SERVICES") && r.contains("172.30.0.61/32"))
        .unwrap_or_else(|| panic!("a KUBE-SERVICES rule for the ClusterIP: {rules:#?}"))
        .clone();
    let sep = rules
        .iter()
        .find(|r| r.starts_with(":KUBE-SEP-"))
        .and_then(|r| r.trim_start_matches(':').split_whitespace().next())
        .unwrap_or_else(|| panic!("an endpoint chain: {rules:#?}"))
        .to_string();
    // The rule as iptables-save prints it is valid iptables syntax once -A becomes -D;
    // a shell parses its quoted comment.
    let delete = format!("iptables -t nat -D{}", jump.trim_start_matches("-A"));
    assert!(node.output("sh", &["-c", &delete]).is_ok());
    node.output("iptables", &["-t", "nat", "-F", &sep]).unwrap();
    let broken = kube_rules(&node);
    assert!(!broken.contains(&jump), "the jump is gone: {broken:#?}");
    assert!(
        !broken.iter().any(|r| r.starts_with(&format!("-A {sep} "))),
        "the endpoint chain is empty: {broken:#?}"
    );

    let took = wait_for(&rules, || kube_rules(&node));
    eprintln!("iptables rules repaired after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_servers_deleted_behind_the_agents_back_are_repaired() {
    require_root!();
    tests::require_ipvs!();
    // The guest's emulated CPU is 10-60x slower: one sync there takes seconds.
    let period = SYNC_PERIOD * time_scale();
    let slack = SLACK * time_scale();
    let node = node("drift-ipvs");
    let agent = node
        .start_agent(
            Mode::Ipvs,
            periodic_sync("ipvs", period),
            false,
            Path::new(RUNNER),
        )
        .await
        .unwrap();
    agent.check_running_mode(Mode::Ipvs).await.unwrap();
    let table = node.ipvs_table().unwrap();
    let real_server = "TCP 172.30.0.61:80 -> 10.182.0.1:9000 Masq 1";
    let second = "TCP 172.30.0.62:80";
    assert!(
        table.contains(real_server) && table.iter().any(|l| l.starts_with(&format!("{second} rr"))),
        "{table:#?}"
    );

    // Failures show as the listing below still holding what was deleted.
    node.output(
        "ipvsadm",
        &["-d", "-t", "172.30.0.61:80", "-r", "10.182.0.1:9000"],
    )
    .unwrap();
    node.output("ipvsadm", &["-D", "-t", "172.30.0.62:80"])
        .unwrap();
    let broken = node.ipvs_table().unwrap();
    assert!(
        !broken.contains(real_server),
        "the real server is gone: {broken:#?}"
    );
    assert!(
        !broken.iter().any(|l| l.starts_with(second)),
        "the virtual server is gone: {broken:#?}"
    );

    let took = wait_within(period + slack, &table, || node.ipvs_table().unwrap());
    eprintln!("ipvs servers repaired after {took:?} (sync period {period:?})");
}
