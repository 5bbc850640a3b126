// SPDX-License-Identifier: Apache-2.0
//! An in-memory iptables for unit tests. It applies restore input the way iptables-restore
//! `--noflush` does (a chain line creates or flushes a chain, `-A`/`-I`/`-D`/`-X` edit,
//! every table is committed atomically or not at all) and refuses what the kernel refuses:
//! rules in missing chains, jumps to missing chains, deleting a chain that is not empty
//! or still referenced. So a generation that would fail against the kernel fails here.

use std::collections::{BTreeMap, HashMap};

use crate::model::IpFamily;
use crate::proxier::netfilter::exec::failed_line;
use crate::proxier::netfilter::save::{self, Line, Op, jump_target};
use crate::proxier::netfilter::{ExecError, IptablesBackend, Table};

/// Targets that are not chains.
const BUILTIN_TARGETS: &[&str] = &[
    "ACCEPT",
    "DROP",
    "REJECT",
    "RETURN",
    "MARK",
    "MASQUERADE",
    "DNAT",
    "SNAT",
];

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableState {
    /// Chain -> rules (the text after `-A CHAIN `).
    pub chains: BTreeMap<String, Vec<String>>,
}

impl TableState {
    fn new(table: Table) -> Self {
        Self {
            chains: table
                .builtin_chains()
                .iter()
                .map(|c| (c.to_string(), Vec::new()))
                .collect(),
        }
    }

    fn referenced(&self, chain: &str) -> bool {
        self.chains
            .values()
            .flatten()
            .any(|rule| jump_target(rule).is_some_and(|target| target == chain))
    }
}

#[derive(Debug, Default)]
pub struct FakeIptables {
    pub tables: HashMap<(IpFamily, Table), TableState>,
    /// Every restore input received, in order (also the failed ones).
    pub restores: Vec<(IpFamily, String)>,
    /// Makes the next restore fail, as a kernel error would.
    pub fail_next_restore: bool,
    pub calls: Vec<String>,
}

impl FakeIptables {
    pub fn table(&mut self, family: IpFamily, table: Table) -> &mut TableState {
        self.tables
            .entry((family, table))
            .or_insert_with(|| TableState::new(table))
    }

    pub fn chain(&self, family: IpFamily, table: Table, chain: &str) -> Option<&Vec<String>> {
        self.tables.get(&(family, table))?.chains.get(chain)
    }

    /// `iptables -t table -F`: every chain emptied, none deleted.
    pub fn flush(&mut self, family: IpFamily, table: Table) {
        for rules in self.table(family, table).chains.values_mut() {
            rules.clear();
        }
    }

    /// `iptables -t table -F; iptables -t table -X`: back to the built-in chains, empty.
    pub fn wipe(&mut self, family: IpFamily, table: Table) {
        self.tables.insert((family, table), TableState::new(table));
    }

    fn apply(&mut self, family: IpFamily, input: &str) -> Result<(), String> {
        let mut staged: Vec<(Table, TableState)> = Vec::new();
        let mut current: Option<(Table, TableState)> = None;
        for (index, raw) in input.lines().enumerate() {
            let line = raw.trim();
            let fail = |why: &str| format!("line {} failed: {why}: {line}", index + 1);
            let command = match save::parse_line(line) {
                Line::Blank | Line::Comment(_) => continue,
                Line::Table(name) => {
                    let table = Table::from_name(name).ok_or_else(|| fail("unknown table"))?;
                    let state = self.table(family, table).clone();
                    current = Some((table, state));
                    continue;
                }
                Line::Commit => {
                    staged.push(
                        current
                            .take()
                            .ok_or_else(|| fail("COMMIT outside a table"))?,
                    );
                    continue;
                }
                Line::Chain(decl) => {
                    let (table, state) = current.as_mut().ok_or_else(|| fail("no table"))?;
                    if table.builtin_chains().contains(&decl.name) {
                        return Err(fail("declaring a built-in chain flushes it; not expected"));
                    }
                    state.chains.insert(decl.name.to_string(), Vec::new());
                    continue;
                }
                Line::Command(command) => command,
                Line::Unknown(_) => {
                    current.as_mut().ok_or_else(|| fail("no table"))?;
                    return Err(fail("unknown command"));
                }
            };
            let (_, state) = current.as_mut().ok_or_else(|| fail("no table"))?;
            let (chain, rest) = (command.chain, command.spec);
            match command.op {
                Op::Append | Op::Insert => {
                    if let Some(target) = jump_target(rest)
                        && !BUILTIN_TARGETS.contains(&target.as_ref())
                        && !state.chains.contains_key(target.as_ref())
                    {
                        return Err(fail("jump to a missing chain"));
                    }
                    let rules = state
                        .chains
                        .get_mut(chain)
                        .ok_or_else(|| fail("no such chain"))?;
                    if command.op == Op::Append {
                        rules.push(rest.to_string());
                    } else {
                        rules.insert(0, rest.to_string());
                    }
                }
                Op::Delete => {
                    let rules = state
                        .chains
                        .get_mut(chain)
                        .ok_or_else(|| fail("no such chain"))?;
                    let at = rules
                        .iter()
                        .position(|r| r == rest)
                        .ok_or_else(|| fail("no such rule"))?;
                    rules.remove(at);
                }
                Op::DeleteChain => {
                    match state.chains.get(chain) {
                        None => return Err(fail("no such chain")),
                        Some(rules) if !rules.is_empty() => return Err(fail("chain not empty")),
                        Some(_) => {}
                    }
                    if state.referenced(chain) {
                        return Err(fail("chain still referenced"));
                    }
                    state.chains.remove(chain);
                }
                Op::NewChain | Op::Flush | Op::Policy => return Err(fail("unknown command")),
            }
        }
        if current.is_some() {
            return Err("missing COMMIT".into());
        }
        for (table, state) in staged {
            self.tables.insert((family, table), state);
        }
        Ok(())
    }
}

