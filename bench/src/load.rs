// SPDX-License-Identifier: Apache-2.0
//! The load generator: a closed-loop client that opens one connection at a time
//! (connect, 1-byte request, 1-byte reply, close) and times each connect(), and the
//! server that answers it. Both are single-threaded and can be pinned to a CPU, so a
//! run measures the path's latency and per-connection cost rather than scheduling.
//!
//! With several targets, one client process alternates between them in short slices, in
//! ABBA order (A B B A A B ...): every target sees the same machine, and a drift of the
//! machine within the run (another tenant, frequency, a busy neighbour) falls on all of them
//! alike instead of on whichever ran last.
//!
//! The client closes abortively (SO_LINGER 0): neither side keeps a TIME_WAIT socket, so
//! the client's ephemeral ports never run out at tens of thousands of connections per
//! second and no port search grows with the run. The close is the same on every path
//! measured, and the socket programs do not act on it.

use std::{
    fs,
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{
    error::{Error, Result},
    stats::percentile,
};

/// What one client run does.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Measured one after another in slices, each for `duration` in all.
    pub targets: Vec<SocketAddr>,
    /// The measured time per target.
    pub duration: Duration,
    /// Length of one slice of the alternation.
    pub slice: Duration,
    /// Connections made (and not recorded) before the measured time starts, spread over
    /// the targets.
    pub warmup: Duration,
    /// A target's measured time also ends after this many connections.
    pub max_connections: u64,
    /// The run stops after this many failed connections to one target.
    pub max_errors: u64,
    /// Read and write timeout of each connection.
    pub io_timeout: Duration,
    /// Per target (empty: none): the cgroup v2 directory this process moves into before
    /// each of the target's slices, so that its sockets are created there (the socket
    /// programs attached to a cgroup act on the sockets created in it).
    pub cgroups: Vec<Option<PathBuf>>,
}

impl ClientOptions {
    pub fn new(targets: Vec<SocketAddr>, duration: Duration) -> Self {
        ClientOptions {
            targets,
            duration,
            slice: Duration::from_millis(100),
            warmup: Duration::from_millis(300),
            max_connections: 20_000_000,
            max_errors: 1000,
            io_timeout: Duration::from_secs(2),
            cgroups: Vec::new(),
        }
    }
}

/// The target of slice `index` among `targets` targets: forward in even rounds, backward
/// in odd ones (A B | B A | A B ... for two).
pub fn slice_target(index: usize, targets: usize) -> usize {
    let (round, pos) = (index / targets, index % targets);
    if round.is_multiple_of(2) {
        pos
    } else {
        targets - 1 - pos
    }
}

/// The result for one target of a client run; `loadgen client` prints a JSON array of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientReport {
    pub target: SocketAddr,
    /// Completed connections in the measured time.
    pub connections: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Length of the target's measured time (the sum of its slices).
    pub seconds: f64,
    /// Completed connections per second.
    pub rate: f64,
    pub connect_p50_us: f64,
    pub connect_p99_us: f64,
    pub connect_mean_us: f64,
}

/// One connection; returns how long connect() took.
pub(crate) fn one_connection(
    target: &SockAddr,
    io_timeout: Duration,
    byte: u8,
) -> io::Result<Duration> {
    let domain = if target.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    // A blocking connect() gives up after the send timeout (Linux): a path that drops SYNs
    // costs `io_timeout` per attempt, not the kernel's two minutes of retransmissions.
    socket.set_write_timeout(Some(io_timeout))?;
    let started = Instant::now();
    socket.connect(target)?;
    let connect_time = started.elapsed();
    socket.set_linger(Some(Duration::ZERO))?;
    socket.set_tcp_nodelay(true)?;
    let mut stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    stream.write_all(&[byte])?;
    let mut reply = [0u8; 1];
    stream.read_exact(&mut reply)?;
    if reply[0] != byte {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reply {} to request {byte}", reply[0]),
        ));
    }
    Ok(connect_time)
}

/// What one target has seen so far.
struct Tally {
    latencies_ns: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
    measured: Duration,
}

impl Tally {
    fn new() -> Self {
        Tally {
            // Room for a long run up front: no reallocation inside the measured loop.
            latencies_ns: Vec::with_capacity(1 << 20),
            errors: 0,
            first_error: None,
            measured: Duration::ZERO,
        }
    }

