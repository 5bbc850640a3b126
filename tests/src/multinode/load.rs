// SPDX-License-Identifier: Apache-2.0
//! Traffic that a migration must not disturb (the `load` subcommand of the scenario
//! runner, run as a client inside a pod, a node or the external namespace):
//!
//! - **new connections**, one after the other at a steady pace: connect, one line each
//!   way, close; each must succeed within [`LoadSpec::timeout`];
//! - **long-lived TCP connections**, opened at start and kept: each exchanges one line
//!   per tick and is broken the first time a line goes unanswered or the socket errs;
//!   every answer must come from the backend its first answer came from;
//! - **a UDP flow**: one numbered datagram per tick from one socket (one 5-tuple for the
//!   whole run); a datagram whose answer never arrives is lost.
//!
//! The process runs until its stdin closes, then prints one [`LoadReport`] as JSON.
//! Every answer comes from a session echo server (`session/<proto>/<ip:port>`), whose
//! line names the backend and the source address it saw.

use std::{
    collections::BTreeSet,
    io::{self, BufRead, BufReader, Write},
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

use crate::scenario::{echo::REFLECT, outcome::Attempt};

#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The clients' source address (0.0.0.0: the kernel's choice).
    pub from: IpAddr,
    /// Where new connections go (TCP, a session echo server behind it).
    pub new_to: Option<SocketAddr>,
    /// Where the long-lived connections go.
    pub long_to: Option<SocketAddr>,
    pub long_count: usize,
    /// Where the UDP flow goes (a UDP echo server behind it).
    pub udp_to: Option<SocketAddr>,
    /// Between two new connections, two lines of a long-lived one, two datagrams.
    pub tick: Duration,
    /// For a connect, an answer, a datagram's answer.
    pub timeout: Duration,
}

/// One failure, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Since the load started.
    pub at_ms: u64,
    pub what: String,
}

/// What the load saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    pub new_attempted: u64,
    pub new_failed: u64,
    pub long_opened: u64,
    pub long_kept: u64,
    pub long_broken: u64,
    /// Long-lived connections whose answers came from more than one backend.
    pub long_moved: u64,
    pub udp_sent: u64,
    pub udp_lost: u64,
    /// The longest time without any UDP answer, while datagrams were sent.
    pub udp_longest_gap_ms: u64,
    /// The backends that answered, and the sources they saw (`backend saw source`).
    pub seen: BTreeSet<String>,
    /// The first failures of each kind (at most 20 in all).
    pub failures: Vec<Failure>,
    /// How long the load ran.
    pub ran_ms: u64,
}

impl LoadReport {
    /// Whether nothing failed, broke, moved or was lost (and something was tried).
    pub fn clean(&self) -> bool {
        self.new_failed == 0
            && self.long_broken == 0
            && self.long_moved == 0
            && self.udp_lost == 0
            && (self.new_attempted > 0 || self.long_opened > 0 || self.udp_sent > 0)
    }

    /// One line for logs and notes.
    pub fn summary(&self) -> String {
        format!(
            "new connections {} attempted / {} failed; long-lived {} kept / {} broken / {} \
             moved; UDP {} sent / {} lost (longest gap {} ms); {} ms",
            self.new_attempted,
            self.new_failed,
            self.long_kept,
            self.long_broken,
            self.long_moved,
            self.udp_sent,
            self.udp_lost,
            self.udp_longest_gap_ms,
            self.ran_ms
        )
    }
}

/// Shared by the load's threads.
struct Shared {
    start: Instant,
    stop: AtomicBool,
    report: Mutex<LoadReport>,
}

