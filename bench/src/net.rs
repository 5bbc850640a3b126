// SPDX-License-Identifier: Apache-2.0
//! The benchmark's namespaces: a node namespace (where the agent runs) routing between a
//! client pod and a server pod, each behind a veth pair, and the node's cgroup, which
//! holds the agent, the client and the server, so the socket programs the agent attaches
//! there see the client's connect(). Nothing touches the machine's own network.
//!
//! ```text
//!   client ns                 node ns (agent)                 server ns
//!   eth0 10.244.0.2/24 <-> cli0 10.244.0.1/24 | srv0 10.244.1.1/24 <-> eth0 10.244.1.2/24
//! ```
//!
//! Every name starts with `kpb<pid>n<seq>`, so leftovers of a run that died can be told
//! from those of a live one ([`cleanup_stale`]).

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use ::tests::scenario::{
    netns::{self, Place, add_netns, ip_in, sysctl_in},
    topology::ReadyProcesses,
};

use super::error::{Error, Result};

pub const PREFIX: &str = "kpb";
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 2);
pub const CLIENT_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
pub const SERVER_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);

/// A fresh run id for this process: `kpb<pid>n<seq>`.
pub fn new_run_id() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{PREFIX}{}n{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pid in one of our names (`kpb1234n0-node` -> 1234).
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    let seq: String = after
        .strip_prefix('n')?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let tail = &after[1 + seq.len()..];
    if seq.is_empty() || !(tail.is_empty() || tail.starts_with('-')) {
        return None;
    }
    digits.parse().ok()
}

/// Where a run keeps its files (manifests, configuration, logs).
pub fn runs_dir() -> PathBuf {
    std::env::temp_dir().join("kube-proxy-bench")
}

/// The bpffs directory of a run's agent.
pub fn bpffs_root(id: &str) -> PathBuf {
    Path::new("/sys/fs/bpf").join(id)
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn names_in(dir: &Path) -> Vec<(String, PathBuf)> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect()
}

/// Fails unless every one of `binaries` is built.
pub fn check_built(binaries: &[&Path]) -> Result<()> {
    match binaries.iter().find(|b| !b.is_file()) {
        Some(missing) => Err(Error::Setup(format!("{} is not built", missing.display()))),
        None => Ok(()),
    }
}

/// The service counts of a run, ascending and each once; fails without a rep or with a
/// count of 0.
pub fn service_counts(counts: &[u32], reps: u32) -> Result<Vec<u32>> {
    let mut counts = counts.to_vec();
    counts.sort_unstable();
    counts.dedup();
    if counts.first().is_none_or(|n| *n == 0) || reps == 0 {
        return Err(Error::Setup(
            "need at least one rep and service counts >= 1".into(),
        ));
    }
    Ok(counts)
}

/// Writes `text` to `path` through a temporary file, so the agent never reads half.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).map_err(Error::io(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, path).map_err(Error::io(format!("renaming to {}", path.display())))
}

/// Removes what benchmark runs whose process is gone left behind (after a SIGKILL);
/// returns a line per thing removed.
pub fn cleanup_stale() -> Result<Vec<String>> {
    let stale = |name: &str| owner_pid(name).is_some_and(|pid| !alive(pid));
    let mut removed = Vec::new();
    for (name, path) in names_in(&bpffs_root("")) {
        if stale(&name) {
            // Only the pins: a host-side cleanup of other modes would touch this machine.
            let _ = proxy_agent::proxier::ebpf::unpin_all(&path);
            let _ = fs::remove_dir_all(&path);
            removed.push(format!("pins {}", path.display()));
        }
    }
    for (name, path) in names_in(&netns::cgroup2_root()?) {
        if stale(&name) && path.is_dir() {
            netns::remove_cgroup(&path)?;
            removed.push(format!("cgroup {}", path.display()));
        }
    }
    for name in netns::list_netns()? {
        if stale(&name) {
            netns::delete_netns(&name)?;
            removed.push(format!("netns {name}"));
        }
    }
    for (name, path) in names_in(&runs_dir()) {
        if stale(&name) {
            let _ = fs::remove_dir_all(&path);
            removed.push(format!("run dir {}", path.display()));
        }
    }
    Ok(removed)
}

