// SPDX-License-Identifier: Apache-2.0
//! The iptables tables the iptables and ipvs modes write to, with their built-in chains.

use std::fmt;

/// The iptables tables these modes use.
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

    /// The table a `*name` line names; `None` for tables these modes never touch.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "filter" => Some(Table::Filter),
            "nat" => Some(Table::Nat),
            "mangle" => Some(Table::Mangle),
            _ => None,
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
