// SPDX-License-Identifier: Apache-2.0
//! The client side of a flow (the `probe` subcommand): bind to the flow's source,
//! reach the destination, send a request line, read the answer; repeat.

use std::{
    io::{self, Read, Write},
    net::{IpAddr, SocketAddr},
    os::fd::AsFd,
    time::{Duration, Instant},
};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
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
    // A node process talking over loopback (`curl localhost:30080`) binds no address (only
    // its fixed port, if any): the route gives it 127.0.0.1 (::1) all the same, unless its
    // destination is translated away from loopback (a NodePort served on loopback by the
    // socket programs), where a bound loopback source makes connect() fail with EINVAL.
    let loopback_talk = spec.from.is_loopback() && spec.to.ip().is_loopback();
    let from = if loopback_talk {
        match spec.from {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        }
    } else {
        spec.from
    };
    if !loopback_talk || spec.from_port != 0 {
        socket.bind(&SocketAddr::new(from, spec.from_port).into())?;
    }
    Ok(socket)
}

fn attempt_stream(spec: &ProbeSpec, protocol: Protocol) -> Attempt {
    let start = Instant::now();
    let socket = match bound_socket(spec, Type::STREAM, protocol) {
        Ok(s) => s,
        Err(err) => return failed(&err, start, false),
    };
    // SCTP needs the watch to see a refusal at all; TCP only to see it sooner (a raw socket
    // needs CAP_NET_RAW, which the runner has and an unprivileged unit test may not).
    let icmp = match (IcmpWatch::open(spec.to), spec.proto) {
        (Ok(watch), _) => Some(watch),
        (Err(err), Proto::Sctp) => return failed(&err, start, false),
        (Err(_), Proto::Tcp | Proto::Udp) => None,
    };
    let quoted = match spec.proto {
        Proto::Sctp => IPPROTO_SCTP as u8,
        Proto::Tcp | Proto::Udp => IPPROTO_TCP,
    };
    if let Err(err) = connect_watching(&socket, spec, icmp.as_ref(), quoted) {
        return failed(&err, start, false);
    }
    let peer = socket.peer_addr().ok().and_then(|a| a.as_socket());
    let mut socket = socket;
    let exchange = (|| {
        socket.set_write_timeout(Some(spec.timeout))?;
        socket.set_read_timeout(Some(spec.timeout))?;
        socket.write_all(REQUEST)?;
        read_answer(&mut socket)
    })();
    match exchange {
        Ok(answer) if !answer.is_empty() => Attempt {
            peer,
            ..Attempt::answered(&String::from_utf8_lossy(&answer), millis(start))
        },
        Ok(_) => Attempt {
            connected: true,
            peer,
            message: Some("connection closed without an answer".into()),
            ..Attempt::new(Outcome::Error, millis(start))
        },
        Err(err) => failed(&err, start, true),
    }
}

/// IANA protocol number of TCP.
const IPPROTO_TCP: u8 = 6;

/// Connects `socket` to the flow's destination within the flow's timeout. A port
/// unreachable that `icmp` sees quoting this socket's first packet (`quoted`: its
/// protocol) is a refusal at once: TCP over IPv6 keeps one that comes back while connect()
/// holds the socket as a soft error and reports it only with the next retransmission, a
/// second later, and SCTP keeps it as a soft error and retransmits its INIT until the
/// timeout. The kernel would say the same (TCP) or nothing (SCTP): the outcome does not
/// change, only how long a REJECT takes to be seen.
fn connect_watching(
    socket: &Socket,
    spec: &ProbeSpec,
    icmp: Option<&IcmpWatch>,
    quoted: u8,
) -> io::Result<()> {
    socket.set_nonblocking(true)?;
    let connected = (|| {
        match socket.connect(&spec.to.into()) {
            Ok(()) => return Ok(()),
            Err(err) if err.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
            Err(err) => return Err(err),
        }
        let port = socket.local_addr()?.as_socket().map_or(0, |a| a.port());
        let deadline = Instant::now() + spec.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            let wait = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = vec![PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
            if let Some(icmp) = icmp {
                fds.push(PollFd::new(icmp.socket.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, wait) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(err) => return Err(err.into()),
            }
            let done = PollFlags::POLLOUT | PollFlags::POLLERR | PollFlags::POLLHUP;
            if fds[0].revents().is_some_and(|r| r.intersects(done)) {
                return match socket.take_error()? {
                    Some(err) => Err(err),
                    None => Ok(()),
                };
            }
            if icmp.is_some_and(|icmp| icmp.saw_port_unreachable(quoted, port, spec.to)) {
                return Err(io::ErrorKind::ConnectionRefused.into());
            }
        }
    })();
    socket.set_nonblocking(false)?;
    connected
}

/// A raw ICMP (ICMPv6) socket of the probe's namespace, open before the attempt starts.
struct IcmpWatch {
    socket: Socket,
    v6: bool,
}

impl IcmpWatch {
    fn open(to: SocketAddr) -> io::Result<Self> {
        let (domain, protocol) = match to {
            SocketAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4),
            SocketAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6),
        };
        let socket = Socket::new(domain, Type::RAW, Some(protocol))?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket,
            v6: to.is_ipv6(),
        })
    }

    /// Whether a port unreachable arrived for a packet of protocol `quoted` from
    /// `local_port` to `to` (reads what is queued, never waits).
    fn saw_port_unreachable(&self, quoted: u8, local_port: u16, to: SocketAddr) -> bool {
        let mut buf = [0u8; 1500];
        loop {
            let n = match (&self.socket).read(&mut buf) {
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            };
            if quotes_port_unreachable(&buf[..n], self.v6, quoted, local_port, to) {
                return true;
            }
        }
    }
}

