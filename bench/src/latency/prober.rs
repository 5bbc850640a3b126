// SPDX-License-Identifier: Apache-2.0
//! The prober: one thread that, every millisecond, starts a non-blocking connect to each
//! pending frontend and advances the attempts in flight. An attempt succeeds only when the
//! backend echoed the byte it was sent (connect, 1-byte request, the same byte back), so
//! neither a connect that something else accepted nor a half-open socket counts: a
//! ClusterIP the agent has not programmed cannot produce a success.
//!
//! Run as `loadgen bench-latency --prober` in the client pod (the node's cgroup, so the
//! socket programs translate its connects). Line protocol on stdin / stdout:
//!
//! ```text
//! in:  probe <id> <ip:port>     probe until the first success, or fail after the bound
//!      control <ip:port>        probe until the end; every success is a false one
//! out: READY
//!      ok <id> <t1 ns, CLOCK_MONOTONIC> <attempts>
//!      fail <id> <attempts>
//!      end <control attempts> <control successes> <longest probe interval, us>
//!                               after stdin closes
//! ```

use std::{
    io::{self, BufRead, ErrorKind, Read as _, Write},
    net::SocketAddr,
    sync::mpsc::{self, Receiver, TryRecvError},
    thread,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// How often each pending frontend gets a new connect.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(1);
/// An attempt not answered by then is abandoned (a SYN to an unprogrammed address that
/// no ICMP error ended).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(50);
/// At most this many attempts in flight per frontend (bounds sockets when SYNs hang).
pub const MAX_IN_FLIGHT: usize = 64;
/// The most connects per second the prober makes in all, by default. When more frontends
/// are pending than it can probe every [`PROBE_INTERVAL`] (slow programming: hundreds
/// pending), each one's interval stretches to share this budget, so the prober does not
/// take the CPU the agent needs (on 2 cores, 100,000 failing connects per second starved
/// it).
pub const MAX_CONNECTS_PER_SEC: u32 = 10_000;

/// The interval between two connects to one frontend while `pending` frontends share
/// `budget` connects per second.
pub fn probe_interval(pending: usize, budget: u32) -> Duration {
    let shared = Duration::from_secs(1) / budget.max(1);
    PROBE_INTERVAL.max(shared.saturating_mul(u32::try_from(pending).unwrap_or(u32::MAX)))
}

/// CLOCK_MONOTONIC in nanoseconds: the same clock in the prober and the orchestrator.
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs * 1_000_000_000 + nanos
    })
}

#[derive(Debug)]
enum Stage {
    Connecting,
    Sent,
}

#[derive(Debug)]
struct Attempt {
    socket: Socket,
    started: Instant,
    stage: Stage,
}

/// What one attempt came to at this tick.
enum Step {
    Pending,
    Failed,
    Answered,
}

impl Attempt {
    /// Starts a connect; `None` when it failed at once (e.g. no route: not programmed).
    fn start(target: SocketAddr) -> Option<Attempt> {
        let socket = Socket::new(
            Domain::for_address(target),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .ok()?;
        socket.set_nonblocking(true).ok()?;
        // Abortive close: no TIME_WAIT or FIN handshake left behind by thousands of probes.
        socket.set_linger(Some(Duration::ZERO)).ok()?;
        socket.set_tcp_nodelay(true).ok()?;
        match socket.connect(&SockAddr::from(target)) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(libc_einprogress()) => {}
            Err(_) => return None,
        }
        Some(Attempt {
            socket,
            started: Instant::now(),
            stage: Stage::Connecting,
        })
    }

    fn step(&mut self, byte: u8) -> Step {
        if self.started.elapsed() > ATTEMPT_TIMEOUT {
            return Step::Failed;
        }
        match self.socket.take_error() {
            Ok(None) => {}
            _ => return Step::Failed,
        }
        if let Stage::Connecting = self.stage {
            // While the handshake runs, a non-blocking send says EAGAIN.
            match self.socket.send(&[byte]) {
                Ok(1) => self.stage = Stage::Sent,
                Err(err) if err.kind() == ErrorKind::WouldBlock => return Step::Pending,
                _ => return Step::Failed,
            }
        }
        let mut reply = [0u8; 1];
        match (&self.socket).read(&mut reply) {
            Ok(1) if reply[0] == byte => Step::Answered,
            Err(err) if err.kind() == ErrorKind::WouldBlock => Step::Pending,
            // Closed without the echo, or another byte: not the backend answering.
            _ => Step::Failed,
        }
    }
}

/// EINPROGRESS (socket2 reports a non-blocking connect under way with it).
fn libc_einprogress() -> i32 {
    nix::errno::Errno::EINPROGRESS as i32
}

#[derive(Debug)]
struct Target {
    /// 0 for the control frontend.
    id: u64,
    addr: SocketAddr,
    control: bool,
    added: Instant,
    next: Instant,
    attempts: u64,
    in_flight: Vec<Attempt>,
}

impl Target {
    /// The byte this target's probes send: never 0, so a zeroed reply never matches.
    fn byte(&self) -> u8 {
        u8::try_from(self.id % 250).unwrap_or(0) + 1
    }
}

