// SPDX-License-Identifier: Apache-2.0
//! The agent against upstream's own kube-apiserver, etcd and EndpointSlice controller
//! (v1.37, the `testbed` control plane), with exactly the ServiceAccount and RBAC of
//! deploy/: it lists and watches every kind it needs (EndpointSlices hand-made and made by
//! the controller from Pods), a permission it lacks is named in its log, the Events it
//! writes are accepted, and it survives what a real control plane does to its clients: a
//! compacted history (410 Gone), an API server restart and a connection that goes silent
//! without a reset. It notices each, relists or resumes, and converges without a Service
//! flapping (the model's change counters grow by the real changes only, and a Service
//! nobody touched never leaves the maps).
//!
//! Tests that only read and write objects use the run's shared control plane
//! (`KPE_CONTROL_PLANE`, started by `cargo xtask test`); those that restart the API server
//! or compact etcd start their own. Without the shared one, each test starts its own.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use testbed::{ControlPlane, Options, control_plane::client_from_kubeconfig, objects::Applier};
use tests::scenario::cluster::ClusterSource as _;
use tests::{
    node_harness::{MapEntry, TestNode, node_yaml, scenario_header, service_yaml},
    require_root,
    scenario::{
        Mode,
        agent::{Agent, ConfigInputs, HEALTHZ_BIND, Launch, METRICS_BIND, get_in},
        real_api::{AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, RealApiStore},
        run::merged_config,
    },
};

use super::nftables_fallback::OldNft;

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");
const NODE: &str = "real-node";
const WAIT: Duration = Duration::from_secs(20);

/// Where a test's control plane comes from.
enum Plane {
    /// The run's, which other tests use too (one at a time).
    Shared(PathBuf),
    /// This test's own, stopped when it ends.
    Own(Box<ControlPlane>),
}

impl Plane {
    /// The shared control plane unless `own` or there is none; else one of this test's.
    async fn get(own: bool, tag: &str) -> Self {
        if !own && let Some(dir) = std::env::var_os(testbed::SHARED_ENV) {
            return Plane::Shared(PathBuf::from(dir));
        }
        let dir = std::env::temp_dir().join(format!("kpe-cp-{tag}-{}", std::process::id()));
        Plane::Own(Box::new(
            ControlPlane::start(Options::new(&dir))
                .await
                .expect("upstream's control plane starts"),
        ))
    }

    fn dir(&self) -> &Path {
        match self {
            Plane::Shared(dir) => dir,
            Plane::Own(plane) => plane.dir(),
        }
    }

    fn owned(&mut self) -> &mut ControlPlane {
        match self {
            Plane::Own(plane) => plane,
            Plane::Shared(_) => unreachable!("asked for with own = true"),
        }
    }

    async fn admin(&self) -> Applier {
        let kubeconfig = self.dir().join("admin.kubeconfig");
        Applier::new(
            client_from_kubeconfig(&kubeconfig)
                .await
                .expect("the admin client"),
        )
    }
}

/// The backends (`ip:port`) the services map holds for frontend `vip:port`, over every
/// scope.
fn backends(node: &TestNode<RealApiStore>, vip: [u8; 4], port: u16) -> BTreeSet<String> {
    let addr = u64::from(u32::from_ne_bytes(vip));
    let dport = u64::from(u16::from_ne_bytes(port.to_be_bytes()));
    // Before the agent pinned its maps there is nothing; it pins them one at a time, so
    // the services map may be there before the backends map.
    let (Ok(services), Ok(backends)) = (
        node.map_entries("SVC4_V2"),
        node.map_entries("BACKENDS4_V1"),
    ) else {
        return BTreeSet::new();
    };
    let ids: BTreeSet<u64> = services
        .iter()
        .filter(|e| e.key["addr"] == addr && e.key["dport"] == dport && e.key["slot"] != 0)
        .filter_map(|e| e.value["backend_id"].as_u64())
        .collect();
    backends
        .iter()
        .filter(|e| e.key.as_u64().is_some_and(|id| ids.contains(&id)))
        .map(|e| {
            let raw = e.value["addr"].as_u64().unwrap_or_default() as u32;
            let ip = std::net::Ipv4Addr::from(raw.to_ne_bytes());
            let port = u16::from_be_bytes(
                (e.value["port"].as_u64().unwrap_or_default() as u16).to_ne_bytes(),
            );
            format!("{ip}:{port}")
        })
        .collect()
}

fn has_frontend(node: &TestNode<RealApiStore>, vip: [u8; 4]) -> bool {
    let addr = u64::from(u32::from_ne_bytes(vip));
    // An unpinned map (the agent not started yet) holds no frontend.
    node.map_entries("SVC4_V2")
        .is_ok_and(|entries| entries.iter().any(|e: &MapEntry| e.key["addr"] == addr))
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Waits until `condition` holds (checked off the runtime's threads: it runs bpftool).
async fn eventually(
    what: &str,
    within: Duration,
    agent: &Agent,
    mut condition: impl FnMut() -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        if tokio::task::block_in_place(&mut condition) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}\n--- agent ---\n{}",
            agent.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A counter of the agent's /metrics (summed over its labels).
fn counter(node: &TestNode<RealApiStore>, name: &str) -> f64 {
    let response = get_in(
        &node.topology.node_ns,
        &format!("http://{METRICS_BIND}/metrics"),
        Duration::from_secs(2),
    )
    .expect("the agent's /metrics answers");
    response
        .body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const SERVICE_CHANGES: &str = "kubeproxy_sync_proxy_rules_service_changes_total";

fn healthz(node: &TestNode<RealApiStore>) -> u16 {
    get_in(
        &node.topology.node_ns,
        &format!("http://{HEALTHZ_BIND}/healthz"),
        Duration::from_secs(2),
    )
    .map(|r| r.status)
    .unwrap_or(0)
}

/// Objects as JSON from YAML list items.
fn values(yaml: &str) -> Vec<Value> {
    serde_yaml::from_str(yaml).unwrap()
}

fn node_object(zone: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": NODE});
    if let Some(zone) = zone {
        labels["topology.kubernetes.io/zone"] = json!(zone);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": labels},
        "spec": {"podCIDRs": ["10.0.0.0/8"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]},
    })
}

/// A Service that selects its endpoints (the controller writes its slices).
fn selecting_service(name: &str, vip: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ns1"},
        "spec": {
            "clusterIP": vip,
            "selector": {"app": name},
            "ports": [{"name": "p", "port": 80, "targetPort": 9000, "protocol": "TCP"}],
        },
    })
}

