// SPDX-License-Identifier: Apache-2.0
//! Issue 4's acceptance for north-south traffic in ebpf mode, in both families: a NodePort
//! connection with externalTrafficPolicy Cluster from an external client to a backend on
//! another node. The backend sees the node's address, the client sees replies from the
//! node's address, and the flow's BPF conntrack entries carry the translation and expire.
//!
//! Built on the scenario runner's library: a dual-stack node, its uplink on a switch shared
//! with the external router and a remote node that routes the backend pod, and the real
//! agent (`target/debug/proxy-agent`, with its eBPF object) fed by the test API server.
//! Needs root and bpftool; skipped with the reason otherwise.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use proxy_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_CLOSING, CT_F_SNAT, Ct4Key, Ct6Key, CtValue,
};
use socket2::{Domain, Socket, Type};
use tests::scenario::{
    Expectation, Mode, RunOptions, Scenario, ScenarioEnv,
    agent::{AgentOptions, bpffs_root},
    format::RawScenario,
    netns::in_netns,
    outcome::AnswerKind,
    run::check_privileges,
};

const RUNNER: &str = env!("CARGO_BIN_EXE_scenario-runner");

const SCENARIO: &str = r#"
name: northsouth-remote-backend
about: NodePort with eTP=Cluster from an external client to a backend on another node
node:
  name: test-node
  addresses: [192.168.0.2/24, 'fd00:168::2/64']
  podCIDR: [10.0.0.0/8, 'fd00:10::/64']
config:
  clusterCIDR: 10.0.0.0/8,fd00:10::/64
  ebpf:
    conntrack: {udpTimeout: 6s, tcpClosingTimeout: 3s}
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: svc1, namespace: ns1}
  spec:
    type: NodePort
    clusterIP: 172.30.0.41
    clusterIPs: [172.30.0.41, 'fd00:30::41']
    ipFamilies: [IPv4, IPv6]
    ipFamilyPolicy: RequireDualStack
    ports:
    - {name: http, port: 80, protocol: TCP, targetPort: 80, nodePort: 3001}
    - {name: dns, port: 53, protocol: UDP, targetPort: 53, nodePort: 3053}
    externalTrafficPolicy: Cluster
    internalTrafficPolicy: Cluster
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-v4, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  endpoints: [{addresses: [10.180.1.1], nodeName: node2, conditions: {ready: true}}]
  ports: [{name: http, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-v6, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv6
  endpoints: [{addresses: ['fd00:10::180:1:1'], nodeName: node2, conditions: {ready: true}}]
  ports: [{name: http, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
flows:
- {from: 203.0.113.2, to: '192.168.0.2:3001', expect: ['10.180.1.1:80'], masq: true}
- {from: 203.0.113.2, to: '192.168.0.2:3053', proto: udp, expect: ['10.180.1.1:53'], masq: true}
- {from: 'fd00:203:113::2', to: '[fd00:168::2]:3001', expect: ['[fd00:10::180:1:1]:80'], masq: true}
- {from: 'fd00:203:113::2', to: '[fd00:168::2]:3053', proto: udp, expect: ['[fd00:10::180:1:1]:53'],
   masq: true}
"#;

/// The lifetime of a UDP flow's entries, and of a TCP flow's once it closes (the
/// dataplane's defaults: the agent has no setting for them yet).
/// The lifetimes the scenario's configuration sets (`ebpf.conntrack`).
const UDP_LIFETIME_S: u32 = 6;
const CLOSING_LIFETIME_S: u32 = 3;
/// How often the agent deletes expired entries.
const COLLECT_INTERVAL_S: u64 = 10;

/// One family's view of the test: its addresses and its conntrack map.
struct Family {
    client: IpAddr,
    node: IpAddr,
    backend: IpAddr,
    map: &'static str,
    key_len: usize,
}

const FAMILIES: [Family; 2] = [
    Family {
        client: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 2)),
        node: IpAddr::V4(Ipv4Addr::new(192, 168, 0, 2)),
        backend: IpAddr::V4(Ipv4Addr::new(10, 180, 1, 1)),
        map: proxy_common::maps::CT4,
        key_len: size_of::<Ct4Key>(),
    },
    Family {
        client: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x203, 0x113, 0, 0, 0, 0, 2)),
        node: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x168, 0, 0, 0, 0, 0, 2)),
        backend: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0x180, 1, 1)),
        map: proxy_common::maps::CT6,
        key_len: size_of::<Ct6Key>(),
    },
];