/// A command from the orchestrator.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Probe { id: u64, addr: SocketAddr },
    Control { addr: SocketAddr },
}

pub fn parse_command(line: &str) -> Option<Command> {
    let mut words = line.split_whitespace();
    match (words.next()?, words.next(), words.next()) {
        ("probe", Some(id), Some(addr)) => Some(Command::Probe {
            id: id.parse().ok()?,
            addr: addr.parse().ok()?,
        }),
        ("control", Some(addr), None) => Some(Command::Control {
            addr: addr.parse().ok()?,
        }),
        _ => None,
    }
}

/// A result line from the prober.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    Ok {
        id: u64,
        t1_ns: u64,
        attempts: u64,
    },
    Fail {
        id: u64,
        attempts: u64,
    },
    End {
        control_attempts: u64,
        control_successes: u64,
        longest_interval_us: u64,
    },
}

pub fn parse_report(line: &str) -> Option<Report> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    match *words.first()? {
        "ok" => Some(Report::Ok {
            id: num(1)?,
            t1_ns: num(2)?,
            attempts: num(3)?,
        }),
        "fail" => Some(Report::Fail {
            id: num(1)?,
            attempts: num(2)?,
        }),
        "end" => Some(Report::End {
            control_attempts: num(1)?,
            control_successes: num(2)?,
            longest_interval_us: num(3)?,
        }),
        _ => None,
    }
}

/// The probing loop over `commands` until the channel closes; reports go to `out`.
/// `give_up`: how long a frontend is probed before it counts as failed; `budget`: connects
/// per second in all.
pub fn probe_loop(
    commands: &Receiver<Command>,
    out: &mut dyn Write,
    give_up: Duration,
    budget: u32,
) -> io::Result<()> {
    let mut targets: Vec<Target> = Vec::new();
    let (mut control_attempts, mut control_successes) = (0u64, 0u64);
    let mut open = true;
    let mut longest = PROBE_INTERVAL;
    while open || targets.iter().any(|t| !t.control) {
        loop {
            let command = match commands.try_recv() {
                Ok(command) => command,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            };
            let (id, addr, control) = match command {
                Command::Probe { id, addr } => (id, addr, false),
                Command::Control { addr } => (0, addr, true),
            };
            let now = Instant::now();
            targets.push(Target {
                id,
                addr,
                control,
                added: now,
                next: now,
                attempts: 0,
                in_flight: Vec::new(),
            });
        }
        if !open {
            // Unprogrammed frontends left are failed by the bound below; the control
            // frontend stops with the input.
            targets.retain(|t| !t.control);
        }
        let now = Instant::now();
        let interval = probe_interval(targets.len(), budget);
        longest = longest.max(interval);
        let mut done = Vec::new();
        for (index, target) in targets.iter_mut().enumerate() {
            let byte = target.byte();
            let mut answered = false;
            target.in_flight.retain_mut(|a| match a.step(byte) {
                Step::Pending => true,
                Step::Failed => false,
                Step::Answered => {
                    answered = true;
                    false
                }
            });
            if target.control {
                if answered {
                    control_successes += 1;
                }
            } else if answered {
                writeln!(
                    out,
                    "ok {} {} {}",
                    target.id,
                    monotonic_ns(),
                    target.attempts
                )?;
                done.push(index);
                continue;
            } else if now.duration_since(target.added) > give_up {
                writeln!(out, "fail {} {}", target.id, target.attempts)?;
                done.push(index);
                continue;
            }
            if now >= target.next && target.in_flight.len() < MAX_IN_FLIGHT {
                target.attempts += 1;
                if target.control {
                    control_attempts += 1;
                }
                target.next = now + interval;
                if let Some(attempt) = Attempt::start(target.addr) {
                    // A connect to a local backend can finish within the call.
                    target.in_flight.push(attempt);
                }
            }
        }
        for index in done.into_iter().rev() {
            targets.swap_remove(index);
        }
        out.flush()?;
        let next = targets.iter().map(|t| t.next).min();
        let wait = next.map_or(PROBE_INTERVAL, |n| {
            n.saturating_duration_since(Instant::now())
        });
        // Attempts in flight are checked again well within the interval.
        let busy = targets.iter().any(|t| !t.in_flight.is_empty());
        let wait = if busy {
            wait.min(Duration::from_micros(100))
        } else {
            wait
        };
        thread::sleep(wait.min(PROBE_INTERVAL));
    }
    let longest_us = longest.as_micros();
    writeln!(
        out,
        "end {control_attempts} {control_successes} {longest_us}"
    )?;
    out.flush()
}

/// The prober process: commands from stdin, reports on stdout.
pub fn run_prober(give_up: Duration, budget: u32) -> io::Result<()> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Some(command) = parse_command(&line) {
                if tx.send(command).is_err() {
                    break;
                }
            } else {
                eprintln!("prober: ignoring {line:?}");
            }
        }
    });
    let stdout = io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "READY")?;
    out.flush()?;
    probe_loop(&rx, &mut out, give_up, budget)
}
