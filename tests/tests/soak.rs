// SPDX-License-Identifier: Apache-2.0
//! Soak: endpoint churn under continuous client traffic, with the real agent.
//!
//! Four ClusterIP TCP services each draw their endpoints from a pool of four pod
//! addresses, every one of which always has a listening backend. A churn loop scales
//! services up and down and rolls endpoints over (the new one ready, the old one
//! terminating: `ready: false, serving: true, terminating: true` for a few events, then
//! gone), never leaving a service without a ready endpoint, and waits for the agent's
//! sync after each change. Meanwhile a client pod opens a new connection to every
//! service every 50 ms and keeps one long-lived connection per service talking.
//!
//! Judged: no new connection fails (refused, timeout, wrong echo), none reaches an
//! endpoint that was not ready in any state the dataplane could have held while it was
//! made, every long-lived connection keeps working with its first backend, and the
//! agent's memory and open descriptors stay flat.
//!
//! `KPE_SOAK_SECONDS` sets the churn duration (default 20 s, so the suite runs it on
//! every pass and it cannot rot); the full soak is `KPE_SOAK_SECONDS=600`.
//! `KPE_SOAK_SEED` picks another churn sequence (the seed is printed).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{Value, json};
use tests::{
    node_harness::{TestNode, scenario_header},
    require_root,
    scenario::{
        Mode,
        agent::Agent,
        netns::{self, bind_tcp_listener_in, in_netns},
        topology::Topology,
    },
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");
const NODE: &str = "test-node";
const CLIENT: &str = "10.0.0.2";
const SERVICES: usize = 4;
const POOL: usize = 4;
const BACKEND_PORT: u16 = 9000;
/// One churn event per tick at most (each also waits for the agent's sync).
const TICK: Duration = Duration::from_millis(500);
/// A new connection to each service this often.
const CONNECT_INTERVAL: &str = "0.05";
/// The agent's resident memory may grow by this much from the end of warm-up to the end
/// of the run. The object set is bounded (4 services, at most 16 endpoints), so a
/// healthy agent's memory settles after warm-up and only allocator noise stays (the
/// runs so far read the same VmRSS, to 0.1 MiB, from warm-up to the end). 10 MiB is a
/// quarter of the agent's ~35-42 MiB: over the full soak's ~600 events it catches a leak
/// of 17 KiB or more per event (a kept object snapshot, a map update's buffers); the
/// late-growth bound below catches slower steady growth.
const RSS_GROWTH_LIMIT_KIB: u64 = 10 * 1024;
/// Between the medians of the second and the last quarter of the samples: memory that
/// still grows after the first half is growing for good.
const RSS_LATE_GROWTH_LIMIT_KIB: u64 = 2 * 1024;

fn vip(service: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(172, 30, 0, 60 + service as u8))
}

fn backend(service: usize, slot: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 180, service as u8, slot as u8 + 1))
}

