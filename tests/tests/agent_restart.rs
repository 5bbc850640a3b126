// SPDX-License-Identifier: Apache-2.0
//! ebpf and iptables modes keep connections through an agent crash and restart and
//! through a change of the service's backends: an established TCP connection to a
//! ClusterIP keeps working while the agent is SIGKILLed and started again and while its
//! backend leaves the service, new connections work while the agent is down, and
//! afterwards they go to the new backend.

use std::{
    io::{BufRead, BufReader},
    net::IpAddr,
    path::Path,
    process::{Child, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime},
};

use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, service_yaml},
    require_root,
    scenario::{Mode, cluster::ClusterSource, readiness::Change, topology::Topology},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const VIP: &str = "172.30.0.41";
const CLIENT: &str = "10.0.0.2";
const FIRST: &str = "10.180.0.1";
const SECOND: &str = "10.180.0.2";

fn objects(backend: &str) -> String {
    node_yaml("test-node", "192.168.0.2")
        + &service_yaml("svc1", VIP, "TCP", backend, "test-node", None)
}

/// The pods: the flows only place them (they are never replayed).
fn node(mode: Mode) -> TestNode {
    let flows = format!(
        "- {{from: {CLIENT}, to: \"{VIP}:80\", expect: [\"{FIRST}:9000\"]}}\n\
         steps:\n\
         - objects: []\n  \
           flows:\n  \
           - {{from: {CLIENT}, to: \"{VIP}:80\", expect: [\"{SECOND}:9000\"]}}"
    );
    TestNode::build(
        &format!("restart-{mode}"),
        &scenario_header("restart", "test-node"),
        &objects(FIRST),
        &flows,
    )
    .unwrap()
}

fn values(yaml: &str) -> Vec<serde_json::Value> {
    serde_yaml::from_str(yaml).unwrap()
}

/// A line-echo server: every line comes back with the server's address in front.
const STREAM_ECHO: &str = r#"
import socket, sys, threading
def serve(c):
    own = "%s:%d" % c.getsockname()[:2]
    f = c.makefile("rwb", buffering=0)
    for line in f:
        f.write(("%s %s" % (own, line.decode())).encode())
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], 9000)); l.listen(16); print("ready", flush=True)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// One long-lived connection: a line every 100 ms; prints each answer or the error.
const STREAM_CLIENT: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=2)
print("peer %s:%d" % s.getpeername()[:2], flush=True)
f = s.makefile("rwb", buffering=0)
end = time.time() + float(sys.argv[2])
n = 0
while time.time() < end:
    n += 1
    try:
        f.write(b"%d\n" % n)
        print("ok %.3f %s" % (time.time(), f.readline().decode().strip()), flush=True)
    except Exception as e:
        print("ERR %s" % e, flush=True)
        break
    time.sleep(0.1)
"#;

/// A one-shot connection: prints the backend that answered.
const ONE_SHOT: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], 80), timeout=2)
s.sendall(b"hello\n")
print(s.makefile().readline().split()[0])
"#;

fn python(topology: &Topology, ip: &str, script: &str, args: &[&str]) -> std::process::Command {
    let place = topology.client_place(ip.parse::<IpAddr>().unwrap());
    let mut all = vec!["-c".to_string(), script.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    place.command(Path::new("python3"), &all)
}

fn start_backend(topology: &Topology, ip: &str) -> Child {
    let mut child = python(topology, ip, STREAM_ECHO, &[ip])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

fn one_shot(topology: &Topology) -> String {
    let out = python(topology, CLIENT, ONE_SHOT, &[VIP]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebpf_established_connections_survive_a_restart_and_a_backend_change() {
    require_root!();
    restart_and_backend_change(Mode::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_established_connections_survive_a_restart_and_a_backend_change() {
    require_root!();
    restart_and_backend_change(Mode::Iptables).await;
}

async fn restart_and_backend_change(mode: Mode) {
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let mut node = node(mode);
    let runner = Path::new(RUNNER);
    let topology = &node.topology;
    let mut backends = vec![
        start_backend(topology, FIRST),
        start_backend(topology, SECOND),
    ];

    // The first agent is killed, not stopped: its pins must stay for the second one.
    let mut first = node
        .start_agent(mode, Default::default(), true, runner)
        .await
        .unwrap();
    assert_eq!(one_shot(topology), format!("{FIRST}:9000"));

    // A long-lived connection, watched from a thread.
    let mut client = python(topology, CLIENT, STREAM_CLIENT, &[VIP, "9"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = client.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let peer = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        peer,
        format!("peer {VIP}:80"),
        "getpeername shows the ClusterIP"
    );
    thread::sleep(Duration::from_secs(1));

    // Crash: the dataplane keeps serving, new connections included.
    first.kill();
    let down_since = Instant::now();
    assert_eq!(
        one_shot(topology),
        format!("{FIRST}:9000"),
        "a new connection while the agent is down"
    );
    thread::sleep(Duration::from_secs(1));
    let mut second = node
        .start_agent(mode, Default::default(), false, runner)
        .await
        .unwrap();
    assert!(down_since.elapsed() < Duration::from_secs(30));

    // The backend leaves the service: the established connection stays with it, new
    // connections go to the new backend.
    let started = SystemTime::now();
    node.source.apply_state(&values(&objects(SECOND))).unwrap();
    second
        .wait_synced(Change {
            started,
            at: SystemTime::now(),
            initial: false,
        })
        .await
        .unwrap();
    assert_eq!(one_shot(topology), format!("{SECOND}:9000"));

    let status = client.wait().unwrap();
    let lines: Vec<String> = rx.try_iter().collect();
    assert!(status.success());
    assert!(lines.iter().all(|l| !l.starts_with("ERR")), "{lines:#?}");
    let answers: Vec<(f64, &str)> = lines
        .iter()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("ok"))
                .then(|| (w.next().unwrap().parse().unwrap(), w.next().unwrap()))
        })
        .collect();
    assert!(
        answers.len() > 60,
        "the connection kept talking: {lines:#?}"
    );
    assert!(
        answers
            .iter()
            .all(|(_, backend)| *backend == format!("{FIRST}:9000")),
        "always the same backend: {lines:#?}"
    );
    let longest_gap = answers
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(0.0, f64::max);
    assert!(
        longest_gap < 1.0,
        "no stall longer than a second (saw {longest_gap:.3} s)"
    );

    drop(second);
    for b in &mut backends {
        let _ = b.kill();
        let _ = b.wait();
    }
    drop(node);
}
