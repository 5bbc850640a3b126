// SPDX-License-Identifier: Apache-2.0
//! `proxy-agent trace`: what the running dataplane would do with one connection.
//!
//! This module holds the vocabulary every mode answers in (a [`Question`], a [`Verdict`])
//! and [`client`] (where the client sits, from the node's addresses and routes). Each mode
//! that can be traced follows its own dataplane's lookup order in its folder (ebpf: the
//! decoded pinned maps; iptables: iptables-save) and registers that with the mode (see
//! [`crate::proxier::ModeTools`]); the decision itself is pure.

pub mod client;

use std::net::{IpAddr, SocketAddr};

use proxy_common::proto;
use serde::Serialize;

use crate::model::PortRef;

/// Where the client of the traced connection sits, which decides which programs see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// A process of the node itself (host network namespace): socket programs.
    Node,
    /// A pod on this node: socket programs.
    Pod,
    /// Anything reaching the node over an uplink: tc (or XDP) programs.
    External,
}

impl ClientKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "node" => Some(Self::Node),
            "pod" => Some(Self::Pod),
            "external" => Some(Self::External),
            _ => None,
        }
    }
}

/// A trace as asked on the command line: where the client sits may be left to the mode,
/// which knows its uplinks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    pub from: IpAddr,
    pub to: SocketAddr,
    /// IANA protocol number.
    pub proto: u8,
    pub client: Option<ClientKind>,
}

impl TraceRequest {
    /// The question, with the client placed by `classify` unless the request placed it.
    pub fn question(&self, classify: impl FnOnce(&IpAddr) -> ClientKind) -> Question {
        Question {
            from: self.from,
            to: self.to,
            proto: self.proto,
            client: self.client.unwrap_or_else(|| classify(&self.from)),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    pub from: IpAddr,
    pub to: SocketAddr,
    /// IANA protocol number.
    pub proto: u8,
    pub client: ClientKind,
}

/// What happens to the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Translated to one of the candidate backends.
    Forward,
    /// Refused at once (ECONNREFUSED, TCP RST or ICMP port unreachable).
    Reject,
    /// Silently dropped.
    Drop,
    /// Not a service: the proxy leaves it alone.
    Untouched,
}

/// The frontend the destination matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MatchedFrontend {
    pub address: IpAddr,
    pub port: u16,
    pub protocol: &'static str,
    pub kind: FrontendKind,
    pub service: Option<PortRef>,
    /// "external" or "internal" (the set for clients on this node, when it differs).
    pub scope: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub address: IpAddr,
    pub port: u16,
    pub local: bool,
    pub terminating: bool,
    /// The source is rewritten to a node address on the way to this backend (it can
    /// differ between backends: iptables masquerades a pod reaching itself, the hairpin).
    pub masquerade: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AffinityInfo {
    pub timeout_seconds: u32,
    /// The backend a live affinity entry pins this client to, if one exists.
    pub pinned_backend: Option<SocketAddr>,
}

/// The answer of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub mode: &'static str,
    pub from: IpAddr,
    pub to: SocketAddr,
    pub protocol: &'static str,
    pub client: ClientKind,
    /// Which program decides: "socket" (connect/sendmsg) or "tc" (uplink).
    pub decided_by: &'static str,
    pub action: Action,
    pub frontend: Option<MatchedFrontend>,
    pub candidates: Vec<Candidate>,
    pub affinity: Option<AffinityInfo>,
    /// Whether the source is rewritten to a node address on the way to every candidate.
    pub masquerade: bool,
    /// The source address the backend sees (its own for the client unless masqueraded).
    pub backend_sees_source: Option<IpAddr>,
    /// The explanation, one step per line.
    pub steps: Vec<String>,
}

impl Verdict {
    /// The masquerade part of a forward verdict of the netfilter modes, once its candidates
    /// are known: a step naming the candidates only a hairpin masquerades (the client is
    /// also the endpoint), then either every path is marked for masquerade (`marked` says
    /// where the SNAT happens; the backend sees a node address) or the backend sees the
    /// client's address (`node_client`: the node's own).
    pub fn explain_masquerade(
        &mut self,
        q: &Question,
        node_addresses: &[IpAddr],
        node_client: bool,
        marked: &str,
    ) {
        let masquerade_all = self.candidates.iter().all(|c| c.masquerade);
        let hairpin: Vec<String> = self
            .candidates
            .iter()
            .filter(|c| c.masquerade)
            .map(|c| SocketAddr::new(c.address, c.port).to_string())
            .collect();
        if !masquerade_all && !hairpin.is_empty() {
            self.steps.push(format!(
                "hairpin: the client is also an endpoint; on the way to {} it is masqueraded",
                hairpin.join(", ")
            ));
        }
        if masquerade_all {
            self.steps.push(marked.to_string());
            self.masquerade = true;
            self.backend_sees_source = node_addresses
                .iter()
                .find(|a| a.is_ipv6() == q.from.is_ipv6() && !a.is_loopback())
                .copied();
        } else {
            self.steps.push(if node_client {
                "not masqueraded: the backend sees the node's own address".to_string()
            } else {
                "not masqueraded: the client address is kept".to_string()
            });
            self.backend_sees_source = Some(q.from);
        }
    }

    /// The answer before `mode`'s `decided_by` step looked at the question: nothing matched
    /// yet, no step taken.
    pub fn untouched(mode: &'static str, q: &Question, decided_by: &'static str) -> Self {
        Self {
            mode,
            from: q.from,
            to: q.to,
            protocol: proto_name(q.proto),
            client: q.client,
            decided_by,
            action: Action::Untouched,
            frontend: None,
            candidates: Vec::new(),
            affinity: None,
            masquerade: false,
            backend_sees_source: None,
            steps: Vec::new(),
        }
    }

    /// Human-readable rendering.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{} {} -> {} ({} client, {} mode, decided by the {} program)\n",
            self.protocol,
            self.from,
            self.to,
            match self.client {
                ClientKind::Node => "node",
                ClientKind::Pod => "pod",
                ClientKind::External => "external",
            },
            self.mode,
            self.decided_by
        );
        for (i, step) in self.steps.iter().enumerate() {
            out.push_str(&format!("  {}. {step}\n", i + 1));
        }
        let verdict = match self.action {
            Action::Forward => {
                let list: Vec<String> = self
                    .candidates
                    .iter()
                    .map(|c| SocketAddr::new(c.address, c.port).to_string())
                    .collect();
                format!("FORWARD to one of [{}]", list.join(", "))
            }
            Action::Reject => "REJECT".into(),
            Action::Drop => "DROP".into(),
            Action::Untouched => "UNTOUCHED".into(),
        };
        out.push_str(&format!("verdict: {verdict}"));
        if self.action == Action::Forward {
            out.push_str(if self.masquerade {
                ", masqueraded"
            } else {
                ", source preserved"
            });
            if let Some(src) = self.backend_sees_source {
                out.push_str(&format!(" (backend sees {src})"));
            }
        }
        out.push('\n');
        out
    }
}

/// What kind of address a frontend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontendKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl FrontendKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::ExternalIp => "ExternalIP",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// The protocol's name as the Service API spells it.
pub fn proto_name(p: u8) -> &'static str {
    match p {
        proto::TCP => "TCP",
        proto::UDP => "UDP",
        proto::SCTP => "SCTP",
        _ => "?",
    }
}
