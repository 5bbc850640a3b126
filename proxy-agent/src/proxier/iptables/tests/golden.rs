// SPDX-License-Identifier: Apache-2.0
//! Golden rules for every behaviour scenario: for each state, the full restore input of
//! each family with services (normalized as upstream's tests compare rules), and for
//! each later state the partial input a sync from the previous state writes. The files
//! live in proxy-agent/tests/data/iptables/; `UPDATE_GOLDEN=1` rewrites them.

use std::fmt::Write;
use std::path::PathBuf;

use super::normalize;
use super::scenario::{Scenario, scenario_files};
use crate::proxier::iptables::rules::{
    FamilyContext, Model, Probabilities, RestoreBuffers, RuleCache, RuleOptions, Scope, generate,
};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/iptables")
}

/// The golden text of one scenario.
fn render(scenario: &Scenario) -> String {
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
            let ctx = FamilyContext::new(&replay.node, state.family, RuleOptions::default());
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

#[test]
fn every_scenario_matches_its_golden_rules() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for path in scenario_files() {
        let scenario = Scenario::load(&path);
        let text = render(&scenario);
        let golden = golden_dir().join(format!("{}.golden", scenario.name));
        if update {
            std::fs::create_dir_all(golden_dir()).unwrap();
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
