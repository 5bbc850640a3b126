// SPDX-License-Identifier: Apache-2.0
//! Echo servers and plain listeners (the `echo` subcommand). Every connection or
//! datagram gets one line: `ECHO <own ip:port> FROM <peer ip:port>` from an echo
//! server, `PLAIN <own ip:port> FROM <peer ip:port>` from a plain listener. A session
//! server (for long-lived connections) answers every line of a stream with the echo line
//! and keeps the connection until the client closes it; its datagrams are echoed.

use std::{
    fmt,
    io::{self, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    str::FromStr,
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, Socket, Type};

use super::{
    addr::parse_socket_addr,
    error::{Error, Result},
    format::Proto,
};

/// IPPROTO_SCTP.
pub const IPPROTO_SCTP: i32 = 132;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListenKind {
    Echo,
    Plain,
    Session,
}

/// `echo/tcp/10.180.0.1:80`, `plain/udp/[fd00::3]:53`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenSpec {
    pub kind: ListenKind,
    pub proto: Proto,
    pub addr: SocketAddr,
}

impl fmt::Display for ListenSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ListenKind::Echo => "echo",
            ListenKind::Plain => "plain",
            ListenKind::Session => "session",
        };
        write!(f, "{kind}/{}/{}", self.proto, self.addr)
    }
}

impl FromStr for ListenSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Invalid(format!(
                "listener {s:?} is not <echo|plain|session>/<proto>/<ip:port>"
            ))
        };
        let mut parts = s.splitn(3, '/');
        let kind = match parts.next() {
            Some("echo") => ListenKind::Echo,
            Some("plain") => ListenKind::Plain,
            Some("session") => ListenKind::Session,
            _ => return Err(bad()),
        };
        let proto = parts.next().ok_or_else(bad)?.parse()?;
        let addr = parse_socket_addr(parts.next().ok_or_else(bad)?)?;
        Ok(ListenSpec { kind, proto, addr })
    }
}

/// Whether this kernel can make SCTP sockets.
pub fn sctp_supported() -> bool {
    Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(Protocol::from(IPPROTO_SCTP)),
    )
    .is_ok()
}

/// The start of a datagram the echo server sends back after its line.
pub const REFLECT: &[u8] = b"REFLECT\n";

pub fn reply_line(kind: ListenKind, own: SocketAddr, peer: SocketAddr) -> String {
    match kind {
        ListenKind::Echo | ListenKind::Session => format!("ECHO {own} FROM {peer}\n"),
        ListenKind::Plain => format!("PLAIN {own} FROM {peer}\n"),
    }
}

/// A bound socket, ready to serve.
#[derive(Debug)]
pub enum Bound {
    Stream(TcpListener, ListenKind),
    Datagram(UdpSocket, ListenKind),
}

impl Bound {
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Bound::Stream(l, _) => l.local_addr(),
            Bound::Datagram(s, _) => s.local_addr(),
        }
    }
}

pub fn bind(spec: &ListenSpec) -> io::Result<Bound> {
    let domain = Domain::for_address(spec.addr);
    match spec.proto {
        Proto::Udp => {
            let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
            socket.set_reuse_address(true)?;
            socket.bind(&spec.addr.into())?;
            Ok(Bound::Datagram(socket.into(), spec.kind))
        }
        Proto::Tcp | Proto::Sctp => {
            let protocol = match spec.proto {
                Proto::Sctp => Protocol::from(IPPROTO_SCTP),
                _ => Protocol::TCP,
            };
            let socket = Socket::new(domain, Type::STREAM, Some(protocol))?;
            socket.set_reuse_address(true)?;
            socket.bind(&spec.addr.into())?;
            socket.listen(128)?;
            // A one-to-one SCTP socket speaks the stream socket calls (accept, read,
            // write, getpeername), so the std stream types serve it as well.
            Ok(Bound::Stream(socket.into(), spec.kind))
        }
    }
}

/// Serves on a thread until the process ends.
pub fn serve(bound: Bound) -> JoinHandle<()> {
    thread::spawn(move || match bound {
        Bound::Stream(listener, kind) => {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        thread::spawn(move || {
                            if let Err(err) = answer_stream(stream, kind) {
                                eprintln!("echo: connection: {err}");
                            }
                        });
                    }
                    Err(err) => eprintln!("echo: accept: {err}"),
                }
            }
        }
        Bound::Datagram(socket, kind) => {
            let mut buf = vec![0u8; 65536];
            loop {
                match socket.recv_from(&mut buf) {
                    Ok((n, peer)) => {
                        let own = socket.local_addr().unwrap_or(peer);
                        let mut reply = reply_line(kind, own, peer).into_bytes();
                        // A datagram that asks for it comes back after the line (large
                        // ones test fragmented answers).
                        if buf[..n].starts_with(REFLECT) {
                            reply.extend_from_slice(&buf[..n]);
                        }
                        if let Err(err) = socket.send_to(&reply, peer) {
                            eprintln!("echo: reply to {peer}: {err}");
                        }
                    }
                    Err(err) => eprintln!("echo: recv: {err}"),
                }
            }
        }
    })
}

fn answer_stream(mut stream: TcpStream, kind: ListenKind) -> io::Result<()> {
    if kind == ListenKind::Session {
        return answer_session(stream);
    }
    // Read the request first, so closing never finds unread data (which would send a
    // RST and could destroy the reply in flight).
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut buf = [0u8; 1024];
    let _ = stream.read(&mut buf);
    let own = stream.local_addr()?;
    let peer = stream.peer_addr()?;
    stream.write_all(reply_line(kind, own, peer).as_bytes())?;
    stream.shutdown(Shutdown::Write)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
    Ok(())
}

