// SPDX-License-Identifier: Apache-2.0
//! `proxy-agent inspect` and `proxy-agent trace` against a live dataplane built by the
//! scenario runner (root; skipped elsewhere): inspect's text and JSON output on a scenario
//! name the services and list the backends, affinity and conntrack entries the flows
//! created (ebpf) and summarise the KUBE-* chains (iptables). That trace's verdict agrees
//! with the real outcome of every scenario flow is checked by the scenario tests
//! themselves (`scenario-runner run --trace-check`, tests/tests/scenarios.rs).

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use tests::scenario::{
    Mode, RunOptions, Scenario,
    agent::{AgentOptions, bpffs_root},
    format::Change,
    netns::Place,
    run::{ScenarioEnv, check_privileges},
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

/// One scenario environment at a time (they are heavy on a small machine).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn shared_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/scenarios")
}

fn options() -> Option<RunOptions> {
    options_for(Mode::Ebpf)
}

fn options_for(mode: Mode) -> Option<RunOptions> {
    if let Err(err) = check_privileges() {
        eprintln!("skipping: {err}");
        return None;
    }
    let binary = Path::new(RUNNER).parent()?.join("proxy-agent");
    if !binary.is_file() {
        eprintln!("skipping: no agent at {}", binary.display());
        return None;
    }
    if !shared_dir().is_dir() {
        eprintln!("skipping: {} not present", shared_dir().display());
        return None;
    }
    let agent = AgentOptions {
        proxy: tests::scenario::agent::Proxy::Ours,
        binary,
        mode,
        extra_args: vec!["--strict-mode".into()],
        config_overrides: Default::default(),
        ready_timeout: Duration::from_secs(30),
    };
    Some(RunOptions::for_agent(agent, PathBuf::from(RUNNER)))
}

