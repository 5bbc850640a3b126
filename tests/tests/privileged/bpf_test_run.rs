// SPDX-License-Identifier: Apache-2.0
//! The north-south tc and XDP programs of proxy-ebpf run on hand-built packets with
//! `BPF_PROG_TEST_RUN` (aya's `TestRun`): DNAT and SNAT of TCP, UDP and SCTP, ICMP errors
//! about a translated flow, conntrack's reverse translation of replies, and the REJECT
//! answers (TCP RST, ICMP port unreachable), in both families; and Maglev's choice of
//! backend, which three dataplanes make alike and the agent's table and hash predict. Every packet that comes out
//! is checked against checksums computed here, independently of the programs' incremental
//! updates and of proxy-common's CRC32c: the IPv4 header checksum, the TCP/UDP/ICMPv6
//! pseudo-header checksums, the ICMP checksum and SCTP's CRC32c.
//!
//! The object is the agent's embedded one, loaded and its maps filled by the agent's own
//! code (`load_and_attach`, then the model -> desired -> apply pipeline over Service and
//! EndpointSlice objects), inside a fresh network namespace whose uplink (a veth) has
//! routes and permanent neighbours, so that the programs' FIB lookups succeed there.
//!
//! What test_run cannot show: a redirect (`bpf_redirect_neigh`, `bpf_redirect`) is only a
//! verdict here (TC_ACT_REDIRECT); the packet is not sent, so the MAC addresses the kernel
//! fills in on the way out after a tc redirect are not seen. XDP_TX frames carry the FIB
//! lookup's addresses, which are checked. The tc context is a plain `__sk_buff` with only
//! `ifindex` set (the uplink), so the checksum offload state is CHECKSUM_NONE: the
//! CHECKSUM_PARTIAL paths of `bpf_l4_csum_replace` are not exercised.
//!
//! Needs root and the real eBPF object (PROXY_REQUIRE_EBPF=1); skipped with the reason
//! otherwise.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions, TestRunResult, Xdp};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proxy_agent::{
    k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service},
    model::ClusterState,
    model::{IpFamily, LoadBalancerAlgorithm},
    node::NodeAddresses,
    proxier::{
        NodeContext,
        ebpf::{
            ApplyState, BackendAddr, LoadError, LoadOptions, Loaded, MapSizes, PinnedReservations,
            Reservations, build_maglev_table, leave_new_flows_to_netfilter, load_and_attach,
            maps_dir,
        },
    },
};
use proxy_common::LbConfig;
use tests::{
    privileged::{TempBpffs, TempCgroup, TempNetns},
    require_root,
};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

const IPPROTO_ICMP: u8 = 1;
const TCP: u8 = 6;
const UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const SCTP: u8 = 132;

const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

// The node, its uplink's neighbours, the external client and the remote backend.
const NODE4: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 2);
const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x168, 0, 0, 0, 0, 0, 2);
const CLIENT4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x203, 0x113, 0, 0, 0, 0, 2);
const BACKEND4: Ipv4Addr = Ipv4Addr::new(10, 180, 1, 1);
const BACKEND6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0x180, 1, 1);
const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// The router towards the clients, and the remote node routing the backend pod.
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const REMOTE_NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];

// Service "web" (eTP=Cluster, its endpoint on another node: DNAT and SNAT), and "empty",
// which has no endpoints (REJECT). Target ports differ from the node ports, so that both
// ports of a flow are rewritten.
const WEB_TCP: (u16, u16) = (30080, 8080);
const WEB_UDP: (u16, u16) = (30053, 5353);
const WEB_SCTP: (u16, u16) = (30099, 9999);
const EMPTY_TCP: u16 = 30081;
const EMPTY_UDP: u16 = 30054;

fn node(v6: bool) -> IpAddr {
    if v6 { NODE6.into() } else { NODE4.into() }
}
fn client(v6: bool) -> IpAddr {
    if v6 { CLIENT6.into() } else { CLIENT4.into() }
}
fn backend(v6: bool) -> IpAddr {
    if v6 { BACKEND6.into() } else { BACKEND4.into() }
}

// ---------------------------------------------------------------------------------------
// Checksums, written here from the RFCs (not the programs' or proxy-common's code).

/// RFC 1071 ones'-complement sum of `data` as 16-bit big-endian words (an odd last byte
/// padded with zero), folded to 16 bits.
fn ones_sum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    for pair in data.chunks(2) {
        let hi = u64::from(pair[0]) << 8;
        let lo = pair.get(1).copied().map_or(0, u64::from);
        sum += hi | lo;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The IPv4 (RFC 768/793) or IPv6 (RFC 8200 8.1) pseudo header of an L4 segment.
fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, l4_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend(s.octets());
            out.extend(d.octets());
            out.extend([0, proto]);
            out.extend((l4_len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            out.extend(s.octets());
            out.extend(d.octets());
            out.extend((l4_len as u32).to_be_bytes());
            out.extend([0, 0, 0, proto]);
        }
        _ => panic!("mixed families"),
    }
    out
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit, as RFC 9260
/// appendix A describes it.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Where a checksum sits and how it is computed, for protocol `proto` of family `v6`.
fn l4_checksum_offset(proto: u8) -> usize {
    match proto {
        TCP => 16,
        UDP => 6,
        SCTP => 8,
        _ => 2, // ICMP, ICMPv6
    }
}

/// Fills in the checksum of the L4 segment `l4` sent from `src` to `dst`.
fn fill_l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, l4: &mut [u8]) {
    let off = l4_checksum_offset(proto);
    l4[off..off + if proto == SCTP { 4 } else { 2 }].fill(0);
    if proto == SCTP {
        // RFC 9260 appendix A: the CRC goes in in the order it was computed (little-endian).
        let crc = crc32c(l4);
        l4[off..off + 4].copy_from_slice(&crc.to_le_bytes());
        return;
    }
    let mut covered = if proto == IPPROTO_ICMP {
        Vec::new()
    } else {
        pseudo_header(src, dst, proto, l4.len())
    };
    covered.extend_from_slice(l4);
    let c = !ones_sum(&covered);
    l4[off..off + 2].copy_from_slice(&c.to_be_bytes());
}

// ---------------------------------------------------------------------------------------
// Packets.

/// An L4 segment before its checksum is filled in.
fn tcp(sport: u16, dport: u16, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend(sport.to_be_bytes());
    t.extend(dport.to_be_bytes());
    t.extend(seq.to_be_bytes());
    t.extend(ack.to_be_bytes());
    t.extend([5 << 4, flags]);
    t.extend(64240u16.to_be_bytes()); // window
    t.extend([0, 0, 0, 0]); // checksum, urgent pointer
    t
}

fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend(sport.to_be_bytes());
    u.extend(dport.to_be_bytes());
    u.extend(((8 + payload.len()) as u16).to_be_bytes());
    u.extend([0, 0]);
    u.extend_from_slice(payload);
    u
}

