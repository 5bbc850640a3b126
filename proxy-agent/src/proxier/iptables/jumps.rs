// SPDX-License-Identifier: Apache-2.0
//! The rules that hook this mode's chains into the built-in chains, shared by the full
//! sync (which inserts the missing ones), the flush check and the cleanup.

use std::collections::HashMap;
use std::fmt;
use std::fmt::Write as _;

use super::exec::{ExecError, IptablesBackend};
use crate::model::IpFamily;

use super::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};

/// The iptables tables this mode uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Filter,
    Nat,
    Mangle,
}

impl Table {
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Nat => "nat",
            Table::Mangle => "mangle",
        }
    }

    /// The chains the kernel creates in this table.
    pub fn builtin_chains(self) -> &'static [&'static str] {
        match self {
            Table::Filter => &["INPUT", "FORWARD", "OUTPUT"],
            Table::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            Table::Mangle => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

const NEW: &str = "-m conntrack --ctstate NEW";

/// Upstream's jump rules, in upstream's order; each is inserted at the top of its built-in
/// chain, so the last one of a chain ends up first.
pub const JUMPS: &[Jump] = &[
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_EXTERNAL_SERVICES,
        comment: "kubernetes externally-visible service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_EXTERNAL_SERVICES,
        comment: "kubernetes externally-visible service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_NODEPORTS,
        comment: "kubernetes health check service ports",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_FORWARD,
        comment: "kubernetes forwarding rules",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_PROXY_FIREWALL,
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_PROXY_FIREWALL,
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_PROXY_FIREWALL,
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: Table::Nat,
        from: "OUTPUT",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: "",
    },
    Jump {
        table: Table::Nat,
        from: "PREROUTING",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: "",
    },
    Jump {
        table: Table::Nat,
        from: "POSTROUTING",
        to: KUBE_POSTROUTING,
        comment: "kubernetes postrouting rules",
        extra: "",
    },
];

/// The localnet protection chain's hooks (as kubelet installs them: no comment). Only
/// installed while localhost NodePorts are enabled, when the chain has a rule.
pub const LOCALNET_JUMPS: &[Jump] = &[
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_FIREWALL,
        comment: "",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_FIREWALL,
        comment: "",
        extra: "",
    },
];

/// The jumps whose absence shows that someone flushed the rules of a table (the canary
/// chain only shows that chains were deleted).
pub const FLUSH_WITNESSES: &[Jump] = &[JUMPS[10], JUMPS[5]];

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
        let Some(rest) = line
            .strip_prefix("-A ")
            .and_then(|l| l.strip_prefix(self.from))
        else {
            return false;
        };
        if !rest.starts_with(' ') || jump_target(rest) != Some(self.to) {
            return false;
        }
        self.comment.is_empty() || rest.contains(self.comment)
    }
}

/// Writes `-I` lines for the jumps of `jumps` that the kernel's built-in chains lack into
/// `nat` and `filter` (restore input lines). Returns how many were missing.
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
    let prefix = format!("-A {chain} ");
    let mut out = String::new();
    for line in saved.lines().filter(|l| l.starts_with(&prefix)) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The `-j` target of a saved rule.
pub fn jump_target(rule: &str) -> Option<&str> {
    let mut words = rule.split_ascii_whitespace();
    while let Some(word) = words.next() {
        if word == "-j" || word == "--jump" {
            return words.next();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_matching() {
        let mut spec = String::new();
        JUMPS[0].write_spec(&mut spec);
        assert_eq!(
            spec,
            "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
        );
        let saved = "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES";
        assert!(JUMPS[0].matches(saved));
        assert!(!JUMPS[1].matches(saved), "other built-in chain");
        assert!(!JUMPS[2].matches(saved), "other target");
        assert!(!JUMPS[0].matches("-A INPUTX -j KUBE-EXTERNAL-SERVICES"));
        assert!(LOCALNET_JUMPS[0].matches("-A INPUT -j KUBE-FIREWALL"));
        assert_eq!(FLUSH_WITNESSES[0].from, "PREROUTING");
        assert_eq!(FLUSH_WITNESSES[1].to, KUBE_FORWARD);
    }
}
