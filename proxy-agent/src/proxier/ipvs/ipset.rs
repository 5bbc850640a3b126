// SPDX-License-Identifier: Apache-2.0
//! ipsets through the `ipset` binary: what the kernel has comes from `ipset save`
//! (parsed), what changes goes to `ipset -exist restore` on stdin as one batch. The batch
//! is generated purely from typed entries ([`SetEntry`]) and set kinds, never from text
//! that came from the API.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::sets::{SetEntry, SetKind};
use crate::{
    model::IpFamily,
    proxier::netfilter::{ExecError, exec::run_program},
};

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct IpsetError(#[from] ExecError);

impl IpsetError {
    /// The ipset binary could not be started (it is not installed).
    pub fn not_installed(&self) -> bool {
        matches!(self.0, ExecError::Spawn { .. })
    }

    /// ipset ran and failed (e.g. no ip_set in the kernel), rather than printing
    /// something unexpected.
    pub fn failed(&self) -> bool {
        matches!(self.0, ExecError::Failed { .. })
    }
}

/// The sets `ipset save` listed: name -> (type, entries as printed).
pub type SavedSets = BTreeMap<String, (String, BTreeSet<String>)>;

/// Parses `ipset save` output.
pub fn parse_save(text: &str) -> SavedSets {
    let mut sets = SavedSets::new();
    for line in text.lines() {
        let mut words = line.split_ascii_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), Some(set_type)) => {
                sets.insert(name.to_string(), (set_type.to_string(), BTreeSet::new()));
            }
            (Some("add"), Some(name), Some(entry)) => {
                if let Some((_, entries)) = sets.get_mut(name) {
                    entries.insert(entry.to_string());
                }
            }
            _ => {}
        }
    }
    sets
}

/// What a restore batch changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetChanges {
    pub input: String,
    pub created: usize,
    pub added: usize,
    pub deleted: usize,
}

/// The restore batch that makes `family`'s sets hold exactly `desired`: missing sets are
/// created, missing entries added, stale ones deleted. A set of ours with another type
/// (left by an older version) is destroyed and created again.
pub fn diff(
    family: IpFamily,
    desired: &BTreeMap<SetKind, BTreeSet<SetEntry>>,
    actual: &SavedSets,
) -> SetChanges {
    let mut changes = SetChanges::default();
    for (&kind, entries) in desired {
        let name = kind.name(family);
        let set_type = kind.set_type().as_str();
        let current = match actual.get(&name) {
            Some((t, current)) if t == set_type => Some(current),
            Some(_) => {
                let _ = writeln!(changes.input, "destroy {name}");
                None
            }
            None => None,
        };
        if current.is_none() {
            let _ = writeln!(
                changes.input,
                "create {name} {set_type} {}",
                kind.create_options(family)
            );
            changes.created += 1;
        }
        let wanted: BTreeSet<String> = entries.iter().map(SetEntry::to_string).collect();
        if let Some(current) = current {
            for stale in current.difference(&wanted) {
                let _ = writeln!(changes.input, "del {name} {stale}");
                changes.deleted += 1;
            }
        }
        for entry in &wanted {
            if current.is_none_or(|c| !c.contains(entry)) {
                let _ = writeln!(changes.input, "add {name} {entry}");
                changes.added += 1;
            }
        }
    }
    changes
}

/// The names of our sets (both families) among `actual`.
pub fn our_sets(actual: &SavedSets) -> Vec<String> {
    actual
        .keys()
        .filter(|name| {
            SetKind::from_name(name, IpFamily::V4).is_some()
                || SetKind::from_name(name, IpFamily::V6).is_some()
        })
        .cloned()
        .collect()
}

/// The `ipset` binary.
pub trait IpsetBackend: Send {
    fn save(&mut self) -> Result<String, IpsetError>;
    fn restore(&mut self, input: &str) -> Result<(), IpsetError>;
}

#[derive(Debug, Default)]
pub struct IpsetCommand;

impl IpsetCommand {
    /// ipset works: the binary exists and talks to the kernel (`ipset list -n`, which
    /// loads ip_set when needed).
    pub fn probe() -> Result<String, IpsetError> {
        run(&["list", "-n"], None)
    }
}

impl IpsetBackend for IpsetCommand {
    fn save(&mut self) -> Result<String, IpsetError> {
        run(&["save"], None)
    }

    fn restore(&mut self, input: &str) -> Result<(), IpsetError> {
        if input.is_empty() {
            return Ok(());
        }
        run(&["-exist", "restore"], Some(input)).map(drop)
    }
}

/// Runs the `ipset` binary (the netfilter layer's runner: same errors as iptables').
fn run(args: &[&str], stdin: Option<&str>) -> Result<String, IpsetError> {
    Ok(run_program("ipset", args, stdin)?)
}