/// An SCTP packet with one INIT (or, `ack`, INIT ACK) chunk.
fn sctp(sport: u16, dport: u16, vtag: u32, ack: bool) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend(sport.to_be_bytes());
    s.extend(dport.to_be_bytes());
    s.extend(vtag.to_be_bytes());
    s.extend([0, 0, 0, 0]); // CRC32c
    s.extend([if ack { 2 } else { 1 }, 0]);
    s.extend(20u16.to_be_bytes());
    s.extend(0x1122_3344u32.to_be_bytes()); // initiate tag
    s.extend(65536u32.to_be_bytes()); // a_rwnd
    s.extend(10u16.to_be_bytes()); // outbound streams
    s.extend(10u16.to_be_bytes()); // inbound streams
    s.extend(1u32.to_be_bytes()); // initial TSN
    s
}

/// An ICMP (v4: type 3) or ICMPv6 (type 1) destination unreachable with `code`, quoting
/// `quoted` (an IP packet, trimmed by the caller).
fn icmp_unreachable(v6: bool, code: u8, quoted: &[u8]) -> Vec<u8> {
    let mut m = vec![if v6 { 1 } else { 3 }, code, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(quoted);
    m
}

/// The IP header and `l4` (its checksum filled in) from `src` to `dst`.
fn ip_packet(src: IpAddr, dst: IpAddr, proto: u8, mut l4: Vec<u8>) -> Vec<u8> {
    fill_l4_checksum(src, dst, proto, &mut l4);
    let mut p = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend([0x45, 0]);
            p.extend(((20 + l4.len()) as u16).to_be_bytes());
            p.extend([0x12, 0x34, 0x40, 0]); // id, DF
            p.extend([64, proto, 0, 0]);
            p.extend(s.octets());
            p.extend(d.octets());
            let c = !ones_sum(&p);
            p[10..12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend([0x60, 0, 0, 0]);
            p.extend((l4.len() as u16).to_be_bytes());
            p.extend([proto, 64]);
            p.extend(s.octets());
            p.extend(d.octets());
        }
        _ => panic!("mixed families"),
    }
    p.extend(l4);
    p
}

/// `ip` in an Ethernet frame from the router (or the remote node) to the uplink.
fn frame(from_mac: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(UPLINK_MAC);
    f.extend(from_mac);
    f.extend(if ip[0] >> 4 == 6 {
        [0x86, 0xdd]
    } else {
        [0x08, 0x00]
    });
    f.extend_from_slice(ip);
    f
}

/// A packet as it came out of a program, its checksums verified.
#[derive(Debug)]
struct Seen {
    eth_dst: [u8; 6],
    eth_src: [u8; 6],
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    /// The L4 segment (or ICMP message).
    l4: Vec<u8>,
}

impl Seen {
    fn sport(&self) -> u16 {
        u16::from_be_bytes([self.l4[0], self.l4[1]])
    }
    fn dport(&self) -> u16 {
        u16::from_be_bytes([self.l4[2], self.l4[3]])
    }
    fn ends(&self) -> ((IpAddr, u16), (IpAddr, u16)) {
        ((self.src, self.sport()), (self.dst, self.dport()))
    }
}

/// Parses an IP packet (no options, no extension headers: the builder makes none) and
/// checks every checksum in it: the IPv4 header's, and the L4 one (`check_l4` false for an
/// ICMP error's quote, whose L4 checksum is neither complete nor maintained).
fn parse_ip(ip: &[u8], check_l4: bool, what: &str) -> (IpAddr, IpAddr, u8, Vec<u8>) {
    let (src, dst, proto, hdr, total) = match ip[0] >> 4 {
        4 => {
            assert_eq!(ip[0], 0x45, "{what}: IPv4 header without options");
            assert_eq!(
                ones_sum(&ip[..20]),
                0xffff,
                "{what}: IPv4 header checksum wrong: {:02x?}",
                &ip[..20]
            );
            let s: [u8; 4] = ip[12..16].try_into().unwrap();
            let d: [u8; 4] = ip[16..20].try_into().unwrap();
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            (IpAddr::from(s), IpAddr::from(d), ip[9], 20, total)
        }
        6 => {
            let s: [u8; 16] = ip[8..24].try_into().unwrap();
            let d: [u8; 16] = ip[24..40].try_into().unwrap();
            let total = 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize;
            (IpAddr::from(s), IpAddr::from(d), ip[6], 40, total)
        }
        v => panic!("{what}: IP version {v}"),
    };
    let l4 = ip[hdr..total.min(ip.len())].to_vec();
    if check_l4 {
        assert_eq!(total, ip.len(), "{what}: IP length vs. data");
        let ok = match proto {
            SCTP => {
                let mut zeroed = l4.clone();
                zeroed[8..12].fill(0);
                crc32c(&zeroed).to_le_bytes() == l4[8..12]
            }
            IPPROTO_ICMP => ones_sum(&l4) == 0xffff,
            _ => {
                let mut covered = pseudo_header(src, dst, proto, l4.len());
                covered.extend_from_slice(&l4);
                ones_sum(&covered) == 0xffff
            }
        };
        assert!(
            ok,
            "{what}: protocol {proto} checksum wrong ({src} -> {dst}): {l4:02x?}"
        );
    }
    (src, dst, proto, l4)
}

fn parse_frame(f: &[u8], what: &str) -> Seen {
    let (src, dst, proto, l4) = parse_ip(&f[14..], true, what);
    Seen {
        eth_dst: f[0..6].try_into().unwrap(),
        eth_src: f[6..12].try_into().unwrap(),
        src,
        dst,
        proto,
        l4,
    }
}

// ---------------------------------------------------------------------------------------
// The dataplane under test.

/// The agent's object, loaded in `ns`, its maps filled by the agent from two Services.
struct Dataplane {
    loaded: Loaded,
    uplink: u32,
    _cgroup: TempCgroup,
    _bpffs: TempBpffs,
}

/// The node the dataplane runs on (every test node has the same addresses: the namespaces
/// are separate).
fn test_node() -> NodeContext {
    NodeContext {
        name: "test-node".into(),
        primary_ips: NodeAddresses {
            v4: Some(NODE4.into()),
            v6: Some(NODE6.into()),
        },
        host_addresses: vec![NODE4.into(), NODE6.into()],
        ..Default::default()
    }
}

