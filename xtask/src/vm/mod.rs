// SPDX-License-Identifier: Apache-2.0
//! A throw-away qemu guest with a kernel that has IPVS (../shared/ipvs-vm.md, recipe A):
//! Debian's linux-image-amd64 under TCG (the /dev/kvm here cannot run a stock kernel), the
//! host's `/` read-only over 9p with a tmpfs overlay, one read-write results directory
//! shared at its host path, no network device. A bash script runs as root inside; its exit
//! status comes back. Used by `cargo xtask vm`, `cargo xtask scenarios` and the guest tests
//! in tests/tests/.

pub mod initramfs;

use std::{
    fmt, fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub use initramfs::Kernel;

/// Everything a boot needs on the host, found.
#[derive(Debug, Clone)]
pub struct Prerequisites {
    pub qemu: PathBuf,
    pub kernel: Kernel,
    pub busybox: PathBuf,
}

fn on_path(tool: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// What is there to boot the guest, or the plain reason it cannot boot here.
pub fn prerequisites() -> Result<Prerequisites, String> {
    let qemu = on_path("qemu-system-x86_64").ok_or(
        "qemu-system-x86_64 is not installed (apt package qemu-system-x86; `cargo xtask setup`)",
    )?;
    for (tool, package) in [("modprobe", "kmod"), ("cpio", "cpio")] {
        if on_path(tool).is_none() {
            return Err(format!(
                "{tool} is not installed (apt package {package}; `cargo xtask setup`)"
            ));
        }
    }
    let kernel = initramfs::find_kernel(
        std::env::var_os("KPE_VM_KERNEL")
            .map(PathBuf::from)
            .as_deref(),
    )?;
    let busybox = initramfs::find_busybox()?;
    Ok(Prerequisites {
        qemu,
        kernel,
        busybox,
    })
}

/// Whether the running (host) kernel has IPVS: loaded, built in, or available as a module.
/// Read from /proc and /lib/modules only; nothing is loaded.
pub fn host_kernel_has_ipvs() -> bool {
    if Path::new("/proc/net/ip_vs").exists() {
        return true;
    }
    let Ok(release) = fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let dir = Path::new("/lib/modules").join(release.trim());
    ["modules.builtin", "modules.dep"].iter().any(|index| {
        fs::read_to_string(dir.join(index)).is_ok_and(|text| {
            text.lines()
                .filter_map(|l| l.split(':').next())
                .any(|path| {
                    path.rsplit('/')
                        .next()
                        .is_some_and(|f| f.starts_with("ip_vs.ko"))
                })
        })
    })
}

/// How to boot.
#[derive(Debug, Clone)]
pub struct VmOptions {
    /// Read-write directory shared with the guest at the same path (results come back
    /// here); a temporary one when unset.
    pub out_dir: Option<PathBuf>,
    /// The script's working directory inside the guest (the host's file tree).
    pub cwd: PathBuf,
    /// The guest is killed after this long.
    pub timeout: Duration,
    pub cpus: u32,
    pub memory_mib: u32,
    /// Copy the guest's console (the script's stdout and stderr) to our stdout as it comes.
    pub echo_console: bool,
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            out_dir: None,
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            timeout: Duration::from_secs(600),
            cpus: 2,
            memory_mib: 2048,
            echo_console: true,
        }
    }
}

/// A guest that ran the script to its end.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// The script's exit status.
    pub status: i32,
    /// Everything the guest printed on its console (the script's stdout and stderr).
    pub console: String,
    /// From starting qemu until it exited.
    pub elapsed: Duration,
}

/// Why a script did not run to its end.
#[derive(Debug)]
pub enum VmError {
    /// This host cannot boot the guest (qemu, kernel or busybox-static missing).
    Unavailable(String),
    /// Preparing the boot failed (initramfs, shared directory).
    Setup(String),
    /// The guest stopped before the script finished (kernel panic, qemu error, power-off).
    Died { console_tail: String },
    /// The guest was killed after the timeout.
    TimedOut {
        after: Duration,
        console_tail: String,
    },
}

