// SPDX-License-Identifier: Apache-2.0
//! Every mode keeps connections through an agent crash and restart and through a change
//! of the service's backends: an established TCP connection to a ClusterIP keeps working
//! while the agent is SIGKILLed and started again and while its backend leaves the
//! service, new connections work while the agent is down, and afterwards they go to the
//! new backend.
//!
//! ipvs mode also shows that the restarted agent does not flush: the IPVS table reads the
//! same before the crash and after the restart, and the cumulative connection counts of
//! its virtual and real servers carry on (a server deleted and added again would start
//! from zero). Where the kernel has no IPVS the ipvs test skips with the reason; the qemu
//! guest (tests/tests/vm_guest.rs, `guest::ipvs_scenarios`) runs it, its timing stretched
//! by `SCENARIO_TIME_SCALE`.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, ChildStdin, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime},
};

use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, service_yaml, time_scale},
    python_backend::{python, start_backend},
    require_root,
    scenario::{Mode, topology::Topology},
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

/// One long-lived connection: a line every 100 ms until its standard input closes (or
/// `argv[3]` seconds pass); prints each answer or the error.
const STREAM_CLIENT: &str = r#"
import socket, sys, threading, time
s = socket.create_connection((sys.argv[1], 80), timeout=float(sys.argv[2]))
print("peer %s:%d" % s.getpeername()[:2], flush=True)
f = s.makefile("rwb", buffering=0)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
end = time.time() + float(sys.argv[3])
n = 0
while time.time() < end and not stop.is_set():
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
s = socket.create_connection((sys.argv[1], 80), timeout=float(sys.argv[2]))
s.sendall(b"hello\n")
print(s.makefile().readline().split()[0])
"#;

/// A socket timeout for the clients: 2 s, stretched on slow machines.
fn socket_timeout() -> String {
    (2 * time_scale()).to_string()
}

fn one_shot(topology: &Topology) -> String {
    let out = python(topology, CLIENT, ONE_SHOT, &[VIP, &socket_timeout()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Seconds since the epoch, as the clients print them.
fn epoch_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipvs_established_connections_survive_a_restart_and_a_backend_change() {
    require_root!();
    tests::require_ipvs!();
    restart_and_backend_change(Mode::Ipvs).await;
}

/// What ipvs mode's table reads before the crash: the lines and their connection counts.
struct IpvsBefore {
    table: std::collections::BTreeSet<String>,
    counts: std::collections::BTreeMap<String, u64>,
}

/// Waits until the counts show both connections so far (the first one-shot and the
/// long-lived one): the kernel folds its per-CPU counters into what it lists only every
/// couple of seconds.
fn ipvs_before(node: &TestNode) -> IpvsBefore {
    let table = node.ipvs_table().unwrap();
    let service = format!("TCP {VIP}:80");
    assert!(
        table
            .iter()
            .any(|l| l.starts_with(&format!("{service} rr"))),
        "the virtual server: {table:#?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10) * time_scale();
    loop {
        let counts = node.ipvs_connection_counts().unwrap();
        if counts.get(&service).is_some_and(|c| *c >= 2) {
            return IpvsBefore { table, counts };
        }
        assert!(
            Instant::now() < deadline,
            "the virtual server counts both connections: {counts:#?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// The restarted agent kept the table: the same lines, and no count back at zero (or
/// lower than before the crash).
fn assert_not_flushed(node: &TestNode, before: &IpvsBefore) {
    let table = node.ipvs_table().unwrap();
    assert_eq!(table, before.table, "the IPVS table after the restart");
    let counts = node.ipvs_connection_counts().unwrap();
    for (server, was) in &before.counts {
        let now = counts.get(server).copied().unwrap_or(0);
        assert!(
            now >= *was,
            "{server} counts {now} connections after the restart, {was} before: it was \
             deleted and added again\nbefore {:#?}\nafter {counts:#?}",
            before.counts
        );
    }
    eprintln!(
        "ipvs: {} table lines unchanged; connection counts before the crash {:?}, after the \
         restart {counts:?}",
        table.len(),
        before.counts
    );
}

/// Ends the long-lived client (closing its standard input) and returns its output.
fn finish(mut client: Child, stdin: ChildStdin, rx: &mpsc::Receiver<String>) -> Vec<String> {
    drop(stdin);
    let status = client.wait().unwrap();
    let lines: Vec<String> = rx.try_iter().collect();
    assert!(status.success(), "{lines:#?}");
    lines
}

async fn restart_and_backend_change(mode: Mode) {
    let scale = time_scale();
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
    first.check_running_mode(mode).await.unwrap();
    assert_eq!(one_shot(topology), format!("{FIRST}:9000"));

    // A long-lived connection, watched from a thread.
    let longest = (120 * scale).to_string();
    let mut client = python(
        topology,
        CLIENT,
        STREAM_CLIENT,
        &[VIP, &socket_timeout(), &longest],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let stdin = client.stdin.take().unwrap();
    let stdout = client.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let peer = rx.recv_timeout(Duration::from_secs(5) * scale).unwrap();
    assert_eq!(
        peer,
        format!("peer {VIP}:80"),
        "getpeername shows the ClusterIP"
    );
    thread::sleep(Duration::from_secs(1));
    let ipvs = (mode == Mode::Ipvs).then(|| ipvs_before(&node));

    // Crash: the dataplane keeps serving, new connections included.
    first.kill();
    let killed_at = SystemTime::now();
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
    let restarted_at = SystemTime::now();
    assert!(down_since.elapsed() < Duration::from_secs(30) * scale);
    if let Some(before) = &ipvs {
        assert_not_flushed(&node, before);
    }

    // The backend leaves the service: the established connection stays with it, new
    // connections go to the new backend.
    node.apply_and_sync(&mut second, &values(&objects(SECOND)))
        .await
        .unwrap();
    let topology = &node.topology;
    assert_eq!(one_shot(topology), format!("{SECOND}:9000"));
    let changed_at = SystemTime::now();
    // The connection keeps talking for a while after the change.
    thread::sleep(Duration::from_secs(1) * scale);

    let lines = finish(client, stdin, &rx);
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
        answers.len() > 20
            && answers.first().unwrap().0 < epoch_seconds(killed_at)
            && answers.last().unwrap().0 > epoch_seconds(changed_at),
        "the connection kept talking from before the crash to after the change: {lines:#?}"
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
        longest_gap < f64::from(scale),
        "no stall longer than {scale} s (saw {longest_gap:.3} s)"
    );
    eprintln!(
        "{mode}: {} answers on one connection, longest gap {longest_gap:.3} s; agent down \
         for {:.1} s",
        answers.len(),
        epoch_seconds(restarted_at) - epoch_seconds(killed_at)
    );

    drop(second);
    for b in &mut backends {
        let _ = b.kill();
        let _ = b.wait();
    }
    drop(node);
}
