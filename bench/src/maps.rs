// SPDX-License-Identifier: Apache-2.0
//! How many service frontends the agent's IPv4 service map holds, read with
//! `bpftool -j map dump pinned`: proof that the maps really carry the services the
//! benchmark claims, not only that the agent says it synced.

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use ::tests::scenario::agent::service_map_pin;
use serde_json::Value;

use super::{
    agent::BenchAgent,
    error::{Error, Result},
    signals,
};

/// Counts frontends with at least one backend in bpftool's JSON dump of the service map:
/// entries of slot 0 (which holds a frontend's backend count and flags) with a port (the
/// VIP-wide entries have port 0) and a non-zero count. bpftool prints BTF-formatted
/// entries under `formatted` (next to the raw bytes), or directly.
pub fn count_frontends(dump: &str) -> Result<usize> {
    let entries: Vec<Value> = serde_json::from_str(dump)?;
    let mut frontends = 0;
    for entry in &entries {
        let named = |part: &str| {
            entry
                .get("formatted")
                .and_then(|f| f.get(part))
                .or_else(|| entry.get(part))
                .filter(|v| v.is_object())
                .ok_or_else(|| {
                    Error::Setup(format!(
                        "the service map dump has no field names (no BTF?): {entry}"
                    ))
                })
        };
        let (key, value) = (named("key")?, named("value")?);
        let field = |v: &Value, name: &str| v.get(name).and_then(Value::as_u64);
        if field(key, "slot") == Some(0)
            && field(key, "dport").is_some_and(|p| p != 0)
            && field(value, "count").is_some_and(|c| c > 0)
        {
            frontends += 1;
        }
    }
    Ok(frontends)
}

/// Frontends in the pinned service map right now.
pub fn frontends_in(bpffs_root: &Path) -> Result<usize> {
    let pin = service_map_pin(bpffs_root);
    let output = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&pin)
        .output()
        .map_err(Error::io("running bpftool"))?;
    if !output.status.success() {
        return Err(Error::Setup(format!(
            "bpftool map dump pinned {}: {}",
            pin.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    count_frontends(&String::from_utf8_lossy(&output.stdout))
}

/// How long a count of programmed services may stay the same, short of what was asked,
/// before a wait gives up: the agent syncs 100,000 services in seconds, so a count that
/// stopped moving means it will not get there (e.g. a map or id space it reports full).
pub const STALL: Duration = Duration::from_secs(30);

/// Whether a polled count has stopped moving short of its goal.
#[derive(Debug)]
pub struct Stall {
    last: Option<usize>,
    since: Instant,
    limit: Duration,
}

impl Stall {
    pub fn new(limit: Duration) -> Self {
        Stall {
            last: None,
            since: Instant::now(),
            limit,
        }
    }

    /// Notes `seen`; true once it has been the same, and not `expected`, for the limit.
    pub fn stalled(&mut self, seen: usize, expected: usize) -> bool {
        if self.last != Some(seen) {
            self.last = Some(seen);
            self.since = Instant::now();
            return false;
        }
        seen != expected && self.since.elapsed() >= self.limit
    }
}

/// Polls the pinned service map until it holds exactly `expected` frontends; fails at
/// `timeout`, or earlier once the count stopped moving for [`STALL`].
pub fn wait_frontends(
    agent: &BenchAgent,
    bpffs: &Path,
    expected: u32,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut stall = Stall::new(STALL);
    loop {
        signals::check()?;
        let seen = frontends_in(bpffs);
        let stalled = matches!(&seen, Ok(n) if stall.stalled(*n, expected as usize));
        match &seen {
            Ok(n) if *n == expected as usize => return Ok(()),
            _ if Instant::now() >= deadline || stalled => {
                let seen = match seen {
                    Ok(n) => n.to_string(),
                    Err(err) => err.to_string(),
                };
                let how = if stalled {
                    format!("stopped moving for {STALL:?}")
                } else {
                    format!("after {timeout:?}")
                };
                return Err(agent.failure(format!(
                    "the service map holds {seen} frontends, not {expected}: {how}"
                )));
            }
            _ => thread::sleep(Duration::from_millis(250)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_stalls_only_short_of_its_goal_and_after_the_limit() {
        let mut stall = Stall::new(Duration::ZERO);
        assert!(!stall.stalled(5, 10), "a first reading is progress");
        assert!(stall.stalled(5, 10));
        assert!(!stall.stalled(6, 10));
        assert!(!stall.stalled(10, 10));
        assert!(!stall.stalled(10, 10), "at the goal it never stalls");
        let mut patient = Stall::new(Duration::from_secs(60));
        patient.stalled(5, 10);
        assert!(!patient.stalled(5, 10));
    }

    #[test]
    fn counts_slot_zero_entries_with_a_port_and_backends() {
        // As bpftool prints with BTF: raw bytes, then the named fields under `formatted`.
        let formatted = r#"[
          {"key": ["0x0a"], "value": ["0x01"],
           "formatted": {"key": {"addr": 167772170, "dport": 20480, "slot": 0, "proto": 6, "scope": 0, "_pad": [0, 0]},
                         "value": {"backend_id": 0, "count": 1, "rev_nat_id": 1, "flags": 1, "_pad": 0}}},
          {"key": ["0x0a"], "value": ["0x01"],
           "formatted": {"key": {"addr": 167772170, "dport": 20480, "slot": 1, "proto": 6, "scope": 0},
                         "value": {"backend_id": 1, "count": 0}}},
          {"key": ["0x0a"], "value": ["0x01"],
           "formatted": {"key": {"addr": 167772170, "dport": 0, "slot": 0, "proto": 0, "scope": 0},
                         "value": {"count": 0, "flags": 2}}},
          {"key": ["0x0a"], "value": ["0x01"],
           "formatted": {"key": {"addr": 167772171, "dport": 20480, "slot": 0, "proto": 6, "scope": 0},
                         "value": {"count": 0, "flags": 1}}}
        ]"#;
        assert_eq!(count_frontends(formatted).unwrap(), 1);
        let direct = r#"[
          {"key": {"addr": 1, "dport": 80, "slot": 0}, "value": {"count": 2}},
          {"key": {"addr": 2, "dport": 80, "slot": 0}, "value": {"count": 1}},
          {"key": {"addr": 2, "dport": 80, "slot": 1}, "value": {"count": 0}}
        ]"#;
        assert_eq!(count_frontends(direct).unwrap(), 2);
        assert_eq!(count_frontends("[]").unwrap(), 0);
    }

    #[test]
    fn a_dump_without_field_names_is_an_error() {
        let raw = r#"[{"key": ["0x0a", "0x00"], "value": ["0x01"]}]"#;
        assert!(count_frontends(raw).is_err());
        assert!(count_frontends("not json").is_err());
    }
}