    fn note_error(&mut self, err: io::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(err.to_string());
        }
    }
}

/// Moves this process into the cgroup of target `which`, when it has one and the process
/// is elsewhere (`current`: where it was moved last).
fn enter_cgroup(opts: &ClientOptions, which: usize, current: &mut Option<usize>) -> io::Result<()> {
    let Some(Some(dir)) = opts.cgroups.get(which) else {
        return Ok(());
    };
    let same = current
        .and_then(|c| opts.cgroups.get(c).cloned().flatten())
        .is_some_and(|c| &c == dir);
    if !same {
        fs::write(dir.join("cgroup.procs"), std::process::id().to_string())?;
    }
    *current = Some(which);
    Ok(())
}

/// Runs the client: a warm-up, then slices alternating between the targets until each
/// has had its measured time. One report per target, in the order given.
pub fn run_client(opts: &ClientOptions) -> Vec<ClientReport> {
    let targets: Vec<SockAddr> = opts.targets.iter().copied().map(SockAddr::from).collect();
    let n = targets.len();
    if n == 0 {
        return Vec::new();
    }
    let mut byte = 0u8;
    let mut cgroup = None;

    let per_target = opts.warmup / u32::try_from(n).unwrap_or(u32::MAX);
    for (which, target) in targets.iter().enumerate() {
        if enter_cgroup(opts, which, &mut cgroup).is_err() {
            continue;
        }
        let end = Instant::now() + per_target;
        let mut errors = 0;
        while Instant::now() < end && errors < opts.max_errors {
            byte = byte.wrapping_add(1);
            if one_connection(target, opts.io_timeout, byte).is_err() {
                errors += 1;
            }
        }
    }

    let mut tallies: Vec<Tally> = (0..n).map(|_| Tally::new()).collect();
    let slice = opts.slice.max(Duration::from_millis(1));
    let mut index = 0usize;
    loop {
        let which = slice_target(index, n);
        index += 1;
        let tally = &mut tallies[which];
        let remaining = opts.duration.saturating_sub(tally.measured);
        let open = remaining > Duration::ZERO
            && (tally.latencies_ns.len() as u64) < opts.max_connections
            && tally.errors < opts.max_errors;
        if open && let Err(err) = enter_cgroup(opts, which, &mut cgroup) {
            // Measured elsewhere the slice would count for the wrong target.
            tally.note_error(err);
            tally.measured += slice;
        } else if open {
            let started = Instant::now();
            let end = started + remaining.min(slice);
            while Instant::now() < end
                && (tally.latencies_ns.len() as u64) < opts.max_connections
                && tally.errors < opts.max_errors
            {
                byte = byte.wrapping_add(1);
                match one_connection(&targets[which], opts.io_timeout, byte) {
                    Ok(took) => tally
                        .latencies_ns
                        .push(u32::try_from(took.as_nanos()).unwrap_or(u32::MAX)),
                    Err(err) => tally.note_error(err),
                }
            }
            tally.measured += started.elapsed();
        }
        let all_done = tallies.iter().all(|t| {
            t.measured >= opts.duration
                || (t.latencies_ns.len() as u64) >= opts.max_connections
                || t.errors >= opts.max_errors
        });
        if all_done {
            break;
        }
    }
    opts.targets
        .iter()
        .zip(tallies)
        .map(|(target, t)| {
            summarize(
                *target,
                t.latencies_ns,
                t.errors,
                t.first_error,
                t.measured.as_secs_f64(),
            )
        })
        .collect()
}

/// The report of a run from its connect() times.
pub fn summarize(
    target: SocketAddr,
    mut latencies_ns: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
) -> ClientReport {
    latencies_ns.sort_unstable();
    let us = |ns: Option<u32>| ns.map_or(0.0, |ns| f64::from(ns) / 1000.0);
    let connections = latencies_ns.len() as u64;
    let mean_us = if latencies_ns.is_empty() {
        0.0
    } else {
        latencies_ns.iter().map(|&n| f64::from(n)).sum::<f64>() / latencies_ns.len() as f64 / 1000.0
    };
    ClientReport {
        target,
        connections,
        errors,
        first_error,
        seconds,
        rate: if seconds > 0.0 {
            connections as f64 / seconds
        } else {
            0.0
        },
        connect_p50_us: us(percentile(&latencies_ns, 50.0)),
        connect_p99_us: us(percentile(&latencies_ns, 99.0)),
        connect_mean_us: mean_us,
    }
}

