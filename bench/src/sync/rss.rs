// SPDX-License-Identifier: Apache-2.0
//! Peak memory of a measured step: the growth of this process's peak resident set over
//! its size before the step (the in-process proxiers: what the agent would allocate), and
//! the peak resident set of a child process run and reaped here (the raw tools).
//!
//! `wait4` is the one call that gives a single child's resource usage (std and nix reap
//! without it), hence the unsafe code.
#![allow(unsafe_code)]

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use super::super::error::{Error, Result};

fn status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// A mark of this process's memory before a step.
#[derive(Debug, Clone, Copy)]
pub struct PeakMark {
    rss_kib: u64,
}

impl PeakMark {
    /// Resets the process's peak resident set to its current size (Linux ≥ 4.0:
    /// `clear_refs` 5) and remembers that size.
    pub fn now() -> Self {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        PeakMark {
            rss_kib: status_kib("VmRSS").unwrap_or(0),
        }
    }

    /// How far the peak rose above the mark since (KiB).
    pub fn growth_kib(&self) -> u64 {
        status_kib("VmHWM")
            .unwrap_or(0)
            .saturating_sub(self.rss_kib)
    }
}

/// Runs `program args` with `input` on its stdin, reaps it with wait4 and returns its
/// peak resident set (KiB). Fails when it exits unsuccessfully.
pub fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<u64> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io(format!("starting {program}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(Error::io(format!("writing to {program}")))?;
    }
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut err) = stderr {
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
        }
        text
    });
    let pid = i32::try_from(child.id())
        .map_err(|_| Error::Setup(format!("{program}: pid out of range")))?;
    let mut status = 0i32;
    // SAFETY: rusage is plain data the kernel fills; pid is our own unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = loop {
        // SAFETY: as above; `status` and `usage` outlive the call.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break rc;
    };
    let stderr = reader.join().unwrap_or_default();
    if reaped != pid {
        return Err(Error::Setup(format!(
            "waiting for {program}: {}",
            std::io::Error::last_os_error()
        )));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(Error::Setup(format!(
            "{program} failed (wait status {status}): {}",
            stderr.trim()
        )));
    }
    // The child is reaped: std must not wait for it again (dropping `child` does not).
    drop(child);
    Ok(u64::try_from(usage.ru_maxrss).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_has_a_peak_and_our_growth_shows() {
        let kib = run_with_input("cat", &[], "hello").expect("cat");
        assert!(kib > 0);
        assert!(run_with_input("false", &[], "").is_err());
        let mark = PeakMark::now();
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        assert!(mark.growth_kib() >= 60 << 10, "{}", mark.growth_kib());
    }
}
