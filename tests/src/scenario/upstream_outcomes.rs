// SPDX-License-Identifier: Apache-2.0
//! Flows whose outcome under upstream's kube-proxy is not the file's expectation, with
//! upstream's outcome (`tests/upstream-outcomes.yaml`, explained in
//! tests/scenarios/README.md). (pure)
//!
//! Replaying the files against upstream (`--mode upstream-X`) found them. Each is either
//! a divergence of ours, on purpose (the file states what our modes do, and upstream-X is
//! judged by the outcome listed here), or a difference of ours still to be closed
//! (`pending`, judged the same way meanwhile). A listed flow is judged by upstream's
//! outcome in every upstream replay, so an entry that upstream stops matching fails there:
//! the list cannot go stale.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use super::{
    error::{Error, Result},
    format::{Expectation, Flow, Mode, RawExpect, parse_expectation},
};

/// Where the list lives, from the workspace root.
pub const PATH: &str = "tests/upstream-outcomes.yaml";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Ours differs from upstream on purpose; the file states ours.
    Divergence,
    /// Ours differs from upstream and should not: to be closed.
    Pending,
    /// Our ebpf mode, compared with upstream's nftables (which it follows elsewhere),
    /// differs on purpose in one aspect of what the flow observes, where the file leaves
    /// that aspect unasserted (socket-level translation needs no hairpin masquerade).
    EbpfDivergence,
}

/// What of a flow's observation two replays may see differently (`conformance::differs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aspect {
    /// Which kinds of answer came (echo, refusal, no answer...).
    Answers,
    /// Whether the endpoints saw an address of the node.
    Masq,
    /// Which endpoints answered.
    Endpoints,
    /// Whether a sticky flow stayed on one endpoint.
    Stickiness,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    file: String,
    flow: usize,
    modes: Vec<String>,
    kind: Kind,
    #[serde(default)]
    upstream: Option<RawUpstream>,
    #[serde(default)]
    differs_in: Option<Aspect>,
    why: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    expect: RawExpect,
    #[serde(default)]
    masq: Option<bool>,
}

/// What a listed flow is judged by.
#[derive(Debug, Clone, PartialEq)]
pub enum Listed {
    /// In `modes` (upstream's), upstream's kube-proxy shows `expect` (and `masq`).
    Outcome {
        expect: Expectation,
        masq: Option<bool>,
    },
    /// Our ebpf mode and upstream's nftables may observe `aspect` differently; the rest
    /// of the observation must agree.
    EbpfAspect(Aspect),
}

/// One listed flow.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamOutcome {
    /// The scenario file's name (`a1-overall.yaml`), in either scenario directory.
    pub file: String,
    /// The flow's 1-based index in its file.
    pub flow: usize,
    pub modes: BTreeSet<Mode>,
    pub kind: Kind,
    pub listed: Listed,
    pub why: String,
}

/// The whole list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamOutcomes(pub Vec<UpstreamOutcome>);

impl UpstreamOutcomes {
    pub fn parse(text: &str) -> Result<Self> {
        let raw: Vec<RawEntry> = serde_yaml::from_str(text)?;
        let mut out = Vec::with_capacity(raw.len());
        for entry in raw {
            let what = |msg: String| {
                Error::Invalid(format!("{PATH}: {} #{}: {msg}", entry.file, entry.flow))
            };
            let modes = entry
                .modes
                .iter()
                .map(|m| m.parse::<Mode>())
                .collect::<Result<BTreeSet<_>>>()
                .map_err(|e| what(e.to_string()))?;
            if entry.why.trim().is_empty() {
                return Err(what("says no why".into()));
            }
            let listed = match (entry.kind, &entry.upstream, entry.differs_in) {
                (Kind::EbpfDivergence, None, Some(aspect)) => {
                    if modes != BTreeSet::from([Mode::Ebpf]) {
                        return Err(what("an ebpf-divergence names the ebpf mode only".into()));
                    }
                    Listed::EbpfAspect(aspect)
                }
                (Kind::EbpfDivergence, _, _) => {
                    return Err(what(
                        "an ebpf-divergence gives differs_in and no upstream outcome".into(),
                    ));
                }
                (_, Some(upstream), None) => {
                    if modes.is_empty() || modes.contains(&Mode::Ebpf) {
                        return Err(what(
                            "modes must name upstream's modes (iptables, ipvs, nftables)".into(),
                        ));
                    }
                    Listed::Outcome {
                        expect: parse_expectation(&upstream.expect).map_err(what)?,
                        masq: upstream.masq,
                    }
                }
                (_, _, _) => {
                    return Err(what(
                        "gives upstream's outcome (upstream:) and no differs_in".into(),
                    ));
                }
            };
            out.push(UpstreamOutcome {
                listed,
                file: entry.file,
                flow: entry.flow,
                modes,
                kind: entry.kind,
                why: entry.why,
            });
        }
        Ok(Self(out))
    }