impl Shared {
    fn millis(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn with<T>(&self, f: impl FnOnce(&mut LoadReport) -> T) -> T {
        let mut report = match self.report.lock() {
            Ok(report) => report,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut report)
    }

    fn fail(&self, what: String) {
        let at_ms = self.millis();
        self.with(|r| {
            if r.failures.len() < 20 {
                r.failures.push(Failure { at_ms, what });
            }
        });
    }

    fn saw(&self, line: &str) {
        let attempt = Attempt::answered(line, 0);
        if let (Some(backend), Some(source)) = (attempt.backend, attempt.seen_source) {
            self.with(|r| r.seen.insert(format!("{backend} saw {source}")));
        }
    }
}

/// Runs the load: opens the long-lived connections, starts the rest, then calls
/// `until_stopped` (which says the load is ready and blocks until it should end), stops
/// and reports.
pub fn run(spec: &LoadSpec, until_stopped: impl FnOnce()) -> LoadReport {
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        report: Mutex::new(LoadReport::default()),
    });
    let mut threads = Vec::new();
    let (opened_tx, opened) = std::sync::mpsc::channel();
    if let Some(to) = spec.long_to {
        for index in 0..spec.long_count {
            let (shared, spec, opened_tx) = (shared.clone(), spec.clone(), opened_tx.clone());
            threads.push(thread::spawn(move || {
                long_lived(&spec, to, index, &shared, &opened_tx);
            }));
        }
    }
    drop(opened_tx);
    // Every long-lived connection is open (or failed to open) before the load is ready;
    // each thread says so once (and a thread that died early drops its sender).
    let expected = if spec.long_to.is_some() {
        spec.long_count
    } else {
        0
    };
    for _ in 0..expected {
        if opened.recv().is_err() {
            break;
        }
    }
    if let Some(to) = spec.new_to {
        let (shared, spec) = (shared.clone(), spec.clone());
        threads.push(thread::spawn(move || new_connections(&spec, to, &shared)));
    }
    if let Some(to) = spec.udp_to {
        let (shared, spec) = (shared.clone(), spec.clone());
        threads.push(thread::spawn(move || udp_flow(&spec, to, &shared)));
    }
    until_stopped();
    shared.stop.store(true, Ordering::SeqCst);
    for thread in threads {
        if thread.join().is_err() {
            shared.fail("a load thread panicked".into());
        }
    }
    let ran_ms = shared.millis();
    shared.with(|r| {
        r.ran_ms = ran_ms;
        r.clone()
    })
}

fn connect(spec: &LoadSpec, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SocketAddr::new(spec.from, 0).into())?;
    socket.connect_timeout(&to.into(), spec.timeout)?;
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(spec.timeout))?;
    stream.set_write_timeout(Some(spec.timeout))?;
    // The client must see the address it dialled, whatever the proxy did.
    let peer = stream.peer_addr()?;
    if peer != to {
        return Err(io::Error::other(format!(
            "connected to {to}, peer is {peer}"
        )));
    }
    Ok(stream)
}

/// Sends one line and reads the one-line answer.
fn exchange(reader: &mut BufReader<TcpStream>, line: &str) -> io::Result<String> {
    reader.get_mut().write_all(line.as_bytes())?;
    let mut answer = String::new();
    if reader.read_line(&mut answer)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed by the other end",
        ));
    }
    Ok(answer.trim().to_string())
}

fn backend_of(answer: &str) -> Option<SocketAddr> {
    Attempt::answered(answer, 0).backend
}

fn new_connections(spec: &LoadSpec, to: SocketAddr, shared: &Shared) {
    let mut n = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        let begun = Instant::now();
        n += 1;
        let outcome = connect(spec, to).and_then(|stream| {
            let mut reader = BufReader::new(stream);
            let answer = exchange(&mut reader, &format!("NEW {n}\n"))?;
            backend_of(&answer)
                .map(|_| answer.clone())
                .ok_or_else(|| io::Error::other(format!("not an echo answer: {answer:?}")))
        });
        shared.with(|r| r.new_attempted += 1);
        match outcome {
            Ok(answer) => shared.saw(&answer),
            Err(err) => {
                shared.with(|r| r.new_failed += 1);
                shared.fail(format!("new connection {n} to {to}: {err}"));
            }
        }
        thread::sleep(spec.tick.saturating_sub(begun.elapsed()));
    }
}

