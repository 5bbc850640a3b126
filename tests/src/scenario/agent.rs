// SPDX-License-Identifier: Apache-2.0
//! Running the proxy under test inside the node namespace and cgroup: its
//! configuration, start, readiness (via its sync metrics or /healthz), stop and cleanup.
//! The proxy is ours (proxy-agent) or upstream's kube-proxy ([`Proxy`]), the judge of the
//! scenario files: both take the same KubeProxyConfiguration, serve the same /healthz,
//! metrics and /proxyMode, and are driven by the runner alike.

use std::{
    ffi::OsString,
    fmt, fs,
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use serde_json::{Map, Value, json};

use super::{
    cluster::AgentConnection,
    error::{Error, Result},
    format::Mode,
    http::{self, HttpResponse},
    netns::{self, Place},
    readiness::{Change, judge_healthz, judge_metrics, parse_sync_times},
};

/// Whose proxy runs in the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Proxy {
    /// This project's proxy-agent.
    #[default]
    Ours,
    /// Upstream's kube-proxy (built by `testbed`): what the scenario files restate.
    Upstream,
}

impl Proxy {
    /// The IP families whose first sync a start must show. Upstream's kube-proxy runs a
    /// proxier per family whenever the node's kernel has both (the node's addresses only
    /// choose the primary one), each syncing on its own; ours syncs every family it runs
    /// at once, and shows them from the start.
    pub fn families_synced_at_start(self) -> &'static [&'static str] {
        match self {
            Proxy::Ours => &[],
            Proxy::Upstream => &["IPv4", "IPv6"],
        }
    }

    /// Whether a sync that looks like the change's must still be the newest a moment
    /// later. Upstream stamps a sync when it ends: a change it heard while the sync ran
    /// (queued before that stamp) is written by the next sync, which starts at once (the
    /// runner's minSyncPeriod) but has not ended yet. Ours hears of changes and syncs on
    /// one task: nothing is queued while a sync runs.
    pub fn confirms_quiet(self) -> bool {
        self == Proxy::Upstream
    }

    /// The first part of the names of its configuration and log in the run directory.
    pub fn file_stem(self) -> &'static str {
        match self {
            Proxy::Ours => "agent",
            Proxy::Upstream => "kube-proxy",
        }
    }
}

/// A runner mode: a dataplane mode of ours (`iptables`) or of upstream's kube-proxy
/// (`upstream-iptables`). Flows are judged by [`ProxyMode::mode`] either way: a flow's
/// `modes:` applies to upstream-X as to X.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyMode {
    pub proxy: Proxy,
    pub mode: Mode,
}

/// The prefix naming upstream's kube-proxy in a runner mode.
const UPSTREAM_PREFIX: &str = "upstream-";

impl ProxyMode {
    pub fn ours(mode: Mode) -> Self {
        Self {
            proxy: Proxy::Ours,
            mode,
        }
    }

    pub fn upstream(mode: Mode) -> Self {
        Self {
            proxy: Proxy::Upstream,
            mode,
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.proxy {
            Proxy::Ours => write!(f, "{}", self.mode),
            Proxy::Upstream => write!(f, "{UPSTREAM_PREFIX}{}", self.mode),
        }
    }
}

impl std::str::FromStr for ProxyMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let Some(upstream) = s.strip_prefix(UPSTREAM_PREFIX) else {
            return Ok(Self::ours(s.parse()?));
        };
        let mode: Mode = upstream.parse()?;
        if mode == Mode::Ebpf {
            return Err(Error::Invalid(format!(
                "{s}: upstream's kube-proxy has no ebpf mode (upstream-iptables, \
                 upstream-nftables or upstream-ipvs)"
            )));
        }
        Ok(Self::upstream(mode))
    }
}

pub const HEALTHZ_BIND: &str = "127.0.0.1:10256";

/// How long an upstream sync that looks like the change's must stay the newest (see
/// [`Proxy::confirms_quiet`]): longer than one sync of a scenario's few services takes.
const QUIET_CONFIRMATION: Duration = Duration::from_millis(200);
pub const METRICS_BIND: &str = "127.0.0.1:10249";

pub fn bpffs_root(run_id: &str) -> PathBuf {
    Path::new("/sys/fs/bpf").join(run_id)
}