fn soak_seconds() -> u64 {
    std::env::var("KPE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// An xorshift generator: the churn sequence is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Condition {
    Ready,
    /// Removed at the churn event of this number.
    Terminating {
        until: u64,
    },
}

#[derive(Default, Debug)]
struct Counts {
    scale_up: u64,
    scale_down: u64,
    roll: u64,
    retired: u64,
}

/// Every service's endpoints, by pool slot.
struct Churn {
    services: Vec<BTreeMap<usize, Condition>>,
    rng: Rng,
    counts: Counts,
}

impl Churn {
    fn new(seed: u64) -> Self {
        let initial = BTreeMap::from([(0, Condition::Ready), (1, Condition::Ready)]);
        Churn {
            services: vec![initial; SERVICES],
            rng: Rng(seed | 1),
            counts: Counts::default(),
        }
    }

    /// Event `n`: terminating endpoints whose time is up leave, and one service scales
    /// up, scales down or rolls one endpoint over. False when nothing changed.
    fn step(&mut self, n: u64) -> bool {
        let mut changed = false;
        for endpoints in &mut self.services {
            let before = endpoints.len();
            endpoints.retain(|_, c| !matches!(c, Condition::Terminating { until } if *until <= n));
            self.counts.retired += (before - endpoints.len()) as u64;
            changed |= before != endpoints.len();
        }
        let service = self.rng.below(SERVICES);
        let endpoints = &mut self.services[service];
        let free: Vec<usize> = (0..POOL).filter(|s| !endpoints.contains_key(s)).collect();
        let ready: Vec<usize> = endpoints
            .iter()
            .filter(|(_, c)| **c == Condition::Ready)
            .map(|(s, _)| *s)
            .collect();
        let mut actions = Vec::new();
        if !free.is_empty() {
            actions.extend(["up", "roll"]);
        }
        if ready.len() >= 2 {
            actions.push("down");
        }
        if actions.is_empty() {
            return changed;
        }
        match self.rng.pick(&actions) {
            "up" => {
                endpoints.insert(self.rng.pick(&free), Condition::Ready);
                self.counts.scale_up += 1;
            }
            "down" => {
                endpoints.remove(&self.rng.pick(&ready));
                self.counts.scale_down += 1;
            }
            _ => {
                let until = n + 2 + self.rng.below(3) as u64;
                endpoints.insert(self.rng.pick(&ready), Condition::Terminating { until });
                endpoints.insert(self.rng.pick(&free), Condition::Ready);
                self.counts.roll += 1;
            }
        }
        true
    }

    fn ready(&self) -> Vec<BTreeSet<IpAddr>> {
        self.services
            .iter()
            .enumerate()
            .map(|(service, endpoints)| {
                endpoints
                    .iter()
                    .filter(|(_, c)| **c == Condition::Ready)
                    .map(|(slot, _)| backend(service, *slot))
                    .collect()
            })
            .collect()
    }

    fn objects(&self) -> Vec<Value> {
        let mut objects = vec![json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE},
            "spec": {"podCIDRs": ["10.0.0.0/8"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]},
        })];
        for (service, endpoints) in self.services.iter().enumerate() {
            let name = format!("soak{service}");
            let vip = vip(service).to_string();
            objects.push(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "ns1"},
                "spec": {"clusterIP": vip, "clusterIPs": [vip], "ports": [
                    {"name": "p", "port": 80, "protocol": "TCP", "targetPort": BACKEND_PORT}]},
            }));
            let endpoints: Vec<Value> = endpoints
                .iter()
                .map(|(slot, condition)| {
                    let ready = *condition == Condition::Ready;
                    json!({
                        "addresses": [backend(service, *slot).to_string()],
                        "nodeName": NODE,
                        "conditions": {"ready": ready, "serving": true, "terminating": !ready},
                    })
                })
                .collect();
            objects.push(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-1"), "namespace": "ns1",
                    "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "p", "port": BACKEND_PORT, "protocol": "TCP"}],
            }));
        }
        objects
    }
}

/// One state the cluster held: applied at `started`, the agent synced by `synced`
/// (seconds since the epoch), with these ready endpoints per service.
struct Applied {
    started: f64,
    synced: f64,
    ready: Vec<BTreeSet<IpAddr>>,
}

/// The endpoints a new connection made between `t0` and `t1` may legitimately reach:
/// the ready ones of every state the dataplane could have held meanwhile (a state from
/// its write until the next one's sync).
fn allowed(timeline: &[Applied], service: usize, t0: f64, t1: f64) -> BTreeSet<IpAddr> {
    let mut set = BTreeSet::new();
    for (k, state) in timeline.iter().enumerate() {
        let until = timeline
            .get(k + 1)
            .map_or(f64::INFINITY, |next| next.synced);
        if state.started <= t1 && until >= t0 {
            set.extend(state.ready[service].iter().copied());
        }
    }
    set
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The node: the flows only place the client and every pool address in a pod.
fn node(mode: Mode, churn: &Churn) -> TestNode {
    let flows: String = (0..SERVICES)
        .map(|service| {
            let pool: Vec<String> = (0..POOL)
                .map(|slot| format!("\"{}:{BACKEND_PORT}\"", backend(service, slot)))
                .collect();
            format!(
                "- {{from: {CLIENT}, to: \"{}:80\", expect: [{}]}}\n",
                vip(service),
                pool.join(", ")
            )
        })
        .collect();
    let objects = serde_yaml::to_string(&churn.objects()).unwrap();
    TestNode::build(
        &format!("soak-{mode}"),
        &scenario_header("soak", NODE),
        &objects,
        &flows,
    )
    .unwrap()
}

/// Line-echo backends on every pool address: each line comes back with the backend's
/// address in front. They run as threads of this process in the pods' namespaces.
struct Backends {
    stop: Arc<AtomicBool>,
    listeners: Vec<(String, SocketAddr, JoinHandle<()>)>,
}

impl Backends {
    fn start(topology: &Topology) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut listeners = Vec::new();
        for service in 0..SERVICES {
            for slot in 0..POOL {
                let ip = backend(service, slot);
                let index = topology.placement.pod_index(ip).unwrap();
                let ns = topology.pod_ns(index);
                let addr = SocketAddr::new(ip, BACKEND_PORT);
                let listener = bind_tcp_listener_in(&ns, addr).unwrap();
                let stop = stop.clone();
                let accept = thread::spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Ok(stream) = stream {
                            thread::spawn(move || echo(stream));
                        }
                    }
                });
                listeners.push((ns, addr, accept));
            }
        }
        Backends { stop, listeners }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for (ns, addr, accept) in self.listeners {
            // Wakes the accept loop so that it sees the flag.
            let _ = in_netns(&ns, move || TcpStream::connect(addr));
            let _ = accept.join();
        }
    }
}