/// The agent's object loaded in `ns` (which has only `lo` yet: the pod-side program
/// attaches nowhere) with maps pinned under `bpffs`; None (after saying why) when the
/// object is the build's stand-in.
fn load_in(
    ns: &TempNetns,
    bpffs: &TempBpffs,
    cgroup: &TempCgroup,
    map_sizes: MapSizes,
    maglev_table_size: u32,
    name: &str,
) -> Option<Loaded> {
    let loaded = ns.run(|| {
        load_and_attach(&LoadOptions {
            bpffs_root: bpffs.path.clone(),
            cgroup: cgroup.path.clone(),
            map_sizes,
            devices: Vec::new(),
            xdp: proxy_agent::config::XdpMode::Off,
            maglev_table_size,
            pod_egress: false,
        })
    });
    match loaded {
        Ok(loaded) => Some(loaded),
        Err(LoadError::Unavailable(reason)) if std::env::var_os("PROXY_REQUIRE_EBPF").is_none() => {
            eprintln!("SKIP {name}: {reason} (build with PROXY_REQUIRE_EBPF=1)");
            None
        }
        Err(e) => panic!("loading the eBPF object: {e}"),
    }
}

/// The uplink (veth `up0`) with the node's addresses, routes to the clients and the
/// backends through neighbours whose MAC addresses are known (so that FIB lookups succeed),
/// forwarding on (FIB lookups refuse otherwise).
const NETWORK: &str = "set -e
ip link add up0 address 02:00:00:00:00:02 type veth peer name up1 address 02:00:00:00:00:fe
ip link set up0 up
ip link set up1 up
sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
ip addr add 192.168.0.2/24 dev up0
ip -6 addr add fd00:168::2/64 dev up0 nodad
ip neigh replace 192.168.0.1 lladdr 02:00:00:00:00:01 dev up0 nud permanent
ip neigh replace 192.168.0.3 lladdr 02:00:00:00:00:03 dev up0 nud permanent
ip -6 neigh replace fd00:168::1 lladdr 02:00:00:00:00:01 dev up0 nud permanent
ip -6 neigh replace fd00:168::3 lladdr 02:00:00:00:00:03 dev up0 nud permanent
ip route add 203.0.113.0/24 via 192.168.0.1
ip route add 10.180.0.0/16 via 192.168.0.3
ip -6 route add fd00:203:113::/64 via fd00:168::1
ip -6 route add fd00:10::/64 via fd00:168::3
ip -o link show dev up0 | cut -d: -f1";

/// The configuration the tests' programs run with: the masquerade addresses are the node's,
/// as the agent's event loop writes them.
fn node_config() -> LbConfig {
    LbConfig {
        masq4: u32::from_ne_bytes(NODE4.octets()),
        masq6: NODE6.octets(),
        ct_tcp_lifetime: 600,
        ct_udp_lifetime: 60,
        ct_closing_lifetime: 10,
        ..Default::default()
    }
}

impl Dataplane {
    /// None (after saying why) when the object is the build's stand-in.
    fn new(ns: &TempNetns, name: &str) -> Option<Self> {
        Self::with_services(ns, name, program_services)
    }

    /// The dataplane with its maps filled by `program` (as the agent's syncs do).
    fn with_services(
        ns: &TempNetns,
        name: &str,
        program: impl FnOnce(&mut Loaded, &NodeContext),
    ) -> Option<Self> {
        let bpffs = TempBpffs::new(&format!("kpe-bpftest-{name}"));
        let cgroup = TempCgroup::new(&format!("kpe-bpftest-{name}"));
        let mut loaded = load_in(
            ns,
            &bpffs,
            &cgroup,
            MapSizes::default(),
            proxy_common::maglev::DEFAULT_TABLE_SIZE,
            name,
        )?;
        let out = ns.sh(NETWORK);
        assert!(
            out.status.success(),
            "setting up the uplink: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let uplink: u32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the uplink's ifindex");

        let node = test_node();
        loaded
            .write_config(node_config())
            .expect("writing the configuration");
        program(&mut loaded, &node);
        Some(Self {
            loaded,
            uplink,
            _cgroup: cgroup,
            _bpffs: bpffs,
        })
    }

    /// Runs tc program `name` on `frame` arriving on the uplink: (verdict, frame out).
    fn tc(&mut self, ns: &TempNetns, name: &str, frame: &[u8]) -> (u32, Vec<u8>) {
        let uplink = self.uplink;
        let program: &mut SchedClassifier = self
            .loaded
            .program_mut(name)
            .expect("the program")
            .try_into()
            .expect("a tc program");
        // struct __sk_buff up to `ifindex` (offset 40): the device the packet came in by.
        let mut ctx = [0u8; 44];
        ctx[40..44].copy_from_slice(&uplink.to_ne_bytes());
        ns.run(|| run(program, frame, &ctx))
    }

    /// Runs the XDP program on `frame` arriving on the uplink: (verdict, frame out).
    fn xdp(&mut self, ns: &TempNetns, frame: &[u8]) -> (u32, Vec<u8>) {
        let uplink = self.uplink;
        let program: &mut Xdp = self
            .loaded
            .program_mut("xdp_uplink")
            .expect("the program")
            .try_into()
            .expect("an XDP program");
        if program.fd().is_err() {
            program.load().expect("loading xdp_uplink");
        }
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&uplink.to_ne_bytes());
        ns.run(|| run(program, frame, &ctx))
    }
}

/// One `BPF_PROG_TEST_RUN` of `program` on `frame` with context `ctx`.
fn run<P>(program: &P, frame: &[u8], ctx: &[u8]) -> (u32, Vec<u8>)
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    let mut out = vec![0u8; 512];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(ctx),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}

/// The Services and EndpointSlices, through the agent's model and apply stage into the
/// maps (as a full sync writes them).
fn program_services(loaded: &mut Loaded, node: &NodeContext) {
    let mut cluster = ClusterState::new(&[IpFamily::V4, IpFamily::V6], &node.name);
    let target = |port: u16| {
        move |p: &mut k8s_openapi::api::core::v1::ServicePort| {
            p.target_port = Some(IntOrString::Int(i32::from(port)));
        }
    };
    let web = mk_service("ns1", "web")
        .type_("NodePort")
        .cluster_ips(&["172.30.0.10", "fd00:30::10"])
        .ip_families(&["IPv4", "IPv6"])
        .node_port("http", 80, "TCP", i32::from(WEB_TCP.0))
        .with_last_port(target(WEB_TCP.1))
        .node_port("dns", 53, "UDP", i32::from(WEB_UDP.0))
        .with_last_port(target(WEB_UDP.1))
        .node_port("assoc", 9, "SCTP", i32::from(WEB_SCTP.0))
        .with_last_port(target(WEB_SCTP.1))
        .external_traffic_policy("Cluster")
        .build();
    let empty = mk_service("ns1", "empty")
        .type_("NodePort")
        .cluster_ips(&["172.30.0.11", "fd00:30::11"])
        .ip_families(&["IPv4", "IPv6"])
        .node_port("http", 80, "TCP", i32::from(EMPTY_TCP))
        .node_port("dns", 53, "UDP", i32::from(EMPTY_UDP))
        .external_traffic_policy("Cluster")
        .build();
    cluster.service(&Arc::new(web), false);
    cluster.service(&Arc::new(empty), false);
    for (family, addr) in [("IPv4", "10.180.1.1"), ("IPv6", "fd00:10::180:1:1")] {
        let slice = mk_endpointslice("ns1", &format!("web-{family}"), "web", family)
            .port("http", i32::from(WEB_TCP.1), "TCP")
            .port("dns", i32::from(WEB_UDP.1), "UDP")
            .port("assoc", i32::from(WEB_SCTP.1), "SCTP")
            .endpoint(mk_endpoint(addr).node("node2"))
            .build();
        cluster.endpoint_slice(&slice, false);
    }
    let changes = cluster.apply_pending();
    let sizes = MapSizes::default();
    let mut apply = ApplyState::new(sizes.backends, sizes.rev_nat);
    let changed: HashSet<_> = changes.changed;
    let stats = apply
        .sync(&mut loaded.maps, cluster.families(), node, &changed, true)
        .expect("writing the maps");
    assert!(stats.written > 0, "the apply stage wrote nothing");
}