impl fmt::Display for VmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmError::Unavailable(why) => write!(f, "the test VM cannot boot here: {why}"),
            VmError::Setup(why) => write!(f, "preparing the test VM: {why}"),
            VmError::Died { console_tail } => write!(
                f,
                "the guest died before the command finished; last console lines:\n{console_tail}"
            ),
            VmError::TimedOut {
                after,
                console_tail,
            } => write!(
                f,
                "the guest was killed after {after:?} (timeout); last console lines:\n{console_tail}"
            ),
        }
    }
}

impl std::error::Error for VmError {}

/// `words` as one POSIX shell command line (each word single-quoted when it needs it).
pub fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Where the guest mounts a file system of its own over the host's tree (init.sh: fresh
/// proc, sysfs, devtmpfs, and tmpfs on /run and /tmp): the host's files below these are
/// not visible inside. (The results directory is shared explicitly, so it may be there.)
pub const GUEST_PRIVATE_MOUNTS: [&str; 5] = ["/tmp", "/run", "/dev", "/proc", "/sys"];

/// The guest mount that hides `path` (absolute, symlinks resolved) from the guest, if any.
pub fn hidden_in_guest(path: &Path) -> Option<&'static str> {
    GUEST_PRIVATE_MOUNTS
        .iter()
        .copied()
        .find(|mount| path.starts_with(mount))
}

/// `Ok` when the guest sees the host's `path` (`what` names it in the error): checked
/// before booting, since a path the guest cannot see fails only inside it, after minutes.
pub fn check_visible_in_guest(what: &str, path: &Path) -> Result<(), String> {
    let resolved = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    match hidden_in_guest(&resolved) {
        None => Ok(()),
        Some(mount) => Err(format!(
            "{what} {} is under {mount}, which the test VM mounts afresh (the guest has its \
             own {mount}), so the guest cannot see it; use a checkout, and a CARGO_TARGET_DIR, \
             outside {}",
            resolved.display(),
            GUEST_PRIVATE_MOUNTS.join(", ")
        )),
    }
}

/// Paths end up on the kernel command line and in qemu's `-fsdev` option: no whitespace,
/// quotes or commas.
fn check_path(what: &str, path: &Path) -> Result<String, VmError> {
    let text = path.to_str().unwrap_or_default();
    if text.is_empty()
        || !path.is_absolute()
        || text
            .chars()
            .any(|c| c.is_whitespace() || "'\",\\".contains(c))
    {
        return Err(VmError::Setup(format!(
            "{what} {} must be an absolute path without whitespace, quotes or commas",
            path.display()
        )));
    }
    Ok(text.to_string())
}

fn unique_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Boots the guest, runs `script` (bash) as root inside it and powers it off.
pub fn run_script(script: &str, options: &VmOptions) -> Result<VmOutcome, VmError> {
    let pre = prerequisites().map_err(VmError::Unavailable)?;
    let initrd = initramfs::initramfs(&pre.kernel, &pre.busybox)
        .map_err(|e| VmError::Setup(format!("building the initramfs: {e:#}")))?;

    let token = unique_token();
    let (out_dir, temporary) = match &options.out_dir {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("kpe-vm-{token}")), true),
    };
    fs::create_dir_all(&out_dir)
        .map_err(|e| VmError::Setup(format!("creating {}: {e}", out_dir.display())))?;
    let out_dir = out_dir
        .canonicalize()
        .map_err(|e| VmError::Setup(format!("{}: {e}", out_dir.display())))?;
    let result = boot(&pre, &initrd, script, options, &out_dir, &token);
    let _ = fs::remove_file(out_dir.join(format!(".kpevm-{token}.sh")));
    let _ = fs::remove_file(out_dir.join(format!(".kpevm-{token}.rc")));
    if temporary {
        let _ = fs::remove_dir_all(&out_dir);
    }
    result
}

