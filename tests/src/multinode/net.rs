// SPDX-License-Identifier: Apache-2.0
//! The network of a three-node cluster (IPv4): one switch, an external router, three
//! node namespaces, pods behind every node.
//!
//! ```text
//!                       ext (192.168.0.1, clients 203.0.113.x on lo)
//!                        |  pod CIDRs routed to their nodes; LB IPs: ECMP over
//!                        |  the three nodes, or pinned per client address
//!        ----------------+---------------- switch (bridge, own namespace)
//!        |               |               |
//!     node 0          node 1          node 2        192.168.0.11/.12/.13, forwarding,
//!   10.1.0.0/24     10.2.0.0/24     10.3.0.0/24     routes to the others' pod CIDRs
//!     |  |            |  |            |  |
//!    pods (routed veths `kp<n>`, proxy-ARP gateway 169.254.1.1, in the node's cgroup)
//! ```
//!
//! Every node has its own cgroup (its agent, its pods and its clients run there) and its
//! own bpffs root; nothing is shared between nodes but the switch. Names carry a per-run
//! id (`kpt<4 hex>`, as the scenario runner's), so `scenario-runner cleanup-stale`
//! removes what a crashed run left.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
};

use crate::scenario::{
    Error, Result,
    netns::{self, Place, add_netns, ip_in, sysctl_in},
    topology::{
        NAMESPACE_SYSCTLS, add_address, build_routed_pod, build_switch, new_run_id,
        plug_into_switch, runs_dir, wait_links_up,
    },
};

/// How many nodes a cluster has.
pub const NODE_COUNT: usize = 3;
/// The external router's address on the switch.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 1);
/// Where every node's pods are: the agents' `clusterCIDR`.
pub const CLUSTER_CIDR: &str = "10.0.0.0/8";
/// A client of the external namespace whose packets to an LB IP take the ECMP route.
pub const EXTERNAL_CLIENT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);

/// The uplink device of every node.
const UPLINK: &str = "eth0";
/// The routing table (in the external namespace) of the client pinned to node `i`.
const PINNED_TABLE_BASE: u32 = 100;

/// Node `index`'s address on the switch.
pub fn node_address(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 0, 11 + index as u8)
}

/// Node `index`'s name (its Node object and its agent's `hostnameOverride`).
pub fn node_name(index: usize) -> String {
    format!("node-{}", (b'a' + index as u8) as char)
}

/// Node `index`'s pod CIDR.
pub fn pod_cidr(index: usize) -> String {
    format!("10.{}.0.0/24", index + 1)
}

/// The `host`-th pod address of node `index` (hosts from 10 up are pods).
pub fn pod_address(index: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, index as u8 + 1, 0, host)
}

/// An external client whose packets to the LB IPs the router sends to node `index`
/// (policy routing by source address: one ECMP "choice" made on purpose).
pub fn pinned_client(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(203, 0, 113, 11 + index as u8)
}

/// One node of the cluster.
#[derive(Debug, Clone)]
pub struct NodeNet {
    pub name: String,
    pub ns: String,
    pub cgroup: PathBuf,
    pub bpffs_root: PathBuf,
    pub address: Ipv4Addr,
}

impl NodeNet {
    /// The node namespace in the node's cgroup (where its agent and host clients run).
    pub fn place(&self) -> Place {
        Place {
            netns: self.ns.clone(),
            cgroup: Some(self.cgroup.clone()),
        }
    }
}

/// One pod: a namespace behind its node, its processes in the node's cgroup.
#[derive(Debug, Clone)]
pub struct PodNet {
    pub node: usize,
    pub ns: String,
    pub address: Ipv4Addr,
}

#[derive(Debug)]
pub struct ClusterNet {
    pub id: String,
    pub ext_ns: String,
    pub nodes: Vec<NodeNet>,
    pub pods: Vec<PodNet>,
    pub run_dir: PathBuf,
    lan_ns: String,
    namespaces: Vec<String>,
    cleaned: bool,
}