/// The test's namespace and dataplane, or None when the test is skipped.
fn setup(name: &str) -> Option<(TempNetns, Dataplane)> {
    let ns = TempNetns::new(&format!("kpe-bpft-{name}"));
    let dp = Dataplane::new(&ns, name)?;
    Some((ns, dp))
}

/// Trims an IP packet to what an ICMP error quotes: its IP header and 8 bytes after it.
fn quote_of(ip: &[u8]) -> Vec<u8> {
    let hdr = if ip[0] >> 4 == 6 { 40 } else { 20 };
    ip[..hdr + 8].to_vec()
}

// ---------------------------------------------------------------------------------------
// The flows.

/// One flow of `proto` from the client to the web Service's node port, through tc's (or
/// XDP's) uplink ingress: the first packet is DNATed to the backend and SNATed to the node,
/// the backend's answer translated back by conntrack; then an ICMP unreachable from the
/// backend about the flow reaches the client as if the node's frontend had sent it.
fn nat_flow(proto: u8, v6: bool, xdp: bool) {
    require_root!();
    let name = format!(
        "nat-{proto}-{}{}",
        if v6 { "v6" } else { "v4" },
        if xdp { "-xdp" } else { "" }
    );
    let Some((ns, mut dp)) = setup(&name) else {
        return;
    };
    let (node_port, target_port) = match proto {
        TCP => WEB_TCP,
        UDP => WEB_UDP,
        _ => WEB_SCTP,
    };
    let client_port = 40000;
    let segment = |sport, dport, reply: bool| match proto {
        TCP if reply => tcp(sport, dport, 5000, 1001, TCP_SYN | TCP_ACK),
        TCP => tcp(sport, dport, 1000, 0, TCP_SYN),
        UDP => udp(sport, dport, b"query"),
        _ => sctp(sport, dport, if reply { 0x1122_3344 } else { 0 }, reply),
    };

    // Client -> node port.
    let first = ip_packet(
        client(v6),
        node(v6),
        proto,
        segment(client_port, node_port, false),
    );
    let (verdict, out) = if xdp {
        dp.xdp(&ns, &frame(ROUTER_MAC, &first))
    } else {
        dp.tc(&ns, "tc_uplink_ingress", &frame(ROUTER_MAC, &first))
    };
    let seen = parse_frame(&out, "the client's first packet, translated");
    let snat_port = seen.sport();
    assert_eq!(
        seen.ends(),
        ((node(v6), snat_port), (backend(v6), target_port)),
        "DNAT to the backend, SNAT to the node"
    );
    // Never the client's own port (40000 is one the node's kernel may give its own sockets
    // to the same backend, whose replies would be taken for this flow's): one of the SNAT
    // range, outside the kernel's ephemeral ports.
    assert!(
        (61_000..=65_535).contains(&snat_port),
        "SNAT source port {snat_port}, not from the SNAT range"
    );
    assert_eq!(seen.proto, proto);
    if xdp {
        // Back out of the uplink to the remote node, with the FIB lookup's addresses.
        assert_eq!(verdict, XDP_TX, "XDP transmits it");
        assert_eq!((seen.eth_dst, seen.eth_src), (REMOTE_NODE_MAC, UPLINK_MAC));
    } else {
        assert_eq!(verdict, TC_ACT_REDIRECT, "tc redirects it to the uplink");
    }

    // The backend's answer, through conntrack, back to the client.
    let answer = ip_packet(
        backend(v6),
        node(v6),
        proto,
        segment(target_port, snat_port, true),
    );
    let (verdict, out) = if xdp {
        dp.xdp(&ns, &frame(REMOTE_NODE_MAC, &answer))
    } else {
        dp.tc(&ns, "tc_uplink_ingress", &frame(REMOTE_NODE_MAC, &answer))
    };
    let seen = parse_frame(&out, "the backend's answer, translated back");
    assert_eq!(
        seen.ends(),
        ((node(v6), node_port), (client(v6), client_port)),
        "reverse NAT: from the frontend to the client"
    );
    if xdp {
        assert_eq!(verdict, XDP_TX);
        assert_eq!((seen.eth_dst, seen.eth_src), (ROUTER_MAC, UPLINK_MAC));
    } else {
        assert_eq!(verdict, TC_ACT_REDIRECT);
    }
    if xdp {
        // ICMP errors are tc's (XDP passes them on untouched).
        return;
    }

    // The backend says port unreachable about the packet it got (node -> backend).
    let got = ip_packet(
        node(v6),
        backend(v6),
        proto,
        segment(snat_port, target_port, false),
    );
    let code = if v6 { 4 } else { 3 };
    let error = ip_packet(
        backend(v6),
        node(v6),
        if v6 { IPPROTO_ICMPV6 } else { IPPROTO_ICMP },
        icmp_unreachable(v6, code, &quote_of(&got)),
    );
    let (verdict, out) = dp.tc(&ns, "tc_uplink_ingress", &frame(REMOTE_NODE_MAC, &error));
    let seen = parse_frame(&out, "the ICMP error, translated");
    assert_eq!(
        (seen.src, seen.dst),
        (node(v6), client(v6)),
        "the error goes to the client, from the frontend"
    );
    assert_eq!(seen.l4[..2], [if v6 { 1 } else { 3 }, code]);
    let (qsrc, qdst, qproto, ql4) = parse_ip(&seen.l4[8..], false, "the quote");
    assert_eq!(qproto, proto);
    assert_eq!(
        (
            (qsrc, u16::from_be_bytes([ql4[0], ql4[1]])),
            (qdst, u16::from_be_bytes([ql4[2], ql4[3]]))
        ),
        ((client(v6), client_port), (node(v6), node_port)),
        "the quote is the client's packet as the client sent it"
    );
    assert_eq!(verdict, TC_ACT_REDIRECT);
}