fn long_lived(
    spec: &LoadSpec,
    to: SocketAddr,
    index: usize,
    shared: &Shared,
    opened: &std::sync::mpsc::Sender<()>,
) {
    let stream = connect(spec, to);
    let _ = opened.send(());
    let stream = match stream {
        Ok(stream) => stream,
        Err(err) => {
            shared.with(|r| {
                r.long_opened += 1;
                r.long_broken += 1;
            });
            shared.fail(format!(
                "long-lived connection {index} to {to}: opening: {err}"
            ));
            return;
        }
    };
    shared.with(|r| r.long_opened += 1);
    // Named in a failure: which flow of the node's conntrack (ours or netfilter's) it was.
    let local = stream
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let mut reader = BufReader::new(stream);
    let mut first_backend = None;
    let mut moved = false;
    let mut line = 0u64;
    let broken = loop {
        if shared.stop.load(Ordering::SeqCst) {
            break None;
        }
        line += 1;
        match exchange(&mut reader, &format!("LONG {index} {line}\n")) {
            Ok(answer) => {
                let backend = backend_of(&answer);
                if line == 1 {
                    shared.saw(&answer);
                    first_backend = backend;
                } else if backend != first_backend && !moved {
                    moved = true;
                    shared.fail(format!(
                        "long-lived connection {index}: answer {line} from {backend:?}, the \
                         first from {first_backend:?}"
                    ));
                }
            }
            Err(err) => break Some(err),
        }
        thread::sleep(spec.tick);
    };
    let _ = reader.get_mut().shutdown(std::net::Shutdown::Both);
    match broken {
        Some(err) => {
            shared.with(|r| r.long_broken += 1);
            shared.fail(format!(
                "long-lived connection {index} from {local} to {to} (backend {first_backend:?}): \
                 line {line}: {err}"
            ));
        }
        None => shared.with(|r| {
            r.long_kept += 1;
            r.long_moved += u64::from(moved);
        }),
    }
}

/// The sequence number a datagram answer carries after the echo line and [`REFLECT`].
fn sequence_of(answer: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(answer);
    let (_, rest) = text.split_once(std::str::from_utf8(REFLECT).ok()?)?;
    rest.trim().strip_prefix("SEQ ")?.trim().parse().ok()
}

