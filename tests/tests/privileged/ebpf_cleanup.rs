// SPDX-License-Identifier: Apache-2.0
//! Issue 18's rollback acceptance: on any kernel, `--cleanup` and a switch to iptables mode
//! leave none of our tc filters or XDP programs on the node, and a NodePort is no longer
//! translated by them. Before 6.6 (no TCX) tc programs are netlink filters on a clsact
//! qdisc that the pins do not hold: the qemu guest (Debian's 6.1, tests/tests/vm_guest.rs
//! `guest::ebpf_cleanup`) runs this test for that path. On a TCX kernel the agent's own
//! filters are links, so the test also plants what an agent on an older kernel (or an
//! older agent) leaves: a netlink tc filter and a netlink-attached XDP program running our
//! programs, beside a filter that is not ours, which must stay.
//!
//! The node: ebpf mode with XDP (generic) on its uplink, a NodePort service whose backend
//! answers an external client. 1) `--cleanup` after the agent was killed (its dataplane
//! left as a crash leaves it): nothing of ours in `tc filter show` on any device nor in
//! `ip -d link` (XDP), and the NodePort is refused. 2) ebpf again, restarted once (one
//! filter of ours per device and hook, at our priority and handle), killed, the backend
//! changed in the API, then the agent in iptables mode: the same leftovers check, and the
//! NodePort answers from the NEW backend: BPF programs left behind would translate at tc
//! ingress, before netfilter, to the old backend from their frozen maps.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Map, Value, json};
use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, service_yaml, time_scale},
    privileged::TempBpffs,
    require_root,
    scenario::{Mode, cluster::ClusterSource, netns::Place},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const VIP: &str = "172.30.0.52";
const NODE_IP: &str = "192.168.0.2";
const NODE_PORT: u16 = 30052;
const CLIENT: &str = "203.0.113.2";
const FIRST: &str = "10.181.0.1";
const SECOND: &str = "10.181.0.2";
const PLANTED: &str = "kpe-planted";

/// What the kernel tools print of our programs: tc shows the filter's name (aya: the
/// program's) and the kernel's 15-character program name; ip shows the XDP program's.
const OUR_NAMES: &[&str] = &["tc_uplink_", "tc_pod_ingre", "xdp_uplink"];

fn objects(backend: &str) -> String {
    node_yaml("cleanup-node", NODE_IP)
        + &service_yaml("svc1", VIP, "TCP", backend, "cleanup-node", Some(NODE_PORT))
}

/// The flows only place the client and both backends (they are never replayed).
fn node() -> TestNode {
    let flows = format!(
        "- {{from: {CLIENT}, to: \"{NODE_IP}:{NODE_PORT}\", expect: [\"{FIRST}:9000\"]}}\n\
         steps:\n\
         - objects: []\n  \
           flows:\n  \
           - {{from: {CLIENT}, to: \"{NODE_IP}:{NODE_PORT}\", expect: [\"{SECOND}:9000\"]}}"
    );
    TestNode::build(
        "ebpfclean",
        &scenario_header("ebpfclean", "cleanup-node"),
        &objects(FIRST),
        &flows,
    )
    .unwrap()
}

fn xdp_generic() -> Map<String, Value> {
    match json!({"ebpf": {"xdpMode": "generic"}}) {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

fn kernel_has_tcx() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().ok());
    matches!((parts.next(), parts.next()), (Some(Some(major)), Some(Some(minor))) if (major, minor) >= (6, 6))
}

