// SPDX-License-Identifier: Apache-2.0
//! Issue 9, "Full maps": an ebpf agent whose service map is too small for the cluster
//! programs what fits and reports the rest, and a restart with a bigger map takes the rest
//! in without dropping a flow.
//!
//! Five services, then six, for a service map of eight entries that may not grow (its
//! ceiling, `ebpf.mapSizeLimits`, is its size): the two first by name (a
//! NodePort one of five entries and a ClusterIP one of three) are programmed and answer,
//! the others are left out and reported (the metric, a warning in the log, a `MapFull`
//! Warning event on the Node), and the entries of the programmed ones never change. The
//! agent is then restarted with room for all (and a bigger conntrack map): every service is
//! programmed, the maps were resized with their entries and ids, and a NodePort connection
//! from an external client, opened before the restart, answers throughout.

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::Path,
    process::Child,
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime},
};

use crate::clients::STREAM_CLIENT;
use proxy_common::{Ct4Key, CtValue};
use serde_json::{Map, Value, json};
use tests::{
    node_harness::{MapEntry, TestNode, bpftool, node_yaml, scenario_header, service_yaml},
    python_backend::{python, start_backend, watch},
    require_root,
    scenario::{Mode, topology::Topology},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const NODE: &str = "fm-node";
const NODE_IP: &str = "192.168.0.2";
const CLIENT: &str = "10.0.0.2";
const EXTERNAL_CLIENT: &str = "203.0.113.2";
const NODE_PORT: u16 = 30001;
/// svc-a (NodePort: ClusterIP and NodePort frontends, two entries each, and the
/// ClusterIP's wildcard) and svc-b (three): exactly the small map.
const SMALL_SERVICE_MAP: u32 = 8;
const SMALL_CONNTRACK: u32 = 1024;
const BIG_SERVICE_MAP: u32 = 64;
const BIG_CONNTRACK: u32 = 4096;

/// (name, ClusterIP, backend); svc-a is the NodePort one.
const SERVICES: [(&str, &str, &str); 6] = [
    ("svc-a", "172.30.0.51", "10.180.0.1"),
    ("svc-b", "172.30.0.52", "10.180.0.2"),
    ("svc-c", "172.30.0.53", "10.180.0.3"),
    ("svc-d", "172.30.0.54", "10.180.0.4"),
    ("svc-e", "172.30.0.55", "10.180.0.5"),
    ("svc-f", "172.30.0.56", "10.180.0.6"),
];

/// The node and the first `services` services.
fn objects(services: usize) -> String {
    let mut out = node_yaml(NODE, NODE_IP);
    for (i, (name, vip, backend)) in SERVICES.iter().take(services).enumerate() {
        let node_port = (i == 0).then_some(NODE_PORT);
        out += &service_yaml(name, vip, "TCP", backend, NODE, node_port);
    }
    out
}

fn values(yaml: &str) -> Vec<Value> {
    serde_yaml::from_str(yaml).unwrap()
}

/// The flows only place the pods and the external client (they are never replayed).
fn build_node() -> TestNode {
    let mut flows: String = SERVICES
        .iter()
        .take(5)
        .map(|(_, vip, backend)| {
            format!("- {{from: {CLIENT}, to: \"{vip}:80\", expect: [\"{backend}:9000\"]}}\n")
        })
        .collect();
    flows += &format!(
        "- {{from: {EXTERNAL_CLIENT}, to: \"{NODE_IP}:{NODE_PORT}\", expect: [\"{}:9000\"]}}\n",
        SERVICES[0].2
    );
    TestNode::build(
        "full-maps",
        &scenario_header("full-maps", NODE),
        &objects(5),
        &flows,
    )
    .unwrap()
}

/// Maps of `services` slots; with `fixed`, the service maps do not grow (their ceiling is
/// their size: see map_growth.rs for maps that grow).
fn map_sizes(services: u32, conntrack: u32, fixed: bool) -> Map<String, Value> {
    let mut ebpf = json!({"mapSizes": {"services": services, "conntrack": conntrack}});
    if fixed {
        ebpf["mapSizeLimits"] = json!({"services": services});
    }
    let mut overrides = Map::new();
    overrides.insert("ebpf".into(), ebpf);
    overrides
}

/// New connections in a loop, one every 50 ms until killed: prints each backend that
/// answered, or the error.
const CONNECT_LOOP: &str = r#"
import socket, sys, time
while True:
    t = time.time()
    try:
        s = socket.create_connection((sys.argv[1], 80), timeout=1)
        s.sendall(b"hello\n")
        print("ok %.3f %s" % (t, s.makefile().readline().split()[0]), flush=True)
        s.close()
    except Exception as e:
        print("ERR %.3f %s" % (t, e), flush=True)
    time.sleep(0.05)
"#;

/// A one-shot connection: prints the backend that answered, or the error.
const ONE_SHOT: &str = r#"
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], 80), timeout=2)
    s.sendall(b"hello\n")
    print(s.makefile().readline().split()[0])