fn run_tool(binary: &Path, place: &Place, args: &[&str]) -> String {
    let all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out: std::process::Output = place.command(binary, &all).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn inspect(binary: &Path, place: &Place, bpffs: &Path, args: &[&str]) -> String {
    let root = bpffs.display().to_string();
    let mut all = vec!["inspect"];
    all.extend(args);
    all.extend(["--bpffs-root", &root]);
    run_tool(binary, place, &all)
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_rules_summarises_the_iptables_mode_chains_of_a_scenario() {
    let Some(options) = options_for(Mode::Iptables) else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let scenario = Scenario::load(&shared_dir().join("k1-session-affinity.yaml")).unwrap();
    let env = ScenarioEnv::set_up(&options, &scenario, false)
        .await
        .expect("setting up");
    let binary = options.agent.as_ref().unwrap().binary.clone();
    let place = Place {
        netns: env.topology.node_ns.clone(),
        cgroup: None,
    };
    let json: serde_json::Value = serde_json::from_str(&run_tool(
        &binary,
        &place,
        &["inspect", "rules", "--output", "json"],
    ))
    .unwrap();
    let services = json["services"].as_array().unwrap();
    let svc = services
        .iter()
        .find(|s| s["service"] == "ns5/svc5:p80" && s["family"] == "IPv4")
        .unwrap_or_else(|| panic!("ns5/svc5:p80 missing: {json}"));
    let kinds: BTreeSet<&str> = svc["frontends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["cluster IP", "external IP", "loadbalancer IP", "nodeport"]),
        "{svc}"
    );
    let endpoints: BTreeSet<&str> = svc["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["address"].as_str().unwrap())
        .collect();
    assert_eq!(
        endpoints,
        BTreeSet::from(["10.180.0.3:80", "10.180.1.3:80", "10.180.2.3:80"]),
        "{svc}"
    );
    assert_eq!(svc["affinity_seconds"], 10800);
    let text = run_tool(&binary, &place, &["inspect", "rules"]);
    println!("{text}");
    assert!(text.contains("ns5/svc5:p80 (IPv4)"), "{text}");
    assert!(text.contains("endpoint 10.180.2.3:80"), "{text}");
    assert!(text.contains("affinity ClientIP 10800s"), "{text}");
    // And trace reads the same rules.
    let trace = run_tool(
        &binary,
        &place,
        &[
            "trace",
            "--mode",
            "iptables",
            "--from",
            "10.0.0.2",
            "--to",
            "172.30.0.45:80",
        ],
    );
    println!("{trace}");
    assert!(trace.contains("verdict: FORWARD to one of ["), "{trace}");
    drop(env);
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_services_backends_affinity_and_conntrack_of_a_scenario() {
    let Some(options) = options() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    // Session affinity from pods and from outside over a NodePort with eTP=Cluster.
    let scenario = Scenario::load(&shared_dir().join("k1-session-affinity.yaml")).unwrap();
    let mut env = match ScenarioEnv::set_up(&options, &scenario, false).await {
        Ok(env) => env,
        Err(err) if err.to_string().contains("carries no eBPF object") => {
            eprintln!("skipping: {err}");
            return;
        }
        Err(err) => panic!("setting up: {err}"),
    };
    for flow in &scenario.stages[0].flows {
        if flow.applies_to(Mode::Ebpf) {
            env.probe(flow).await.unwrap();
        }
    }
    let binary = options.agent.as_ref().unwrap().binary.clone();
    let place = Place {
        netns: env.topology.node_ns.clone(),
        cgroup: None,
    };
    let bpffs = bpffs_root(&env.topology.id);

    // Every Service port of the scenario appears by name with its ClusterIP frontend.
    let json: serde_json::Value = serde_json::from_str(&inspect(
        &binary,
        &place,
        &bpffs,
        &["services", "-o", "json"],
    ))
    .unwrap();
    let frontends = json.as_array().unwrap();
    assert!(!frontends.is_empty());
    let mut named = BTreeSet::new();
    for f in frontends {
        let svc = &f["service"];
        assert!(svc.is_object(), "frontend without a name: {f}");
        named.insert(format!(
            "{}/{}",
            svc["namespace"].as_str().unwrap(),
            svc["name"].as_str().unwrap()
        ));
    }
    let expected: BTreeSet<String> = scenario_services(&scenario);
    assert_eq!(named, expected);
    let text = inspect(&binary, &place, &bpffs, &["services"]);
    println!("{text}");
    assert!(text.starts_with("SERVICE"), "{text}");
    for name in &expected {
        assert!(text.contains(name.as_str()), "{name} missing:\n{text}");
    }
    // Backends: each endpoint address of the scenario, with its state.
    let backends: serde_json::Value = serde_json::from_str(&inspect(
        &binary,
        &place,
        &bpffs,
        &["backends", "-o", "json"],
    ))
    .unwrap();
    let listed: BTreeSet<String> = backends
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap().to_string())
        .collect();
    for ep in scenario_endpoints(&scenario) {
        assert!(listed.contains(&ep), "backend {ep} not listed: {listed:?}");
    }
    let text = inspect(&binary, &place, &bpffs, &["backends"]);
    assert!(text.contains("active"), "{text}");
    // The sticky flows left affinity entries pointing at listed backends.
    let affinity: serde_json::Value = serde_json::from_str(&inspect(
        &binary,
        &place,
        &bpffs,
        &["affinity", "-o", "json"],
    ))
    .unwrap();
    let entries = affinity.as_array().unwrap();
    assert!(
        !entries.is_empty(),
        "no affinity entries after sticky flows"
    );
    for e in entries {
        let backend: SocketAddr = e["backend"].as_str().unwrap().parse().unwrap();
        assert!(listed.contains(&backend.ip().to_string()), "{e}");
        assert!(e["service"].is_object(), "{e}");
    }
    // trace's text form on the same live state.
    let trace = run_tool(
        &binary,
        &place,
        &[
            "trace",
            "--from",
            "10.0.0.2",
            "--to",
            "172.30.0.45:80",
            "--bpffs-root",
            &bpffs.display().to_string(),
        ],
    );
    println!("{trace}");
    assert!(
        trace.contains("ClusterIP frontend of service ns5/svc5:p80"),
        "{trace}"
    );
    assert!(
        trace.contains("sessionAffinity ClientIP (10800s)"),
        "{trace}"
    );
    assert!(trace.contains("verdict: FORWARD to one of ["), "{trace}");
    let text = inspect(&binary, &place, &bpffs, &["affinity"]);
    println!("{text}");
    println!("{}", inspect(&binary, &place, &bpffs, &["conntrack"]));
    assert!(text.lines().count() > 1, "{text}");
    // Conntrack: JSON is an array whatever the flows did; external flows are tracked.
    let ct: serde_json::Value = serde_json::from_str(&inspect(
        &binary,
        &place,
        &bpffs,
        &["conntrack", "-o", "json"],
    ))
    .unwrap();
    let external = scenario.stages[0].flows.iter().any(|f| {
        f.applies_to(Mode::Ebpf)
            && env.topology.placement.pod_index(f.from).is_none()
            && !scenario.node.addresses.iter().any(|a| a.addr() == f.from)
    });
    if external {
        assert!(
            !ct.as_array().unwrap().is_empty(),
            "no conntrack entry: {ct}"
        );
    }
}

/// The objects of the scenario's first stage.
fn first_objects(scenario: &Scenario) -> Vec<serde_json::Value> {
    match &scenario.stages[0].change {
        Change::Replace(objects) => objects.clone(),
        Change::Delete(_) => Vec::new(),
    }
}

fn scenario_services(scenario: &Scenario) -> BTreeSet<String> {
    first_objects(scenario)
        .into_iter()
        .filter(|o| o["kind"] == "Service")
        .filter(|o| o["spec"]["type"] != "ExternalName" && o["spec"]["clusterIP"] != "None")
        .map(|o| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or("default"),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn scenario_endpoints(scenario: &Scenario) -> BTreeSet<String> {
    first_objects(scenario)
        .into_iter()
        .filter(|o| o["kind"] == "EndpointSlice")
        .flat_map(|o| o["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] != false)
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}
