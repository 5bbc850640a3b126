// SPDX-License-Identifier: Apache-2.0
//! The ebpf dataplane's live state in human terms: the pinned maps read once and decoded
//! into frontends (with their service names), backends, affinity and conntrack entries.
//! Reading touches the kernel ([`super::pinned`]); decoding ([`decode`]) is pure.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use ipnet::IpNet;
use proxy_common::{
    AFFINITY_CLIENT_NETNS, AffinityKey, AffinityValue, CT_DIR_REPLY, CT_F_CLOSING, CT_F_REPLY_SEEN,
    CT_F_SNAT, Ct4Key, Ct6Key, CtValue, LbConfig, SCOPE_INTERNAL, SvcValue, svc_flags,
};
use serde::Serialize;

use crate::{
    model::PortRef,
    proxier::ebpf::{entries::Snapshot, maps::MapOpError},
    trace::{FrontendKind, proto_name},
};

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(
        "no ebpf dataplane pinned under {0} (is the agent running in ebpf mode? see --bpffs-root)"
    )]
    NotPinned(PathBuf),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Op(#[from] MapOpError),
}

/// The kind of frontend a service entry's `svc_flags` say it is.
pub fn frontend_kind(flags: u16) -> FrontendKind {
    if flags & svc_flags::NODE_PORT != 0 {
        FrontendKind::NodePort
    } else if flags & svc_flags::EXTERNAL_IP != 0 {
        FrontendKind::ExternalIp
    } else if flags & svc_flags::LOAD_BALANCER != 0 {
        FrontendKind::LoadBalancer
    } else {
        FrontendKind::ClusterIp
    }
}

/// One scope of a frontend: the backend set for clients outside the node (`external`) or,
/// when it differs, for clients on it (`internal`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveScope {
    pub scope: &'static str,
    /// Raw `svc_flags` of this scope's slot 0.
    pub flags: u16,
    /// Backend ids of slots 1..=count, in slot order.
    pub backend_ids: Vec<u32>,
    /// No usable backend here although the service has some elsewhere: drop, not reject.
    pub drop_when_empty: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveFrontend {
    /// The unspecified address for NodePorts (every NodePort address).
    pub address: IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    pub kind: FrontendKind,
    pub rev_nat_id: u32,
    /// The service port it belongs to (absent if the names table has no entry).
    pub service: Option<PortRef>,
    pub affinity_timeout: Option<u32>,
    pub external_traffic_local: bool,
    pub internal_traffic_local: bool,
    /// Traffic from outside is masqueraded (SNAT to the node).
    pub masquerade: bool,
    pub source_ranges: Vec<IpNet>,
    pub scopes: Vec<LiveScope>,
}

