// SPDX-License-Identifier: Apache-2.0
//! A service mesh's sidecar in ebpf mode, with and without `ebpf.socketLBHostNamespaceOnly`.
//!
//! The client pod redirects its outbound TCP to a listener of its own, as Istio's init
//! container does (`iptables -t nat ... -j REDIRECT --to-ports 15001`, the sidecar's own
//! connections excluded by their mark). The listener reads where each connection was
//! going (SO_ORIGINAL_DST), connects there itself and relays one line. With socket-level
//! load balancing in pods (the default), connect() has already been translated before
//! the redirect: the sidecar sees the backend. With the setting on, it sees the ClusterIP,
//! and its own connection to the ClusterIP is load-balanced per packet by the pod-side tc
//! programs: to a pod on the node, and to a host-network endpoint (the node's address),
//! whose answers only the pod-side egress program translates back. An agent started
//! without the setting then takes the node over and detaches that program.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use serde_json::json;
use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, time_scale},
    python_backend::{python, start_backend},
    require_root,
    scenario::{Mode, agent::Agent, netns::Place},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const CLIENT: &str = "10.0.0.2";
const POD_VIP: &str = "172.30.0.41";
const POD_BACKEND: &str = "10.180.0.1";
const HOST_VIP: &str = "172.30.0.42";
const NODE_IP: &str = "192.168.0.2";
/// The sidecar's port and the mark of its own connections (Istio's are 15001 and 1337).
const SIDECAR_PORT: &str = "15001";
const SIDECAR_MARK: &str = "1337";

/// Two ClusterIP Services (80 -> 9000): one backed by a pod on the node, one by the node's
/// own address (a host-network endpoint, as the API server's is).
fn objects() -> String {
    let service = |name: &str, vip: &str, backend: &str| {
        format!(
            r#"- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: ns1}}
  spec:
    clusterIP: {vip}
    clusterIPs: [{vip}]
    ports: [{{name: p, port: 80, protocol: TCP, targetPort: 9000}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {name}-1, namespace: ns1, labels: {{kubernetes.io/service-name: {name}}}}}
  addressType: IPv4
  endpoints: [{{addresses: [{backend}], nodeName: test-node, conditions: {{ready: true}}}}]
  ports: [{{name: p, port: 9000, protocol: TCP}}]
"#
        )
    };
    node_yaml("test-node", NODE_IP)
        + &service("web", POD_VIP, POD_BACKEND)
        + &service("host", HOST_VIP, NODE_IP)
}

/// The sidecar: for every redirected connection, prints `orig ADDR:PORT`, connects there
/// (marked, so that the redirect leaves it alone), relays one line each way.
const SIDECAR: &str = r#"
import socket, struct, sys, threading
port, mark = int(sys.argv[1]), int(sys.argv[2])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(16); print("ready", flush=True)
def serve(c):
    raw = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
    dport = struct.unpack("!H", raw[2:4])[0]
    dst = socket.inet_ntoa(raw[4:8])
    print("orig %s:%d" % (dst, dport), flush=True)
    up = socket.socket(); up.setsockopt(socket.SOL_SOCKET, 36, mark)  # SO_MARK
    up.settimeout(5)
    up.connect((dst, dport))
    f, u = c.makefile("rwb", buffering=0), up.makefile("rwb", buffering=0)
    u.write(f.readline()); f.write(u.readline())
    c.close(); up.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// The application: connects to `argv[1]:argv[2]`, sends a line, prints `peer ADDR:PORT`
/// (getpeername) and the answer, or `err ERRNO`.
const APP: &str = r#"
import socket, errno, sys
s = socket.socket(); s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    peer = "%s:%d" % s.getpeername()
    s.sendall(b"hello\n")
    print("peer", peer, "answer", s.makefile("rb").readline().decode().strip())
except OSError as e:
    print("err", errno.errorcode.get(e.errno, e.errno))
"#;

/// The pod's redirect, as a mesh's init container installs it: the sidecar's own
/// connections and loopback pass, every other outbound TCP connection goes to the sidecar.
fn install_redirect(place: &Place) {
    let mark = format!("-m mark --mark {SIDECAR_MARK} -j RETURN");
    let redirect = format!("-j REDIRECT --to-ports {SIDECAR_PORT}");
    for rule in [mark.as_str(), "-d 127.0.0.0/8 -j RETURN", redirect.as_str()] {
        let mut args: Vec<String> = ["-t", "nat", "-A", "OUTPUT", "-p", "tcp"]
            .map(String::from)
            .to_vec();
        args.extend(rule.split(' ').map(String::from));
        let status = place
            .command(Path::new("iptables"), &args)
            .status()
            .expect("iptables runs");
        assert!(status.success(), "iptables {args:?}");
    }
}

