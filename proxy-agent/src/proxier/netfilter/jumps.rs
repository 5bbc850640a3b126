// SPDX-License-Identifier: Apache-2.0
//! The rules that hook a mode's chains into the built-in chains: how one is written, how
//! it is recognised in `iptables -S` / `iptables-save` output, and inserting the missing
//! ones. The iptables and ipvs modes each list their own (`JUMPS` in their folders); the
//! full sync, the flush check and the cleanup share this code.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::exec::{ExecError, IptablesBackend};
use super::save::{self, Line, Op};
use super::table::Table;
use crate::model::IpFamily;

/// One rule in a built-in chain that jumps to one of our chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jump {
    pub table: Table,
    pub from: &'static str,
    pub to: &'static str,
    /// Empty: no comment match.
    pub comment: &'static str,
    pub extra: &'static str,
}

impl Jump {
    /// The rule as iptables-restore input, without the leading `-A/-I CHAIN`.
    pub fn write_spec(&self, out: &mut String) {
        if !self.extra.is_empty() {
            out.push_str(self.extra);
            out.push(' ');
        }
        if !self.comment.is_empty() {
            out.push_str("-m comment --comment \"");
            out.push_str(self.comment);
            out.push_str("\" ");
        }
        out.push_str("-j ");
        out.push_str(self.to);
    }

    /// Whether a line of `iptables -S` / `iptables-save` output is this jump. The target
    /// and, when there is one, the comment identify it: iptables reorders and respells
    /// matches, so the rest of the text is not compared.
    pub fn matches(&self, line: &str) -> bool {
        let Line::Command(rule) = save::parse_line(line) else {
            return false;
        };
        rule.op == Op::Append
            && rule.chain == self.from
            && rule.target().is_some_and(|target| target == self.to)
            && (self.comment.is_empty() || rule.has_comment(self.comment))
    }
}

/// Writes `-I` lines for the jumps of `jumps` that the kernel's built-in chains lack into
/// `nat` and `filter` (restore input lines). Returns how many were missing. `saved`: a
/// table as this sync already saved it, read instead of listing its chains again.
pub fn write_missing_jumps<'j>(
    backend: &mut dyn IptablesBackend,
    family: IpFamily,
    jumps: impl IntoIterator<Item = &'j Jump>,
    saved: Option<(Table, &str)>,
    nat: &mut String,
    filter: &mut String,
) -> Result<usize, ExecError> {
    let mut listed: HashMap<(Table, &str), String> = HashMap::new();
    let mut added = 0;
    for jump in jumps {
        let listing = match listed.entry((jump.table, jump.from)) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(match saved {
                // The table was just saved: its rules are there, no command needed.
                Some((table, text)) if table == jump.table => rules_of(text, jump.from),
                _ => backend
                    .list_chain(family, jump.table, jump.from)?
                    .unwrap_or_default(),
            }),
        };
        if listing.lines().any(|line| jump.matches(line)) {
            continue;
        }
        let rules = match jump.table {
            Table::Nat => &mut *nat,
            _ => &mut *filter,
        };
        let _ = write!(rules, "-I {} ", jump.from);
        jump.write_spec(rules);
        rules.push('\n');
        added += 1;
    }
    Ok(added)
}

/// The `-A <chain> ...` lines of `chain` in `iptables-save` output, as `iptables -S <chain>`
/// lists them.
fn rules_of(saved: &str, chain: &str) -> String {
    let mut out = String::new();
    for rule in save::appended_rules(saved).filter(|rule| rule.chain == chain) {
        let _ = writeln!(out, "-A {} {}", rule.chain, rule.spec);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORTALS: Jump = Jump {
        table: Table::Filter,
        from: "INPUT",
        to: "KUBE-EXTERNAL-SERVICES",
        comment: "kubernetes externally-visible service portals",
        extra: "-m conntrack --ctstate NEW",
    };

    #[test]
    fn specs_and_matching() {
        let mut spec = String::new();
        PORTALS.write_spec(&mut spec);
        assert_eq!(
            spec,
            "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
        );
        let saved = format!("-A INPUT {spec}");
        assert!(PORTALS.matches(&saved));
        let forward = Jump {
            from: "FORWARD",
            ..PORTALS
        };
        assert!(!forward.matches(&saved), "other built-in chain");
        let other = Jump {
            to: "KUBE-NODEPORTS",
            ..PORTALS
        };
        assert!(!other.matches(&saved), "other target");
        assert!(!PORTALS.matches("-A INPUTX -j KUBE-EXTERNAL-SERVICES"));
        assert!(
            !PORTALS.matches("-A INPUT -m comment --comment \"other\" -j KUBE-EXTERNAL-SERVICES"),
            "other comment"
        );
        let bare = Jump {
            comment: "",
            extra: "",
            ..PORTALS
        };
        assert!(bare.matches("-A INPUT -j KUBE-EXTERNAL-SERVICES"));
    }

    #[test]
    fn a_saved_table_answers_for_its_chains() {
        let saved = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n-A FORWARD -j ACCEPT\nCOMMIT\n";
        assert_eq!(
            rules_of(saved, "INPUT"),
            "-A INPUT -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n"
        );
    }
}
