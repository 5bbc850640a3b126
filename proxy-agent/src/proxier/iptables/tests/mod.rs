// SPDX-License-Identifier: Apache-2.0
//! Tests of the iptables mode without privileges: golden rules for every behaviour
//! scenario, partial syncs against an in-memory iptables, the proxier's flush detection,
//! failure handling and cleanup.

mod golden;
mod metrics;
mod partial;
mod proxier;
pub(crate) mod scenario;
mod upstream_ported;

use std::collections::BTreeMap;

/// Sorts restore input the way upstream's tests compare it (`sortIPTablesRules`): per
/// table, KUBE-NODEPORTS and KUBE-SERVICES first, then the other chains by name; rules
/// grouped by chain in that order, each chain's rules in their original order; chain
/// deletions last. Makes our output comparable line by line with upstream's expected text.
pub fn normalize(input: &str) -> String {
    let mut out = String::new();
    let mut table: Option<TableText> = None;
    for line in input.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some(TableText::new(name));
        } else if line == "COMMIT" {
            if let Some(t) = table.take() {
                t.write(&mut out);
            }
        } else if let Some(t) = table.as_mut() {
            t.add(line);
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

struct TableText {
    name: String,
    chains: Vec<String>,
    rules: BTreeMap<String, Vec<String>>,
    other: Vec<String>,
}

impl TableText {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            chains: Vec::new(),
            rules: BTreeMap::new(),
            other: Vec::new(),
        }
    }

    fn add(&mut self, line: &str) {
        if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split(' ').next().unwrap_or_default().to_string();
            if !self.chains.contains(&chain) {
                self.chains.push(chain);
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split(' ').next().unwrap_or_default().to_string();
            self.rules.entry(chain).or_default().push(line.to_string());
        } else {
            self.other.push(line.to_string());
        }
    }

    fn write(mut self, out: &mut String) {
        let rank = |c: &String| match c.as_str() {
            "KUBE-NODEPORTS" => (0, c.clone()),
            "KUBE-SERVICES" => (1, c.clone()),
            _ => (2, c.clone()),
        };
        self.chains.sort_by_key(rank);
        out.push_str(&format!("*{}\n", self.name));
        for chain in &self.chains {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for chain in &self.chains {
            for rule in self.rules.remove(chain).unwrap_or_default() {
                out.push_str(&rule);
                out.push('\n');
            }
        }
        // Rules of chains not declared here (built-in chains, unchanged service chains).
        for rules in self.rules.into_values() {
            for rule in rules {
                out.push_str(&rule);
                out.push('\n');
            }
        }
        for line in self.other {
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
}
