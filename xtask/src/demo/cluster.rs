// SPDX-License-Identifier: Apache-2.0
//! The demo's cluster: upstream's control plane (testbed's `control-plane serve`, its own
//! process, so that `--keep` can leave it running), reached by kubectl with the admin
//! kubeconfig and by the agent, inside the sandbox node, through a relay on the node's
//! 127.0.0.1:6443 with the ServiceAccount and RBAC of deploy/.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_yaml::Value;

use super::{check_interrupted, pause, sandbox::node_ns};

/// The Service range of the demo's cluster (its ServiceCIDR `kubernetes`): the examples'
/// ClusterIPs are in it, and default/kubernetes takes its first address.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// Where the agent reaches the API server, inside the node namespace.
pub const API_IN_NODE: &str = "127.0.0.1:6443";
/// How long the control plane may take to start (the first start after a build is the
/// slowest).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The running control plane's files.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub admin_kubeconfig: PathBuf,
    pub agent_kubeconfig: PathBuf,
}

pub fn dir_in(work_dir: &Path) -> PathBuf {
    work_dir.join("control-plane")
}

/// Starts `control-plane serve` in a process group of its own (Ctrl-C is the demo's to
/// handle; `--keep` leaves it running after the demo), and waits until it is ready.
pub fn start(binary: &Path, work_dir: &Path) -> anyhow::Result<Cluster> {
    let dir = dir_in(work_dir);
    let agent_kubeconfig = work_dir.join("agent.kubeconfig");
    let log = work_dir.join("control-plane.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().context("the control plane's log")?;
    let mut command = Command::new(binary);
    command
        .arg("serve")
        .arg("--dir")
        .arg(&dir)
        .args(["--service-cidr", SERVICE_CIDR])
        .arg("--relay")
        .arg(format!("{}={API_IN_NODE}", node_ns()))
        .arg("--agent-kubeconfig")
        .arg(&agent_kubeconfig)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    println!("    $ {}", crate::util::describe(&command));
    let mut child = command.spawn().context("starting control-plane serve")?;
    let started = Instant::now();
    loop {
        check_interrupted()?;
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.lines().any(|l| l.starts_with("READY ")) {
            for line in text.lines() {
                println!("    {line}");
            }
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("the control plane exited ({status}):\n{text}");
        }
        if started.elapsed() > START_TIMEOUT {
            bail!("the control plane was not ready within {START_TIMEOUT:?}:\n{text}");
        }
        pause(Duration::from_millis(200))?;
    }
    Ok(Cluster {
        admin_kubeconfig: dir.join("admin.kubeconfig"),
        agent_kubeconfig,
    })
}

/// Stops the control plane serving `dir` (its owner process, named in state.json) and
/// waits until it is gone; nothing to do when none runs there.
pub fn stop(dir: &Path) -> anyhow::Result<()> {
    let state = dir.join("state.json");
    let Ok(text) = fs::read_to_string(&state) else {
        return Ok(());
    };
    let value: Value =
        serde_yaml::from_str(&text).with_context(|| format!("reading {}", state.display()))?;
    let Some(pid) = value.get("owner_pid").and_then(Value::as_u64) else {
        bail!("{}: no owner_pid", state.display());
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains("control-plane") {
        return Ok(());
    }
    println!("    stopping the control plane (pid {pid})");
    crate::util::run_cmd(Command::new("kill").args(["-TERM", &pid.to_string()]))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Gone, or a zombie of this very process (the demo started it and has not reaped it).
    let running = || {
        fs::read_to_string(proc_dir.join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .is_some_and(|zombie| !zombie)
    };
    while running() {
        if Instant::now() > deadline {
            bail!("the control plane (pid {pid}) did not stop within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

impl Cluster {
    /// `kubectl --kubeconfig ADMIN args`, echoed; its output unless it fails.
    pub fn kubectl(&self, args: &[&str], echo: bool) -> anyhow::Result<String> {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args);
        if echo {
            println!("    $ kubectl {}", args.join(" "));
        }
        let out = command
            .stdin(Stdio::null())
            .output()
            .context("running kubectl (it comes with the machine)")?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Applies the examples, then writes the status no kubelet writes here (the Node's
    /// addresses, each Pod's IP and readiness) through the status subresource.
    pub fn apply_examples(&self, dir: &Path, objects: &[Value]) -> anyhow::Result<()> {
        let dir_arg = dir.display().to_string();
        // kubectl 1.32 warns that it is more than one minor version from the 1.37 server.
        let applied = self.kubectl(&["apply", "-f", &dir_arg], true)?;
        for line in applied.lines() {
            println!("      {line}");
        }
        println!("    the status a kubelet would write (the examples' `status:`):");
        for object in objects {
            let Some(status) = object.get("status") else {
                continue;
            };
            let kind = object
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_lowercase();
            let name = object
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let namespace = object
                .get("metadata")
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str);
            let patch = serde_yaml_to_json(&serde_yaml::Mapping::from_iter([(
                Value::from("status"),
                status.clone(),
            )]))?;
            let mut args = vec!["patch", &kind, name];
            if let Some(ns) = namespace {
                args.extend(["-n", ns]);
            }
            args.extend(["--subresource=status", "--type=merge", "-p", &patch]);
            println!(
                "    $ kubectl patch {kind} {name}{} --subresource=status --type=merge -p '{{\"status\": ...}}'",
                namespace.map(|ns| format!(" -n {ns}")).unwrap_or_default()
            );
            self.kubectl(&args, false)?;
        }
        Ok(())
    }

    /// Waits until the EndpointSlice controller lists every ready pod of `ips` in the
    /// namespace's slices, then shows them.
    pub fn wait_for_slices(&self, namespace: &str, ready_ips: &[String]) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            check_interrupted()?;
            let json = self.kubectl(
                &["get", "endpointslices", "-n", namespace, "-o", "json"],
                false,
            )?;
            let listed: Value = serde_yaml::from_str(&json).context("reading the slices")?;
            let ready: Vec<String> = listed
                .get("items")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .flat_map(|slice| {
                    slice
                        .get("endpoints")
                        .and_then(Value::as_sequence)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter(|e| {
                    e.get("conditions")
                        .and_then(|c| c.get("ready"))
                        .and_then(Value::as_bool)
                        .unwrap_or(true)
                })
                .flat_map(|e| {
                    e.get("addresses")
                        .and_then(Value::as_sequence)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect();
            if ready_ips.iter().all(|ip| ready.contains(ip)) {
                println!(
                    "    the controller wrote the slices after {:.1} s:",
                    started.elapsed().as_secs_f64()
                );
                let table = self.kubectl(&["get", "endpointslices", "-n", namespace], true)?;
                for line in table.lines() {
                    println!("      {line}");
                }
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("after 30 s the slices list {ready:?} as ready, not all of {ready_ips:?}");
            }
            pause(Duration::from_millis(200))?;
        }
    }
}

/// YAML to a JSON text (kubectl's `-p` takes JSON).
fn serde_yaml_to_json(value: &serde_yaml::Mapping) -> anyhow::Result<String> {
    serde_json::to_string(value).context("a status as JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_becomes_a_json_merge_patch() {
        let status: serde_yaml::Mapping = serde_yaml::from_str(
            "status: {phase: Running, podIPs: [{ip: 10.0.0.1}], conditions: [{type: Ready, status: \"True\"}], n: 3}",
        )
        .unwrap();
        assert_eq!(
            serde_yaml_to_json(&status).unwrap(),
            r#"{"status":{"phase":"Running","podIPs":[{"ip":"10.0.0.1"}],"conditions":[{"type":"Ready","status":"True"}],"n":3}}"#
        );
    }
}
