// SPDX-License-Identifier: Apache-2.0
//! The namespaces of one scenario run: the node, a switch its uplink plugs into, an
//! external network (the router and the external clients) and the remote nodes on that
//! switch, one namespace per pod (Calico-style routed veths) behind the node or a remote
//! node, the node's cgroup, and the listeners. Everything is named after a per-run id
//! and removed on drop.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader},
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ipnet::IpNet;

use super::{
    addr::host_prefix,
    echo::{ListenKind, ListenSpec, UNBOUND},
    error::{Error, Result},
    format::{NodeSpec, Proto},
    netns::{self, Place, add_netns, ip_in, sysctl_in},
    placement::{Binding, ClientPlace, Placement, RemoteNodePlan},
};

/// A plain listener that could not bind (the `echo` subcommand's `UNBOUND` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unbound {
    pub home: ClientPlace,
    pub spec: ListenSpec,
    /// Why, e.g. `Address already in use (os error 98) for 5 s`.
    pub reason: String,
}

impl Unbound {
    /// `UNBOUND plain/tcp/192.168.0.2:30000 <reason>` printed in the namespace of `home`.
    pub fn parse(home: ClientPlace, line: &str) -> Option<Self> {
        let rest = line.strip_prefix(UNBOUND)?.strip_prefix(' ')?;
        let (spec, reason) = rest.split_once(' ').unwrap_or((rest, ""));
        Some(Unbound {
            home,
            spec: spec.parse().ok()?,
            reason: reason.trim().to_string(),
        })
    }
}

/// Every name a run creates starts with this, then 4 hex digits.
pub const PREFIX: &str = "kpt";
/// The pods' gateway, answered by proxy ARP on the host side of their veth.
pub const POD_GATEWAY_V4: &str = "169.254.1.1";
pub const POD_GATEWAY_V6: &str = "fe80::1";

/// Set in every namespace before its interfaces are made. Duplicate address detection
/// off: an IPv6 address stays "tentative" (unusable as a source, not answered for) for
/// a second or more after it is added, which would lose a flow's first packets; and
/// unlimited ICMP errors, so that back-to-back rejected attempts (a UDP REJECT is an
/// ICMP port unreachable) are never silenced by the per-destination rate limit.
pub const NAMESPACE_SYSCTLS: [(&str, &str); 4] = [
    ("net.ipv6.conf.all.accept_dad", "0"),
    ("net.ipv6.conf.default.accept_dad", "0"),
    ("net.ipv6.icmp.ratelimit", "0"),
    ("net.ipv4.icmp_ratelimit", "0"),
];

pub fn runs_dir() -> PathBuf {
    std::env::temp_dir().join("scenario-runner")
}

/// A fresh `kpt<4 hex>` id that no namespace, cgroup or run directory uses yet.
pub fn new_run_id(cgroup_root: &Path) -> Result<String> {
    let existing = netns::list_netns()?;
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default()
        ^ std::process::id().rotate_left(16);
    for n in 0..1024u32 {
        let id = format!(
            "{PREFIX}{:04x}",
            (seed.wrapping_add(n.wrapping_mul(40503))) & 0xffff
        );
        let taken = existing.iter().any(|ns| ns.starts_with(&format!("{id}-")))
            || cgroup_root.join(format!("{id}-node")).exists()
            || runs_dir().join(&id).exists();
        if !taken {
            return Ok(id);
        }
    }
    Err(Error::Setup("no free run id".into()))
}

/// The run id a leftover name belongs to, if it is one of ours.
pub fn run_id_of(name: &str) -> Option<&str> {
    let id = name.get(..PREFIX.len() + 4)?;
    let hex = id.strip_prefix(PREFIX)?;
    let rest = &name[id.len()..];
    (hex.bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && (rest.is_empty() || rest.starts_with('-')))
    .then_some(id)
}

/// A long-running helper process (a listener, a server) started by
/// [`spawn_and_wait_ready`].
#[derive(Debug)]
pub struct Managed {
    name: String,
    child: Child,
}

impl Managed {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Kills the process and reaps it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        if let Err(err) = self.child.wait() {
            eprintln!("stopping {}: {err}", self.name);
        }
    }
}

/// Long-running helpers, each started with [`spawn_and_wait_ready`] (its log under
/// `log_dir`); killed and reaped on [`kill_all`](Self::kill_all) or drop.
#[derive(Debug)]
pub struct ReadyProcesses {
    log_dir: PathBuf,
    list: Vec<Managed>,
}