#[test]
fn tcp_v4_nodeport_is_dnated_snated_and_translated_back() {
    nat_flow(TCP, false, false);
}

#[test]
fn tcp_v6_nodeport_is_dnated_snated_and_translated_back() {
    nat_flow(TCP, true, false);
}

#[test]
fn udp_v4_nodeport_is_dnated_snated_and_translated_back() {
    nat_flow(UDP, false, false);
}

#[test]
fn udp_v6_nodeport_is_dnated_snated_and_translated_back() {
    nat_flow(UDP, true, false);
}

#[test]
fn sctp_v4_nodeport_is_dnated_snated_and_translated_back() {
    nat_flow(SCTP, false, false);
}

#[test]
fn sctp_v6_nodeport_is_dnated_snated_and_translated_back() {
    nat_flow(SCTP, true, false);
}

#[test]
fn xdp_tcp_v4_nodeport_is_translated_and_transmitted() {
    nat_flow(TCP, false, true);
}

#[test]
fn xdp_udp_v6_nodeport_is_translated_and_transmitted() {
    nat_flow(UDP, true, true);
}

#[test]
fn xdp_sctp_v4_nodeport_is_translated_and_transmitted() {
    nat_flow(SCTP, false, true);
}

/// A packet to the node port of a Service without endpoints: tc answers it (TCP RST, ICMP
/// port unreachable quoting it) back out of the uplink.
fn rejected(proto: u8, v6: bool) {
    require_root!();
    let name = format!("reject-{proto}-{}", if v6 { "v6" } else { "v4" });
    let Some((ns, mut dp)) = setup(&name) else {
        return;
    };
    let client_port = 40001;
    let sent = match proto {
        TCP => ip_packet(
            client(v6),
            node(v6),
            TCP,
            tcp(client_port, EMPTY_TCP, 7000, 0, TCP_SYN),
        ),
        _ => ip_packet(
            client(v6),
            node(v6),
            UDP,
            udp(client_port, EMPTY_UDP, b"anyone?"),
        ),
    };
    let (verdict, out) = dp.tc(&ns, "tc_uplink_ingress", &frame(ROUTER_MAC, &sent));
    assert_eq!(verdict, TC_ACT_REDIRECT, "the answer goes back out");
    let seen = parse_frame(&out, "the REJECT answer");
    assert_eq!(
        (seen.eth_dst, seen.eth_src),
        (ROUTER_MAC, UPLINK_MAC),
        "MAC addresses swapped"
    );
    assert_eq!((seen.src, seen.dst), (node(v6), client(v6)));
    if proto == TCP {
        assert_eq!(seen.proto, TCP);
        assert_eq!((seen.sport(), seen.dport()), (EMPTY_TCP, client_port));
        let seq = u32::from_be_bytes(seen.l4[4..8].try_into().unwrap());
        let ack = u32::from_be_bytes(seen.l4[8..12].try_into().unwrap());
        assert_eq!(seen.l4[13], TCP_RST | TCP_ACK, "RST answering a SYN");
        assert_eq!((seq, ack), (0, 7001), "acknowledges the SYN");
    } else {
        let icmp = if v6 { IPPROTO_ICMPV6 } else { IPPROTO_ICMP };
        assert_eq!(seen.proto, icmp);
        let (kind, code) = if v6 { (1, 4) } else { (3, 3) };
        assert_eq!(seen.l4[..2], [kind, code], "port unreachable");
        assert_eq!(
            seen.l4[8..],
            quote_of(&sent)[..],
            "quotes the packet's IP header and 8 bytes"
        );
    }
}

#[test]
fn tcp_v4_to_a_service_without_endpoints_gets_a_rst() {
    rejected(TCP, false);
}

#[test]
fn tcp_v6_to_a_service_without_endpoints_gets_a_rst() {
    rejected(TCP, true);
}

#[test]
fn udp_v4_to_a_service_without_endpoints_gets_port_unreachable() {
    rejected(UDP, false);
}

#[test]
fn udp_v6_to_a_service_without_endpoints_gets_port_unreachable() {
    rejected(UDP, true);
}

/// How many entries the family's BPF conntrack map holds.
fn ct_entries(dp: &Dataplane, v6: bool) -> usize {
    if v6 {
        dp.loaded.ct6.keys().count()
    } else {
        dp.loaded.ct4.keys().count()
    }
}

/// A netfilter mode taking the node over, its rules in place, sets the handing-over flag
/// (the agent's own call, on the pinned configuration map): from then on tc and XDP start
/// no flow. A new connection, even one to a frontend without endpoints (the rules answer
/// it now), goes to the stack as it came and leaves no conntrack entry; the connection the
/// programs translated before keeps its translation both ways until they go.
fn handing_over(v6: bool) {
    require_root!();
    let name = format!("handover-{}", if v6 { "v6" } else { "v4" });
    let Some((ns, mut dp)) = setup(&name) else {
        return;
    };
    let (node_port, target_port) = WEB_TCP;
    let syn = |sport: u16, dport: u16| {
        ip_packet(
            client(v6),
            node(v6),
            TCP,
            tcp(sport, dport, 1000, 0, TCP_SYN),
        )
    };
    let (verdict, out) = dp.tc(
        &ns,
        "tc_uplink_ingress",
        &frame(ROUTER_MAC, &syn(40010, node_port)),
    );
    assert_eq!(verdict, TC_ACT_REDIRECT, "before: translated");
    let snat_port = parse_frame(&out, "the first connection's SYN").sport();
    let entries = ct_entries(&dp, v6);
    assert!(entries > 0, "the first connection is tracked");

    assert_eq!(
        leave_new_flows_to_netfilter(&maps_dir(&dp._bpffs.path)),
        Ok(true),
        "the flag is set in the pinned configuration"
    );
    for (what, packet) in [
        ("a new connection", syn(40011, node_port)),
        (
            "a connection to a frontend without endpoints",
            syn(40012, EMPTY_TCP),
        ),
    ] {
        let sent = frame(ROUTER_MAC, &packet);
        assert_eq!(
            dp.tc(&ns, "tc_uplink_ingress", &sent),
            (TC_ACT_OK, sent.clone()),
            "{what}: tc passes it as it came"
        );
        assert_eq!(
            dp.xdp(&ns, &sent),
            (XDP_PASS, sent.clone()),
            "{what}: XDP passes it as it came"
        );
    }
    assert_eq!(ct_entries(&dp, v6), entries, "no flow started");

    // The first connection: the client's next segment and the backend's answer.
    let ack = ip_packet(
        client(v6),
        node(v6),
        TCP,
        tcp(40010, node_port, 1001, 5001, TCP_ACK),
    );
    let (verdict, out) = dp.tc(&ns, "tc_uplink_ingress", &frame(ROUTER_MAC, &ack));
    assert_eq!(verdict, TC_ACT_REDIRECT);
    assert_eq!(
        parse_frame(&out, "the first connection's ACK").ends(),
        ((node(v6), snat_port), (backend(v6), target_port)),
        "still DNATed and SNATed as before"
    );
    let answer = ip_packet(
        backend(v6),
        node(v6),
        TCP,
        tcp(target_port, snat_port, 5001, 1001, TCP_ACK),
    );
    let (verdict, out) = dp.tc(&ns, "tc_uplink_ingress", &frame(REMOTE_NODE_MAC, &answer));
    assert_eq!(verdict, TC_ACT_REDIRECT);
    assert_eq!(
        parse_frame(&out, "the backend's answer").ends(),
        ((node(v6), node_port), (client(v6), 40010)),
        "still translated back"
    );
}