/// A session: one echo line per line received, until the client closes (or resets).
fn answer_session(stream: TcpStream) -> io::Result<()> {
    let own = stream.local_addr()?;
    let peer = stream.peer_addr()?;
    let reply = reply_line(ListenKind::Session, own, peer);
    let mut writer = stream.try_clone()?;
    let reader = io::BufReader::new(stream);
    for line in io::BufRead::lines(reader) {
        line?;
        writer.write_all(reply.as_bytes())?;
    }
    Ok(())
}

/// The start of the line the `echo` subcommand prints, before `READY`, for a listener it
/// gave up binding: `UNBOUND <spec> <reason>`.
pub const UNBOUND: &str = "UNBOUND";

/// Binds every listener. One whose address is in use is retried until `patience` has
/// passed (a port another process is closing frees within moments); any other error, or
/// an address still in use then, is returned for that listener.
pub fn bind_patiently(
    specs: &[ListenSpec],
    patience: Duration,
) -> (Vec<Bound>, Vec<(ListenSpec, io::Error)>) {
    let deadline = Instant::now() + patience;
    let mut bound = Vec::new();
    let mut pending: Vec<ListenSpec> = specs.to_vec();
    loop {
        let mut in_use = Vec::new();
        let mut failed = Vec::new();
        for spec in pending {
            match bind(&spec) {
                Ok(b) => bound.push(b),
                Err(err) if err.kind() == io::ErrorKind::AddrInUse => in_use.push((spec, err)),
                Err(err) => failed.push((spec, err)),
            }
        }
        if in_use.is_empty() || Instant::now() >= deadline {
            failed.extend(in_use);
            return (bound, failed);
        }
        // Failures other than "in use" do not go away by waiting.
        if !failed.is_empty() {
            failed.extend(in_use);
            return (bound, failed);
        }
        pending = in_use.into_iter().map(|(spec, _)| spec).collect();
        thread::sleep(Duration::from_millis(50));
    }
}

/// Binds every listener, then serves them all; `on_ready` runs once all are bound.
pub fn run(specs: &[ListenSpec], on_ready: impl FnOnce()) -> Result<()> {
    let (bound, failed) = bind_patiently(specs, Duration::ZERO);
    if let Some((spec, err)) = failed.into_iter().next() {
        return Err(Error::io(format!("binding {spec}"))(err));
    }
    serve_all(bound, on_ready);
    Ok(())
}

/// Binds what it can within `patience` (see [`bind_patiently`]) and serves that;
/// `on_ready` runs once binding is over, with the listeners that never bound.
pub fn run_patiently(
    specs: &[ListenSpec],
    patience: Duration,
    on_ready: impl FnOnce(&[(ListenSpec, io::Error)]),
) {
    let (bound, failed) = bind_patiently(specs, patience);
    serve_all(bound, || on_ready(&failed));
}

fn serve_all(bound: Vec<Bound>, on_ready: impl FnOnce()) {
    let handles: Vec<_> = bound.into_iter().map(serve).collect();
    on_ready();
    for handle in handles {
        let _ = handle.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip() {
        for text in [
            "echo/tcp/10.180.0.1:80",
            "plain/udp/[fd00::3]:53",
            "echo/sctp/10.0.0.1:1235",
        ] {
            assert_eq!(text.parse::<ListenSpec>().unwrap().to_string(), text);
        }
        assert!("echo/tcp".parse::<ListenSpec>().is_err());
        assert!("loud/tcp/1.2.3.4:5".parse::<ListenSpec>().is_err());
    }

    #[test]
    fn binding_waits_for_a_port_being_freed_and_reports_one_never_freed() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let spec: ListenSpec = format!("plain/tcp/{addr}").parse().unwrap();
        let released = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let (bound, failed) = bind_patiently(&[spec], Duration::from_secs(5));
        released.join().unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0].local_addr().unwrap(), addr);

        // Held for good: given up after the patience, the others bound all the same.
        let other: ListenSpec = "plain/udp/127.0.0.1:0".parse().unwrap();
        let started = Instant::now();
        let (bound2, failed) = bind_patiently(&[spec, other], Duration::from_millis(300));
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(bound2.len(), 1);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, spec);
        assert_eq!(failed[0].1.kind(), io::ErrorKind::AddrInUse);
        // Without patience, any failure is an error.
        let err = run(&[spec], || {}).unwrap_err().to_string();
        assert!(err.starts_with(&format!("binding {spec}: ")), "{err}");
        drop(bound);

        // Errors that waiting cannot cure are not waited for.
        let foreign: ListenSpec = "plain/tcp/192.0.2.1:80".parse().unwrap();
        let started = Instant::now();
        let (_, failed) = bind_patiently(&[foreign], Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(failed[0].1.kind(), io::ErrorKind::AddrNotAvailable);
    }

    #[test]
    fn answers_tcp_and_udp() {
        let tcp = bind(&"echo/tcp/127.0.0.1:0".parse().unwrap()).unwrap();
        let udp = bind(&"plain/udp/127.0.0.1:0".parse().unwrap()).unwrap();
        let (tcp_addr, udp_addr) = (tcp.local_addr().unwrap(), udp.local_addr().unwrap());
        serve(tcp);
        serve(udp);

        let mut stream = TcpStream::connect(tcp_addr).unwrap();
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let own = stream.local_addr().unwrap();
        assert_eq!(answer, format!("ECHO {tcp_addr} FROM {own}\n"));

        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.connect(udp_addr).unwrap();
        client.send(b"hi").unwrap();
        let mut buf = [0u8; 256];
        let n = client.recv(&mut buf).unwrap();
        let own = client.local_addr().unwrap();
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            format!("PLAIN {udp_addr} FROM {own}\n")
        );
    }
}