struct Sidecar {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Sidecar {
    fn start(node: &TestNode) -> Self {
        let mut child = python(
            &node.topology,
            CLIENT,
            SIDECAR,
            &[SIDECAR_PORT, SIDECAR_MARK],
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let sidecar = Self { child, lines };
        assert_eq!(sidecar.next_line(), "ready", "the sidecar listens");
        sidecar
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(10) * time_scale())
            .unwrap_or_else(|e| panic!("the sidecar printed nothing: {e}"))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the application saw and what the sidecar read as the original destination.
fn ask(node: &TestNode, sidecar: &Sidecar, vip: &str) -> (String, String) {
    let out = python(&node.topology, CLIENT, APP, &[vip, "80"])
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    let app = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (app, sidecar.next_line())
}

/// The pinned links of the pod-side egress program.
fn pod_egress_links(node: &TestNode) -> Vec<String> {
    let links = node.bpffs_root().join("links");
    let mut names: Vec<String> = std::fs::read_dir(&links)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tc_pod_egress_"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Starts the agent with `host_namespace_only` (`keep`: its dataplane stays at its stop,
/// for the next agent) and asks both Services through the sidecar.
async fn through_the_sidecar(
    node: &TestNode,
    host_namespace_only: bool,
    keep: bool,
) -> (Agent, Vec<(String, String)>) {
    let overrides = json!({"ebpf": {"socketLBHostNamespaceOnly": host_namespace_only}});
    let agent = node
        .start_agent(
            Mode::Ebpf,
            overrides.as_object().cloned().unwrap_or_default(),
            keep,
            Path::new(RUNNER),
        )
        .await
        .unwrap();
    agent.check_running_mode(Mode::Ebpf).await.unwrap();
    let sidecar = Sidecar::start(node);
    let seen = vec![ask(node, &sidecar, POD_VIP), ask(node, &sidecar, HOST_VIP)];
    (agent, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_sees_the_cluster_ip_only_with_socket_lb_limited_to_the_host() {
    require_root!();
    let flows =
        format!("- {{from: {CLIENT}, to: \"{POD_VIP}:80\", expect: [\"{POD_BACKEND}:9000\"]}}");
    let node = TestNode::build(
        "mesh",
        &scenario_header("mesh", "test-node"),
        &objects(),
        &flows,
    )
    .unwrap();
    let mut children = vec![
        start_backend(&node.topology, POD_BACKEND),
        // A host-network endpoint: the node's own namespace.
        start_backend(&node.topology, NODE_IP),
    ];
    install_redirect(&node.topology.client_place(CLIENT.parse().unwrap()));

    let (mut limited_agent, limited) = through_the_sidecar(&node, true, true).await;
    assert_eq!(
        limited,
        vec![
            (
                format!("peer {POD_VIP}:80 answer {POD_BACKEND}:9000 hello"),
                format!("orig {POD_VIP}:80"),
            ),
            (
                format!("peer {HOST_VIP}:80 answer {NODE_IP}:9000 hello"),
                format!("orig {HOST_VIP}:80"),
            ),
        ],
        "with socketLBHostNamespaceOnly the sidecar reads the ClusterIP and reaches both \
         backends through it"
    );
    assert!(
        !pod_egress_links(&node).is_empty(),
        "the setting attaches tc_pod_egress to the pod devices"
    );
    limited_agent.stop();

    // The next agent, without the setting, takes over the same node.
    let (_agent, default) = through_the_sidecar(&node, false, false).await;
    assert_eq!(
        default,
        vec![
            (
                format!("peer {POD_VIP}:80 answer {POD_BACKEND}:9000 hello"),
                format!("orig {POD_BACKEND}:9000"),
            ),
            (
                format!("peer {HOST_VIP}:80 answer {NODE_IP}:9000 hello"),
                format!("orig {NODE_IP}:9000"),
            ),
        ],
        "by default connect() is translated before the redirect: the sidecar reads the \
         backend"
    );
    assert_eq!(
        pod_egress_links(&node),
        Vec::<String>::new(),
        "an agent without the setting detaches the earlier agent's tc_pod_egress"
    );
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
}