const TCP: u8 = 6;
const UDP: u8 = 17;
const HTTP_NODE_PORT: u16 = 3001;
const DNS_NODE_PORT: u16 = 3053;

/// One conntrack entry, decoded from the map's raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CtEntry {
    source: SocketAddr,
    destination: SocketAddr,
    proto: u8,
    dir: u8,
    frontend: SocketAddr,
    backend: SocketAddr,
    snat: SocketAddr,
    client: SocketAddr,
    flags: u8,
    /// Seconds of CLOCK_MONOTONIC_COARSE.
    expires: u32,
}

fn ip_at(bytes: &[u8], offset: usize, v4: bool) -> IpAddr {
    if v4 {
        let octets: [u8; 4] = bytes[offset..offset + 4].try_into().unwrap();
        IpAddr::from(octets)
    } else {
        let octets: [u8; 16] = bytes[offset..offset + 16].try_into().unwrap();
        IpAddr::from(octets)
    }
}

/// Ports are kept in network byte order, as in the packets.
fn port_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes(bytes[offset..offset + 2].try_into().unwrap())
}

impl CtEntry {
    fn decode(key: &[u8], value: &[u8]) -> Self {
        assert_eq!(value.len(), size_of::<CtValue>());
        let v4 = key.len() == size_of::<Ct4Key>();
        let (saddr, daddr, sport, dport, proto, dir) = if v4 {
            (
                std::mem::offset_of!(Ct4Key, saddr),
                std::mem::offset_of!(Ct4Key, daddr),
                std::mem::offset_of!(Ct4Key, sport),
                std::mem::offset_of!(Ct4Key, dport),
                std::mem::offset_of!(Ct4Key, proto),
                std::mem::offset_of!(Ct4Key, dir),
            )
        } else {
            (
                std::mem::offset_of!(Ct6Key, saddr),
                std::mem::offset_of!(Ct6Key, daddr),
                std::mem::offset_of!(Ct6Key, sport),
                std::mem::offset_of!(Ct6Key, dport),
                std::mem::offset_of!(Ct6Key, proto),
                std::mem::offset_of!(Ct6Key, dir),
            )
        };
        let socket = |addr: usize, port: usize| {
            SocketAddr::new(ip_at(value, addr, v4), port_at(value, port))
        };
        let expires = std::mem::offset_of!(CtValue, expires);
        CtEntry {
            source: SocketAddr::new(ip_at(key, saddr, v4), port_at(key, sport)),
            destination: SocketAddr::new(ip_at(key, daddr, v4), port_at(key, dport)),
            proto: key[proto],
            dir: key[dir],
            frontend: socket(
                std::mem::offset_of!(CtValue, frontend_addr),
                std::mem::offset_of!(CtValue, frontend_port),
            ),
            backend: socket(
                std::mem::offset_of!(CtValue, backend_addr),
                std::mem::offset_of!(CtValue, backend_port),
            ),
            snat: socket(
                std::mem::offset_of!(CtValue, snat_addr),
                std::mem::offset_of!(CtValue, snat_port),
            ),
            client: socket(
                std::mem::offset_of!(CtValue, client_addr),
                std::mem::offset_of!(CtValue, client_port),
            ),
            flags: value[std::mem::offset_of!(CtValue, flags)],
            // Written by the kernel on this machine: native byte order.
            expires: u32::from_ne_bytes(value[expires..expires + 4].try_into().unwrap()),
        }
    }
}

fn hex_bytes(value: &serde_json::Value) -> Vec<u8> {
    value
        .as_array()
        .expect("bpftool prints bytes as an array")
        .iter()
        .map(|b| {
            let text = b.as_str().expect("a byte as a hex string");
            u8::from_str_radix(text.trim_start_matches("0x"), 16).unwrap()
        })
        .collect()
}

