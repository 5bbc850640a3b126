// SPDX-License-Identifier: Apache-2.0
//! Node facts established at start-up (upstream server.go's order): the node's IPs from
//! --bind-address or its Node object, the host's addresses, the local-traffic detector
//! (NodeCIDR waits for the Node's podCIDRs), nodePortAddresses resolved, the uplink devices;
//! then the process settings (oomScoreAdj, conntrack sysctls).

use std::{net::IpAddr, sync::Arc};

use k8s_openapi::api::core::v1::Node;

use ipnet::IpNet;
use tracing::{info, warn};

use super::error::Result;
use crate::{
    config::{LocalMode, ProxyMode, Resolved},
    node::{
        ConntrackSettings, LocalDetector, NodeAddresses, ProcSysctl, apply_conntrack,
        apply_oom_score_adj, host_addresses, local::Mode as DetectorMode, node_ips_from_node,
        primary_node_ips,
    },
    proxier::resolve_nodeport_addresses,
};

/// What start-up learned about the node.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub primary_ips: NodeAddresses,
    pub host_addresses: Vec<IpAddr>,
    pub local_detector: LocalDetector,
    pub nodeport_addresses: Option<Vec<IpAddr>>,
    /// Uplink devices for tc programs.
    pub devices: Vec<String>,
}

fn pod_cidrs(node: &Node) -> Vec<IpNet> {
    let spec = node.spec.as_ref();
    let mut cidrs: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if cidrs.is_empty()
        && let Some(c) = spec.and_then(|s| s.pod_cidr.clone())
    {
        cidrs.push(c);
    }
    cidrs
        .iter()
        .filter_map(|c| crate::k8s::convert::parse_cidr_sloppy(c))
        .collect()
}

/// Where start-up reads this node's Node object from: the event loop, which keeps it.
pub trait NodeSource {
    fn node_object(&self) -> Option<&Node>;
    /// Processes events until this node's Node object satisfies `ready`.
    fn wait_for_node(
        &mut self,
        ready: impl Fn(&Node) -> bool,
    ) -> impl std::future::Future<Output = Result<Arc<Node>>>;
}

pub async fn establish(resolved: &Resolved, event_loop: &mut impl NodeSource) -> Result<NodeFacts> {
    let config = &resolved.config;
    let bind: Option<IpAddr> = config.bind_address.parse().ok();
    let node_ips = event_loop
        .node_object()
        .map(node_ips_from_node)
        .unwrap_or_default();
    if event_loop.node_object().is_none() {
        warn!(
            "this node's Node object was not found; node IPs come from --bind-address or loopback"
        );
    }
    let primary_ips = primary_node_ips(bind, &node_ips);
    info!(node_ips = ?primary_ips.iter().collect::<Vec<_>>(), "node IPs");

    let local_detector = match resolved.effective.local_mode {
        LocalMode::ClusterCidr => {
            LocalDetector::new(DetectorMode::ClusterCidr(&resolved.effective.cluster_cidrs))?
        }
        LocalMode::NodeCidr => {
            let node = event_loop
                .wait_for_node(|n| !pod_cidrs(n).is_empty())
                .await?;
            LocalDetector::new(DetectorMode::NodeCidr(&pod_cidrs(&node)))?
        }
        LocalMode::BridgeInterface => LocalDetector::new(DetectorMode::BridgeInterface(
            &config.detect_local.bridge_interface,
        ))?,
        LocalMode::InterfaceNamePrefix => LocalDetector::new(DetectorMode::InterfaceNamePrefix(
            &config.detect_local.interface_name_prefix,
        ))?,
    };
    if !local_detector.is_implemented() {
        info!("no local-traffic detector (clusterCIDR unset): traffic is not classified as local");
    }

    let hosts = host_addresses();
    let npa = &resolved.effective.node_port_addresses;
    let nodeport_addresses = if npa.matches_all() {
        None
    } else {
        resolve_nodeport_addresses(&npa.cidrs(), npa.includes_primary(), &primary_ips, &hosts)
    };
    let devices = if config.ebpf.devices.is_empty() {
        devices_holding(&primary_ips.iter().collect::<Vec<_>>())
    } else {
        config.ebpf.devices.clone()
    };
    Ok(NodeFacts {
        primary_ips,
        host_addresses: hosts,
        local_detector,
        nodeport_addresses,
        devices,
    })
}

/// Interfaces that hold any of `addrs` (the default uplinks).
fn devices_holding(addrs: &[IpAddr]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Ok(ifaddrs) = nix::ifaddrs::getifaddrs() {
        for ifa in ifaddrs {
            let ip = ifa.address.and_then(|a| {
                a.as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
            });
            if let Some(ip) = ip
                && addrs.contains(&ip)
                && !ip.is_loopback()
                && !out.contains(&ifa.interface_name)
            {
                out.push(ifa.interface_name);
            }
        }
    }
    out
}

/// oomScoreAdj and the conntrack sysctls, each logged; none of them is fatal.
pub fn apply_process_settings(resolved: &Resolved, mode: ProxyMode) {
    let config = &resolved.config;
    apply_oom_score_adj(config.oom_score_adj);
    let ct = &config.conntrack;
    let settings = ConntrackSettings {
        max_per_core: ct.max_per_core,
        min: ct.min,
        tcp_established_timeout: ct.tcp_established_timeout.map(|d| d.to_std()),
        tcp_close_wait_timeout: ct.tcp_close_wait_timeout.map(|d| d.to_std()),
        tcp_be_liberal: ct.tcp_be_liberal,
        udp_timeout: Some(ct.udp_timeout.to_std()),
        udp_stream_timeout: Some(ct.udp_stream_timeout.to_std()),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let outcomes = apply_conntrack(&mut ProcSysctl::default(), &settings, cores);
    info!(
        mode = mode.as_str(),
        settings = outcomes.len(),
        "conntrack settings processed"
    );
}
