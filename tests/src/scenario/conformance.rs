// SPDX-License-Identifier: Apache-2.0
//! Differential replay (pure): what each flow's attempts showed, written by the runner
//! (`run --observations FILE`, one JSON line a flow), and the flows where one of our
//! modes and upstream's kube-proxy saw different things (`scenario-runner diff`, driven by
//! `cargo xtask conformance --diff MODE`).
//!
//! Two replays are compared flow by flow (the same file and flow index): which kinds of
//! answer came (an endpoint's echo, a plain listener, another answer, a refusal, no
//! answer, an error), the source the endpoints saw (an address of the node, or the
//! client's own), and the endpoints that answered. Endpoints are chosen at random, so two
//! replays that each stayed inside the file's backend set agree; a sticky flow must stay on
//! one endpoint in both. A flow only one replay ran is the file's own split of the packet
//! by `modes:` (its documented divergence), and a flow listed in tests/upstream-outcomes.yaml
//! for the mode is a documented difference: neither is reported as a difference.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};

use super::{
    format::{Expectation, Flow, Mode},
    outcome::{AnswerKind, Attempt, Outcome},
    upstream_outcomes::{Aspect, Listed, UpstreamOutcomes, known_class},
};

/// What a flow's attempts showed, as far as two proxies are compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// `echo`, `plain`, `other`, `refused`, `timeout`, `error`.
    pub kinds: BTreeSet<String>,
    /// The endpoints whose echo answered.
    pub backends: BTreeSet<SocketAddr>,
    /// Per echo answer: did the endpoint see an address of the node (masquerade)?
    pub masq: BTreeSet<bool>,
}

impl Observation {
    pub fn of(attempts: &[Attempt], node_addresses: &BTreeSet<IpAddr>) -> Self {
        let mut out = Self::default();
        for attempt in attempts {
            let kind = match (attempt.outcome, attempt.answer_kind) {
                (Outcome::Answer, Some(AnswerKind::Echo)) => "echo",
                (Outcome::Answer, Some(AnswerKind::Plain)) => "plain",
                (Outcome::Answer, _) => "other",
                (Outcome::Refused, _) => "refused",
                (Outcome::Timeout, _) => "timeout",
                (Outcome::Error, _) => "error",
            };
            out.kinds.insert(kind.to_string());
            if kind == "echo" {
                out.backends.extend(attempt.backend);
                if let Some(source) = attempt.seen_source {
                    out.masq.insert(node_addresses.contains(&source));
                }
            }
        }
        out
    }
}

/// One flow of one replay, as the runner writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedFlow {
    /// The scenario file's name.
    pub file: String,
    pub index: usize,
    /// `proto from -> to`, for reports.
    pub packet: String,
    /// The file's backend set for the flow, if it expects one.
    #[serde(default)]
    pub expected_backends: BTreeSet<SocketAddr>,
    #[serde(default)]
    pub sticky: bool,
    /// The flow's note (a fuzzed flow's `fuzz:` tags name its known classes).
    #[serde(default)]
    pub note: String,
    pub observed: Observation,
}

impl ObservedFlow {
    pub fn new(file: &str, flow: &Flow, observed: Observation) -> Self {
        Self {
            file: file.to_string(),
            index: flow.index,
            packet: format!("{} {} -> {}", flow.proto, flow.from, flow.to),
            expected_backends: match &flow.expect {
                Expectation::Backends(set) => set.clone(),
                _ => BTreeSet::new(),
            },
            sticky: flow.sticky,
            note: flow.note.clone(),
            observed,
        }
    }
}

/// A flow the two replays saw differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub file: String,
    pub index: usize,
    pub packet: String,
    pub ours: Observation,
    pub upstream: Observation,
    pub what: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DIFF {} #{} {}: {} (ours {:?}, upstream {:?})",
            self.file, self.index, self.packet, self.what, self.ours, self.upstream
        )
    }
}