#[test]
fn handing_over_v4_starts_no_flow_and_keeps_translating_the_old_ones() {
    handing_over(false);
}

#[test]
fn handing_over_v6_starts_no_flow_and_keeps_translating_the_old_ones() {
    handing_over(true);
}

/// A flow netfilter's conntrack translates (the mode the node ran before started it), its
/// answer tuple reserved by the agent's handover (`PinnedReservations`): its SNAT port goes
/// to no new flow to the same backend, which would take its answers and, by the backend's
/// ACK to a second SYN, have it reset; its answers and their ICMP errors go to the stack as
/// they came, for netfilter to translate.
fn netfilter_flow_reserved(v6: bool) {
    require_root!();
    let name = format!("reserved-{}", if v6 { "v6" } else { "v4" });
    let Some((ns, mut dp)) = setup(&name) else {
        return;
    };
    let (node_port, target_port) = WEB_TCP;
    // Two SNAT ports: the reserved one and one free.
    dp.loaded
        .write_config(LbConfig {
            snat_port_min: 61_000,
            snat_port_max: 61_001,
            ..node_config()
        })
        .expect("writing the configuration");
    let answer = proxy_agent::proxier::conntrack::Tuple {
        src: backend(v6),
        dst: node(v6),
        protocol: TCP,
        src_port: target_port,
        dst_port: 61_000,
    };
    let family = if v6 { IpFamily::V6 } else { IpFamily::V4 };
    let mut reservations = PinnedReservations::new(&maps_dir(&dp._bpffs.path));
    reservations
        .reserve(family, &answer)
        .expect("reserving the tuple");
    assert_eq!(
        reservations.list(family).expect("listing reservations"),
        [answer].into(),
        "read back from the pinned map"
    );

    let mut translated = 0;
    for client_port in 40_100..40_110 {
        let syn = ip_packet(
            client(v6),
            node(v6),
            TCP,
            tcp(client_port, node_port, 1000, 0, TCP_SYN),
        );
        let (verdict, out) = dp.tc(&ns, "tc_uplink_ingress", &frame(ROUTER_MAC, &syn));
        match verdict {
            TC_ACT_REDIRECT => {
                let seen = parse_frame(&out, "a new connection's SYN");
                assert_eq!(
                    seen.sport(),
                    61_001,
                    "the reserved port is netfilter's flow's"
                );
                translated += 1;
            }
            // Each of its tries met a taken port (one in 16).
            TC_ACT_SHOT => {}
            other => panic!("verdict {other} for a new connection"),
        }
        // Its entries go, so that the free port is free again for the next one.
        if v6 {
            let keys: Vec<_> = dp.loaded.ct6.keys().filter_map(Result::ok).collect();
            for key in keys.iter().filter(|k| k.dport != 61_000u16.to_be()) {
                dp.loaded.ct6.remove(key).expect("forgetting the flow");
            }
        } else {
            let keys: Vec<_> = dp.loaded.ct4.keys().filter_map(Result::ok).collect();
            for key in keys.iter().filter(|k| k.dport != 61_000u16.to_be()) {
                dp.loaded.ct4.remove(key).expect("forgetting the flow");
            }
        }
    }
    assert!(translated > 0, "no new connection was translated");

    // The reserved flow's answer and an ICMP error about its packets: untouched.
    let answer_packet = ip_packet(
        backend(v6),
        node(v6),
        TCP,
        tcp(target_port, 61_000, 5001, 1001, TCP_ACK),
    );
    let sent = frame(REMOTE_NODE_MAC, &answer_packet);
    assert_eq!(
        dp.tc(&ns, "tc_uplink_ingress", &sent),
        (TC_ACT_OK, sent.clone()),
        "tc leaves the answer to the stack"
    );
    assert_eq!(
        dp.xdp(&ns, &sent),
        (XDP_PASS, sent.clone()),
        "XDP leaves the answer to the stack"
    );
    let got = ip_packet(
        node(v6),
        backend(v6),
        TCP,
        tcp(61_000, target_port, 1001, 5001, TCP_ACK),
    );
    let error = ip_packet(
        backend(v6),
        node(v6),
        if v6 { IPPROTO_ICMPV6 } else { IPPROTO_ICMP },
        icmp_unreachable(v6, if v6 { 4 } else { 3 }, &quote_of(&got)),
    );
    let sent = frame(REMOTE_NODE_MAC, &error);
    assert_eq!(
        dp.tc(&ns, "tc_uplink_ingress", &sent),
        (TC_ACT_OK, sent.clone()),
        "the ICMP error is netfilter's to translate"
    );

    reservations
        .release(family, &answer)
        .expect("releasing the tuple");
    assert!(reservations.list(family).expect("listing").is_empty());
}

#[test]
fn a_netfilter_flows_v4_snat_port_is_reserved_and_its_answers_passed_on() {
    netfilter_flow_reserved(false);
}

#[test]
fn a_netfilter_flows_v6_snat_port_is_reserved_and_its_answers_passed_on() {
    netfilter_flow_reserved(true);
}

#[test]
fn the_checksums_of_this_test_are_right() {
    // RFC 9260 / iSCSI check value of CRC-32C.
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    // RFC 1071's example: 0x0001 + 0xf203 + 0xf4f5 + 0xf6f7 = 0xddf2 (folded).
    assert_eq!(
        ones_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
        0xddf2
    );
    // A packet built here passes the checks made here.
    let p = ip_packet(client(false), node(false), SCTP, sctp(1, 2, 3, false));
    let _ = parse_frame(&frame(ROUTER_MAC, &p), "a built packet");
}

// ---------------------------------------------------------------------------------------
// Maglev: a LoadBalancer VIP whose service asks for Maglev, reached by new TCP flows from
// outside (SNATed, eTP=Cluster). Each "node" is a dataplane of its own, in its own
// namespace, whose agent knows the backends under other ids.

/// The VIP, its port and the backends' target port.
const MAGLEV_VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const MAGLEV_PORT: u16 = 80;
const MAGLEV_TARGET: u16 = 8080;
/// Backends 10.180.2.1..=10.180.2.N (routed through the remote node).
const MAGLEV_BACKENDS: u8 = 10;

