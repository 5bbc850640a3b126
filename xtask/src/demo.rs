// SPDX-License-Identifier: Apache-2.0
//! `cargo xtask demo`: the agent in ebpf mode on a sandbox node of a real control plane,
//! start to finish.
//!
//! Setup when needed, build, then a node network namespace, upstream's control plane
//! (etcd, kube-apiserver, kube-controller-manager v1.37, `testbed`), deploy/examples/
//! applied with kubectl (Services with selectors, Pods whose status the demo writes as no
//! kubelet runs: the real EndpointSlice controller makes the slices), one namespace per
//! pod (each running a tiny HTTP server that answers with its pod's name), the agent
//! started in the node namespace and a cgroup of its own with deploy/'s ServiceAccount,
//! requests to the ClusterIPs from the same place, the services map, and everything
//! removed again, on success, failure or Ctrl-C alike. With `--keep` it all stays (the
//! kubeconfig is printed, to add Services of one's own); `--stop` removes it. The host's
//! interfaces, cgroups and processes are never touched: the socket programs attach to the
//! demo's cgroup, the tc programs to the sandbox node's uplink, the maps are pinned under
//! a bpffs directory of the demo's own, the API server listens on 127.0.0.1.

mod backend;
mod cluster;
mod examples;
mod maps;
mod sandbox;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Args;

pub use self::backend::{BackendArgs, run as run_backend};
use self::{
    examples::{Examples, Frontend},
    sandbox::{Sandbox, bpffs_root, command_in, node_ns, pod_ns, work_dir},
};
use crate::util::{cargo, run_cmd, workspace_root};

#[derive(Args, Default)]
pub struct DemoArgs {
    /// Build and run the agent with the release profile.
    #[arg(long)]
    pub release: bool,
    /// Leave the control plane, the sandbox node, its pods and the agent running, and print
    /// how to reach them (`cargo xtask demo --stop` removes them).
    #[arg(long, conflicts_with = "stop")]
    pub keep: bool,
    /// Remove what `--keep` left running.
    #[arg(long)]
    pub stop: bool,
}

const STEPS: usize = 10;
/// Requests sent to each ClusterIP.
const REQUESTS: usize = 10;
/// The agent's servers, inside the node namespace.
const HEALTHZ: &str = "127.0.0.1:10256";
const METRICS: &str = "127.0.0.1:10249";
/// Set by the agent after each successful sync (upstream's name).
const SYNC_METRIC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Ctrl-C (and SIGTERM, SIGHUP) only set a flag: the demo then stops at the next check
/// and removes what it created instead of dying with the sandbox in place.
fn catch_signals() -> anyhow::Result<()> {
    let flag = INTERRUPTED.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, Arc::clone(flag))
            .context("installing the signal handlers")?;
    }
    Ok(())
}

fn check_interrupted() -> anyhow::Result<()> {
    if INTERRUPTED
        .get()
        .is_some_and(|flag| flag.load(Ordering::Relaxed))
    {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleeps, waking early to report an interruption.
fn pause(duration: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        check_interrupted()?;
        thread::sleep(Duration::from_millis(20).min(duration));
    }
    check_interrupted()
}

fn step(n: usize, what: &str) {
    println!();
    crate::util::step(&format!("[{n}/{STEPS}] {what}"));
}

/// Runs the demo; after Ctrl-C, once the sandbox is gone, exits with 130 as shells do.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let result = run_demo(args);
    if check_interrupted().is_err() {
        eprintln!("interrupted; everything the demo created is removed");
        std::process::exit(130);
    }
    result
}