/// How two observations of one flow differ, aspect by aspect (see the module doc); empty
/// when they agree.
pub fn differs(
    flow: &ObservedFlow,
    ours: &Observation,
    upstream: &Observation,
) -> Vec<(Aspect, String)> {
    let mut out = Vec::new();
    if ours.kinds != upstream.kinds {
        out.push((
            Aspect::Answers,
            format!(
                "answers {:?} against upstream's {:?}",
                ours.kinds, upstream.kinds
            ),
        ));
    }
    if ours.masq != upstream.masq {
        out.push((
            Aspect::Masq,
            format!(
                "endpoints saw a node address {:?} against upstream's {:?}",
                ours.masq, upstream.masq
            ),
        ));
    }
    let within = |o: &Observation| o.backends.is_subset(&flow.expected_backends);
    let backends_agree = ours.backends == upstream.backends
        || (!flow.expected_backends.is_empty() && within(ours) && within(upstream));
    if !backends_agree {
        out.push((
            Aspect::Endpoints,
            format!(
                "endpoints {:?} against upstream's {:?}",
                ours.backends, upstream.backends
            ),
        ));
    }
    if flow.sticky && (ours.backends.len() > 1) != (upstream.backends.len() > 1) {
        out.push((Aspect::Stickiness, "stickiness".into()));
    }
    out
}

/// Whether the list documents `aspects` of the flow differing between ours in
/// `ours_mode` and upstream in `upstream_mode`.
fn documented(
    outcomes: &UpstreamOutcomes,
    flow: &ObservedFlow,
    aspects: &[(Aspect, String)],
    ours_mode: Mode,
    upstream_mode: Mode,
) -> bool {
    let file = std::path::Path::new(&flow.file);
    if outcomes.find(file, flow.index, upstream_mode).is_some() {
        return true;
    }
    let only: Vec<Aspect> = aspects.iter().map(|(a, _)| *a).collect();
    if known_class(&flow.note, ours_mode, &only).is_some() {
        return true;
    }
    if ours_mode != Mode::Ebpf {
        return false;
    }
    match outcomes.find(file, flow.index, Mode::Ebpf) {
        Some(entry) => match entry.listed {
            Listed::EbpfAspect(allowed) => aspects.iter().all(|(a, _)| *a == allowed),
            Listed::Outcome { .. } => false,
        },
        None => false,
    }
}

/// What the comparison of two replays found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    pub compared: usize,
    /// Flows only one replay ran: the files' own `modes:` splits.
    pub split: usize,
    /// Flows listed in tests/upstream-outcomes.yaml that differ as listed.
    pub documented: Vec<Difference>,
    pub differences: Vec<Difference>,
}