fn echo(stream: TcpStream) {
    let Ok(own) = stream.local_addr() else { return };
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        if writeln!(out, "{own} {line}").is_err() {
            return;
        }
    }
}

/// The client: per service a thread opening a new connection every interval and one
/// long-lived connection exchanging a line every 200 ms. Prints `ready` once the
/// long-lived ones are up, then one line per new connection (`ok SERVICE T0 T1 BACKEND`
/// or `err SERVICE T0 T1 WHY`), and per long-lived one `stream_ok SERVICE BACKEND N
/// MAXGAP` or `stream_err SERVICE WHY`.
const CLIENT_SCRIPT: &str = r#"
import socket, sys, threading, time
duration, interval = float(sys.argv[1]), float(sys.argv[2])
vips = sys.argv[3:]
lock = threading.Lock()
def say(*words):
    with lock:
        print(*words, flush=True)
def exchange(f, n):
    f.write(b"%d\n" % n)
    words = f.readline().decode().split()
    if len(words) != 2 or words[1] != str(n):
        raise Exception("bad answer %r" % words)
    return words[0].rsplit(":", 1)[0]
def one_shots(i, vip, end):
    n = 0
    while time.time() < end:
        n += 1
        t0 = time.time()
        try:
            with socket.create_connection((vip, 80), timeout=2) as s:
                peer = exchange(s.makefile("rwb", buffering=0), n)
            say("ok", i, "%.6f" % t0, "%.6f" % time.time(), peer)
        except Exception as e:
            say("err", i, "%.6f" % t0, "%.6f" % time.time(), repr(e).replace(" ", "_"))
        time.sleep(max(0.0, interval - (time.time() - t0)))
def stream(i, s, f, end):
    n, first, last, gap = 0, None, time.time(), 0.0
    try:
        while time.time() < end:
            n += 1
            peer = exchange(f, n)
            first = first or peer
            if peer != first:
                raise Exception("moved from %s to %s" % (first, peer))
            now = time.time()
            gap, last = max(gap, now - last), now
            time.sleep(0.2)
        say("stream_ok", i, first, n, "%.3f" % gap)
    except Exception as e:
        say("stream_err", i, repr(e).replace(" ", "_"))
streams = []
for i, vip in enumerate(vips):
    s = socket.create_connection((vip, 80), timeout=2)
    streams.append((i, s, s.makefile("rwb", buffering=0)))
end = time.time() + duration
threads = [threading.Thread(target=stream, args=(i, s, f, end)) for i, s, f in streams]
threads += [threading.Thread(target=one_shots, args=(i, v, end)) for i, v in enumerate(vips)]
say("ready")
for t in threads: t.start()
for t in threads: t.join()
"#;

fn start_client(topology: &Topology, duration: Duration) -> (Child, JoinHandle<Vec<String>>) {
    let place = topology.client_place(CLIENT.parse().unwrap());
    let mut args = vec![
        "-c".to_string(),
        CLIENT_SCRIPT.to_string(),
        format!("{}", duration.as_secs_f64()),
        CONNECT_INTERVAL.to_string(),
    ];
    args.extend((0..SERVICES).map(|s| vip(s).to_string()));
    let mut child = place
        .command(Path::new("python3"), &args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, "ready", "the long-lived connections are up");
    let reader = thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .inspect(|line| {
                if line.contains("err") {
                    eprintln!("client: {line}");
                }
            })
            .collect()
    });
    (child, reader)
}