fn run_demo(args: &DemoArgs) -> anyhow::Result<()> {
    if !crate::util::is_root() {
        bail!(
            "the demo needs root: it creates network namespaces and a cgroup and loads BPF programs"
        );
    }
    catch_signals()?;
    if args.stop {
        step(1, "removing what `cargo xtask demo --keep` left running");
        cluster::stop(&cluster::dir_in(&work_dir()))?;
        return Sandbox::remove_leftovers(&target_dir().join("debug/proxy-agent"), true);
    }

    step(
        1,
        "toolchain (cargo xtask setup runs only when something is missing: Rust, LLVM, \
         bpf-linker, and upstream's control plane built from Go modules)",
    );
    crate::setup::ensure_ready()?;
    println!("    ready");
    check_interrupted()?;

    step(
        2,
        "building proxy-agent (its eBPF object included) and testbed's control-plane",
    );
    let agent = build_agent(args.release)?;
    let control_plane = build_control_plane()?;
    check_interrupted()?;

    let examples_dir = workspace_root().join("deploy/examples");
    let (examples, objects) = examples::load(&examples_dir)?;
    step(3, "sandbox node");
    cluster::stop(&cluster::dir_in(&work_dir()))?;
    Sandbox::remove_leftovers(&agent, false)?;
    let mut sandbox = Sandbox::create(&agent, examples.node_address)?;
    println!(
        "    network namespace {}: eth0 {}/24, uplink to {}-outside",
        node_ns(),
        examples.node_address,
        sandbox::PREFIX
    );
    println!("    cgroup {}", sandbox.cgroup.display());

    let outcome = show(&mut sandbox, &examples, &objects, &agent, &control_plane);
    if outcome.is_err() && check_interrupted().is_ok() {
        print_agent_log_tail();
    }
    match outcome {
        Ok(cluster) if args.keep => {
            step(10, "left running (--keep)");
            let cgroup = sandbox.cgroup.clone();
            sandbox.keep();
            print_kept(&cluster, &agent, &cgroup);
            Ok(())
        }
        outcome => {
            step(10, "removing everything the demo created");
            let stopped = cluster::stop(&cluster::dir_in(&work_dir()));
            let cleanup = sandbox.teardown();
            outcome?;
            stopped?;
            cleanup?;
            println!("\ndemo finished");
            Ok(())
        }
    }
}

/// Steps 4 to 9, on a sandbox that exists; the cluster they ran on.
fn show(
    sandbox: &mut Sandbox,
    examples: &Examples,
    objects: &[serde_yaml::Value],
    agent: &Path,
    control_plane: &Path,
) -> anyhow::Result<cluster::Cluster> {
    step(
        4,
        "upstream's control plane: etcd, kube-apiserver (RBAC on), kube-controller-manager \
         (its EndpointSlice controllers)",
    );
    let cluster = cluster::start(control_plane, &work_dir())?;
    check_interrupted()?;

    step(
        5,
        "deploy/examples/ through the API: Services with selectors, Pods and their status",
    );
    cluster.apply_examples(&examples.dir, objects)?;
    let ready: Vec<String> = examples
        .pods
        .iter()
        .filter(|p| p.ready)
        .map(|p| p.address.to_string())
        .collect();
    cluster.wait_for_slices("demo", &ready)?;

    step(
        6,
        "pods: one network namespace each, a backend answering with the pod's name",
    );
    for (index, pod) in examples.pods.iter().enumerate() {
        check_interrupted()?;
        sandbox.add_pod(index, pod)?;
        sandbox.start_backend(pod)?;
    }
    wait_for_backends(sandbox, examples)?;

    step(
        7,
        "the agent: ebpf mode, deploy/'s ServiceAccount, in the node namespace and cgroup",
    );
    start_agent(sandbox, examples, agent, &cluster)?;
    wait_for_sync(sandbox)?;

    step(
        8,
        "requests to the ClusterIPs, from the node namespace and cgroup",
    );
    for frontend in &examples.frontends {
        check_interrupted()?;
        request_spread(sandbox, examples, frontend)?;
    }

    step(9, "the services map");
    show_services_map(agent, examples)?;
    Ok(cluster)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn build_control_plane() -> anyhow::Result<PathBuf> {
    run_cmd(cargo().args(["build", "--package", "testbed", "--bin", "control-plane"]))?;
    let binary = target_dir().join("debug/control-plane");
    if !binary.exists() {
        bail!("the build left no binary at {}", binary.display());
    }
    Ok(binary)
}

/// What `--keep` leaves, and how to use it.
fn print_kept(cluster: &cluster::Cluster, agent: &Path, cgroup: &Path) {
    let kubeconfig = cluster.admin_kubeconfig.display();
    let root = bpffs_root();
    println!(
        "    The control plane, the sandbox node {node}, its pods and the agent keep running.
    Talk to the cluster (kubectl, admin):
      export KUBECONFIG={kubeconfig}
      kubectl get services,endpointslices -A
    Add a Service of your own (it selects the hello pods) and watch the agent take it:
      kubectl apply -f - <<'EOF'
      apiVersion: v1
      kind: Service
      metadata: {{name: mine, namespace: demo}}
      spec: {{clusterIP: 10.96.0.99, selector: {{app: hello}}, ports: [{{port: 8080, targetPort: 8080}}]}}
      EOF
      {agent} inspect services --bpffs-root {root}
      nsenter --net=/run/netns/{node} {agent} trace --bpffs-root {root} --from 10.244.1.11 --to 10.96.0.99:8080
    Request it from the node, inside the demo's cgroup (where the socket programs are):
      nsenter --net=/run/netns/{node} sh -c 'echo $$ > {cgroup}/cgroup.procs; exec curl -s http://10.96.0.99:8080/'
    The agent's log: {log}
    Remove it all: cargo xtask demo --stop",
        node = node_ns(),
        agent = agent.display(),
        root = root.display(),
        log = work_dir().join("agent.log").display(),
        cgroup = cgroup.display(),
    );
}

fn build_agent(release: bool) -> anyhow::Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "--package", "proxy-agent", "--bin", "proxy-agent"])
        .env("PROXY_REQUIRE_EBPF", "1");
    if release {
        cmd.arg("--release");
    }
    if let Err(e) = run_cmd(&mut cmd) {
        check_interrupted()?;
        return Err(e);
    }
    let binary = target_dir()
        .join(if release { "release" } else { "debug" })
        .join("proxy-agent");
    if !binary.exists() {
        bail!("the build left no binary at {}", binary.display());
    }
    Ok(binary)
}