/// The pinned IPv4 service map under the agent's bpffs root.
pub fn service_map_pin(bpffs_root: &Path) -> PathBuf {
    proxy_agent::proxier::ebpf::maps_dir(bpffs_root).join(proxy_common::maps::SVC4)
}

/// Everything the runner must set, merged over the scenario's `config:` fragment.
#[derive(Debug, Clone)]
pub struct ConfigInputs<'a> {
    pub fragment: &'a Map<String, Value>,
    pub proxy: Proxy,
    pub mode: Mode,
    pub node_name: &'a str,
    pub connection: &'a AgentConnection,
    pub bpffs_root: &'a Path,
    pub cgroup_root: &'a Path,
}

/// Sets `entries` inside the object at `key`, keeping what else it holds.
fn merge_into(map: &mut Map<String, Value>, key: &str, entries: Vec<(&str, Value)>) {
    let mut inner = match map.remove(key) {
        Some(Value::Object(inner)) => inner,
        _ => Map::new(),
    };
    for (name, value) in entries {
        inner.insert(name.to_string(), value);
    }
    map.insert(key.to_string(), Value::Object(inner));
}

/// What upstream's kube-proxy is told about conntrack: leave the node's settings alone
/// (zero is "do not set"), as a kube-proxy in a shared network namespace must; the
/// nf_conntrack sysctls it would set are the host's, not the node's.
fn upstream_conntrack() -> Value {
    json!({
        "maxPerCore": 0,
        "min": 0,
        "tcpEstablishedTimeout": "0s",
        "tcpCloseWaitTimeout": "0s",
        "udpTimeout": "0s",
        "udpStreamTimeout": "0s",
    })
}

/// The KubeProxyConfiguration YAML the proxy is started with: the file's fragment with
/// what the runner sets over it (node name, where to serve, how to reach the API server);
/// for ours the `ebpf` pins, for upstream's kube-proxy conntrack left alone and nothing of
/// ours (it knows no `ebpf` section).
pub fn render_config(inputs: &ConfigInputs<'_>) -> Result<String> {
    let mut config = Map::new();
    config.insert(
        "apiVersion".into(),
        json!("kubeproxy.config.k8s.io/v1alpha1"),
    );
    config.insert("kind".into(), json!("KubeProxyConfiguration"));
    for (key, value) in inputs.fragment {
        config.insert(key.clone(), value.clone());
    }
    config.insert("mode".into(), json!(inputs.mode.as_str()));
    config.insert("hostnameOverride".into(), json!(inputs.node_name));
    config.insert("healthzBindAddress".into(), json!(HEALTHZ_BIND));
    config.insert("metricsBindAddress".into(), json!(METRICS_BIND));
    if let AgentConnection::Kubeconfig(path) = inputs.connection {
        merge_into(
            &mut config,
            "clientConnection",
            vec![("kubeconfig", json!(path))],
        );
    }
    match inputs.proxy {
        Proxy::Ours => merge_into(
            &mut config,
            "ebpf",
            vec![
                ("bpffsRoot", json!(inputs.bpffs_root)),
                ("cgroupRoot", json!(inputs.cgroup_root)),
            ],
        ),
        Proxy::Upstream => {
            config.remove("ebpf");
            config.insert("conntrack".into(), upstream_conntrack());
            // A change that lands while a sync runs is applied by the next sync, which
            // upstream holds back for minSyncPeriod (1 s by default); the sync metrics
            // stamp a sync's end, not its start, so the change looks applied a second
            // early. A millisecond (zero means the default) runs the next sync at once;
            // it changes when rules are written, not what they say.
            for section in ["iptables", "ipvs", "nftables"] {
                let has_own = config
                    .get(section)
                    .and_then(|s| s.get("minSyncPeriod"))
                    .is_some();
                if !has_own {
                    merge_into(&mut config, section, vec![("minSyncPeriod", json!("1ms"))]);
                }
            }
            // Verbose enough to show each sync and why a rule was skipped.
            merge_into(&mut config, "logging", vec![("verbosity", json!(2))]);
        }
    }
    Ok(serde_yaml::to_string(&Value::Object(config))?)
}

