// SPDX-License-Identifier: Apache-2.0
//! UDP load: a client that keeps a fixed window of small datagrams in flight to each
//! target and counts the answers per second, and the server that echoes them. Like the
//! TCP client ([`load`](super::load)), several targets alternate in short slices (ABBA),
//! so every target sees the same machine.
//!
//! A connected socket per target: the kernel hands the client only datagrams from the
//! address it sent to, so an answer that came back untranslated (from the backend instead
//! of the NodePort) is not counted. When no answer arrives within the reply timeout, the
//! window's datagrams count as lost and a new window starts; every loop is bounded by the
//! slice's time.

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::load::slice_target;

#[derive(Debug, Clone)]
pub struct UdpOptions {
    pub targets: Vec<SocketAddr>,
    /// Measured time per target.
    pub duration: Duration,
    pub slice: Duration,
    /// Unrecorded traffic before the measured time, spread over the targets.
    pub warmup: Duration,
    /// Datagrams in flight per target.
    pub window: u32,
    /// Payload bytes of each datagram (at least 8: a sequence number).
    pub payload: usize,
    /// An answer later than this counts its window as lost.
    pub reply_timeout: Duration,
}

impl UdpOptions {
    pub fn new(targets: Vec<SocketAddr>, duration: Duration) -> Self {
        UdpOptions {
            targets,
            duration,
            slice: Duration::from_millis(100),
            warmup: Duration::from_millis(300),
            window: 16,
            payload: 18,
            reply_timeout: Duration::from_millis(20),
        }
    }
}

/// One target of a UDP client run; `loadgen udp-client` prints a JSON array of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UdpReport {
    pub target: SocketAddr,
    pub sent: u64,
    pub answered: u64,
    /// Datagrams (or their answers) given up on.
    pub lost: u64,
    /// Send or receive errors (ICMP errors surface here on a connected socket).
    pub errors: u64,
    pub first_error: Option<String>,
    pub seconds: f64,
    /// Answered datagrams per second: each is a request and its answer through the path.
    pub pps: f64,
}

impl UdpReport {
    /// The share of datagrams lost, in percent.
    pub fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * self.lost as f64 / self.sent as f64
        }
    }
}

struct Flow {
    socket: UdpSocket,
    next_seq: u64,
    in_flight: u32,
    sent: u64,
    answered: u64,
    lost: u64,
    errors: u64,
    first_error: Option<String>,
    measured: Duration,
}

impl Flow {
    fn open(target: SocketAddr, reply_timeout: Duration) -> io::Result<Self> {
        let bind: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().unwrap_or_else(|_| unreachable!())
        } else {
            "[::]:0".parse().unwrap_or_else(|_| unreachable!())
        };
        let socket = UdpSocket::bind(bind)?;
        socket.connect(target)?;
        socket.set_read_timeout(Some(reply_timeout.max(Duration::from_millis(1))))?;
        Ok(Flow {
            socket,
            next_seq: 0,
            in_flight: 0,
            sent: 0,
            answered: 0,
            lost: 0,
            errors: 0,
            first_error: None,
            measured: Duration::ZERO,
        })
    }

    fn note_error(&mut self, err: &io::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(err.to_string());
        }
    }

    /// Keeps the window full until `end`; then waits (bounded) for what is in flight.
    fn run_until(&mut self, end: Instant, window: u32, buf: &mut [u8], reply: &mut [u8]) {
        while Instant::now() < end {
            while self.in_flight < window {
                buf[..8].copy_from_slice(&self.next_seq.to_be_bytes());
                self.next_seq += 1;
                match self.socket.send(buf) {
                    Ok(_) => {
                        self.sent += 1;
                        self.in_flight += 1;
                    }
                    Err(err) => {
                        self.note_error(&err);
                        break;
                    }
                }
            }
            self.receive_one(reply);
        }
        // Drain: the next slice (maybe another target's) starts with nothing in flight.
        while self.in_flight > 0 {
            self.receive_one(reply);
        }
    }

    fn receive_one(&mut self, reply: &mut [u8]) {
        match self.socket.recv(reply) {
            Ok(_) => {
                self.answered += 1;
                self.in_flight = self.in_flight.saturating_sub(1);
            }
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                self.lost += u64::from(self.in_flight);
                self.in_flight = 0;
            }
            Err(err) => {
                self.note_error(&err);
                self.lost += u64::from(self.in_flight);
                self.in_flight = 0;
            }
        }
    }

    /// Counters back to zero after the warm-up (late answers of the warm-up may still
    /// arrive; they are few and count for the measured part).
    fn reset(&mut self) {
        self.sent = 0;
        self.answered = 0;
        self.lost = 0;
        self.errors = 0;
        self.first_error = None;
    }
}