fn udp_flow(spec: &LoadSpec, to: SocketAddr, shared: &Shared) {
    let socket = (|| {
        let socket = UdpSocket::bind(SocketAddr::new(spec.from, 0))?;
        socket.connect(to)?;
        socket.set_read_timeout(Some(Duration::from_millis(20)))?;
        Ok::<_, io::Error>(socket)
    })();
    let socket = match socket {
        Ok(socket) => socket,
        Err(err) => {
            shared.fail(format!("UDP flow to {to}: {err}"));
            return;
        }
    };
    let mut answered = BTreeSet::new();
    let mut sent = 0u64;
    let mut last_answer = Instant::now();
    let mut longest_gap = Duration::ZERO;
    let mut next_send = Instant::now();
    let mut buf = [0u8; 2048];
    let mut receive = |socket: &UdpSocket, answered: &mut BTreeSet<u64>, last: &mut Instant| {
        match socket.recv(&mut buf) {
            Ok(n) => {
                if let Some(seq) = sequence_of(&buf[..n]) {
                    answered.insert(seq);
                    let text = String::from_utf8_lossy(&buf[..n]);
                    if let Some(line) = text.lines().next() {
                        shared.saw(line);
                    }
                    *last = Instant::now();
                }
                true
            }
            // Timeouts, and ICMP errors surfacing on a connected socket: the answer is
            // simply missing, which the count shows.
            Err(_) => false,
        }
    };
    while !shared.stop.load(Ordering::SeqCst) {
        if Instant::now() >= next_send {
            sent += 1;
            let mut datagram = REFLECT.to_vec();
            datagram.extend_from_slice(format!("SEQ {sent}\n").as_bytes());
            if let Err(err) = socket.send(&datagram)
                && err.kind() != io::ErrorKind::ConnectionRefused
            {
                shared.fail(format!("UDP datagram {sent} to {to}: {err}"));
            }
            next_send += spec.tick;
            longest_gap = longest_gap.max(last_answer.elapsed());
        }
        receive(&socket, &mut answered, &mut last_answer);
    }
    // Stragglers still in flight.
    let drain_until = Instant::now() + spec.timeout;
    while Instant::now() < drain_until && answered.len() < usize::try_from(sent).unwrap_or(0) {
        receive(&socket, &mut answered, &mut last_answer);
    }
    let lost = (1..=sent).filter(|seq| !answered.contains(seq)).count() as u64;
    if lost > 0 {
        let first: Vec<u64> = (1..=sent)
            .filter(|seq| !answered.contains(seq))
            .take(10)
            .collect();
        shared.fail(format!(
            "UDP flow to {to}: {lost} of {sent} datagrams unanswered (first: {first:?})"
        ));
    }
    shared.with(|r| {
        r.udp_sent = sent;
        r.udp_lost = lost;
        r.udp_longest_gap_ms = u64::try_from(longest_gap.as_millis()).unwrap_or(u64::MAX);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::echo;

    fn server(text: &str) -> SocketAddr {
        let bound = echo::bind(&text.parse().unwrap()).unwrap();
        let addr = bound.local_addr().unwrap();
        echo::serve(bound);
        addr
    }

    #[test]
    fn a_quiet_load_is_clean_and_counts_everything() {
        let tcp = server("session/tcp/127.0.0.1:0");
        let udp = server("session/udp/127.0.0.1:0");
        let spec = LoadSpec {
            from: "127.0.0.1".parse().unwrap(),
            new_to: Some(tcp),
            long_to: Some(tcp),
            long_count: 3,
            udp_to: Some(udp),
            tick: Duration::from_millis(10),
            timeout: Duration::from_millis(500),
        };
        let report = run(&spec, || thread::sleep(Duration::from_millis(300)));
        assert!(report.clean(), "{report:?}");
        assert_eq!((report.long_opened, report.long_kept), (3, 3));
        assert!(report.new_attempted >= 5, "{report:?}");
        assert!(report.udp_sent >= 5, "{report:?}");
        assert!(
            report.seen.contains(&format!("{tcp} saw 127.0.0.1")),
            "{report:?}"
        );
    }

    #[test]
    fn a_dead_backend_breaks_connections_and_loses_datagrams() {
        // Nothing listens: new connections are refused, the datagrams go unanswered.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let spec = LoadSpec {
            from: "127.0.0.1".parse().unwrap(),
            new_to: Some(closed),
            long_to: Some(closed),
            long_count: 1,
            udp_to: Some(silent.local_addr().unwrap()),
            tick: Duration::from_millis(10),
            timeout: Duration::from_millis(100),
        };
        let report = run(&spec, || thread::sleep(Duration::from_millis(200)));
        assert!(!report.clean());
        assert!(report.new_failed > 0 && report.new_failed == report.new_attempted);
        assert_eq!(report.long_broken, 1);
        assert!(report.udp_lost > 0 && report.udp_lost == report.udp_sent);
        assert!(!report.failures.is_empty());
    }

    #[test]
    fn reads_the_sequence_after_the_echo_line() {
        assert_eq!(
            sequence_of(b"ECHO 10.0.0.1:9000 FROM 10.0.0.2:4000\nREFLECT\nSEQ 42\n"),
            Some(42)
        );
        assert_eq!(
            sequence_of(b"ECHO 10.0.0.1:9000 FROM 10.0.0.2:4000\n"),
            None
        );
    }
}
