// SPDX-License-Identifier: Apache-2.0
//! The scale run's prober: one connection at a time to one service that is already
//! programmed (connect, a 1-byte request, the same byte back, abortive close), a new one
//! every [`PROBE_INTERVAL`], each bounded by [`PROBE_TIMEOUT`], counting attempts and
//! failures until told to stop. A failure is any attempt the backend did not answer with
//! its byte: a connect refused or unreachable (the socket programs did not translate the
//! ClusterIP), a timeout, a reset, another byte.
//!
//! The timeout is a second, not the milliseconds of the latency prober: that one races
//! programming, this one must not count a prober that two busy cores (the agent syncing
//! 100,000 services) left waiting as a dataplane failure. A SYN lost on the way still
//! fails: its retransmission comes after the second.
//!
//! Runs as `loadgen bench-memory --prober --probe-target ADDR` in the client pod (the
//! node's cgroup, so the socket programs translate its connects). Protocol: `READY` on
//! stdout after the first answered probe (the path works before the measurement starts);
//! when stdin closes, one JSON line, the [`ProbeReport`].

use std::{
    io::{self, BufRead, Write},
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::SockAddr;

use crate::{
    client::LineChild,
    error::{Error, Result},
    latency::prober::monotonic_ns,
    load::one_connection,
    net::BenchNet,
};

/// How often a probe starts (when the previous one took less).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// The bound of one probe: connect, send and receive each.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The report lists the times of this many failures at most (the count has them all).
pub const LISTED_FAILURES: usize = 20;
/// How long the prober may take to get its first answer before the run gives up.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// What the prober saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub attempts: u64,
    pub failures: u64,
    pub first_error: Option<String>,
    /// When the first [`LISTED_FAILURES`] failed probes started (CLOCK_MONOTONIC, ms).
    pub failed_at_ms: Vec<u64>,
    /// The longest time between the starts of two consecutive probes (ms): more than the
    /// interval means the prober was starved or a probe was slow, and a short gap in the
    /// dataplane could have gone unseen.
    pub longest_gap_ms: u64,
}

/// Counts probes into a [`ProbeReport`] (pure).
#[derive(Debug, Default)]
pub struct ProbeTally {
    report: ProbeReport,
    last_start_ms: Option<u64>,
}

impl ProbeTally {
    /// Notes one probe that started at `started_ms` (CLOCK_MONOTONIC) and ended in
    /// `outcome`.
    pub fn record(&mut self, started_ms: u64, outcome: &io::Result<()>) {
        self.report.attempts += 1;
        if let Some(last) = self.last_start_ms {
            let gap = started_ms.saturating_sub(last);
            self.report.longest_gap_ms = self.report.longest_gap_ms.max(gap);
        }
        self.last_start_ms = Some(started_ms);
        if let Err(err) = outcome {
            self.report.failures += 1;
            if self.report.first_error.is_none() {
                self.report.first_error = Some(err.to_string());
            }
            if self.report.failed_at_ms.len() < LISTED_FAILURES {
                self.report.failed_at_ms.push(started_ms);
            }
        }
    }

    pub fn report(&self) -> &ProbeReport {
        &self.report
    }

    pub fn into_report(self) -> ProbeReport {
        self.report
    }
}

fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// Probes `target` until `stop` is set; `on_first_answer` runs once, after the first
/// probe the backend answered.
pub fn probe_until_stopped(
    target: SocketAddr,
    stop: &AtomicBool,
    mut on_first_answer: impl FnMut(),
) -> ProbeReport {
    let target = SockAddr::from(target);
    let mut tally = ProbeTally::default();
    let mut answered = false;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let started = monotonic_ms();
        // Never 0, and changing: a stale or zeroed byte never passes for the answer.
        let byte = u8::try_from(tally.report().attempts % 250).unwrap_or(0) + 1;
        let outcome = one_connection(&target, PROBE_TIMEOUT, byte).map(|_| ());
        if outcome.is_ok() && !answered {
            answered = true;
            on_first_answer();
        }
        tally.record(started, &outcome);
        next += PROBE_INTERVAL;
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else {
            // Late (a slow probe): the next one now, not a burst to catch up.
            next = now;
        }
    }
    tally.into_report()
}

/// The prober process: `READY` after the first answer, the report when stdin closes.
pub fn run_prober(target: SocketAddr) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = Arc::clone(&stop);
    thread::spawn(move || {
        // Nothing is sent on stdin: its end (EOF or an error) is the signal.
        for line in io::stdin().lock().lines() {
            if line.is_err() {
                break;
            }
        }
        stopper.store(true, Ordering::Relaxed);
    });
    let report = probe_until_stopped(target, &stop, || {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "READY").and_then(|()| out.flush());
    });
    let mut out = io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&report)?)?;
    out.flush()
}

