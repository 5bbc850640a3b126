// SPDX-License-Identifier: Apache-2.0
//! Golden rules for every behaviour scenario: for each state, the full restore input of
//! each family with services (normalized as upstream's tests compare rules), and for
//! each later state the partial input a sync from the previous state writes. The files
//! live in proxy-agent/tests/data/iptables/; `UPDATE_GOLDEN=1` rewrites them.
//!
//! The same with upstream's nfacct objects available (the rules then feed them, see
//! `proxier::netfilter::nfacct`) live in proxy-agent/tests/data/iptables/nfacct/; the
//! shared scenarios' goldens have no nfacct, as a host without it.

use std::fmt::Write;
use std::path::PathBuf;

use super::normalize;
use super::scenario::{Scenario, scenario_files};
use crate::proxier::iptables::rules::{
    FamilyContext, Model, NfacctCounters, Probabilities, RestoreBuffers, RuleCache, RuleOptions,
    Scope, generate,
};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/iptables")
}

fn nfacct_golden_dir() -> PathBuf {
    golden_dir().join("nfacct")
}

/// The golden text of one scenario on a host without nfacct.
fn render(scenario: &Scenario) -> String {
    render_with(scenario, RuleOptions::default())
}

/// The golden text of one scenario with these host facts.
fn render_with(scenario: &Scenario, options: RuleOptions) -> String {
    let mut replay = scenario.replay();
    let mut text = format!(
        "# Scenario {}: generated iptables-restore input.\n",
        scenario.name
    );
    let mut caches: Vec<(RuleCache, Probabilities)> = (0..replay.families.len())
        .map(|_| Default::default())
        .collect();
    for (index, objects) in scenario.states.iter().enumerate() {
        let step = replay.apply(objects);
        for (state, (cache, probabilities)) in replay.families.iter().zip(&mut caches) {
            if state.services.is_empty() && cache.port_count() == 0 {
                continue;
            }
            let ctx = FamilyContext::new(&replay.node, state.family, options);
            let model = Model {
                services: &state.services,
                endpoints: &state.endpoints,
            };
            let mut out = RestoreBuffers::default();
            let mut input = String::new();
            if index > 0 {
                let generated = generate(
                    model,
                    &ctx,
                    Scope::Partial(&step.changed),
                    cache,
                    probabilities,
                    &mut out,
                );
                out.delete_chains(generated.stale_chains.iter());
                out.assemble(&mut input);
                let mut changed: Vec<String> = step.changed.iter().map(|s| s.to_string()).collect();
                changed.sort();
                let _ = writeln!(
                    text,
                    "\n## state {index}, {}: partial sync from state {} (changed: {})",
                    state.family,
                    index - 1,
                    changed.join(", ")
                );
                text.push_str(&normalize(&input));
            }
            let mut fresh = RuleCache::default();
            let generated = generate(
                model,
                &ctx,
                Scope::Full,
                &mut fresh,
                probabilities,
                &mut out,
            );
            input.clear();
            out.assemble(&mut input);
            let _ = writeln!(
                text,
                "\n## state {index}, {}: full sync ({} service ports, {} endpoints)",
                state.family, generated.service_ports, generated.endpoints
            );
            text.push_str(&normalize(&input));
            if index == 0 {
                *cache = fresh;
            }
        }
    }
    text
}

fn with_nfacct() -> RuleOptions {
    RuleOptions {
        nfacct: NfacctCounters::ALL,
        ..RuleOptions::default()
    }
}

#[test]
fn every_scenario_matches_its_golden_rules() {
    compare_goldens(&golden_dir(), render);
}

#[test]
fn every_scenario_matches_its_golden_rules_with_nfacct() {
    compare_goldens(&nfacct_golden_dir(), |scenario| {
        render_with(scenario, with_nfacct())
    });
}