/// Every entry of a pinned conntrack map (`bpftool -j map dump pinned`).
fn dump(map: &Path, key_len: usize) -> Vec<CtEntry> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(map)
        .output()
        .expect("running bpftool");
    assert!(
        out.status.success(),
        "bpftool map dump {}: {}",
        map.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    entries
        .iter()
        .map(|e| {
            let key = hex_bytes(&e["key"]);
            assert_eq!(key.len(), key_len, "{e}");
            CtEntry::decode(&key, &hex_bytes(&e["value"]))
        })
        .collect()
}

/// CLOCK_MONOTONIC_COARSE in seconds: the clock of the entries' `expires`.
fn now_s() -> u32 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).unwrap();
    u32::try_from(t.tv_sec()).unwrap()
}

/// The flow's two entries: the one its packets from the client hit, and the one the
/// backend's replies hit. Panics (with the map's contents) unless both exist.
fn flow_entries(
    entries: &[CtEntry],
    client: SocketAddr,
    frontend: SocketAddr,
    proto: u8,
) -> [CtEntry; 2] {
    let forward = entries
        .iter()
        .find(|e| {
            e.dir == CT_DIR_FORWARD
                && e.proto == proto
                && e.source == client
                && e.destination == frontend
        })
        .unwrap_or_else(|| {
            panic!("no forward entry {client} -> {frontend}/{proto} in {entries:#?}")
        })
        .clone();
    let reply = entries
        .iter()
        .find(|e| {
            e.dir == CT_DIR_REPLY
                && e.proto == proto
                && e.source == forward.backend
                && e.destination == forward.snat
        })
        .unwrap_or_else(|| panic!("no reply entry for {forward:?} in {entries:#?}"))
        .clone();
    [forward, reply]
}

fn flow_present(entries: &[CtEntry], client: SocketAddr, proto: u8) -> bool {
    entries
        .iter()
        .any(|e| e.proto == proto && (e.source == client || e.client == client))
}

/// The translation both entries must carry: client -> node:nodePort becomes node -> backend.
fn assert_translated(
    entries: &[CtEntry; 2],
    family: &Family,
    client: SocketAddr,
    node_port: u16,
    backend_port: u16,
) {
    for entry in entries {
        assert_eq!(
            entry.frontend,
            SocketAddr::new(family.node, node_port),
            "{entry:?}"
        );
        assert_eq!(
            entry.backend,
            SocketAddr::new(family.backend, backend_port),
            "{entry:?}"
        );
        assert_eq!(entry.client, client, "{entry:?}");
        assert_eq!(entry.snat.ip(), family.node, "{entry:?}");
        assert_ne!(entry.flags & CT_F_SNAT, 0, "not masqueraded: {entry:?}");
    }
}

fn agent_binary() -> Option<PathBuf> {
    let path = Path::new(RUNNER).parent()?.join("proxy-agent");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipping: no agent at {} (cargo build -p proxy-agent)",
            path.display()
        );
        None
    }
}

fn have_bpftool() -> bool {
    let ok = Command::new("bpftool")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: bpftool not found");
    }
    ok
}

/// A TCP exchange from the external namespace through a fixed source port: returns the
/// answer and the peer the client's socket is connected to.
fn tcp_exchange(ext_ns: &str, client: SocketAddr, to: SocketAddr) -> (String, SocketAddr) {
    let mut stream: TcpStream = in_netns(ext_ns, move || {
        let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
        socket.bind(&client.into())?;
        socket.connect_timeout(&to.into(), Duration::from_secs(3))?;
        Ok(TcpStream::from(socket))
    })
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    (answer, stream.peer_addr().unwrap())
}

/// A UDP request from an unconnected socket in the external namespace: the answer and
/// the address it came from, as the client's kernel saw it.
fn udp_exchange(ext_ns: &str, client: SocketAddr, to: SocketAddr) -> (String, SocketAddr) {
    let socket: UdpSocket = in_netns(ext_ns, move || UdpSocket::bind(client)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut buf = [0u8; 512];
    for _ in 0..3 {
        socket.send_to(b"GET / HTTP/1.0\r\n\r\n", to).unwrap();
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            return (String::from_utf8_lossy(&buf[..n]).into_owned(), from);
        }
    }
    panic!("no UDP answer from {to} to {client}");
}