except Exception as e:
    print("ERR %s" % e)
"#;

/// Stops a watched client; returns its answers `(time, backend)` after checking that none
/// failed.
fn answers(mut child: Child, rx: &mpsc::Receiver<String>, what: &str) -> Vec<(f64, String)> {
    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<String> = rx.try_iter().collect();
    assert!(
        lines.iter().all(|l| !l.starts_with("ERR")),
        "{what} failed: {lines:#?}"
    );
    lines
        .iter()
        .filter_map(|l| {
            let mut w = l.strip_prefix("ok ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.to_string()))
        })
        .collect()
}

/// A conntrack entry no packet matches (its client is in a documentation range): only a
/// copy carries it through a resize, whereas the dataplane re-creates the entries of a
/// live flow by itself. `(key, value)` in hex bytes, as bpftool takes them.
fn conntrack_marker() -> (Vec<String>, Vec<String>) {
    let node: Ipv4Addr = NODE_IP.parse().unwrap();
    let mut key = vec![198, 51, 100, 9];
    key.extend(node.octets());
    key.extend(40000u16.to_be_bytes());
    key.extend(NODE_PORT.to_be_bytes());
    key.extend([6, 0, 0, 0]);
    assert_eq!(key.len(), size_of::<Ct4Key>());
    let mut value = vec![0u8; size_of::<CtValue>()];
    value[..4].copy_from_slice(&node.octets());
    // Far in the future, so that no collection removes it.
    let expires = std::mem::offset_of!(CtValue, expires);
    value[expires..expires + 4].copy_from_slice(&0x7fff_ffffu32.to_ne_bytes());
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect();
    (hex(&key), hex(&value))
}

/// The formatted value of the CT4 entry with raw key `key`.
fn conntrack_value(node: &TestNode, key: &[String]) -> Option<Value> {
    node.map_entries("CT4_V1")
        .unwrap()
        .into_iter()
        .find(|e| e.raw_key == key)
        .map(|e| e.value)
}

fn one_shot(topology: &Topology, vip: &str) -> String {
    let out = python(topology, CLIENT, ONE_SHOT, &[vip]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The agent's /metrics page, fetched inside the node namespace.
fn metrics(node: &TestNode) -> String {
    node.output(
        "python3",
        &[
            "-c",
            "import urllib.request; \
             print(urllib.request.urlopen('http://127.0.0.1:10249/metrics', timeout=2).read().decode())",
        ],
    )
    .unwrap()
}

fn not_programmed(node: &TestNode) -> Option<u64> {
    metrics(node)
        .lines()
        .find_map(|l| l.strip_prefix("kubeproxy_ebpf_services_not_programmed "))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls until the metric says `want` (a sync may still be on its way).
fn wait_not_programmed(node: &TestNode, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = not_programmed(node);
        if seen == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "kubeproxy_ebpf_services_not_programmed is {seen:?}, not {want}:\n{}",
            metrics(node)
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// The ClusterIPs with a frontend in SVC4 (keys hold addresses in network byte order,
/// which BTF prints as native integers; the NodePort frontend's address is 0.0.0.0).
fn programmed_vips(node: &TestNode) -> BTreeSet<Ipv4Addr> {
    node.map_entries("SVC4_V2")
        .unwrap()
        .iter()
        .filter_map(|e| e.key["addr"].as_u64())
        .filter_map(|raw| u32::try_from(raw).ok())
        .map(|raw| Ipv4Addr::from(raw.to_ne_bytes()))
        .filter(|ip| !ip.is_unspecified())
        .collect()
}

fn vips(services: &[(&str, &str, &str)]) -> BTreeSet<Ipv4Addr> {
    services
        .iter()
        .map(|(_, vip, _)| vip.parse().unwrap())
        .collect()
}

/// The programmed entries of the maps the services fill, `key => value`.
fn lb_entries(node: &TestNode) -> BTreeSet<String> {
    ["SVC4_V2", "BACKENDS4_V1", "REV_NAT4_V2"]
        .iter()
        .flat_map(|map| {
            node.map_entries(map)
                .unwrap()
                .iter()
                .map(|e| format!("{map} {}", e.formatted()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The raw keys of the north-south conntrack entries (their values carry timestamps).
fn conntrack_keys(node: &TestNode) -> BTreeSet<Vec<String>> {
    node.map_entries("CT4_V1")
        .unwrap()
        .into_iter()
        .map(|e: MapEntry| e.raw_key)
        .collect()
}

fn max_entries(node: &TestNode, map: &str) -> u64 {
    let path = node.pinned_map(map).display().to_string();
    let text = node
        .output("bpftool", &["-j", "map", "show", "pinned", &path])
        .unwrap();
    let info: Value = serde_json::from_str(&text).unwrap();
    info["max_entries"].as_u64().unwrap_or(0)
}

fn map_full_events(node: &TestNode) -> Vec<Value> {
    node.source
        .store()
        .server()
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "MapFull")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_maps_program_what_fits_and_a_restart_with_room_takes_the_rest_without_a_gap() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let mut node = build_node();
    let runner = Path::new(RUNNER);
    let mut backends: Vec<Child> = SERVICES
        .iter()
        .take(5)
        .map(|(_, _, backend)| start_backend(&node.topology, backend))
        .collect();

    // Small maps: the agent stays up and programs what fits, in name order.
    let mut first = node
        .start_agent(
            Mode::Ebpf,
            map_sizes(SMALL_SERVICE_MAP, SMALL_CONNTRACK, true),
            true,
            runner,
        )
        .await
        .unwrap();
    wait_not_programmed(&node, 3);
    assert_eq!(programmed_vips(&node), vips(&SERVICES[..2]));
    assert!(node.map_entries("SVC4_V2").unwrap().len() <= SMALL_SERVICE_MAP as usize);
    assert_eq!(
        one_shot(&node.topology, SERVICES[1].1),
        format!("{}:9000", SERVICES[1].2)
    );

    // A connection from outside through the NodePort, watched from a thread until the end.
    let (stream, stream_rx) = watch(python(
        &node.topology,
        EXTERNAL_CLIENT,
        STREAM_CLIENT,
        &[NODE_IP, &NODE_PORT.to_string()],
    ));
    let first_answer = stream_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        first_answer.starts_with("ok ") && first_answer.contains(SERVICES[0].2),
        "{first_answer}"
    );

    // One more service while the map is full: it is refused, nothing programmed changes.
    let programmed = lb_entries(&node);
    node.apply_and_sync(&mut first, &values(&objects(6)))
        .await
        .unwrap();
    wait_not_programmed(&node, 4);
    assert_eq!(lb_entries(&node), programmed);

    // The report: a warning in the log naming the full map, a MapFull event on the Node.
    let log = std::fs::read_to_string(&first.log).unwrap();
    let warning = log
        .lines()
        .find(|l| l.contains("BPF maps full"))
        .unwrap_or_else(|| panic!("no full-map warning in the log:\n{log}"));
    assert!(
        tests::scenario::agent::klog_severity(warning) == Some('W')
            && warning.contains("SVC4_V2")
            && warning.contains("ns1/svc-c"),
        "{warning}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while map_full_events(&node).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = map_full_events(&node);
    assert_eq!(events.len(), 1, "one event (rate-limited): {events:#?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["regarding"]["kind"], "Node");
    assert_eq!(events[0]["regarding"]["name"], NODE);
    let note = events[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("SVC4_V2") && note.contains("ebpf.mapSizeLimits.services"),
        "{note}"
    );
    assert!(note.contains("ns1/svc-c"), "{note}");

    // Restart with room for everything, as an operator would: SIGTERM, new configuration;
    // meanwhile a pod opens connections to svc-a's ClusterIP without pause.
    let conntrack = conntrack_keys(&node);
    assert!(!conntrack.is_empty(), "the NodePort flow is tracked");
    let (marker_key, marker_value) = conntrack_marker();
    let ct4 = node.pinned_map("CT4_V1").display().to_string();
    let mut update = vec!["map", "update", "pinned", &ct4, "key", "hex"];
    update.extend(marker_key.iter().map(String::as_str));
    update.extend(["value", "hex"]);
    update.extend(marker_value.iter().map(String::as_str));
    bpftool(&update);
    let marker = conntrack_value(&node, &marker_key).expect("the marker is in CT4");
    let (connects, connects_rx) = watch(python(
        &node.topology,
        CLIENT,
        CONNECT_LOOP,
        &[SERVICES[0].1],
    ));
    thread::sleep(Duration::from_millis(500));
    first.stop();
    let restarted_at = SystemTime::now();
    let second = node
        .start_agent(
            Mode::Ebpf,
            map_sizes(BIG_SERVICE_MAP, BIG_CONNTRACK, false),
            false,
            runner,
        )
        .await
        .unwrap();
    wait_not_programmed(&node, 0);
    assert_eq!(programmed_vips(&node), vips(&SERVICES));
    assert_eq!(max_entries(&node, "SVC4_V2"), u64::from(BIG_SERVICE_MAP));
    assert_eq!(max_entries(&node, "CT4_V1"), u64::from(BIG_CONNTRACK));
    let log = std::fs::read_to_string(&second.log).unwrap();
    for map in ["SVC4_V2", "CT4_V1"] {
        assert!(
            log.lines()
                .any(|l| l.contains("map resized") && l.contains(map)),
            "{map} resized:\n{log}"
        );
    }
    // Nothing was flushed: every entry (and id) programmed before is still there.
    let after = lb_entries(&node);
    let lost: Vec<&String> = programmed.difference(&after).collect();
    assert!(lost.is_empty(), "entries lost in the restart: {lost:#?}");
    let ct_after = conntrack_keys(&node);
    assert!(
        conntrack.is_subset(&ct_after),
        "conntrack entries lost: {conntrack:#?} vs {ct_after:#?}"
    );
    assert_eq!(
        conntrack_value(&node, &marker_key),
        Some(marker),
        "conntrack entries were copied into the resized map"
    );
    assert_eq!(
        one_shot(&node.topology, SERVICES[2].1),
        format!("{}:9000", SERVICES[2].2),
        "a service refused before answers now"
    );

    // The connections opened before the restart answered throughout, and still do; every
    // new connection during the restart found svc-a.
    thread::sleep(Duration::from_secs(1));
    let restart_secs = restarted_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let backend_a = format!("{}:9000", SERVICES[0].2);
    let connected = answers(connects, &connects_rx, "a new connection to svc-a");
    assert!(
        connected.iter().any(|(t, _)| *t > restart_secs + 0.5),
        "new connections after the restart: {connected:#?}"
    );
    assert!(
        connected.iter().all(|(_, b)| *b == backend_a),
        "{connected:#?}"
    );
    let streamed = answers(stream, &stream_rx, "the NodePort connection");
    assert!(
        streamed.iter().any(|(t, _)| *t > restart_secs + 0.5),
        "answers after the restart: {streamed:#?}"
    );
    assert!(
        streamed.iter().all(|(_, b)| b.starts_with(SERVICES[0].2)),
        "always the same backend: {streamed:#?}"
    );
    let longest_gap = streamed
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(0.0, f64::max);
    assert!(
        longest_gap < 1.0,
        "no stall longer than a second (saw {longest_gap:.3} s)"
    );

    for b in &mut backends {
        let _ = b.kill();
        let _ = b.wait();
    }
}
