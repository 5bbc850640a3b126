// SPDX-License-Identifier: Apache-2.0
//! Running one `loadgen` client process in a namespace: bounded in time, killed on a
//! signal or when late, its JSON report parsed, and the hypervisor's steal on the watched
//! CPUs recorded while it ran. And [`LineChild`]: a helper process that runs alongside
//! a measurement, talking in lines (the probers).

use std::{
    fs,
    io::{BufRead, BufReader, Read as _, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use serde::de::DeserializeOwned;

use ::tests::scenario::netns::Place;

use super::{
    cpustat,
    error::{Error, Result},
    load::ClientReport,
    signals,
};

/// A run stops rather than report numbers when more than this share of connections fail.
pub const MAX_ERROR_SHARE: f64 = 0.001;

/// One `loadgen client` run from `place` against `target` (pinned to `cpu` when given):
/// its report, or an error when it made no connection or more than [`MAX_ERROR_SHARE`]
/// of its connections failed.
pub fn connection_run(
    place: &Place,
    loadgen: &Path,
    target: std::net::SocketAddr,
    duration: Duration,
    warmup: Duration,
    cpu: Option<usize>,
) -> Result<ClientReport> {
    let mut args = vec![
        "client".to_string(),
        "--target".into(),
        target.to_string(),
        "--seconds".into(),
        duration.as_secs_f64().to_string(),
        "--warmup-ms".into(),
        warmup.as_millis().to_string(),
    ];
    if let Some(cpu) = cpu {
        args.extend(["--cpu".into(), cpu.to_string()]);
    }
    let limit = duration + warmup + Duration::from_secs(20);
    let (reports, _): (Vec<ClientReport>, _) = run_json(place, loadgen, &args, limit, &[])?;
    let report = reports
        .into_iter()
        .next()
        .ok_or_else(|| Error::Load("the client reported nothing".into()))?;
    let attempts = report.connections + report.errors;
    if report.connections == 0 || report.errors as f64 > MAX_ERROR_SHARE * attempts as f64 {
        return Err(Error::Load(format!(
            "{target}: {} of {attempts} connections failed (first: {})",
            report.errors,
            report.first_error.as_deref().unwrap_or("none"),
        )));
    }
    Ok(report)
}

/// Runs `exe args` in `place`, waits at most `limit`, and parses its stdout as JSON. Also
/// returns the steal share of `watched_cpus` (all CPUs when empty) over the run.
pub fn run_json<T: DeserializeOwned>(
    place: &Place,
    exe: &Path,
    args: &[String],
    limit: Duration,
    watched_cpus: &[usize],
) -> Result<(T, Option<f64>)> {
    signals::check()?;
    let cpu_before = cpustat::read(watched_cpus);
    let mut child = place
        .command(exe, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io("starting the client"))?;
    // Read both pipes on threads: a chatty child must never block on a full pipe.
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_reader = thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = stdout {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let err_reader = thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = stderr {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(Error::io("waiting for the client"))?
        {
            break status;
        }
        if let Err(err) = signals::check() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Load(format!(
                "the client did not finish within {limit:?}"
            )));
        }
        thread::sleep(Duration::from_millis(20));
    };
    let steal = match (cpu_before, cpustat::read(watched_cpus)) {
        (Some(before), Some(after)) => cpustat::steal_percent(before, after),
        _ => None,
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    signals::check()?;
    if !status.success() {
        return Err(Error::Load(format!(
            "the client failed ({status}): {}",
            stderr.trim()
        )));
    }
    Ok((serde_json::from_str(stdout.trim())?, steal))
}

/// A helper process in a namespace that talks in lines: commands on its stdin, reports
/// on its stdout (read on a thread, so it never blocks on a full pipe), its stderr into a
/// log file. It is killed on drop.
#[derive(Debug)]
pub struct LineChild {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Its stdout, a line at a time.
    pub lines: Receiver<String>,
    log: PathBuf,
}

impl LineChild {
    /// Starts `exe args` in `place` and waits up to `ready_within` for its first line,
    /// which must be `READY`.
    pub fn start(
        name: &str,
        place: &Place,
        exe: &Path,
        args: &[String],
        log: PathBuf,
        ready_within: Duration,
    ) -> Result<Self> {
        let stderr =
            fs::File::create(&log).map_err(Error::io(format!("creating {}", log.display())))?;
        let mut child = place
            .command(exe, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(Error::io(format!("starting the {name}")))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut started = LineChild {
            name: name.to_string(),
            child,
            stdin,
            lines,
            log,
        };
        match started.lines.recv_timeout(ready_within) {
            Ok(line) if line == "READY" => Ok(started),
            other => {
                started.kill();
                Err(Error::Load(format!(
                    "the {name} did not start ({other:?}): {}",
                    started.log_text()
                )))
            }
        }
    }

    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::Load(format!("the {}'s input is closed", self.name)))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(Error::io(format!("writing to the {}", self.name)))
    }

    /// Closes its input: the end of the commands.
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// What it wrote to its stderr so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        self.kill();
    }
}
