// SPDX-License-Identifier: Apache-2.0
//! The ebpf dataplane's decision for one connection, from its decoded maps. Follows the
//! programs (proxy-ebpf `lb.rs` lookup_frontend, `sock.rs` translate, `nodeport/ingress.rs`
//! new_flow and `nodeport/egress.rs` verdict) step by step, so its answer is the one the
//! kernel gives.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use proxy_common::{proto, svc_flags};

use super::inspect::{
    LiveState,
    live::{self, LiveFrontend, LiveScope},
    read_pinned,
};
use crate::{
    proxier::HostLayout,
    trace::{
        Action, AffinityInfo, Candidate, ClientKind, FrontendKind, MatchedFrontend, Question,
        TraceRequest, Verdict, client, proto_name,
    },
};

/// `trace` in ebpf mode: the pinned maps under the layout's pin directory, decoded and
/// followed.
pub(super) fn trace_live(layout: &HostLayout, request: &TraceRequest) -> Result<Verdict, String> {
    let pinned = read_pinned(&layout.bpffs_root).map_err(|e| e.to_string())?;
    let state = live::decode(&pinned);
    // The uplinks are known from the link pins of the tc programs; where tc attaches over
    // netlink (kernels before 6.6) there are none, and the devices holding the node's
    // addresses are the uplinks, as for iptables mode.
    let question = request.question(|from| {
        let uplinks = if state.node.uplinks.is_empty() {
            client::address_devices()
        } else {
            state.node.uplinks.clone()
        };
        client::classify(from, &uplinks)
    });
    Ok(trace(&state, &question))
}

/// What the destination is, as the programs' lookup sees it.
enum Lookup<'a> {
    None,
    Service(&'a LiveFrontend, &'a LiveScope),
    Reject,
    Drop,
}

fn unspecified(addr: &IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn lookup<'a>(
    state: &'a LiveState,
    q: &Question,
    internal: bool,
    steps: &mut Vec<String>,
) -> Lookup<'a> {
    let (addr, port, p) = (q.to.ip(), q.to.port(), proto_name(q.proto));
    let find = |a: IpAddr| {
        state
            .frontends
            .iter()
            .find(|f| f.address == a && f.port == port && f.protocol == p)
    };
    let mut found = find(addr);
    if found.is_some() {
        steps.push(format!("{addr}:{port}/{p} is a frontend"));
    } else if state.node.nodeport_addresses.contains(&addr) {
        found = find(unspecified(&addr));
        if found.is_some() {
            steps.push(format!(
                "{addr} is a NodePort address and {port}/{p} is a NodePort"
            ));
        }
    }
    match found {
        Some(f) => {
            let external = f.scope("external");
            let two_scopes = external.is_some_and(|s| s.flags & svc_flags::TWO_SCOPES != 0);
            let scope = if internal && two_scopes {
                steps.push(
                    "the client is on this node: the frontend's internal backend set applies \
                     (traffic from the node and its pods short-circuits to the cluster-wide set)"
                        .into(),
                );
                f.scope("internal").or(external)
            } else {
                external
            };
            match scope {
                Some(s) => Lookup::Service(f, s),
                None => Lookup::None,
            }
        }
        None if state.wildcards.contains(&addr) => {
            steps.push(format!(
                "{addr} is a ClusterIP but has no frontend for port {port}/{p}"
            ));
            Lookup::Reject
        }
        None if addr.is_loopback()
            && state
                .node
                .loopback_nodeports_rejected
                .contains(&addr.is_ipv6())
            && find(unspecified(&addr)).is_some() =>
        {
            steps.push(format!(
                "{port}/{p} is a NodePort, refused on loopback: the KubeProxyNFTablesLocalhostNodePorts gate is on and nodePortAddresses lists no loopback range of the family"
            ));
            Lookup::Reject
        }
        None if state.node.service_cidrs.iter().any(|c| c.contains(&addr)) => {
            steps.push(format!(
                "{addr} is inside a service CIDR but no service holds it"
            ));
            Lookup::Drop
        }
        None => {
            steps.push(format!("{addr}:{port}/{p} is not a service frontend"));
            Lookup::None
        }
    }
}

fn matched(f: &LiveFrontend, s: &LiveScope) -> MatchedFrontend {
    MatchedFrontend {
        address: f.address,
        port: f.port,
        protocol: f.protocol,
        kind: f.kind,
        service: f.service.clone(),
        scope: s.scope,
    }
}

fn source_allowed(f: &LiveFrontend, from: &IpAddr) -> bool {
    f.source_ranges.iter().any(|r| r.contains(from))
}

fn describe_frontend(f: &LiveFrontend, steps: &mut Vec<String>) {
    let name = f.service.as_ref().map_or_else(
        || format!("rev_nat_id {}", f.rev_nat_id),
        |s| format!("service {s}"),
    );
    steps.push(format!("{} frontend of {name}", f.kind.label()));
}

