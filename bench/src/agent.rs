// SPDX-License-Identifier: Apache-2.0
//! The agent under benchmark: ebpf mode (strict: no fallback), fed from a manifest
//! directory, in the node namespace and cgroup, with its own bpffs root. Readiness comes
//! from its sync metrics, read from inside the node namespace.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::sched::{CloneFlags, setns};
use serde_json::{Map, Value, json};

use ::tests::scenario::{
    Mode,
    agent::{ConfigInputs, METRICS_BIND, render_config},
    cluster::AgentConnection,
    http::{self, HttpResponse},
    netns::{Place, netns_path},
    readiness::{Change, judge_metrics, parse_sync_times},
};

use super::{
    error::{Error, Result},
    signals,
};

pub const NODE_NAME: &str = "bench-node";

/// How [`BenchAgent::start_spec`] starts the agent.
#[derive(Debug, Clone)]
pub struct StartSpec<'a> {
    pub connection: AgentConnection,
    /// Settings merged under the ones the benchmark sets.
    pub fragment: &'a Map<String, Value>,
    pub mode: Mode,
    /// Environment variables set for the agent (e.g. a PATH whose iptables* are the
    /// -legacy variants).
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

/// Settings the benchmark adds to the agent's configuration. The periodic full resync is
/// pushed out of the measurement (it would diff every map entry in the middle of a rep at
/// 10,000 services): the benchmark measures the dataplane, not the control plane.
pub fn config_fragment() -> Map<String, Value> {
    let mut fragment = Map::new();
    fragment.insert("iptables".into(), json!({ "syncPeriod": "1h" }));
    fragment
}

#[derive(Debug)]
pub struct BenchAgent {
    child: Option<Child>,
    binary: PathBuf,
    bpffs_root: PathBuf,
    node: Place,
    /// Environment the agent and its `--cleanup` run with (e.g. a PATH naming other
    /// iptables commands).
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    pub log: PathBuf,
}

impl BenchAgent {
    /// Writes the configuration and starts the agent in `node`.
    pub fn start(
        binary: &Path,
        node: Place,
        run_dir: &Path,
        manifests: &Path,
        bpffs_root: &Path,
    ) -> Result<Self> {
        Self::start_with(
            binary,
            node,
            run_dir,
            manifests,
            bpffs_root,
            &config_fragment(),
        )
    }

    /// [`start`](Self::start) with `fragment` as the configuration's settings (merged
    /// under the ones the benchmark sets: mode, node name, bind addresses, pins, cgroup).
    pub fn start_with(
        binary: &Path,
        node: Place,
        run_dir: &Path,
        manifests: &Path,
        bpffs_root: &Path,
        fragment: &Map<String, Value>,
    ) -> Result<Self> {
        Self::start_spec(
            binary,
            node,
            run_dir,
            bpffs_root,
            &StartSpec {
                connection: AgentConnection::SourceDir(manifests.to_path_buf()),
                fragment,
                mode: Mode::Ebpf,
                env: Vec::new(),
            },
        )
    }

    /// [`start_with`](Self::start_with) in `mode` (still strict: no fallback), with `env`
    /// added to the agent's environment and to its `--cleanup` at stop (e.g. a PATH whose
    /// `iptables*` are the legacy ones).
    #[allow(clippy::too_many_arguments)]
    pub fn start_in_mode(
        binary: &Path,
        node: Place,
        run_dir: &Path,
        manifests: &Path,
        bpffs_root: &Path,
        fragment: &Map<String, Value>,
        mode: Mode,
        env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Self> {
        Self::start_spec(
            binary,
            node,
            run_dir,
            bpffs_root,
            &StartSpec {
                connection: AgentConnection::SourceDir(manifests.to_path_buf()),
                fragment,
                mode,
                env,
            },
        )
    }

    /// Starts the agent as `spec` says: fed from a directory (`--source`) or an API server
    /// (its kubeconfig), in any mode, with `--strict-mode`.
    pub fn start_spec(
        binary: &Path,
        node: Place,
        run_dir: &Path,
        bpffs_root: &Path,
        spec: &StartSpec<'_>,
    ) -> Result<Self> {
        let cgroup = node
            .cgroup
            .clone()
            .ok_or_else(|| Error::Setup("the node has no cgroup".into()))?;
        let config = render_config(&ConfigInputs {
            fragment: spec.fragment,
            mode: spec.mode,
            node_name: NODE_NAME,
            connection: &spec.connection,
            bpffs_root,
            cgroup_root: &cgroup,
        })?;
        let config_path = run_dir.join("agent.yaml");
        fs::write(&config_path, config)
            .map_err(Error::io(format!("writing {}", config_path.display())))?;
        let log = run_dir.join("agent.log");
        let out =
            fs::File::create(&log).map_err(Error::io(format!("creating {}", log.display())))?;
        let err = out.try_clone().map_err(Error::io("agent log"))?;
        let mut args = vec!["--config".to_string(), config_path.display().to_string()];
        if let AgentConnection::SourceDir(dir) = &spec.connection {
            args.extend(["--source".to_string(), dir.display().to_string()]);
        }
        args.push("--strict-mode".to_string());
        let mut command = node.command(binary, &args);
        command.envs(spec.env.iter().map(|(k, v)| (k, v)));
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(Error::io(format!("starting {}", binary.display())))?;
        Ok(BenchAgent {
            child: Some(child),
            binary: binary.to_path_buf(),
            bpffs_root: bpffs_root.to_path_buf(),
            node,
            env: spec.env.clone(),
            log,
        })
    }

    /// Waits until the agent's sync metrics show `change` applied.
    pub fn wait_synced(&mut self, change: Change, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let url = format!("http://{METRICS_BIND}/metrics");
        loop {
            signals::check()?;
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(self.failure(format!("exited ({status})")));
            }
            let last = match get_in(&self.node.netns, &url) {
                Ok(metrics) if metrics.status == 200 => {
                    match judge_metrics(
                        parse_sync_times(&metrics.body),
                        change,
                        std::time::SystemTime::now(),
                    ) {
                        Ok(()) => return Ok(()),
                        Err(why) => why,
                    }
                }
                Ok(other) => format!("/metrics answered {}", other.status),
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(self.failure(format!("not synced after {timeout:?}: {last}")));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's process id while it runs (the node's `nsenter` execs it in place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn failure(&self, reason: String) -> Error {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        Error::Agent(format!(
            "{reason}\n--- last lines of {} ---\n{tail}",
            self.log.display()
        ))
    }

    /// SIGTERM, SIGKILL after 5 s, then `--cleanup` on its pins and the pin directory
    /// removed.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
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
        let args = [
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

impl Drop for BenchAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP GET from inside network namespace `ns` (the agent's 127.0.0.1 is the node's):
/// a short-lived thread enters the namespace and makes the request.
pub fn get_in(ns: &str, url: &str) -> Result<HttpResponse> {
    let path = netns_path(ns);
    let url = url.to_string();
    let name = ns.to_string();
    thread::spawn(move || {
        let file =
            fs::File::open(&path).map_err(Error::io(format!("opening {}", path.display())))?;
        setns(&file, CloneFlags::CLONE_NEWNET)
            .map_err(|source| Error::Scenario(::tests::scenario::Error::Setns { name, source }))?;
        Ok(http::get(&url, Duration::from_millis(500))?)
    })
    .join()
    .map_err(|_| Error::Setup("the namespace GET thread panicked".into()))?
}