fn failed(program: &str, stderr: String) -> ExecError {
    ExecError::Failed {
        program: program.into(),
        status: "exit status: 1".into(),
        line: failed_line(&stderr),
        stderr,
    }
}

impl IptablesBackend for FakeIptables {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        self.calls.push(format!("restore {family}"));
        self.restores.push((family, input.to_string()));
        if std::mem::take(&mut self.fail_next_restore) {
            return Err(failed("iptables-restore", "injected failure".into()));
        }
        self.apply(family, input)
            .map_err(|e| failed("iptables-restore", e))
    }

    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        self.calls.push(format!("save {family} {table}"));
        let state = self.table(family, table).clone();
        let mut out = format!("*{table}\n");
        for chain in state.chains.keys() {
            let policy = if table.builtin_chains().contains(&chain.as_str()) {
                "ACCEPT"
            } else {
                "-"
            };
            out.push_str(&format!(":{chain} {policy} [0:0]\n"));
        }
        for (chain, rules) in &state.chains {
            for rule in rules {
                out.push_str(&format!("-A {chain} {rule}\n"));
            }
        }
        out.push_str("COMMIT\n");
        Ok(out)
    }

    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        self.calls.push(format!("list {family} {table} {chain}"));
        let builtin = table.builtin_chains().contains(&chain);
        let Some(rules) = self.table(family, table).chains.get(chain) else {
            return Ok(None);
        };
        let mut out = if builtin {
            format!("-P {chain} ACCEPT\n")
        } else {
            format!("-N {chain}\n")
        };
        for rule in rules {
            out.push_str(&format!("-A {chain} {rule}\n"));
        }
        Ok(Some(out))
    }
}

/// A [`FakeIptables`] the test keeps a handle on while a proxier owns the backend.
#[derive(Clone, Debug, Default)]
pub struct SharedFake(pub std::sync::Arc<std::sync::Mutex<FakeIptables>>);

impl SharedFake {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, FakeIptables> {
        self.0.lock().unwrap()
    }
}

impl IptablesBackend for SharedFake {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        self.lock().restore(family, input)
    }

    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        self.lock().save(family, table)
    }

    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        self.lock().list_chain(family, table, chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_is_atomic_and_checks_references() {
        let mut fake = FakeIptables::default();
        let ok = "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\n-I PREROUTING -j KUBE-A\nCOMMIT\n";
        fake.restore(IpFamily::V4, ok).unwrap();
        assert_eq!(
            fake.chain(IpFamily::V4, Table::Nat, "PREROUTING").unwrap(),
            &vec!["-j KUBE-A".to_string()]
        );
        let bad = "*nat\n:KUBE-C - [0:0]\n-A KUBE-C -j KUBE-MISSING\nCOMMIT\n";
        let err = fake.restore(IpFamily::V4, bad).unwrap_err().to_string();
        assert!(err.contains("line 3 failed"), "{err}");
        assert!(fake.chain(IpFamily::V4, Table::Nat, "KUBE-C").is_none());
        let referenced = "*nat\n-X KUBE-B\nCOMMIT\n";
        assert!(fake.restore(IpFamily::V4, referenced).is_err());
        let flush_then_delete = "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n";
        fake.restore(IpFamily::V4, flush_then_delete).unwrap();
        assert!(fake.chain(IpFamily::V4, Table::Nat, "KUBE-B").is_none());
        assert!(
            fake.save(IpFamily::V4, Table::Nat)
                .unwrap()
                .contains(":KUBE-A - [0:0]")
        );
        assert_eq!(
            fake.list_chain(IpFamily::V4, Table::Nat, "PREROUTING")
                .unwrap()
                .unwrap(),
            "-P PREROUTING ACCEPT\n-A PREROUTING -j KUBE-A\n"
        );
    }
}
