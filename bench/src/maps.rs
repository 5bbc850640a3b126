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

/// Polls the pinned service map until it holds exactly `expected` frontends.
pub fn wait_frontends(
    agent: &BenchAgent,
    bpffs: &Path,
    expected: u32,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        signals::check()?;
        let seen = frontends_in(bpffs);
        match &seen {
            Ok(n) if *n == expected as usize => return Ok(()),
            _ if Instant::now() >= deadline => {
                let seen = match seen {
                    Ok(n) => n.to_string(),
                    Err(err) => err.to_string(),
                };
                return Err(agent.failure(format!(
                    "the service map holds {seen} frontends, not {expected}, after {timeout:?}"
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