    /// The list in the workspace at `root`.
    pub fn load(root: &Path) -> Result<Self> {
        let path: PathBuf = root.join(PATH);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The entry for flow `index` of `file` in `mode`, if listed.
    pub fn find(&self, file: &Path, index: usize, mode: Mode) -> Option<&UpstreamOutcome> {
        let name = file.file_name()?.to_str()?;
        self.0
            .iter()
            .find(|e| e.file == name && e.flow == index && e.modes.contains(&mode))
    }

    /// `flow` as upstream's kube-proxy in `mode` is judged: with the listed outcome if
    /// there is one (and the entry), else as written.
    pub fn judged_by_upstream(
        &self,
        file: &Path,
        flow: &Flow,
        mode: Mode,
    ) -> (Flow, Option<&UpstreamOutcome>) {
        match self.find(file, flow.index, mode) {
            Some(
                entry @ UpstreamOutcome {
                    listed: Listed::Outcome { expect, masq },
                    ..
                },
            ) => {
                let mut judged = flow.clone();
                judged.expect = expect.clone();
                judged.masq = *masq;
                judged.sticky = false;
                (judged, Some(entry))
            }
            _ => (flow.clone(), None),
        }
    }
}

/// A documented difference a fuzzed flow may show: in `modes` (ours), flows tagged
/// `fuzz:<tag>` may observe `aspects` differently from upstream's kube-proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownClass {
    pub tag: &'static str,
    pub modes: &'static [Mode],
    pub aspects: &'static [Aspect],
    pub why: &'static str,
}

/// The classes of documented differences (tests/upstream-outcomes.yaml lists their
/// instances in the scenario files; tests/scenarios/README.md explains them).
pub const KNOWN_CLASSES: &[KnownClass] = &[
    KnownClass {
        tag: "hairpin",
        modes: &[Mode::Ebpf],
        aspects: &[Aspect::Masq],
        why: "socket-level LB needs no hairpin masquerade (c1's ebpf split, v6-n1 #9)",
    },
    KnownClass {
        tag: "hairpin-not-local",
        modes: &[Mode::Nftables, Mode::Ebpf],
        aspects: &[Aspect::Answers, Aspect::Masq, Aspect::Endpoints],
        why: "upstream's nftables masquerades hairpin connections only for this node's \
              endpoints (pending: a1 #16)",
    },
    KnownClass {
        tag: "socket-lb-external",
        modes: &[Mode::Ebpf],
        aspects: &[Aspect::Masq],
        why: "a pod's connection to a NodePort, external IP or LB IP is translated at \
              connect(), so it needs no SNAT where upstream's rules masquerade it \
              (f2's and e1's ebpf flows); never under masqueradeAll",
    },
];

