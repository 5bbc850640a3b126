// SPDX-License-Identifier: Apache-2.0
//! Privileged checks of the scenario runner: real namespaces, listeners and probes,
//! without the agent (flows that need no proxy must pass; plain listeners on loopback and
//! per step) and with a stand-in agent (configuration, namespace, cgroup, readiness,
//! cleanup). Skipped when not root.

use std::{
    collections::BTreeSet,
    fs,
    io::{Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use tests::scenario::{
    Expectation, Flow, FlowReport, Mode, Proto, RunOptions, Scenario, ScenarioEnv, Status,
    agent::AgentOptions,
    format::RawScenario,
    netns::{self, bind_tcp_listener_in, cgroup2_root},
    outcome::Outcome,
    placement::Placement,
    run::{check_privileges, run_scenario},
    topology::{Topology, run_id_of, runs_dir},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

/// One run at a time in this process: the runs this process started are told apart from
/// other processes' by the runner pid in their run directory, not from each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn privileged() -> bool {
    match check_privileges() {
        Ok(()) => true,
        Err(err) => {
            eprintln!("skipping privileged scenario-runner test: {err}");
            false
        }
    }
}

fn shared(name: &str) -> Option<Scenario> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/scenarios")
        .join(name);
    if !path.exists() {
        eprintln!("skipping: {} not present", path.display());
        return None;
    }
    Some(Scenario::load(&path).unwrap())
}

/// Namespaces, cgroups, pin and run directories of the given runs that exist right now.
/// Other runs (other tests, other processes on the machine) come and go meanwhile, so
/// only the runs a test started itself are checked.
fn leftovers(runs: &BTreeSet<String>) -> BTreeSet<String> {
    let ours = |name: &str| run_id_of(name).is_some_and(|id| runs.contains(id));
    let mut names: BTreeSet<String> = netns::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| ours(n))
        .map(|n| format!("netns {n}"))
        .collect();
    for (dir, what) in [
        (cgroup2_root().unwrap(), "cgroup"),
        (PathBuf::from("/sys/fs/bpf"), "pins"),
        (runs_dir(), "run dir"),
    ] {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if ours(&name) {
                names.insert(format!("{what} {name}"));
            }
        }
    }
    names
}

/// Runs that this process has started and that are still live: their run directory names
/// this process as the runner.
fn live_runs_of_this_process() -> BTreeSet<String> {
    let me = std::process::id().to_string();
    fs::read_dir(runs_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            fs::read_to_string(e.path().join("runner.pid")).is_ok_and(|pid| pid.trim() == me)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| run_id_of(name) == Some(name.as_str()))
        .collect()
}

fn options(agent: Option<AgentOptions>) -> RunOptions {
    RunOptions {
        upstream_outcomes: Default::default(),
        observations: None,
        mode: Mode::Iptables,
        agent,
        runner_exe: PathBuf::from(RUNNER),
        timeout: Duration::from_millis(1000),
        keep: false,
        // The stand-in agents below check the --source command line.
        api: tests::scenario::run::ClusterApi::Directory,
        trace_check: false,
        only_proto: None,
        only_external_clients: false,
    }
}

/// Replays a scenario; also returns the run it used (seen while its flows ran).
async fn replay(options: &RunOptions, scenario: &Scenario) -> (Vec<FlowReport>, BTreeSet<String>) {
    let mut runs = BTreeSet::new();
    let mut emit = |r: &FlowReport| {
        println!("{r}");
        runs.extend(live_runs_of_this_process());
    };
    let reports = run_scenario(options, scenario, &mut emit).await;
    assert!(
        !runs.is_empty(),
        "no run of this process seen: {reports:#?}"
    );
    (reports, runs)
}

