// SPDX-License-Identifier: Apache-2.0
//! BPF run-time statistics of the agent's programs: enabling them for the run only, finding
//! the run's programs (those behind the links pinned under its bpffs root) and reading
//! their run counts and run times from `bpftool -j prog show` (the parsing is pure).

use std::{
    collections::BTreeMap,
    fs,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use super::super::error::{Error, Result};

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Run-time statistics switched on while this lives. Preferably by `BPF_ENABLE_STATS`,
/// whose fd switches them off when closed (also when the process dies, so a crash cannot
/// leave every program on the machine paying for them); else by the sysctl, put back to
/// its old value on drop (the benchmark turns signals into an unwinding error).
#[derive(Debug)]
pub struct StatsGuard {
    _fd: Option<OwnedFd>,
    restore: Option<String>,
    pub how: &'static str,
}

impl StatsGuard {
    pub fn enable() -> Result<Self> {
        match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Ok(StatsGuard {
                _fd: Some(fd),
                restore: None,
                how: "BPF_ENABLE_STATS",
            }),
            Err(err) => {
                eprintln!("==> BPF_ENABLE_STATS failed ({err}); using {SYSCTL}");
                let old =
                    fs::read_to_string(SYSCTL).map_err(Error::io(format!("reading {SYSCTL}")))?;
                fs::write(SYSCTL, "1").map_err(Error::io(format!("writing {SYSCTL}")))?;
                Ok(StatsGuard {
                    _fd: None,
                    restore: Some(old.trim().to_string()),
                    how: "sysctl",
                })
            }
        }
    }
}

impl Drop for StatsGuard {
    fn drop(&mut self) {
        if let Some(old) = &self.restore
            && let Err(err) = fs::write(SYSCTL, old)
        {
            eprintln!("cleanup: restoring {SYSCTL} to {old}: {err}");
        }
    }
}

/// Cumulative counters of one program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgStats {
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// The programs of interest by id: name and counters, from `bpftool -j prog show`.
/// bpftool omits the counters while they are zero.
pub fn parse_progs(json: &str, ids: &[u32]) -> Result<BTreeMap<u32, (String, ProgStats)>> {
    let all: Vec<Value> = serde_json::from_str(json)?;
    let mut out = BTreeMap::new();
    for prog in &all {
        let Some(id) = prog
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
        else {
            continue;
        };
        if !ids.contains(&id) {
            continue;
        }
        let name = prog
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("unnamed")
            .to_string();
        let field = |f: &str| prog.get(f).and_then(Value::as_u64).unwrap_or(0);
        out.insert(
            id,
            (
                name,
                ProgStats {
                    run_cnt: field("run_cnt"),
                    run_time_ns: field("run_time_ns"),
                },
            ),
        );
    }
    Ok(out)
}

/// The program id of a link, from `bpftool -j link show pinned`.
pub fn parse_link_prog(json: &str) -> Result<Option<u32>> {
    let link: Value = serde_json::from_str(json)?;
    Ok(link
        .get("prog_id")
        .and_then(Value::as_u64)
        .and_then(|i| u32::try_from(i).ok()))
}

fn bpftool(args: &[&str], path: Option<&Path>) -> Result<String> {
    let mut cmd = Command::new("bpftool");
    cmd.arg("-j").args(args);
    if let Some(path) = path {
        cmd.arg(path);
    }
    let out = cmd.output().map_err(Error::io("running bpftool"))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "bpftool {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The files under `dir`, recursively (pins may sit in subdirectories).
fn pins_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => todo.push(path),
                Ok(_) => out.push(path),
                Err(_) => {}
            }
        }
    }
    out.sort();
    out
}

/// The ids of the programs attached by this run's agent: those of the links it pinned
/// under its bpffs root (no other program on the machine is counted).
pub fn run_program_ids(bpffs_root: &Path) -> Result<Vec<u32>> {
    let links = proxy_agent::proxier::ebpf::links_dir(bpffs_root);
    let mut ids = Vec::new();
    for pin in pins_under(&links) {
        if let Some(id) = parse_link_prog(&bpftool(&["link", "show", "pinned"], Some(&pin))?)?
            && !ids.contains(&id)
        {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err(Error::Setup(format!(
            "no pinned links under {}",
            links.display()
        )));
    }
    Ok(ids)
}

/// The counters of programs `ids` right now.
pub fn snapshot(ids: &[u32]) -> Result<BTreeMap<u32, (String, ProgStats)>> {
    parse_progs(&bpftool(&["prog", "show"], None)?, ids)
}

/// Per program name (programs of the same name summed): calls and run time between two
/// snapshots.
pub fn delta(
    before: &BTreeMap<u32, (String, ProgStats)>,
    after: &BTreeMap<u32, (String, ProgStats)>,
) -> BTreeMap<String, ProgStats> {
    let mut out: BTreeMap<String, ProgStats> = BTreeMap::new();
    for (id, (name, a)) in after {
        let b = before.get(id).map(|(_, s)| *s).unwrap_or_default();
        let sum = out.entry(name.clone()).or_default();
        sum.run_cnt += a.run_cnt.saturating_sub(b.run_cnt);
        sum.run_time_ns += a.run_time_ns.saturating_sub(b.run_time_ns);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_programs_of_interest_and_their_deltas() {
        let before = r#"[
          {"id": 7, "type": "cgroup_sock_addr", "name": "sock_connect4", "run_time_ns": 1000, "run_cnt": 10},
          {"id": 8, "type": "cgroup_sock_addr", "name": "sock_getpeername4"},
          {"id": 9, "type": "sched_cls", "name": "other_prog", "run_time_ns": 5, "run_cnt": 1}
        ]"#;
        let after = r#"[
          {"id": 7, "type": "cgroup_sock_addr", "name": "sock_connect4", "run_time_ns": 4000, "run_cnt": 30},
          {"id": 8, "type": "cgroup_sock_addr", "name": "sock_getpeername4"},
          {"id": 9, "type": "sched_cls", "name": "other_prog", "run_time_ns": 50, "run_cnt": 2}
        ]"#;
        let (b, a) = (
            parse_progs(before, &[7, 8]).unwrap(),
            parse_progs(after, &[7, 8]).unwrap(),
        );
        assert_eq!(a.len(), 2);
        let d = delta(&b, &a);
        assert_eq!(
            d["sock_connect4"],
            ProgStats {
                run_cnt: 20,
                run_time_ns: 3000
            }
        );
        assert_eq!(d["sock_getpeername4"], ProgStats::default());
        assert!(!d.contains_key("other_prog"));
        assert!(parse_progs("{}", &[1]).is_err());
    }

    #[test]
    fn a_link_names_its_program() {
        let link = r#"{"id": 3, "type": "cgroup", "prog_id": 42, "cgroup_id": 9, "attach_type": "cgroup_inet4_connect"}"#;
        assert_eq!(parse_link_prog(link).unwrap(), Some(42));
        assert_eq!(parse_link_prog(r#"{"id": 3}"#).unwrap(), None);
    }
}
