// SPDX-License-Identifier: Apache-2.0
//! An API outage leaves the dataplane alone, and the agent converges quickly once the API
//! is back: the test API server drops every connection for 60 s (`OUTAGE_SECONDS` to
//! shorten it by hand) while a new Service is created behind it; throughout, the agent
//! runs, its maps keep the first Service exactly, and /healthz answers 200 (as upstream's:
//! nothing was queued that it failed to apply). When the server answers again, the new
//! Service is in the maps within the watchers' reconnect bound (their backoff has grown to
//! 5-10 s by then; asserted with slack for busy machines).

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};
use tests::{
    apiserver::Outage,
    node_harness::{MapEntry, TestNode, node_yaml, scenario_header, service_yaml},
    require_root,
    scenario::{Mode, agent::HEALTHZ_BIND},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

fn frontends(node: &TestNode) -> BTreeSet<String> {
    node.map_entries("SVC4_V2")
        .unwrap()
        .iter()
        .map(MapEntry::formatted)
        .collect()
}

/// Whether the services map has a frontend on `vip`.
fn has_frontend(node: &TestNode, vip: [u8; 4]) -> bool {
    let addr = u64::from(u32::from_ne_bytes(vip));
    node.map_entries("SVC4_V2")
        .unwrap()
        .iter()
        .any(|e| e.key["addr"] == addr)
}

fn healthz_status(node: &TestNode) -> String {
    node.output(
        "curl",
        &[
            "-s",
            "-o",
            "/dev/null",
            "-m",
            "2",
            "-w",
            "%{http_code}",
            &format!("http://{HEALTHZ_BIND}/healthz"),
        ],
    )
    .unwrap()
}

// The test API server runs on this runtime: the checks below run commands (bpftool, curl)
// and are wrapped in `block_in_place` so that they never starve its accept loop, which
// would delay the agent's reconnection and be measured as the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dataplane_outlives_an_api_outage_and_converges_after_it() {
    require_root!();
    let outage = Duration::from_secs(
        std::env::var("OUTAGE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let service = |name, vip, backend| service_yaml(name, vip, "TCP", backend, "outage-node", None);
    let objects =
        node_yaml("outage-node", "192.168.0.2") + &service("first", "172.30.0.71", "10.183.0.1");
    let node = TestNode::build(
        "outage",
        &scenario_header("outage", "outage-node"),
        &objects,
        "- {from: 10.0.0.2, to: \"172.30.0.71:80\", expect: [\"10.183.0.1:9000\"]}\n\
         - {from: 10.0.0.2, to: \"172.30.0.72:80\", expect: [\"10.183.0.2:9000\"]}",
    )
    .unwrap();
    // No periodic resync during the test: what is measured after the outage is the
    // relist and the sync it triggers, never a wait for the runner's minSyncPeriod after
    // a periodic sync that happened to fall just before the API came back.
    let mut overrides = Map::new();
    overrides.insert("iptables".into(), json!({"syncPeriod": "1h"}));
    let mut agent = node
        .start_agent(Mode::Ebpf, overrides, false, Path::new(RUNNER))
        .await
        .unwrap();
    let before = frontends(&node);
    assert!(has_frontend(&node, [172, 30, 0, 71]), "{before:#?}");
    assert_eq!(healthz_status(&node), "200");

    let server = node.source.store().server();
    server.set_outage(Outage::ConnectionsClosed);
    let second: Vec<Value> =
        serde_yaml::from_str(&service("second", "172.30.0.72", "10.183.0.2")).unwrap();
    for object in second {
        server.apply_value(object).unwrap();
    }
    let started = Instant::now();
    while started.elapsed() < outage {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (seen, health) =
            tokio::task::block_in_place(|| (frontends(&node), healthz_status(&node)));
        assert_eq!(
            seen,
            before,
            "the maps keep their state during the outage ({:?} in)",
            started.elapsed()
        );
        assert_eq!(
            health,
            "200",
            "healthz during the outage ({:?} in):\n{}",
            started.elapsed(),
            agent.log_tail(20)
        );
    }

    server.set_outage(Outage::None);
    let back = Instant::now();
    let back_at = humantime::format_rfc3339_micros(std::time::SystemTime::now());
    while !tokio::task::block_in_place(|| has_frontend(&node, [172, 30, 0, 72])) {
        assert!(
            back.elapsed() < proxy_agent::k8s::watch::RECONNECT_BOUND * 3,
            "the new Service never reached the maps:\n{}",
            agent.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converged = back.elapsed();
    eprintln!("converged {converged:?} after the API came back");
    // Each watcher tries again within one delay of its backoff (at most RECONNECT_BOUND);
    // the slack is for a busy machine's sync, yet far below the up to 60 s that client-go's
    // default backoff (30 s plus jitter) could take after a 60 s outage.
    assert!(
        converged <= proxy_agent::k8s::watch::RECONNECT_BOUND + Duration::from_secs(2),
        "converged only after {converged:?} (the API came back at {back_at}):\n{}",
        agent
            .log_tail(400)
            .lines()
            .filter(|l| !l.contains("failed"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(frontends(&node).is_superset(&before));
    assert_eq!(healthz_status(&node), "200");
    agent.stop();
}
