// SPDX-License-Identifier: Apache-2.0
//! The agent under benchmark: ebpf mode (strict: no fallback), fed from a manifest
//! directory, in the node namespace and cgroup, with its own bpffs root; started, stopped
//! and cleaned up by the scenario harness's [`Agent`]. Readiness comes from its sync
//! metrics alone (a benchmark times the sync), read from inside the node namespace.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant, SystemTime},
};

use serde_json::{Map, Value, json};

use ::tests::scenario::{
    Mode,
    agent::{Agent, ConfigInputs, Launch, METRICS_BIND, get_in},
    cluster::AgentConnection,
    netns::Place,
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

/// How long a GET of the agent's metrics may take.
const GET_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug)]
pub struct BenchAgent {
    /// Stops the agent and runs its `--cleanup` (with the same environment) on drop.
    agent: Agent,
    node_ns: String,
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
        let node_ns = node.netns.clone();
        let agent = Agent::launch(&Launch {
            binary,
            mode: spec.mode,
            inputs: &ConfigInputs {
                proxy: tests::scenario::agent::Proxy::Ours,
                fragment: spec.fragment,
                mode: spec.mode,
                node_name: NODE_NAME,
                connection: &spec.connection,
                bpffs_root,
                cgroup_root: &cgroup,
            },
            node,
            config: run_dir.join("agent.yaml"),
            log: run_dir.join("agent.log"),
            extra_args: vec!["--strict-mode".to_string()],
            env: spec.env.clone(),
            // Unused: the benchmarks' waits ([`wait_synced`](Self::wait_synced)) take
            // their own.
            ready_timeout: Duration::ZERO,
            keep: false,
        })?;
        Ok(BenchAgent {
            log: agent.log.clone(),
            agent,
            node_ns,
        })
    }

    /// Waits for the agent's first sync of what its source held when it was started at
    /// `started`.
    pub fn wait_initial_sync(&mut self, started: SystemTime, timeout: Duration) -> Result<()> {
        self.wait_synced(
            Change {
                started,
                at: started,
                initial: true,
            },
            timeout,
        )
    }

    /// Waits until the agent's sync metrics show `change` applied.
    pub fn wait_synced(&mut self, change: Change, timeout: Duration) -> Result<()> {
        self.wait_metrics(timeout, |body, now| {
            judge_metrics(&parse_sync_times(body), change, now, &[])
        })
    }

    /// Polls the agent's metrics until `judge` (given their text and the time they were
    /// read) accepts them, and returns what it returned; fails when the agent exits, or at
    /// `timeout` with the judge's last reason.
    pub fn wait_metrics<T>(
        &mut self,
        timeout: Duration,
        mut judge: impl FnMut(&str, SystemTime) -> Result<T, String>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            signals::check()?;
            if let Some(status) = self.agent.exit_status() {
                return Err(self.failure(format!("exited ({status})")));
            }
            let last = match self.metrics() {
                Ok(body) => match judge(&body, SystemTime::now()) {
                    Ok(accepted) => return Ok(accepted),
                    Err(why) => why,
                },
                Err(err) => err,
            };
            if Instant::now() >= deadline {
                return Err(self.failure(format!("not synced after {timeout:?}: {last}")));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's metrics text, read once from inside the node namespace.
    pub fn metrics(&self) -> Result<String, String> {
        let url = format!("http://{METRICS_BIND}/metrics");
        match get_in(&self.node_ns, &url, GET_TIMEOUT) {
            Ok(metrics) if metrics.status == 200 => Ok(metrics.body),
            Ok(other) => Err(format!("/metrics answered {}", other.status)),
            Err(err) => Err(err),
        }
    }

    /// The agent's process id while it runs (the node's `nsenter` execs it in place).
    pub fn pid(&self) -> Option<u32> {
        self.agent.pid()
    }

    pub fn failure(&self, reason: String) -> Error {
        Error::Agent(format!(
            "{reason}\n--- last lines of {} ---\n{}",
            self.log.display(),
            self.agent.log_tail(30)
        ))
    }

    /// SIGTERM, SIGKILL after 5 s, then `--cleanup` on its pins and the pin directory
    /// removed.
    pub fn stop(&mut self) {
        self.agent.stop();
    }
}
