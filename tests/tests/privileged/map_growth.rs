// SPDX-License-Identifier: Apache-2.0
//! Issue 20, "Maps that grow by themselves": an ebpf agent started with small maps takes
//! a cluster that outgrows them without a restart and without a failed connection.
//!
//! The agent starts with room for 256 service slots, 256 backends and 64 frontends, and
//! one NodePort service that real backends answer. While a pod connects to its ClusterIP
//! without pause (a line each way per connection), an outside client does the same through
//! the NodePort, and a long-lived NodePort connection exchanges a line every 100 ms, the
//! cluster grows by batches of services of four endpoints each until the service, backend
//! and rev_nat maps have each grown at least twice. Then: the pinned maps are bigger,
//! every growth is counted and logged, every service is programmed and answers, no probe
//! failed, and the long-lived connection (tracked in the conntrack map the programs share
//! across each growth) still answers from the same backend.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    net::Ipv4Addr,
    path::Path,
    process::{Child, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime},
};

use crate::clients::STREAM_CLIENT;
use serde_json::{Map, Value, json};
use tests::{
    node_harness::{TestNode, node_yaml, scenario_header},
    python_backend::{python, watch},
    require_root,
    scenario::Mode,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const NODE: &str = "mg-node";
const NODE_IP: &str = "192.168.0.2";
const CLIENT: &str = "10.0.0.2";
const EXTERNAL_CLIENT: &str = "203.0.113.2";
const NODE_PORT: u16 = 30001;
const PROBE_VIP: &str = "172.30.0.10";
/// The pods behind every service: each listens on port 9000 (the probed service) and on
/// one port per added service.
const BACKENDS: [&str; 4] = ["10.180.0.1", "10.180.0.2", "10.180.0.3", "10.180.0.4"];
/// Added services: 120 of 6 service slots, 4 backends and one frontend each, in batches
/// of 15, so that each map crosses its high-water mark twice, one batch at a time.
const ADDED: usize = 120;
const BATCH: usize = 15;
const FIRST_PORT: u16 = 10000;

const START_SERVICES: u32 = 256;
const START_BACKENDS: u32 = 256;
const START_REV_NAT: u32 = 64;

/// A line-echo server on port 9000 and on ports `FIRST_PORT..FIRST_PORT + argv[2]` of
/// `argv[1]`: every line comes back with the server's address in front. Prints `ready`
/// once it listens on all.
const MULTI_PORT_ECHO: &str = r#"
import socket, sys, threading
def serve(c):
    own = "%s:%d" % c.getsockname()[:2]
    f = c.makefile("rwb", buffering=0)
    for line in f:
        f.write(("%s %s" % (own, line.decode())).encode())
def accept(l):
    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
ports = [9000] + list(range(10000, 10000 + int(sys.argv[2])))
for port in ports:
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((sys.argv[1], port)); l.listen(64)
    threading.Thread(target=accept, args=(l,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// New connections in a loop to `argv[1]:argv[2]`, one every 20 ms until killed, a line
/// each way: prints each backend that answered, or the error.
const CONNECT_LOOP: &str = r#"
import socket, sys, time
while True:
    t = time.time()
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
        s.sendall(b"hello\n")
        print("ok %.3f %s" % (t, s.makefile().readline().split()[0]), flush=True)
        s.close()
    except Exception as e:
        print("ERR %.3f %s" % (t, e), flush=True)
    time.sleep(0.02)
"#;

/// One connection to each address of `argv[1:]` (port 80): prints the failures.
const EVERY_SERVICE: &str = r#"
import socket, sys
for vip in sys.argv[1:]:
    try:
        s = socket.create_connection((vip, 80), timeout=2)
        s.sendall(b"hello\n")
        if not s.makefile().readline():
            print("ERR %s no answer" % vip)
        s.close()
    except Exception as e:
        print("ERR %s %s" % (vip, e))
print("done", flush=True)
"#;

fn added_vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 31, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// The four pods as the endpoints of a slice (YAML flow items).
fn endpoints_yaml() -> String {
    BACKENDS
        .iter()
        .map(|b| format!("{{addresses: [{b}], nodeName: {NODE}, conditions: {{ready: true}}}}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The probed NodePort service, backed by the four pods on port 9000.
fn probe_service() -> String {
    let endpoints = endpoints_yaml();
    format!(
        r#"- apiVersion: v1
  kind: Service
  metadata: {{name: probe, namespace: ns1}}
  spec:
    type: NodePort
    clusterIP: {PROBE_VIP}
    clusterIPs: [{PROBE_VIP}]
    ports: [{{name: p, port: 80, protocol: TCP, targetPort: 9000, nodePort: {NODE_PORT}}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: probe-1, namespace: ns1, labels: {{kubernetes.io/service-name: probe}}}}
  addressType: IPv4
  endpoints: [{}]
  ports: [{{name: p, port: 9000, protocol: TCP}}]
"#,
        endpoints
    )
}

/// Added service `i`: a ClusterIP service whose four endpoints are the pods on a port of
/// its own (so that its backends are its own).
fn added_service(i: usize) -> String {
    let vip = added_vip(i);
    let port = FIRST_PORT + i as u16;
    let endpoints = endpoints_yaml();
    format!(
        r#"- apiVersion: v1
  kind: Service
  metadata: {{name: added-{i:03}, namespace: ns1}}
  spec:
    clusterIP: {vip}
    clusterIPs: [{vip}]
    ports: [{{name: p, port: 80, protocol: TCP, targetPort: {port}}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: added-{i:03}-1, namespace: ns1, labels: {{kubernetes.io/service-name: added-{i:03}}}}}
  addressType: IPv4
  endpoints: [{}]
  ports: [{{name: p, port: {port}, protocol: TCP}}]
"#,
        endpoints
    )
}

/// The node, the probed service and the first `added` added services.
fn objects(added: usize) -> String {
    let mut out = node_yaml(NODE, NODE_IP) + &probe_service();
    for i in 0..added {
        out += &added_service(i);
    }
    out
}

fn values(yaml: &str) -> Vec<Value> {
    serde_yaml::from_str(yaml).unwrap()
}

/// The flows only place the pods and the clients (they are never replayed).
fn build_node() -> TestNode {
    let mut flows: String = BACKENDS
        .iter()
        .map(|b| format!("- {{from: {CLIENT}, to: \"{PROBE_VIP}:80\", expect: [\"{b}:9000\"]}}\n"))
        .collect();
    flows += &format!(
        "- {{from: {EXTERNAL_CLIENT}, to: \"{NODE_IP}:{NODE_PORT}\", expect: [\"{}:9000\"]}}\n",
        BACKENDS[0]
    );
    TestNode::build(
        "map-growth",
        &scenario_header("map-growth", NODE),
        &objects(0),
        &flows,
    )
    .unwrap()
}

fn small_maps() -> Map<String, Value> {
    let mut overrides = Map::new();
    overrides.insert(
        "ebpf".into(),
        json!({"mapSizes": {
            "services": START_SERVICES,
            "backends": START_BACKENDS,
            "revNat": START_REV_NAT,
        }}),
    );
    overrides
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

/// The value of the sample `name` (with its labels) on the metrics page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn growths(page: &str, map: &str) -> f64 {
    sample(
        page,
        &format!("kubeproxy_ebpf_map_growths_total{{map=\"{map}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Polls until every service is programmed (a sync may still be on its way).
fn wait_all_programmed(node: &TestNode) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = metrics(node);
        if sample(&page, "kubeproxy_ebpf_services_not_programmed") == Some(0.0) {
            return;
        }
        assert!(Instant::now() < deadline, "services left out:\n{page}");
        thread::sleep(Duration::from_millis(200));
    }
}

fn max_entries(node: &TestNode, map: &str) -> u64 {
    let path = node.pinned_map(map).display().to_string();
    let text = node
        .output("bpftool", &["-j", "map", "show", "pinned", &path])
        .unwrap();
    let info: Value = serde_json::from_str(&text).unwrap();
    info["max_entries"].as_u64().unwrap_or(0)
}

/// The ClusterIPs with a frontend in SVC4 (keys hold addresses in network byte order,
/// which BTF prints as native integers).
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

/// Stops a watched client; returns its answers `(time, backend)` after checking that none
/// failed.
fn answers(mut child: Child, rx: &mpsc::Receiver<String>, what: &str) -> Vec<(f64, String)> {
    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<String> = rx.try_iter().collect();
    let failed: Vec<&String> = lines.iter().filter(|l| l.starts_with("ERR")).collect();
    assert!(
        failed.is_empty(),
        "{what}: {} of {} failed: {failed:#?}",
        failed.len(),
        lines.len()
    );
    lines
        .iter()
        .filter_map(|l| {
            let mut w = l.strip_prefix("ok ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.to_string()))
        })
        .collect()
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maps_grow_under_load_without_a_restart_or_a_failed_connection() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let mut node = build_node();
    let runner = Path::new(RUNNER);
    let added = ADDED.to_string();
    let mut backends: Vec<Child> = BACKENDS
        .iter()
        .map(|b| {
            let mut child = python(&node.topology, b, MULTI_PORT_ECHO, &[b, &added])
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3 starts");
            let mut line = String::new();
            if let Some(out) = child.stdout.as_mut() {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            assert_eq!(line.trim(), "ready", "the backend on {b} started");
            child
        })
        .collect();

    let mut agent = node
        .start_agent(Mode::Ebpf, small_maps(), false, runner)
        .await
        .unwrap();
    wait_all_programmed(&node);
    let page = metrics(&node);
    for map in ["SVC4_V2", "BACKENDS4_V1", "REV_NAT4_V2"] {
        assert_eq!(growths(&page, map), 0.0, "{map} fits at first");
    }
    assert_eq!(max_entries(&node, "REV_NAT4_V2"), u64::from(START_REV_NAT));

    // The load: a pod's ClusterIP connections, an outside client's NodePort connections,
    // and one long-lived NodePort connection.
    let node_port = NODE_PORT.to_string();
    let (cluster_ip, cluster_ip_rx) = watch(python(
        &node.topology,
        CLIENT,
        CONNECT_LOOP,
        &[PROBE_VIP, "80"],
    ));
    let (from_outside, from_outside_rx) = watch(python(
        &node.topology,
        EXTERNAL_CLIENT,
        CONNECT_LOOP,
        &[NODE_IP, &node_port],
    ));
    let (stream, stream_rx) = watch(python(
        &node.topology,
        EXTERNAL_CLIENT,
        STREAM_CLIENT,
        &[NODE_IP, &node_port],
    ));
    let first_answer = stream_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(first_answer.starts_with("ok "), "{first_answer}");
    let stream_backend = first_answer
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string();

    // The cluster grows, a batch at a time.
    let began = Instant::now();
    for batch in 1..=ADDED / BATCH {
        node.apply_and_sync(&mut agent, &values(&objects(batch * BATCH)))
            .await
            .unwrap();
    }
    wait_all_programmed(&node);
    let grown_at = now_secs();
    eprintln!("{ADDED} services added in {:?}", began.elapsed());

    // Each map grew at least twice, counted and logged, and the pins hold the new maps.
    let page = metrics(&node);
    for (map, start) in [
        ("SVC4_V2", START_SERVICES),
        ("BACKENDS4_V1", START_BACKENDS),
        ("REV_NAT4_V2", START_REV_NAT),
    ] {
        assert!(growths(&page, map) >= 2.0, "{map} grew twice:\n{page}");
        assert!(
            max_entries(&node, map) >= 4 * u64::from(start),
            "{map}: {} entries",
            max_entries(&node, map)
        );
    }
    let log = std::fs::read_to_string(&agent.log).unwrap();
    let logged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("BPF map grown"))
        .collect();
    assert!(
        logged
            .iter()
            .any(|l| l.contains("REV_NAT4_V2") && l.contains("took_ms")),
        "growth logged:\n{log}"
    );
    eprintln!("{}", logged.join("\n"));
    assert!(!log.contains("BPF maps full"), "nothing refused:\n{log}");
    assert!(!log.contains("cannot grow"), "{log}");

    // Every service is programmed and answers.
    let vips = programmed_vips(&node);
    let wanted: BTreeSet<Ipv4Addr> = (0..ADDED).map(added_vip).collect();
    assert!(
        wanted.is_subset(&vips),
        "missing: {:?}",
        wanted.difference(&vips).collect::<Vec<_>>()
    );
    let wanted_args: Vec<String> = wanted.iter().map(ToString::to_string).collect();
    let wanted_args: Vec<&str> = wanted_args.iter().map(String::as_str).collect();
    let out = python(&node.topology, CLIENT, EVERY_SERVICE, &wanted_args)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.trim(), "done", "every added service answers:\n{out}");

    // No probe failed, before, during or after the growth; the long-lived connection
    // answered throughout from the same backend.
    thread::sleep(Duration::from_millis(500));
    for (child, rx, what) in [
        (cluster_ip, &cluster_ip_rx, "ClusterIP probe from a pod"),
        (
            from_outside,
            &from_outside_rx,
            "NodePort probe from outside",
        ),
    ] {
        let ok = answers(child, rx, what);
        eprintln!("{what}: {} probes, none failed", ok.len());
        assert!(ok.len() > 20, "{what}: only {} probes", ok.len());
        assert!(
            ok.iter().any(|(t, _)| *t > grown_at),
            "{what}: probes after the growth"
        );
    }
    let streamed = answers(stream, &stream_rx, "the long-lived NodePort connection");
    assert!(
        streamed.iter().any(|(t, _)| *t > grown_at),
        "answers after the growth: {streamed:#?}"
    );
    assert!(
        streamed.iter().all(|(_, b)| *b == stream_backend),
        "always the same backend: {streamed:#?}"
    );

    for b in &mut backends {
        let _ = b.kill();
        let _ = b.wait();
    }
}

/// Adds ClusterIP service `ns1/svc{i}` (172.16.0.1 + i, port 80) with `endpoints`
/// endpoints (up to 16) on another node to `cluster`.
fn add_clusterip_service(cluster: &mut proxy_agent::model::ClusterState, i: u32, endpoints: u32) {
    use proxy_agent::k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service};
    let name = format!("svc{i}");
    let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 1)) + i);
    let svc = mk_service("ns1", &name)
        .cluster_ip(&vip.to_string())
        .port("http", 80, "TCP")
        .build();
    cluster.service(&std::sync::Arc::new(svc), false);
    let mut slice =
        mk_endpointslice("ns1", &format!("{name}-1"), &name, "IPv4").port("http", 8080, "TCP");
    for e in 0..endpoints {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i * 16 + e);
        slice = slice.endpoint(mk_endpoint(&ip.to_string()).node("node-b").build());
    }
    cluster.endpoint_slice(&slice.build(), false);
}

/// The node the in-process proxiers of these tests run for.
fn in_process_node() -> proxy_agent::proxier::NodeContext {
    proxy_agent::proxier::NodeContext {
        name: "node-a".into(),
        host_addresses: vec!["192.168.0.2".parse().unwrap()],
        ..Default::default()
    }
}

/// An in-process ebpf proxier with the default map size limits (the maps may grow).
fn start_growable(
    opts: &proxy_agent::proxier::ebpf::LoadOptions,
) -> proxy_agent::proxier::ebpf::EbpfProxier {
    proxy_agent::proxier::ebpf::EbpfProxier::start_with_limits(
        opts,
        &proxy_agent::config::MapSizeLimits::default(),
        Default::default(),
        Default::default(),
    )
    .expect("the dataplane loads")
}

/// Applies what is pending in `cluster` and syncs it in `proxier` (full or partial), as
/// the agent does: `after` runs once the sync returned, then the proxier's `after_sync`;
/// without `after` (None) there is no `after_sync`.
fn sync_pending(
    proxier: &mut proxy_agent::proxier::ebpf::EbpfProxier,
    cluster: &mut proxy_agent::model::ClusterState,
    full: bool,
    after: Option<&mut dyn FnMut()>,
) -> proxy_agent::proxier::SyncStats {
    use proxy_agent::proxier::{Proxier, StaleConntrack, SyncRequest};
    let changes = cluster.apply_pending();
    let node = in_process_node();
    let stale = StaleConntrack::default();
    let request = SyncRequest {
        families: cluster.families(),
        node: &node,
        full,
        changed: &changes.changed,
        stale: &stale,
    };
    let stats = proxier.sync(&request).expect("the sync succeeds");
    if let Some(after) = after {
        after();
        proxier.after_sync(&request);
    }
    stats
}

/// Issue 20's scale target, measured in-process (run it in release:
/// `cargo test --release -p tests --test privileged cold_sync -- --ignored --nocapture`):
/// a cold start of the ebpf proxier from the default map sizes and limits, then the first
/// full sync of 100,000 ClusterIP services of 10 endpoints each, in a fresh network
/// namespace and cgroup. Prints the agent time of each part and what was programmed.
#[test]
#[ignore = "a measurement: minutes of setup, run by hand in release"]
fn cold_sync_of_100k_services_of_10_endpoints_from_the_default_sizes() {
    use proxy_agent::{
        model::{ClusterState, IpFamily},
        proxier::{Proxier, StaleConntrack, SyncRequest},
    };
    use tests::privileged::{TempBpffs, TempCgroup, TempNetns, load_options};
    require_root!();
    let services: u32 = std::env::var("KPE_COLD_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let endpoints: u32 = 10;
    let bpffs = TempBpffs::new("kpe-cold");
    let cgroup = TempCgroup::new("kpe-cold");
    // Debug: the proxier's "ebpf sync phases" line says where the time went.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::DEBUG)
        .try_init();

    let built = Instant::now();
    let mut cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    for i in 0..services {
        add_clusterip_service(&mut cluster, i, endpoints);
    }
    let changes = cluster.apply_pending();
    eprintln!("{services} x {endpoints} built in {:?}", built.elapsed());
    let node = in_process_node();
    let stale = StaleConntrack::default();
    let opts = load_options(&bpffs, &cgroup);
    // In a namespace of its own: the pod-side program attaches to every device but lo.
    let netns = TempNetns::new("kpe-cold");
    let (started, synced, stats) = netns.run(|| {
        let began = Instant::now();
        let mut proxier = start_growable(&opts);
        let started = began.elapsed();
        let stats = proxier
            .sync(&SyncRequest {
                families: cluster.families(),
                node: &node,
                full: true,
                changed: &changes.changed,
                stale: &stale,
            })
            .expect("the sync succeeds");
        (started, began.elapsed(), stats)
    });
    eprintln!(
        "start (load, attach) {started:?}; start + first full sync {synced:?}; \
         services programmed {}, not programmed {} ({:?}); written {}; grown: {:#?}; usage: {:#?}",
        stats.services,
        stats.not_programmed,
        stats.full_maps,
        stats.written,
        stats.map_growth,
        stats.map_usage
    );
}

/// A partial sync of thousands of services writes their backend and reverse-NAT entries
/// on another thread while it admits them, into maps that grow meanwhile (the proxier's
/// `apply::ahead`): started with room for 1,024 entries each, the proxier takes 6,000
/// services of four endpoints in one partial sync, and the full sync after it finds
/// nothing to write or delete: the maps hold exactly what the plan says, every slot's
/// backend included.
#[test]
fn a_big_partial_sync_written_ahead_into_growing_maps_leaves_nothing_for_a_full_sync() {
    use proxy_agent::model::{ClusterState, IpFamily};
    use tests::privileged::{TempBpffs, TempCgroup, TempNetns, load_options};
    require_root!();
    const SERVICES: u32 = 6_000;
    const ENDPOINTS: u32 = 4;
    let bpffs = TempBpffs::new("kpe-ahead");
    let cgroup = TempCgroup::new("kpe-ahead");
    let mut opts = load_options(&bpffs, &cgroup);
    opts.map_sizes.services = 1_024;
    opts.map_sizes.backends = 1_024;
    opts.map_sizes.rev_nat = 1_024;
    let mut cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    // In a namespace of its own: the pod-side program attaches to every device but lo.
    let netns = TempNetns::new("kpe-ahead");
    netns.run(|| {
        let mut proxier = start_growable(&opts);
        let mut sync = |cluster: &mut ClusterState, full: bool| {
            sync_pending(&mut proxier, cluster, full, Some(&mut || {}))
        };
        add_clusterip_service(&mut cluster, 0, ENDPOINTS);
        sync(&mut cluster, true);
        (1..=SERVICES).for_each(|i| add_clusterip_service(&mut cluster, i, ENDPOINTS));
        let stats = sync(&mut cluster, false);
        assert_eq!(stats.not_programmed, 0, "{:?}", stats.full_maps);
        assert!(
            stats
                .map_growth
                .iter()
                .any(|g| g.map.starts_with("BACKENDS4")),
            "the backend map grew: {:?}",
            stats.map_growth
        );
        // Per service: its backends, a reverse-NAT entry, and its service entries:
        // slot 0, a slot per backend, and the ClusterIP's entry for its other ports.
        let svc_entries = 1 + ENDPOINTS as usize + 1;
        let per_service = ENDPOINTS as usize + 1 + svc_entries;
        assert_eq!(stats.written, SERVICES as usize * per_service);
        let usage = |prefix: &str| {
            stats
                .map_usage
                .iter()
                .find(|u| u.map.starts_with(prefix))
                .map(|u| u.entries)
        };
        let all = SERVICES as usize + 1;
        assert_eq!(usage("BACKENDS4"), Some(all * ENDPOINTS as usize));
        assert_eq!(usage("REV_NAT4"), Some(all));
        assert_eq!(usage("SVC4"), Some(all * svc_entries));
        let again = sync(&mut cluster, true);
        assert_eq!(
            (again.written, again.deleted),
            (0, 0),
            "a full sync finds the maps as planned"
        );
    });
}

/// A sync of thousands of services writes its service entries in two halves at once, and
/// the names table after it is reported: the names come with `after_sync`, and when that
/// is not called, the next sync writes every name itself. Nothing is lost either way: the
/// full sync after finds every entry written (both halves), and the table names each
/// frontend.
#[test]
fn a_big_sync_writes_its_entries_in_halves_and_its_names_after_it() {
    use proxy_agent::{
        model::{ClusterState, IpFamily},
        proxier::ebpf::{maps_dir, read_names},
    };
    use tests::privileged::{TempBpffs, TempCgroup, TempNetns, load_options};
    require_root!();
    // 12,000 services of 5 endpoints: 84,000 service entries, past the 65,536 a run of
    // service puts needs to be written in halves.
    const SERVICES: u32 = 12_000;
    const ENDPOINTS: u32 = 5;
    let bpffs = TempBpffs::new("kpe-halves");
    let cgroup = TempCgroup::new("kpe-halves");
    let opts = load_options(&bpffs, &cgroup);
    let names_dir = maps_dir(&opts.bpffs_root);
    let named = || {
        let names = read_names(&names_dir).expect("the names table reads");
        names
            .values()
            .map(|port| port.name.clone())
            .collect::<BTreeSet<String>>()
    };
    let services = |range: std::ops::RangeInclusive<u32>| -> BTreeSet<String> {
        range.map(|i| format!("svc{i}")).collect()
    };
    let mut cluster = ClusterState::new(&[IpFamily::V4], "node-a");
    let netns = TempNetns::new("kpe-halves");
    netns.run(|| {
        let mut proxier = start_growable(&opts);
        add_clusterip_service(&mut cluster, 0, ENDPOINTS);
        sync_pending(&mut proxier, &mut cluster, true, Some(&mut || {}));
        assert_eq!(named(), services(0..=0), "a small sync names at once");

        (1..=SERVICES).for_each(|i| add_clusterip_service(&mut cluster, i, ENDPOINTS));
        let mut before_after_sync = || {
            assert_eq!(named().len(), 1, "the big sync's names wait for after_sync");
        };
        let stats = sync_pending(
            &mut proxier,
            &mut cluster,
            false,
            Some(&mut before_after_sync),
        );
        assert_eq!(stats.not_programmed, 0, "{:?}", stats.full_maps);
        assert_eq!(
            named(),
            services(0..=SERVICES),
            "after_sync names every frontend"
        );

        // A big sync whose after_sync never comes: the next sync names everything.
        let more = SERVICES + 1..=SERVICES + 5_000;
        more.for_each(|i| add_clusterip_service(&mut cluster, i, ENDPOINTS));
        sync_pending(&mut proxier, &mut cluster, false, None);
        assert_eq!(
            named(),
            services(0..=SERVICES),
            "its names are not written yet"
        );
        add_clusterip_service(&mut cluster, SERVICES + 5_001, ENDPOINTS);
        let stats = sync_pending(&mut proxier, &mut cluster, false, None);
        // Only the new service's entries: backends, reverse NAT, slot 0, slots, wildcard.
        let one_service = ENDPOINTS as usize + 1 + (1 + ENDPOINTS as usize + 1);
        assert_eq!(stats.written, one_service);
        assert_eq!(
            named(),
            services(0..=SERVICES + 5_001),
            "the small sync wrote every name"
        );

        // Both halves of the big sync's service entries are in: a full sync writes and
        // deletes nothing.
        let again = sync_pending(&mut proxier, &mut cluster, true, None);
        assert_eq!((again.written, again.deleted), (0, 0));
    });
}