/// GET `url` with curl from `netns` (and the demo's cgroup, when given).
fn http_get(netns: &str, cgroup: Option<&Path>, url: &str) -> anyhow::Result<String> {
    let out = command_in(
        netns,
        cgroup,
        Path::new("curl"),
        &["-sS", "--max-time", "2", url],
    )
    .stdin(Stdio::null())
    .output()
    .context("running curl")?;
    if !out.status.success() {
        bail!("GET {url}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every pod answers at its own address before the agent starts: the network works.
fn wait_for_backends(sandbox: &mut Sandbox, examples: &Examples) -> anyhow::Result<()> {
    for pod in &examples.pods {
        for addr in Examples::listen_addresses(pod) {
            let deadline = Instant::now() + Duration::from_secs(10);
            let url = format!("http://{addr}/");
            loop {
                check_interrupted()?;
                if let Some(name) = sandbox.exited_backend() {
                    bail!("the backend of {name} exited");
                }
                match http_get(&node_ns(), None, &url) {
                    Ok(body) if body.trim() == pod.name => break,
                    Ok(body) => bail!("{url} answered {body:?}, not {:?}", pod.name),
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => pause(Duration::from_millis(100))?,
                }
            }
            let state = if pod.ready { "ready" } else { "not ready" };
            println!(
                "    {:<22} {addr:<18} answers {:?} ({state})",
                pod_ns(pod),
                pod.name
            );
        }
    }
    Ok(())
}

/// The configuration the agent runs with: the node and servers of the sandbox, the demo's
/// bpffs directory and cgroup, and no conntrack sysctls (some of them are global).
fn agent_config(examples: &Examples, cgroup: &Path, kubeconfig: &Path) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ebpf
hostnameOverride: {node}
# deploy/'s ServiceAccount, through the API server's relay on the node's 127.0.0.1:6443.
clientConnection:
  kubeconfig: {kubeconfig}
# Local traffic is the Node's podCIDRs (deploy/examples/node.yaml).
detectLocalMode: NodeCIDR
healthzBindAddress: {HEALTHZ}
metricsBindAddress: {METRICS}
nodePortAddresses: [primary]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
ebpf:
  bpffsRoot: {bpffs}
  cgroupRoot: {cgroup}
",
        node = examples.node_name,
        bpffs = bpffs_root().display(),
        cgroup = cgroup.display(),
        kubeconfig = kubeconfig.display(),
    )
}

fn start_agent(
    sandbox: &mut Sandbox,
    examples: &Examples,
    agent: &Path,
    cluster: &cluster::Cluster,
) -> anyhow::Result<()> {
    let config = work_dir().join("config.yaml");
    let text = agent_config(examples, &sandbox.cgroup, &cluster.agent_kubeconfig);
    fs::write(&config, &text).with_context(|| format!("writing {}", config.display()))?;
    let log = work_dir().join("agent.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().context("agent log")?;
    let config_arg = config.display().to_string();
    let args = [
        "--config",
        config_arg.as_str(),
        // Exit rather than fall back to iptables: the demo is about ebpf mode.
        "--strict-mode",
    ];
    println!("    proxy-agent {}", args.join(" "));
    println!("    configuration {}:", config.display());
    for line in text.lines() {
        println!("      {line}");
    }
    let child = command_in(&node_ns(), Some(&sandbox.cgroup), agent, &args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {}", agent.display()))?;
    sandbox.agent = Some(child);
    Ok(())
}

/// The value of `name` on the metrics page, if it is there.
/// The first sample of `name`, whatever its labels (the sync gauges carry `ip_family`).
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split('{').next().unwrap_or(series);
            (metric == name).then(|| value.parse().ok()).flatten()
        })
}

