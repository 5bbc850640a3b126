// SPDX-License-Identifier: Apache-2.0
//! A connected UDP socket across the removal of its backend, in ebpf mode: socket-level
//! load balancing translated it once, at connect(), so without help it would keep sending
//! to the removed pod. The agent destroys it in the sync that removes the backend; this
//! test records what the application sees on its next send() and recv(), and where a
//! reconnect to the ClusterIP goes. An unconnected socket and a socket connected to the pod
//! directly, in the same pod, are left alone.
//!
//! A second test drives the DaemonSet's socket-terminator sidecar (`proxy-agent
//! socket-terminator`) the way the agent does when it runs without CAP_SYS_ADMIN.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, ChildStdin, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use proxy_agent::proxier::ebpf::sockets::{
    Netns, PinnedRevNat, Sidecar, SockId, SocketReach as _, Translations as _,
};
use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, time_scale},
    python_backend::{python, start_ready},
    require_root,
    scenario::{Mode, topology::Topology},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const VIP: &str = "172.30.0.41";
const CLIENT: &str = "10.0.0.2";
const FIRST: &str = "10.180.0.1";
const SECOND: &str = "10.180.0.2";

/// A UDP Service (80 -> 9000) and its EndpointSlice with `backends`.
fn objects(backends: &[&str]) -> String {
    let endpoints: Vec<String> = backends
        .iter()
        .map(|b| format!("{{addresses: [{b}], nodeName: test-node, conditions: {{ready: true}}}}"))
        .collect();
    node_yaml("test-node", "192.168.0.2")
        + &format!(
            r#"- apiVersion: v1
  kind: Service
  metadata: {{name: dns, namespace: ns1}}
  spec:
    clusterIP: {VIP}
    clusterIPs: [{VIP}]
    ports: [{{name: p, port: 80, protocol: UDP, targetPort: 9000}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: dns-1, namespace: ns1, labels: {{kubernetes.io/service-name: dns}}}}
  addressType: IPv4
  endpoints: [{}]
  ports: [{{name: p, port: 9000, protocol: UDP}}]
"#,
            endpoints.join(", ")
        )
}

fn values(yaml: &str) -> Vec<serde_json::Value> {
    serde_yaml::from_str(yaml).unwrap()
}

/// The pods: the flows only place them (they are never replayed).
fn node(name: &str) -> TestNode {
    let flows = format!(
        "- {{from: {CLIENT}, to: \"{VIP}:80\", proto: udp, expect: [\"{FIRST}:9000\", \"{SECOND}:9000\"]}}"
    );
    TestNode::build(
        name,
        &scenario_header(name, "test-node"),
        &objects(&[FIRST, SECOND]),
        &flows,
    )
    .unwrap()
}

/// A UDP echo server on port 9000 of `argv[1]`: answers every datagram with its own
/// address and the sender's. Prints `ready` once bound.
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 9000))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(512)
    s.sendto(("%s:9000 %s:%d" % (sys.argv[1], peer[0], peer[1])).encode(), peer)
"#;

fn start_udp_backend(topology: &Topology, ip: &str) -> Child {
    start_ready(topology, ip, UDP_ECHO)
}