/// The namespaces, cgroup and run directory of one benchmark run; removed on drop.
#[derive(Debug)]
pub struct BenchNet {
    pub id: String,
    pub node_ns: String,
    pub client_ns: String,
    pub server_ns: String,
    pub cgroup: PathBuf,
    pub run_dir: PathBuf,
    namespaces: Vec<String>,
    cgroup_created: bool,
    processes: ReadyProcesses,
    cleaned: bool,
}

impl BenchNet {
    /// Starts the echo server (`loadgen serve`, pinned to `cpu` if given) on the backend's
    /// address in the server namespace and waits until it is ready.
    pub fn start_backend(&mut self, loadgen: &Path, cpu: Option<usize>) -> Result<()> {
        let backend = std::net::SocketAddr::from((SERVER_IP, super::manifests::BACKEND_PORT));
        let mut args = vec!["serve".to_string(), "--listen".into(), backend.to_string()];
        if let Some(cpu) = cpu {
            args.extend(["--cpu".into(), cpu.to_string()]);
        }
        let place = self.server_place();
        self.spawn_ready("server", &place, loadgen, &args)
    }

    /// The run's manifest directory for the agent's `--source`, holding the measured
    /// service (whose one endpoint is the echo server).
    pub fn measured_manifests(&self) -> Result<PathBuf> {
        let dir = self.run_dir.join("manifests");
        fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        write_atomically(
            &dir.join("measured.json"),
            &super::manifests::measured_service(SERVER_IP),
        )?;
        Ok(dir)
    }

    /// Creates everything; on error, what was created is removed.
    pub fn build(id: &str) -> Result<Self> {
        let cgroup = netns::cgroup2_root()?.join(format!("{id}-node"));
        let run_dir = runs_dir().join(id);
        let processes = ReadyProcesses::new(&run_dir);
        let mut net = BenchNet {
            id: id.to_string(),
            node_ns: format!("{id}-node"),
            client_ns: format!("{id}-cli"),
            server_ns: format!("{id}-srv"),
            cgroup,
            run_dir,
            namespaces: Vec::new(),
            cgroup_created: false,
            processes,
            cleaned: false,
        };
        fs::create_dir_all(&net.run_dir)
            .map_err(Error::io(format!("creating {}", net.run_dir.display())))?;
        netns::create_cgroup(&net.cgroup)?;
        net.cgroup_created = true;
        net.build_network()?;
        net.wait_links_up()?;
        Ok(net)
    }