impl ClusterNet {
    /// Builds the switch, the router, the nodes and the pods (`(node, host)` pairs, see
    /// [`pod_address`]); `lb_ips` are routed by ECMP over the nodes, and to one node for
    /// each [`pinned_client`]. On error, what was made is removed.
    pub fn build(pods: &[(usize, u8)], lb_ips: &[Ipv4Addr]) -> Result<Self> {
        let cgroup_root = netns::cgroup2_root()?;
        let id = new_run_id(&cgroup_root)?;
        let run_dir = runs_dir().join(&id);
        std::fs::create_dir_all(&run_dir)
            .map_err(Error::io(format!("creating {}", run_dir.display())))?;
        std::fs::write(run_dir.join("runner.pid"), std::process::id().to_string())
            .map_err(Error::io("writing runner.pid"))?;
        let nodes = (0..NODE_COUNT)
            .map(|index| NodeNet {
                name: node_name(index),
                ns: format!("{id}-n{index}"),
                cgroup: cgroup_root.join(format!("{id}-n{index}")),
                bpffs_root: PathBuf::from("/sys/fs/bpf").join(format!("{id}-n{index}")),
                address: node_address(index),
            })
            .collect();
        let mut net = ClusterNet {
            ext_ns: format!("{id}-ext"),
            lan_ns: format!("{id}-lan"),
            id,
            nodes,
            pods: Vec::new(),
            run_dir,
            namespaces: Vec::new(),
            cleaned: false,
        };
        net.build_all(pods, lb_ips)?;
        wait_links_up(&net.namespaces)?;
        Ok(net)
    }

    fn add_ns(&mut self, ns: &str) -> Result<()> {
        add_netns(ns)?;
        self.namespaces.push(ns.to_string());
        Ok(())
    }

    fn build_all(&mut self, pods: &[(usize, u8)], lb_ips: &[Ipv4Addr]) -> Result<()> {
        let (lan, ext) = (self.lan_ns.clone(), self.ext_ns.clone());
        self.add_ns(&lan)?;
        build_switch(&lan)?;
        self.build_router(&ext, lb_ips)?;
        for index in 0..NODE_COUNT {
            self.build_node(index)?;
        }
        for (n, &(node, host)) in pods.iter().enumerate() {
            let address = pod_address(node, host);
            let ns = format!("{}-p{n}", self.id);
            self.add_ns(&ns)?;
            let node_ns = self.nodes[node].ns.clone();
            let host_if = format!("kp{n}");
            build_routed_pod(&node_ns, &ns, &host_if, IpAddr::V4(address))?;
            sysctl_in(
                &node_ns,
                &[
                    (&format!("net.ipv4.conf.{host_if}.proxy_arp"), "1"),
                    (&format!("net.ipv4.neigh.{host_if}.proxy_delay"), "0"),
                    (&format!("net.ipv4.conf.{host_if}.rp_filter"), "0"),
                ],
            )?;
            self.pods.push(PodNet { node, ns, address });
        }
        Ok(())
    }