fn wait_for_sync(sandbox: &mut Sandbox) -> anyhow::Result<()> {
    let started = Instant::now();
    let url = format!("http://{METRICS}/metrics");
    loop {
        check_interrupted()?;
        if let Some(agent) = sandbox.agent.as_mut()
            && let Ok(Some(status)) = agent.try_wait()
        {
            bail!("the agent exited ({status})");
        }
        if let Ok(page) = http_get(&node_ns(), None, &url)
            && let Some(when) = metric(&page, SYNC_METRIC)
            && when > 0.0
        {
            println!(
                "    synced after {:.1} s: {SYNC_METRIC} {when}",
                started.elapsed().as_secs_f64()
            );
            break;
        }
        if started.elapsed() > SYNC_TIMEOUT {
            bail!("the agent did not sync within {SYNC_TIMEOUT:?}");
        }
        pause(Duration::from_millis(200))?;
    }
    for path in ["healthz", "proxyMode"] {
        let url = format!("http://{HEALTHZ}/{path}");
        let body = http_get(&node_ns(), None, &url)?;
        println!("    GET {url} -> {}", body.trim());
    }
    Ok(())
}

/// REQUESTS requests to one ClusterIP; every answer must come from one of its ready pods.
fn request_spread(
    sandbox: &Sandbox,
    examples: &Examples,
    frontend: &Frontend,
) -> anyhow::Result<()> {
    let url = format!("http://{}:{}/", frontend.cluster_ip, frontend.port);
    println!("    {} -> {url}", frontend.service);
    let mut answers: BTreeMap<String, usize> =
        frontend.pods.iter().map(|pod| (pod.clone(), 0)).collect();
    let mut line = Vec::new();
    for _ in 0..REQUESTS {
        check_interrupted()?;
        let body = http_get(&node_ns(), Some(&sandbox.cgroup), &url)?;
        let name = body.trim().to_string();
        line.push(name.clone());
        *answers.entry(name).or_default() += 1;
    }
    println!("      answers: {}", line.join(" "));
    let mut tally = Vec::new();
    for (name, count) in &answers {
        match examples.pods.iter().find(|p| &p.name == name) {
            Some(pod) if pod.ready => tally.push(format!("{name} x{count}")),
            Some(_) if *count == 0 => tally.push(format!("{name} x0 (not ready)")),
            Some(_) => bail!("{url}: {name} answered {count} times, but it is not ready"),
            None => bail!("{url}: unexpected answer {name:?}"),
        }
    }
    println!("      spread:  {}", tally.join(", "));
    let ready = frontend
        .pods
        .iter()
        .filter(|name| examples.pods.iter().any(|p| &p.name == *name && p.ready))
        .count();
    let answered = answers.values().filter(|count| **count > 0).count();
    if ready > 1 && answered == 1 {
        println!(
            "      (every request went to the same pod this time: the choice is random per connection)"
        );
    }
    Ok(())
}

