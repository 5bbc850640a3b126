// SPDX-License-Identifier: Apache-2.0
//! The iptables dataplane's decision for one connection, from `iptables-save` output: a
//! small interpreter of the rules our proxier writes. The nat table is walked from
//! KUBE-SERVICES (where PREROUTING and OUTPUT send new connections); a `statistic` rule is a
//! branch, so every endpoint chain reachable is collected as a candidate with the masquerade
//! mark its path set. Without a DNAT, the filter table's KUBE-* chains decide between
//! REJECT, DROP and untouched. Pure: the saved text, the node's addresses and the question
//! in, a [`Verdict`] out.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use proxy_common::proto;

use crate::{
    model::{IpFamily, PortRef},
    proxier::{
        HostLayout,
        netfilter::{
            CommandBackend, IptablesBackend as _, Table,
            save::{self, Rule},
        },
    },
    trace::{
        Action, AffinityInfo, Candidate, ClientKind, FrontendKind, MatchedFrontend, Question,
        TraceRequest, Verdict, client, proto_name,
    },
};

/// `trace` in iptables mode: the destination family's nat and filter tables
/// (iptables-save), the node's addresses and the `recent` affinity lists, followed.
pub(super) fn trace_live(_: &HostLayout, request: &TraceRequest) -> Result<Verdict, String> {
    let question = request.question(|from| client::classify(from, &client::address_devices()));
    let family = if request.to.is_ipv6() {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    let mut backend = CommandBackend::detect().map_err(|e| e.to_string())?;
    let nat = backend
        .save(family, Table::Nat)
        .map_err(|e| e.to_string())?;
    let filter = backend
        .save(family, Table::Filter)
        .map_err(|e| e.to_string())?;
    let node: Vec<IpAddr> = client::local_addresses()
        .into_iter()
        .map(|(_, ip)| ip)
        .collect();
    Ok(trace(&nat, &filter, &node, &recent_lists(), &question))
}

/// The affinity lists of the `recent` module in this network namespace (endpoint chains).
fn recent_lists() -> RecentLists {
    std::fs::read_dir("/proc/net/xt_recent")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("KUBE-SEP-").then(|| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                (name, parse_recent(&text))
            })
        })
        .collect()
}

/// The masquerade bit upstream and we use by default (0x4000 = bit 14).
const DEFAULT_MASQ_MARK: u32 = 0x4000;

/// What the walker needs to know about the node and the packet.
struct Ctx<'a> {
    q: &'a Question,
    node_addresses: &'a [IpAddr],
    nat: Vec<Rule>,
}

/// One path through the nat table.
#[derive(Clone, Debug, Default)]
struct Path {
    mark: u32,
    dnat: Option<String>,
    /// The first rule with a service comment on the path.
    comment: Option<String>,
    affinity: Option<u32>,
    /// The endpoint chain the DNAT is in.
    endpoint_chain: Option<String>,
}

fn net_matches(spec: &str, ip: &IpAddr) -> bool {
    if let Ok(net) = spec.parse::<IpNet>() {
        return net.contains(ip);
    }
    spec.parse::<IpAddr>().is_ok_and(|a| a == *ip)
}

fn proto_matches(spec: &str, p: u8) -> bool {
    match spec.to_ascii_lowercase().as_str() {
        "tcp" | "6" => p == proto::TCP,
        "udp" | "17" => p == proto::UDP,
        "sctp" | "132" => p == proto::SCTP,
        _ => false,
    }
}

fn parse_mark(spec: &str) -> (u32, u32) {
    let mut parts = spec.split('/');
    let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0);
    let value = parts.next().map(hex).unwrap_or(0);
    let mask = parts.next().map(hex).unwrap_or(u32::MAX);
    (value, mask)
}

