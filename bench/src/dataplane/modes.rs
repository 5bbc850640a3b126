// SPDX-License-Identifier: Apache-2.0
//! The modes of the dataplane benchmark and how each puts N services into a fresh node
//! namespace: our agent (ebpf, iptables, nftables), upstream-shaped rules loaded with the raw tools
//! (kube-proxy-iptables, kube-proxy-nft), or nothing (direct).

use std::{
    ffi::OsString,
    fmt::Write as _,
    fs,
    io::Write as _,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use serde_json::{Map, Value, json};

use ::tests::scenario::netns::Place;

use crate::{
    error::{Error, Result},
    manifests::{BACKEND_PORT, SERVICE_IP, SERVICE_PORT},
    net::SERVER_IP,
    shaped::{ShapedOptions, ShapedService, fillers},
    signals,
};

/// The measured service's second port and its backend port: the established-connection
/// load ([`stream`](super::stream)) goes there.
pub const STREAM_SERVICE_PORT: u16 = SERVICE_PORT + 1;
pub const STREAM_BACKEND_PORT: u16 = BACKEND_PORT + 1;
/// Services per `nft -f` transaction in kube-proxy-nft mode (see
/// [`nft_full_in_transactions`](crate::shaped::nft_full_in_transactions)).
pub const NFT_CHUNK: usize = 1000;
/// Endpoints per filler service.
pub const FILLER_ENDPOINTS: u32 = 4;
/// The pods' CIDR (the client and server pods live in it): traffic from outside would be
/// marked for masquerade, as with kube-proxy's `--cluster-cidr`.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DpMode {
    /// The client connects straight to the backends: the route every mode is paired with
    /// (in the mode's own namespaces, see [`abba`](super::abba)).
    Direct,
    /// Nothing for the services, but conntrack and NAT hooks on in the node namespace
    /// (an nftables table whose rules match none of the benchmark's traffic), as on a node
    /// where kube-proxy or a CNI plugin has registered them: both routes go straight to the
    /// backends, so its ratio is the method's noise floor (A against A).
    DirectCt,
    /// Our agent in ebpf mode.
    Ebpf,
    /// Our agent in iptables mode, with `iptables*` naming the legacy commands.
    Iptables,
    /// Our agent in nftables mode (`nft` on PATH; `--strict-mode`, so no fallback).
    Nftables,
    /// Upstream-shaped iptables rules, the measured service last in KUBE-SERVICES.
    KubeProxyIptables,
    /// The same, the measured service at a seeded random position.
    KubeProxyIptablesRandom,
    /// Upstream-shaped nftables rules.
    KubeProxyNft,
}

impl DpMode {
    pub const ALL: [DpMode; 8] = [
        DpMode::Direct,
        DpMode::DirectCt,
        DpMode::Ebpf,
        DpMode::Iptables,
        DpMode::Nftables,
        DpMode::KubeProxyIptables,
        DpMode::KubeProxyIptablesRandom,
        DpMode::KubeProxyNft,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DpMode::Direct => "direct",
            DpMode::DirectCt => "direct-ct",
            DpMode::Ebpf => "ebpf",
            DpMode::Iptables => "iptables",
            DpMode::Nftables => "nftables",
            DpMode::KubeProxyIptables => "kube-proxy-iptables",
            DpMode::KubeProxyIptablesRandom => "kube-proxy-iptables@random",
            DpMode::KubeProxyNft => "kube-proxy-nft",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == text)
    }
}

/// Backends of the measured service: the server pod's addresses (each with its servers).
pub const MEASURED_BACKENDS: u8 = 4;

/// The measured service's backends' addresses: [`SERVER_IP`] and the next ones.
pub fn backend_ips() -> Vec<Ipv4Addr> {
    (0..MEASURED_BACKENDS)
        .map(|i| Ipv4Addr::from(u32::from(SERVER_IP) + u32::from(i)))
        .collect()
}

/// The measured service's two ports (connection rate; established connection), both to
/// the [`MEASURED_BACKENDS`] real backends.
pub fn measured() -> [ShapedService; 2] {
    let port = |name: &str, port: u16, target: u16| ShapedService {
        namespace: "bench".into(),
        name: "measured".into(),
        port_name: name.into(),
        cluster_ip: SERVICE_IP,
        port,
        endpoints: backend_ips()
            .into_iter()
            .map(|ip| SocketAddrV4::new(ip, target))
            .collect(),
    };
    [
        port("conn", SERVICE_PORT, BACKEND_PORT),
        port("stream", STREAM_SERVICE_PORT, STREAM_BACKEND_PORT),
    ]
}