fn show_services_map(agent: &Path, examples: &Examples) -> anyhow::Result<()> {
    let root = bpffs_root();
    let root_arg = root.display().to_string();
    println!("    $ proxy-agent inspect services --bpffs-root {root_arg}");
    let out = command_in(
        &node_ns(),
        None,
        agent,
        &["inspect", "services", "--bpffs-root", &root_arg],
    )
    .stdin(Stdio::null())
    .output()
    .context("running proxy-agent inspect")?;
    indent(&String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!(
            "proxy-agent inspect services failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let services = root.join("maps").join(proxy_common::maps::SVC4);
    let backends = root.join("maps").join(proxy_common::maps::BACKENDS4);
    println!("    $ bpftool map dump pinned {}", services.display());
    indent(&bpftool(&["map", "dump", "pinned"], &services)?);
    println!("    The same entries decoded (addresses and ports are kept in network byte order;");
    println!("    slot 0 holds a frontend's backend count, slots 1..n its backend ids):");
    let lines = maps::describe(
        &bpftool(&["--json", "map", "dump", "pinned"], &services)?,
        &bpftool(&["--json", "map", "dump", "pinned"], &backends)?,
        &|addr| {
            examples
                .pods
                .iter()
                .find(|p| p.address == *addr.ip() && p.ports.contains(&addr.port()))
                .map(|p| p.name.clone())
        },
    )?;
    for line in lines {
        println!("      {line}");
    }
    Ok(())
}

fn bpftool(args: &[&str], map: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new("bpftool")
        .args(args)
        .arg(map)
        .stdin(Stdio::null())
        .output()
        .context("running bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool {} {}: {}",
            args.join(" "),
            map.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn indent(text: &str) {
    for line in text.lines() {
        println!("      {line}");
    }
}

fn print_agent_log_tail() {
    let log = work_dir().join("agent.log");
    if let Ok(text) = fs::read_to_string(&log) {
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("--- last lines of the agent's log ---");
        for line in &lines[lines.len().saturating_sub(30)..] {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_metric_value_and_ignores_comments_and_prefixes() {
        let page = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds x\n\
                    # TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n\
                    kubeproxy_sync_proxy_rules_last_timestamp_seconds_total 3\n\
                    kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e9\n";
        assert_eq!(metric(page, SYNC_METRIC), Some(1.7e9));
        assert_eq!(metric("# only comments\n", SYNC_METRIC), None);
        let labelled = "kubeproxy_sync_proxy_rules_last_timestamp_seconds_total{ip_family=\"IPv4\"} 3\n\
                        kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.8e9\n";
        assert_eq!(metric(labelled, SYNC_METRIC), Some(1.8e9));
    }

    #[test]
    fn the_agent_configuration_points_at_the_sandbox() {
        let dir = workspace_root().join("deploy/examples");
        let (examples, _) = examples::load(&dir).unwrap();
        let text = agent_config(
            &examples,
            Path::new("/sys/fs/cgroup/kpdemo"),
            Path::new("/tmp/kpdemo/agent.kubeconfig"),
        );
        let value: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(value["mode"].as_str(), Some("ebpf"));
        assert_eq!(value["hostnameOverride"].as_str(), Some("demo-node"));
        assert_eq!(
            value["ebpf"]["cgroupRoot"].as_str(),
            Some("/sys/fs/cgroup/kpdemo")
        );
        assert_eq!(
            value["ebpf"]["bpffsRoot"].as_str(),
            Some("/sys/fs/bpf/kpdemo")
        );
        assert_eq!(value["conntrack"]["maxPerCore"].as_i64(), Some(0));
        assert_eq!(
            value["clientConnection"]["kubeconfig"].as_str(),
            Some("/tmp/kpdemo/agent.kubeconfig")
        );
    }
}