#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Whose proxy [`AgentOptions::binary`] is.
    pub proxy: Proxy,
    pub binary: PathBuf,
    /// The mode the agent is asked to run. The runner requires it to run
    /// [`RunOptions::mode`](super::RunOptions) (the mode flows are judged in): the same
    /// mode, or the fallback a test expects.
    pub mode: Mode,
    /// Appended to the agent's command line.
    pub extra_args: Vec<String>,
    /// Configuration merged over each scenario's `config` (objects merge key by key), e.g.
    /// `{"ebpf": {"xdpMode": "generic"}}`. The agent ignores most flags when it is given a
    /// configuration file, as upstream does, so settings go here rather than in flags.
    pub config_overrides: Map<String, Value>,
    pub ready_timeout: Duration,
}

/// How [`Agent::launch`] starts the agent: what the scenario runner ([`Agent::start`])
/// and the benchmarks share.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub binary: &'a Path,
    /// The mode the agent is asked to run (see [`AgentOptions::mode`]).
    pub mode: Mode,
    pub inputs: &'a ConfigInputs<'a>,
    pub node: Place,
    /// Where the configuration is written and the agent's output goes.
    pub config: PathBuf,
    pub log: PathBuf,
    /// Appended to the agent's command line (after `--config` and `--source`).
    pub extra_args: Vec<String>,
    /// Added to the environment of the agent and of its `--cleanup` at stop (e.g. a PATH
    /// whose `iptables*` are the legacy ones).
    pub env: Vec<(OsString, OsString)>,
    pub ready_timeout: Duration,
    /// Leave the agent's pins and rules at stop, for inspection.
    pub keep: bool,
}

/// The running agent. Dropping it stops it and removes what it left behind.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    pub log: PathBuf,
    pub config: PathBuf,
    binary: PathBuf,
    env: Vec<(OsString, OsString)>,
    proxy: Proxy,
    /// The mode the agent was asked to run.
    requested: Mode,
    bpffs_root: PathBuf,
    node: Place,
    /// The node namespace, outside the node cgroup (for /healthz polling).
    probe_place: Place,
    ready_timeout: Duration,
    /// `--keep`: leave the agent's pins and rules for inspection.
    keep: bool,
}

impl Agent {
    /// Writes the configuration and starts the agent.
    pub fn start(
        options: &AgentOptions,
        inputs: &ConfigInputs<'_>,
        node: Place,
        run_dir: &Path,
        // The runner no longer starts itself to poll the agent (see `get`); kept so that
        // callers need not change.
        _runner_exe: &Path,
        keep: bool,
    ) -> Result<Self> {
        Self::launch(&Launch {
            binary: &options.binary,
            mode: options.mode,
            inputs,
            node,
            config: run_dir.join(format!(
                "{}-{}.yaml",
                options.proxy.file_stem(),
                options.mode
            )),
            log: run_dir.join(format!(
                "{}-{}.log",
                options.proxy.file_stem(),
                options.mode
            )),
            extra_args: options.extra_args.clone(),
            env: Vec::new(),
            ready_timeout: options.ready_timeout,
            keep,
        })
    }

    /// Writes the configuration and starts the agent as `launch` says.
    pub fn launch(launch: &Launch<'_>) -> Result<Self> {
        let Launch {
            binary,
            inputs,
            node,
            config,
            log,
            ..
        } = launch;
        fs::write(config, render_config(inputs)?)
            .map_err(Error::io(format!("writing {}", config.display())))?;
        let out =
            fs::File::create(log).map_err(Error::io(format!("creating {}", log.display())))?;
        let err = out.try_clone().map_err(Error::io("agent log"))?;
        let mut args = vec!["--config".to_string(), config.display().to_string()];
        if let AgentConnection::SourceDir(dir) = inputs.connection {
            if inputs.proxy == Proxy::Upstream {
                return Err(Error::Setup(
                    "upstream's kube-proxy reads the cluster from an API server only (--api real)"
                        .into(),
                ));
            }
            args.extend(["--source".to_string(), dir.display().to_string()]);
        }
        args.extend(launch.extra_args.iter().cloned());
        let child = node
            .command(binary, &args)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(Error::io(format!("starting {}", binary.display())))?;
        Ok(Agent {
            child: Some(child),
            log: log.clone(),
            config: config.clone(),
            binary: binary.to_path_buf(),
            env: launch.env.clone(),
            proxy: inputs.proxy,
            requested: launch.mode,
            bpffs_root: inputs.bpffs_root.to_path_buf(),
            probe_place: Place {
                netns: node.netns.clone(),
                cgroup: None,
            },
            node: node.clone(),
            ready_timeout: launch.ready_timeout,
            keep: launch.keep,
        })
    }