/// splitmix64: a seeded position that is the same in every run.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where the measured service goes among `fillers` fillers in the random placement
/// (0 ..= fillers; the same in every run).
pub fn random_position(fillers: u32) -> usize {
    let seed = mix(0x6b75_6265 ^ u64::from(fillers));
    (seed % (u64::from(fillers) + 1)) as usize
}

/// N services: `n - 1` fillers with the measured service's two ports at `position`
/// (`None`: last).
pub fn services(n: u32, position: Option<usize>) -> Vec<ShapedService> {
    let mut list = fillers(n.saturating_sub(1), FILLER_ENDPOINTS);
    let at = position.unwrap_or(list.len()).min(list.len());
    list.splice(at..at, measured());
    list
}

pub fn shaped_options() -> ShapedOptions {
    ShapedOptions {
        cluster_cidr: CLUSTER_CIDR.parse().ok(),
    }
}

/// The Services and EndpointSlices of `services` for the agent's `--source` directory;
/// the ports of one service (same namespace and name, consecutive) become one Service.
pub fn manifests(services: &[ShapedService]) -> String {
    let mut out = String::with_capacity(services.len() * 700);
    for group in services.chunk_by(|a, b| a.namespace == b.namespace && a.name == b.name) {
        let (ns, name) = (&group[0].namespace, &group[0].name);
        let ip = group[0].cluster_ip;
        let target = |s: &ShapedService| s.endpoints.first().map_or(0, SocketAddrV4::port);
        let svc_ports: Vec<String> = group
            .iter()
            .map(|s| {
                format!(
                    "{{name: \"{}\", port: {}, targetPort: {}, protocol: TCP}}",
                    s.port_name,
                    s.port,
                    target(s)
                )
            })
            .collect();
        let slice_ports: Vec<String> = group
            .iter()
            .map(|s| {
                format!(
                    "{{name: \"{}\", port: {}, protocol: TCP}}",
                    s.port_name,
                    target(s)
                )
            })
            .collect();
        let mut addresses: Vec<Ipv4Addr> = group
            .iter()
            .flat_map(|s| s.endpoints.iter().map(|e| *e.ip()))
            .collect();
        // Each port lists the same backends: one endpoint per address.
        addresses.sort_unstable();
        addresses.dedup();
        let endpoints: Vec<String> = addresses
            .iter()
            .map(|a| format!("{{addresses: [{a}], conditions: {{ready: true}}}}"))
            .collect();
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\n\
             metadata: {{name: {name}, namespace: {ns}}}\n\
             spec: {{type: ClusterIP, clusterIP: {ip}, clusterIPs: [{ip}], ipFamilies: [IPv4], \
             ports: [{}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nendpoints: [{}]\nports: [{}]\n",
            svc_ports.join(", "),
            endpoints.join(", "),
            slice_ports.join(", ")
        );
    }
    out
}

/// The agent's settings: the benchmark's, the pods' CIDR, and eBPF maps big enough for
/// `services` services of [`FILLER_ENDPOINTS`] endpoints (a frontend takes one service-map
/// slot per backend plus one, and its ClusterIP one more).
pub fn agent_fragment(services: u32) -> Map<String, Value> {
    let mut fragment = crate::agent::config_fragment();
    let per = FILLER_ENDPOINTS + 2;
    let room = |n: u32| n.saturating_mul(5) / 4 + 1024;
    fragment.insert("clusterCIDR".into(), json!(CLUSTER_CIDR));
    fragment.insert(
        "ebpf".into(),
        json!({"mapSizes": {
            "services": room(services.saturating_mul(per)).max(65_536),
            "backends": room(services.saturating_mul(FILLER_ENDPOINTS)).max(65_536),
            "revNat": room(services.saturating_mul(2)).max(65_536),
        }}),
    );
    fragment
}

/// A directory of `iptables*`/`ip6tables*` symlinks to the `-legacy` commands, for the
/// front of the agent's PATH: the nft backend of iptables 1.8.9 cannot restore 10,000+
/// services in reasonable time. Returns the PATH to run with.
pub fn legacy_path(dir: &Path) -> Result<OsString> {
    fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let system = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin".into());
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let legacy = format!("{family}-legacy{suffix}");
            let target = std::env::split_paths(&system)
                .map(|p| p.join(&legacy))
                .find(|p| p.is_file())
                .ok_or_else(|| Error::Setup(format!("{legacy} is not installed")))?;
            let link = dir.join(format!("{family}{suffix}"));
            if !link.exists() {
                std::os::unix::fs::symlink(&target, &link)
                    .map_err(Error::io(format!("linking {}", link.display())))?;
            }
        }
    }
    let mut paths = vec![PathBuf::from(dir)];
    paths.extend(std::env::split_paths(&system));
    std::env::join_paths(paths).map_err(|e| Error::Setup(format!("PATH: {e}")))
}