/// Runs the client: a warm-up, then slices alternating between the targets until each has
/// had its measured time. One report per target, in the order given.
pub fn run_udp_client(opts: &UdpOptions) -> io::Result<Vec<UdpReport>> {
    let mut flows = opts
        .targets
        .iter()
        .map(|t| Flow::open(*t, opts.reply_timeout))
        .collect::<io::Result<Vec<_>>>()?;
    let n = flows.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let window = opts.window.max(1);
    let mut buf = vec![0u8; opts.payload.max(8)];
    let mut reply = vec![0u8; 2048];
    let per_target = opts.warmup / u32::try_from(n).unwrap_or(u32::MAX);
    for flow in &mut flows {
        flow.run_until(Instant::now() + per_target, window, &mut buf, &mut reply);
        flow.reset();
    }
    let slice = opts.slice.max(Duration::from_millis(1));
    let mut index = 0usize;
    while flows.iter().any(|f| f.measured < opts.duration) {
        let flow = &mut flows[slice_target(index, n)];
        index += 1;
        let remaining = opts.duration.saturating_sub(flow.measured);
        if remaining.is_zero() {
            continue;
        }
        let started = Instant::now();
        flow.run_until(started + remaining.min(slice), window, &mut buf, &mut reply);
        flow.measured += started.elapsed();
    }
    Ok(opts
        .targets
        .iter()
        .zip(flows)
        .map(|(target, f)| {
            let seconds = f.measured.as_secs_f64();
            UdpReport {
                target: *target,
                sent: f.sent,
                answered: f.answered,
                lost: f.lost,
                errors: f.errors,
                first_error: f.first_error,
                seconds,
                pps: if seconds > 0.0 {
                    f.answered as f64 / seconds
                } else {
                    0.0
                },
            }
        })
        .collect())
}

/// Echoes every datagram to its sender until the socket fails.
pub fn serve_udp(socket: &UdpSocket) -> io::Result<()> {
    let mut buf = vec![0u8; 65536];
    loop {
        let (len, from) = socket.recv_from(&mut buf)?;
        // A client that went away is its own business.
        let _ = socket.send_to(&buf[..len], from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_and_server_on_loopback() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        std::thread::spawn(move || serve_udp(&server));
        let other_server = UdpSocket::bind("127.0.0.2:0").unwrap();
        let other = other_server.local_addr().unwrap();
        std::thread::spawn(move || serve_udp(&other_server));
        let mut opts = UdpOptions::new(vec![addr, other], Duration::from_millis(200));
        opts.warmup = Duration::from_millis(20);
        opts.slice = Duration::from_millis(20);
        let reports = run_udp_client(&opts).unwrap();
        assert_eq!(reports.len(), 2);
        for (report, target) in reports.iter().zip([addr, other]) {
            assert_eq!(report.target, target);
            assert!(report.answered > 100, "{report:?}");
            assert!(report.answered <= report.sent);
            assert!(report.loss_percent() < 5.0, "{report:?}");
            assert!((report.pps - report.answered as f64 / report.seconds).abs() < 1e-6);
            assert!(report.seconds >= 0.2 && report.seconds < 0.35, "{report:?}");
        }
    }

    #[test]
    fn nobody_answering_is_loss_not_a_hang() {
        // Bound, then closed: nothing listens there.
        let addr = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut opts = UdpOptions::new(vec![addr], Duration::from_millis(100));
        opts.warmup = Duration::ZERO;
        let started = Instant::now();
        let report = run_udp_client(&opts).unwrap().remove(0);
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(report.answered, 0);
        assert!(report.lost > 0 || report.errors > 0, "{report:?}");
        assert_eq!(report.pps, 0.0);
    }
}