/// A Service whose endpoints carry zone hints (topology-aware routing), with its slice:
/// 10.183.0.3 for zone-a, 10.183.0.4 for zone-b.
fn zoned_service() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "zoned", "namespace": "ns1",
                         "annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
            "spec": {"clusterIP": "172.30.0.83",
                     "ports": [{"name": "p", "port": 80, "targetPort": 9000, "protocol": "TCP"}]},
        }),
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "zoned-1", "namespace": "ns1",
                         "labels": {"kubernetes.io/service-name": "zoned"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.183.0.3"], "nodeName": NODE, "zone": "zone-a",
                 "conditions": {"ready": true}, "hints": {"forZones": [{"name": "zone-a"}]}},
                {"addresses": ["10.183.0.4"], "nodeName": NODE, "zone": "zone-b",
                 "conditions": {"ready": true}, "hints": {"forZones": [{"name": "zone-b"}]}},
            ],
            "ports": [{"name": "p", "port": 9000, "protocol": "TCP"}],
        }),
    ]
}

fn service_cidr(name: &str, cidr: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
           "metadata": {"name": name}, "spec": {"cidrs": [cidr]}})
}

/// The hex of an IPv4 LPM trie key (prefix length, little-endian u32, then the address).
fn lpm_key(prefix: u8, addr: [u8; 4]) -> Vec<String> {
    [prefix, 0, 0, 0]
        .iter()
        .chain(&addr)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The first stage's objects: the node, and `steady` (172.30.0.81 -> 10.183.0.1), a
/// Service nobody changes.
fn first_objects() -> String {
    node_yaml(NODE, "192.168.0.2")
        + &service_yaml("steady", "172.30.0.81", "TCP", "10.183.0.1", NODE, None)
}

const FLOWS: &str = "- {from: 10.0.0.2, to: \"172.30.0.81:80\", expect: [\"10.183.0.1:9000\"]}";

/// An agent in ebpf mode without periodic full syncs, so that what moves the counters and
/// the maps is the watch alone, logging at V(4) (what its watchers report).
async fn start_agent(node: &TestNode<RealApiStore>) -> Agent {
    let mut overrides = Map::new();
    overrides.insert("iptables".into(), json!({"syncPeriod": "1h"}));
    overrides.insert("logging".into(), json!({"verbosity": 4}));
    node.start_agent(Mode::Ebpf, overrides, false, Path::new(RUNNER))
        .await
        .expect("the agent syncs from the real API server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_follows_every_kind_through_the_real_server() {
    require_root!();
    let plane = Plane::get(false, "follow").await;
    let later: Vec<Value> = [selecting_service("picked", "172.30.0.82")]
        .into_iter()
        .chain(zoned_service())
        .collect();
    let node = TestNode::build_real(
        "real-follow",
        &scenario_header("real-follow", NODE),
        &first_objects(),
        FLOWS,
        plane.dir(),
        &later,
    )
    .unwrap();
    let agent = start_agent(&node).await;
    assert_eq!(
        backends(&node, [172, 30, 0, 81], 80),
        set(&["10.183.0.1:9000"])
    );
    let mut admin = plane.admin().await;

    // A Service with a selector: upstream's EndpointSlice controller writes its slice from
    // the Pod, and the endpoint follows the Pod's readiness.
    admin.apply(&later[0]).await.unwrap();
    let pod = |ready| {
        testbed::objects::pod(
            "ns1",
            "picked-1",
            &json!({"app": "picked"}),
            NODE,
            &["10.183.0.2".into()],
            ready,
        )
    };
    admin.apply(&pod(true)).await.unwrap();
    eventually("the controller's slice in the maps", WAIT, &agent, || {
        backends(&node, [172, 30, 0, 82], 80) == set(&["10.183.0.2:9000"])
    })
    .await;
    admin.apply(&pod(false)).await.unwrap();
    eventually("the unready pod out of the maps", WAIT, &agent, || {
        backends(&node, [172, 30, 0, 82], 80).is_empty()
    })
    .await;

    // A ServiceCIDR: its range is where unallocated addresses are dropped.
    admin
        .apply(&service_cidr("real-follow-extra", "172.31.9.0/24"))
        .await
        .unwrap();
    let key = lpm_key(24, [172, 31, 9, 0]);
    eventually("the new ServiceCIDR in the maps", WAIT, &agent, || {
        node.map_entries("SVC_CIDRS4_V1")
            .unwrap()
            .iter()
            .any(|e| e.raw_key == key)
    })
    .await;

    // The Node: its zone picks which hinted endpoints serve.
    admin.apply(&node_object(Some("zone-a"))).await.unwrap();
    for object in zoned_service() {
        admin.apply(&object).await.unwrap();
    }
    eventually("zone-a's endpoint", WAIT, &agent, || {
        backends(&node, [172, 30, 0, 83], 80) == set(&["10.183.0.3:9000"])
    })
    .await;
    admin.apply(&node_object(Some("zone-b"))).await.unwrap();
    eventually(
        "zone-b's endpoint after the Node moved",
        WAIT,
        &agent,
        || backends(&node, [172, 30, 0, 83], 80) == set(&["10.183.0.4:9000"]),
    )
    .await;

    // Deletions.
    admin.delete(&later[0]).await.unwrap();
    eventually("the deleted Service out of the maps", WAIT, &agent, || {
        !has_frontend(&node, [172, 30, 0, 82])
    })
    .await;
    admin
        .delete(&service_cidr("real-follow-extra", "172.31.9.0/24"))
        .await
        .unwrap();
    eventually(
        "the deleted ServiceCIDR out of the maps",
        WAIT,
        &agent,
        || {
            !node
                .map_entries("SVC_CIDRS4_V1")
                .unwrap()
                .iter()
                .any(|e| e.raw_key == key)
        },
    )
    .await;
    assert_eq!(
        backends(&node, [172, 30, 0, 81], 80),
        set(&["10.183.0.1:9000"])
    );
    drop(agent);
}

/// deploy/rbac.yaml's ClusterRole as JSON.
fn deployed_role() -> Value {
    let text =
        std::fs::read_to_string(testbed::binaries::workspace_root().join("deploy/rbac.yaml"))
            .unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|v| v["kind"] == "ClusterRole")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_the_agent_lacks_is_named_and_its_return_is_picked_up() {
    require_root!();
    let plane = Plane::get(false, "rbac").await;
    let node = TestNode::build_real(
        "real-rbac",
        &scenario_header("real-rbac", NODE),
        &first_objects(),
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    let mut admin = plane.admin().await;
    let full = deployed_role();
    let mut without_slices = full.clone();
    without_slices["rules"] = json!(
        full["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| !r["resources"]
                .as_array()
                .unwrap()
                .contains(&json!("endpointslices")))
            .cloned()
            .collect::<Vec<_>>()
    );
    admin.apply(&without_slices).await.unwrap();

    let agent = node
        .spawn_agent(Mode::Ebpf, Map::new(), false, Path::new(RUNNER))
        .unwrap();
    let named =
        "the API server forbids this agent to list and watch endpointslices.discovery.k8s.io";
    eventually("the refusal named in the log", WAIT, &agent, || {
        std::fs::read_to_string(&agent.log)
            .unwrap_or_default()
            .contains(named)
    })
    .await;
    assert!(
        backends(&node, [172, 30, 0, 81], 80).is_empty(),
        "no endpoint without the slices"
    );

    admin.apply(&full).await.unwrap();
    eventually(
        "the slices once the permission is back",
        WAIT + Duration::from_secs(10),
        &agent,
        || backends(&node, [172, 30, 0, 81], 80) == set(&["10.183.0.1:9000"]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_events_are_accepted_by_the_server() {
    require_root!();
    let plane = Plane::get(false, "events").await;
    let node = TestNode::build_real(
        "real-events",
        &scenario_header("real-events", NODE),
        &first_objects(),
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    // nftables mode with an nft too old: the agent falls back to iptables and posts a
    // Warning ProxyModeFallback on its Node.
    let old_nft = OldNft::new("real-events");
    let connection = node.source.connection();
    let bpffs = node.bpffs_root();
    let fragment = merged_config(&node.scenario.config, &Map::new());
    let inputs = ConfigInputs {
        proxy: tests::scenario::agent::Proxy::Ours,
        fragment: &fragment,
        mode: Mode::Nftables,
        node_name: NODE,
        connection: &connection,
        bpffs_root: &bpffs,
        cgroup_root: &node.topology.cgroup,
    };
    let agent_binary = TestNode::agent_binary();
    let agent = Agent::launch(&Launch {
        binary: &agent_binary,
        mode: Mode::Nftables,
        inputs: &inputs,
        node: node.node_place(),
        config: node.topology.run_dir.join("agent-events.yaml"),
        log: node.topology.run_dir.join("agent-events.log"),
        extra_args: Vec::new(),
        env: vec![(OsString::from("PATH"), old_nft.path())],
        ready_timeout: WAIT,
        keep: false,
    })
    .unwrap();
    let client = client_from_kubeconfig(&plane.dir().join("admin.kubeconfig"))
        .await
        .unwrap();
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::all(client);
    let started = Instant::now();
    let event = loop {
        let list = events.list(&Default::default()).await.unwrap();
        let found = list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ProxyModeFallback")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NODE)
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            started.elapsed() < WAIT,
            "no ProxyModeFallback event on the server:\n{}",
            agent.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("kube-proxy-ebpf")
    );
    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "the agent's writes were refused:\n{log}"
    );
    // Only the ServiceAccount of deploy/ was used.
    let kubeconfig = std::fs::read_to_string(node.topology.run_dir.join("kubeconfig")).unwrap();
    assert!(kubeconfig.contains(&format!(
        "system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
    )));
}

/// The moving Service's two states (172.30.0.92, its port 80 then 81).
fn moving(port: u16) -> Vec<Value> {
    let mut objects = values(&service_yaml(
        "moving",
        "172.30.0.92",
        "TCP",
        "10.183.0.2",
        NODE,
        None,
    ));
    objects[0]["spec"]["ports"][0]["port"] = json!(port);
    objects
}

/// What shows a flap, before a fault, to compare with after: the model's count of
/// Service changes (no Service but `moving` changes: default/kubernetes's Service is
/// never touched, its EndpointSlice is when the API server restarts), and how often the
/// watchers reported `steady`'s Service or slice (their debug lines, V(4)).
struct Counters {
    services: f64,
    steady_reports: usize,
}

fn steady_reports(agent: &Agent) -> usize {
    std::fs::read_to_string(&agent.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            (l.contains("\"upsert\"") || l.contains("\"delete\"")) && l.contains("name=\"steady")
        })
        .count()
}

fn counters(node: &TestNode<RealApiStore>, agent: &Agent) -> Counters {
    Counters {
        services: counter(node, SERVICE_CHANGES),
        steady_reports: steady_reports(agent),
    }
}

/// After a fault during which `moving` changed once: the agent converged to it, counted
/// that one Service change, and never reported the untouched `steady` again (a relist
/// replayed as deletions and additions would count and report every object again).
async fn converged_without_flapping(
    node: &TestNode<RealApiStore>,
    agent: &Agent,
    before: &Counters,
    within: Duration,
) {
    eventually("the change made during the fault", within, agent, || {
        backends(node, [172, 30, 0, 92], 81) == set(&["10.183.0.2:9000"])
    })
    .await;
    let after = counters(node, agent);
    assert_eq!(
        after.services - before.services,
        1.0,
        "one Service change, counted once:\n{}",
        agent.log_tail(60)
    );
    assert!(
        before.steady_reports >= 2,
        "the first list reported steady's Service and slice"
    );
    assert_eq!(
        after.steady_reports,
        before.steady_reports,
        "steady reported again:\n{}",
        agent.log_tail(60)
    );
    assert_eq!(
        backends(node, [172, 30, 0, 81], 80),
        set(&["10.183.0.1:9000"])
    );
    assert_eq!(healthz(node), 200);
}

/// Polls that `steady` stays in the maps until the returned guard is dropped; the guard
/// says how often it was found missing.
struct SteadyWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl SteadyWatch {
    fn start(node: &TestNode<RealApiStore>) -> Self {
        let pin = node.pinned_map("SVC4_V2");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let addr = u64::from(u32::from_ne_bytes([172, 30, 0, 81]));
        let thread = std::thread::spawn(move || {
            let mut missing = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let out = std::process::Command::new("bpftool")
                    .args(["-j", "map", "dump", "pinned"])
                    .arg(&pin)
                    .output();
                if let Ok(out) = out {
                    let entries: Vec<Value> =
                        serde_json::from_slice(&out.stdout).unwrap_or_default();
                    if !entries
                        .iter()
                        .any(|e| e["formatted"]["key"]["addr"] == addr)
                    {
                        missing += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            missing
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn missing(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map(|t| t.join().unwrap()).unwrap_or(0)
    }
}

fn signal(agent: &Agent, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(agent.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
}

fn log_has(agent: &Agent, needle: &str) -> bool {
    std::fs::read_to_string(&agent.log)
        .unwrap_or_default()
        .contains(needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_history_is_relisted_without_flapping() {
    require_root!();
    let mut plane = Plane::get(true, "gone").await;
    let objects =
        first_objects() + &service_yaml("moving", "172.30.0.92", "TCP", "10.183.0.2", NODE, None);
    let node = TestNode::build_real(
        "real-gone",
        &scenario_header("real-gone", NODE),
        &objects,
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    let agent = start_agent(&node).await;
    let before = counters(&node, &agent);
    let steady = SteadyWatch::start(&node);

    // The agent falls behind (stopped, as a starved process would be) while the Service
    // changes and the history it knows is compacted away; the API server restarts, so its
    // watch cache starts after the compaction too, and closes the agent's connections.
    signal(&agent, nix::sys::signal::Signal::SIGSTOP);
    let mut admin = plane.admin().await;
    admin.apply(&moving(81)[0]).await.unwrap();
    let compacted = plane.owned().compact_etcd().unwrap();
    plane.owned().restart_apiserver().await.unwrap();
    signal(&agent, nix::sys::signal::Signal::SIGCONT);

    converged_without_flapping(&node, &agent, &before, WAIT).await;
    assert!(
        log_has(&agent, "410") || log_has(&agent, "Expired") || log_has(&agent, "too old"),
        "the resumed watch was not answered 410 Gone (compacted at revision {compacted}):\n{}",
        agent.log_tail(60)
    );
    assert_eq!(steady.missing(), 0, "the untouched Service left the maps");
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_is_ridden_out() {
    require_root!();
    let mut plane = Plane::get(true, "restart").await;
    let objects =
        first_objects() + &service_yaml("moving", "172.30.0.92", "TCP", "10.183.0.2", NODE, None);
    let node = TestNode::build_real(
        "real-restart",
        &scenario_header("real-restart", NODE),
        &objects,
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    let agent = start_agent(&node).await;
    let before = counters(&node, &agent);
    let steady = SteadyWatch::start(&node);

    plane.owned().stop_apiserver().unwrap();
    // While it is away, the dataplane stays and the agent stays healthy: nothing it was
    // given is left unapplied.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(healthz(&node), 200, "{}", agent.log_tail(20));
    plane.owned().start_apiserver().await.unwrap();
    let mut admin = plane.admin().await;
    admin.apply(&moving(81)[0]).await.unwrap();

    converged_without_flapping(&node, &agent, &before, WAIT).await;
    assert!(
        log_has(&agent, "watch failed"),
        "the restart went unnoticed:\n{}",
        agent.log_tail(40)
    );
    assert_eq!(steady.missing(), 0, "the untouched Service left the maps");
    drop(agent);
}

/// Drops every packet to and from the relay's port in the node namespace (no reset, no
/// ICMP): the agent's connections to the API server go silent.
struct SilentCut {
    ns: String,
}

impl SilentCut {
    const TABLE: &'static str = "kpe_silent_cut";

    fn start(node: &TestNode<RealApiStore>) -> Self {
        let port = node.source.store().relay().port();
        let ns = node.topology.node_ns.clone();
        let script = format!(
            "table inet {t} {{\n  chain input {{\n    type filter hook input priority -400;\n    \
             tcp dport {port} drop\n    tcp sport {port} drop\n  }}\n}}\n",
            t = Self::TABLE
        );
        let status = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child.stdin.take().unwrap().write_all(script.as_bytes())?;
                child.wait()
            })
            .unwrap();
        assert!(status.success(), "nft -f of the cut");
        Self { ns }
    }
}

impl Drop for SilentCut {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "nft",
                "delete",
                "table",
                "inet",
                Self::TABLE,
            ])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_is_noticed_and_replaced() {
    require_root!();
    let plane = Plane::get(false, "cut").await;
    let objects =
        first_objects() + &service_yaml("moving", "172.30.0.92", "TCP", "10.183.0.2", NODE, None);
    let node = TestNode::build_real(
        "real-cut",
        &scenario_header("real-cut", NODE),
        &objects,
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    let agent = start_agent(&node).await;
    let before = counters(&node, &agent);
    let steady = SteadyWatch::start(&node);
    let failures_before = std::fs::read_to_string(&agent.log)
        .unwrap_or_default()
        .matches("watch failed")
        .count();

    let cut = SilentCut::start(&node);
    let cut_at = Instant::now();
    let mut admin = plane.admin().await;
    admin.apply(&moving(81)[0]).await.unwrap();
    // The bound of the agent's API connections (k8s/client.rs: 30 s idle, then 15 s of
    // unanswered keepalive probes), with slack for a loaded machine.
    let bound = proxy_agent::k8s::client::DEAD_CONNECTION_BOUND + Duration::from_secs(15);
    let noticed = eventually("the silent connection noticed", bound, &agent, || {
        std::fs::read_to_string(&agent.log)
            .unwrap_or_default()
            .matches("watch failed")
            .count()
            > failures_before
    })
    .await;
    eprintln!("the dead connection was noticed {noticed:?} after the cut");
    assert_eq!(
        healthz(&node),
        200,
        "healthz during the cut:\n{}",
        agent.log_tail(20)
    );
    drop(cut);
    let restored = Instant::now();
    converged_without_flapping(&node, &agent, &before, Duration::from_secs(40)).await;
    eprintln!(
        "converged {:?} after the network came back ({:?} after the cut)",
        restored.elapsed(),
        cut_at.elapsed()
    );
    assert_eq!(steady.missing(), 0, "the untouched Service left the maps");
    drop(agent);
}

#[test]
fn deploy_is_accepted_by_the_real_server_in_a_server_side_dry_run() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plane = runtime.block_on(Plane::get(false, "dryrun"));
    let deploy = testbed::binaries::workspace_root().join("deploy");
    let output = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(plane.dir().join("admin.kubeconfig"))
        .args(["apply", "--server-side", "--dry-run=server", "-k"])
        .arg(&deploy)
        .output()
        .expect("kubectl runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "kubectl refused deploy/:\n{stdout}\n{stderr}"
    );
    for kind in [
        "serviceaccount",
        "clusterrole",
        "clusterrolebinding",
        "configmap",
        "daemonset",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(kind) && l.contains("(server dry run)")),
            "no {kind} in the dry run:\n{stdout}"
        );
    }
    drop(plane);
}

/// Every file listed as refused by the real API server still is, with the stated reason
/// (once the server, or the file, changes, the entry must go and the file replays through
/// the real server again).
#[test]
fn the_files_listed_as_refused_by_the_real_server_still_are() {
    require_root!();
    let root = testbed::binaries::workspace_root();
    for (file, reason) in tests::scenario::real_api::REFUSED_BY_REAL_API {
        let path = [
            root.join("../shared/scenarios").join(file),
            root.join("tests/scenarios").join(file),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} is listed as refused but exists nowhere"));
        let output = std::process::Command::new(RUNNER)
            .args(["run", "--mode", "ebpf", "--api", "real", "--file"])
            .arg(&path)
            .output()
            .expect("the runner runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.lines().any(|l| l.starts_with("FAIL")
                && l.contains("the API server refused")
                && l.contains(reason)),
            "{file} is listed as refused ({reason}) but the real API server took it:\n{stdout}"
        );
    }
}

/// Upstream's kube-proxy started beside the agent on its node, as a `kubeadm upgrade
/// apply` re-adding its DaemonSet would leave it (nftables mode; its own healthz and
/// metrics ports, since upstream exits when it cannot bind them): the agent reports it
/// within a full sync (a Warning Event on the Node naming what was found, its log line,
/// `kubeproxy_foreign_proxy_detected` 1), and reports it gone once kube-proxy's table is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kube_proxy_beside_the_agent_is_reported_within_a_sync() {
    require_root!();
    let plane = Plane::get(false, "beside").await;
    let node = TestNode::build_real(
        "real-beside",
        &scenario_header("real-beside", NODE),
        &first_objects(),
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    // A full sync every second: the other modes are probed after each.
    const SYNC_PERIOD: Duration = Duration::from_secs(1);
    let mut overrides = Map::new();
    overrides.insert(
        "iptables".into(),
        json!({"syncPeriod": "1s", "minSyncPeriod": "0s"}),
    );
    let agent = node
        .start_agent(Mode::Ebpf, overrides, false, Path::new(RUNNER))
        .await
        .expect("the agent syncs from the real API server");
    let detected = || counter(&node, "kubeproxy_foreign_proxy_detected");
    assert_eq!(detected(), 0.0, "nothing beside the agent yet");

    // kube-proxy's configuration as the runner writes it for upstream-nftables (the same
    // ServiceAccount's kubeconfig, conntrack sysctls left alone), on other ports.
    let connection = node.source.connection();
    let bpffs = node.bpffs_root();
    let fragment = merged_config(&node.scenario.config, &Map::new());
    let inputs = ConfigInputs {
        proxy: tests::scenario::agent::Proxy::Upstream,
        fragment: &fragment,
        mode: Mode::Nftables,
        node_name: NODE,
        connection: &connection,
        bpffs_root: &bpffs,
        cgroup_root: &node.topology.cgroup,
    };
    let mut config: Value =
        serde_yaml::from_str(&tests::scenario::agent::render_config(&inputs).unwrap()).unwrap();
    config["healthzBindAddress"] = json!("127.0.0.1:10356");
    config["metricsBindAddress"] = json!("127.0.0.1:10349");
    let config_path = node.topology.run_dir.join("kube-proxy-beside.yaml");
    std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let binaries =
        testbed::binaries::Binaries::locate().expect("upstream's binaries (cargo xtask setup)");
    let log_path = node.topology.run_dir.join("kube-proxy-beside.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut kube_proxy = std::process::Command::new("ip")
        .args(["netns", "exec", &node.topology.node_ns])
        .arg(binaries.kube_proxy())
        .arg("--config")
        .arg(&config_path)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting upstream's kube-proxy");
    let kube_proxy_log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let took = eventually("kubeproxy_foreign_proxy_detected 1", WAIT, &agent, || {
        detected() == 1.0
    })
    .await;
    let kube_proxy_started = kube_proxy_log();
    assert!(
        kube_proxy_started.contains("nftables"),
        "upstream ran in nftables mode:\n{kube_proxy_started}"
    );
    let client = client_from_kubeconfig(&plane.dir().join("admin.kubeconfig"))
        .await
        .unwrap();
    // The Event is posted and the log line written after the metric is set, each on its
    // way; and kube-proxy creates its tables one family at a time, so that a first report
    // may name only one of them.
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::all(client);
    let started = Instant::now();
    let reported = loop {
        let listed = events.list(&Default::default()).await;
        let found = listed.iter().flat_map(|l| &l.items).find(|e| {
            e.reason.as_deref() == Some("ForeignProxyDetected")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NODE)
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("table ip kube-proxy"))
        });
        if let Some(event) = found {
            break event.clone();
        }
        let seen = listed.as_ref().map(|l| {
            l.items
                .iter()
                .map(|e| (e.reason.clone(), e.note.clone()))
                .collect::<Vec<_>>()
        });
        assert!(
            started.elapsed() < WAIT,
            "no ForeignProxyDetected event naming table ip kube-proxy on the server \
             ({seen:?}):\n{}",
            agent.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(reported.type_.as_deref(), Some("Warning"));
    eventually("the agent's log line", WAIT, &agent, || {
        std::fs::read_to_string(&agent.log)
            .unwrap_or_default()
            .contains("another proxy is programming this node")
    })
    .await;
    eprintln!(
        "upstream's kube-proxy reported {} ms after it started (full syncs every {SYNC_PERIOD:?})",
        took.as_millis()
    );

    // kube-proxy stopped and its tables removed (its pod deleted, then `kube-proxy
    // --cleanup`): the agent says so.
    let _ = kube_proxy.kill();
    let _ = kube_proxy.wait();
    for family in ["ip", "ip6"] {
        let _ = std::process::Command::new("ip")
            .args(["netns", "exec", &node.topology.node_ns])
            .args(["nft", "delete", "table", family, "kube-proxy"])
            .status();
    }
    eventually(
        "kubeproxy_foreign_proxy_detected 0 once kube-proxy's tables are gone",
        WAIT,
        &agent,
        || detected() == 0.0,
    )
    .await;
}

/// A container of a pod run on the test node as the kubelet would: its command and args
/// with `$(VAR)` expanded from its env, the binary the image holds at `image_path` replaced
/// by this machine's, and each volume bind-mounted where the container sees it, in a
/// mount namespace of its own.
struct PodRun {
    /// Container path → host directory.
    mounts: Vec<(PathBuf, PathBuf)>,
    /// Mountpoints this test created, removed again when it ends.
    created: Vec<PathBuf>,
    netns: PathBuf,
}

impl PodRun {
    fn new(netns: PathBuf, mounts: Vec<(PathBuf, PathBuf)>) -> Self {
        let mut created = Vec::new();
        for (target, _) in &mounts {
            let mut missing = Vec::new();
            let mut at = target.as_path();
            while !at.exists() {
                missing.push(at.to_path_buf());
                match at.parent() {
                    Some(parent) => at = parent,
                    None => break,
                }
            }
            std::fs::create_dir_all(target).unwrap();
            created.extend(missing);
        }
        Self {
            mounts,
            created,
            netns,
        }
    }

    /// `argv` (already expanded) in the pod's mounts and the node's network namespace.
    fn command(&self, argv: &[String]) -> std::process::Command {
        let mut script = String::from("set -e\n");
        for (i, _) in self.mounts.iter().enumerate() {
            script += &format!("mount --bind \"$SRC{i}\" \"$DST{i}\"\n");
        }
        script += "exec nsenter --net=\"$NETNS\" -- \"$@\"\n";
        let mut command = std::process::Command::new("unshare");
        command
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                "sh",
            ])
            .args(argv)
            .env("NETNS", &self.netns);
        for (i, (target, source)) in self.mounts.iter().enumerate() {
            command
                .env(format!("SRC{i}"), source)
                .env(format!("DST{i}"), target);
        }
        command
    }
}

impl Drop for PodRun {
    fn drop(&mut self) {
        // Deepest first; only the empty directories this test made.
        for dir in &self.created {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The container's command line as the kubelet runs it: `$(NAME)` replaced by the
/// container's env (spec.nodeName for a fieldRef), `image_binary` by `binary`.
fn container_argv(
    container: &Value,
    node_name: &str,
    image_binary: &str,
    binary: &Path,
) -> Vec<String> {
    let mut env = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap_or_default();
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("spec.nodeName") => node_name.to_owned(),
            Some(other) => panic!("no value for fieldRef {other}"),
            None => var["value"].as_str().unwrap_or_default().to_owned(),
        };
        env.push((name.to_owned(), value));
    }
    let words = ["command", "args"]
        .iter()
        .flat_map(|key| container[*key].as_array().cloned().unwrap_or_default());
    words
        .map(|word| {
            let mut word = word.as_str().unwrap_or_default().to_owned();
            for (name, value) in &env {
                word = word.replace(&format!("$({name})"), value);
            }
            word.replace(image_binary, &binary.display().to_string())
        })
        .collect()
}

fn documents_of_kind<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|document| serde::Deserialize::deserialize(document).ok())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Writes a ConfigMap's data as the files of its volume, in `dir`.
fn config_map_files(config_map: &Value, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for (key, value) in config_map["data"].as_object().unwrap() {
        std::fs::write(dir.join(key), value.as_str().unwrap()).unwrap();
    }
    dir.to_path_buf()
}

/// The configuration a process on the node serves on /configz, once it answers.
async fn configz_of(
    node: &TestNode<RealApiStore>,
    process: &mut std::process::Child,
    log: &Path,
) -> Value {
    let started = Instant::now();
    loop {
        let answer = get_in(
            &node.topology.node_ns,
            &format!("http://{METRICS_BIND}/configz"),
            Duration::from_secs(2),
        );
        if let Ok(response) = answer
            && response.status == 200
        {
            let body: Value = serde_json::from_str(&response.body)
                .unwrap_or_else(|e| panic!("/configz: {e}: {}", response.body));
            return body["kubeproxy.config.k8s.io"].clone();
        }
        let exited = process.try_wait().ok().flatten();
        assert!(
            exited.is_none() && started.elapsed() < WAIT,
            "no /configz (exited: {exited:?}):\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The fields (`a.b.c`) whose values differ between two configurations.
fn differing_fields(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let path = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                differing_fields(
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    &path,
                    out,
                );
            }
        }
        _ if a != b => out.push(format!("{at}: {a} vs {b}")),
        _ => {}
    }
}

fn stop(process: &mut std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(process.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = process.wait();
}

/// The migration README's "Install: replacing kube-proxy" describes, on the real control
/// plane, from kubeadm's own output: the `kube-proxy` ConfigMap as `kubeadm init phase
/// addon kube-proxy --print-manifest` (1.37) writes it, the agent's command line and its
/// ConfigMap as `kubectl kustomize deploy/` renders them, every file where the pod sees it
/// (kubeadm's ConfigMap at /var/lib/kube-proxy, ours at /var/lib/kube-proxy-ebpf, the
/// service-account token, the host's bpffs and cgroup root). The init container and then
/// the agent run unedited: the agent syncs the cluster into its maps. Its /configz with
/// kubeadm's file alone equals upstream kube-proxy's for the same file and command line,
/// field by field (apart from the `ebpf` section upstream does not have); with the
/// overrides, only what they write differs (and the NodePort addresses their mode implies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeadm_cluster_s_kube_proxy_configmap_runs_the_agent_unedited() {
    require_root!();
    let plane = Plane::get(false, "kubeadm").await;
    let node = TestNode::build_real(
        "real-kubeadm",
        &scenario_header("real-kubeadm", NODE),
        &first_objects(),
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    let binaries =
        testbed::binaries::Binaries::locate().expect("upstream's binaries (cargo xtask setup)");
    let run_dir = node.topology.run_dir.clone();

    // The API server as the node reaches it, and the agent's service account.
    let agent_kubeconfig = kube::config::Kubeconfig::read_from(run_dir.join("kubeconfig")).unwrap();
    let cluster = agent_kubeconfig.clusters[0].cluster.as_ref().unwrap();
    let server = cluster.server.clone().unwrap();
    let endpoint = server.strip_prefix("https://").unwrap();
    let admin = plane.admin().await;
    let token = testbed::objects::service_account_token(
        admin.client(),
        AGENT_NAMESPACE,
        AGENT_SERVICE_ACCOUNT,
    )
    .await
    .unwrap();
    let service_account = run_dir.join("serviceaccount");
    std::fs::create_dir_all(&service_account).unwrap();
    std::fs::write(service_account.join("token"), token).unwrap();
    std::fs::write(
        service_account.join("ca.crt"),
        ControlPlane::attach(plane.dir()).unwrap().ca_pem(),
    )
    .unwrap();
    std::fs::write(service_account.join("namespace"), AGENT_NAMESPACE).unwrap();

    // kubeadm's manifests for this cluster (pod network: the node's podCIDR).
    let init_configuration = run_dir.join("kubeadm.yaml");
    std::fs::write(
        &init_configuration,
        format!(
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n\
             kubernetesVersion: {version}\ncontrolPlaneEndpoint: {endpoint}\n\
             networking: {{podSubnet: 10.0.0.0/8, serviceSubnet: 172.30.0.0/16}}\n",
            version = binaries.version(),
        ),
    )
    .unwrap();
    let kubeadm = std::process::Command::new(binaries.kubeadm())
        .args([
            "init",
            "phase",
            "addon",
            "kube-proxy",
            "--print-manifest",
            "--config",
        ])
        .arg(&init_configuration)
        .output()
        .unwrap();
    assert!(
        kubeadm.status.success(),
        "kubeadm: {}",
        String::from_utf8_lossy(&kubeadm.stderr)
    );
    let kubeadm_objects = yaml_documents(&String::from_utf8_lossy(&kubeadm.stdout));
    let kubeadm_files = config_map_files(
        documents_of_kind(&kubeadm_objects, "ConfigMap", "kube-proxy"),
        &run_dir.join("kubeadm-configmap"),
    );
    let kube_proxy_container = &documents_of_kind(&kubeadm_objects, "DaemonSet", "kube-proxy")["spec"]
        ["template"]["spec"]["containers"][0];

    // Ours, as kustomize renders deploy/.
    let deploy = testbed::binaries::workspace_root().join("deploy");
    let rendered = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&deploy)
        .output()
        .expect("kubectl kustomize");
    assert!(rendered.status.success());
    let ours = yaml_documents(&String::from_utf8_lossy(&rendered.stdout));
    let our_files = config_map_files(
        documents_of_kind(&ours, "ConfigMap", "kube-proxy-ebpf"),
        &run_dir.join("agent-configmap"),
    );
    let pod = &documents_of_kind(&ours, "DaemonSet", "kube-proxy-ebpf")["spec"]["template"]["spec"];
    let agent_container = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "proxy-agent")
        .unwrap();
    let init_container = &pod["initContainers"][0];

    let agent_binary = tests::node_harness::agent_binary();
    let image_agent = "/usr/local/bin/proxy-agent";
    std::fs::create_dir_all(node.bpffs_root()).unwrap();
    let pod_run = PodRun::new(
        netns_scaffold::netns_path(&node.topology.node_ns),
        vec![
            ("/var/lib/kube-proxy".into(), kubeadm_files),
            ("/var/lib/kube-proxy-ebpf".into(), our_files),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                service_account,
            ),
            ("/sys/fs/bpf/kube-proxy-ebpf".into(), node.bpffs_root()),
            (
                "/run/kube-proxy-ebpf/cgroupv2".into(),
                node.topology.cgroup.clone(),
            ),
        ],
    );

    // The init container, then the agent, unedited.
    let init = pod_run
        .command(&container_argv(
            init_container,
            NODE,
            image_agent,
            &agent_binary,
        ))
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "the init container: {}{}",
        String::from_utf8_lossy(&init.stdout),
        String::from_utf8_lossy(&init.stderr)
    );
    let agent_argv = container_argv(agent_container, NODE, image_agent, &agent_binary);
    let start = |argv: &[String], log_name: &str| {
        let log_path = run_dir.join(log_name);
        let log = std::fs::File::create(&log_path).unwrap();
        let child = pod_run
            .command(argv)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        (child, log_path)
    };
    let (mut agent, agent_log) = start(&agent_argv, "agent-kubeadm.log");
    let with_overrides = configz_of(&node, &mut agent, &agent_log).await;
    let started = Instant::now();
    while backends(&node, [172, 30, 0, 81], 80) != set(&["10.183.0.1:9000"]) {
        assert!(
            started.elapsed() < WAIT,
            "the agent did not program the Service:\n{}",
            std::fs::read_to_string(&agent_log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(&mut agent);

    // Kubeadm's file alone (the same command line without --config-overrides), and
    // upstream's kube-proxy on kubeadm's own command line.
    let alone_argv: Vec<String> = agent_argv
        .iter()
        .filter(|a| !a.starts_with("--config-overrides="))
        .cloned()
        .collect();
    let (mut alone, alone_log) = start(&alone_argv, "agent-kubeadm-alone.log");
    let kubeadm_alone = configz_of(&node, &mut alone, &alone_log).await;
    stop(&mut alone);
    let upstream_argv = container_argv(
        kube_proxy_container,
        NODE,
        "/usr/local/bin/kube-proxy",
        &binaries.kube_proxy(),
    );
    let (mut upstream, upstream_log) = start(&upstream_argv, "kube-proxy-kubeadm.log");
    let upstream_configz = configz_of(&node, &mut upstream, &upstream_log).await;
    stop(&mut upstream);

    let mut ours_alone = kubeadm_alone.clone();
    ours_alone.as_object_mut().unwrap().remove("ebpf");
    let mut differences = Vec::new();
    differing_fields(&ours_alone, &upstream_configz, "", &mut differences);
    assert!(
        differences.is_empty(),
        "/configz differs from upstream's for kubeadm's file (ours vs upstream's):\n{}\n\
         ours: {ours_alone:#}\nupstream's: {upstream_configz:#}",
        differences.join("\n")
    );

    let mut differences = Vec::new();
    differing_fields(&with_overrides, &kubeadm_alone, "", &mut differences);
    let fields: BTreeSet<&str> = differences
        .iter()
        .filter_map(|d| d.split(':').next())
        .collect();
    assert!(fields.contains("mode"), "{differences:#?}");
    assert!(
        fields
            .iter()
            .all(|f| ["mode", "nodePortAddresses"].contains(f) || f.starts_with("ebpf.")),
        "the overrides changed more than they write: {differences:#?}"
    );
    assert_eq!(with_overrides["mode"], "ebpf");
    assert_eq!(with_overrides["nodePortAddresses"], json!(["primary"]));
}

/// A /metrics page's families: name → (type, label names of its samples, `le` and
/// `quantile` aside).
fn metric_families(page: &str) -> std::collections::BTreeMap<String, (String, BTreeSet<String>)> {
    let mut families = std::collections::BTreeMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                families.insert(name.to_owned(), (kind.to_owned(), BTreeSet::new()));
            }
        }
    }
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((sample, labels)) = line.split_once('{') else {
            continue;
        };
        let family = ["_bucket", "_sum", "_count", "_total"]
            .iter()
            .filter_map(|suffix| sample.strip_suffix(suffix))
            .find(|base| families.contains_key(*base))
            .unwrap_or(sample);
        let Some((_, names)) = families.get_mut(family) else {
            continue;
        };
        let labels = labels.rsplit_once('}').map_or("", |(l, _)| l);
        for pair in labels.split("\",") {
            if let Some((name, _)) = pair.split_once('=')
                && name != "le"
                && name != "quantile"
            {
                names.insert(name.trim().to_owned());
            }
        }
    }
    families
}

/// Upstream's kube-proxy and the agent, each in iptables mode on the same node and
/// control plane, after a first sync: every family upstream's /metrics has (apart from
/// Go's runtime, `go_*`) the agent's has too, with the same type and label names; and
/// their logs start alike (the flag dump with upstream's values, the version, the sync
/// summary at V2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_of_upstream_kube_proxy_is_served_alike() {
    require_root!();
    let plane = Plane::get(false, "families").await;
    let node = TestNode::build_real(
        "real-families",
        &scenario_header("real-families", NODE),
        &first_objects(),
        FLOWS,
        plane.dir(),
        &[],
    )
    .unwrap();
    let scrape = || {
        get_in(
            &node.topology.node_ns,
            &format!("http://{METRICS_BIND}/metrics"),
            Duration::from_secs(2),
        )
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| r.body)
    };
    let synced = |page: &str| {
        page.lines()
            .filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds"))
            .any(|l| l.rsplit(' ').next().is_some_and(|v| v != "0"))
    };

    // Each proxy as its DaemonSet runs it: its configuration file (the runner's, iptables
    // mode), on the node, here at -v=2 so that the start-up lines are all there.
    let connection = node.source.connection();
    let bpffs = node.bpffs_root();
    let fragment = merged_config(&node.scenario.config, &Map::new());
    let binaries =
        testbed::binaries::Binaries::locate().expect("upstream's binaries (cargo xtask setup)");
    let run = async |proxy: tests::scenario::agent::Proxy, format: &str| {
        let (binary, name) = match proxy {
            tests::scenario::agent::Proxy::Upstream => {
                (binaries.kube_proxy(), format!("kube-proxy-{format}"))
            }
            tests::scenario::agent::Proxy::Ours => (
                tests::node_harness::agent_binary(),
                format!("agent-{format}"),
            ),
        };
        let inputs = ConfigInputs {
            proxy,
            fragment: &fragment,
            mode: Mode::Iptables,
            node_name: NODE,
            connection: &connection,
            bpffs_root: &bpffs,
            cgroup_root: &node.topology.cgroup,
        };
        let config_path = node.topology.run_dir.join(format!("{name}.yaml"));
        std::fs::write(
            &config_path,
            tests::scenario::agent::render_config(&inputs).unwrap(),
        )
        .unwrap();
        let log_path = node.topology.run_dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut process = std::process::Command::new("nsenter")
            .arg(format!(
                "--net={}",
                netns_scaffold::netns_path(&node.topology.node_ns).display()
            ))
            .arg("--")
            .arg(binary)
            .arg(format!("--config={}", config_path.display()))
            .arg("-v=2")
            .arg(format!("--logging-format={format}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let started = Instant::now();
        let page = loop {
            if let Some(page) = scrape()
                && synced(&page)
            {
                break page;
            }
            assert!(
                started.elapsed() < WAIT && process.try_wait().ok().flatten().is_none(),
                "{name} did not sync:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        stop(&mut process);
        (page, std::fs::read_to_string(&log_path).unwrap_or_default())
    };
    use tests::scenario::agent::Proxy::{Ours, Upstream};
    let (upstream_page, upstream_log) = run(Upstream, "text").await;
    let (our_page, our_log) = run(Ours, "text").await;
    // klog's JSON as component-base writes it: the same fields in the version line (`ts`
    // in milliseconds, `v`, `caller`, `msg`, the version).
    let (_, upstream_json) = run(Upstream, "json").await;
    let (_, our_json) = run(Ours, "json").await;
    let version_line = |log: &str| -> Map<String, Value> {
        log.lines()
            .filter_map(|l| serde_json::from_str::<Map<String, Value>>(l).ok())
            .find(|line| line.get("msg") == Some(&json!("Version info")))
            .unwrap_or_else(|| panic!("no JSON \"Version info\" line in\n{log}"))
    };
    let (upstream_version, our_version) = (version_line(&upstream_json), version_line(&our_json));
    let keys = |line: &Map<String, Value>| line.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        keys(&our_version),
        keys(&upstream_version),
        "ours {our_version:?}, upstream's {upstream_version:?}"
    );
    for line in [&our_version, &upstream_version] {
        let ts = line["ts"].as_f64().unwrap_or_default();
        assert!(ts > 1.7e12 && ts < 1e13, "ts in milliseconds: {line:?}");
        assert_eq!(line["v"], json!(0), "{line:?}");
    }

    // The first lines: each flag with its value, as pflag prints it (the same values for
    // every flag upstream has, the file aside), then the version; at V2 each sync's summary.
    let flags = |log: &str| -> BTreeMap<String, String> {
        log.lines()
            .filter_map(|l| l.split_once("] FLAG: --"))
            .filter_map(|(_, flag)| flag.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect()
    };
    let (upstream_flags, our_flags) = (flags(&upstream_log), flags(&our_log));
    let mut differing = Vec::new();
    for (name, value) in &upstream_flags {
        match our_flags.get(name) {
            _ if name == "config" => {}
            Some(ours) if ours == value => {}
            ours => differing.push(format!("--{name}: upstream's {value}, ours {ours:?}")),
        }
    }
    assert!(
        differing.is_empty() && upstream_flags.len() > 50,
        "the start-up flag dumps differ:\n{}",
        differing.join("\n")
    );
    for log in [&upstream_log, &our_log] {
        let first_non_flag = log.lines().find(|l| !l.contains("] FLAG: --"));
        assert!(
            log.lines().next().is_some_and(|l| l.contains("] FLAG: --")),
            "the flags come first:\n{log}"
        );
        assert!(first_non_flag.is_some());
        for message in [
            "\"Version info\" version=\"v",
            "\"SyncProxyRules complete\"",
        ] {
            assert!(log.contains(message), "no {message} in\n{log}");
        }
    }

    let upstream = metric_families(&upstream_page);
    let ours = metric_families(&our_page);
    let mut missing = Vec::new();
    for (name, (kind, labels)) in &upstream {
        if name.starts_with("go_") {
            continue;
        }
        match ours.get(name) {
            None => missing.push(format!("{name} ({kind} {labels:?}): not served")),
            Some((our_kind, our_labels)) if our_kind != kind || our_labels != labels => missing
                .push(format!(
                    "{name}: {our_kind} {our_labels:?}, upstream's {kind} {labels:?}"
                )),
            Some(_) => {}
        }
    }
    eprintln!(
        "upstream's families ({}), go_* aside, all served alike: {:?}",
        upstream.len(),
        upstream
            .keys()
            .filter(|n| !n.starts_with("go_"))
            .collect::<Vec<_>>()
    );
    assert!(
        missing.is_empty(),
        "families of upstream's /metrics the agent lacks or serves otherwise:\n{}",
        missing.join("\n")
    );
}