fn assert_l1(reports: &[FlowReport]) {
    assert_eq!(reports.len(), 2, "{reports:#?}");
    let udp = &reports[0];
    assert_eq!(udp.status, Status::Pass, "{udp}");
    assert!(
        udp.text.contains("echo 10.180.0.1:1234 saw 10.0.0.2"),
        "{udp}"
    );
    let sctp = &reports[1];
    if tests::scenario::echo::sctp_supported() {
        assert_eq!(sctp.status, Status::Pass, "{sctp}");
    } else {
        assert_eq!(sctp.status, Status::Skip, "{sctp}");
        assert!(
            sctp.text.starts_with("kernel has no SCTP support"),
            "{sctp}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn direct_pod_traffic_and_untouched_flows_pass_without_an_agent() {
    if !privileged() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let (Some(l1), Some(mut a1)) = (
        shared("l1-headless-ignored.yaml"),
        shared("a1-overall.yaml"),
    ) else {
        return;
    };
    let (reports, mut runs) = replay(&options(None), &l1).await;
    assert_l1(&reports);

    // a1 cut down to its UNTOUCHED flow: a plain listener in a pod outside any service.
    for stage in &mut a1.stages {
        stage.flows.retain(|f| f.expect == Expectation::Untouched);
    }
    let (reports, a1_runs) = replay(&options(None), &a1).await;
    runs.extend(a1_runs);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].status, Status::Pass, "{}", reports[0]);
    assert_eq!(reports[0].text, "1x plain listener 10.0.0.3:80");

    let left = leftovers(&runs);
    assert!(left.is_empty(), "the runs left something behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listener_bound_from_here_serves_inside_the_node_namespace() {
    if !privileged() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let Some(l1) = shared("l1-headless-ignored.yaml") else {
        return;
    };
    let placement = Placement::plan(&l1).unwrap();
    let topology = Topology::build(&l1.node, &placement, false).unwrap();
    let runs = BTreeSet::from([topology.id.clone()]);
    assert!(!leftovers(&runs).is_empty());
    assert!(
        topology
            .node_addresses()
            .unwrap()
            .contains(&"192.168.0.2".parse().unwrap())
    );

    let listener = bind_tcp_listener_in(&topology.node_ns, "127.0.0.1:0".parse().unwrap()).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = [0u8; 256];
        let _ = stream.read(&mut buf).unwrap();
        stream
            .write_all(b"HTTP/1.0 200 OK\r\n\r\nfrom the node namespace")
            .unwrap();
    });
    // 127.0.0.1 of the node namespace is not ours: only a client inside reaches it.
    let url = format!("http://127.0.0.1:{port}/");
    let out = topology
        .node_place()
        .command(Path::new(RUNNER), &["http-get".into(), url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["status"], 200);
    assert_eq!(body["body"], "from the node namespace");
    server.join().unwrap();

    let namespaces = topology.namespaces().to_vec();
    drop(topology);
    let remaining = netns::list_netns().unwrap();
    assert!(namespaces.iter().all(|n| !remaining.contains(n)));
    let left = leftovers(&runs);
    assert!(left.is_empty(), "{left:?}");
}

/// A stand-in for proxy-agent: records how it was started and accepts `--cleanup`.
/// With `metrics`, it reports syncs only through the sync gauges on 127.0.0.1:10249
/// (its /healthz says 503); without, its metrics (still on 127.0.0.1:10249: the runner
/// takes an agent whose metrics server is not up as still starting) have no sync gauges,
/// and it reports syncs only through /healthz on 127.0.0.1:10256, with the timestamp
/// written as upstream writes it (Go's time.String()).
fn fake_agent(dir: &Path, metrics: bool) -> Option<PathBuf> {
    if Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        eprintln!("skipping the stand-in agent part: no python3");
        return None;
    }
    let script = format!(
        r#"#!/bin/sh
echo "$@" >> {dir}/args
case " $* " in *" --cleanup "*) exit 0;; esac
cp "$2" {dir}/config.yaml
cat /proc/self/cgroup > {dir}/cgroup
exec python3 -c '
import datetime, http.server, threading, time
METRICS = {metrics}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        now = datetime.datetime.now(datetime.timezone.utc)
        if self.path == "/proxyMode":
            body = "iptables"
            self.send_response(200)
        elif self.path == "/metrics" and METRICS:
            t = now.timestamp()
            body = "kubeproxy_sync_proxy_rules_last_timestamp_seconds %f\nkubeproxy_sync_proxy_rules_last_queued_timestamp_seconds %f\n" % (t, t - 1)
            self.send_response(200)
        elif self.path == "/metrics":
            body = "process_start_time_seconds 1\n"
            self.send_response(200)
        else:
            stamp = now.strftime("%Y-%m-%d %H:%M:%S.%f +0000 UTC m=+1.5")
            body = "{{\"lastUpdated\": \"%s\",\"currentTime\": \"%s\"}}" % (stamp, stamp)
            self.send_response(503 if METRICS else 200)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