    /// The agent's process id while it runs (the node's `nsenter` execs it in place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the agent exited, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())
    }

    /// Waits for the agent's first sync after its start (see [`Agent::wait_synced`]).
    pub async fn wait_first_sync(&mut self) -> Result<()> {
        let now = SystemTime::now();
        self.wait_synced(Change {
            started: now,
            at: now,
            initial: true,
        })
        .await
    }

    /// Waits until the agent has applied `change`: by its sync metrics, or failing
    /// those, by /healthz (see [`readiness`](super::readiness)).
    pub async fn wait_synced(&mut self, change: Change) -> Result<()> {
        let deadline = Instant::now() + self.ready_timeout;
        // Upstream's kube-proxy: the sync stamp at which the change looked applied, which
        // must still be the newest one a moment later (see `Proxy::confirms_quiet`).
        let mut candidate: Option<Option<f64>> = None;
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(self.failure(format!("exited ({status})")));
            }
            let mut newest_sync = None;
            let verdict = match self.get(&format!("http://{METRICS_BIND}/metrics")).await {
                Ok(metrics)
                    if metrics.status == 200
                        && !parse_sync_times(&metrics.body).families.is_empty() =>
                {
                    let times = parse_sync_times(&metrics.body);
                    newest_sync = times.last_sync();
                    judge_metrics(
                        &times,
                        change,
                        SystemTime::now(),
                        self.proxy.families_synced_at_start(),
                    )
                }
                // Only a proxy that serves metrics without the sync gauges is judged by
                // /healthz: one whose metrics server is not up yet is simply not ready
                // (its /healthz says "healthy" while starting, as upstream's does), and one
                // that shows only the queued gauge has not synced yet (upstream's kube-proxy
                // shows the sync gauge from its first sync on).
                Ok(_) => match self.get(&format!("http://{HEALTHZ_BIND}/healthz")).await {
                    Ok(healthz) => judge_healthz(&healthz, change),
                    Err(err) => Err(err),
                },
                Err(err) => Err(err),
            };
            let last = match verdict {
                Ok(()) if !self.proxy.confirms_quiet() => return Ok(()),
                Ok(()) if candidate == Some(newest_sync) => return Ok(()),
                Ok(()) => {
                    candidate = Some(newest_sync);
                    tokio::time::sleep(QUIET_CONFIRMATION).await;
                    continue;
                }
                Err(why) => {
                    candidate = None;
                    why
                }
            };
            if Instant::now() >= deadline {
                return Err(self.failure(format!(
                    "not synced {:?} after the change: {last}",
                    self.ready_timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails unless the agent runs `expected` (its `/proxyMode`, the mode actually running
    /// after any fallback): a fallback's results must never pass as the requested mode's.
    pub async fn check_running_mode(&self, expected: Mode) -> Result<()> {
        let url = format!("http://{METRICS_BIND}/proxyMode");
        let running = match self.get(&url).await {
            Ok(answer) if answer.status == 200 => answer.body.trim().to_string(),
            Ok(answer) => {
                return Err(self.failure(format!("GET {url} answered {}", answer.status)));
            }
            Err(err) => return Err(self.failure(err)),
        };
        if running == expected.as_str() {
            return Ok(());
        }
        let requested = self.requested;
        let why = fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("FALLBACK") || l.contains("fallback"))
            .map(|l| format!(" (agent log: {})", without_ansi(l).trim()))
            .unwrap_or_default();
        Err(Error::Agent {
            reason: format!(
                "the agent runs {running:?} mode, not {expected}: {requested} was requested \
                 and it fell back{why}; its flows are not judged as {expected}"
            ),
        })
    }

    /// GET from inside the node namespace (see [`get_in`]), on a blocking task.
    async fn get(&self, url: &str) -> Result<HttpResponse, String> {
        let netns = self.probe_place.netns.clone();
        let url = url.to_string();
        tokio::task::spawn_blocking(move || get_in(&netns, &url, Duration::from_millis(300)))
            .await
            .map_err(|err| format!("GET task: {err}"))?
    }

    fn failure(&self, reason: String) -> Error {
        Error::Agent {
            reason: format!(
                "{reason}\n--- last lines of {} ---\n{}",
                self.log.display(),
                self.log_tail(40)
            ),
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGKILL, nothing else: the dataplane stays as the agent left it (a crash or an
    /// upgrade's hard stop). A later `stop` (or drop) of this handle does nothing.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL after 5 s, and nothing else: the dataplane stays for the
    /// next agent (an upgrade, a mode switch). Returns whether the agent was running.
    pub fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    /// SIGTERM, then SIGKILL after 5 s; then (unless kept) `--cleanup` with the same
    /// pin root, and the pin directory removed.
    pub fn stop(&mut self) {
        if !self.terminate() || self.keep {
            return;
        }
        if self.proxy == Proxy::Upstream {
            // Its rules live in the node's namespace only, which goes with the run; nothing
            // of upstream's is pinned or attached outside it.
            return;
        }

        let args = vec![
            "--cleanup".to_string(),
            "--bpffs-root".to_string(),
            self.bpffs_root.display().to_string(),
        ];
        match self
            .node
            .command(&self.binary, &args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) if !out.status.success() => eprintln!(
                "cleanup: {} --cleanup failed: {}",
                self.binary.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => eprintln!(
                "cleanup: running {} --cleanup: {err}",
                self.binary.display()
            ),
            Ok(_) => {}
        }
        if self.bpffs_root.exists()
            && let Err(err) = fs::remove_dir_all(&self.bpffs_root)
        {
            eprintln!("cleanup: removing {}: {err}", self.bpffs_root.display());
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP GET from inside network namespace `ns` (the agent's 127.0.0.1 is the node's),
/// over a socket made there by a short-lived thread: no process per poll, which matters
/// where every exec is slow (the emulated test VM) and the agent needs the CPU to sync.
pub fn get_in(ns: &str, url: &str, timeout: Duration) -> Result<HttpResponse, String> {
    let netns = ns.to_string();
    http::get_with(url, timeout, |addr| {
        netns::in_netns(&netns, move || {
            std::net::TcpStream::connect_timeout(&addr, timeout)
        })
        .map_err(std::io::Error::other)
    })
    .map_err(|err| err.to_string())
}

/// The severity of one line of the agent's log in klog's text format (`I`, `W`, `E` or
/// `F`, followed by the month and day: `E1127 ...`); `None` for any other line.
pub fn klog_severity(line: &str) -> Option<char> {
    let mut chars = line.chars();
    let severity = chars.next().filter(|c| "IWEF".contains(*c))?;
    let date: String = chars.by_ref().take(4).collect();
    (date.len() == 4 && date.chars().all(|c| c.is_ascii_digit()) && chars.next() == Some(' '))
        .then_some(severity)
}

/// `text` without ANSI escape sequences (the agent's log may be coloured).
fn without_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters... final byte in @..~
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(
        fragment: &'a Map<String, Value>,
        connection: &'a AgentConnection,
    ) -> ConfigInputs<'a> {
        ConfigInputs {
            fragment,
            proxy: Proxy::Ours,
            mode: Mode::Ipvs,
            node_name: "test-node",
            connection,
            bpffs_root: Path::new("/sys/fs/bpf/kpt0001"),
            cgroup_root: Path::new("/sys/fs/cgroup/unified/kpt0001-node"),
        }
    }

    #[test]
    fn ansi_colours_are_stripped() {
        assert_eq!(
            without_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m fell back"),
            "2026 ERROR fell back"
        );
        assert_eq!(without_ansi("plain"), "plain");
    }

    #[test]
    fn klog_lines_have_a_severity() {
        let line = r#"E1127 01:02:03.456789    1234 mod.rs:42] "cannot serve" err="busy""#;
        assert_eq!(klog_severity(line), Some('E'));
        assert_eq!(klog_severity(&line.replacen('E', "W", 1)), Some('W'));
        assert_eq!(klog_severity("ERROR something"), None);
        assert_eq!(klog_severity("Error: E1127"), None);
        assert_eq!(klog_severity(""), None);
    }

    #[test]
    fn config_merges_fragment_and_runner_settings() {
        let fragment: Map<String, Value> = serde_yaml::from_str(
            "clusterCIDR: 10.0.0.0/8\nmode: iptables\nclientConnection: {qps: 5}\nnodePortAddresses: [primary]\n",
        )
        .unwrap();
        let connection = AgentConnection::Kubeconfig("/tmp/k/kubeconfig".into());
        let text = render_config(&inputs(&fragment, &connection)).unwrap();
        let back: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1");
        assert_eq!(back["kind"], "KubeProxyConfiguration");
        assert_eq!(back["clusterCIDR"], "10.0.0.0/8");
        assert_eq!(back["nodePortAddresses"][0], "primary");
        assert_eq!(back["mode"], "ipvs");
        assert_eq!(back["hostnameOverride"], "test-node");
        assert_eq!(back["healthzBindAddress"], HEALTHZ_BIND);
        assert_eq!(back["metricsBindAddress"], METRICS_BIND);
        assert_eq!(back["clientConnection"]["qps"], 5);
        assert_eq!(back["clientConnection"]["kubeconfig"], "/tmp/k/kubeconfig");
        assert_eq!(back["ebpf"]["bpffsRoot"], "/sys/fs/bpf/kpt0001");
        assert_eq!(
            back["ebpf"]["cgroupRoot"],
            "/sys/fs/cgroup/unified/kpt0001-node"
        );

        let dir = AgentConnection::SourceDir("/tmp/objects".into());
        let back: Value =
            serde_yaml::from_str(&render_config(&inputs(&Map::new(), &dir)).unwrap()).unwrap();
        assert!(back.get("clientConnection").is_none());
    }

    #[test]
    fn upstream_gets_the_files_config_without_ours_and_conntrack_left_alone() {
        let fragment: Map<String, Value> = serde_yaml::from_str(
            "clusterCIDR: 10.0.0.0/8\nebpf: {xdpMode: generic}\nnftables: {masqueradeAll: true}\n",
        )
        .unwrap();
        let connection = AgentConnection::Kubeconfig("/tmp/k/kubeconfig".into());
        let mut upstream = inputs(&fragment, &connection);
        upstream.proxy = Proxy::Upstream;
        upstream.mode = Mode::Nftables;
        let back: Value = serde_yaml::from_str(&render_config(&upstream).unwrap()).unwrap();
        assert!(back.get("ebpf").is_none(), "{back}");
        assert_eq!(back["mode"], "nftables");
        assert_eq!(back["clusterCIDR"], "10.0.0.0/8");
        assert_eq!(back["nftables"]["masqueradeAll"], true);
        assert_eq!(back["hostnameOverride"], "test-node");
        assert_eq!(back["clientConnection"]["kubeconfig"], "/tmp/k/kubeconfig");
        assert_eq!(back["conntrack"]["maxPerCore"], 0);
        assert_eq!(back["conntrack"]["tcpEstablishedTimeout"], "0s");
        assert_eq!(back["conntrack"]["tcpCloseWaitTimeout"], "0s");
        assert_eq!(back["nftables"]["minSyncPeriod"], "1ms");
        assert_eq!(back["iptables"]["minSyncPeriod"], "1ms");
    }

    #[test]
    fn runner_modes_name_whose_proxy_runs() {
        let upstream: ProxyMode = "upstream-nftables".parse().unwrap();
        assert_eq!(upstream, ProxyMode::upstream(Mode::Nftables));
        assert_eq!(upstream.to_string(), "upstream-nftables");
        let ours: ProxyMode = "ipvs".parse().unwrap();
        assert_eq!(ours, ProxyMode::ours(Mode::Ipvs));
        assert_eq!(ours.to_string(), "ipvs");
        assert!("upstream-ebpf".parse::<ProxyMode>().is_err());
        assert!("upstream-".parse::<ProxyMode>().is_err());
        assert!("upstream-userspace".parse::<ProxyMode>().is_err());
    }
}
