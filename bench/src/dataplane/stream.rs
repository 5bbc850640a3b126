// SPDX-License-Identifier: Apache-2.0
//! The established-connection load: request/response latency (1-byte ping-pong on one
//! connection) and one-stream throughput (bulk writes), with the server that answers both.
//! The client's first byte says which: [`PING`] for ping-pong, [`SINK`] for a stream the
//! server reads to the end and answers with the byte count (so the client times what
//! arrived, not what it queued in its socket buffer).
//!
//! The client is single-threaded; the server answers each connection on a thread of its
//! own. Both can be pinned, like the connection-rate load ([`load`](crate::load)).

use std::{
    io::{self, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::stats::percentile;

pub const PING: u8 = b'P';
pub const SINK: u8 = b'S';
/// One write of the throughput stream.
const CHUNK: usize = 64 * 1024;

/// What one `stream-client` run measured against one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamReport {
    pub target: SocketAddr,
    /// Round trips timed.
    pub round_trips: u64,
    pub rr_p50_us: f64,
    pub rr_p99_us: f64,
    /// Bytes the server received from the stream.
    pub bytes: u64,
    /// From the first write to the server's count (all bytes arrived).
    pub stream_seconds: f64,
    /// Megabytes (10^6 bytes) per second.
    pub throughput_mb_s: f64,
}

fn connect(target: SocketAddr, io_timeout: Duration) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&target, io_timeout)?;
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A connection in ping-pong mode: one byte out, the same byte back.
pub struct PingPong {
    stream: TcpStream,
    value: u8,
}

impl PingPong {
    /// One round trip.
    pub fn round_trip(&mut self) -> io::Result<()> {
        self.value = self.value.wrapping_add(1);
        self.stream.write_all(&[self.value])?;
        let mut byte = [0u8; 1];
        self.stream.read_exact(&mut byte)?;
        if byte[0] != self.value {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("reply {} to {}", byte[0], self.value),
            ));
        }
        Ok(())
    }
}

/// Opens a connection to `target` and asks for ping-pong.
pub fn open_ping_pong(target: SocketAddr, io_timeout: Duration) -> io::Result<PingPong> {
    let mut stream = connect(target, io_timeout)?;
    stream.write_all(&[PING])?;
    Ok(PingPong { stream, value: 0 })
}

/// Ping-pong on one connection: `warmup` untimed, then `duration` of timed round trips.
/// Returns the sorted round-trip times in nanoseconds.
pub fn ping_pong(
    target: SocketAddr,
    warmup: Duration,
    duration: Duration,
    io_timeout: Duration,
) -> io::Result<Vec<u32>> {
    let mut conn = open_ping_pong(target, io_timeout)?;
    let end = Instant::now() + warmup;
    while Instant::now() < end {
        conn.round_trip()?;
    }
    // Room for a long run up front: no reallocation inside the timed loop.
    let mut times = Vec::with_capacity(1 << 20);
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let started = Instant::now();
        conn.round_trip()?;
        times.push(u32::try_from(started.elapsed().as_nanos()).unwrap_or(u32::MAX));
    }
    times.sort_unstable();
    Ok(times)
}

/// Writes for `duration`, then waits for the server's count of what it received. Returns
/// (bytes, seconds from the first write to the count's arrival).
pub fn bulk(
    target: SocketAddr,
    duration: Duration,
    io_timeout: Duration,
) -> io::Result<(u64, f64)> {
    let mut stream = connect(target, io_timeout)?;
    stream.write_all(&[SINK])?;
    let chunk = vec![0x5au8; CHUNK];
    let started = Instant::now();
    let end = started + duration;
    while Instant::now() < end {
        stream.write_all(&chunk)?;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut count = [0u8; 8];
    stream.read_exact(&mut count)?;
    Ok((u64::from_be_bytes(count), started.elapsed().as_secs_f64()))
}

/// Both measurements against `target`, `duration` each.
pub fn run_stream_client(
    target: SocketAddr,
    warmup: Duration,
    duration: Duration,
) -> io::Result<StreamReport> {
    let io_timeout = Duration::from_secs(2);
    let times = ping_pong(target, warmup, duration, io_timeout)?;
    let us = |ns: Option<u32>| ns.map_or(0.0, |ns| f64::from(ns) / 1000.0);
    // A short stream first, untimed: slow start and buffer autotuning happen there.
    bulk(target, warmup.min(Duration::from_millis(200)), io_timeout)?;
    let (bytes, seconds) = bulk(target, duration, io_timeout)?;
    Ok(StreamReport {
        target,
        round_trips: times.len() as u64,
        rr_p50_us: us(percentile(&times, 50.0)),
        rr_p99_us: us(percentile(&times, 99.0)),
        bytes,
        stream_seconds: seconds,
        throughput_mb_s: if seconds > 0.0 {
            bytes as f64 / seconds / 1e6
        } else {
            0.0
        },
    })
}

/// One connection: ping-pong until the peer closes, or read to the end and answer with
/// the byte count.
fn answer(stream: &mut TcpStream) -> io::Result<()> {
    let mut kind = [0u8; 1];
    stream.read_exact(&mut kind)?;
    match kind[0] {
        PING => {
            let mut byte = [0u8; 1];
            loop {
                match stream.read(&mut byte)? {
                    0 => return Ok(()),
                    _ => stream.write_all(&byte)?,
                }
            }
        }
        SINK => {
            let mut buf = vec![0u8; CHUNK];
            let mut total = 0u64;
            loop {
                match stream.read(&mut buf)? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            stream.write_all(&total.to_be_bytes())
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown request kind {other}"),
        )),
    }
}

/// Answers connections until the listener fails, each on a thread of its own: a client
/// alternating between two routes holds two ping-pong connections open at once, and both
/// may reach this backend. A connection's own failure (the peer reset it, a timeout) ends
/// only that connection.
pub fn serve_stream(listener: &TcpListener, io_timeout: Duration) -> io::Result<()> {
    loop {
        let (mut stream, _) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(err) if err.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(err) => return Err(err),
        };
        let _ = stream.set_read_timeout(Some(io_timeout));
        let _ = stream.set_write_timeout(Some(io_timeout));
        let _ = stream.set_nodelay(true);
        std::thread::spawn(move || answer(&mut stream));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_pong_and_stream_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve_stream(&listener, Duration::from_secs(2)));
        let report =
            run_stream_client(addr, Duration::from_millis(20), Duration::from_millis(100)).unwrap();
        assert_eq!(report.target, addr);
        assert!(report.round_trips > 10, "{report:?}");
        assert!(report.rr_p50_us > 0.0 && report.rr_p50_us <= report.rr_p99_us);
        assert!(report.bytes >= CHUNK as u64, "{report:?}");
        assert!(report.stream_seconds >= 0.1 && report.throughput_mb_s > 0.0);
    }
}
