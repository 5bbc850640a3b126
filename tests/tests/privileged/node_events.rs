// SPDX-License-Identifier: Apache-2.0
//! The agent posts Events on its Node for a proxy-mode fallback and for objects it
//! refuses: an agent asked for ipvs mode on this kernel (no IP_VS) is given one valid and
//! one invalid Service through the test API server, inside a network namespace of its own,
//! and the server receives a Warning `ProxyModeFallback` and a Warning `InvalidService`
//! naming the refused Service, each once. An agent asked for nftables mode with an `nft`
//! too old falls back to iptables with a `ProxyModeFallback` naming nftables and the
//! reason. kube-proxy's nftables table appearing beside the agent's iptables mode (as
//! when kube-proxy comes back) becomes a Warning `ForeignProxyDetected` within a full sync.

use std::{
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    apiserver::{ServerConfig, TestApiServer},
    node_harness::TestNode,
    require_root,
    scenario::{
        agent::get_in,
        netns::{Place, add_netns, bind_tcp_listener_in, delete_netns, ip_in},
    },
};

use super::nftables_fallback::OldNft;

const NODE: &str = "events-node";

/// Kills the agent and removes the namespace whatever the test's outcome.
struct Cleanup {
    ns: String,
    agent: Option<Child>,
    dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = delete_netns(&self.ns);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": NODE},
               "spec": {"podCIDRs": ["10.0.0.0/24"]},
               "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.2"}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "good", "namespace": "ns1"},
               "spec": {"clusterIP": "172.30.0.10", "clusterIPs": ["172.30.0.10"],
                        "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "bad-ip", "namespace": "ns1"},
               "spec": {"clusterIP": "172.30.0.300", "clusterIPs": ["172.30.0.300"],
                        "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}}),
    ]
}

fn with_reason<'a>(events: &'a [Value], reason: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["reason"] == reason).collect()
}

/// A network namespace with the test API server holding [`objects`], and the agent in
/// `mode` there (its output in `agent.log` of the run directory). `path`: the agent's
/// PATH, when not this process's.
struct Setup {
    server: TestApiServer,
    guard: Cleanup,
    ns: String,
}

fn start(tag: &str, mode: &str, path: Option<&std::ffi::OsStr>) -> Setup {
    start_with(tag, mode, path, "")
}

/// [`start`] with `extra` appended to the configuration file.
fn start_with(tag: &str, mode: &str, path: Option<&std::ffi::OsStr>, extra: &str) -> Setup {
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let ns = format!("kpe-{tag}-{}", std::process::id());
    let dir = std::env::temp_dir().join(&ns);
    std::fs::create_dir_all(&dir).unwrap();
    add_netns(&ns).unwrap();
    let mut guard = Cleanup {
        ns: ns.clone(),
        agent: None,
        dir: dir.clone(),
    };
    ip_in(&ns, &["link", "set", "lo", "up"]).unwrap();

    let listener = bind_tcp_listener_in(&ns, ([127, 0, 0, 1], 0).into()).unwrap();
    let server = TestApiServer::start_on(listener, ServerConfig::default()).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    for object in objects() {
        server.create_value(object).unwrap();
    }

    // Conntrack settings of 0 leave the machine's sysctls alone; the bpffs root does not
    // exist, so no ebpf leftovers are looked for on the host.
    let config = dir.join("config.yaml");
    let yaml = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
         kind: KubeProxyConfiguration\n\
         mode: {mode}\n\
         hostnameOverride: {NODE}\n\
         clusterCIDR: 10.0.0.0/8\n\
         healthzBindAddress: 127.0.0.1:10256\n\
         metricsBindAddress: 127.0.0.1:10249\n\
         clientConnection: {{kubeconfig: {}}}\n\
         conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}\n\
         ebpf: {{bpffsRoot: {}}}\n{extra}",
        kubeconfig.display(),
        dir.join("no-bpffs").display()
    );
    std::fs::write(&config, yaml).unwrap();
    let log = std::fs::File::create(dir.join("agent.log")).unwrap();
    let place = Place {
        netns: ns.clone(),
        cgroup: None,
    };
    let mut command = place.command(
        &binary,
        &["--config".to_string(), config.display().to_string()],
    );
    if let Some(path) = path {
        command.env("PATH", path);
    }
    guard.agent = Some(
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    Setup { server, guard, ns }
}

impl Setup {
    fn log(&self) -> String {
        std::fs::read_to_string(self.guard.dir.join("agent.log")).unwrap_or_default()
    }