/// A 4000-byte datagram (fragmented on the way out) that the echo server reflects (so
/// its answer is fragmented too): the answer, checked to carry the payload whole.
fn big_udp_exchange(ext_ns: &str, client: SocketAddr, to: SocketAddr) -> (String, SocketAddr) {
    let socket: UdpSocket = in_netns(ext_ns, move || UdpSocket::bind(client)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut request = tests::scenario::echo::REFLECT.to_vec();
    request.extend((0..4000u32).map(|i| b'a' + (i % 26) as u8));
    let mut buf = vec![0u8; 65536];
    for _ in 0..3 {
        socket.send_to(&request, to).unwrap();
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            let answer = &buf[..n];
            assert!(
                answer.ends_with(&request),
                "the reflected payload came back cut or changed ({n} bytes)"
            );
            return (String::from_utf8_lossy(answer).into_owned(), from);
        }
    }
    panic!("no answer to a fragmented datagram from {to} to {client}");
}

#[tokio::test(flavor = "multi_thread")]
async fn nodeport_etp_cluster_to_a_remote_backend_is_masqueraded_tracked_and_expires() {
    remote_backend_flow(None).await;
}

/// The same with XDP (generic, on the veth uplink) in front of tc: the forward packets and
/// the remote backend's answers go back out of the uplink from XDP.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_with_xdp_generic_on_the_uplink() {
    remote_backend_flow(Some("generic")).await;
}

/// The scenario and how to run it (ebpf mode, XDP as given); `None` when this machine
/// cannot run the test (the reason printed).
fn prepare(xdp_mode: Option<&str>) -> Option<(Scenario, RunOptions)> {
    if let Err(err) = check_privileges() {
        eprintln!("skipping: {err}");
        return None;
    }
    let binary = agent_binary()?;
    if !have_bpftool() {
        return None;
    }
    let raw: RawScenario = serde_yaml::from_str(SCENARIO).unwrap();
    let scenario = Scenario::from_raw(raw, Path::new("northsouth.yaml")).unwrap();
    let agent = AgentOptions {
        proxy: tests::scenario::agent::Proxy::Ours,
        binary,
        mode: Mode::Ebpf,
        // Fail rather than fall back to iptables mode.
        extra_args: vec!["--strict-mode".into()],
        config_overrides: xdp_mode
            .map(|m| {
                let mut o = serde_json::Map::new();
                o.insert("ebpf".into(), serde_json::json!({ "xdpMode": m }));
                o
            })
            .unwrap_or_default(),
        ready_timeout: Duration::from_secs(30),
    };
    let options = RunOptions::for_agent(agent, PathBuf::from(RUNNER));
    Some((scenario, options))
}

/// The scenario's node, pods and agent; `None` when the agent has no eBPF object.
async fn start<'a>(options: &'a RunOptions, scenario: &'a Scenario) -> Option<ScenarioEnv<'a>> {
    match ScenarioEnv::set_up(options, scenario, false).await {
        Ok(env) => Some(env),
        Err(err) if err.to_string().contains("carries no eBPF object") => {
            eprintln!("skipping: the agent was built without its eBPF object: {err}");
            None
        }
        Err(err) => panic!("setting up: {err}"),
    }
}

