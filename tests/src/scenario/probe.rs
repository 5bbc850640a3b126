// SPDX-License-Identifier: Apache-2.0
//! The client side of a flow (the `probe` subcommand): bind to the flow's source,
//! reach the destination, send a request line, read the answer; repeat.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, Socket, Type};

use super::{
    echo::IPPROTO_SCTP,
    format::Proto,
    outcome::{Attempt, Outcome},
};

/// The request line: also a valid HTTP/1.0 request, so health-check servers answer.
pub const REQUEST: &[u8] = b"GET / HTTP/1.0\r\n\r\n";

#[derive(Debug, Clone)]
pub struct ProbeSpec {
    pub from: IpAddr,
    /// 0 for an ephemeral port.
    pub from_port: u16,
    pub to: SocketAddr,
    pub proto: Proto,
    pub count: u32,
    /// Per stage: for connecting, and for the answer.
    pub timeout: Duration,
}

/// Runs `count` attempts one after the other.
pub fn probe(spec: &ProbeSpec) -> Vec<Attempt> {
    (0..spec.count)
        .map(|_| match spec.proto {
            Proto::Tcp => attempt_stream(spec, Protocol::TCP),
            Proto::Sctp => attempt_stream(spec, Protocol::from(IPPROTO_SCTP)),
            Proto::Udp => attempt_datagram(spec),
        })
        .collect()
}

fn millis(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn failed(err: &io::Error, start: Instant, connected: bool) -> Attempt {
    let outcome = match err.kind() {
        io::ErrorKind::ConnectionRefused => Outcome::Refused,
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::Timeout,
        _ => Outcome::Error,
    };
    let mut attempt = Attempt::new(outcome, millis(start));
    attempt.connected = connected;
    if outcome == Outcome::Error {
        attempt.errno = err.raw_os_error();
        attempt.message = Some(err.to_string());
    }
    attempt
}

fn bound_socket(spec: &ProbeSpec, ty: Type, protocol: Protocol) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(spec.to), ty, Some(protocol))?;
    // A fixed UDP source port is reused by the next attempt and the next step.
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::new(spec.from, spec.from_port).into())?;
    Ok(socket)
}

fn attempt_stream(spec: &ProbeSpec, protocol: Protocol) -> Attempt {
    let start = Instant::now();
    let socket = match bound_socket(spec, Type::STREAM, protocol) {
        Ok(s) => s,
        Err(err) => return failed(&err, start, false),
    };
    if let Err(err) = socket.connect_timeout(&spec.to.into(), spec.timeout) {
        return failed(&err, start, false);
    }
    let mut socket = socket;
    let exchange = (|| {
        socket.set_write_timeout(Some(spec.timeout))?;
        socket.set_read_timeout(Some(spec.timeout))?;
        socket.write_all(REQUEST)?;
        read_answer(&mut socket)
    })();
    match exchange {
        Ok(answer) if !answer.is_empty() => {
            Attempt::answered(&String::from_utf8_lossy(&answer), millis(start))
        }
        Ok(_) => Attempt {
            connected: true,
            message: Some("connection closed without an answer".into()),
            ..Attempt::new(Outcome::Error, millis(start))
        },
        Err(err) => failed(&err, start, true),
    }
}

/// Reads until EOF or the timeout; a partial answer before a timeout still counts.
fn read_answer(socket: &mut Socket) -> io::Result<Vec<u8>> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return Ok(answer),
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.len() > 8192 {
                    return Ok(answer);
                }
            }
            Err(err) if !answer.is_empty() && is_timeout(&err) => return Ok(answer),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
}

fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

fn attempt_datagram(spec: &ProbeSpec) -> Attempt {
    let start = Instant::now();
    let exchange = (|| {
        let mut socket = bound_socket(spec, Type::DGRAM, Protocol::UDP)?;
        // Connected, so an ICMP port unreachable surfaces as ECONNREFUSED.
        socket.connect(&spec.to.into())?;
        socket.set_read_timeout(Some(spec.timeout))?;
        socket.send(REQUEST)?;
        let mut buf = [0u8; 2048];
        let n = socket.read(&mut buf)?;
        Ok::<_, io::Error>(buf[..n].to_vec())
    })();
    match exchange {
        Ok(answer) => Attempt::answered(&String::from_utf8_lossy(&answer), millis(start)),
        Err(err) => failed(&err, start, false),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, UdpSocket};

    use super::*;
    use crate::scenario::{echo, outcome::AnswerKind};

    fn spec(to: SocketAddr, proto: Proto, count: u32) -> ProbeSpec {
        ProbeSpec {
            from: "127.0.0.1".parse().unwrap(),
            from_port: 0,
            to,
            proto,
            count,
            timeout: Duration::from_millis(300),
        }
    }

    fn echo_server(text: &str) -> SocketAddr {
        let bound = echo::bind(&text.parse().unwrap()).unwrap();
        let addr = bound.local_addr().unwrap();
        echo::serve(bound);
        addr
    }

    #[test]
    fn tcp_answers_and_refusals() {
        let addr = echo_server("echo/tcp/127.0.0.1:0");
        let attempts = probe(&spec(addr, Proto::Tcp, 3));
        assert_eq!(attempts.len(), 3);
        for a in &attempts {
            assert_eq!(a.answer_kind, Some(AnswerKind::Echo), "{a:?}");
            assert_eq!(a.backend, Some(addr));
            assert_eq!(a.seen_source, Some("127.0.0.1".parse().unwrap()));
        }

        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let attempts = probe(&spec(closed, Proto::Tcp, 1));
        assert_eq!(attempts[0].outcome, Outcome::Refused);
    }

    #[test]
    fn udp_answers_refusals_timeouts_and_fixed_ports() {
        let addr = echo_server("echo/udp/127.0.0.1:0");
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut fixed = spec(addr, Proto::Udp, 2);
        fixed.from_port = port;
        let attempts = probe(&fixed);
        for a in &attempts {
            assert_eq!(a.answer_kind, Some(AnswerKind::Echo), "{a:?}");
            let line = a.first_line.as_deref().unwrap();
            assert!(line.ends_with(&format!("FROM 127.0.0.1:{port}")), "{line}");
        }

        let closed = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(
            probe(&spec(closed, Proto::Udp, 1))[0].outcome,
            Outcome::Refused
        );

        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let attempt = &probe(&spec(silent.local_addr().unwrap(), Proto::Udp, 1))[0];
        assert_eq!(attempt.outcome, Outcome::Timeout);
        assert!(attempt.elapsed_ms >= 250, "{attempt:?}");
    }

    #[test]
    fn binding_a_foreign_address_is_an_error_not_a_drop() {
        let mut s = spec("127.0.0.1:9".parse().unwrap(), Proto::Tcp, 1);
        s.from = "192.0.2.123".parse().unwrap();
        let attempt = &probe(&s)[0];
        assert_eq!(attempt.outcome, Outcome::Error);
        assert_eq!(attempt.errno, Some(nix::errno::Errno::EADDRNOTAVAIL as i32));
    }
}