impl ReadyProcesses {
    pub fn new(log_dir: &Path) -> Self {
        ReadyProcesses {
            log_dir: log_dir.to_path_buf(),
            list: Vec::new(),
        }
    }

    /// Starts `exe args` in `place` and waits for its `READY` line (see
    /// [`spawn_and_wait_ready`]); returns the lines it printed before.
    pub fn spawn_ready(
        &mut self,
        name: &str,
        place: &Place,
        exe: &Path,
        args: &[String],
    ) -> Result<Vec<String>> {
        let (managed, before) = spawn_and_wait_ready(&self.log_dir, name, place, exe, args)?;
        self.list.push(managed);
        Ok(before)
    }

    /// Kills every process, then reaps them; safe to call twice.
    pub fn kill_all(&mut self) {
        for managed in &mut self.list {
            let _ = managed.child.kill();
        }
        for mut managed in self.list.drain(..) {
            if let Err(err) = managed.child.wait() {
                eprintln!("cleanup: waiting for {}: {err}", managed.name);
            }
        }
    }
}

impl Drop for ReadyProcesses {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Starts `exe args` in `place` (stderr to `<log_dir>/<name>.log`) and waits until it
/// prints `READY` (10 s, plus the listener's own `--bind-patience-ms`); also returns the
/// lines it printed before (plain listeners that could not bind). A process that exits
/// or times out is killed, and the error carries its log.
pub fn spawn_and_wait_ready(
    log_dir: &Path,
    name: &str,
    place: &Place,
    exe: &Path,
    args: &[String],
) -> Result<(Managed, Vec<String>)> {
    let log = log_dir.join(format!("{name}.log"));
    let stderr =
        fs::File::create(&log).map_err(Error::io(format!("creating {}", log.display())))?;
    let mut child = place
        .command(exe, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(Error::io(format!("starting {name}")))?;
    let stdout = child.stdout.take();
    let mut managed = Managed {
        name: name.to_string(),
        child,
    };
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut before = Vec::new();
        let mut ready = false;
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.trim() == "READY" {
                    ready = true;
                    break;
                }
                before.push(line);
            }
        }
        let _ = tx.send((ready, before));
    });
    // The listener's own bind patience comes on top of starting it.
    let patience = args
        .iter()
        .position(|a| a == "--bind-patience-ms")
        .and_then(|i| args.get(i + 1))
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    let outcome = rx.recv_timeout(Duration::from_secs(10) + patience);
    match outcome {
        Ok((true, before)) => Ok((managed, before)),
        other => {
            let _ = managed.child.kill();
            let _ = managed.child.wait();
            Err(Error::Setup(format!(
                "{name} did not start ({}): {}",
                match other {
                    Ok(_) => "exited",
                    Err(_) => "timed out",
                },
                fs::read_to_string(&log).unwrap_or_default().trim()
            )))
        }
    }
}

/// The node's uplink device, in the node namespace and in every remote node's.
pub const UPLINK: &str = "eth0";
/// The bridge of the switch namespace.
const SWITCH_BRIDGE: &str = "br0";

#[derive(Debug)]
pub struct Topology {
    pub id: String,
    pub node_ns: String,
    pub ext_ns: String,
    /// The switch: a bridge joining the node's uplink, the external router and the
    /// remote nodes on one L2 segment.
    pub switch_ns: String,
    pub cgroup: PathBuf,
    pub run_dir: PathBuf,
    pub placement: Placement,
    node: NodeSpec,
    /// Namespaces created so far, for cleanup.
    namespaces: Vec<String>,
    /// Echo servers, for the whole run.
    processes: Vec<Managed>,
    /// The current stage's plain listeners.
    plain: Vec<Managed>,
    keep: bool,
    cleaned: bool,
}

