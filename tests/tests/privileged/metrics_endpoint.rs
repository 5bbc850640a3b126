// SPDX-License-Identifier: Apache-2.0
//! A running agent's metrics server against upstream kube-proxy's: `/metrics` has every
//! upstream metric name of its mode (the list, quoted with its source, is
//! `proxy_agent::serve::upstream_metrics`) and the process collector's `process_*`, and
//! `/configz` serves the effective configuration keyed by its group, as upstream does.
//!
//! Root (skipped otherwise): the agent runs in iptables mode in a network namespace of
//! its own (`unshare --net`), so its rules, servers and ports are not the host's. The
//! nfacct counters are that namespace's too: a connection to 127.0.0.1:<nodePort> inside
//! it must show in `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`.
//! In nftables mode the same page has the nftables counters (at 0, by family) and the
//! common families, and none of iptables mode's.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use proxy_agent::serve::{
    MetricsMode,
    upstream_metrics::{NOT_EXPORTED, UPSTREAM},
};

fn agent_binary() -> PathBuf {
    tests::node_harness::TestNode::agent_binary()
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata:
  name: metrics-node
  labels: {kubernetes.io/hostname: metrics-node}
spec:
  podCIDR: 10.244.0.0/24
status:
  addresses: [{type: InternalIP, address: 127.0.0.1}]
";

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ipFamilies: [IPv4]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
";

const NODE_PORT: u16 = 30080;

const SLICE: &str = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints: [{addresses: [10.244.0.5], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
";

/// The agent in its own network namespace; killed when dropped.
struct Agent {
    child: Child,
    source: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.source);
    }
}

impl Agent {
    /// The agent in `mode`, strict: a fallback would expose another mode's metrics.
    fn start(mode: &str) -> Self {
        let source =
            std::env::temp_dir().join(format!("metrics-endpoint-{mode}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&source);
        fs::create_dir_all(&source).unwrap();
        fs::write(source.join("node.yaml"), NODE).unwrap();
        fs::write(source.join("service.yaml"), SERVICE).unwrap();
        fs::write(source.join("slice.yaml"), SLICE).unwrap();
        // A fresh namespace's loopback is down: up first, so 127.0.0.1 can be bound.
        let child = Command::new("unshare")
            .args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec \"$0\" \"$@\"",
            ])
            .arg(agent_binary())
            .args(["--proxy-mode", mode, "--strict-mode"])
            .args(["--hostname-override", "metrics-node"])
            .args(["--cluster-cidr", "10.244.0.0/16"])
            .arg("--source")
            .arg(&source)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the agent under unshare");
        Self { child, source }
    }

    /// GET `url` from inside the agent's namespace (empty when it does not answer).
    fn get(&self, url: &str) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", self.child.id()))
            .args(["curl", "-s", "-i", "--max-time", "2", url])
            .output()
            .expect("running curl in the agent's namespace");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Opens a TCP connection to 127.0.0.1:`port` from inside the agent's namespace. The
    /// endpoint does not exist, so it fails; its SYN has gone through the nat rules.
    fn connect_localhost(&self, port: u16) {
        let _ = Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", self.child.id()))
            .args(["curl", "-s", "--max-time", "1"])
            .arg(format!("http://127.0.0.1:{port}/"))
            .output()
            .expect("running curl in the agent's namespace");
    }

    /// The metrics page once its unlabelled sample `name` is at least `min`.
    fn metrics_with_at_least(&mut self, name: &str, min: f64) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let page = self.metrics_with("kubeproxy_proxy_livez_total{");
            if sample(&page, name).is_some_and(|v| v >= min) {
                return page;
            }
            assert!(
                Instant::now() < deadline,
                "{name} not >= {min} after 30 s:\n{page}"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The metrics page once it contains `text`.
    fn metrics_with(&mut self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the agent exited ({status})");
            }
            let page = self.get("http://127.0.0.1:10249/metrics");
            if page.contains(text) {
                return page;
            }
            assert!(Instant::now() < deadline, "no {text} after 60 s:\n{page}");
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// A new endpoint for `web`, with the trigger time the EndpointSlice controller
    /// would annotate: the agent measures its network programming latency from it.
    fn add_endpoint(&self) {
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let slice = SLICE
            .replace(
                "labels: {kubernetes.io/service-name: web}",
                &format!(
                    "labels: {{kubernetes.io/service-name: web}}\n  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{now}\"}}"
                ),
            )
            .replace("[10.244.0.5]", "[10.244.0.5]}, {addresses: [10.244.0.6]");
        fs::write(self.source.join("slice.yaml"), slice).unwrap();
    }
}

/// The value of the unlabelled sample `name`.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn families(page: &str) -> Vec<&str> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect()
}

#[test]
fn metrics_has_every_upstream_name_of_its_mode_and_configz_the_configuration() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a network namespace and iptables for the agent)");
        return;
    }
    assert!(
        agent_binary().is_file(),
        "{} not built",
        agent_binary().display()
    );
    let mut agent = Agent::start("iptables");
    // The rule counts appear with the first sync.
    agent.metrics_with("kubeproxy_sync_proxy_rules_iptables_total{");
    // Network programming latency is observed for changes after the agent started (the
    // trigger time has whole seconds).
    thread::sleep(Duration::from_millis(1100));
    agent.add_endpoint();
    agent.metrics_with("kubeproxy_network_programming_duration_seconds_count{");
    // healthz and livez counters appear once probed, as upstream's.
    for path in ["healthz", "livez"] {
        agent.get(&format!("http://127.0.0.1:10256/{path}"));
    }
    agent.metrics_with("kubeproxy_proxy_livez_total{");
    // A localhost NodePort connection counts in nfacct (iptables mode set route_localnet
    // in the namespace). The counter lives as long as the namespace, so at least 1.
    agent.connect_localhost(NODE_PORT);
    let page = agent.metrics_with_at_least(
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
        1.0,
    );
    assert!(
        sample(
            &page,
            "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
        )
        .is_some(),
        "no INVALID-drop sample:\n{page}"
    );
    let exposed = families(&page);
    for (name, _, _, group) in UPSTREAM {
        if !group.in_mode(MetricsMode::Iptables) || NOT_EXPORTED.iter().any(|(n, _)| n == name) {
            continue;
        }
        assert!(exposed.contains(name), "/metrics lacks {name}:\n{page}");
    }
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    ] {
        assert!(exposed.contains(&process), "/metrics lacks {process}");
    }
    // The rule counts of the synced rules, by family and table.
    assert!(
        page.lines().any(|l| l.starts_with(
            "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"}"
        ) && !l.ends_with(" 0")),
        "no nat rule count:\n{page}"
    );

    let configz = agent.get("http://127.0.0.1:10249/configz");
    let (head, body) = configz.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let value: serde_json::Value = serde_json::from_str(body).expect("JSON");
    let object = value.as_object().expect("an object");
    assert_eq!(
        object.keys().collect::<Vec<_>>(),
        ["kubeproxy.config.k8s.io"]
    );
    let config = &object["kubeproxy.config.k8s.io"];
    assert_eq!(config["mode"], "iptables");
    assert_eq!(config["hostnameOverride"], "metrics-node");
    assert_eq!(config["metricsBindAddress"], "127.0.0.1:10249");
    assert_eq!(config["clusterCIDR"], "10.244.0.0/16");
}