/// The agent's resident memory (KiB) and open descriptors.
#[derive(Clone, Copy, Debug)]
struct Usage {
    at: f64,
    rss_kib: u64,
    fds: usize,
}

/// The agent is the `proxy-agent` process in the node's cgroup whose parent is not one:
/// a command it is starting (iptables-restore) bears its name until it execs.
fn agent_pid(topology: &Topology) -> i32 {
    let named: Vec<i32> = netns::cgroup_pids(&topology.cgroup)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "proxy-agent")
        })
        .collect();
    let parent = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse::<i32>().ok())
            })
    };
    let agents: Vec<i32> = named
        .iter()
        .copied()
        .filter(|pid| parent(pid).is_none_or(|p| !named.contains(&p)))
        .collect();
    assert_eq!(agents.len(), 1, "one agent in the node cgroup: {named:?}");
    agents[0]
}

fn usage(pid: i32, since: Instant) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    Usage {
        at: since.elapsed().as_secs_f64(),
        rss_kib,
        fds,
    }
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebpf_endpoint_churn_under_traffic_fails_no_connection_and_keeps_memory_flat() {
    require_root!();
    soak(Mode::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iptables_endpoint_churn_under_traffic_fails_no_connection_and_keeps_memory_flat() {
    require_root!();
    soak(Mode::Iptables).await;
}

/// Applies the churn's current state and waits for the agent's sync.
async fn apply(node: &mut TestNode, agent: &mut Agent, churn: &Churn) -> Applied {
    let started = SystemTime::now();
    node.apply_and_sync(agent, &churn.objects()).await.unwrap();
    Applied {
        started: epoch(started),
        synced: epoch(SystemTime::now()),
        ready: churn.ready(),
    }
}

async fn soak(mode: Mode) {
    let binary = TestNode::agent_binary();
    assert!(binary.exists(), "{} is not built", binary.display());
    let duration = Duration::from_secs(soak_seconds());
    let seed = std::env::var("KPE_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026);
    let warm_up = (duration / 10).clamp(Duration::from_secs(3), Duration::from_secs(60));
    let sample_every = (duration / 60).max(Duration::from_secs(1));
    println!(
        "soak {mode}: {} s of churn, seed {seed}",
        duration.as_secs()
    );

    let mut churn = Churn::new(seed);
    let mut node = node(mode, &churn);
    let backends = Backends::start(&node.topology);
    let before_agent = SystemTime::now();
    let mut agent = node
        .start_agent(mode, Default::default(), false, Path::new(RUNNER))
        .await
        .unwrap();
    let mut timeline = vec![Applied {
        started: epoch(before_agent),
        synced: epoch(SystemTime::now()),
        ready: churn.ready(),
    }];
    let pid = agent_pid(&node.topology);

    let (mut client, reader) = start_client(&node.topology, duration + Duration::from_secs(1));
    let began = Instant::now();
    let mut samples: Vec<Usage> = Vec::new();
    let mut next_sample = warm_up;
    let mut events = 0u64;
    while began.elapsed() < duration {
        let tick = Instant::now();
        if churn.step(events) {
            timeline.push(apply(&mut node, &mut agent, &churn).await);
            assert!(
                churn.ready().iter().all(|r| !r.is_empty()),
                "every service keeps a ready endpoint"
            );
        }
        events += 1;
        if began.elapsed() >= next_sample {
            samples.push(usage(pid, began));
            next_sample += sample_every;
        }
        tokio::time::sleep(TICK.saturating_sub(tick.elapsed())).await;
    }
    samples.push(usage(pid, began));
    let churned_for = began.elapsed();

    let status = client.wait().unwrap();
    let lines = reader.join().unwrap();
    backends.stop();
    assert!(status.success(), "client: {status}");

    // New connections.
    let (mut ok, mut failed, mut misrouted, mut slow) = (0u64, Vec::new(), Vec::new(), 0u64);
    let mut max_latency = 0.0f64;
    let mut streams = Vec::new();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "ok" => {
                let service: usize = words[1].parse().unwrap();
                let (t0, t1): (f64, f64) = (words[2].parse().unwrap(), words[3].parse().unwrap());
                let peer: IpAddr = words[4].parse().unwrap();
                max_latency = max_latency.max(t1 - t0);
                slow += u64::from(t1 - t0 > 0.5);
                if allowed(&timeline, service, t0, t1).contains(&peer) {
                    ok += 1;
                } else {
                    misrouted.push(line.clone());
                }
            }
            "err" => failed.push(line.clone()),
            "stream_ok" | "stream_err" => streams.push(line.clone()),
            other => panic!("unexpected client line {other:?}: {line}"),
        }
    }
    let exchanges: u64 = streams
        .iter()
        .filter(|l| l.starts_with("stream_ok"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    let stream_gap = streams
        .iter()
        .filter(|l| l.starts_with("stream_ok"))
        .map(|l| l.split_whitespace().nth(4).unwrap().parse::<f64>().unwrap())
        .fold(0.0, f64::max);

    let kib = |k: u64| k as f64 / 1024.0;
    let (start, end) = (samples[0], *samples.last().unwrap());
    let max_rss = samples.iter().map(|s| s.rss_kib).max().unwrap();
    println!(
        "agent usage samples (s: RSS MiB/fds): {}",
        samples
            .iter()
            .map(|s| format!("{:.0}: {:.1}/{}", s.at, kib(s.rss_kib), s.fds))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let c = &churn.counts;
    println!(
        "SOAK {mode}: {:.0} s, {} churn events (scale-up {}, scale-down {}, roll-over {}, \
         terminating removed {}); new connections ok {ok}, failed {}, misrouted {} \
         (slowest {:.3} s, {slow} over 0.5 s); long-lived {}/{SERVICES} ok, {exchanges} \
         exchanges, longest gap {stream_gap:.3} s; agent RSS start {:.1} MiB, end {:.1} MiB, \
         max {:.1} MiB; fds start {}, end {}",
        churned_for.as_secs_f64(),
        timeline.len() - 1,
        c.scale_up,
        c.scale_down,
        c.roll,
        c.retired,
        failed.len(),
        misrouted.len(),
        max_latency,
        streams
            .iter()
            .filter(|l| l.starts_with("stream_ok"))
            .count(),
        kib(start.rss_kib),
        kib(end.rss_kib),
        kib(max_rss),
        start.fds,
        end.fds,
    );

    assert!(failed.is_empty(), "failed connections: {failed:#?}");
    assert!(
        misrouted.is_empty(),
        "new connections to endpoints that were not ready: {misrouted:#?}"
    );
    let expected = (duration.as_secs_f64() / 0.05) as u64 * SERVICES as u64;
    assert!(
        ok > expected / 2,
        "traffic ran the whole time: {ok} of ~{expected}"
    );
    assert_eq!(
        streams
            .iter()
            .filter(|l| l.starts_with("stream_ok"))
            .count(),
        SERVICES,
        "long-lived connections: {streams:#?}"
    );
    assert!(stream_gap < 1.0, "long-lived stall of {stream_gap:.3} s");
    assert!(
        end.rss_kib <= start.rss_kib + RSS_GROWTH_LIMIT_KIB,
        "agent RSS grew from {} to {} KiB",
        start.rss_kib,
        end.rss_kib
    );
    if samples.len() >= 8 {
        let quarter = samples.len() / 4;
        let rss: Vec<u64> = samples.iter().map(|s| s.rss_kib).collect();
        let (second, last) = (
            median(&rss[quarter..2 * quarter]),
            median(&rss[rss.len() - quarter..]),
        );
        assert!(
            last <= second + RSS_LATE_GROWTH_LIMIT_KIB,
            "agent RSS still growing: median {second} KiB in the second quarter, {last} KiB in the last"
        );
    }
    assert!(
        end.fds <= start.fds + 4,
        "agent descriptors grew from {} to {}",
        start.fds,
        end.fds
    );
    assert!(
        agent
            .log_tail(400)
            .lines()
            .all(|l| tests::scenario::agent::klog_severity(l) != Some('E')),
        "agent errors:\n{}",
        agent.log_tail(40)
    );
    drop(agent);
    drop(node);
}