/// Whether `packet` (what a raw socket reads: IPv4 header and ICMP, or an ICMPv6 message)
/// is a port unreachable quoting a packet of protocol `quoted` from `local_port` to `to`.
fn quotes_port_unreachable(
    packet: &[u8],
    v6: bool,
    quoted: u8,
    local_port: u16,
    to: SocketAddr,
) -> bool {
    let quoted = if v6 {
        // ICMPv6 destination unreachable (1), port unreachable (4); then the quoted IPv6
        // header (40 bytes), whose next header must be `quoted`.
        if packet.len() < 8 + 40 + 4 || packet[0] != 1 || packet[1] != 4 {
            return false;
        }
        let ip = &packet[8..];
        let mut dst = [0u8; 16];
        dst.copy_from_slice(&ip[24..40]);
        if ip[6] != quoted || IpAddr::from(dst) != to.ip() {
            return false;
        }
        &ip[40..]
    } else {
        let ihl = usize::from(packet.first().map_or(0, |b| b & 0x0f)) * 4;
        // ICMP destination unreachable (3), port unreachable (3).
        let Some(icmp) = packet.get(ihl..) else {
            return false;
        };
        if icmp.len() < 8 + 20 + 4 || icmp[0] != 3 || icmp[1] != 3 {
            return false;
        }
        let ip = &icmp[8..];
        let quoted_ihl = usize::from(ip[0] & 0x0f) * 4;
        let dst = IpAddr::from([ip[16], ip[17], ip[18], ip[19]]);
        if ip[9] != quoted || dst != to.ip() || ip.len() < quoted_ihl + 4 {
            return false;
        }
        &ip[quoted_ihl..]
    };
    quoted.len() >= 4
        && u16::from_be_bytes([quoted[0], quoted[1]]) == local_port
        && u16::from_be_bytes([quoted[2], quoted[3]]) == to.port()
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
        let socket = bound_socket(spec, Type::DGRAM, Protocol::UDP)?;
        // Connected, so an ICMP port unreachable surfaces as ECONNREFUSED.
        socket.connect(&spec.to.into())?;
        socket.set_read_timeout(Some(spec.timeout))?;
        let socket = std::net::UdpSocket::from(socket);
        socket.send(REQUEST)?;
        let mut buf = [0u8; 2048];
        let (n, from) = socket.recv_from(&mut buf)?;
        Ok::<_, io::Error>((buf[..n].to_vec(), from))
    })();
    match exchange {
        Ok((answer, from)) => Attempt {
            peer: Some(from),
            ..Attempt::answered(&String::from_utf8_lossy(&answer), millis(start))
        },
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
    fn port_unreachables_are_recognised_by_their_quote() {
        const SCTP: u8 = IPPROTO_SCTP as u8;
        let to: SocketAddr = "172.30.0.41:80".parse().unwrap();
        // IPv4 header (20), ICMP 3/3 (8), quoted IPv4 header (20, SCTP, to 172.30.0.41),
        // quoted SCTP ports 40000 -> 80.
        let mut v4 = vec![0x45u8; 1];
        v4.extend([0; 19]);
        v4.extend([3, 3, 0, 0, 0, 0, 0, 0]);
        let mut quoted = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 132, 0, 0, 10, 0, 0, 2];
        quoted.extend([172, 30, 0, 41]);
        v4.extend(&quoted);
        v4.extend(40000u16.to_be_bytes());
        v4.extend(80u16.to_be_bytes());
        assert!(quotes_port_unreachable(&v4, false, SCTP, 40000, to));
        assert!(!quotes_port_unreachable(&v4, false, SCTP, 40001, to));
        let other: SocketAddr = "172.30.0.42:80".parse().unwrap();
        assert!(!quotes_port_unreachable(&v4, false, SCTP, 40000, other));
        let mut host_unreachable = v4.clone();
        host_unreachable[21] = 1;
        assert!(!quotes_port_unreachable(
            &host_unreachable,
            false,
            SCTP,
            40000,
            to
        ));
        // The same quote names SCTP: it is no answer to a TCP SYN.
        assert!(!quotes_port_unreachable(&v4, false, IPPROTO_TCP, 40000, to));

        let to6: SocketAddr = "[fd00:30::41]:80".parse().unwrap();
        let mut v6 = vec![1u8, 4, 0, 0, 0, 0, 0, 0];
        let mut header = [0u8; 40];
        header[0] = 0x60;
        header[6] = 132;
        header[24..40].copy_from_slice(
            &"fd00:30::41"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend(header);
        v6.extend(40000u16.to_be_bytes());
        v6.extend(80u16.to_be_bytes());
        assert!(quotes_port_unreachable(&v6, true, SCTP, 40000, to6));
        assert!(!quotes_port_unreachable(&v6[..40], true, SCTP, 40000, to6));
        let mut tcp6 = v6.clone();
        tcp6[8 + 6] = IPPROTO_TCP;
        assert!(quotes_port_unreachable(
            &tcp6,
            true,
            IPPROTO_TCP,
            40000,
            to6
        ));
        assert!(!quotes_port_unreachable(&tcp6, true, SCTP, 40000, to6));
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
