// SPDX-License-Identifier: Apache-2.0
//! Which translated UDP flows are still right (pure): upstream's `CleanStaleEntries`
//! decision, shared by the netfilter reconciler (iptables, ipvs) and the BPF conntrack
//! cleanup (ebpf).
//!
//! Every frontend of every UDP service port of one family — ClusterIP, external IPs and
//! load-balancer VIPs with the service port, and the NodePort on the node's addresses —
//! maps to the set of endpoints (address and port) that serve it. Serving, not ready: a
//! terminating endpoint that still serves keeps its flows, and traffic policies and
//! topology are ignored, as upstream does (a policy change must not cut existing flows,
//! just as it cuts no TCP connection). A service port without serving endpoints maps to
//! the empty set, so every flow to it is stale (upstream PR 139629: its REJECT or DROP
//! rule never sees the datagrams an old entry already translates). So do the frontends of
//! ports removed or changed since the last reconcile (PR 141371 for removed ones), unless
//! a live port still has them.
//!
//! One deliberate difference: upstream matches NodePort flows on the destination port
//! alone and therefore skips NodePorts without serving endpoints (it would delete
//! unrelated flows to that port on other hosts). Here a NodePort matches only flows to
//! one of the node's own addresses, so NodePorts without endpoints, and NodePorts that
//! went away, are cleaned too.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use crate::model::FamilyState;
use crate::model::{IpFamily, Protocol, ServicePort};

/// What a translated flow's original destination and chosen backend amount to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowVerdict {
    /// The destination is no UDP frontend this reconcile knows of: not the proxy's
    /// business (netfilter holds every flow of the node).
    Unknown,
    /// The backend serves the frontend: the flow is right.
    Serving,
    /// The frontend is gone or has no serving endpoints, or the backend no longer serves
    /// it: the next datagram must be load-balanced afresh.
    Stale,
}

/// The UDP frontends of one IP family and the endpoints serving each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpFrontends {
    by_address: HashMap<SocketAddr, HashSet<SocketAddr>>,
    by_node_port: HashMap<u16, HashSet<SocketAddr>>,
    node_addresses: HashSet<IpAddr>,
}

impl UdpFrontends {
    /// The frontends of `state`'s UDP service ports, plus those of `replaced` (previous
    /// versions of ports removed or changed; other families' are skipped) with no serving
    /// endpoint unless a live port has the same frontend. `node_addresses`: the host's
    /// addresses, where NodePorts are reached.
    pub fn new<'a>(
        state: &FamilyState,
        replaced: impl IntoIterator<Item = &'a ServicePort>,
        node_addresses: &[IpAddr],
    ) -> Self {
        let family = state.family;
        let mut frontends = UdpFrontends {
            node_addresses: node_addresses
                .iter()
                .filter(|ip| family.contains(ip))
                .copied()
                .collect(),
            ..Default::default()
        };
        for (name, port) in state.services.iter() {
            if port.protocol != Protocol::Udp {
                continue;
            }
            let serving: HashSet<SocketAddr> = state
                .endpoints
                .get(name)
                .into_iter()
                .flatten()
                .filter(|endpoint| endpoint.serving)
                .map(|endpoint| endpoint.addr())
                .collect();
            // Two live ports claiming one frontend (a conflict the API server lets
            // through): a flow to either's endpoints is kept.
            for frontend in address_frontends(port) {
                frontends
                    .by_address
                    .entry(frontend)
                    .or_default()
                    .extend(serving.iter().copied());
            }
            if let Some(node_port) = port.node_port {
                frontends
                    .by_node_port
                    .entry(node_port)
                    .or_default()
                    .extend(serving.iter().copied());
            }
        }
        for port in replaced {
            if port.protocol != Protocol::Udp || IpFamily::of(&port.cluster_ip) != family {
                continue;
            }
            for frontend in address_frontends(port) {
                frontends.by_address.entry(frontend).or_default();
            }
            if let Some(node_port) = port.node_port {
                frontends.by_node_port.entry(node_port).or_default();
            }
        }
        frontends
    }

    /// The verdict on a flow sent to `frontend` and translated to `backend` (the reply
    /// direction's source). Address frontends are looked up first, as upstream does.
    pub fn verdict(&self, frontend: SocketAddr, backend: SocketAddr) -> FlowVerdict {
        let serving = self.by_address.get(&frontend).or_else(|| {
            self.node_addresses
                .contains(&frontend.ip())
                .then(|| self.by_node_port.get(&frontend.port()))
                .flatten()
        });
        match serving {
            None => FlowVerdict::Unknown,
            Some(endpoints) if endpoints.contains(&backend) => FlowVerdict::Serving,
            Some(_) => FlowVerdict::Stale,
        }
    }

    /// No UDP frontend at all: nothing can be stale.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }
}

/// ClusterIP, external IPs and load-balancer VIPs, each with the service port.
fn address_frontends(port: &ServicePort) -> impl Iterator<Item = SocketAddr> + '_ {
    std::iter::once(port.cluster_ip)
        .chain(port.external_ips.iter().copied())
        .chain(port.load_balancer_vips())
        .map(|ip| SocketAddr::new(ip, port.port))
}