async fn remote_backend_flow(xdp_mode: Option<&str>) {
    let Some((scenario, options)) = prepare(xdp_mode) else {
        return;
    };
    let Some(mut env) = start(&options, &scenario).await else {
        return;
    };

    // The backends live behind the remote node, so the translated traffic leaves the node
    // through its uplink and the replies come back through it.
    let placement = &env.topology.placement;
    for family in &FAMILIES {
        let pod = &placement.pods[placement.pod_index(family.backend).unwrap()];
        let remote = placement
            .remote_node_of(pod)
            .expect("the backend on a remote node");
        assert_eq!(remote.name, "node2");
    }

    // Every flow as the runner replays it: the backend sees the node's address.
    let flows: Vec<_> = scenario.flows().cloned().collect();
    for flow in &flows {
        let attempts = env.probe(flow).await.unwrap();
        let Expectation::Backends(backends) = &flow.expect else {
            unreachable!()
        };
        for attempt in &attempts {
            assert_eq!(
                attempt.answer_kind,
                Some(AnswerKind::Echo),
                "{flow:?}: {attempt:?}"
            );
            assert!(backends.contains(&attempt.backend.unwrap()), "{attempt:?}");
            let node = FAMILIES
                .iter()
                .find(|f| f.client == flow.from)
                .map(|f| f.node);
            assert_eq!(attempt.seen_source, node, "{flow:?}: {attempt:?}");
        }
    }

    let pins = bpffs_root(&env.topology.id).join("maps");
    let ext_ns = env.topology.ext_ns.clone();
    let mut closed_tcp = Vec::new();
    let mut open_udp = Vec::new();
    for (n, family) in FAMILIES.iter().enumerate() {
        let map = pins.join(family.map);
        let port_base = 41000 + 10 * u16::try_from(n).unwrap();

        // UDP from an unconnected socket: the reply comes from the node's address and
        // NodePort, and says the backend saw the node's address.
        let client = SocketAddr::new(family.client, port_base);
        let node_port = SocketAddr::new(family.node, DNS_NODE_PORT);
        let (answer, from) = udp_exchange(&ext_ns, client, node_port);
        assert_eq!(from, node_port, "the reply's source as the client saw it");
        let backend = SocketAddr::new(family.backend, 53);
        assert!(
            answer.starts_with(&format!("ECHO {backend} FROM {}:", bracketed(family.node))),
            "{answer}"
        );
        let udp = flow_entries(&dump(&map, family.key_len), client, node_port, UDP);
        assert_translated(&udp, family, client, DNS_NODE_PORT, 53);
        let now = now_s();
        for entry in &udp {
            assert!(
                entry.expires >= now && entry.expires <= now + UDP_LIFETIME_S + 1,
                "UDP entry expires at {} (now {now}, lifetime {UDP_LIFETIME_S} s): {entry:?}",
                entry.expires
            );
        }
        open_udp.push((map.clone(), family.key_len, client));

        // A datagram larger than the MTU, both ways: every fragment is translated (the
        // later ones carry no ports; the first one's are remembered for them).
        let client = SocketAddr::new(family.client, port_base + 2);
        let (answer, from) = big_udp_exchange(&ext_ns, client, node_port);
        assert_eq!(from, node_port, "the fragmented reply's source");
        assert!(
            answer.starts_with(&format!("ECHO {backend} FROM {}:", bracketed(family.node))),
            "{}",
            &answer[..answer.len().min(200)]
        );

        // TCP: the connection's peer is the node's address and NodePort.
        let client = SocketAddr::new(family.client, port_base + 1);
        let node_port = SocketAddr::new(family.node, HTTP_NODE_PORT);
        let (answer, peer) = tcp_exchange(&ext_ns, client, node_port);
        assert_eq!(peer, node_port);
        let backend = SocketAddr::new(family.backend, 80);
        assert!(
            answer.starts_with(&format!("ECHO {backend} FROM {}:", bracketed(family.node))),
            "{answer}"
        );
        // Closed by both sides now: the entries are closing and live a short while only.
        let tcp = flow_entries(&dump(&map, family.key_len), client, node_port, TCP);
        assert_translated(&tcp, family, client, HTTP_NODE_PORT, 80);
        let now = now_s();
        for entry in &tcp {
            assert_ne!(
                entry.flags & CT_F_CLOSING,
                0,
                "closed but not closing: {entry:?}"
            );
            assert!(
                entry.expires <= now + CLOSING_LIFETIME_S + 1,
                "closing entry expires at {} (now {now}): {entry:?}",
                entry.expires
            );
        }
        closed_tcp.push((map, family.key_len, client));
    }

    // With XDP, the remote backend's traffic went back out of the uplink from XDP.
    let transmitted = xdp_counter(&pins, proxy_common::maps::XDP_STAT_TX);
    if xdp_mode.is_some() {
        assert!(
            transmitted >= 8,
            "XDP transmitted only {transmitted} packets of the translated flows"
        );
    } else {
        assert_eq!(transmitted, 0, "XDP is off but transmitted packets");
    }

    // The closed connections' entries expire and the agent deletes them.
    let deadline = Instant::now()
        + Duration::from_secs(u64::from(CLOSING_LIFETIME_S) + COLLECT_INTERVAL_S + 10);
    loop {
        let left: Vec<_> = closed_tcp
            .iter()
            .filter(|(map, key_len, client)| flow_present(&dump(map, *key_len), *client, TCP))
            .map(|(_, _, client)| *client)
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "conntrack entries of closed connections from {left:?} still there"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The UDP entries expire after the configured lifetime and the agent deletes them.
    let deadline =
        Instant::now() + Duration::from_secs(u64::from(UDP_LIFETIME_S) + COLLECT_INTERVAL_S + 10);
    loop {
        let left: Vec<_> = open_udp
            .iter()
            .filter(|(map, key_len, client)| flow_present(&dump(map, *key_len), *client, UDP))
            .map(|(_, _, client)| *client)
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "UDP entries from {left:?} never expired"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(env);
}

/// ICMP errors about translated flows are translated too: a remote backend that refuses
/// (port unreachable, as a REJECT rule in its namespace answers) is seen by the external
/// client as the NodePort refusing, on TCP and UDP, in both families.
#[tokio::test(flavor = "multi_thread")]
async fn icmp_errors_of_a_remote_backend_reach_the_client_translated() {
    let Some((scenario, options)) = prepare(None) else {
        return;
    };
    let Some(env) = start(&options, &scenario).await else {
        return;
    };
    let placement = &env.topology.placement;
    let ext_ns = env.topology.ext_ns.clone();
    for (n, family) in FAMILIES.iter().enumerate() {
        let pod = placement.pod_index(family.backend).unwrap();
        let pod_ns = env.topology.pod_ns(pod);
        let tables = if family.backend.is_ipv4() {
            "iptables"
        } else {
            "ip6tables"
        };
        for rule in [
            ["-p", "udp", "--dport", "53"],
            ["-p", "tcp", "--dport", "80"],
        ] {
            let status = Command::new("ip")
                .args(["netns", "exec", &pod_ns, tables, "-I", "INPUT"])
                .args(rule)
                .args(["-j", "REJECT"])
                .status()
                .unwrap();
            assert!(status.success(), "{tables} in {pod_ns}");
        }
        let port_base = 42000 + 10 * u16::try_from(n).unwrap();

        // UDP, connected: the translated port unreachable surfaces as ECONNREFUSED.
        let client = SocketAddr::new(family.client, port_base);
        let to = SocketAddr::new(family.node, DNS_NODE_PORT);
        let socket: UdpSocket = in_netns(&ext_ns, move || {
            let s = UdpSocket::bind(client)?;
            s.connect(to)?;
            Ok(s)
        })
        .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut refused = false;
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            let _ = socket.send(b"ping");
            match socket.recv(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused = true;
                    break;
                }
                Err(_) => continue,
                Ok(n) => panic!("an answer despite the REJECT: {:?}", &buf[..n]),
            }
        }
        assert!(
            refused,
            "UDP {client} -> {to}: the backend's refusal never arrived"
        );

        // TCP: connect() is refused at once instead of timing out.
        let client = SocketAddr::new(family.client, port_base + 1);
        let to = SocketAddr::new(family.node, HTTP_NODE_PORT);
        let started = Instant::now();
        let err = in_netns(&ext_ns, move || {
            let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
            socket.bind(&client.into())?;
            Ok(socket.connect_timeout(&to.into(), Duration::from_secs(3)))
        })
        .unwrap()
        .expect_err("connected despite the REJECT");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "TCP {client} -> {to}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    drop(env);
}

/// The XDP program's counter `slot`, summed over CPUs (bpftool's view of the pinned map).
fn xdp_counter(pins: &Path, slot: u32) -> u64 {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(pins.join(proxy_common::maps::XDP_STATS))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    dump.as_array()
        .unwrap()
        .iter()
        .map(|e| e.get("formatted").unwrap_or(e))
        .filter(|e| e["key"] == slot)
        .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
        .map(|v| v["value"].as_u64().unwrap_or(0))
        .sum()
}

/// An address as it appears in `ip:port` text.
fn bracketed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    }
}