/// The prober running in the client pod; killed on drop.
#[derive(Debug)]
pub struct ProberProcess {
    process: LineChild,
}

impl ProberProcess {
    /// Starts the prober against `target` and waits for its first answered probe.
    pub fn start(bench_net: &BenchNet, loadgen: &Path, target: SocketAddr) -> Result<Self> {
        let args = [
            "bench-memory".to_string(),
            "--prober".into(),
            "--probe-target".into(),
            target.to_string(),
        ];
        let process = LineChild::start(
            "scale prober",
            &bench_net.client_place(),
            loadgen,
            &args,
            bench_net.run_dir.join("scale-prober.log"),
            READY_WITHIN,
        )?;
        Ok(ProberProcess { process })
    }

    /// Stops it (the probe in flight ends first) and returns its report.
    pub fn finish(mut self) -> Result<ProbeReport> {
        self.process.close_input();
        let line = self
            .process
            .lines
            .recv_timeout(PROBE_TIMEOUT * 3 + Duration::from_secs(5))
            .map_err(|_| {
                Error::Load(format!(
                    "the scale prober did not report: {}",
                    self.process.log_text()
                ))
            })?;
        Ok(serde_json::from_str(&line)?)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::ErrorKind,
        net::{Ipv4Addr, TcpListener},
    };

    use super::*;
    use crate::load::serve;

    #[test]
    fn a_tally_counts_failures_keeps_the_first_error_and_the_longest_gap() {
        let mut tally = ProbeTally::default();
        tally.record(100, &Ok(()));
        tally.record(105, &Err(io::Error::from(ErrorKind::ConnectionRefused)));
        tally.record(130, &Ok(()));
        tally.record(136, &Err(io::Error::from(ErrorKind::TimedOut)));
        let report = tally.into_report();
        assert_eq!((report.attempts, report.failures), (4, 2));
        assert_eq!(report.failed_at_ms, [105, 136]);
        assert_eq!(report.longest_gap_ms, 25);
        assert!(
            report
                .first_error
                .as_deref()
                .is_some_and(|e| e.contains("refused")),
            "{report:?}"
        );
    }

    #[test]
    fn a_tally_lists_a_bounded_number_of_failures_and_counts_them_all() {
        let mut tally = ProbeTally::default();
        for at in 0..100 {
            tally.record(at, &Err(io::Error::from(ErrorKind::TimedOut)));
        }
        let report = tally.report();
        assert_eq!(report.failures, 100);
        assert_eq!(report.failed_at_ms.len(), LISTED_FAILURES);
        assert_eq!(report.longest_gap_ms, 1);
        assert_eq!(ProbeTally::default().into_report(), ProbeReport::default());
    }

    #[test]
    fn the_report_is_one_json_line_both_ways() {
        let report = ProbeReport {
            attempts: 3,
            failures: 1,
            first_error: Some("Connection refused (os error 111)".into()),
            failed_at_ms: vec![42],
            longest_gap_ms: 7,
        };
        let line = serde_json::to_string(&report).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<ProbeReport>(&line).unwrap(), report);
    }

    /// Against an echo server on loopback: every probe answered, and the first answer
    /// reported once.
    #[test]
    fn probes_an_answering_server_until_stopped() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let target = listener.local_addr().unwrap();
        thread::spawn(move || serve(&listener, Duration::from_secs(1)));
        let stop = AtomicBool::new(false);
        let mut first_answers = 0;
        let report = thread::scope(|scope| {
            scope.spawn(|| {
                thread::sleep(PROBE_INTERVAL * 10);
                stop.store(true, Ordering::Relaxed);
            });
            probe_until_stopped(target, &stop, || first_answers += 1)
        });
        assert!(report.attempts >= 2, "{report:?}");
        assert_eq!(report.failures, 0, "{report:?}");
        assert_eq!(first_answers, 1);
    }

    /// A port nothing listens on refuses every probe: all fail, none answers.
    #[test]
    fn probes_of_a_closed_port_all_fail() {
        let closed = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        let stop = AtomicBool::new(false);
        let mut answered = false;
        let report = thread::scope(|scope| {
            scope.spawn(|| {
                thread::sleep(PROBE_INTERVAL * 4);
                stop.store(true, Ordering::Relaxed);
            });
            probe_until_stopped(closed, &stop, || answered = true)
        });
        assert!(report.attempts >= 1, "{report:?}");
        assert_eq!(report.failures, report.attempts);
        assert!(!answered);
        assert!(report.first_error.is_some());
    }
}