/// An application holding named UDP sockets, driven one command per line; each command
/// prints one line: `ok [result]`, `ERR <errno name>` or `TIMEOUT`.
///   connect NAME HOST PORT   connect NAME (a new socket the first time); prints the peer
///   unconnected NAME         a new socket, bound to an ephemeral port, never connected
///   send NAME | sendto NAME HOST PORT | recv NAME | local NAME | peer NAME
const APP: &str = r#"
import socket, sys, errno
timeout = float(sys.argv[1])
socks = {}
def new(name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    socks[name] = s
    return s
def out(*words):
    print(" ".join(str(w) for w in words), flush=True)
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "connect":
            s = socks.get(w[1]) or new(w[1])
            s.connect((w[2], int(w[3])))
            out("ok", "%s:%d" % s.getpeername())
        elif w[0] == "unconnected":
            new(w[1]).bind(("0.0.0.0", 0))
            out("ok")
        elif w[0] == "send":
            socks[w[1]].send(b"hello")
            out("ok")
        elif w[0] == "sendto":
            socks[w[1]].sendto(b"hello", (w[2], int(w[3])))
            out("ok")
        elif w[0] == "recv":
            out("ok", socks[w[1]].recv(512).decode())
        elif w[0] == "local":
            out("ok", "%s:%d" % socks[w[1]].getsockname())
        elif w[0] == "peer":
            out("ok", "%s:%d" % socks[w[1]].getpeername())
    except socket.timeout:
        out("TIMEOUT")
    except OSError as e:
        out("ERR", errno.errorcode.get(e.errno, e.errno))
"#;

struct App {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl App {
    fn start(topology: &Topology) -> Self {
        let timeout = time_scale().to_string();
        let mut child = python(topology, CLIENT, APP, &[&timeout])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// Runs one command and returns its line.
    fn run(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.lines
            .recv_timeout(Duration::from_secs(10) * time_scale())
            .unwrap_or_else(|e| panic!("{command}: no answer ({e})"))
    }

    /// Sends on `name` and returns the backend that answered (`ip:port`), or the error.
    fn ask(&mut self, name: &str) -> String {
        let sent = self.run(&format!("send {name}"));
        if sent != "ok" {
            return sent;
        }
        self.answer(name)
    }

    fn ask_to(&mut self, name: &str, to: &str) -> String {
        let sent = self.run(&format!("sendto {name} {to}"));
        if sent != "ok" {
            return sent;
        }
        self.answer(name)
    }

    /// The backend of the next answer on `name`, or the error.
    fn answer(&mut self, name: &str) -> String {
        let got = self.run(&format!("recv {name}"));
        match got.strip_prefix("ok ") {
            Some(reply) => reply
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string(),
            None => got,
        }
    }

    fn value(&mut self, command: &str) -> String {
        let got = self.run(command);
        got.strip_prefix("ok ")
            .unwrap_or_else(|| panic!("{command}: {got}"))
            .to_string()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn other(backend: &str) -> &'static str {
    if backend.starts_with(FIRST) {
        SECOND
    } else {
        FIRST
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connected_udp_socket_leaves_a_removed_backend() {
    require_root!();
    let mut node = node("connudp");
    let topology = &node.topology;
    let mut backends = vec![
        start_udp_backend(topology, FIRST),
        start_udp_backend(topology, SECOND),
    ];
    let mut agent = node
        .start_agent(Mode::Ebpf, Default::default(), false, Path::new(RUNNER))
        .await
        .unwrap();
    agent.check_running_mode(Mode::Ebpf).await.unwrap();

    let mut app = App::start(&node.topology);
    let vip = format!("{VIP} 80");
    assert_eq!(
        app.value(&format!("connect c {vip}")),
        format!("{VIP}:80"),
        "getpeername shows the ClusterIP"
    );
    let removed = app.ask("c");
    assert!(
        removed == format!("{FIRST}:9000") || removed == format!("{SECOND}:9000"),
        "the connected socket reaches a backend: {removed}"
    );
    for _ in 0..3 {
        assert_eq!(
            app.ask("c"),
            removed,
            "a connected socket keeps its backend"
        );
    }
    let removed_ip = removed.split(':').next().unwrap().to_string();
    let live = format!("{}:9000", other(&removed));
    let c_before = app.value("local c");
    // In the same pod: an unconnected socket to the ClusterIP, and a socket connected to
    // the (soon removed) pod directly.
    assert_eq!(app.run("unconnected u"), "ok");
    let u_first = app.ask_to("u", &vip);
    assert!(
        u_first.ends_with(":9000"),
        "the unconnected socket: {u_first}"
    );
    let u_before = app.value("local u");
    app.value(&format!("connect d {removed_ip} 9000"));
    assert_eq!(app.ask("d"), removed, "the direct socket reaches its pod");
    let d_before = app.value("local d");
    // A socket whose datagrams to the ClusterIP reached the pod before (translated per
    // datagram at sendmsg()), then connected to that pod directly: a direct socket too.
    assert_eq!(app.run("unconnected t"), "ok");
    let mut t_answers = Vec::new();
    for _ in 0..40 {
        t_answers.push(app.ask_to("t", &vip));
        if t_answers.contains(&removed) {
            break;
        }
    }
    assert!(
        t_answers.contains(&removed),
        "the ClusterIP's datagrams reach {removed} sometimes: {t_answers:?}"
    );
    app.value(&format!("connect t {removed_ip} 9000"));
    assert_eq!(app.ask("t"), removed);
    let t_before = app.value("local t");

    // The backend leaves the Service; the sync that removes it terminates the socket.
    node.apply_and_sync(&mut agent, &values(&objects(&[other(&removed)])))
        .await
        .unwrap();
    let send_after = app.run("send c");
    let recv_after = app.answer("c");
    let peer_after = app.run("peer c");
    let send_again = app.run("send c");
    // The application reacts as resolvers do: it connects again, to the Service.
    let reconnect = app.value(&format!("connect c {vip}"));
    let mut after_reconnect = Vec::new();
    for _ in 0..5 {
        after_reconnect.push(app.ask("c"));
    }
    let c_after = app.value("local c");
    let u_after_answer = app.ask_to("u", &vip);
    let u_after = app.value("local u");
    let d_after_answer = app.ask("d");
    let d_after = app.value("local d");
    let d_peer = app.value("peer d");
    let t_after_answer = app.ask("t");
    let t_after = app.value("local t");

    eprintln!(
        "connected UDP socket {c_before} -> {VIP}:80, translated to {removed}; after the \
         sync that removed {removed}:\n  send()        -> {send_after}\n  recv()        -> \
         {recv_after}\n  getpeername() -> {peer_after}\n  send() again  -> {send_again}\n  \
         connect({VIP}:80) again -> peer {reconnect}, local {c_after}; answers from \
         {after_reconnect:?}\n  unconnected socket {u_before} (after: {u_after}): \
         answered by {u_after_answer}\n  direct socket {d_before} -> {d_peer} (after: \
         {d_after}): answered by {d_after_answer}\n  socket {t_before} that sent to the \
         ClusterIP, then connected to {removed} directly (after: {t_after}): answered by \
         {t_after_answer}"
    );

    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    // What the application sees: an error it can act on, at once.
    assert_eq!(
        send_after, "ERR EDESTADDRREQ",
        "the socket was disconnected: a send without an address has nowhere to go"
    );
    assert_eq!(
        recv_after, "ERR ECONNABORTED",
        "the pending error reports the abort"
    );
    assert_eq!(peer_after, "ERR ENOTCONN");
    assert_eq!(send_again, "ERR EDESTADDRREQ");
    // Never the removed backend again; the live one after reconnecting.
    assert_eq!(reconnect, format!("{VIP}:80"));
    assert!(
        after_reconnect.iter().all(|b| *b == live),
        "after reconnecting, only the live backend {live}: {after_reconnect:?}"
    );
    // The unconnected socket is the same socket, and now reaches the live backend.
    assert_eq!(
        u_after, u_before,
        "the unconnected socket was not destroyed"
    );
    assert_eq!(u_after_answer, live);
    // The socket connected to the pod directly is untouched and still reaches it.
    assert_eq!(d_after, d_before, "the direct socket was not destroyed");
    assert_eq!(d_peer, removed);
    assert_eq!(d_after_answer, removed);
    assert_eq!(
        t_after, t_before,
        "the socket connected directly later was not destroyed"
    );
    assert_eq!(t_after_answer, removed);

    assert!(
        log.contains("connected UDP socket terminated"),
        "the agent logs the termination:\n{log}"
    );
    drop(app);
    drop(agent);
    for b in &mut backends {
        let _ = b.kill();
        let _ = b.wait();
    }
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_lists_and_destroys_what_it_is_asked_to() {
    require_root!();
    let node = node("connudp-sidecar");
    let topology = &node.topology;
    let mut backends = vec![
        start_udp_backend(topology, FIRST),
        start_udp_backend(topology, SECOND),
    ];
    let agent = node
        .start_agent(Mode::Ebpf, Default::default(), false, Path::new(RUNNER))
        .await
        .unwrap();
    agent.check_running_mode(Mode::Ebpf).await.unwrap();
    let mut app = App::start(&node.topology);
    app.value(&format!("connect c {VIP} 80"));
    let backend = app.ask("c");
    let local = app.value("local c");

    // The sidecar, in the node's namespace like the DaemonSet's (host network).
    let socket = node.topology.run_dir.join("socket-terminator.sock");
    let mut sidecar = node
        .node_place()
        .command(
            &TestNode::agent_binary(),
            &[
                "socket-terminator".into(),
                "--socket".into(),
                socket.display().to_string(),
            ],
        )
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let mut reach = Sidecar {
        socket: socket.clone(),
    };
    let listing = reach.list().unwrap();
    let ours: Vec<(Netns, SockId)> = listing
        .sockets
        .iter()
        .filter(|(_, id)| id.local.to_string() == local)
        .cloned()
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "the app's socket is listed once: {listing:#?}"
    );
    let (netns, id) = &ours[0];
    assert_eq!(id.peer.to_string(), backend, "connected to its backend");
    assert!(
        netns
            .path
            .as_ref()
            .is_some_and(|p| p.display().to_string().contains(&node.topology.id)),
        "found in the client pod's namespace, not the node's: {netns}"
    );
    // The agent's side: the pinned maps say it was translated, and from where.
    let mut lookups = PinnedRevNat {
        v4: node.pinned_map("SOCK_REV_NAT4_V2"),
        v6: node.pinned_map("SOCK_REV_NAT6_V2"),
    };
    let translated = lookups.translated(&ours).unwrap();
    assert_eq!(
        translated.len(),
        1,
        "recorded as translated: {translated:?}"
    );
    assert_eq!(translated[0].1.frontend.to_string(), format!("{VIP}:80"));
    let found = translated[0].1;
    let done = reach.destroy(vec![(netns.clone(), found.id)]).unwrap();
    assert_eq!(done.destroyed.len(), 1, "{done:#?}");
    let recv = app.answer("c");
    eprintln!(
        "sidecar: listed {} connected UDP sockets in {} namespaces; destroyed {local} -> {backend}; the app's recv() -> {recv}",
        listing.sockets.len(),
        listing.searched
    );
    assert_eq!(recv, "ERR ECONNABORTED");

    let _ = sidecar.kill();
    let _ = sidecar.wait();
    drop(app);
    drop(agent);
    for b in &mut backends {
        let _ = b.kill();
        let _ = b.wait();
    }
    drop(node);
}
