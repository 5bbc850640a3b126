// SPDX-License-Identifier: Apache-2.0
//! An upgrade to a new map layout version leaves no window where services don't resolve.
//!
//! Map names carry their layout version (`SVC4_V2`). An agent of a newer layout finds none of
//! its maps pinned while the previous agent's programs still run: it must fill its new maps
//! before its programs replace the running ones. The test plays the older agent's part by
//! renaming every pin of a killed agent to the version before its own (the programs it left
//! attached keep using those maps), then starts the agent and connects to the service all
//! along: every connection must be answered, the renamed maps must be gone afterwards and
//! the current layout's maps must hold the service.

use std::{
    fs,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use tests::{
    node_harness::{TestNode, node_yaml, scenario_header, service_yaml},
    require_root,
    scenario::{Mode, outcome::Attempt},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const VIP: &str = "172.30.0.41";
const CLIENT: &str = "10.0.0.2";
const BACKEND: &str = "10.180.0.1";

fn build_node() -> TestNode {
    let objects = node_yaml("test-node", "192.168.0.2")
        + &service_yaml("svc1", VIP, "TCP", BACKEND, "test-node", None);
    let flows = format!("- {{from: {CLIENT}, to: \"{VIP}:80\", expect: [\"{BACKEND}:9000\"]}}\n");
    TestNode::build(
        "layout-upgrade",
        &scenario_header("layout-upgrade", "test-node"),
        &objects,
        &flows,
    )
    .unwrap()
}

/// `count` connections from the client pod to the service, one after the other.
fn connect(node: &TestNode, count: u32) -> Vec<Attempt> {
    let args: Vec<String> = [
        "probe",
        "--from",
        CLIENT,
        "--to",
        &format!("{VIP}:80"),
        "--count",
        &count.to_string(),
        "--timeout-ms",
        "500",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let out = node
        .topology
        .client_place(CLIENT.parse().unwrap())
        .command(Path::new(RUNNER), &args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The layout version in a map's name (`SVC4_V2` -> 2).
fn layout_version(name: &str) -> u32 {
    name.rsplit_once("_V").unwrap().1.parse().unwrap()
}

fn answered_by_backend(a: &Attempt) -> bool {
    a.backend
        .is_some_and(|b| b.to_string() == format!("{BACKEND}:9000"))
}

/// Renames every pin of layout version n ≥ 1 to version n - 1: what a node upgraded from
/// an agent of the previous layout holds (each map base has one version pinned, so the
/// renames never collide).
fn pretend_previous_layout(maps_dir: &Path) -> Vec<String> {
    let mut renamed = Vec::new();
    for entry in fs::read_dir(maps_dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((base, version)) = name.rsplit_once("_V") else {
            continue;
        };
        let Some(version) = version.parse::<u32>().ok().filter(|v| *v >= 1) else {
            continue;
        };
        let old = format!("{base}_V{}", version - 1);
        fs::rename(entry.path(), maps_dir.join(&old)).unwrap();
        renamed.push(old);
    }
    renamed.sort();
    renamed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_map_layout_takes_over_without_a_window() {
    require_root!();
    let mut node = build_node();
    node.topology
        .start_listeners(Path::new(RUNNER), false)
        .unwrap();
    let runner = Path::new(RUNNER);
    let maps_dir = node.bpffs_root().join("maps");

    let mut previous = node
        .start_agent(Mode::Ebpf, Default::default(), true, runner)
        .await
        .unwrap();
    assert!(connect(&node, 1).iter().all(answered_by_backend));
    previous.kill();
    let old_pins = pretend_previous_layout(&maps_dir);
    let svc4_before = format!(
        "{}_V{}",
        "SVC4",
        layout_version(proxy_common::maps::SVC4) - 1
    );
    assert!(old_pins.contains(&svc4_before), "{old_pins:?}");
    assert!(
        connect(&node, 3).iter().all(answered_by_backend),
        "the previous programs serve from the renamed maps"
    );

    // Connections all along the new agent's start.
    let node = Arc::new(node);
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (node, stop) = (Arc::clone(&node), Arc::clone(&stop));
        thread::spawn(move || {
            let mut attempts = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                attempts.extend(connect(&node, 10));
            }
            attempts
        })
    };
    thread::sleep(Duration::from_millis(300));
    let agent = node
        .start_agent(Mode::Ebpf, Default::default(), false, runner)
        .await
        .unwrap();
    thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let attempts = prober.join().unwrap();

    let log = agent.log_tail(200);
    assert!(
        log.contains("map layout upgrade"),
        "the agent saw an upgrade and deferred attaching:\n{log}"
    );
    assert!(
        log.contains("programs of the new map layout attached"),
        "{log}"
    );
    let failed: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| !answered_by_backend(a))
        .collect();
    eprintln!(
        "{} connections during the upgrade, {} not answered by the backend",
        attempts.len(),
        failed.len()
    );
    assert!(attempts.len() >= 20, "the prober ran: {}", attempts.len());
    assert!(
        failed.is_empty(),
        "connections failed during the upgrade: {failed:#?}"
    );

    let left: Vec<String> = fs::read_dir(&maps_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.iter().all(|n| !old_pins.contains(n)),
        "the previous layout's maps are removed: {left:?}"
    );
    assert!(
        !node
            .map_entries(proxy_common::maps::SVC4)
            .unwrap()
            .is_empty(),
        "the new layout's service map holds the service"
    );
    assert!(connect(&node, 3).iter().all(answered_by_backend));
    drop(agent);
}
