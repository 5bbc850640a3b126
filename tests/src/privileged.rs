// SPDX-License-Identifier: Apache-2.0
//! Helpers for tests that need root: skipping when unprivileged, temporary cgroups and
//! bpffs directories that clean up after themselves, and running commands inside a cgroup.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// Whether the test process may do privileged things (root).
pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Returns early from a test, with a message, when not running as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::privileged::is_root() {
            eprintln!(
                "SKIP {}: needs root (run `cargo xtask test` as root)",
                module_path!()
            );
            return;
        }
    };
}

/// The cgroup v2 mount point.
pub fn cgroup2_root() -> PathBuf {
    proxy_agent::proxier::ebpf::detect_cgroup2_root()
        .expect("a cgroup v2 mount (the test machines have one)")
}

/// A child cgroup of the v2 root, removed (after killing its processes) on drop.
pub struct TempCgroup {
    pub path: PathBuf,
}

impl TempCgroup {
    pub fn new(name: &str) -> Self {
        let path = cgroup2_root().join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&path).expect("creating a test cgroup");
        Self { path }
    }

    /// Runs `sh -c script` with the shell moved into this cgroup first.
    pub fn run_sh(&self, script: &str) -> Output {
        let procs = self.path.join("cgroup.procs");
        Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {} && {script}", procs.display()))
            .output()
            .expect("running sh")
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for _ in 0..50 {
            if fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A bpffs directory for one test's pins, removed (unpinning everything) on drop.
pub struct TempBpffs {
    pub path: PathBuf,
}

impl TempBpffs {
    pub fn new(name: &str) -> Self {
        let path = Path::new("/sys/fs/bpf").join(format!("{name}-{}", std::process::id()));
        let _ = proxy_agent::proxier::ebpf::unpin_all(&path);
        Self { path }
    }
}

impl Drop for TempBpffs {
    fn drop(&mut self) {
        let _ = proxy_agent::proxier::ebpf::unpin_all(&self.path);
    }
}

/// What a test loads the dataplane with: pins under `bpffs`, socket programs on `cgroup`,
/// the default map sizes, no device and no XDP.
pub fn load_options(
    bpffs: &TempBpffs,
    cgroup: &TempCgroup,
) -> proxy_agent::proxier::ebpf::LoadOptions {
    proxy_agent::proxier::ebpf::LoadOptions {
        bpffs_root: bpffs.path.clone(),
        cgroup: cgroup.path.clone(),
        map_sizes: proxy_agent::proxier::ebpf::MapSizes::default(),
        devices: Vec::new(),
        xdp: proxy_agent::config::XdpMode::Off,
        maglev_table_size: proxy_common::maglev::DEFAULT_TABLE_SIZE,
        pod_egress: false,
    }
}

/// A network namespace with only `lo` (up), deleted on drop. Keeps test traffic off the
/// machine's real network: nothing in it routes anywhere but loopback.
pub struct TempNetns {
    pub name: String,
}

impl TempNetns {
    pub fn new(name: &str) -> Self {
        let name = format!("{name}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip netns add {name}");
        let ns = Self { name };
        ns.sh("ip link set lo up");
        ns
    }

    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs `f` on a thread that lives in the namespace (what looks at the calling
    /// thread's namespace: netlink, the programs' devices, FIB lookups), passing a panic
    /// on as it was.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
        std::thread::scope(|scope| {
            let handle = scope.spawn(move || {
                let file = std::fs::File::open(&path).expect("opening the namespace");
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                f()
            });
            match handle.join() {
                Ok(value) => value,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Runs `sh -c script` inside the namespace (outside any test cgroup).
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .arg(format!("--net={}", self.path().display()))
            .args(["--", "sh", "-c", script])
            .output()
            .expect("running nsenter")
    }

    /// Runs `sh -c script` inside the namespace and inside `cgroup`.
    pub fn sh_in_cgroup(&self, cgroup: &TempCgroup, script: &str) -> Output {
        cgroup.run_sh(&format!(
            "exec nsenter --net={} -- sh -c '{}'",
            self.path().display(),
            script.replace('\'', "'\\''")
        ))
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs the agent in a network namespace of its own (`unshare --net`: its servers bind
/// there and nothing it might touch is the host's) with `args`, a source directory holding
/// `node_yaml`, and `path` as its PATH when given, and waits up to `limit` for it to exit
/// (it is killed and the test fails otherwise). Returns its exit status and its stdout and
/// stderr, in that order. For start-up refusals (`--strict-mode`).
pub fn run_agent_to_exit(
    agent: &Path,
    args: &[&str],
    node_yaml: &str,
    path: Option<&std::ffi::OsStr>,
    limit: std::time::Duration,
) -> (std::process::ExitStatus, String) {
    use std::io::Read as _;
    use std::process::Stdio;
    use std::time::Instant;

    let source = std::env::temp_dir().join(format!(
        "kpe-agent-exit-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let _ = fs::remove_dir_all(&source);
    fs::create_dir_all(&source).expect("creating the source directory");
    fs::write(source.join("node.yaml"), node_yaml).expect("writing the Node");
    let mut command = Command::new("unshare");
    command
        .arg("--net")
        .arg("--")
        .arg(agent)
        .args(args)
        .arg("--source")
        .arg(&source)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(path) = path {
        command.env("PATH", path);
    }
    let mut child = command.spawn().expect("starting the agent under unshare");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the agent") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = fs::remove_dir_all(&source);
            panic!("the agent still runs after {limit:?}: it was expected to exit");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut output = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut output);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut output);
    }
    let _ = fs::remove_dir_all(&source);
    (status, output)
}