fn maglev_backend(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 180, 2, i)
}

/// The agent's model and apply state of one node, kept across syncs.
struct MaglevNode {
    cluster: ClusterState,
    apply: ApplyState,
}

impl MaglevNode {
    /// The "hashed" LoadBalancer service (annotated for Maglev; the configuration says
    /// random) with `backends`. `decoys` unrelated backends are programmed first, so that
    /// this node's ids for the hashed ones differ from another node's.
    fn new(backends: &[Ipv4Addr], decoys: u8) -> Self {
        let sizes = MapSizes::default();
        Self::with_tables(
            backends,
            decoys,
            proxy_common::maglev::DEFAULT_TABLE_SIZE,
            sizes.maglev_tables,
        )
    }

    /// [`MaglevNode::new`] for a map of `tables` tables of `table_size` entries.
    fn with_tables(backends: &[Ipv4Addr], decoys: u8, table_size: u32, tables: u32) -> Self {
        let mut cluster = ClusterState::new(&[IpFamily::V4], "test-node");
        let hashed = mk_service("ns1", "hashed")
            .type_("LoadBalancer")
            .cluster_ip("172.30.0.20")
            .node_port("http", i32::from(MAGLEV_PORT), "TCP", 30090)
            .with_last_port(|p| p.target_port = Some(IntOrString::Int(i32::from(MAGLEV_TARGET))))
            .lb_ingress(&MAGLEV_VIP.to_string(), None)
            .external_traffic_policy("Cluster")
            .annotation("kube-proxy-ebpf.io/lb-algorithm", "maglev")
            .build();
        cluster.service(&Arc::new(hashed), false);
        if decoys > 0 {
            // "aaa" sorts before "hashed": its backends get their ids first.
            let decoy = mk_service("ns1", "aaa")
                .cluster_ip("172.30.0.21")
                .port("http", 80, "TCP")
                .build();
            cluster.service(&Arc::new(decoy), false);
            let mut slice = mk_endpointslice("ns1", "aaa-1", "aaa", "IPv4").port("http", 80, "TCP");
            for i in 0..decoys {
                slice = slice.endpoint(mk_endpoint(&format!("10.180.9.{}", i + 1)).node("node2"));
            }
            cluster.endpoint_slice(&slice.build(), false);
        }
        let sizes = MapSizes::default();
        let mut node = Self {
            cluster,
            apply: ApplyState::new(sizes.backends, sizes.rev_nat).with_maglev(
                LoadBalancerAlgorithm::Random,
                table_size,
                tables,
            ),
        };
        node.set_backends(backends);
        node
    }

    fn set_backends(&mut self, backends: &[Ipv4Addr]) {
        let mut slice = mk_endpointslice("ns1", "hashed-1", "hashed", "IPv4").port(
            "http",
            i32::from(MAGLEV_TARGET),
            "TCP",
        );
        for b in backends {
            slice = slice.endpoint(mk_endpoint(&b.to_string()).node("node2"));
        }
        self.cluster.endpoint_slice(&slice.build(), false);
    }

    /// Applies the model's pending changes to `loaded`'s maps.
    fn sync(&mut self, loaded: &mut Loaded, full: bool) {
        let changes = self.cluster.apply_pending();
        self.apply
            .sync(
                &mut loaded.maps,
                self.cluster.families(),
                &test_node(),
                &changes.changed,
                full,
            )
            .expect("writing the maps");
    }
}

/// A node's dataplane with the hashed service over `backends`.
fn maglev_node(
    ns: &TempNetns,
    name: &str,
    backends: &[Ipv4Addr],
    decoys: u8,
) -> Option<(Dataplane, MaglevNode)> {
    let mut state = MaglevNode::new(backends, decoys);
    let dp = Dataplane::with_services(ns, name, |loaded, _| state.sync(loaded, true))?;
    Some((dp, state))
}

/// The client of flow `i`: addresses and ports spread over the client network.
fn maglev_client(i: u32) -> (Ipv4Addr, u16) {
    (
        Ipv4Addr::new(203, 0, 113, 2 + (i % 200) as u8),
        30_000 + (i * 7919 % 30_000) as u16,
    )
}

/// Sends flow `i`'s SYN to the VIP through the uplink's tc program; returns the backend it
/// was sent to (checking the translation on the way: DNAT to the target port, SNAT).
fn maglev_backend_of(dp: &mut Dataplane, ns: &TempNetns, i: u32) -> Ipv4Addr {
    let (client, sport) = maglev_client(i);
    let syn = ip_packet(
        client.into(),
        MAGLEV_VIP.into(),
        TCP,
        tcp(sport, MAGLEV_PORT, 1000, 0, TCP_SYN),
    );
    let (verdict, out) = dp.tc(ns, "tc_uplink_ingress", &frame(ROUTER_MAC, &syn));
    assert_eq!(
        verdict, TC_ACT_REDIRECT,
        "flow {i}: redirected to the backend"
    );
    let seen = parse_frame(&out, "a SYN to the Maglev VIP");
    assert_eq!(
        seen.src,
        IpAddr::from(NODE4),
        "flow {i}: SNATed to the node"
    );
    assert_eq!(seen.dport(), MAGLEV_TARGET);
    match seen.dst {
        IpAddr::V4(b) => b,
        other => panic!("flow {i}: an IPv6 backend {other}"),
    }
}

/// The backend the agent's table (built here, from the backends' addresses only) gives
/// flow `i`, with the flow hash both the programs and the agent use.
fn maglev_expected(backends: &[Ipv4Addr], i: u32) -> Ipv4Addr {
    let members: Vec<(BackendAddr, u32)> = backends
        .iter()
        .zip(1..)
        .map(|(b, id)| {
            (
                BackendAddr {
                    addr: (*b).into(),
                    port: MAGLEV_TARGET,
                    proto: TCP,
                },
                id,
            )
        })
        .collect();
    let table = build_maglev_table(&members, proxy_common::maglev::DEFAULT_TABLE_SIZE);
    let (client, sport) = maglev_client(i);
    let mut saddr = [0u8; 16];
    saddr[..4].copy_from_slice(&client.octets());
    let mut daddr = [0u8; 16];
    daddr[..4].copy_from_slice(&MAGLEV_VIP.octets());
    let hash =
        proxy_common::maglev::flow_hash(&saddr, &daddr, sport.to_be(), MAGLEV_PORT.to_be(), TCP);
    let id = table[(hash % proxy_common::maglev::DEFAULT_TABLE_SIZE) as usize];
    backends[(id - 1) as usize]
}