impl Topology {
    /// Creates everything but the listeners. On error, what was created is removed.
    pub fn build(node: &NodeSpec, placement: &Placement, keep: bool) -> Result<Self> {
        let cgroup_root = netns::cgroup2_root()?;
        let id = new_run_id(&cgroup_root)?;
        let run_dir = runs_dir().join(&id);
        fs::create_dir_all(&run_dir)
            .map_err(Error::io(format!("creating {}", run_dir.display())))?;
        fs::write(run_dir.join("runner.pid"), std::process::id().to_string())
            .map_err(Error::io("writing runner.pid"))?;
        let mut topology = Topology {
            node_ns: format!("{id}-node"),
            ext_ns: format!("{id}-ext"),
            switch_ns: format!("{id}-lan"),
            cgroup: cgroup_root.join(format!("{id}-node")),
            id,
            run_dir,
            placement: placement.clone(),
            node: node.clone(),
            namespaces: Vec::new(),
            processes: Vec::new(),
            plain: Vec::new(),
            keep,
            cleaned: false,
        };
        netns::create_cgroup(&topology.cgroup)?;
        topology.build_network()?;
        topology.wait_links_up()?;
        Ok(topology)
    }

    /// Waits until every veth of every namespace reports operstate UP and no IPv6 address
    /// is still tentative. Until the kernel's link watcher has processed a new carrier (up
    /// to a second later) the device still has the no-op qdisc, which silently drops what
    /// is sent: the first flow would lose its SYN and time out.
    fn wait_links_up(&self) -> Result<()> {
        wait_links_up(&self.namespaces)
    }

    pub fn pod_ns(&self, index: usize) -> String {
        format!("{}-p{index}", self.id)
    }

    /// The namespace of the remote node at `index` of [`Placement::remote_nodes`].
    pub fn remote_ns(&self, index: usize) -> String {
        format!("{}-r{index}", self.id)
    }