/// Runs `program args` in `place` with `input` on stdin, for at most `limit`; its stdout.
pub fn run_with_input(
    place: &Place,
    program: &str,
    args: &[&str],
    input: &str,
    limit: Duration,
) -> Result<String> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let what = format!("{program} {}", args.join(" "));
    let mut child = place
        .command(Path::new(program), &args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::io(format!("starting {what}")))?;
    // Feed and drain on threads: the tool may fill a pipe before it reads all its input.
    let stdin = child.stdin.take();
    let input = input.to_string();
    let writer = thread::spawn(move || stdin.map(|mut pipe| pipe.write_all(input.as_bytes())));
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = read(child.stdout.take().map(|p| Box::new(p) as _));
    let err = read(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(Error::io(format!("waiting for {what}")))?
        {
            break status;
        }
        let late = Instant::now() >= deadline;
        if late || signals::check().is_err() {
            let _ = child.kill();
            let _ = child.wait();
            signals::check()?;
            return Err(Error::Setup(format!(
                "{what} did not finish within {limit:?}"
            )));
        }
        thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        let first: Vec<&str> = stderr.lines().take(5).collect();
        return Err(Error::Setup(format!(
            "{what} failed ({status}): {}",
            first.join("; ")
        )));
    }
    Ok(stdout)
}

/// The ruleset of `direct-ct`: NAT hooks at prerouting, output and postrouting and a
/// forward filter with a conntrack match, so that conntrack tracks every flow through the
/// node, and rules that match nothing the benchmark sends (a documentation address).
pub const DIRECT_CT_RULESET: &str = "table ip bench-ct {
  chain bench_pre { type nat hook prerouting priority dstnat; ip daddr 192.0.2.1 tcp dport 9 dnat to 192.0.2.2; }
  chain bench_out { type nat hook output priority -100; ip daddr 192.0.2.1 tcp dport 9 dnat to 192.0.2.2; }
  chain bench_post { type nat hook postrouting priority srcnat; ip saddr 192.0.2.1 masquerade; }
  chain bench_forward { type filter hook forward priority filter; ct state invalid drop; }
}
";

/// How many services the agent's iptables mode has in `KUBE-SERVICES` of the node.
pub fn kube_services_rules(node: &Place, path: &OsString, limit: Duration) -> Result<usize> {
    let dump = run_with_input(
        node,
        "env",
        &[
            &format!("PATH={}", path.to_string_lossy()),
            "iptables-save",
            "-t",
            "nat",
        ],
        "",
        limit,
    )?;
    Ok(dump
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES ") && l.contains("-j KUBE-SVC-"))
        .count())
}

/// How many elements the `service-ips` verdict map of the agent's nftables table holds in
/// `node` (one per ClusterIP service port here); 0 while the table does not exist.
pub fn service_ips_elements(node: &Place, limit: Duration) -> Result<usize> {
    match run_with_input(
        node,
        "nft",
        &["list", "map", "ip", "kube-proxy", "service-ips"],
        "",
        limit,
    ) {
        Ok(listing) => Ok(map_elements(&listing)),
        // Before the first sync there is no table: nft says so with an error exit.
        Err(Error::Setup(_)) => Ok(0),
        Err(err) => Err(err),
    }
}

/// The elements of an `nft list map` listing of a verdict map: each has one ` : ` between
/// its key and its verdict, however nft wraps the lines.
pub fn map_elements(listing: &str) -> usize {
    listing
        .split_once("elements = {")
        .map_or(0, |(_, elements)| elements.matches(" : ").count())
}