fn describe_set(
    f: &LiveFrontend,
    s: &LiveScope,
    candidates: &[Candidate],
    steps: &mut Vec<String>,
) {
    if s.flags & svc_flags::ETP_LOCAL != 0 {
        steps.push(
            "externalTrafficPolicy: Local: only endpoints on this node, client address kept".into(),
        );
    } else if s.flags & svc_flags::ITP_LOCAL != 0 && f.kind == FrontendKind::ClusterIp {
        steps.push("internalTrafficPolicy: Local: only endpoints on this node".into());
    } else {
        steps.push(
            "cluster-wide endpoints (ready ones, filtered by topology hints when they apply)"
                .into(),
        );
    }
    if !candidates.is_empty() && candidates.iter().all(|c| c.terminating) {
        steps.push(
            "no ready endpoint: the serving terminating ones are used (upstream's fallback)".into(),
        );
    }
    if s.flags & svc_flags::MAGLEV != 0 {
        steps.push(
            "Maglev: a new flow from outside the node takes the backend its 5-tuple hashes to in the frontend's table, the same on every node (flows from this node's pods and processes: at random)".into(),
        );
    }
}

/// Whether a new flow of `client` to frontend `f` (scope `s`) is masqueraded, as
/// proxy-ebpf `lb.rs` masquerade_flow decides: eTP=Cluster external frontends always; a
/// ClusterIP with masqueradeAll, or from a source the local-traffic detector does not call
/// local (pods of this node are local whenever there is a detector).
fn masquerade_flow(state: &LiveState, f: &LiveFrontend, s: &LiveScope, q: &Question) -> bool {
    if s.flags & svc_flags::MASQUERADE != 0 {
        return true;
    }
    if f.kind != FrontendKind::ClusterIp {
        return false;
    }
    if state.node.masquerade_all {
        return true;
    }
    if !state.node.local_detector {
        return false;
    }
    match q.client {
        ClientKind::Pod => false,
        _ => !state.node.local_cidrs.iter().any(|c| c.contains(&q.from)),
    }
}