/// The value of the sample `name{labels}`.
fn labelled_sample(page: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

#[test]
fn metrics_in_nftables_mode_has_its_counters_and_the_common_families_only() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a network namespace and nftables for the agent)");
        return;
    }
    assert!(
        agent_binary().is_file(),
        "{} not built",
        agent_binary().display()
    );
    let mut agent = Agent::start("nftables");
    // The first sync.
    agent.metrics_with("kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}");
    let mode = agent.get("http://127.0.0.1:10249/proxyMode");
    assert!(
        mode.trim_end().ends_with("\r\n\r\nnftables"),
        "/proxyMode: {mode}"
    );
    // As in iptables mode: a change with a trigger time, and probes, fill the common
    // families that only appear once observed.
    thread::sleep(Duration::from_millis(1100));
    agent.add_endpoint();
    agent.metrics_with("kubeproxy_network_programming_duration_seconds_count{");
    for path in ["healthz", "livez"] {
        agent.get(&format!("http://127.0.0.1:10256/{path}"));
    }
    let page = agent.metrics_with("kubeproxy_proxy_livez_total{");

    let exposed = families(&page);
    for (name, _, _, group) in UPSTREAM {
        if NOT_EXPORTED.iter().any(|(n, _)| n == name) {
            continue;
        }
        if group.in_mode(MetricsMode::Nftables) {
            assert!(exposed.contains(name), "/metrics lacks {name}:\n{page}");
        } else {
            assert!(
                !exposed.contains(name),
                "nftables mode exposes {name}, not one of its families:\n{page}"
            );
        }
    }
    // Nothing failed: the nftables counters are there at 0 for the node's family.
    for name in [
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
    ] {
        assert_eq!(
            labelled_sample(&page, name, "ip_family=\"IPv4\""),
            Some(0.0),
            "{name}:\n{page}"
        );
    }
    assert!(
        labelled_sample(
            &page,
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "ip_family=\"IPv4\""
        )
        .is_some_and(|t| t > 0.0),
        "no sync time:\n{page}"
    );
    assert!(
        !page.contains("kubeproxy_iptables_"),
        "iptables mode's counters in nftables mode:\n{page}"
    );
    let configz = agent.get("http://127.0.0.1:10249/configz");
    assert!(configz.contains("\"mode\":\"nftables\""), "{configz}");
}
