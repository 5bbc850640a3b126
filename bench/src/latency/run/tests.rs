// SPDX-License-Identifier: Apache-2.0
use std::{
    io::{Read, Write},
    net::TcpListener,
    sync::mpsc,
};

use super::*;
use crate::latency::node::agent_fragment;
use crate::latency::prober::{Command, probe_loop};

#[test]
fn fragment_sizes_the_maps_for_fillers_and_changes() {
    let opts = LatencyOptions::full("a".into(), "l".into(), LatencyMode::Ebpf);
    assert_eq!(opts.total_changes(), 6000);
    let fragment = agent_fragment(&opts);
    assert_eq!(fragment["ebpf"]["mapSizes"]["services"], 131_072);
    assert_eq!(fragment["iptables"]["minSyncPeriod"], "1ms");
    assert_eq!(fragment["iptables"]["syncPeriod"], "1h");
    let big = LatencyOptions {
        services: 50_000,
        ..opts
    };
    assert_eq!(
        agent_fragment(&big)["ebpf"]["mapSizes"]["services"],
        524_288
    );
    assert_eq!(
        LatencyMode::parse("iptables-legacy"),
        Some(LatencyMode::IptablesLegacy)
    );
}

/// Runs the probe loop in this process over `commands` for `window`, then closes them.
fn probe_for(commands: Vec<Command>, window: Duration) -> Vec<Report> {
    let (tx, rx) = mpsc::channel();
    for command in commands {
        tx.send(command).unwrap();
    }
    let closer = thread::spawn(move || {
        thread::sleep(window);
        drop(tx);
    });
    let mut out = Vec::new();
    probe_loop(&rx, &mut out, window / 2, 10_000).unwrap();
    closer.join().unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| parse_report(l).unwrap())
        .collect()
}

/// The prober counts an attempt only when the byte it sent comes back: a port nobody
/// listens on, a listener that accepts and closes, and one that answers another byte are
/// no success (the control frontend sees 0 successes); an echo is.
#[test]
fn prober_counts_only_the_echo() {
    let closed_port = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = closed_port.local_addr().unwrap();
    drop(closed_port);
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let mute_addr = mute.local_addr().unwrap();
    let wrong = TcpListener::bind("127.0.0.1:0").unwrap();
    let wrong_addr = wrong.local_addr().unwrap();
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo_addr = echo.local_addr().unwrap();
    for (listener, answer) in [(mute, None), (wrong, Some(0xEE_u8)), (echo, Some(0))] {
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut byte = [0u8; 1];
                if stream.read_exact(&mut byte).is_err() {
                    continue;
                }
                match answer {
                    None => {}
                    Some(0) => drop(stream.write_all(&byte)),
                    Some(other) => drop(stream.write_all(&[other])),
                }
            }
        });
    }
    let reports = probe_for(
        vec![
            Command::Control { addr: refused },
            Command::Probe {
                id: 1,
                addr: refused,
            },
            Command::Probe {
                id: 2,
                addr: mute_addr,
            },
            Command::Probe {
                id: 3,
                addr: wrong_addr,
            },
            Command::Probe {
                id: 4,
                addr: echo_addr,
            },
        ],
        Duration::from_millis(600),
    );
    let ok: Vec<u64> = reports
        .iter()
        .filter_map(|r| match r {
            Report::Ok { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(ok, [4], "{reports:?}");
    let mut failed: Vec<u64> = reports
        .iter()
        .filter_map(|r| match r {
            Report::Fail { id, attempts } => {
                assert!(*attempts > 10, "{reports:?}");
                Some(*id)
            }
            _ => None,
        })
        .collect();
    failed.sort_unstable();
    assert_eq!(failed, [1, 2, 3], "{reports:?}");
    let Some(Report::End {
        control_attempts,
        control_successes,
        longest_interval_us,
    }) = reports.last()
    else {
        panic!("no end line: {reports:?}");
    };
    assert!(*control_attempts > 10, "{reports:?}");
    assert_eq!(*control_successes, 0);
    assert_eq!(*longest_interval_us, 1000);
}

#[test]
fn many_pending_frontends_share_the_connect_budget() {
    use crate::latency::prober::probe_interval;
    assert_eq!(probe_interval(1, 10_000), Duration::from_millis(1));
    assert_eq!(probe_interval(10, 10_000), Duration::from_millis(1));
    assert_eq!(probe_interval(100, 10_000), Duration::from_millis(10));
    assert_eq!(probe_interval(500, 10_000), Duration::from_millis(50));
    assert_eq!(probe_interval(500, 2_000), Duration::from_millis(250));
    assert_eq!(probe_interval(1, 0), Duration::from_secs(1));
}

/// The quick slice, as the test suite runs it: changes are made and programmed, none
/// fails, the never-created control frontend never answers, nothing is left behind.
/// Speed is not judged. Needs root, the eBPF object and the built binaries; without them
/// it skips, unless PROXY_REQUIRE_EBPF=1 says they must be there.
#[test]
fn quick_latency_bench_programs_every_change_and_cleans_up() {
    let Some(crate::quick::Built { agent, loadgen }) = crate::quick::prerequisites("latency")
    else {
        return;
    };
    let mut opts = LatencyOptions::quick(agent, loadgen, LatencyMode::Ebpf);
    opts.verbose = false;
    let results = run_latency(&opts).expect("quick latency bench");
    assert_eq!(results.changes, 100, "{}", results.table());
    assert_eq!(results.programmed(), 100, "{}", results.table());
    assert_eq!(results.failed, 0, "{}", results.table());
    assert!(
        results.latencies_ms.iter().all(|l| *l > 0.0),
        "{}",
        results.table()
    );
    assert!(results.control_attempts > 0, "{}", results.table());
    assert_eq!(results.false_successes, 0, "{}", results.table());
    assert_eq!(results.csv_rows().len(), results.metrics().len());
    assert_eq!(net::owner_pid(&results.run_id), Some(std::process::id()));
    let left = net::leftovers(&results.run_id).unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}