/// Compares our replay in `ours_mode` with upstream's in `upstream_mode`.
pub fn compare(
    ours: &[ObservedFlow],
    upstream: &[ObservedFlow],
    outcomes: &UpstreamOutcomes,
    ours_mode: Mode,
    upstream_mode: Mode,
) -> Comparison {
    let key = |f: &ObservedFlow| (f.file.clone(), f.index);
    let theirs: BTreeMap<(String, usize), &ObservedFlow> =
        upstream.iter().map(|f| (key(f), f)).collect();
    let mut out = Comparison::default();
    let mut seen = BTreeSet::new();
    for flow in ours {
        let Some(other) = theirs.get(&key(flow)) else {
            out.split += 1;
            continue;
        };
        seen.insert(key(flow));
        out.compared += 1;
        let aspects = differs(flow, &flow.observed, &other.observed);
        if aspects.is_empty() {
            continue;
        }
        let difference = Difference {
            file: flow.file.clone(),
            index: flow.index,
            packet: flow.packet.clone(),
            ours: flow.observed.clone(),
            upstream: other.observed.clone(),
            what: aspects
                .iter()
                .map(|(_, what)| what.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        };
        if documented(outcomes, flow, &aspects, ours_mode, upstream_mode) {
            out.documented.push(difference);
        } else {
            out.differences.push(difference);
        }
    }
    out.split += upstream.iter().filter(|f| !seen.contains(&key(f))).count();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(backend: &str, source: &str) -> Attempt {
        Attempt {
            answer_kind: Some(AnswerKind::Echo),
            backend: Some(backend.parse().unwrap()),
            seen_source: Some(source.parse().unwrap()),
            connected: true,
            ..Attempt::new(Outcome::Answer, 1)
        }
    }

    fn node() -> BTreeSet<IpAddr> {
        BTreeSet::from(["192.168.0.2".parse().unwrap()])
    }

    fn observed(file: &str, index: usize, attempts: &[Attempt], expected: &[&str]) -> ObservedFlow {
        ObservedFlow {
            file: file.into(),
            index,
            packet: "tcp 10.0.0.2 -> 172.30.0.41:80".into(),
            expected_backends: expected.iter().map(|b| b.parse().unwrap()).collect(),
            sticky: false,
            note: String::new(),
            observed: Observation::of(attempts, &node()),
        }
    }

    #[test]
    fn observations_keep_kinds_endpoints_and_masquerade() {
        let seen = Observation::of(
            &[
                echo("10.180.0.1:80", "192.168.0.2"),
                echo("10.180.0.2:80", "10.0.0.2"),
                Attempt::new(Outcome::Timeout, 1000),
            ],
            &node(),
        );
        assert_eq!(
            seen.kinds,
            BTreeSet::from(["echo".to_string(), "timeout".to_string()])
        );
        assert_eq!(seen.backends.len(), 2);
        assert_eq!(seen.masq, BTreeSet::from([false, true]));
    }

    #[test]
    fn random_endpoints_inside_the_files_set_agree_and_the_rest_differs() {
        let set = ["10.180.0.1:80", "10.180.0.2:80"];
        let a = observed("c1.yaml", 1, &[echo("10.180.0.1:80", "10.0.0.2")], &set);
        let b = observed("c1.yaml", 1, &[echo("10.180.0.2:80", "10.0.0.2")], &set);
        let none = UpstreamOutcomes::default();
        let same = compare(
            std::slice::from_ref(&a),
            &[b],
            &none,
            Mode::Nftables,
            Mode::Nftables,
        );
        assert_eq!((same.compared, same.differences.len()), (1, 0));

        let masqueraded = observed("c1.yaml", 1, &[echo("10.180.0.1:80", "192.168.0.2")], &set);
        let found = compare(
            std::slice::from_ref(&a),
            &[masqueraded],
            &none,
            Mode::Nftables,
            Mode::Nftables,
        );
        assert_eq!(found.differences.len(), 1, "{found:?}");
        assert!(found.differences[0].what.contains("node address"));

        let refused = observed("c1.yaml", 1, &[Attempt::new(Outcome::Refused, 0)], &set);
        let found = compare(
            std::slice::from_ref(&a),
            &[refused],
            &none,
            Mode::Nftables,
            Mode::Nftables,
        );
        assert!(
            found.differences[0]
                .to_string()
                .starts_with("DIFF c1.yaml #1 tcp")
        );

        // A flow only one replay has is the file's split; a listed one is documented.
        let split = observed("c1.yaml", 2, &[Attempt::new(Outcome::Timeout, 1000)], &[]);
        let listed = UpstreamOutcomes::parse(
            "- {file: c1.yaml, flow: 1, modes: [nftables], kind: divergence, upstream: {expect: REJECT}, why: x}",
        )
        .unwrap();
        let refused = observed("c1.yaml", 1, &[Attempt::new(Outcome::Refused, 0)], &set);
        let found = compare(
            &[a, split],
            &[refused],
            &listed,
            Mode::Nftables,
            Mode::Nftables,
        );
        assert_eq!(
            (
                found.compared,
                found.split,
                found.documented.len(),
                found.differences.len()
            ),
            (1, 1, 1, 0)
        );
    }

    #[test]
    fn an_ebpf_divergence_covers_its_aspect_only_and_only_for_ebpf() {
        let set = ["10.180.0.1:80", "10.180.0.2:80"];
        let plain = observed("n1.yaml", 9, &[echo("10.180.0.1:80", "10.0.0.2")], &set);
        let masqueraded = observed("n1.yaml", 9, &[echo("10.180.0.1:80", "192.168.0.2")], &set);
        let elsewhere = observed("n1.yaml", 9, &[echo("10.180.0.9:80", "192.168.0.2")], &set);
        let listed = UpstreamOutcomes::parse(
            "- {file: n1.yaml, flow: 9, modes: [ebpf], kind: ebpf-divergence, differs_in: masq, why: x}",
        )
        .unwrap();
        let count = |ours: &ObservedFlow, theirs: &ObservedFlow, mode: Mode| {
            let found = compare(
                std::slice::from_ref(ours),
                std::slice::from_ref(theirs),
                &listed,
                mode,
                Mode::Nftables,
            );
            (found.documented.len(), found.differences.len())
        };
        assert_eq!(count(&plain, &masqueraded, Mode::Ebpf), (1, 0));
        assert_eq!(count(&plain, &masqueraded, Mode::Nftables), (0, 1));
        // Another aspect differing as well is not covered.
        assert_eq!(count(&plain, &elsewhere, Mode::Ebpf), (0, 1));
    }
}