impl LiveFrontend {
    pub fn scope(&self, name: &str) -> Option<&LiveScope> {
        self.scopes.iter().find(|s| s.scope == name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveBackend {
    pub id: u32,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    pub local: bool,
    pub terminating: bool,
}

impl LiveBackend {
    pub fn state(&self) -> &'static str {
        if self.terminating {
            "terminating"
        } else {
            "active"
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveAffinity {
    /// `node (netns:<cookie>)` or `pod netns:<cookie>` for clients on this node (socket
    /// programs key them by network namespace), else the client's address.
    pub client: String,
    pub client_address: Option<IpAddr>,
    pub netns_cookie: Option<u64>,
    pub rev_nat_id: u32,
    pub frontend: Option<String>,
    pub service: Option<PortRef>,
    pub backend_id: u32,
    pub backend: Option<String>,
    /// Seconds since the entry was last used.
    pub idle_seconds: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveConntrack {
    pub protocol: &'static str,
    pub direction: &'static str,
    pub client: String,
    pub frontend: String,
    pub backend: String,
    /// The node address and port the flow was masqueraded to.
    pub snat: Option<String>,
    pub service: Option<PortRef>,
    pub reply_seen: bool,
    pub closing: bool,
    /// Seconds left before the entry expires (negative: expired, not yet collected).
    pub expires_in: i64,
}

/// Node-level facts the programs act on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveNode {
    pub nodeport_addresses: Vec<IpAddr>,
    pub service_cidrs: Vec<IpNet>,
    pub masquerade_v4: Option<IpAddr>,
    pub masquerade_v6: Option<IpAddr>,
    pub host_netns_cookie: u64,
    /// Devices the uplink (north-south) programs are attached to.
    pub uplinks: Vec<String>,
    /// masqueradeAll is in effect.
    pub masquerade_all: bool,
    /// A local-traffic detector is configured (pods count as local traffic).
    pub local_detector: bool,
    /// The sources the detector calls local (empty for interface-based detectors).
    pub local_cidrs: Vec<IpNet>,
    /// socketLBHostNamespaceOnly: the socket programs leave pods' connections to the
    /// pod-side tc programs.
    pub socket_lb_host_namespace_only: bool,
    /// The families (IPv6: true) whose loopback NodePorts are refused.
    pub loopback_nodeports_rejected: Vec<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveState {
    pub frontends: Vec<LiveFrontend>,
    pub backends: Vec<LiveBackend>,
    pub affinity: Vec<LiveAffinity>,
    pub conntrack: Vec<LiveConntrack>,
    pub node: LiveNode,
    /// ClusterIPs on which any port or protocol without a frontend is rejected.
    pub wildcards: Vec<IpAddr>,
}

impl LiveState {
    pub fn backend(&self, v6: bool, id: u32) -> Option<&LiveBackend> {
        self.backends
            .iter()
            .find(|b| b.id == id && b.address.is_ipv6() == v6)
    }
}

/// Raw contents of the maps, as read.
#[derive(Debug, Default)]
pub struct RawMaps {
    pub snapshot: Snapshot,
    pub names: HashMap<(bool, u32), PortRef>,
    pub affinity: Vec<(AffinityKey, AffinityValue)>,
    pub ct4: Vec<(Ct4Key, CtValue)>,
    pub ct6: Vec<(Ct6Key, CtValue)>,
    pub config: LbConfig,
    /// The local-traffic detector's CIDRs (`LOCAL_CIDRS*`).
    pub local_cidrs: Vec<IpNet>,
    pub uplinks: Vec<String>,
    /// Seconds of CLOCK_MONOTONIC_COARSE when read (the programs' clock).
    pub now: u32,
}

fn addr16(bytes: &[u8; 16], v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(*bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

fn v4(raw: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(raw.to_ne_bytes()))
}

fn sockaddr(addr: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

/// Decodes raw map contents (pure).
pub fn decode(raw: &RawMaps) -> LiveState {
    let snap = &raw.snapshot;
    let mut state = LiveState::default();
    // Group slots by frontend and scope.
    let mut slot0: BTreeMap<(IpAddr, u16, u8), BTreeMap<u8, SvcValue>> = BTreeMap::new();
    let mut slots: HashMap<(IpAddr, u16, u8, u8), BTreeMap<u16, u32>> = HashMap::new();
    for (k, v) in &snap.svc {
        let f = k.frontend;
        if k.slot == 0 {
            if v.flags & svc_flags::WILDCARD != 0 {
                state.wildcards.push(f.addr);
                continue;
            }
            slot0
                .entry((f.addr, f.port, f.proto))
                .or_default()
                .insert(k.scope, *v);
        } else {
            slots
                .entry((f.addr, f.port, f.proto, k.scope))
                .or_default()
                .insert(k.slot, v.backend_id);
        }
    }
    state.wildcards.sort();
    for ((addr, port, p), scopes) in slot0 {
        let Some(external) = scopes.values().next().copied() else {
            continue;
        };
        let flags = external.flags;
        let v6 = addr.is_ipv6();
        let mut live_scopes = Vec::new();
        for (scope, value) in &scopes {
            let ids = slots
                .get(&(addr, port, p, *scope))
                .map(|m| {
                    m.range(1..=value.count)
                        .map(|(_, id)| *id)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            live_scopes.push(LiveScope {
                scope: if *scope == SCOPE_INTERNAL {
                    "internal"
                } else {
                    "external"
                },
                flags: value.flags,
                backend_ids: ids,
                drop_when_empty: value.flags & svc_flags::DROP_NO_ENDPOINTS != 0,
            });
        }
        let mut source_ranges: Vec<IpNet> = snap
            .src_ranges
            .iter()
            .filter(|(id, net)| *id == external.rev_nat_id && net.addr().is_ipv6() == v6)
            .map(|(_, net)| *net)
            .collect();
        source_ranges.sort();
        state.frontends.push(LiveFrontend {
            address: addr,
            port,
            protocol: proto_name(p),
            kind: frontend_kind(flags),
            rev_nat_id: external.rev_nat_id,
            service: raw.names.get(&(v6, external.rev_nat_id)).cloned(),
            affinity_timeout: (flags & svc_flags::AFFINITY != 0).then_some(external.backend_id),
            external_traffic_local: flags & svc_flags::ETP_LOCAL != 0,
            internal_traffic_local: flags & svc_flags::ITP_LOCAL != 0,
            masquerade: flags & svc_flags::MASQUERADE != 0,
            source_ranges,
            scopes: live_scopes,
        });
    }
    // By service, then frontend kind and address (unnamed frontends last).
    state.frontends.sort_by(|a, b| {
        (
            a.service.is_none(),
            &a.service,
            a.kind as u8,
            a.address,
            a.port,
        )
            .cmp(&(
                b.service.is_none(),
                &b.service,
                b.kind as u8,
                b.address,
                b.port,
            ))
    });
    for ((_, id), b) in &snap.backends {
        state.backends.push(LiveBackend {
            id: *id,
            address: b.addr.addr,
            port: b.addr.port,
            protocol: proto_name(b.addr.proto),
            local: b.local,
            terminating: b.terminating,
        });
    }
    state.backends.sort_by_key(|b| (b.address.is_ipv6(), b.id));

    let frontend_of =
        |v6: bool, id: u32| snap.rev_nat.get(&(v6, id)).map(|(a, p)| sockaddr(*a, *p));
    for (k, v) in &raw.affinity {
        let (client, client_address, netns_cookie, v6) = if k.kind == AFFINITY_CLIENT_NETNS {
            let mut b = [0u8; 8];
            b.copy_from_slice(&k.client[..8]);
            let cookie = u64::from_ne_bytes(b);
            // The family of a netns-keyed entry is that of its frontend.
            let v6 = !snap.rev_nat.contains_key(&(false, k.rev_nat_id));
            let client = if cookie == raw.config.host_netns_cookie {
                format!("node (netns:{cookie})")
            } else {
                format!("pod netns:{cookie}")
            };
            (client, None, Some(cookie), v6)
        } else {
            let v6 = k.kind == proxy_common::AFFINITY_CLIENT_V6;
            let a = addr16(&k.client, v6);
            (a.to_string(), Some(a), None, v6)
        };
        state.affinity.push(LiveAffinity {
            client,
            client_address,
            netns_cookie,
            rev_nat_id: k.rev_nat_id,
            frontend: frontend_of(v6, k.rev_nat_id),
            service: raw.names.get(&(v6, k.rev_nat_id)).cloned(),
            backend_id: v.backend_id,
            backend: state
                .backend(v6, v.backend_id)
                .map(|b| sockaddr(b.address, b.port)),
            idle_seconds: raw.now.saturating_sub(v.last_used),
        });
    }
    state
        .affinity
        .sort_by(|a, b| (a.rev_nat_id, &a.client).cmp(&(b.rev_nat_id, &b.client)));

    let ct = |p: u8, dir: u8, v: &CtValue, v6: bool| LiveConntrack {
        protocol: proto_name(p),
        direction: if dir == CT_DIR_REPLY {
            "reply"
        } else {
            "forward"
        },
        client: sockaddr(addr16(&v.client_addr, v6), u16::from_be(v.client_port)),
        frontend: sockaddr(addr16(&v.frontend_addr, v6), u16::from_be(v.frontend_port)),
        backend: sockaddr(addr16(&v.backend_addr, v6), u16::from_be(v.backend_port)),
        snat: (v.flags & CT_F_SNAT != 0)
            .then(|| sockaddr(addr16(&v.snat_addr, v6), u16::from_be(v.snat_port))),
        service: raw.names.get(&(v6, v.rev_nat_id())).cloned(),
        reply_seen: v.flags & CT_F_REPLY_SEEN != 0,
        closing: v.flags & CT_F_CLOSING != 0,
        expires_in: i64::from(v.expires) - i64::from(raw.now),
    };
    for (k, v) in &raw.ct4 {
        state.conntrack.push(ct(k.proto, k.dir, v, false));
    }
    for (k, v) in &raw.ct6 {
        state.conntrack.push(ct(k.proto, k.dir, v, true));
    }
    state.conntrack.sort_by(|a, b| {
        (&a.frontend, &a.client, a.direction).cmp(&(&b.frontend, &b.client, b.direction))
    });

    let mut nodeport: Vec<IpAddr> = snap.nodeport_addrs.iter().copied().collect();
    nodeport.sort();
    let mut cidrs: Vec<IpNet> = snap.svc_cidrs.iter().copied().collect();
    cidrs.sort();
    state.node = LiveNode {
        nodeport_addresses: nodeport,
        service_cidrs: cidrs,
        masquerade_v4: (raw.config.masq4 != 0).then(|| v4(raw.config.masq4)),
        masquerade_v6: (raw.config.masq6 != [0; 16])
            .then(|| IpAddr::V6(Ipv6Addr::from(raw.config.masq6))),
        host_netns_cookie: raw.config.host_netns_cookie,
        uplinks: raw.uplinks.clone(),
        masquerade_all: raw.config.flags & proxy_common::LB_CFG_MASQUERADE_ALL != 0,
        local_detector: raw.config.flags & proxy_common::LB_CFG_LOCAL_DETECTOR != 0,
        local_cidrs: raw.local_cidrs.clone(),
        socket_lb_host_namespace_only: raw.config.flags
            & proxy_common::LB_CFG_SOCKET_LB_HOST_NETNS_ONLY
            != 0,
        loopback_nodeports_rejected: [
            (false, proxy_common::LB_CFG_LOOPBACK_NODEPORTS_REJECT4),
            (true, proxy_common::LB_CFG_LOOPBACK_NODEPORTS_REJECT6),
        ]
        .into_iter()
        .filter(|(_, bit)| raw.config.flags & bit != 0)
        .map(|(v6, _)| v6)
        .collect(),
    };
    state
}