    fn build_network(&mut self) -> Result<()> {
        for ns in [&self.node_ns, &self.client_ns, &self.server_ns] {
            add_netns(ns)?;
            self.namespaces.push(ns.clone());
        }
        sysctl_in(
            &self.node_ns,
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ],
        )?;
        // Room for fast port reuse; abortive closes leave no TIME_WAIT, this is headroom.
        sysctl_in(
            &self.client_ns,
            &[("net.ipv4.ip_local_port_range", "1024 65535")],
        )?;
        let node = self.node_ns.clone();
        for (ns, node_if, ip, gateway) in [
            (self.client_ns.clone(), "cli0", CLIENT_IP, CLIENT_GATEWAY),
            (self.server_ns.clone(), "srv0", SERVER_IP, SERVER_GATEWAY),
        ] {
            ip_in(
                &node,
                &[
                    "link", "add", node_if, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
            ip_in(
                &node,
                &["addr", "add", &format!("{gateway}/24"), "dev", node_if],
            )?;
            ip_in(&ns, &["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            ip_in(&node, &["link", "set", node_if, "up"])?;
            ip_in(&ns, &["link", "set", "eth0", "up"])?;
            ip_in(
                &ns,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    &gateway.to_string(),
                    "dev",
                    "eth0",
                ],
            )?;
        }
        Ok(())
    }

    /// Until the kernel has processed a new veth's carrier, the device drops what is sent
    /// (the first connection would lose its SYN).
    fn wait_links_up(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        for ns in &self.namespaces {
            loop {
                let out = ip_in(ns, &["-o", "link", "show"])?;
                let pending = out
                    .lines()
                    .filter(|l| l.contains('@'))
                    .any(|l| !l.contains("state UP"));
                if !pending {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Error::Setup(format!(
                        "links in {ns} did not come up: {out}"
                    )));
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// More addresses on the server pod's interface (more backends in the one pod).
    pub fn add_server_addresses(&self, addresses: &[Ipv4Addr]) -> Result<()> {
        for ip in addresses.iter().filter(|ip| **ip != SERVER_IP) {
            ip_in(
                &self.server_ns,
                &["addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )?;
        }
        Ok(())
    }

    pub fn node_place(&self) -> Place {
        Place {
            netns: self.node_ns.clone(),
            cgroup: Some(self.cgroup.clone()),
        }
    }

    /// The client pod: its own namespace, the node's cgroup.
    pub fn client_place(&self) -> Place {
        Place {
            netns: self.client_ns.clone(),
            cgroup: Some(self.cgroup.clone()),
        }
    }

    pub fn server_place(&self) -> Place {
        Place {
            netns: self.server_ns.clone(),
            cgroup: Some(self.cgroup.clone()),
        }
    }

    /// Starts a long-running helper in `place` and waits for its `READY` line; it is
    /// killed at cleanup.
    pub fn spawn_ready(
        &mut self,
        name: &str,
        place: &Place,
        exe: &Path,
        args: &[String],
    ) -> Result<()> {
        self.processes.spawn_ready(name, place, exe, args)?;
        Ok(())
    }

    /// Removes everything; safe to call twice. Errors are printed, not returned: this runs
    /// from `Drop` too, and one failure must not stop the rest.
    pub fn cleanup(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        self.processes.kill_all();
        if self.cgroup_created
            && let Err(err) = netns::remove_cgroup(&self.cgroup)
        {
            eprintln!("cleanup: {err}");
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(err) = netns::delete_netns(ns) {
                eprintln!("cleanup: {err}");
            }
        }
        if self.run_dir.exists()
            && let Err(err) = fs::remove_dir_all(&self.run_dir)
        {
            eprintln!("cleanup: removing {}: {err}", self.run_dir.display());
        }
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Every namespace, cgroup, pin directory and run directory named after `id` that exists
/// right now (empty after a clean run).
pub fn leftovers(id: &str) -> Result<Vec<String>> {
    let ours = |name: &str| name == id || name.starts_with(&format!("{id}-"));
    let mut found: Vec<String> = netns::list_netns()?
        .into_iter()
        .filter(|n| ours(n))
        .map(|n| format!("netns {n}"))
        .collect();
    for dir in [netns::cgroup2_root()?, bpffs_root(""), runs_dir()] {
        for (name, path) in names_in(&dir) {
            if ours(&name) {
                found.push(path.display().to_string());
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_name_their_process() {
        let id = new_run_id();
        assert_eq!(owner_pid(&id), Some(std::process::id()));
        assert_eq!(owner_pid(&format!("{id}-node")), Some(std::process::id()));
        assert_ne!(new_run_id(), id);
        assert_eq!(owner_pid("kpb42n0-srv"), Some(42));
        assert_eq!(owner_pid("kpb42n17"), Some(42));
        assert_eq!(owner_pid("kpb42"), None);
        assert_eq!(owner_pid("kpb42n"), None);
        assert_eq!(owner_pid("kpb42n1x"), None);
        assert_eq!(owner_pid("kpt3fa2-node"), None);
        assert_eq!(owner_pid("other"), None);
    }
}