impl Ctx<'_> {
    fn local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.node_addresses.contains(ip)
    }

    /// Whether the packet (with `mark`) matches every condition of `r`.
    fn matches(&self, r: &Rule, mark: u32) -> bool {
        let (src, dst) = (self.q.from, self.q.to.ip());
        let checks: [(&str, bool); 4] =
            [("-s", true), ("!-s", false), ("-d", true), ("!-d", false)];
        for (opt, positive) in checks {
            if let Some(spec) = r.get(opt) {
                let ip = if opt.ends_with('s') { &src } else { &dst };
                if net_matches(spec, ip) != positive {
                    return false;
                }
            }
        }
        if let Some(p) = r.get("-p")
            && !proto_matches(p, self.q.proto)
        {
            return false;
        }
        if let Some(port) = r.get("--dport")
            && port.parse::<u16>().ok() != Some(self.q.to.port())
        {
            return false;
        }
        for (opt, ip, want) in [
            ("--dst-type", &dst, true),
            ("!--dst-type", &dst, false),
            ("--src-type", &src, true),
            ("!--src-type", &src, false),
        ] {
            if let Some(t) = r.get(opt)
                && t == "LOCAL"
                && self.local(ip) != want
            {
                return false;
            }
        }
        if let Some(spec) = r.get("--mark") {
            let (value, mask) = parse_mark(spec);
            if mark & mask != value {
                return false;
            }
        }
        if let Some(spec) = r.get("!--mark") {
            let (value, mask) = parse_mark(spec);
            if mark & mask == value {
                return false;
            }
        }
        // Interface matches (detect-local by bridge or interface prefix): a pod of this
        // node arrives on a pod interface, nothing else does.
        if r.get("-i").is_some() && self.q.client != ClientKind::Pod {
            return false;
        }
        if r.get("!-i").is_some() && self.q.client == ClientKind::Pod {
            return false;
        }
        true
    }

    /// Walks `chain`; returns the paths that end in a DNAT (terminal) and the path that
    /// falls out of the chain (None when every way through was terminal).
    fn walk(&self, chain: &str, mut path: Path, depth: usize, out: &mut Vec<Path>) -> Option<Path> {
        if depth > 16 {
            return Some(path);
        }
        let rules: Vec<&Rule> = self.nat.iter().filter(|r| r.chain == chain).collect();
        for r in rules {
            if !self.matches(r, path.mark) {
                continue;
            }
            if let Some(secs) = r.get("--seconds").and_then(|s| s.parse().ok())
                && r.opts.contains_key("--rcheck")
            {
                // Affinity: the same endpoint is also reachable through the statistic
                // rules below, so this is noted, not followed.
                path.affinity = Some(secs);
                continue;
            }
            if path.comment.is_none()
                && let Some(c) = r.get("--comment")
                && c.contains('/')
            {
                path.comment = Some(c.to_string());
            }
            let target = r.get("-j").unwrap_or_default();
            let branch = r.get("--probability").is_some();
            match target {
                "DNAT" => {
                    path.dnat = r.get("--to-destination").map(str::to_string);
                    path.endpoint_chain = Some(chain.to_string());
                    out.push(path);
                    return None;
                }
                "MARK" => {
                    if let Some(m) = r.get("--or-mark") {
                        path.mark |= parse_mark(m).0;
                    } else if let Some(m) = r.get("--set-xmark") {
                        let (v, mask) = parse_mark(m);
                        path.mark = (path.mark & !mask) ^ v;
                    } else if let Some(m) = r.get("--xor-mark") {
                        path.mark ^= parse_mark(m).0;
                    }
                }
                "RETURN" => return Some(path),
                "ACCEPT" => return Some(path),
                t if t.starts_with("KUBE-") => {
                    let rest = self.walk(t, path.clone(), depth + 1, out);
                    if !branch {
                        match rest {
                            Some(p) => path = p,
                            None => return None,
                        }
                    }
                }
                _ => {}
            }
        }
        Some(path)
    }
}

fn service_of(comment: &str) -> Option<PortRef> {
    let first = comment.split_whitespace().next()?;
    let (ns, rest) = first.split_once('/')?;
    let (name, port) = rest.split_once(':').unwrap_or((rest, ""));
    Some(PortRef {
        namespace: ns.into(),
        name: name.into(),
        port_name: port.into(),
    })
}

fn kind_of(comment: &str, chain_hint: bool) -> FrontendKind {
    if comment.contains("loadbalancer IP") {
        FrontendKind::LoadBalancer
    } else if comment.contains("external IP") {
        FrontendKind::ExternalIp
    } else if comment.contains("cluster IP") {
        FrontendKind::ClusterIp
    } else if chain_hint {
        FrontendKind::NodePort
    } else {
        FrontendKind::ClusterIp
    }
}

/// The clients the `recent` module remembers, per list (endpoint chain) name, as
/// `/proc/net/xt_recent/<name>` shows them ("src=10.0.0.2 ttl: ...").
pub type RecentLists = std::collections::HashMap<String, Vec<IpAddr>>;

