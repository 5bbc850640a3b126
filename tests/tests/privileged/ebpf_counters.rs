// SPDX-License-Identifier: Apache-2.0
//! ebpf mode's own drop and reject counters, end to end: a connection refused by a socket
//! program (the node to a ClusterIP without endpoints), one refused by the uplink's tc
//! program (outside to that Service's NodePort) and SYNs it drops (outside to an
//! eTP=Local NodePort whose endpoints are on another node) reach
//! `kubeproxy_ebpf_datapath_rejects_total` and `kubeproxy_ebpf_datapath_drops_total`
//! by reason, and `proxy-agent status` shows the same counts beside the programs, the
//! maps and the last sync.

use std::{path::Path, process::Stdio, time::Duration};

use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, time_scale},
    require_root,
    scenario::{
        Mode,
        agent::{METRICS_BIND, get_in},
        netns::Place,
    },
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const NODE_IP: &str = "192.168.0.2";
const EXTERNAL: &str = "203.0.113.2";

/// `empty`: a NodePort Service without endpoints; `elsewhere`: an eTP=Local NodePort whose
/// only endpoint is on another node.
fn objects() -> String {
    node_yaml("test-node", NODE_IP)
        + r#"- apiVersion: v1
  kind: Service
  metadata: {name: empty, namespace: ns1}
  spec:
    type: NodePort
    clusterIP: 172.30.0.50
    clusterIPs: [172.30.0.50]
    ports: [{name: p, port: 80, protocol: TCP, targetPort: 9000, nodePort: 30050}]
- apiVersion: v1
  kind: Service
  metadata: {name: elsewhere, namespace: ns1}
  spec:
    type: NodePort
    externalTrafficPolicy: Local
    clusterIP: 172.30.0.51
    clusterIPs: [172.30.0.51]
    ports: [{name: p, port: 80, protocol: TCP, targetPort: 9000, nodePort: 30051}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: elsewhere-1, namespace: ns1, labels: {kubernetes.io/service-name: elsewhere}}
  addressType: IPv4
  endpoints: [{addresses: [10.180.1.1], nodeName: other-node, conditions: {ready: true}}]
  ports: [{name: p, port: 9000, protocol: TCP}]
"#
}

/// A TCP connect from `place` to `to` (`IP PORT`): `ok`, or the errno's name.
fn connect(place: &Place, to: &str) -> String {
    let script = "import socket, sys, errno\n\
                  s = socket.socket(); s.settimeout(float(sys.argv[3]))\n\
                  try:\n    s.connect((sys.argv[1], int(sys.argv[2]))); print('ok')\n\
                  except socket.timeout:\n    print('timeout')\n\
                  except OSError as e:\n    print(errno.errorcode.get(e.errno, e.errno))\n";
    let mut args = vec!["-c".to_string(), script.to_string()];
    args.extend(to.split(' ').map(str::to_string));
    args.push(time_scale().to_string());
    let out = place
        .command(Path::new("python3"), &args)
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The value of the sample `name{reason="reason"}` on the metrics page.
fn sample(page: &str, name: &str, reason: &str) -> Option<u64> {
    let prefix = format!("{name}{{reason=\"{reason}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_and_rejects_are_counted_by_reason_and_shown_by_status() {
    require_root!();
    let flows = format!(
        "- {{from: {EXTERNAL}, to: \"{NODE_IP}:30050\", expect: REJECT}}\n\
         - {{from: 10.0.0.2, to: \"172.30.0.50:80\", expect: REJECT}}"
    );
    let node = TestNode::build(
        "counters",
        &scenario_header("counters", "test-node"),
        &objects(),
        &flows,
    )
    .unwrap();
    let agent = node
        .start_agent(Mode::Ebpf, Default::default(), false, Path::new(RUNNER))
        .await
        .unwrap();
    agent.check_running_mode(Mode::Ebpf).await.unwrap();
    let outside = node.topology.client_place(EXTERNAL.parse().unwrap());

    assert_eq!(
        connect(&node.node_place(), "172.30.0.50 80"),
        "ECONNREFUSED"
    );
    assert_eq!(
        connect(&outside, &format!("{NODE_IP} 30050")),
        "ECONNREFUSED"
    );
    assert_eq!(connect(&outside, &format!("{NODE_IP} 30051")), "timeout");

    let page = get_in(
        &node.topology.node_ns,
        &format!("http://{METRICS_BIND}/metrics"),
        Duration::from_secs(5),
    )
    .expect("the metrics page")
    .body;
    let rejects = "kubeproxy_ebpf_datapath_rejects_total";
    let drops = "kubeproxy_ebpf_datapath_drops_total";
    assert!(
        page.contains(&format!("# TYPE {rejects} counter")),
        "{page}"
    );
    assert_eq!(
        sample(&page, rejects, "no_endpoints"),
        Some(2),
        "one refusal by the socket program, one by tc"
    );
    assert_eq!(sample(&page, rejects, "unserved_port"), Some(0));
    let dropped_syns = sample(&page, drops, "no_local_endpoints").unwrap_or(0);
    assert!(
        dropped_syns >= 1,
        "the SYNs to the eTP=Local NodePort (and their retransmissions): {dropped_syns}"
    );
    assert_eq!(sample(&page, drops, "source_range"), Some(0));

    // status: the same counters, the programs where they are attached, maps, last sync.
    let bpffs = node.bpffs_root().display().to_string();
    let status = node
        .run(
            &TestNode::agent_binary(),
            &[
                "status",
                "--bpffs-root",
                &bpffs,
                "--metrics-address",
                METRICS_BIND,
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    eprintln!("proxy-agent status:\n{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let has = |row: &[&str]| rows.iter().any(|r| r.as_slice() == row);
    assert!(
        text.starts_with("mode: ebpf\nagent: running, healthy\n"),
        "{text}"
    );
    assert!(text.contains("last sync: IPv4 "), "{text}");
    for program in ["sock_connect4", "sock_sendmsg6", "sock_getpeername4"] {
        assert!(has(&[program, "cgroup", "link"]), "{program} in:\n{text}");
    }
    let uplink = tests::scenario::topology::UPLINK;
    assert!(has(&["tc_uplink_ingress", uplink, "link"]), "{text}");
    assert!(has(&["tc_uplink_egress", uplink, "link"]), "{text}");
    assert!(
        rows.iter().any(|r| r.first() == Some(&"tc_pod_ingress")),
        "the pod devices: {text}"
    );
    assert!(
        rows.iter()
            .any(|r| r.first() == Some(&"SVC4_V2") && r.len() == 4),
        "the service map's fill: {text}"
    );
    assert!(has(&["reject", "no_endpoints", "2"]), "{text}");
    let status_drops: u64 = rows
        .iter()
        .find(|r| r.len() == 3 && r[0] == "drop" && r[1] == "no_local_endpoints")
        .and_then(|r| r[2].parse().ok())
        .unwrap_or(0);
    assert!(
        status_drops >= dropped_syns,
        "status shows the dropped SYNs ({status_drops} >= {dropped_syns}): {text}"
    );
}
