// SPDX-License-Identifier: Apache-2.0
//! One control-plane component as a child process: its own process group, killed by the
//! kernel when the thread that started it dies (`PR_SET_PDEATHSIG`), its output in a log
//! file, and stopped as upstream's components expect (SIGTERM, then SIGKILL after a grace
//! period). Dropping a [`Component`] stops it, so a test that panics leaves no process.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("starting {name} ({program}): {source}")]
    Spawn {
        name: String,
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening the log {path}: {source}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A running component.
pub struct Component {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// How long SIGTERM is given before SIGKILL.
    grace: Duration,
}

impl std::fmt::Debug for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Component")
            .field("name", &self.name)
            .field("pid", &self.pid())
            .field("log", &self.log)
            .finish()
    }
}

impl Component {
    /// Starts `program args` with stdout and stderr appended to `log`.
    ///
    /// The kernel sends SIGKILL to the child when the *thread* that called this exits, so
    /// start components from a thread that lives as long as they should (the main thread,
    /// a test's thread, a runtime's worker), never from a short-lived blocking task.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        grace: Duration,
    ) -> Result<Self, ProcessError> {
        let open = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|source| ProcessError::Log {
                    path: log.to_path_buf(),
                    source,
                })
        };
        let stdout = open()?;
        let stderr = open()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (setpgid, prctl, getppid) and allocates nothing.
        unsafe {
            command.pre_exec(|| {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl: then nobody would kill us.
                if libc::getppid() == 1 {
                    return Err(std::io::Error::other("the parent exited"));
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| ProcessError::Spawn {
            name: name.to_string(),
            program: program.to_path_buf(),
            source,
        })?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            grace,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether it has exited (and with what), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// SIGTERM to its process group, SIGKILL after the grace period; waits for it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let Ok(pid) = i32::try_from(child.id()) else {
            let _ = child.kill();
            let _ = child.wait();
            return;
        };
        let group = Pid::from_raw(pid);
        if child.try_wait().ok().flatten().is_none() {
            let _ = killpg(group, Signal::SIGTERM);
            let deadline = Instant::now() + self.grace;
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Whatever the component left in its group goes too.
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait();
    }

    /// Stops it at once (SIGKILL to its group), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a file (empty when it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_component_leaves_no_process() {
        let dir = std::env::temp_dir().join(format!("testbed-proc-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let component = Component::start(
            "sleep",
            Path::new("/bin/sh"),
            &["-c".into(), "echo started; sleep 600 & wait".into()],
            &log,
            Duration::from_millis(200),
        )
        .unwrap();
        let pid = component.pid().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tail(&log, 1).contains("started") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The shell's own child (sleep) is in its group. A killed process that this
        // machine's init has not reaped yet (a zombie) no longer runs.
        let running = |p: i32| {
            fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(')')
                        .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
                })
                .unwrap_or(false)
        };
        let group_members = || {
            fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|p| {
                    nix::unistd::getpgid(Some(Pid::from_raw(*p))).ok()
                        == Some(Pid::from_raw(pid as i32))
                })
                .filter(|p| running(*p))
                .count()
        };
        assert!(group_members() >= 2, "the shell and its sleep");
        drop(component);
        assert_eq!(group_members(), 0, "nothing of the group is left running");
        fs::remove_dir_all(&dir).unwrap();
    }
}