pub fn parse_recent(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("src=")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The trace of `q` through saved rules (`nat` and `filter` of the question's family);
/// `recent` gives the affinity lists' current members.
pub fn trace(
    nat: &str,
    filter: &str,
    node_addresses: &[IpAddr],
    recent: &RecentLists,
    q: &Question,
) -> Verdict {
    let decided_by = if q.client == ClientKind::Node {
        "nat OUTPUT"
    } else {
        "nat PREROUTING"
    };
    let mut v = Verdict::untouched("iptables", q, decided_by);
    if q.client == ClientKind::Pod && q.to.ip().is_loopback() {
        // The pod's own loopback: its packets never reach the node's rules.
        v.steps
            .push("a pod's loopback address is its own: the node's rules never see it".into());
        return v;
    }
    let ctx = Ctx {
        q,
        node_addresses,
        nat: save::rules(nat).collect(),
    };
    let mut ends = Vec::new();
    ctx.walk("KUBE-SERVICES", Path::default(), 0, &mut ends);
    let steps = &mut v.steps;
    if !ends.is_empty() {
        let first = &ends[0];
        if let Some(c) = &first.comment {
            let service = service_of(c);
            steps.push(format!("nat KUBE-SERVICES matches {} ({c})", q.to));
            v.frontend = Some(MatchedFrontend {
                address: q.to.ip(),
                port: q.to.port(),
                protocol: proto_name(q.proto),
                // A node address, or loopback (localhost NodePorts), reaches NodePorts.
                kind: kind_of(c, ctx.local(&q.to.ip())),
                service,
                scope: "external",
            });
        }
        for p in &ends {
            let Some(dest) = p.dnat.as_deref().and_then(|d| d.parse::<SocketAddr>().ok()) else {
                continue;
            };
            let masquerade = p.mark & DEFAULT_MASQ_MARK != 0;
            match v
                .candidates
                .iter_mut()
                .find(|c| SocketAddr::new(c.address, c.port) == dest)
            {
                Some(c) => c.masquerade |= masquerade,
                None => v.candidates.push(Candidate {
                    address: dest.ip(),
                    port: dest.port(),
                    local: false,
                    terminating: false,
                    masquerade,
                }),
            }
            if let Some(secs) = p.affinity {
                let pinned = p
                    .endpoint_chain
                    .as_ref()
                    .and_then(|c| recent.get(c))
                    .is_some_and(|clients| clients.contains(&q.from));
                let info = v.affinity.get_or_insert(AffinityInfo {
                    timeout_seconds: secs,
                    pinned_backend: None,
                });
                if pinned {
                    info.pinned_backend = Some(dest);
                }
            }
        }
        steps.push(format!(
            "{} endpoint chain(s) reachable (statistic rules pick one at random)",
            v.candidates.len()
        ));
        if let Some(a) = &v.affinity {
            steps.push(match a.pinned_backend {
                Some(b) => format!(
                    "sessionAffinity ClientIP ({}s): the recent list of {b} holds this client",
                    a.timeout_seconds
                ),
                None => format!(
                    "sessionAffinity ClientIP ({}s): the recent module keeps a client on the endpoint it first reached",
                    a.timeout_seconds
                ),
            });
        }
        v.action = Action::Forward;
        let node_source = q.client == ClientKind::Node && node_addresses.contains(&q.from);
        v.explain_masquerade(
            q,
            node_addresses,
            node_source,
            "marked for masquerade: KUBE-POSTROUTING SNATs to a node address",
        );
        return v;
    }
    steps.push(format!("no nat rule translates {}", q.to));
    // No DNAT: the filter table's verdicts on the original destination.
    let filter: Vec<Rule> = save::rules(filter).collect();
    let mut chains = vec!["KUBE-PROXY-FIREWALL", "KUBE-SERVICES"];
    if q.client != ClientKind::Node {
        chains.push("KUBE-EXTERNAL-SERVICES");
        chains.push("KUBE-NODEPORTS");
    }
    for chain in chains {
        for r in filter.iter().filter(|r| r.chain == chain) {
            let target = r.get("-j").unwrap_or_default();
            if (target == "REJECT" || target == "DROP") && ctx.matches(r, 0) {
                let comment = r.get("--comment").unwrap_or_default();
                steps.push(format!("filter {chain}: {target} ({comment})"));
                if let Some(service) = service_of(comment) {
                    v.frontend = Some(MatchedFrontend {
                        address: q.to.ip(),
                        port: q.to.port(),
                        protocol: proto_name(q.proto),
                        kind: kind_of(comment, chain == "KUBE-NODEPORTS"),
                        service: Some(service),
                        scope: "external",
                    });
                }
                v.action = if target == "REJECT" {
                    Action::Reject
                } else {
                    Action::Drop
                };
                v.decided_by = "filter";
                return v;
            }
        }
    }
    steps.push("passed on untouched".into());
    v
}

#[cfg(test)]
mod tests;