/// The trace of `q` through the ebpf dataplane described by `state`.
pub fn trace(state: &LiveState, q: &Question) -> Verdict {
    // The kernel runs no cgroup socket hook for SCTP: a pod's SCTP is load-balanced per
    // packet by the pod-side tc program, and so is everything of pods when socket-level
    // load balancing is limited to the node's namespace.
    let socket = match q.client {
        ClientKind::External => false,
        ClientKind::Pod => q.proto != proto::SCTP && !state.node.socket_lb_host_namespace_only,
        ClientKind::Node => true,
    };
    let mut v = Verdict::untouched("ebpf", q, if socket { "socket" } else { "tc" });
    if q.proto != proto::TCP && q.proto != proto::UDP && q.proto != proto::SCTP {
        v.steps
            .push("only TCP, UDP and SCTP are load-balanced".into());
        return v;
    }
    if q.client == ClientKind::Pod && q.to.ip().is_loopback() {
        v.steps
            .push("a pod's loopback address is its own: the socket programs leave it alone".into());
        return v;
    }
    let steps = &mut v.steps;
    steps.push(if socket {
        "a client on this node: connect()/sendmsg() is translated by the cgroup socket programs"
            .into()
    } else if q.client == ClientKind::Pod && q.proto == proto::SCTP {
        "SCTP from a pod (no socket hook runs for SCTP): the pod-side tc program translates each packet"
            .into()
    } else if q.client == ClientKind::Pod {
        "socketLBHostNamespaceOnly: the pod's connection keeps the service address (a sidecar reads it); the pod-side tc program translates each packet"
            .into()
    } else {
        "a client outside the node: the uplink's tc (or XDP) program translates the packet"
            .to_string()
    });
    // Clients on the node itself always take a frontend's internal scope; pods only when a
    // local-traffic detector tells them apart from outside traffic (sock.rs).
    let internal = match q.client {
        ClientKind::Node => true,
        ClientKind::Pod => state.node.local_detector,
        ClientKind::External => false,
    };
    if q.client == ClientKind::Pod && !internal {
        steps.push(
            "no local-traffic detector: pods do not short-circuit, externalTrafficPolicy applies to them"
                .into(),
        );
    }
    let (f, s) = match lookup(state, q, internal, steps) {
        Lookup::None => {
            steps.push("passed on untouched".into());
            return v;
        }
        Lookup::Reject => {
            steps.push("rejected (connection refused)".into());
            v.action = Action::Reject;
            return v;
        }
        Lookup::Drop => {
            if socket {
                steps.push(
                    "left alone by the socket program; the uplink's egress program drops it".into(),
                );
            } else {
                steps.push("dropped".into());
            }
            v.action = Action::Drop;
            return v;
        }
        Lookup::Service(f, s) => (f, s),
    };
    describe_frontend(f, steps);
    v.frontend = Some(matched(f, s));
    if s.flags & svc_flags::SOURCE_RANGES != 0 && !source_allowed(f, &q.from) {
        steps.push(format!(
            "{} is outside loadBalancerSourceRanges {:?}: dropped",
            q.from,
            f.source_ranges
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ));
        v.action = Action::Drop;
        return v;
    }
    let v6 = f.address.is_ipv6();
    let candidates: Vec<Candidate> = s
        .backend_ids
        .iter()
        .filter_map(|id| state.backend(v6, *id))
        .map(|b| Candidate {
            address: b.address,
            port: b.port,
            local: b.local,
            terminating: b.terminating,
            masquerade: false,
        })
        .collect();
    if candidates.is_empty() {
        if s.drop_when_empty {
            steps.push(
                "no endpoint usable from here, but the service has endpoints elsewhere \
                 (traffic policy Local): dropped"
                    .into(),
            );
            v.action = Action::Drop;
        } else {
            steps.push("the service has no endpoints: rejected".into());
            v.action = Action::Reject;
        }
        return v;
    }
    describe_set(f, s, &candidates, steps);
    if let Some(timeout) = f.affinity_timeout {
        let pinned = state
            .affinity
            .iter()
            .filter(|a| a.rev_nat_id == f.rev_nat_id && a.idle_seconds <= timeout)
            .find(|a| match q.client {
                ClientKind::External => a.client_address == Some(q.from),
                ClientKind::Node => a.netns_cookie == Some(state.node.host_netns_cookie),
                ClientKind::Pod => false,
            })
            .and_then(|a| a.backend.as_deref())
            .and_then(|b| b.parse::<SocketAddr>().ok());
        steps.push(match (pinned, q.client) {
            (Some(b), _) => format!("sessionAffinity ClientIP ({timeout}s): this client is pinned to {b}"),
            (None, ClientKind::Pod) => format!(
                "sessionAffinity ClientIP ({timeout}s): keyed by the pod's network namespace; its first connection picks the backend"
            ),
            (None, _) => format!(
                "sessionAffinity ClientIP ({timeout}s): no live entry yet; the next connection picks one and sticks to it"
            ),
        });
        v.affinity = Some(AffinityInfo {
            timeout_seconds: timeout,
            pinned_backend: pinned,
        });
    }
    if q.proto == proto::SCTP && !socket && candidates.iter().any(|c| c.port != q.to.port()) {
        steps.push(
            "SCTP to a backend on another port: the port rewrite patches the CRC32c (fragments are dropped)"
                .into(),
        );
    }
    v.action = Action::Forward;
    let masquerade = masquerade_flow(state, f, s, q);
    // With masqueradeAll the socket programs leave a pod's masqueraded connections to the
    // pod-side tc program, which can rewrite the source.
    let per_connection =
        socket && !(q.client == ClientKind::Pod && state.node.masquerade_all && masquerade);
    if per_connection {
        steps.push(
            "translated once at connect(): no NAT, the backend sees the client's own address"
                .into(),
        );
        v.backend_sees_source = Some(q.from);
    } else {
        if socket {
            v.decided_by = "tc";
            steps.push(
                "masqueradeAll: the socket program leaves this pod connection to the pod-side tc program, which translates it per packet with SNAT"
                    .into(),
            );
        }
        let masq_addr = if v6 {
            state.node.masquerade_v6
        } else {
            state.node.masquerade_v4
        };
        match (masquerade, masq_addr) {
            (true, Some(node)) => {
                let why = if s.flags & svc_flags::MASQUERADE != 0 {
                    "externalTrafficPolicy: Cluster"
                } else if state.node.masquerade_all {
                    "masqueradeAll"
                } else {
                    "a ClusterIP from a source the local-traffic detector does not call local"
                };
                steps.push(format!("{why}: masqueraded to the node address {node}"));
                v.masquerade = true;
                v.backend_sees_source = Some(node);
            }
            _ => {
                steps.push("client address preserved (no masquerade)".into());
                v.backend_sees_source = Some(q.from);
            }
        }
        let tracked: Vec<&str> = state
            .conntrack
            .iter()
            .filter(|c| c.direction == "forward" && c.frontend == q.to.to_string())
            .filter(|c| {
                c.client
                    .parse::<SocketAddr>()
                    .is_ok_and(|a| a.ip() == q.from)
            })
            .map(|c| c.backend.as_str())
            .collect();
        if !tracked.is_empty() {
            steps.push(format!(
                "established flows from this client are tracked to {}",
                tracked.join(", ")
            ));
        }
    }
    v.candidates = candidates;
    let masquerade = v.masquerade;
    // The per-packet path masquerades a pod reaching itself (the hairpin), whatever the
    // frontend's rules say; per connection nothing is rewritten.
    let hairpin_masq = !per_connection
        && q.client == ClientKind::Pod
        && (if v6 {
            state.node.masquerade_v6.is_some()
        } else {
            state.node.masquerade_v4.is_some()
        });
    let mut hairpin = false;
    for c in &mut v.candidates {
        c.masquerade = masquerade || (hairpin_masq && c.address == q.from);
        hairpin |= hairpin_masq && !masquerade && c.address == q.from;
    }
    if hairpin {
        steps_after_candidates(&mut v);
    }
    v
}

/// Notes the hairpin on a verdict whose candidates include the client itself.
fn steps_after_candidates(v: &mut Verdict) {
    v.steps.push(
        "the client is a candidate: reaching itself per packet, it is masqueraded to the node (hairpin)"
            .into(),
    );
}

#[cfg(test)]
mod tests;
