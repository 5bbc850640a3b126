// SPDX-License-Identifier: Apache-2.0
//! One client process measuring two routes to the same backends in alternating slices
//! (ABBA: A B | B A | A B ...), so both see the same machine: the mode's route (the
//! ClusterIP) and the direct route (the backends' own addresses) from the same client pod.
//!
//! The connection load has the shape of the suite's anchor: several client threads (4 in
//! the full suite), each opening one connection at a time (connect, 1-byte request and
//! reply, close), spread over several backends (4). The slices follow one wall-clock
//! schedule shared by all threads, so every thread switches route at the same moment and
//! each route gets exactly half of the measured time. A connection belongs to the slice it
//! started in.
//!
//! The established-connection load alternates too: ping-pong on two connections (one per
//! route) in slices, then bulk streams in A B B A order.

use std::{
    io,
    net::SocketAddr,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use socket2::SockAddr;

use crate::{
    load::{ClientReport, slice_target, summarize},
    stats::percentile,
};

use super::stream::{StreamReport, bulk, open_ping_pong};

/// What one `abba-client` run does.
#[derive(Debug, Clone)]
pub struct AbbaOptions {
    /// The routes, each a list of addresses its connections go to in turn.
    pub routes: Vec<Vec<SocketAddr>>,
    /// Measured time per route.
    pub duration: Duration,
    pub slice: Duration,
    /// Unrecorded connections before the schedule starts, alternating too.
    pub warmup: Duration,
    pub threads: usize,
    pub io_timeout: Duration,
    /// A thread stops after this many failed connections (of all routes).
    pub max_errors: u64,
}

/// The connection-rate part of a report, and the established-connection part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbbaReport {
    /// One per route, in the order given.
    pub conn: Vec<ClientReport>,
    /// One per route, when the run included the stream part.
    pub stream: Vec<StreamReport>,
}

/// The slices of a schedule giving each of `routes` routes `duration`.
pub fn slice_count(duration: Duration, slice: Duration, routes: usize) -> usize {
    let per_route = duration.as_nanos().div_ceil(slice.as_nanos().max(1));
    usize::try_from(per_route)
        .unwrap_or(usize::MAX)
        .saturating_mul(routes)
}

/// What one thread saw of each route.
#[derive(Debug, Default)]
struct ThreadTally {
    latencies_ns: Vec<Vec<u32>>,
    errors: Vec<u64>,
    first_error: Vec<Option<String>>,
}

fn one(target: &SockAddr, io_timeout: Duration, byte: u8) -> io::Result<Duration> {
    crate::load::one_connection(target, io_timeout, byte)
}

/// One thread's part of the schedule.
fn thread_loop(
    opts: &AbbaOptions,
    index: usize,
    start: Instant,
    slices: usize,
    slice: Duration,
) -> ThreadTally {
    let routes: Vec<Vec<SockAddr>> = opts
        .routes
        .iter()
        .map(|r| r.iter().copied().map(SockAddr::from).collect())
        .collect();
    let n = routes.len();
    let mut tally = ThreadTally {
        latencies_ns: (0..n).map(|_| Vec::with_capacity(1 << 18)).collect(),
        errors: vec![0; n],
        first_error: vec![None; n],
    };
    // Threads start on different backends, so that 4 threads and 4 backends keep every
    // backend busy in both routes.
    let mut turn = index;
    let mut byte = u8::try_from(index % 251).unwrap_or(0);
    let mut total_errors = 0u64;
    // One connection of `route`; false when it failed.
    let mut next = |route: usize, record: bool, tally: &mut ThreadTally| -> bool {
        let addrs = &routes[route];
        if addrs.is_empty() {
            return false;
        }
        let target = &addrs[turn % addrs.len()];
        turn = turn.wrapping_add(1);
        byte = byte.wrapping_add(1);
        match one(target, opts.io_timeout, byte) {
            Ok(took) => {
                if record {
                    tally.latencies_ns[route]
                        .push(u32::try_from(took.as_nanos()).unwrap_or(u32::MAX));
                }
                true
            }
            Err(err) => {
                if record {
                    tally.errors[route] += 1;
                    if tally.first_error[route].is_none() {
                        tally.first_error[route] = Some(err.to_string());
                    }
                }
                false
            }
        }
    };
    // Warm-up: the same alternation, before the schedule's start.
    let warm_slices = slice_count(opts.warmup, slice, n).max(n);
    let warm_slice = opts.warmup / u32::try_from(warm_slices).unwrap_or(u32::MAX);
    let warm_start = start.checked_sub(opts.warmup).unwrap_or(start);
    for k in 0..warm_slices {
        let end = warm_start + warm_slice * u32::try_from(k + 1).unwrap_or(u32::MAX);
        while Instant::now() < end.min(start) && total_errors < opts.max_errors {
            if !next(slice_target(k, n), false, &mut tally) {
                total_errors += 1;
            }
        }
    }
    loop {
        let now = Instant::now();
        if now < start {
            thread::sleep(start - now);
            continue;
        }
        let k = usize::try_from((now - start).as_nanos() / slice.as_nanos().max(1))
            .unwrap_or(usize::MAX);
        if k >= slices || total_errors >= opts.max_errors {
            break;
        }
        let end = start + slice * u32::try_from(k + 1).unwrap_or(u32::MAX);
        let route = slice_target(k, n);
        while Instant::now() < end && total_errors < opts.max_errors {
            if !next(route, true, &mut tally) {
                total_errors += 1;
            }
        }
    }
    tally
}

