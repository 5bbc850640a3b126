// SPDX-License-Identifier: Apache-2.0
//! The namespaces of one scenario run: the node, an external network behind its
//! uplink, one namespace per pod (Calico-style routed veths), the node's cgroup, and
//! the listeners. Everything is named after a per-run id and removed on drop.

use std::{
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
    echo::{ListenKind, ListenSpec},
    error::{Error, Result},
    format::{NodeSpec, Proto},
    netns::{self, Place, add_netns, ip_in, sysctl_in},
    placement::{ClientPlace, Placement},
};

/// Every name a run creates starts with this, then 4 hex digits.
pub const PREFIX: &str = "kpt";
/// The pods' gateway, answered by proxy ARP on the host side of their veth.
pub const POD_GATEWAY_V4: &str = "169.254.1.1";
pub const POD_GATEWAY_V6: &str = "fe80::1";

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

#[derive(Debug)]
struct Managed {
    name: String,
    child: Child,
}

#[derive(Debug)]
pub struct Topology {
    pub id: String,
    pub node_ns: String,
    pub ext_ns: String,
    pub cgroup: PathBuf,
    pub run_dir: PathBuf,
    pub placement: Placement,
    node: NodeSpec,
    /// Namespaces created so far, for cleanup.
    namespaces: Vec<String>,
    processes: Vec<Managed>,
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
            cgroup: cgroup_root.join(format!("{id}-node")),
            id,
            run_dir,
            placement: placement.clone(),
            node: node.clone(),
            namespaces: Vec::new(),
            processes: Vec::new(),
            keep,
            cleaned: false,
        };
        netns::create_cgroup(&topology.cgroup)?;
        topology.build_network()?;
        topology.wait_links_up()?;
        Ok(topology)
    }

    /// Waits until every veth of every namespace reports operstate UP. Until the kernel's
    /// link watcher has processed a new carrier (up to a second later) the device still has
    /// the no-op qdisc, which silently drops what is sent: the first flow would lose its
    /// SYN and time out.
    fn wait_links_up(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for ns in &self.namespaces {
            loop {
                let out = netns::ip_in(ns, &["-o", "link", "show"])?;
                let pending = out
                    .lines()
                    .filter(|l| l.contains("veth") || l.contains("@"))
                    .any(|l| !l.contains("state UP"));
                if !pending {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(Error::Setup(format!(
                        "links in {ns} did not come up: {out}"
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        Ok(())
    }

    pub fn pod_ns(&self, index: usize) -> String {
        format!("{}-p{index}", self.id)
    }

    fn build_network(&mut self) -> Result<()> {
        let (node, ext) = (self.node_ns.clone(), self.ext_ns.clone());
        for ns in [&node, &ext] {
            add_netns(ns)?;
            self.namespaces.push(ns.clone());
        }
        sysctl_in(
            &node,
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ],
        )?;
        // The external side only sends and answers; it must not bounce untranslated
        // packets back to the node.
        sysctl_in(
            &ext,
            &[
                ("net.ipv4.ip_forward", "0"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ],
        )?;
        self.build_uplink()?;
        let mut host_sysctls = Vec::new();
        for (index, pod) in self.placement.pods.clone().iter().enumerate() {
            self.build_pod(index, pod.address)?;
            host_sysctls.push(format!("net.ipv4.conf.kp{index}.proxy_arp"));
            host_sysctls.push(format!("net.ipv4.neigh.kp{index}.proxy_delay"));
            host_sysctls.push(format!("net.ipv4.conf.kp{index}.rp_filter"));
        }
        // proxy_delay defaults to up to 0.8 s of random delay per proxied ARP reply.
        let values = ["1", "0", "0"];
        let settings: Vec<(&str, &str)> = host_sysctls
            .iter()
            .zip(values.iter().cycle())
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        if !settings.is_empty() {
            sysctl_in(&node, &settings)?;
        }
        Ok(())
    }

    fn build_uplink(&self) -> Result<()> {
        let (node, ext) = (self.node_ns.as_str(), self.ext_ns.as_str());
        ip_in(
            node,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "ext0", "netns", ext,
            ],
        )?;
        for address in &self.node.addresses {
            add_address(node, *address, "eth0")?;
        }
        add_address(ext, self.placement.router, "ext0")?;
        ip_in(node, &["link", "set", "eth0", "up"])?;
        ip_in(ext, &["link", "set", "ext0", "up"])?;
        let router = self.placement.router.addr().to_string();
        let primary = self.node.primary().addr().to_string();
        ip_in(
            node,
            &["route", "add", "default", "via", &router, "dev", "eth0"],
        )?;
        ip_in(
            ext,
            &["route", "add", "default", "via", &primary, "dev", "ext0"],
        )?;
        // Service addresses inside the uplink subnet would otherwise be ARPed for.
        for ip in &self.placement.routed_to_node {
            if ip.is_ipv4() == self.node.primary().addr().is_ipv4() {
                let dest = format!("{ip}/{}", host_prefix(*ip));
                ip_in(
                    ext,
                    &["route", "replace", &dest, "via", &primary, "dev", "ext0"],
                )?;
            }
        }
        for ip in self
            .placement
            .external_clients
            .iter()
            .chain(&self.placement.external_owned())
        {
            add_address(ext, host_net(*ip), "lo")?;
        }
        Ok(())
    }

    fn build_pod(&mut self, index: usize, address: IpAddr) -> Result<()> {
        let ns = self.pod_ns(index);
        add_netns(&ns)?;
        self.namespaces.push(ns.clone());
        let node = self.node_ns.as_str();
        let host_if = format!("kp{index}");
        ip_in(
            node,
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        add_address(&ns, host_net(address), "eth0")?;
        ip_in(&ns, &["link", "set", "eth0", "up"])?;
        ip_in(node, &["link", "set", &host_if, "up"])?;
        let route = format!("{address}/{}", host_prefix(address));
        ip_in(node, &["route", "add", &route, "dev", &host_if])?;
        if address.is_ipv4() {
            ip_in(
                &ns,
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
                &ns,
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
                &["-6", "addr", "add", &gateway, "dev", &host_if, "nodad"],
            )?;
            ip_in(
                &ns,
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

    fn pod_place(&self, ip: IpAddr) -> Option<Place> {
        self.placement.pod_index(ip).map(|index| Place {
            netns: self.pod_ns(index),
            cgroup: Some(self.cgroup.clone()),
        })
    }

    /// Starts the echo servers and plain listeners and waits until each has bound.
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
        let plain = |proto: Proto, addr| ListenSpec {
            kind: ListenKind::Plain,
            proto,
            addr,
        };
        let mut groups: Vec<(Place, Vec<ListenSpec>)> = Vec::new();
        for pod in &self.placement.pods {
            let mut specs: Vec<ListenSpec> = pod
                .echo_ports
                .iter()
                .flat_map(|p| echo(pod.address, *p))
                .collect();
            specs.extend(
                pod.plain
                    .iter()
                    .map(|(proto, port)| plain(*proto, (pod.address, *port).into())),
            );
            if let Some(place) = self.pod_place(pod.address) {
                groups.push((place, specs));
            }
        }
        let mut on_node: Vec<ListenSpec> = self
            .placement
            .node_echo
            .iter()
            .flat_map(|(ip, ports)| ports.iter().flat_map(|p| echo(*ip, *p)).collect::<Vec<_>>())
            .collect();
        on_node.extend(
            self.placement
                .node_plain
                .iter()
                .map(|(proto, a)| plain(*proto, *a)),
        );
        groups.push((self.node_place(), on_node));
        let external: Vec<ListenSpec> = self
            .placement
            .external_plain
            .iter()
            .map(|(proto, a)| plain(*proto, *a))
            .collect();
        let ext_place = Place {
            netns: self.ext_ns.clone(),
            cgroup: None,
        };
        groups.push((ext_place, external));

        for (place, specs) in groups {
            let specs: Vec<ListenSpec> = specs
                .into_iter()
                .filter(|s| sctp || s.proto != Proto::Sctp)
                .collect();
            if specs.is_empty() {
                continue;
            }
            let mut args = vec!["echo".to_string()];
            args.extend(specs.iter().map(ToString::to_string));
            let name = format!("echo-{}", place.netns);
            self.spawn_and_wait_ready(&name, &place, exe, &args)?;
        }
        Ok(())
    }

    fn spawn_and_wait_ready(
        &mut self,
        name: &str,
        place: &Place,
        exe: &Path,
        args: &[String],
    ) -> Result<()> {
        let log = self.run_dir.join(format!("{name}.log"));
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
        self.processes.push(Managed {
            name: name.to_string(),
            child,
        });
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut line = String::new();
            if let Some(out) = stdout {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            let _ = tx.send(line);
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if line.trim() == "READY" => Ok(()),
            other => Err(Error::Setup(format!(
                "{name} did not start ({}): {}",
                match other {
                    Ok(_) => "exited",
                    Err(_) => "timed out",
                },
                fs::read_to_string(&log).unwrap_or_default().trim()
            ))),
        }
    }

    /// Every address the node namespace owns right now.
    pub fn node_addresses(&self) -> Result<std::collections::BTreeSet<IpAddr>> {
        netns::addresses_in(&self.node_ns)
    }

    /// Removes everything; safe to call twice. Errors are printed, not returned: this
    /// runs from `Drop` too, and one failure must not stop the rest.
    pub fn cleanup(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
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

fn host_net(ip: IpAddr) -> IpNet {
    // A host prefix is always valid for its own family.
    IpNet::new(ip, host_prefix(ip)).unwrap_or_else(|_| IpNet::from(ip))
}

fn add_address(ns: &str, address: IpNet, dev: &str) -> Result<()> {
    let text = address.to_string();
    if address.addr().is_ipv4() {
        ip_in(ns, &["addr", "add", &text, "dev", dev]).map(drop)
    } else {
        ip_in(ns, &["-6", "addr", "add", &text, "dev", dev, "nodad"]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