/// The backend that answered a NodePort connection from the external client, or the
/// outcome (`refused`, `timeout`) when none did.
fn node_port_answer(node: &TestNode) -> String {
    let args: Vec<String> = [
        "probe",
        "--from",
        CLIENT,
        "--to",
        &format!("{NODE_IP}:{NODE_PORT}"),
        "--proto",
        "tcp",
        "--timeout-ms",
        &(2000 * time_scale()).to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let client: IpAddr = CLIENT.parse().unwrap();
    let out = node
        .topology
        .client_place(client)
        .command(Path::new(RUNNER), &args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let attempt: Value = serde_json::from_str(text.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("probe output {text:?}: {e}"));
    match attempt["backend"].as_str() {
        Some(backend) => backend.to_string(),
        None => attempt["outcome"].as_str().unwrap_or("?").to_string(),
    }
}

/// The node's links.
fn links(node: &TestNode) -> Vec<String> {
    let links: Value = serde_json::from_str(&node.output("ip", &["-j", "link", "show"]).unwrap())
        .unwrap_or_default();
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// The link holding the node's address: where tc's uplink programs and XDP run.
fn uplink(node: &TestNode) -> String {
    let addresses: Value =
        serde_json::from_str(&node.output("ip", &["-j", "addr", "show"]).unwrap()).unwrap();
    addresses
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| {
            l["addr_info"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|a| a["local"] == NODE_IP)
        })
        .and_then(|l| l["ifname"].as_str().map(str::to_string))
        .expect("the node's uplink")
}

/// Our programs as `tc filter show` (every device, both hooks) and `ip -d link` (XDP)
/// show them, one line each.
#[derive(Debug, Default)]
struct Ours {
    filters: Vec<String>,
    xdp: Vec<String>,
}

impl Ours {
    fn is_empty(&self) -> bool {
        self.filters.is_empty() && self.xdp.is_empty()
    }
}

fn is_ours(line: &str) -> bool {
    OUR_NAMES.iter().any(|name| line.contains(name))
}

fn ours(node: &TestNode) -> Ours {
    let mut seen = Ours::default();
    for device in links(node) {
        for hook in ["ingress", "egress"] {
            let shown = node
                .output("tc", &["filter", "show", "dev", &device, hook])
                .unwrap();
            seen.filters.extend(
                shown
                    .lines()
                    .filter(|l| is_ours(l))
                    .map(|l| format!("{device} {hook}: {}", l.trim())),
            );
        }
        let shown = node
            .output("ip", &["-d", "link", "show", "dev", &device])
            .unwrap();
        seen.xdp.extend(
            shown
                .lines()
                .filter(|l| l.contains("xdp") && is_ours(l))
                .map(|l| format!("{device}: {}", l.trim())),
        );
    }
    seen
}

fn run(node: &TestNode, program: &str, args: &[&str]) {
    let place = Place {
        netns: node.topology.node_ns.clone(),
        cgroup: None,
    };
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = place
        .command(Path::new(program), &args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The id of the program `json` (one `tc -j filter show` entry, or `bpftool -j link`)
/// names.
fn prog_id_of_filters(json: &str) -> Option<u64> {
    let filters: Value = serde_json::from_str(json).ok()?;
    filters
        .as_array()?
        .iter()
        .find_map(|f| f["options"]["prog"]["id"].as_u64())
}

/// What an agent attaching through netlink leaves, planted beside this one's dataplane
/// on a device of its own (made the first time): our egress program as a netlink tc filter (a priority and
/// handle of its own) and our XDP program attached through netlink (no bpf_link), with
/// a filter that is not ours.
fn plant_netlink_attachments(node: &TestNode, uplink: &str) {
    let shown: Value = serde_json::from_str(
        &node
            .output("ip", &["-j", "-d", "link", "show", uplink])
            .unwrap(),
    )
    .unwrap();
    let xdp_id = shown[0]["xdp"]["prog"]["id"]
        .as_u64()
        .expect("XDP runs on the uplink");
    let tc_pin = node
        .bpffs_root()
        .join("links")
        .join(format!("tc_uplink_egress_{uplink}"));
    let tc_id = if tc_pin.exists() {
        let out = Command::new("bpftool")
            .args(["-j", "link", "show", "pinned"])
            .arg(&tc_pin)
            .output()
            .unwrap();
        let link: Value = serde_json::from_slice(&out.stdout).unwrap();
        link["prog_id"].as_u64()
    } else {
        prog_id_of_filters(
            &node
                .output("tc", &["-j", "filter", "show", "dev", uplink, "egress"])
                .unwrap(),
        )
    }
    .expect("the egress program runs on the uplink");
    let pins = TempBpffs::new("kpe-planted");
    std::fs::create_dir_all(&pins.path).unwrap();
    let pin = |id: u64, name: &str| -> PathBuf {
        let path = pins.path.join(name);
        let status = Command::new("bpftool")
            .args(["prog", "pin", "id", &id.to_string()])
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "bpftool prog pin id {id}");
        path
    };
    let xdp_pin = pin(xdp_id, "xdp");
    let made = links(node).iter().any(|l| l == PLANTED);
    let tc_pin = pin(tc_id, "tc");
    let (xdp_pin, tc_pin) = (xdp_pin.display().to_string(), tc_pin.display().to_string());
    if !made {
        // A veth: some kernels (this host's) have no dummy driver.
        run(
            node,
            "ip",
            &[
                "link",
                "add",
                PLANTED,
                "type",
                "veth",
                "peer",
                "name",
                "kpe-planted-p",
            ],
        );
        run(node, "ip", &["link", "set", PLANTED, "up"]);
        run(node, "tc", &["qdisc", "add", "dev", PLANTED, "clsact"]);
        run(
            node,
            "tc",
            &[
                "filter", "add", "dev", PLANTED, "ingress", "prio", "9", "u32", "match", "u32",
                "0", "0",
            ],
        );
    }
    run(
        node,
        "ip",
        &[
            "link",
            "set",
            "dev",
            PLANTED,
            "xdpgeneric",
            "pinned",
            &xdp_pin,
        ],
    );
    run(
        node,
        "tc",
        &[
            "filter", "add", "dev", PLANTED, "egress", "prio", "7", "handle", "7", "bpf", "da",
            "pinned", &tc_pin,
        ],
    );
    // The attachments hold the programs now.
    for pin in [&xdp_pin, &tc_pin] {
        let _ = std::fs::remove_file(pin);
    }
    let _ = std::fs::remove_dir(&pins.path);
}

fn foreign_filter(node: &TestNode) -> String {
    node.output("tc", &["filter", "show", "dev", PLANTED, "ingress"])
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_and_a_switch_to_iptables_leave_no_tc_filter_or_xdp() {
    require_root!();
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let mut node = node();
    let runner = Path::new(RUNNER);
    node.topology.start_listeners(runner, false).unwrap();
    let uplink = uplink(&node);

    // 1. ebpf mode with XDP, killed as a crash leaves it; then --cleanup.
    let mut ebpf = node
        .start_agent(Mode::Ebpf, xdp_generic(), true, runner)
        .await
        .unwrap();
    assert_eq!(node_port_answer(&node), format!("{FIRST}:9000"));
    let seen = ours(&node);
    assert!(
        seen.xdp.iter().any(|l| l.contains("xdp_uplink")),
        "XDP runs on the uplink: {seen:?}"
    );
    assert!(
        kernel_has_tcx()
            || seen
                .filters
                .iter()
                .any(|l| l.starts_with(&format!("{uplink} ingress"))),
        "without TCX, tc programs are netlink filters: {seen:?}"
    );
    ebpf.kill();
    plant_netlink_attachments(&node, &uplink);
    let seen = ours(&node);
    assert!(
        seen.filters.iter().any(|l| l.starts_with(PLANTED))
            && seen.xdp.iter().any(|l| l.starts_with(PLANTED)),
        "the planted netlink attachments show: {seen:?}"
    );
    let foreign = foreign_filter(&node);
    assert!(foreign.contains("u32"), "{foreign}");
    let bpffs = node.bpffs_root().display().to_string();
    for run in 1..=2 {
        let out = node
            .node_place()
            .command(
                &binary,
                &[
                    "--cleanup".to_string(),
                    "--bpffs-root".into(),
                    bpffs.clone(),
                ],
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "--cleanup run {run} exits 0: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen = ours(&node);
        assert!(
            seen.is_empty(),
            "--cleanup run {run} left: {seen:?}; it said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        foreign_filter(&node),
        foreign,
        "a filter that is not ours stays"
    );
    let answer = node_port_answer(&node);
    assert!(
        answer == "refused" || answer == "timeout",
        "after --cleanup nothing translates the NodePort: {answer}"
    );

    // 2. ebpf again, restarted once (an upgrade): one filter of ours per device and hook.
    for start in 1..=2 {
        let mut ebpf = node
            .start_agent(Mode::Ebpf, xdp_generic(), true, runner)
            .await
            .unwrap();
        assert_eq!(node_port_answer(&node), format!("{FIRST}:9000"));
        ebpf.kill();
        let seen = ours(&node);
        let mut hooks: Vec<&str> = seen
            .filters
            .iter()
            .filter_map(|l| l.split(": ").next())
            .collect();
        let count = hooks.len();
        hooks.dedup();
        assert_eq!(
            hooks.len(),
            count,
            "start {start}: a filter per hook: {seen:?}"
        );
        assert!(
            kernel_has_tcx()
                || seen
                    .filters
                    .iter()
                    .all(|l| l.contains("pref 19280") && l.contains("handle 0x4b50")),
            "start {start}: our priority and handle: {seen:?}"
        );
    }
    // The backend changes; iptables mode starts.
    plant_netlink_attachments(&node, &uplink);
    let second: Vec<Value> = serde_yaml::from_str(&objects(SECOND)).unwrap();
    node.source.apply_state(&second).unwrap();
    let mut iptables = node
        .start_agent(Mode::Iptables, Map::new(), false, runner)
        .await
        .unwrap();
    let seen = ours(&node);
    assert!(seen.is_empty(), "iptables mode started over: {seen:?}");
    assert_eq!(
        node_port_answer(&node),
        format!("{SECOND}:9000"),
        "iptables serves the NodePort (frozen BPF maps would send it to {FIRST})"
    );
    assert_eq!(foreign_filter(&node), foreign);
    iptables.stop();
}
