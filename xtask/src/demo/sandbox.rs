// SPDX-License-Identifier: Apache-2.0
//! The demo's sandbox: a node network namespace with an uplink to an "outside" namespace,
//! one namespace per pod (routed veths, Calico-style), a cgroup of its own under the cgroup2
//! root, and the processes running there. Everything carries the `kpdemo` prefix and is
//! removed by [`Sandbox::teardown`], which also runs on drop (errors, Ctrl-C). The host's
//! interfaces, cgroups and processes are never touched. Namespaces, cgroups and the
//! commands that run inside them come from the `netns-scaffold` crate, as for the scenario harness.

use std::{
    fs,
    net::Ipv4Addr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use netns_scaffold::{
    self as netns, self, Place, add_netns, cgroup2_root, kill_cgroup_processes, remove_cgroup,
    sysctl_in,
};

use super::examples::Pod;

/// Every name the demo creates starts with this.
pub const PREFIX: &str = "kpdemo";
/// The router on the outside of the node's uplink.
const ROUTER: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
/// The pods' gateway, answered by proxy ARP on the node's side of each veth.
const POD_GATEWAY: &str = "169.254.1.1";

pub fn node_ns() -> String {
    format!("{PREFIX}-node")
}

fn outside_ns() -> String {
    format!("{PREFIX}-outside")
}

pub fn pod_ns(pod: &Pod) -> String {
    format!("{PREFIX}-{}", pod.name)
}

pub fn bpffs_root() -> PathBuf {
    Path::new("/sys/fs/bpf").join(PREFIX)
}

pub fn work_dir() -> PathBuf {
    std::env::temp_dir().join(PREFIX)
}

fn ip_in(ns: &str, args: &[&str]) -> anyhow::Result<()> {
    netns::ip_in(ns, args)?;
    Ok(())
}

/// Our namespaces that exist now.
fn our_namespaces() -> Vec<String> {
    netns::list_netns()
        .unwrap_or_default()
        .into_iter()
        .filter(|name| name.starts_with(&format!("{PREFIX}-")))
        .collect()
}

/// Where a process runs: the network namespace `netns`, inside the demo's cgroup (see
/// [`Place::command`]). Its own process group keeps the terminal's Ctrl-C away from it:
/// the demo stops it, in order, itself.
pub fn command_in(netns: &str, cgroup: Option<&Path>, program: &Path, args: &[&str]) -> Command {
    let place = Place {
        netns: netns.to_string(),
        cgroup: cgroup.map(Path::to_path_buf),
    };
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    let mut command = place.command(program, &args);
    command.process_group(0);
    command
}

/// SIGTERM, then SIGKILL after `grace`.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = netns::run("kill", &["-TERM", &child.id().to_string()]);
        let deadline = Instant::now() + grace;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[derive(Debug)]
pub struct Sandbox {
    pub cgroup: PathBuf,
    /// The agent binary, for `--cleanup` at teardown.
    agent_binary: PathBuf,
    namespaces: Vec<String>,
    cgroup_created: bool,
    backends: Vec<(String, Child)>,
    pub agent: Option<Child>,
    torn_down: bool,
}

impl Sandbox {
    /// Removes what an earlier, killed (or kept: `always`) demo left behind. Refuses when a
    /// demo still runs.
    pub fn remove_leftovers(agent_binary: &Path, always: bool) -> anyhow::Result<()> {
        let pid_file = work_dir().join("demo.pid");
        if let Ok(pid) = fs::read_to_string(&pid_file) {
            let pid = pid.trim();
            // A live process of that pid that is a demo too (pids get reused).
            let running = fs::read(Path::new("/proc").join(pid).join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("demo"));
            if running && pid != std::process::id().to_string() {
                bail!("another demo (pid {pid}) is running; it removes its sandbox when it ends");
            }
        }
        let cgroup = cgroup2_root()?.join(PREFIX);
        let leftovers = !our_namespaces().is_empty()
            || cgroup.exists()
            || bpffs_root().exists()
            || work_dir().exists();
        if leftovers {
            if !always {
                println!("    removing what an interrupted or kept demo left behind");
            }
            let mut stale = Sandbox {
                cgroup,
                agent_binary: agent_binary.to_path_buf(),
                namespaces: our_namespaces(),
                cgroup_created: true,
                backends: Vec::new(),
                agent: None,
                torn_down: false,
            };
            stale.teardown()?;
        } else if always {
            println!("    nothing to remove");
        }
        Ok(())
    }

    /// Leaves everything running: the sandbox is not torn down when dropped, and its
    /// processes (the agent, the backends) outlive the demo.
    pub fn keep(mut self) {
        self.torn_down = true;
        self.agent = None;
        self.backends.clear();
    }

    /// The node namespace (uplink to an outside namespace, node address, default route)
    /// and the demo's cgroup.
    pub fn create(agent_binary: &Path, node_address: Ipv4Addr) -> anyhow::Result<Self> {
        fs::create_dir_all(work_dir()).context("creating the work directory")?;
        fs::write(work_dir().join("demo.pid"), std::process::id().to_string())
            .context("writing demo.pid")?;
        let mut sandbox = Sandbox {
            cgroup: cgroup2_root()?.join(PREFIX),
            agent_binary: agent_binary.to_path_buf(),
            namespaces: Vec::new(),
            cgroup_created: false,
            backends: Vec::new(),
            agent: None,
            torn_down: false,
        };
        netns::create_cgroup(&sandbox.cgroup)?;
        sandbox.cgroup_created = true;

        let (node, outside) = (node_ns(), outside_ns());
        for ns in [&node, &outside] {
            add_netns(ns)?;
            sandbox.namespaces.push(ns.clone());
        }
        // Forwarding on: the kernel answers proxy ARP (the pods' gateway) only then.
        sysctl_in(
            &node,
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ],
        )?;
        // The outside only answers ARP for the router: what the node sends there
        // untranslated goes nowhere.
        sysctl_in(&outside, &[("net.ipv4.ip_forward", "0")])?;
        ip_in(
            &node,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &outside,
            ],
        )?;
        ip_in(
            &node,
            &["addr", "add", &format!("{node_address}/24"), "dev", "eth0"],
        )?;
        ip_in(
            &outside,
            &["addr", "add", &format!("{ROUTER}/24"), "dev", "eth0"],
        )?;
        ip_in(&node, &["link", "set", "eth0", "up"])?;
        ip_in(&outside, &["link", "set", "eth0", "up"])?;
        ip_in(
            &node,
            &[
                "route",
                "add",
                "default",
                "via",
                &ROUTER.to_string(),
                "dev",
                "eth0",
            ],
        )?;
        Ok(sandbox)
    }

    /// A pod namespace behind a routed veth (`kpdemo<index>` on the node's side).
    pub fn add_pod(&mut self, index: usize, pod: &Pod) -> anyhow::Result<()> {
        let (node, ns) = (node_ns(), pod_ns(pod));
        add_netns(&ns)?;
        self.namespaces.push(ns.clone());
        let host_if = format!("{PREFIX}{index}");
        ip_in(
            &node,
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        ip_in(
            &ns,
            &["addr", "add", &format!("{}/32", pod.address), "dev", "eth0"],
        )?;
        ip_in(&ns, &["link", "set", "eth0", "up"])?;
        ip_in(
            &ns,
            &["route", "add", POD_GATEWAY, "dev", "eth0", "scope", "link"],
        )?;
        ip_in(
            &ns,
            &["route", "add", "default", "via", POD_GATEWAY, "dev", "eth0"],
        )?;
        ip_in(&node, &["link", "set", &host_if, "up"])?;
        ip_in(
            &node,
            &[
                "route",
                "add",
                &format!("{}/32", pod.address),
                "dev",
                &host_if,
            ],
        )?;
        // proxy_delay defaults to a random wait of up to 0.8 s per proxied ARP reply.
        let proxy_arp = format!("net.ipv4.conf.{host_if}.proxy_arp");
        let proxy_delay = format!("net.ipv4.neigh.{host_if}.proxy_delay");
        sysctl_in(&node, &[(&proxy_arp, "1"), (&proxy_delay, "0")])?;
        Ok(())
    }

    /// Starts the pod's backend (this very binary, `demo-backend`) in its namespace.
    pub fn start_backend(&mut self, pod: &Pod) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("locating the xtask binary")?;
        let listen: Vec<String> = super::examples::Examples::listen_addresses(pod)
            .iter()
            .map(ToString::to_string)
            .collect();
        let mut args = vec!["demo-backend", "--name", &pod.name];
        for addr in &listen {
            args.extend(["--listen", addr.as_str()]);
        }
        let child = command_in(&pod_ns(pod), Some(&self.cgroup), &exe, &args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the backend of {}", pod.name))?;
        self.backends.push((pod.name.clone(), child));
        Ok(())
    }

    /// Whether a backend has exited (it failed to bind, typically).
    pub fn exited_backend(&mut self) -> Option<String> {
        self.backends
            .iter_mut()
            .find_map(|(name, child)| (!matches!(child.try_wait(), Ok(None))).then_some(name))
            .cloned()
    }

    /// Stops the agent and the backends, removes the agent's pins (its own `--cleanup`),
    /// the cgroup, the namespaces and the work directory; then checks nothing is left.
    pub fn teardown(&mut self) -> anyhow::Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let mut problems = Vec::new();
        if let Some(mut agent) = self.agent.take() {
            println!("    stopping the agent (SIGTERM)");
            stop_child(&mut agent, Duration::from_secs(5));
        }
        // Whatever else runs there: the backends, or an interrupted demo's agent.
        kill_cgroup_processes(&self.cgroup);
        for (_, mut backend) in self.backends.drain(..) {
            stop_child(&mut backend, Duration::ZERO);
        }
        let root = bpffs_root();
        if root.exists() {
            println!("    proxy-agent --cleanup --bpffs-root {}", root.display());
            let node = node_ns();
            let cleanup = if self.namespaces.contains(&node) && self.agent_binary.exists() {
                let mut cmd = command_in(
                    &node,
                    None,
                    &self.agent_binary,
                    &["--cleanup", "--bpffs-root", &root.display().to_string()],
                );
                cmd.stdin(Stdio::null())
                    .output()
                    .map_err(anyhow::Error::from)
                    .and_then(|out| {
                        if out.status.success() {
                            Ok(())
                        } else {
                            bail!("{}", String::from_utf8_lossy(&out.stderr).trim())
                        }
                    })
            } else {
                Ok(())
            };
            if let Err(e) = cleanup {
                problems.push(format!("proxy-agent --cleanup: {e:#}"));
            }
            // What --cleanup leaves (the directories themselves) goes too.
            if let Err(e) = fs::remove_dir_all(&root)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                problems.push(format!("removing {}: {e}", root.display()));
            }
        }
        if self.cgroup_created {
            println!("    removing cgroup {}", self.cgroup.display());
            if let Err(e) = remove_cgroup(&self.cgroup) {
                problems.push(format!("{e:#}"));
            }
        }
        if !self.namespaces.is_empty() {
            println!(
                "    removing network namespaces {}",
                self.namespaces.join(" ")
            );
        }
        // Pods first: deleting the node namespace then finds no veth peer left to destroy.
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = netns::delete_netns(&ns) {
                problems.push(format!("{e:#}"));
            }
        }
        if let Err(e) = fs::remove_dir_all(work_dir())
            && e.kind() != std::io::ErrorKind::NotFound
        {
            problems.push(format!("removing {}: {e}", work_dir().display()));
        }

        let mut left: Vec<String> = our_namespaces();
        left.extend(
            [self.cgroup.clone(), bpffs_root(), work_dir()]
                .into_iter()
                .filter(|p| p.exists())
                .map(|p| p.display().to_string()),
        );
        if !left.is_empty() {
            problems.push(format!("still present: {}", left.join(" ")));
        }
        if problems.is_empty() {
            println!("    nothing left behind");
            Ok(())
        } else {
            bail!("cleanup incomplete:\n  {}", problems.join("\n  "))
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.torn_down {
            println!("==> removing the sandbox");
            if let Err(e) = self.teardown() {
                eprintln!("{e:#}");
            }
        }
    }
}