threading.Thread(target=http.server.HTTPServer(("127.0.0.1", 10249), H).serve_forever, daemon=True).start()
http.server.HTTPServer(("127.0.0.1", 10256), H).serve_forever()
'
"#,
        dir = dir.display(),
        metrics = if metrics { "True" } else { "False" },
    );
    let path = dir.join("proxy-agent");
    fs::write(&path, script).unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    Some(path)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_runs_in_the_node_namespace_and_cgroup_and_is_cleaned_up() {
    if !privileged() {
        return;
    }
    let _serial = SERIAL.lock().await;
    for metrics in [true, false] {
        run_with_fake_agent(metrics).await;
    }
}

async fn run_with_fake_agent(metrics: bool) {
    let Some(l1) = shared("l1-headless-ignored.yaml") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("fake-agent-{}-{metrics}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let Some(binary) = fake_agent(&dir, metrics) else {
        return;
    };
    let agent = AgentOptions {
        proxy: tests::scenario::agent::Proxy::Ours,
        binary,
        mode: Mode::Iptables,
        extra_args: vec!["--v=2".into()],
        config_overrides: Default::default(),
        ready_timeout: Duration::from_secs(10),
    };
    let (reports, runs) = replay(&options(Some(agent)), &l1).await;
    assert_l1(&reports);

    let args = fs::read_to_string(dir.join("args")).unwrap();
    let lines: Vec<&str> = args.lines().collect();
    assert_eq!(lines.len(), 2, "{args}");
    assert!(
        lines[0].starts_with("--config ")
            && lines[0].contains(" --source ")
            && lines[0].ends_with(" --v=2")
    );
    assert!(
        lines[1].starts_with("--cleanup --bpffs-root /sys/fs/bpf/kpt"),
        "{}",
        lines[1]
    );

    let config: serde_json::Value =
        serde_yaml::from_str(&fs::read_to_string(dir.join("config.yaml")).unwrap()).unwrap();
    assert_eq!(config["kind"], "KubeProxyConfiguration");
    assert_eq!(config["mode"], "iptables");
    assert_eq!(config["clusterCIDR"], "10.0.0.0/8");
    assert_eq!(config["hostnameOverride"], "test-node");
    let cgroup_root = config["ebpf"]["cgroupRoot"].as_str().unwrap().to_string();
    let cgroup_name = Path::new(&cgroup_root)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let membership = fs::read_to_string(dir.join("cgroup")).unwrap();
    assert!(
        membership
            .lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&format!("/{cgroup_name}"))),
        "agent not in {cgroup_name}: {membership}"
    );

    let left = leftovers(&runs);
    assert!(left.is_empty(), "the run left something behind: {left:?}");
    // The pins the agent was told to use belong to that run.
    let pins = config["ebpf"]["bpffsRoot"].as_str().unwrap();
    assert!(
        runs.iter().any(|id| pins.ends_with(&format!("/{id}"))),
        "{pins} vs {runs:?}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

fn inline_scenario(yaml: &str) -> Scenario {
    let raw: RawScenario = serde_yaml::from_str(yaml).unwrap();
    Scenario::from_raw(raw, Path::new("inline.yaml")).unwrap()
}

/// A probe of `from -> to` that is no flow of the file (`expect` is not used).
fn extra_probe(from: &str, to: &str, proto: Proto) -> Flow {
    Flow {
        index: 0,
        step: 0,
        from: from.parse().unwrap(),
        to: to.parse().unwrap(),
        proto,
        expect: Expectation::Untouched,
        masq: None,
        sticky: false,
        modes: None,
        note: String::new(),
    }
}

/// Runs every flow of `stage`; the reports' texts, asserting each passed.
async fn pass_stage(env: &mut ScenarioEnv<'_>, scenario: &Scenario, stage: usize) -> Vec<String> {
    let addrs = env.topology.node_addresses().unwrap();
    let mut texts = Vec::new();
    for flow in &scenario.stages[stage].flows {
        let (status, text) = env.run_flow(flow, &addrs).await;
        println!(
            "step {stage} #{} {} -> {}: {text}",
            flow.index, flow.from, flow.to
        );
        assert_eq!(status, Status::Pass, "#{} {}: {text}", flow.index, flow.to);
        texts.push(text);
    }
    texts
}

const LOOPBACK: &str = r#"
name: loopback
node:
  name: test-node
  addresses: [192.168.0.2/24, 'fd00:168::2/64']
  podCIDR: [10.0.0.0/8, 'fd00:10::/64']
config: {clusterCIDR: '10.0.0.0/8,fd00:10::/64'}
flows:
- {from: 127.0.0.1, to: '127.0.0.1:5555', expect: UNTOUCHED}
- {from: 192.168.0.2, to: '127.0.0.1:5555', proto: udp, expect: UNTOUCHED}
- {from: '::1', to: '[::1]:5555', expect: UNTOUCHED}
- {from: 10.0.0.2, to: '127.0.0.1:5556', expect: UNTOUCHED}
- {from: 'fd00:10::2', to: '[::1]:5556', proto: udp, expect: UNTOUCHED}
"#;

/// 1b: an UNTOUCHED flow to a loopback destination is answered by a plain listener on the
/// loopback of the namespace its client runs in (node or pod), and only there.
#[tokio::test(flavor = "multi_thread")]
async fn untouched_loopback_flows_are_answered_in_the_clients_own_namespace() {
    if !privileged() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let scenario = inline_scenario(LOOPBACK);
    let options = options(None);
    let mut env = ScenarioEnv::set_up(&options, &scenario, false)
        .await
        .unwrap();
    let runs = BTreeSet::from([env.topology.id.clone()]);
    let texts = pass_stage(&mut env, &scenario, 0).await;
    assert_eq!(
        texts,
        [
            "1x plain listener 127.0.0.1:5555",
            "1x plain listener 127.0.0.1:5555",
            "1x plain listener [::1]:5555",
            "1x plain listener 127.0.0.1:5556",
            "1x plain listener [::1]:5556",
        ]
    );
    // Each loopback is the namespace's own: the node's port is not the pod's, and back.
    for (from, to) in [
        ("10.0.0.2", "127.0.0.1:5555"),
        ("127.0.0.1", "127.0.0.1:5556"),
        ("::1", "[::1]:5556"),
    ] {
        let attempts = env.probe(&extra_probe(from, to, Proto::Tcp)).await.unwrap();
        assert_eq!(
            attempts[0].outcome,
            Outcome::Refused,
            "{from} -> {to}: {attempts:?}"
        );
    }
    drop(env);
    let left = leftovers(&runs);
    assert!(left.is_empty(), "the run left something behind: {left:?}");
}

const STEPS: &str = r#"
name: steps
node: {name: test-node, addresses: [192.168.0.2/24], podCIDR: 10.0.0.0/8}
config: {clusterCIDR: 10.0.0.0/8}
flows:
- {from: 192.168.0.2, to: '192.168.0.2:30000', expect: LOCAL}
- {from: 192.168.0.2, to: '192.168.0.2:30002', expect: LOCAL}
- {from: 192.168.0.2, to: '192.168.0.2:30001', expect: UNTOUCHED}
steps:
- objects: []
  flows:
  - {from: 192.168.0.2, to: '192.168.0.2:30000', expect: UNTOUCHED}
  - {from: 192.168.0.2, to: '192.168.0.2:30002', expect: UNTOUCHED}
- objects: []
  flows:
  - {from: 192.168.0.2, to: '192.168.0.2:30001', expect: LOCAL}
  - {from: 127.0.0.1, to: '127.0.0.1:30001', expect: UNTOUCHED}
  - {from: 192.168.0.2, to: '192.168.0.2:30003', expect: LOCAL}
  - {from: 192.168.0.2, to: '192.168.0.2:30003', expect: UNTOUCHED, modes: [ipvs]}
"#;

/// Answers every connection with an HTTP status line, as the proxy's health-check server
/// does, until `stop` is set; then closes the port.
fn stand_in_server(listener: TcpListener, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_millis(500)))
                        .unwrap();
                    let mut buf = [0u8; 256];
                    let _ = stream.read(&mut buf);
                    let _ = stream.write_all(b"HTTP/1.0 200 OK\r\n\r\nstand-in\n");
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("stand-in server: {e}"),
            }
        }
    })
}