#[test]
fn maglev_picks_the_same_backend_on_every_node_and_a_removal_moves_about_one_nth() {
    require_root!();
    let backends: Vec<Ipv4Addr> = (1..=MAGLEV_BACKENDS).map(maglev_backend).collect();
    const FLOWS: u32 = 1_000;

    // Node A: every flow reaches the backend the userspace table and hash say, which
    // holds only if the programs' flow hash is the agent's.
    let ns_a = TempNetns::new("kpe-bpft-maglev-a");
    let Some((mut a, _)) = maglev_node(&ns_a, "maglev-a", &backends, 0) else {
        return;
    };
    let on_a: Vec<Ipv4Addr> = (0..FLOWS)
        .map(|i| maglev_backend_of(&mut a, &ns_a, i))
        .collect();
    for (i, seen) in on_a.iter().enumerate() {
        assert_eq!(*seen, maglev_expected(&backends, i as u32), "flow {i}");
    }
    let used: HashSet<_> = on_a.iter().collect();
    assert_eq!(used.len(), backends.len(), "every backend gets flows");

    // Nodes B and C know the backends under other ids (and list them in another order):
    // the same flows reach the same backends.
    let ns_b = TempNetns::new("kpe-bpft-maglev-b");
    let mut reversed = backends.clone();
    reversed.reverse();
    let Some((mut b, _)) = maglev_node(&ns_b, "maglev-b", &reversed, 3) else {
        return;
    };
    let ns_c = TempNetns::new("kpe-bpft-maglev-c");
    let Some((mut c, mut c_state)) = maglev_node(&ns_c, "maglev-c", &backends, 7) else {
        return;
    };
    for i in 0..200 {
        assert_eq!(
            maglev_backend_of(&mut b, &ns_b, i),
            on_a[i as usize],
            "flow {i} via node B"
        );
        assert_eq!(
            maglev_backend_of(&mut c, &ns_c, i),
            on_a[i as usize],
            "flow {i} via node C"
        );
    }

    // Node C loses one backend (a partial sync): flows it has not seen yet (no conntrack
    // entry) move only if they were on the removed backend, or a few more.
    let removed = backends[3];
    let rest: Vec<Ipv4Addr> = backends.iter().copied().filter(|b| *b != removed).collect();
    c_state.set_backends(&rest);
    c_state.sync(&mut c.loaded, false);
    let fresh = 200..200 + FLOWS;
    let mut moved = 0;
    let mut others_moved = 0;
    for i in fresh.clone() {
        let before = on_a
            .get(i as usize)
            .copied()
            .unwrap_or_else(|| maglev_backend_of(&mut a, &ns_a, i));
        let after = maglev_backend_of(&mut c, &ns_c, i);
        assert_ne!(after, removed, "flow {i}");
        assert_eq!(
            after,
            maglev_expected(&rest, i),
            "flow {i} after the removal"
        );
        if after != before {
            moved += 1;
            if before != removed {
                others_moved += 1;
            }
        }
    }
    let n = f64::from(MAGLEV_BACKENDS);
    let fraction = f64::from(moved) / f64::from(FLOWS);
    eprintln!(
        "maglev: {moved} of {FLOWS} flows moved ({fraction:.3}; 1/N = {:.3}), {others_moved} not on the removed backend",
        1.0 / n
    );
    // 1/N of the flows, give or take the sampling of 1,000 flows (about 3 standard
    // deviations) and Maglev's few percent of disruption.
    assert!(fraction <= 1.0 / n + 0.05, "{moved} of {FLOWS} flows moved");
    assert!(fraction >= 1.0 / n - 0.05, "{moved} of {FLOWS} flows moved");
    assert!(
        f64::from(others_moved) / f64::from(FLOWS) <= 0.03,
        "{others_moved} flows of remaining backends moved"
    );
}

/// The Maglev map as pinned under `bpffs`: its capacity, the table size its configuration
/// holds, and table 0's first `size` entries.
fn pinned_maglev(bpffs: &TempBpffs, size: u32) -> (u32, u32, Vec<u32>) {
    use aya::maps::{Array, Map, MapData, MapInfo};
    let dir = maps_dir(&bpffs.path);
    let open = |name: &str| -> Array<MapData, u32> {
        let data = MapData::from_pin(dir.join(name)).expect("a pinned map");
        Array::try_from(Map::Array(data)).expect("an array of u32")
    };
    let capacity = MapInfo::from_pin(dir.join(proxy_common::maps::MAGLEV))
        .expect("the Maglev map's description")
        .max_entries();
    let configured = open(proxy_common::maps::MAGLEV_CONFIG)
        .get(&0, 0)
        .expect("the table size");
    let tables = open(proxy_common::maps::MAGLEV);
    let table0 = (0..size.min(capacity))
        .map(|i| tables.get(&i, 0).expect("an entry"))
        .collect();
    (capacity, configured, table0)
}

#[test]
fn a_new_maglev_table_size_replaces_the_tables_across_a_restart() {
    require_root!();
    let ns = TempNetns::new("kpe-bpft-maglev-size");
    let bpffs = TempBpffs::new("kpe-bpftest-maglev-size");
    let cgroup = TempCgroup::new("kpe-bpftest-maglev-size");
    let backends: Vec<Ipv4Addr> = (1..=MAGLEV_BACKENDS).map(maglev_backend).collect();
    // One agent's life: load with `size` and `tables`, check what it finds, sync.
    let life = |size: u32, tables: u32, check: &dyn Fn(u32, u32, &[u32])| -> bool {
        let sizes = MapSizes {
            maglev_tables: tables,
            ..MapSizes::default()
        };
        let Some(mut loaded) = load_in(&ns, &bpffs, &cgroup, sizes, size, "maglev-size") else {
            return false;
        };
        let (capacity, configured, table0) = pinned_maglev(&bpffs, size);
        assert_eq!(
            capacity,
            size * tables,
            "the map holds the configured tables"
        );
        assert_eq!(configured, size, "the size is written before any sync");
        check(size, tables, &table0);
        let mut node = MaglevNode::with_tables(&backends, 0, size, tables);
        node.sync(&mut loaded, true);
        let (_, _, table0) = pinned_maglev(&bpffs, size);
        assert!(
            table0.iter().all(|id| *id != 0),
            "table 0 is written in full at size {size}"
        );
        true
    };
    let fresh = |size: u32, _: u32, table0: &[u32]| {
        assert!(
            table0.iter().all(|id| *id == 0),
            "a new map at size {size} is empty"
        );
    };
    let kept = |size: u32, _: u32, table0: &[u32]| {
        assert!(
            table0.iter().all(|id| *id != 0),
            "the map at size {size} is kept"
        );
    };
    if !life(251, 4, &fresh) {
        return;
    }
    // Same shape: the pins are reused, tables and all. Another size or number of tables:
    // a new map, empty until the first sync writes it.
    life(251, 4, &kept);
    life(16_381, 4, &fresh);
    life(16_381, 6, &fresh);
    life(16_381, 6, &kept);
}
