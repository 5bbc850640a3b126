// SPDX-License-Identifier: Apache-2.0
//! Network namespaces, cgroups and processes inside them: test scaffolding driven
//! through `ip`, `nsenter` and `sysctl` (the agent itself uses netlink). Its own crate so
//! that the demo (xtask) builds nodes the way the scenario harness and the benchmarks do
//! without depending on the test crate, and so on the agent.

use std::{
    collections::BTreeSet,
    fs,
    net::{IpAddr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use nix::sched::{CloneFlags, setns};
use serde::Deserialize;

/// What went wrong building or using the scaffolding.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("no cgroup2 mount in /proc/mounts")]
    NoCgroup2,
    #[error("entering network namespace {name}: {source}")]
    Setns { name: String, source: nix::Error },
    #[error("{0}")]
    Setup(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let shown = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io(format!("running {shown}")))?;
    if !output.status.success() {
        return Err(Error::Command {
            command: shown,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `ip <args>` inside `ns`.
pub fn ip_in(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    run("ip", &full)
}

pub fn add_netns(name: &str) -> Result<()> {
    run("ip", &["netns", "add", name])?;
    ip_in(name, &["link", "set", "lo", "up"])?;
    Ok(())
}

pub fn delete_netns(name: &str) -> Result<()> {
    run("ip", &["netns", "delete", name]).map(drop)
}

pub fn list_netns() -> Result<Vec<String>> {
    Ok(run("ip", &["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Sets sysctls as seen from inside `ns` (`/proc/sys/net` is per namespace).
pub fn sysctl_in(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let assignments: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let path = format!("--net={}", netns_path(ns).display());
    let mut args = vec![path.as_str(), "--", "sysctl", "-q", "-w"];
    args.extend(assignments.iter().map(String::as_str));
    run("nsenter", &args).map(drop)
}

/// Like [`sysctl_in`], but keys this kernel does not have are skipped (`sysctl -e`).
pub fn sysctl_in_ignoring_unknown(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let assignments: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let path = format!("--net={}", netns_path(ns).display());
    let mut args = vec![path.as_str(), "--", "sysctl", "-q", "-e", "-w"];
    args.extend(assignments.iter().map(String::as_str));
    run("nsenter", &args).map(drop)
}

#[derive(Deserialize)]
struct IpJsonLink {
    #[serde(default)]
    addr_info: Vec<IpJsonAddr>,
}

#[derive(Deserialize)]
struct IpJsonAddr {
    local: Option<IpAddr>,
}

/// Every address configured in `ns`, on any interface.
pub fn addresses_in(ns: &str) -> Result<BTreeSet<IpAddr>> {
    let json = ip_in(ns, &["-j", "addr", "show"])?;
    let links: Vec<IpJsonLink> = serde_json::from_str(&json)?;
    Ok(links
        .into_iter()
        .flat_map(|l| l.addr_info)
        .filter_map(|a| a.local)
        .collect())
}

/// The cgroup2 mount point, from /proc/mounts (hybrid hosts have it at
/// /sys/fs/cgroup/unified, pure v2 hosts at /sys/fs/cgroup).
pub fn cgroup2_root() -> Result<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").map_err(Error::io("reading /proc/mounts"))?;
    cgroup2_root_from(&mounts).ok_or(Error::NoCgroup2)
}

pub fn cgroup2_root_from(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
    })
}

pub fn create_cgroup(path: &Path) -> Result<()> {
    fs::create_dir(path).map_err(Error::io(format!("creating cgroup {}", path.display())))
}

pub fn cgroup_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGKILL to every process in the cgroup (they may take a moment to exit).
pub fn kill_cgroup_processes(path: &Path) {
    for pid in cgroup_pids(path) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Kills whatever still runs in the cgroup, then removes it (retrying while the
/// killed processes finish exiting).
pub fn remove_cgroup(path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let mut last = None;
    for _ in 0..50 {
        kill_cgroup_processes(path);
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(err) => last = Some(err),
        }
        thread::sleep(Duration::from_millis(100));
    }
    Err(Error::Io {
        context: format!("removing cgroup {}", path.display()),
        source: last.unwrap_or_else(|| std::io::Error::other("busy")),
    })
}

/// Where a process runs: a network namespace, and optionally a cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub netns: String,
    pub cgroup: Option<PathBuf>,
}

impl Place {
    /// A command that runs `program args` in this place. The shell moves itself into
    /// the cgroup before exec'ing nsenter, so the program starts inside both. nsenter
    /// (unlike `ip netns exec`) leaves /sys as it is, so bpffs and cgroupfs stay visible.
    pub fn command(&self, program: &Path, args: &[String]) -> Command {
        let netns = format!("--net={}", netns_path(&self.netns).display());
        let mut command = match &self.cgroup {
            Some(cgroup) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(r#"procs="$1"; ns="$2"; shift 2; echo $$ > "$procs" && exec nsenter "$ns" -- "$@""#)
                    .arg("sh")
                    .arg(cgroup.join("cgroup.procs"))
                    .arg(netns);
                c
            }
            None => {
                let mut c = Command::new("nsenter");
                c.arg(netns).arg("--");
                c
            }
        };
        command.arg(program).args(args);
        command
    }
}

/// Runs `f` on a short-lived thread inside `ns`, without moving this process. Sockets
/// `f` creates keep that namespace for life, so this process can use them afterwards
/// (a server for clients in `ns`, or a client there).
pub fn in_netns<T, F>(ns: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let path = netns_path(ns);
    let name = ns.to_string();
    thread::spawn(move || {
        let file =
            fs::File::open(&path).map_err(Error::io(format!("opening {}", path.display())))?;
        setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| Error::Setns {
            name: name.clone(),
            source,
        })?;
        f().map_err(Error::io(format!("inside {name}")))
    })
    .join()
    .map_err(|_| Error::Setup("namespace thread panicked".into()))?
}

/// Binds a TCP listener inside `ns` (see [`in_netns`]).
pub fn bind_tcp_listener_in(ns: &str, addr: SocketAddr) -> Result<TcpListener> {
    in_netns(ns, move || TcpListener::bind(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_hybrid_and_unified_layouts() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(
            cgroup2_root_from(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(
            cgroup2_root_from(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(cgroup2_root_from("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn commands_enter_namespace_and_cgroup() {
        let place = Place {
            netns: "kpt0000-node".into(),
            cgroup: Some("/sys/fs/cgroup/unified/kpt0000-node".into()),
        };
        let cmd = place.command(Path::new("/bin/echo"), &["hi".into()]);
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(cmd.get_program(), "sh");
        assert_eq!(args[3], "/sys/fs/cgroup/unified/kpt0000-node/cgroup.procs");
        assert_eq!(args[4], "--net=/run/netns/kpt0000-node");
        assert_eq!(&args[5..], ["/bin/echo", "hi"]);

        let outside = Place {
            netns: "kpt0000-ext".into(),
            cgroup: None,
        };
        let cmd = outside.command(Path::new("/bin/echo"), &[]);
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(cmd.get_program(), "nsenter");
        assert_eq!(args, ["--net=/run/netns/kpt0000-ext", "--", "/bin/echo"]);
    }
}