fn in_use(result: Result<TcpListener, tests::scenario::netns::Error>) -> bool {
    matches!(result, Err(tests::scenario::netns::Error::Io { source, .. })
        if source.kind() == std::io::ErrorKind::AddrInUse)
}

/// 1c: plain listeners live for one stage. A port the proxy serves in a stage (LOCAL) is
/// never taken by the runner; an UNTOUCHED port of the next stage is bound once the proxy
/// let it go (retried while in use), and said so when it never frees; a stage's listeners
/// are gone before the next change, so the proxy may open those ports then; listeners of
/// other stages stay as witnesses where free. Stand-in servers in the node namespace play
/// the proxy's health-check servers.
#[tokio::test(flavor = "multi_thread")]
async fn plain_listeners_live_for_one_step_and_wait_for_the_proxys_ports() {
    if !privileged() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let scenario = inline_scenario(STEPS);
    let options = options(None);
    let mut env = ScenarioEnv::set_up(&options, &scenario, false)
        .await
        .unwrap();
    let runs = BTreeSet::from([env.topology.id.clone()]);
    let node_ns = env.topology.node_ns.clone();
    let bind = |port: u16| bind_tcp_listener_in(&node_ns, ([192, 168, 0, 2], port).into());
    let http = "1x other answer \"HTTP/1.0 200 OK\"";

    // Step 0: 30000 and 30002 are the proxy's (free for it), 30001 the runner's, and
    // 30003 too (a witness: step 2 has an UNTOUCHED flow there).
    let stop_30000 = Arc::new(AtomicBool::new(false));
    let server_30000 = stand_in_server(bind(30000).unwrap(), stop_30000.clone());
    let stop_30002 = Arc::new(AtomicBool::new(false));
    let server_30002 = stand_in_server(bind(30002).unwrap(), stop_30002.clone());
    assert!(in_use(bind(30001)));
    assert!(in_use(bind(30003)));
    let texts = pass_stage(&mut env, &scenario, 0).await;
    assert_eq!(texts, [http, http, "1x plain listener 192.168.0.2:30001"]);

    // Step 1: the proxy closes 30000 a moment after the change (the runner waits for it);
    // 30002 it never closes. 30001 stays the runner's (a witness).
    let closer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(1500));
        stop_30000.store(true, Ordering::Relaxed);
    });
    env.enter_stage(1).await.unwrap();
    closer.join().unwrap();
    server_30000.join().unwrap();
    assert!(in_use(bind(30001)));
    let addrs = env.topology.node_addresses().unwrap();
    let flows = &scenario.stages[1].flows;
    assert_eq!(
        env.run_flow(&flows[0], &addrs).await,
        (
            Status::Pass,
            "1x plain listener 192.168.0.2:30000".to_string()
        )
    );
    assert_eq!(
        env.run_flow(&flows[1], &addrs).await,
        (
            Status::Fail,
            format!(
                "expected UNTOUCHED, saw {http}; the runner's plain listener \
                 plain/tcp/192.168.0.2:30002 was not placed: Address already in use (os error \
                 98); the port never freed within 5000 ms"
            )
        )
    );

    // Step 2: the runner's listeners are gone before the change, so the proxy may open
    // 30001 and 30003 (this one on every address). The runner listens on 127.0.0.1:30001
    // (the proxy holds only the node address there), tries 192.168.0.2:30003 once without
    // waiting and says why it is absent, and keeps 30000 as a witness.
    env.stop_plain_listeners();
    env.apply_stage(2).await.unwrap();
    let stop_30001 = Arc::new(AtomicBool::new(false));
    let server_30001 = stand_in_server(bind(30001).unwrap(), stop_30001.clone());
    let stop_30003 = Arc::new(AtomicBool::new(false));
    let wildcard = bind_tcp_listener_in(&node_ns, ([0, 0, 0, 0], 30003).into()).unwrap();
    let server_30003 = stand_in_server(wildcard, stop_30003.clone());
    let started = std::time::Instant::now();
    env.start_plain_listeners(2).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(in_use(bind(30000)));
    let addrs = env.topology.node_addresses().unwrap();
    let mut seen = Vec::new();
    for flow in &scenario.stages[2].flows {
        seen.push(env.run_flow(flow, &addrs).await);
    }
    assert_eq!(seen[0], (Status::Pass, http.to_string()));
    assert_eq!(
        seen[1],
        (
            Status::Pass,
            "1x plain listener 127.0.0.1:30001".to_string()
        )
    );
    assert_eq!(seen[2], (Status::Pass, http.to_string()));
    assert_eq!(
        seen[3],
        (
            Status::Fail,
            format!(
                "expected UNTOUCHED, saw {http}; the runner's plain listener \
                 plain/tcp/192.168.0.2:30003 was not placed: Address already in use (os error \
                 98) (a LOCAL flow of this step has the proxy serve this port)"
            )
        )
    );
    for (stop, server) in [
        (stop_30001, server_30001),
        (stop_30002, server_30002),
        (stop_30003, server_30003),
    ] {
        stop.store(true, Ordering::Relaxed);
        server.join().unwrap();
    }

    drop(env);
    let left = leftovers(&runs);
    assert!(left.is_empty(), "the run left something behind: {left:?}");
}