    /// The events the server holds once one of each of `reasons` is there (or after 30 s).
    async fn events_with(&mut self, reasons: &[&str]) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let events = self.server.events();
            let done = reasons
                .iter()
                .all(|reason| !with_reason(&events, reason).is_empty());
            if done || Instant::now() > deadline {
                return events;
            }
            if let Some(Ok(Some(status))) = self.guard.agent.as_mut().map(Child::try_wait) {
                panic!("the agent exited ({status}):\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The one ProxyModeFallback event, a Warning about the Node.
fn the_fallback_event<'e>(events: &'e [Value], log: &str) -> &'e Value {
    let fallback = with_reason(events, "ProxyModeFallback");
    assert_eq!(fallback.len(), 1, "one fallback event: {events:#?}\n{log}");
    let fallback = fallback[0];
    assert_eq!(fallback["type"], "Warning");
    assert_eq!(fallback["regarding"]["kind"], "Node");
    assert_eq!(fallback["regarding"]["name"], NODE);
    fallback
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_and_refused_objects_become_events_on_the_node() {
    require_root!();
    let mut setup = start("ev", "ipvs", None);
    let events = setup
        .events_with(&["ProxyModeFallback", "InvalidService"])
        .await;
    let log = setup.log();

    let fallback = the_fallback_event(&events, &log);
    assert_eq!(fallback["reportingController"], "kube-proxy-ebpf");
    let note = fallback["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("proxy mode ipvs cannot run on this node") && note.contains("iptables"),
        "{note}"
    );

    let refused = with_reason(&events, "InvalidService");
    assert_eq!(refused.len(), 1, "one refusal event: {events:#?}\n{log}");
    let refused = refused[0];
    assert_eq!(refused["type"], "Warning");
    assert_eq!(refused["regarding"]["kind"], "Node");
    assert_eq!(refused["related"]["kind"], "Service");
    assert_eq!(refused["related"]["namespace"], "ns1");
    assert_eq!(refused["related"]["name"], "bad-ip");
    let note = refused["note"].as_str().unwrap_or_default();
    assert!(note.starts_with("Service ns1/bad-ip ignored: "), "{note}");
    assert!(note.contains("172.30.0.300"), "{note}");
    // The valid Service is not refused.
    assert!(
        !events.iter().any(|e| e["related"]["name"] == "good"),
        "{events:#?}"
    );
    drop(setup);
}

/// nftables mode where `nft` is too old (see `nftables_fallback::OldNft`): the agent falls
/// back to iptables, says so in its log (`PROXY MODE FALLBACK`, naming the mode and the
/// reason) and in one Warning `ProxyModeFallback` on its Node, and then runs iptables
/// mode: its `/proxyMode` says iptables and its KUBE-SERVICES chain is in the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nftables_fallback_becomes_an_event_and_iptables_runs() {
    require_root!();
    let old_nft = OldNft::new("events");
    let mut setup = start("evnft", "nftables", Some(&old_nft.path()));
    let events = setup.events_with(&["ProxyModeFallback"]).await;
    let log = setup.log();

    let fallback = the_fallback_event(&events, &log);
    let note = fallback["note"].as_str().unwrap_or_default();
    let too_old = format!("nft {} is too old", OldNft::VERSION);
    assert!(
        note.starts_with("proxy mode nftables cannot run on this node")
            && note.contains(&too_old)
            && note.contains("iptables"),
        "{note}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("PROXY MODE FALLBACK"))
        .unwrap_or_else(|| panic!("no PROXY MODE FALLBACK in the log:\n{log}"));
    assert!(
        line.contains("nftables") && line.contains(&too_old) && line.contains("iptables"),
        "the fallback line names neither the mode, the reason nor the fallback: {line}"
    );

    // The mode that runs is iptables, with its rules (the first sync may still be on its
    // way when the event arrives).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mode = get_in(
            &setup.ns,
            "http://127.0.0.1:10249/proxyMode",
            Duration::from_millis(500),
        );
        let place = Place {
            netns: setup.ns.clone(),
            cgroup: None,
        };
        let saved = place
            .command(std::path::Path::new("iptables-save"), &[])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        let running = mode
            .as_ref()
            .is_ok_and(|m| m.status == 200 && m.body.trim() == "iptables");
        if running && saved.contains(":KUBE-SERVICES") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 30 s: /proxyMode {mode:?}, iptables-save:\n{saved}\n{}",
            setup.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(setup);
}

/// Another proxy writing the node (here kube-proxy's nftables table, as its nftables mode
/// creates it, beside our iptables mode) is reported within a full sync: a Warning event on
/// the Node, once, and a log line naming what was found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_proxy_on_the_node_becomes_an_event_within_a_full_sync() {
    require_root!();
    let mut setup = start_with(
        "evfp",
        "iptables",
        None,
        "iptables: {syncPeriod: 1s, minSyncPeriod: 0s}\nlogging: {verbosity: 2}\n",
    );
    // After the first sync, which removes what other modes left.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !setup.log().contains("SyncProxyRules complete") {
        assert!(Instant::now() < deadline, "never synced:\n{}", setup.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        with_reason(&setup.server.events(), "ForeignProxyDetected").is_empty(),
        "{}",
        setup.log()
    );
    let nft = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &setup.ns,
            "nft",
            "add",
            "table",
            "ip",
            "kube-proxy",
        ])
        .status()
        .unwrap();
    assert!(nft.success());
    let events = setup.events_with(&["ForeignProxyDetected"]).await;
    let log = setup.log();
    let found = with_reason(&events, "ForeignProxyDetected");
    assert_eq!(found.len(), 1, "{events:#?}\n{log}");
    assert_eq!(found[0]["type"], "Warning");
    assert_eq!(found[0]["regarding"]["name"], NODE);
    let note = found[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("nftables table ip kube-proxy"), "{note}");
    assert!(
        log.contains("another proxy is programming this node"),
        "{log}"
    );
}