/// The known class covering `aspects` of a flow with `note` in our `mode`, if any.
pub fn known_class(note: &str, mode: Mode, aspects: &[Aspect]) -> Option<&'static KnownClass> {
    let tags: BTreeSet<&str> = note
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("fuzz:"))
        .collect();
    KNOWN_CLASSES.iter().find(|class| {
        tags.contains(class.tag)
            && class.modes.contains(&mode)
            && aspects.iter().all(|a| class.aspects.contains(a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"
- file: s02-stale-udp-frontends.yaml
  flow: 7
  modes: [iptables, nftables]
  kind: divergence
  upstream: {expect: ['10.180.0.1:53'], masq: true}
  why: upstream's reconciler keys on the Services it still has
- file: a1-overall.yaml
  flow: 16
  modes: [nftables]
  kind: pending
  upstream: {expect: DROP}
  why: hairpin only for local endpoints
"#;

    fn flow(index: usize) -> Flow {
        Flow {
            index,
            step: 0,
            from: "10.0.0.2".parse().unwrap(),
            to: "172.30.0.41:80".parse().unwrap(),
            proto: Default::default(),
            expect: Expectation::Untouched,
            masq: None,
            sticky: true,
            modes: None,
            note: String::new(),
        }
    }

    #[test]
    fn a_listed_flow_is_judged_by_upstreams_outcome_in_its_modes_only() {
        let list = UpstreamOutcomes::parse(LIST).unwrap();
        let file = Path::new("/x/tests/scenarios/s02-stale-udp-frontends.yaml");
        let (judged, entry) = list.judged_by_upstream(file, &flow(7), Mode::Nftables);
        assert_eq!(entry.map(|e| e.kind), Some(Kind::Divergence));
        assert_eq!(
            judged.expect,
            Expectation::Backends(["10.180.0.1:53".parse().unwrap()].into())
        );
        assert_eq!(judged.masq, Some(true));
        assert!(!judged.sticky);
        let (as_written, entry) = list.judged_by_upstream(file, &flow(7), Mode::Ipvs);
        assert!(entry.is_none());
        assert_eq!(as_written, flow(7));
        assert!(list.find(file, 8, Mode::Nftables).is_none());
        assert!(
            list.find(Path::new("a1-overall.yaml"), 16, Mode::Nftables)
                .is_some()
        );
    }

    #[test]
    fn an_ebpf_divergence_names_ebpf_and_one_aspect() {
        let list = UpstreamOutcomes::parse(
            "- {file: v6-n1.yaml, flow: 9, modes: [ebpf], kind: ebpf-divergence, differs_in: masq, why: x}",
        )
        .unwrap();
        let entry = list.find(Path::new("v6-n1.yaml"), 9, Mode::Ebpf).unwrap();
        assert_eq!(entry.listed, Listed::EbpfAspect(Aspect::Masq));
        // Upstream's replays are never judged by it.
        let (judged, listed) =
            list.judged_by_upstream(Path::new("v6-n1.yaml"), &flow(9), Mode::Nftables);
        assert!(listed.is_none());
        assert_eq!(judged, flow(9));
    }

    #[test]
    fn entries_must_name_upstream_modes_and_say_why() {
        for bad in [
            LIST.replace("[iptables, nftables]", "[ebpf]"),
            LIST.replace("[iptables, nftables]", "[]"),
            LIST.replace("hairpin only for local endpoints", "''"),
            LIST.replace("kind: pending", "kind: maybe"),
            LIST.replace("{expect: DROP}", "{expect: SOMETIMES}"),
            LIST.replace("{expect: DROP}", "{expect: DROP}\n  differs_in: masq"),
            LIST.replace("kind: pending", "kind: ebpf-divergence"),
            LIST.replace(
                "kind: pending\n  upstream: {expect: DROP}",
                "kind: ebpf-divergence\n  differs_in: masq",
            ),
        ] {
            assert!(UpstreamOutcomes::parse(&bad).is_err(), "{bad}");
        }
    }

    /// Every entry of the committed list names a flow that exists, applies to the listed
    /// modes and expects something else than upstream's outcome (an entry whose outcome
    /// the file now states is stale), and the README explains its kind.
    #[test]
    fn the_committed_list_names_real_flows_that_upstream_contradicts() {
        use crate::scenario::Scenario;
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = crate_dir.join("..");
        let list = UpstreamOutcomes::load(&root).unwrap();
        assert!(!list.0.is_empty());
        let readme = std::fs::read_to_string(crate_dir.join("scenarios/README.md")).unwrap();
        for entry in &list.0 {
            let path = [
                root.join("../shared/scenarios").join(&entry.file),
                crate_dir.join("scenarios").join(&entry.file),
            ]
            .into_iter()
            .find(|p| p.is_file());
            let Some(path) = path else {
                // The shared directory may be absent from a checkout of this tree alone.
                assert!(
                    !root.join("../shared/scenarios").is_dir(),
                    "{} is listed but exists nowhere",
                    entry.file
                );
                continue;
            };
            let scenario = Scenario::load(&path).unwrap();
            let flow = scenario
                .flows()
                .find(|f| f.index == entry.flow)
                .unwrap_or_else(|| panic!("{} has no flow #{}", entry.file, entry.flow));
            for mode in &entry.modes {
                assert!(
                    flow.applies_to(*mode),
                    "{} #{} is not a {mode} flow",
                    entry.file,
                    entry.flow
                );
            }
            match &entry.listed {
                Listed::Outcome { expect, masq } => assert!(
                    flow.expect != *expect || flow.masq != *masq,
                    "{} #{}: the file already states upstream's outcome; remove the entry",
                    entry.file,
                    entry.flow
                ),
                // Compared with upstream's nftables, the file must judge it there too and
                // leave the aspect open (else the file, not the list, is where it belongs).
                Listed::EbpfAspect(aspect) => {
                    assert!(
                        flow.applies_to(Mode::Nftables),
                        "{} #{} is no nftables flow to compare ebpf with",
                        entry.file,
                        entry.flow
                    );
                    if *aspect == Aspect::Masq {
                        assert!(
                            flow.masq.is_none(),
                            "{} #{} asserts masq: split it in the file instead",
                            entry.file,
                            entry.flow
                        );
                    }
                }
            }
            let kind = match entry.kind {
                Kind::Divergence => "divergence",
                Kind::Pending => "pending",
                Kind::EbpfDivergence => "ebpf-divergence",
            };
            assert!(
                readme.contains(&format!("`{kind}`")),
                "README explains no `{kind}`"
            );
        }
    }

    #[test]
    fn known_classes_match_tags_modes_and_aspects() {
        let note = "case 0: fz1 ClusterIp port p0 from Endpoint(0) to ClusterIp fuzz:hairpin";
        assert!(known_class(note, Mode::Ebpf, &[Aspect::Masq]).is_some());
        assert!(known_class(note, Mode::Nftables, &[Aspect::Masq]).is_none());
        assert!(known_class(note, Mode::Ebpf, &[Aspect::Answers]).is_none());
        let remote = format!("{note} fuzz:hairpin-not-local");
        assert!(known_class(&remote, Mode::Nftables, &[Aspect::Answers, Aspect::Masq]).is_some());
        assert!(known_class("case 0 plain", Mode::Ebpf, &[Aspect::Masq]).is_none());
    }
}