/// With nfacct, the rules are those without it plus the counting: the INVALID-drop rule
/// names its object, and each NodePort rule of KUBE-NODEPORTS with endpoints is preceded,
/// in IPv4 with localhost NodePorts on, by the same jump for 127.0.0.0/8 naming the
/// localhost object. Checked for every scenario against the rendering without nfacct.
#[test]
fn nfacct_only_adds_the_counting() {
    const INVALID: &str = " -m nfacct --nfacct-name ct_state_invalid_dropped_pkts";
    const LOCALHOST: &str = " -m nfacct --nfacct-name localhost_nps_accepted_pkts";
    let mut localhost_rules = 0;
    for path in scenario_files() {
        let scenario = Scenario::load(&path);
        let plain = render(&scenario);
        let counted = render_with(&scenario, with_nfacct());
        let mut stripped = Vec::new();
        let mut lines = counted.lines().peekable();
        while let Some(line) = lines.next() {
            if let Some((before, after)) = line.split_once(LOCALHOST) {
                // The counting rule: the next rule without `-d 127.0.0.0/8` and nfacct.
                assert!(
                    before.starts_with("-A KUBE-NODEPORTS ")
                        && before.contains(" -d 127.0.0.0/8 --dport "),
                    "{}: {line}",
                    scenario.name
                );
                let next = lines.peek().copied().unwrap_or_default();
                let uncounted = format!("{}{after}", before.replace(" -d 127.0.0.0/8", ""));
                assert_eq!(next, uncounted, "{}: {line}", scenario.name);
                localhost_rules += 1;
                continue;
            }
            stripped.push(line.replace(INVALID, ""));
        }
        assert_eq!(stripped.join("\n"), plain.trim_end(), "{}", scenario.name);
        assert_eq!(
            counted.contains(INVALID),
            plain.contains("--ctstate INVALID -j DROP"),
            "{}",
            scenario.name
        );
    }
    assert!(
        localhost_rules > 0,
        "no scenario has a localhost NodePort rule"
    );
}

/// The lines upstream's own test expects with its nfacct objects available, quoted from
/// TestOverallIPTablesRules (kubernetes/kubernetes pkg/proxy/iptables/proxier_test.go),
/// which the a1-overall scenario restates (it also gives ns4/svc4 a NodePort, 3004).
#[test]
fn a1_overall_with_nfacct_has_upstreams_counting_rules() {
    let path = scenario_files()
        .into_iter()
        .find(|p| p.ends_with("a1-overall.yaml"))
        .expect("the shared scenario a1-overall");
    let text = render_with(&Scenario::load(&path), with_nfacct());
    let upstream = [
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP",
        "-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-GNZBNJ2PO5MGZ6GT",
        "-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT",
        "-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK",
        "-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK",
        "-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-NUKIZ6OKUXPJNT4C",
        "-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C",
    ];
    // The first state's IPv4 full sync.
    let first: Vec<&str> = text
        .split("\n## ")
        .nth(1)
        .expect("state 0")
        .lines()
        .collect();
    for line in upstream {
        assert!(first.contains(&line), "missing {line}:\n{text}");
    }
    // Each counting rule directly precedes its NodePort's rule, as upstream writes them.
    for pair in upstream[1..].chunks(2) {
        let at = first.iter().position(|l| *l == pair[0]).unwrap();
        assert_eq!(first[at + 1], pair[1]);
    }
}

fn compare_goldens(dir: &std::path::Path, render: impl Fn(&Scenario) -> String) {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for path in scenario_files() {
        let scenario = Scenario::load(&path);
        let text = render(&scenario);
        let golden = dir.join(format!("{}.golden", scenario.name));
        if update {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(&golden, &text).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_else(|_| {
            panic!(
                "{} is missing; run with UPDATE_GOLDEN=1 and review it",
                golden.display()
            )
        });
        if expected != text {
            let line = expected
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(expected.lines().count().min(text.lines().count()));
            failures.push(format!(
                "{}: differs at line {}:\n  golden:    {}\n  generated: {}",
                golden.display(),
                line + 1,
                expected.lines().nth(line).unwrap_or("<end>"),
                text.lines().nth(line).unwrap_or("<end>")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "golden mismatches (UPDATE_GOLDEN=1 rewrites them; review the diff):\n{}",
        failures.join("\n")
    );
}