/// Answers connections one at a time until the listener fails: reads one byte, writes it
/// back, closes.
pub fn serve(listener: &TcpListener, io_timeout: Duration) -> io::Result<()> {
    loop {
        let (mut stream, _) = match listener.accept() {
            Ok(accepted) => accepted,
            // A connection reset before accept() is the client's business, not ours.
            Err(err) if err.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(err) => return Err(err),
        };
        let _ = stream.set_read_timeout(Some(io_timeout));
        let _ = stream.set_write_timeout(Some(io_timeout));
        let _ = stream.set_nodelay(true);
        let mut request = [0u8; 1];
        if stream.read_exact(&mut request).is_ok() {
            let _ = stream.write_all(&request);
        }
    }
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..nix::sched::CpuSet::count())
        .filter(|cpu| set.is_set(*cpu).unwrap_or(false))
        .collect()
}

/// Pins the calling thread (and the threads it starts later) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)
        .map_err(|source| Error::Affinity { cpu, source })?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|source| Error::Affinity { cpu, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_and_server_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(&listener, Duration::from_secs(2)));
        // The same server under two names: both targets get their own report and time.
        let other = SocketAddr::from(([127, 0, 0, 2], addr.port()));
        let listener_v2 = TcpListener::bind(other).unwrap();
        std::thread::spawn(move || serve(&listener_v2, Duration::from_secs(2)));
        let mut opts = ClientOptions::new(vec![addr, other], Duration::from_millis(200));
        opts.warmup = Duration::from_millis(20);
        opts.slice = Duration::from_millis(20);
        let reports = run_client(&opts);
        assert_eq!(reports.len(), 2);
        for (report, target) in reports.iter().zip([addr, other]) {
            assert_eq!(report.target, target);
            assert_eq!(report.errors, 0, "{:?}", report.first_error);
            assert!(report.connections > 10, "{report:?}");
            assert!(report.connect_p50_us > 0.0);
            assert!(report.connect_p50_us <= report.connect_p99_us);
            assert!((report.rate - report.connections as f64 / report.seconds).abs() < 1e-6);
            // Measured for its share, not for the whole run.
            assert!(report.seconds >= 0.2 && report.seconds < 0.3, "{report:?}");
        }
    }

    #[test]
    fn slices_alternate_abba() {
        let order: Vec<usize> = (0..8).map(|i| slice_target(i, 2)).collect();
        assert_eq!(order, [0, 1, 1, 0, 0, 1, 1, 0]);
        let three: Vec<usize> = (0..6).map(|i| slice_target(i, 3)).collect();
        assert_eq!(three, [0, 1, 2, 2, 1, 0]);
        assert_eq!(slice_target(5, 1), 0);
    }

    #[test]
    fn client_counts_refused_connections_and_stops() {
        // A port nobody listens on: bind, learn the port, close.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut opts = ClientOptions::new(vec![addr], Duration::from_secs(5));
        opts.warmup = Duration::ZERO;
        opts.max_errors = 5;
        let report = run_client(&opts).remove(0);
        assert_eq!(report.connections, 0);
        assert_eq!(report.errors, 5);
        assert!(report.seconds < 5.0);
        assert!(report.first_error.is_some());
    }

    #[test]
    fn summary_of_known_latencies() {
        let addr: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let lat: Vec<u32> = (1..=100).rev().map(|n| n * 1000).collect();
        let report = summarize(addr, lat, 2, Some("x".into()), 2.0);
        assert_eq!(report.connections, 100);
        assert_eq!(report.rate, 50.0);
        assert_eq!(report.connect_p50_us, 50.0);
        assert_eq!(report.connect_p99_us, 99.0);
        assert_eq!(report.connect_mean_us, 50.5);
        let empty = summarize(addr, Vec::new(), 0, None, 1.0);
        assert_eq!((empty.rate, empty.connect_p99_us), (0.0, 0.0));
    }

    #[test]
    fn pinning_to_an_allowed_cpu() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let cpu = cpus[cpus.len() - 1];
        // In a thread of its own, so the test harness's threads keep their CPUs.
        std::thread::spawn(move || {
            pin_to_cpu(cpu).unwrap();
            assert_eq!(allowed_cpus(), vec![cpu]);
        })
        .join()
        .unwrap();
    }
}
