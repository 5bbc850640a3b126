// SPDX-License-Identifier: Apache-2.0
//! Golden rulesets for every behaviour scenario (../shared/scenarios) and this module's
//! own (IPv6, ServiceCIDRs): for each state, each family with services, the partial
//! transaction from the previous state (with the deletion of the chains it left stale)
//! and the full one. The files live next to this one in golden/; `UPDATE_GOLDEN=1`
//! rewrites them.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::proxier::iptables::tests::scenario::{Scenario, scenario_files};
use crate::proxier::nftables::names::ENDPOINT_SLOTS;
use crate::proxier::nftables::{DesiredState, Model, NftContext, Written};

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/proxier/nftables/tests/golden")
}

/// Scenarios of this module: an IPv6 single-stack set of services, and ServiceCIDRs.
pub const OWN_SCENARIOS: &[&str] = &[include_str!("scenarios/n1-ipv6.yaml")];

/// The transactions of one scenario, state after state: what the kernel tests load.
pub struct Rendered {
    pub name: String,
    /// Per family with services: the texts in the order a node would run them.
    pub steps: Vec<(crate::model::IpFamily, Vec<String>)>,
    /// Per family: the full text of the last state into a fresh table, and the one a
    /// restarted agent writes over whatever the table holds (no listing).
    pub last_full: Vec<(crate::model::IpFamily, String, String)>,
    pub golden: String,
}

pub fn render(scenario: &Scenario) -> Rendered {
    let mut replay = scenario.replay();
    let mut golden = format!("# Scenario {}: generated nft -f input.\n", scenario.name);
    let mut written: Vec<Written> = (0..replay.families.len())
        .map(|_| Written::default())
        .collect();
    let mut steps: Vec<(crate::model::IpFamily, Vec<String>)> = replay
        .families
        .iter()
        .map(|f| (f.family, Vec::new()))
        .collect();
    let mut last_full = Vec::new();
    let start = Instant::now();
    for (index, objects) in scenario.states.iter().enumerate() {
        let step = replay.apply(objects);
        last_full.clear();
        let now = start + Duration::from_secs(10 * index as u64);
        for ((state, written), (_, texts)) in
            replay.families.iter().zip(&mut written).zip(&mut steps)
        {
            if state.services.is_empty() && written.port_count() == 0 {
                continue;
            }
            let ctx = NftContext::new(&replay.node, state.family, &state.service_cidrs);
            let model = Model {
                services: &state.services,
                endpoints: &state.endpoints,
            };
            let desired = DesiredState::build(model, &ctx);
            if written.is_empty() {
                let (text, _) = written.full(&desired, &ctx, Some(&[]), now);
                let _ = writeln!(
                    golden,
                    "\n## state {index}, {}: first full sync",
                    state.family
                );
                golden.push_str(&elide_slot_maps(&text));
                texts.push(text);
            } else {
                if let Some(deletion) = written.stale_chain_deletion(&ctx, now) {
                    let _ = writeln!(
                        golden,
                        "\n## state {index}, {}: stale chains deleted",
                        state.family
                    );
                    golden.push_str(&deletion);
                    texts.push(deletion);
                }
                let (text, _) = written.partial_from_model(model, &ctx, &step.changed, now);
                let mut changed: Vec<String> = step.changed.iter().map(|s| s.to_string()).collect();
                changed.sort();
                let _ = writeln!(
                    golden,
                    "\n## state {index}, {}: partial sync from state {} (changed: {})",
                    state.family,
                    index - 1,
                    changed.join(", ")
                );
                golden.push_str(&elide_slot_maps(&text));
                texts.push(text);
                let (full, _) = Written::default().full(&desired, &ctx, Some(&[]), now);
                let _ = writeln!(
                    golden,
                    "\n## state {index}, {}: full sync into a fresh table",
                    state.family
                );
                golden.push_str(&elide_slot_maps(&full));
            }
            let (restart, _) = Written::default().full(&desired, &ctx, None, now);
            last_full.push((state.family, desired.cold_load(&ctx), restart));
        }
    }
    // The chains the last partial left stale go too, as they would a second later.
    for ((state, written), (_, texts)) in replay.families.iter().zip(&mut written).zip(&mut steps) {
        let ctx = NftContext::new(&replay.node, state.family, &state.service_cidrs);
        let later = start + Duration::from_secs(10 * scenario.states.len() as u64);
        if let Some(deletion) = written.stale_chain_deletion(&ctx, later) {
            texts.push(deletion);
        }
    }
    steps.retain(|(_, texts)| !texts.is_empty());
    Rendered {
        name: scenario.name.clone(),
        steps,
        last_full,
        golden,
    }
}

/// The text with the declarations and flushes of the slot maps past the first left out
/// (256 alike lines in every full transaction): one comment line says so. Elements stay.
fn elide_slot_maps(text: &str) -> String {
    let first = format!("{ENDPOINT_SLOTS}-tcp-0 ");
    let mut out = String::with_capacity(text.len());
    let mut elided = 0;
    for line in text.lines() {
        let declares = (line.starts_with("add map ") || line.starts_with("flush map "))
            && line.contains(&format!("{ENDPOINT_SLOTS}-"))
            && !line.contains(&first)
            && !line.ends_with(&format!("{ENDPOINT_SLOTS}-tcp-0"));
        if declares {
            elided += 1;
            continue;
        }
        if elided > 0 {
            let _ = writeln!(
                out,
                "# ... and {elided} more {ENDPOINT_SLOTS} maps likewise (tcp, udp, sctp)"
            );
            elided = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    if elided > 0 {
        let _ = writeln!(
            out,
            "# ... and {elided} more {ENDPOINT_SLOTS} maps likewise (tcp, udp, sctp)"
        );
    }
    out
}

pub fn all_scenarios() -> Vec<Scenario> {
    scenario_files()
        .iter()
        .map(|path| Scenario::load(path))
        .chain(OWN_SCENARIOS.iter().map(|text| Scenario::parse(text)))
        .collect()
}

#[test]
fn every_scenario_matches_its_golden_ruleset() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for scenario in all_scenarios() {
        let text = render(&scenario).golden;
        let golden = golden_dir().join(format!("{}.nft", scenario.name));
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