    /// The external namespace: the router's address, the clients, a route to every pod
    /// CIDR through its node, and the LB IPs: an L4-hashed multipath route over the nodes
    /// (an ECMP router), and for each pinned client a table sending them to one node.
    fn build_router(&mut self, ext: &str, lb_ips: &[Ipv4Addr]) -> Result<()> {
        self.add_ns(ext)?;
        let settings = [
            ("net.ipv4.ip_forward", "0"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.fib_multipath_hash_policy", "1"),
        ];
        sysctl_in(ext, &[&settings[..], &NAMESPACE_SYSCTLS[..]].concat())?;
        plug_into_switch(&self.lan_ns, ext, "ext0", "x0")?;
        add_address(
            ext,
            format!("{ROUTER}/24").parse().map_err(bad_net)?,
            "ext0",
        )?;
        for client in std::iter::once(EXTERNAL_CLIENT).chain((0..NODE_COUNT).map(pinned_client)) {
            add_address(ext, format!("{client}/32").parse().map_err(bad_net)?, "lo")?;
        }
        for index in 0..NODE_COUNT {
            let via = node_address(index).to_string();
            ip_in(ext, &["route", "add", &pod_cidr(index), "via", &via])?;
        }
        for lb in lb_ips {
            let dest = format!("{lb}/32");
            let mut args = vec!["route".to_string(), "add".into(), dest.clone()];
            for index in 0..NODE_COUNT {
                args.extend([
                    "nexthop".into(),
                    "via".into(),
                    node_address(index).to_string(),
                ]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ip_in(ext, &args)?;
            for index in 0..NODE_COUNT {
                let table = (PINNED_TABLE_BASE + index as u32).to_string();
                let via = node_address(index).to_string();
                ip_in(ext, &["route", "add", &dest, "via", &via, "table", &table])?;
            }
        }
        for index in 0..NODE_COUNT {
            let table = (PINNED_TABLE_BASE + index as u32).to_string();
            let from = pinned_client(index).to_string();
            ip_in(
                ext,
                &[
                    "rule", "add", "pref", "100", "from", &from, "lookup", &table,
                ],
            )?;
        }
        Ok(())
    }

    /// Node `index`: its namespace and cgroup, its uplink on the switch, a default route
    /// through the router and the other nodes' pod CIDRs through them.
    fn build_node(&mut self, index: usize) -> Result<()> {
        let node = self.nodes[index].clone();
        self.add_ns(&node.ns)?;
        netns::create_cgroup(&node.cgroup)?;
        let settings = [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        sysctl_in(&node.ns, &[&settings[..], &NAMESPACE_SYSCTLS[..]].concat())?;
        plug_into_switch(&self.lan_ns, &node.ns, UPLINK, &format!("n{index}"))?;
        add_address(
            &node.ns,
            format!("{}/24", node.address).parse().map_err(bad_net)?,
            UPLINK,
        )?;
        let router = ROUTER.to_string();
        ip_in(&node.ns, &["route", "add", "default", "via", &router])?;
        for other in (0..NODE_COUNT).filter(|other| *other != index) {
            let via = node_address(other).to_string();
            ip_in(&node.ns, &["route", "add", &pod_cidr(other), "via", &via])?;
        }
        Ok(())
    }

    /// Sends the external namespace's own traffic for `lb` (the ECMP route's) through
    /// node `index` only: a router that moved the flows to that node.
    pub fn route_via(&self, lb: Ipv4Addr, index: usize) -> Result<()> {
        let (dest, via) = (format!("{lb}/32"), node_address(index).to_string());
        ip_in(&self.ext_ns, &["route", "replace", &dest, "via", &via])
            .map(drop)
            .map_err(Into::into)
    }

    /// The pod with this address.
    pub fn pod(&self, address: Ipv4Addr) -> Option<&PodNet> {
        self.pods.iter().find(|p| p.address == address)
    }

    /// Where a client with this source address runs: its pod (in its node's cgroup), a
    /// node (namespace and cgroup), or the external namespace.
    pub fn place_of(&self, source: Ipv4Addr) -> Place {
        if let Some(pod) = self.pod(source) {
            return Place {
                netns: pod.ns.clone(),
                cgroup: Some(self.nodes[pod.node].cgroup.clone()),
            };
        }
        if let Some(node) = self.nodes.iter().find(|n| n.address == source) {
            return node.place();
        }
        Place {
            netns: self.ext_ns.clone(),
            cgroup: None,
        }
    }

    /// Removes every namespace, cgroup and the run directory; safe to call twice.
    pub fn cleanup(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        for node in &self.nodes {
            netns::kill_cgroup_processes(&node.cgroup);
            if let Err(err) = netns::remove_cgroup(&node.cgroup) {
                eprintln!("cleanup: {err}");
            }
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(err) = netns::delete_netns(ns) {
                eprintln!("cleanup: {err}");
            }
        }
        if let Err(err) = std::fs::remove_dir_all(&self.run_dir) {
            eprintln!("cleanup: removing {}: {err}", self.run_dir.display());
        }
    }
}

impl Drop for ClusterNet {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn bad_net(err: ipnet::AddrParseError) -> Error {
    Error::Setup(format!("address: {err}"))
}