fn boot(
    pre: &Prerequisites,
    initrd: &Path,
    script: &str,
    options: &VmOptions,
    out_dir: &Path,
    token: &str,
) -> Result<VmOutcome, VmError> {
    let out = check_path("the results directory", out_dir)?;
    let cwd = check_path("the working directory", &options.cwd)?;
    check_visible_in_guest("the working directory", &options.cwd).map_err(VmError::Setup)?;
    let script_path = out_dir.join(format!(".kpevm-{token}.sh"));
    let rc_path = out_dir.join(format!(".kpevm-{token}.rc"));
    fs::write(&script_path, script)
        .map_err(|e| VmError::Setup(format!("writing {}: {e}", script_path.display())))?;
    let _ = fs::remove_file(&rc_path);

    let mut qemu = Command::new(&pre.qemu);
    qemu.args(["-accel", "tcg,thread=multi", "-machine", "q35", "-cpu", "max"])
        .args(["-smp", &options.cpus.to_string()])
        .args(["-m", &format!("{}M", options.memory_mib)])
        .args(["-nodefaults", "-no-reboot", "-display", "none"])
        .args(["-serial", "stdio", "-monitor", "none"])
        .arg("-kernel")
        .arg(&pre.kernel.image)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off rcupdate.rcu_expedited=1 kpevm.out={out} kpevm.cwd={cwd} kpevm.token={token}"
        ))
        .args([
            "-fsdev",
            "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device",
            "virtio-9p-pci,fsdev=root,mount_tag=hostroot",
            "-fsdev",
            &format!("local,id=out,path={out},security_model=none,multidevs=remap"),
            "-device",
            "virtio-9p-pci,fsdev=out,mount_tag=out",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    let started = Instant::now();
    let mut child = qemu
        .spawn()
        .map_err(|e| VmError::Setup(format!("starting {}: {e}", pre.qemu.display())))?;
    let stdout = child.stdout.take();
    let echo = options.echo_console;
    let console_reader = thread::spawn(move || {
        let mut console = String::new();
        let Some(stdout) = stdout else {
            return console;
        };
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            let text = String::from_utf8_lossy(&line)
                .trim_end_matches(['\n', '\r'])
                .to_string();
            line.clear();
            // The power-off that ends every run is not news.
            if text.ends_with("] sysrq: Power Off") || text.ends_with("] reboot: Power down") {
                continue;
            }
            if echo {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
            console.push_str(&text);
            console.push('\n');
        }
        console
    });
    let stderr = child.stderr.take();
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut stderr) = stderr {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    });

    let deadline = started + options.timeout;
    let timed_out = loop {
        match child.try_wait() {
            Ok(Some(_)) => break false,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break true;
            }
            Ok(None) => thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(VmError::Setup(format!("waiting for qemu: {e}")));
            }
        }
    };
    let elapsed = started.elapsed();
    let console = console_reader.join().unwrap_or_default();
    let qemu_errors = stderr_reader.join().unwrap_or_default();
    let tail = || {
        let lines: Vec<&str> = console.lines().chain(qemu_errors.lines()).collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    if timed_out {
        return Err(VmError::TimedOut {
            after: options.timeout,
            console_tail: tail(),
        });
    }
    let status = fs::read_to_string(&rc_path)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    match status {
        Some(status) => Ok(VmOutcome {
            status,
            console,
            elapsed,
        }),
        None => Err(VmError::Died {
            console_tail: tail(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell() {
        let words: Vec<String> = ["ipvsadm", "-Ln", "a b", "it's", "", "x=1,y"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            shell_words(&words),
            r#"ipvsadm -Ln 'a b' 'it'\''s' '' x=1,y"#
        );
    }

    #[test]
    fn paths_under_the_guests_own_mounts_are_not_visible_there() {
        for (path, mount) in [
            (
                "/tmp/runner-check/target/debug/scenario-runner",
                Some("/tmp"),
            ),
            ("/tmp", Some("/tmp")),
            ("/run/user/0/x", Some("/run")),
            ("/dev/shm/x", Some("/dev")),
            ("/tmpfoo/x", None),
            ("/work/main/target/debug/scenario-runner", None),
            ("/var/tmp/x", None),
        ] {
            assert_eq!(hidden_in_guest(Path::new(path)), mount, "{path}");
        }
        let err = check_visible_in_guest("the scenario runner", Path::new("/tmp/nope/runner"))
            .unwrap_err();
        assert!(
            err.starts_with(
                "the scenario runner /tmp/nope/runner is under /tmp, which the test VM mounts \
                 afresh"
            ),
            "{err}"
        );
        assert!(check_visible_in_guest("x", Path::new("/work/main")).is_ok());
    }

    #[test]
    fn paths_for_the_kernel_command_line_are_checked() {
        assert!(check_path("x", Path::new("/work/out")).is_ok());
        for bad in ["relative", "/a b", "/a,b", "/it's"] {
            assert!(check_path("x", Path::new(bad)).is_err(), "{bad}");
        }
    }
}