    fn build_network(&mut self) -> Result<()> {
        let (node, ext) = (self.node_ns.clone(), self.ext_ns.clone());
        self.build_switch()?;
        for ns in [&node, &ext] {
            add_netns(ns)?;
            self.namespaces.push(ns.clone());
        }
        let node_settings = [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv6.conf.default.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        sysctl_in(
            &node,
            &[&node_settings[..], &NAMESPACE_SYSCTLS[..]].concat(),
        )?;
        // The external side only sends and answers; it must not bounce untranslated
        // packets back to the node.
        let ext_settings = [
            ("net.ipv4.ip_forward", "0"),
            ("net.ipv6.conf.all.forwarding", "0"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        sysctl_in(&ext, &[&ext_settings[..], &NAMESPACE_SYSCTLS[..]].concat())?;
        self.build_uplink()?;
        let remote_nodes = self.placement.remote_nodes.clone();
        for (index, remote) in remote_nodes.iter().enumerate() {
            self.build_remote_node(index, remote)?;
        }
        // The namespace each pod's veth starts in: the node's, or its remote node's.
        let mut host_sysctls: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (index, pod) in self.placement.pods.clone().iter().enumerate() {
            let host = match pod.remote {
                Some(remote) => self.remote_ns(remote),
                None => node.clone(),
            };
            self.build_pod(index, pod.address, &host)?;
            if let Some(remote) = self.placement.remote_node_of(pod) {
                // The node reaches a remote pod through its node, over the uplink.
                let via = remote.address_for(pod.address).ok_or_else(|| {
                    Error::Setup(format!(
                        "remote node {} has no address for {}",
                        remote.name, pod.address
                    ))
                })?;
                let route = host_net(pod.address).to_string();
                let via = via.addr().to_string();
                ip_in(&node, &["route", "add", &route, "via", &via, "dev", UPLINK])?;
            }
            host_sysctls.entry(host).or_default().extend([
                format!("net.ipv4.conf.kp{index}.proxy_arp"),
                format!("net.ipv4.neigh.kp{index}.proxy_delay"),
                format!("net.ipv4.conf.kp{index}.rp_filter"),
            ]);
        }
        // proxy_delay defaults to up to 0.8 s of random delay per proxied ARP reply.
        let values = ["1", "0", "0"];
        for (host, keys) in &host_sysctls {
            let settings: Vec<(&str, &str)> = keys
                .iter()
                .zip(values.iter().cycle())
                .map(|(k, v)| (k.as_str(), *v))
                .collect();
            sysctl_in(host, &settings)?;
        }
        Ok(())
    }

    /// The L2 segment of the uplink: a bridge in a namespace of its own, which only
    /// switches frames (no addresses, no IPv6, no netfilter on bridged traffic).
    fn build_switch(&mut self) -> Result<()> {
        let lan = self.switch_ns.clone();
        add_netns(&lan)?;
        self.namespaces.push(lan.clone());
        build_switch(&lan)
    }

    /// A veth from the switch to `ns`, named `device` there and `port` on the switch.
    fn plug_into_switch(&self, ns: &str, device: &str, port: &str) -> Result<()> {
        plug_into_switch(&self.switch_ns, ns, device, port)
    }

    /// A remote node: forwards for its pods (built later), reaches the node's pods and
    /// addresses through the node, and everything else through the external router, as
    /// a node of a routed cluster does. Traffic the proxy sends to a pod here leaves the
    /// node through its uplink; the pod's replies come back the same way.
    fn build_remote_node(&mut self, index: usize, remote: &RemoteNodePlan) -> Result<()> {
        let ns = self.remote_ns(index);
        add_netns(&ns)?;
        self.namespaces.push(ns.clone());
        let settings = [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv6.conf.default.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        sysctl_in(&ns, &[&settings[..], &NAMESPACE_SYSCTLS[..]].concat())?;
        self.plug_into_switch(&ns, UPLINK, &format!("r{index}"))?;
        for address in &remote.addresses {
            add_address(&ns, *address, UPLINK)?;
        }
        for address in &remote.addresses {
            let ip = address.addr();
            let Some(node_side) = self.node.primary_for(ip) else {
                continue;
            };
            let node_side = node_side.addr().to_string();
            if let Some(router) = self.placement.router_for(ip) {
                let router = router.addr().to_string();
                ip_in(
                    &ns,
                    &["route", "add", "default", "via", &router, "dev", UPLINK],
                )?;
            }
            let same_family = |net: &IpNet| net.addr().is_ipv4() == ip.is_ipv4();
            let mut through_node: Vec<IpNet> = self
                .node
                .pod_cidrs
                .iter()
                .copied()
                .filter(same_family)
                .map(|c| c.trunc())
                .collect();
            // The node's other addresses, which may lie outside this node's subnet.
            through_node.extend(
                self.node
                    .addresses
                    .iter()
                    .filter(|a| same_family(a) && !address.contains(&a.addr()))
                    .map(|a| host_net(a.addr())),
            );
            for dest in through_node {
                let dest = dest.to_string();
                ip_in(
                    &ns,
                    &["route", "replace", &dest, "via", &node_side, "dev", UPLINK],
                )?;
            }
            // Pods of the other remote nodes, through them.
            for pod in &self.placement.pods {
                let Some(other) = pod.remote.filter(|other| *other != index) else {
                    continue;
                };
                let other = &self.placement.remote_nodes[other];
                if let Some(via) = other
                    .address_for(pod.address)
                    .filter(|_| same_family(&host_net(pod.address)))
                {
                    let dest = host_net(pod.address).to_string();
                    let via = via.addr().to_string();
                    ip_in(&ns, &["route", "add", &dest, "via", &via, "dev", UPLINK])?;
                }
            }
        }
        Ok(())
    }

    fn build_uplink(&self) -> Result<()> {
        let (node, ext) = (self.node_ns.as_str(), self.ext_ns.as_str());
        self.plug_into_switch(node, UPLINK, "n0")?;
        self.plug_into_switch(ext, "ext0", "x0")?;
        for address in &self.node.addresses {
            add_address(node, *address, UPLINK)?;
        }
        for router in &self.placement.routers {
            add_address(ext, *router, "ext0")?;
        }
        // One router and one pair of default routes per family the node has an address of.
        for router in &self.placement.routers {
            let Some(node_side) = self.node.primary_for(router.addr()) else {
                continue;
            };
            let (router, node_side) = (router.addr().to_string(), node_side.addr().to_string());
            ip_in(
                node,
                &["route", "add", "default", "via", &router, "dev", UPLINK],
            )?;
            ip_in(
                ext,
                &["route", "add", "default", "via", &node_side, "dev", "ext0"],
            )?;
        }
        // Service addresses inside the uplink subnet would otherwise be resolved on the
        // link (ARP / neighbour discovery) instead of being sent to the node.
        for ip in &self.placement.routed_to_node {
            if let Some(node_side) = self.node.primary_for(*ip) {
                let dest = format!("{ip}/{}", host_prefix(*ip));
                let via = node_side.addr().to_string();
                ip_in(
                    ext,
                    &["route", "replace", &dest, "via", &via, "dev", "ext0"],
                )?;
            }
        }
        for ip in self
            .placement
            .external_clients
            .iter()
            .chain(&self.placement.external_owned)
        {
            add_address(ext, host_net(*ip), "lo")?;
        }
        self.answer_untranslated()
    }

    /// What the node sends out for a service address it routes here was left untranslated
    /// by the proxy. Without this it would vanish (this namespace does not forward), so a
    /// proxy that failed to drop it would still pass a DROP flow. This namespace owns those
    /// addresses, so the kernel refuses such packets (TCP reset, ICMP port unreachable) and
    /// answers ARP / neighbour solicitations for the ones inside the uplink subnet; its
    /// own packets to them (the external clients') still go to the node, by a policy rule
    /// consulted before the local table, which is moved behind it.
    fn answer_untranslated(&self) -> Result<()> {
        let ext = self.ext_ns.as_str();
        let mut families = BTreeSet::new();
        for ip in &self.placement.answered_outside {
            if self.node.primary_for(*ip).is_none() {
                continue;
            }
            let family = family_flag(*ip);
            if families.insert(family) {
                ip_in(
                    ext,
                    &[
                        family,
                        "rule",
                        "add",
                        "pref",
                        LOCAL_RULE_PREF,
                        "lookup",
                        "local",
                    ],
                )?;
                ip_in(
                    ext,
                    &[family, "rule", "del", "pref", "0", "lookup", "local"],
                )?;
            }
            let dest = format!("{ip}/{}", host_prefix(*ip));
            ip_in(
                ext,
                &[
                    family,
                    "rule",
                    "add",
                    "pref",
                    OWN_TRAFFIC_RULE_PREF,
                    "iif",
                    "lo",
                    "to",
                    &dest,
                    "lookup",
                    "main",
                ],
            )?;
            // Without a prefix route of its own: the main table keeps sending the
            // namespace's own traffic for it to the node.
            let own = host_net(*ip).to_string();
            let mut args = vec![family, "addr", "add", own.as_str(), "dev", "ext0"];
            if ip.is_ipv6() {
                args.extend(["nodad", "noprefixroute"]);
            }
            ip_in(ext, &args)?;
        }
        Ok(())
    }

    /// A pod namespace behind `host` (the node's namespace or a remote node's).
    fn build_pod(&mut self, index: usize, address: IpAddr, host: &str) -> Result<()> {
        let ns = self.pod_ns(index);
        add_netns(&ns)?;
        self.namespaces.push(ns.clone());
        build_routed_pod(host, &ns, &format!("kp{index}"), address)
    }

    /// Where a client of this address runs.
    pub fn client_place(&self, ip: IpAddr) -> Place {
        match self.placement.place_client(&self.node, ip) {
            ClientPlace::Node => self.node_place(),
            ClientPlace::Pod(ip) => self.pod_place(ip).unwrap_or_else(|| self.node_place()),
            ClientPlace::External => Place {
                netns: self.ext_ns.clone(),
                cgroup: None,
            },
        }
    }

    pub fn node_place(&self) -> Place {
        Place {
            netns: self.node_ns.clone(),
            cgroup: Some(self.cgroup.clone()),
        }
    }

    /// A pod behind the node runs in the node's cgroup (the proxy's socket programs see
    /// it); one on a remote node does not: no proxy runs there.
    fn pod_place(&self, ip: IpAddr) -> Option<Place> {
        self.placement.pod_index(ip).map(|index| Place {
            netns: self.pod_ns(index),
            cgroup: self.placement.pods[index]
                .remote
                .is_none()
                .then(|| self.cgroup.clone()),
        })
    }

    /// The namespace (and cgroup) of a place; `None` for a pod the plan does not have.
    fn place_of(&self, place: ClientPlace) -> Option<Place> {
        match place {
            ClientPlace::Node => Some(self.node_place()),
            ClientPlace::Pod(ip) => self.pod_place(ip),
            ClientPlace::External => Some(Place {
                netns: self.ext_ns.clone(),
                cgroup: None,
            }),
        }
    }

    /// Starts the echo servers (of every stage: pods and host-network endpoints exist for
    /// the whole file) and waits until each has bound. Plain listeners are per stage:
    /// [`Topology::start_plain_listeners`].
    pub fn start_listeners(&mut self, exe: &Path, sctp: bool) -> Result<()> {
        let protos: Vec<Proto> = Proto::ALL
            .into_iter()
            .filter(|p| sctp || *p != Proto::Sctp)
            .collect();
        let echo = |ip: IpAddr, port: u16| {
            protos.iter().map(move |proto| ListenSpec {
                kind: ListenKind::Echo,
                proto: *proto,
                addr: (ip, port).into(),
            })
        };
        let mut groups: Vec<(Place, Vec<ListenSpec>)> = Vec::new();
        for pod in &self.placement.pods {
            let specs: Vec<ListenSpec> = pod
                .echo_ports
                .iter()
                .flat_map(|p| echo(pod.address, *p))
                .collect();
            if let Some(place) = self.pod_place(pod.address) {
                groups.push((place, specs));
            }
        }
        let on_node: Vec<ListenSpec> = self
            .placement
            .node_echo
            .iter()
            .flat_map(|(ip, ports)| ports.iter().flat_map(|p| echo(*ip, *p)).collect::<Vec<_>>())
            .collect();
        groups.push((self.node_place(), on_node));
        for (place, specs) in groups {
            if specs.is_empty() {
                continue;
            }
            let mut args = vec!["echo".to_string()];
            args.extend(specs.iter().map(ToString::to_string));
            let name = format!("echo-{}", place.netns);
            let (managed, _) = self.spawn_and_wait_ready(&name, &place, exe, &args)?;
            self.processes.push(managed);
        }
        Ok(())
    }

    /// Starts the plain listeners of `stage` (SCTP ones only with `sctp`), one process per
    /// namespace and [`Binding`], and waits until each has bound what it could. A
    /// [`Binding::Patient`] address still in use (a port the proxy served in the previous
    /// stage and is closing) is retried for up to `patience`; the others are tried once.
    /// What never bound is returned with the reason (witnesses excepted: no flow of the
    /// stage needs them), and the flows to it are probed all the same (whatever holds the
    /// port answers them).
    pub fn start_plain_listeners(
        &mut self,
        stage: usize,
        exe: &Path,
        sctp: bool,
        patience: Duration,
    ) -> Result<Vec<Unbound>> {
        let mut groups: BTreeMap<(ClientPlace, Binding), Vec<ListenSpec>> = BTreeMap::new();
        for listener in self.placement.plain_of(stage) {
            if sctp || listener.proto != Proto::Sctp {
                let group = (listener.home, listener.binding);
                groups.entry(group).or_default().push(ListenSpec {
                    kind: ListenKind::Plain,
                    proto: listener.proto,
                    addr: listener.addr,
                });
            }
        }
        let mut unbound = Vec::new();
        for ((home, binding), specs) in groups {
            let place = self.place_of(home).ok_or_else(|| {
                Error::Setup(format!("no namespace for plain listeners in {home:?}"))
            })?;
            let (wait, tag) = match binding {
                Binding::Patient => (patience, ""),
                Binding::Once => (Duration::ZERO, "-once"),
                Binding::Witness => (Duration::ZERO, "-witness"),
            };
            let mut args = vec![
                "echo".to_string(),
                "--bind-patience-ms".into(),
                wait.as_millis().to_string(),
            ];
            args.extend(specs.iter().map(ToString::to_string));
            let name = format!("plain{stage}{tag}-{}", place.netns);
            let (managed, lines) = self.spawn_and_wait_ready(&name, &place, exe, &args)?;
            self.plain.push(managed);
            for line in lines {
                let Some(mut u) = Unbound::parse(home, &line) else {
                    return Err(Error::Setup(format!(
                        "{name}: unexpected line before READY: {line}"
                    )));
                };
                match binding {
                    Binding::Patient => unbound.push(u),
                    Binding::Once => {
                        u.reason
                            .push_str(" (a LOCAL flow of this step has the proxy serve this port)");
                        unbound.push(u);
                    }
                    Binding::Witness => {}
                }
            }
        }
        Ok(unbound)
    }

    /// Stops the current stage's plain listeners and waits until they have exited (their
    /// ports are free again), before the next change reaches the proxy.
    pub fn stop_plain_listeners(&mut self) {
        for managed in &mut self.plain {
            let _ = managed.child.kill();
        }
        for mut managed in self.plain.drain(..) {
            managed.stop();
        }
    }

    /// Starts a listener process and waits for its `READY`; also returns the lines it
    /// printed before (plain listeners that could not bind).
    fn spawn_and_wait_ready(
        &self,
        name: &str,
        place: &Place,
        exe: &Path,
        args: &[String],
    ) -> Result<(Managed, Vec<String>)> {
        spawn_and_wait_ready(&self.run_dir, name, place, exe, args)
    }

    /// Every address the node namespace owns right now.
    pub fn node_addresses(&self) -> Result<std::collections::BTreeSet<IpAddr>> {
        netns::addresses_in(&self.node_ns).map_err(Into::into)
    }

    /// Removes everything; safe to call twice. Errors are printed, not returned: this
    /// runs from `Drop` too, and one failure must not stop the rest.
    pub fn cleanup(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        self.stop_plain_listeners();
        for managed in &mut self.processes {
            let _ = managed.child.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for managed in &mut self.processes {
            while matches!(managed.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            if matches!(managed.child.try_wait(), Ok(None)) {
                eprintln!("cleanup: {} did not exit", managed.name);
            }
        }
        if let Err(err) = netns::remove_cgroup(&self.cgroup) {
            eprintln!("cleanup: {err}");
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(err) = netns::delete_netns(ns) {
                eprintln!("cleanup: {err}");
            }
        }
        if let Err(err) = fs::remove_dir_all(&self.run_dir) {
            eprintln!("cleanup: removing {}: {err}", self.run_dir.display());
        }
    }

    pub fn keep(&self) -> bool {
        self.keep
    }

    /// Namespaces this topology created (for tests and `--keep` hints).
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "kept: namespaces {:?}, cgroup {}, run dir {} (remove with `scenario-runner cleanup-stale`)",
                self.namespaces,
                self.cgroup.display(),
                self.run_dir.display()
            );
            return;
        }
        self.cleanup();
    }
}

pub fn wait_links_up(namespaces: &[String]) -> Result<()> {
    let deadline =
        std::time::Instant::now() + super::readiness::scaled(std::time::Duration::from_secs(5));
    for ns in namespaces {
        loop {
            let out = netns::ip_in(ns, &["-o", "link", "show"])?;
            let links_pending = out
                .lines()
                .filter(|l| l.contains("veth") || l.contains("@"))
                .any(|l| !l.contains("state UP"));
            // With DAD off nothing should stay tentative; if the kernel ignored that
            // setting, wait the detection out rather than lose the first packets.
            let tentative = netns::ip_in(ns, &["-6", "-o", "addr", "show", "tentative"])?;
            let failed = netns::ip_in(ns, &["-6", "-o", "addr", "show", "dadfailed"])?;
            if !failed.trim().is_empty() {
                return Err(Error::Setup(format!(
                    "duplicate IPv6 address in {ns}: {failed}"
                )));
            }
            if !links_pending && tentative.trim().is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::Setup(format!(
                    "links in {ns} did not come up: {out}{tentative}"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Makes namespace `lan` a switch (see [`Topology::switch_ns`]): one bridge, no addresses,
/// no IPv6, no netfilter on bridged traffic.
pub fn build_switch(lan: &str) -> Result<()> {
    sysctl_in(
        lan,
        &[
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
        ],
    )?;
    // Only where bridge netfilter exists (`-e` ignores unknown keys).
    netns::sysctl_in_ignoring_unknown(
        lan,
        &[
            ("net.bridge.bridge-nf-call-iptables", "0"),
            ("net.bridge.bridge-nf-call-ip6tables", "0"),
            ("net.bridge.bridge-nf-call-arptables", "0"),
        ],
    )?;
    // No STP and no multicast snooping: ports forward at once, and neighbour
    // solicitations (multicast) reach every port whatever MLD state the bridge saw.
    ip_in(
        lan,
        &[
            "link",
            "add",
            SWITCH_BRIDGE,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
            "mcast_snooping",
            "0",
        ],
    )?;
    ip_in(lan, &["link", "set", SWITCH_BRIDGE, "up"])
        .map(drop)
        .map_err(Into::into)
}

/// A veth from the switch namespace `lan` to `ns`, named `device` there and `port` on
/// the switch.
pub fn plug_into_switch(lan: &str, ns: &str, device: &str, port: &str) -> Result<()> {
    ip_in(
        lan,
        &[
            "link", "add", port, "type", "veth", "peer", "name", device, "netns", ns,
        ],
    )?;
    ip_in(lan, &["link", "set", port, "master", SWITCH_BRIDGE])?;
    ip_in(lan, &["link", "set", port, "up"])?;
    ip_in(ns, &["link", "set", device, "up"])
        .map(drop)
        .map_err(Into::into)
}

/// Plugs the existing namespace `ns` in as a pod of `host` (Calico-style): a veth
/// `host_if` there and `eth0` in the pod holding `address`, a host route to it, and
/// the pod's default route through the proxy-ARP gateway. The caller sets the
/// host-side sysctls of `host_if` (proxy_arp 1, proxy_delay 0, rp_filter 0).
pub fn build_routed_pod(host: &str, ns: &str, host_if: &str, address: IpAddr) -> Result<()> {
    // Before the veth exists: its end here takes the namespace's defaults.
    sysctl_in(ns, &NAMESPACE_SYSCTLS)?;
    let node = host;
    ip_in(
        node,
        &[
            "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ],
    )?;
    add_address(ns, host_net(address), "eth0")?;
    ip_in(ns, &["link", "set", "eth0", "up"])?;
    ip_in(node, &["link", "set", host_if, "up"])?;
    let route = format!("{address}/{}", host_prefix(address));
    ip_in(node, &["route", "add", &route, "dev", host_if])?;
    if address.is_ipv4() {
        ip_in(
            ns,
            &[
                "route",
                "add",
                POD_GATEWAY_V4,
                "dev",
                "eth0",
                "scope",
                "link",
            ],
        )?;
        ip_in(
            ns,
            &[
                "route",
                "add",
                "default",
                "via",
                POD_GATEWAY_V4,
                "dev",
                "eth0",
            ],
        )?;
    } else {
        let gateway = format!("{POD_GATEWAY_V6}/64");
        ip_in(
            node,
            &["-6", "addr", "add", &gateway, "dev", host_if, "nodad"],
        )?;
        ip_in(
            ns,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                POD_GATEWAY_V6,
                "dev",
                "eth0",
            ],
        )?;
    }
    Ok(())
}

pub fn host_net(ip: IpAddr) -> IpNet {
    // A host prefix is always valid for its own family.
    IpNet::new(ip, host_prefix(ip)).unwrap_or_else(|_| IpNet::from(ip))
}

/// Rule preferences in the external namespace (see [`Topology::answer_untranslated`]):
/// its own traffic to the addresses it answers for goes by the main table (to the node),
/// before the local table is consulted.
const OWN_TRAFFIC_RULE_PREF: &str = "10";
const LOCAL_RULE_PREF: &str = "1000";

fn family_flag(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "-4" } else { "-6" }
}

pub fn add_address(ns: &str, address: IpNet, dev: &str) -> Result<()> {
    let text = address.to_string();
    if address.addr().is_ipv4() {
        ip_in(ns, &["addr", "add", &text, "dev", dev])
            .map(drop)
            .map_err(Into::into)
    } else {
        ip_in(ns, &["-6", "addr", "add", &text, "dev", dev, "nodad"])
            .map(drop)
            .map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unbound_lines() {
        let home = ClientPlace::Pod("10.0.0.2".parse().unwrap());
        let u = Unbound::parse(
            home,
            "UNBOUND plain/tcp/127.0.0.1:5555 Address already in use (os error 98); the port never freed within 5000 ms",
        )
        .unwrap();
        assert_eq!(u.home, home);
        assert_eq!(u.spec.to_string(), "plain/tcp/127.0.0.1:5555");
        assert_eq!(
            u.reason,
            "Address already in use (os error 98); the port never freed within 5000 ms"
        );
        assert!(Unbound::parse(home, "READY").is_none());
        assert!(Unbound::parse(home, "UNBOUND nonsense").is_none());
    }

    #[test]
    fn recognises_our_names() {
        assert_eq!(run_id_of("kpt3fa2-node"), Some("kpt3fa2"));
        assert_eq!(run_id_of("kpt3fa2-p12"), Some("kpt3fa2"));
        assert_eq!(run_id_of("kpt3fa2"), Some("kpt3fa2"));
        assert_eq!(run_id_of("kpt3fa2x"), None);
        assert_eq!(run_id_of("kptzzzz-node"), None);
        assert_eq!(run_id_of("kpt3FA2-node"), None);
        assert_eq!(run_id_of("kp0"), None);
        assert_eq!(run_id_of("other-node"), None);
    }
}
