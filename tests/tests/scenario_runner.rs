// SPDX-License-Identifier: Apache-2.0
//! Privileged checks of the scenario runner: real namespaces, listeners and probes,
//! without the agent (flows that need no proxy must pass) and with a stand-in agent
//! (configuration, namespace, cgroup, readiness, cleanup). Skipped when not root.

use std::{
    collections::BTreeSet,
    fs,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use tests::scenario::{
    Expectation, FlowReport, Mode, RunOptions, Scenario, Status,
    agent::AgentOptions,
    netns::{self, bind_tcp_listener_in, cgroup2_root},
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
        mode: Mode::Iptables,
        agent,
        runner_exe: PathBuf::from(RUNNER),
        timeout: Duration::from_millis(1000),
        keep: false,
        // The stand-in agents below check the --source command line.
        dir_source: true,
        trace_check: false,
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

/// `--mode nftables` is refused up front with the reason (the agent has no such mode yet),
/// before anything is built or started; no root needed.
#[test]
fn nftables_mode_is_refused_with_the_reason() {
    let out = Command::new(RUNNER)
        .args(["run", "--mode", "nftables", "--filter", "no-such-file"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot replay nftables mode") && stderr.contains("no nftables mode yet"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