/// Runs the connection-rate schedule on `opts.threads` threads; one report per route.
pub fn run_routes(opts: &AbbaOptions) -> Vec<ClientReport> {
    let n = opts.routes.len();
    if n == 0 {
        return Vec::new();
    }
    let slice = opts.slice.max(Duration::from_millis(1));
    let slices = slice_count(opts.duration, slice, n);
    // The schedule starts once every thread is through its warm-up.
    let start = Instant::now() + opts.warmup + Duration::from_millis(5);
    let shared = Arc::new(opts.clone());
    let handles: Vec<_> = (0..opts.threads.max(1))
        .map(|index| {
            let opts = Arc::clone(&shared);
            thread::spawn(move || thread_loop(&opts, index, start, slices, slice))
        })
        .collect();
    let tallies: Vec<ThreadTally> = handles.into_iter().filter_map(|h| h.join().ok()).collect();
    // Every route had slices / n slices of the shared schedule.
    let per_route_seconds = (slice * u32::try_from(slices / n).unwrap_or(u32::MAX)).as_secs_f64();
    (0..n)
        .map(|route| {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let mut first_error = None;
            for t in &tallies {
                latencies.extend_from_slice(&t.latencies_ns[route]);
                errors += t.errors[route];
                if first_error.is_none() {
                    first_error.clone_from(&t.first_error[route]);
                }
            }
            let target = opts.routes[route]
                .first()
                .copied()
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            summarize(target, latencies, errors, first_error, per_route_seconds)
        })
        .collect()
}

/// Ping-pong on one connection per target, alternating in slices for `duration` per
/// target (after an untimed `warmup`), then bulk streams of `duration / 2` in A B B A
/// order. One report per target.
pub fn run_stream_pair(
    targets: &[SocketAddr],
    warmup: Duration,
    duration: Duration,
    slice: Duration,
    io_timeout: Duration,
) -> io::Result<Vec<StreamReport>> {
    let n = targets.len();
    let mut conns = targets
        .iter()
        .map(|t| open_ping_pong(*t, io_timeout))
        .collect::<io::Result<Vec<_>>>()?;
    for conn in &mut conns {
        let end = Instant::now() + warmup / u32::try_from(n.max(1)).unwrap_or(1);
        while Instant::now() < end {
            conn.round_trip()?;
        }
    }
    let slice = slice.max(Duration::from_millis(1));
    let mut times: Vec<Vec<u32>> = (0..n).map(|_| Vec::with_capacity(1 << 18)).collect();
    for k in 0..slice_count(duration, slice, n) {
        let which = slice_target(k, n);
        let end = Instant::now() + slice;
        while Instant::now() < end {
            let started = Instant::now();
            conns[which].round_trip()?;
            times[which].push(u32::try_from(started.elapsed().as_nanos()).unwrap_or(u32::MAX));
        }
    }
    drop(conns);
    // Streams: an untimed short one per target first (slow start, buffer autotuning).
    for t in targets {
        bulk(*t, warmup.min(Duration::from_millis(100)), io_timeout)?;
    }
    let half = duration / 2;
    let mut streamed = vec![(0u64, 0f64); n];
    for k in 0..2 * n {
        let which = slice_target(k, n);
        let (bytes, seconds) = bulk(targets[which], half, io_timeout)?;
        streamed[which].0 += bytes;
        streamed[which].1 += seconds;
    }
    let us = |ns: Option<u32>| ns.map_or(0.0, |ns| f64::from(ns) / 1000.0);
    Ok(targets
        .iter()
        .zip(times.iter_mut())
        .zip(streamed)
        .map(|((target, times), (bytes, seconds))| {
            times.sort_unstable();
            StreamReport {
                target: *target,
                round_trips: times.len() as u64,
                rr_p50_us: us(percentile(times, 50.0)),
                rr_p99_us: us(percentile(times, 99.0)),
                bytes,
                stream_seconds: seconds,
                throughput_mb_s: if seconds > 0.0 {
                    bytes as f64 / seconds / 1e6
                } else {
                    0.0
                },
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;
    use crate::{dataplane::stream::serve_stream, load::serve};

    fn listener() -> (SocketAddr, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        (listener.local_addr().unwrap(), listener)
    }

    #[test]
    fn threads_share_one_schedule_and_each_route_gets_its_time() {
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let (addr, l) = listener();
            std::thread::spawn(move || serve(&l, Duration::from_secs(2)));
            addrs.push(addr);
        }
        let opts = AbbaOptions {
            routes: vec![addrs.clone(), vec![addrs[0]]],
            duration: Duration::from_millis(200),
            slice: Duration::from_millis(20),
            warmup: Duration::from_millis(20),
            threads: 3,
            io_timeout: Duration::from_secs(2),
            max_errors: 10,
        };
        let reports = run_routes(&opts);
        assert_eq!(reports.len(), 2);
        for (report, target) in reports.iter().zip([addrs[0], addrs[0]]) {
            assert_eq!(report.target, target);
            assert_eq!(report.errors, 0, "{:?}", report.first_error);
            assert!(report.connections > 10, "{report:?}");
            assert!((report.seconds - 0.2).abs() < 1e-9, "{report:?}");
        }
        assert_eq!(slice_count(Duration::from_millis(250), opts.slice, 2), 26);
    }

    #[test]
    fn stream_pair_reports_both_targets() {
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let (addr, l) = listener();
            std::thread::spawn(move || serve_stream(&l, Duration::from_secs(2)));
            addrs.push(addr);
        }
        let reports = run_stream_pair(
            &addrs,
            Duration::from_millis(20),
            Duration::from_millis(100),
            Duration::from_millis(10),
            Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(reports.len(), 2);
        for (r, t) in reports.iter().zip(&addrs) {
            assert_eq!(r.target, *t);
            assert!(
                r.round_trips > 5 && r.bytes > 0 && r.throughput_mb_s > 0.0,
                "{r:?}"
            );
        }
    }
}
