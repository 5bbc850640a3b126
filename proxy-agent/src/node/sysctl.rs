// SPDX-License-Identifier: Apache-2.0
//! Process and kernel settings upstream applies at start-up: the OOM score adjustment and
//! the conntrack limits and timeouts. Each change is logged; one that is not permitted (a
//! read-only /proc/sys in a container, a value only the initial namespace may set) is a
//! warning, never a crash.

use std::{io, path::PathBuf, time::Duration};

use tracing::{info, warn};

/// Reads and writes sysctls by their /proc/sys path (e.g. `net/netfilter/nf_conntrack_max`).
pub trait Sysctl {
    fn read(&self, name: &str) -> io::Result<String>;
    fn write(&mut self, name: &str, value: &str) -> io::Result<()>;
}

/// The real /proc/sys.
#[derive(Debug, Default)]
pub struct ProcSysctl {
    pub root: Option<PathBuf>,
}

impl ProcSysctl {
    fn path(&self, name: &str) -> PathBuf {
        self.root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/proc/sys"))
            .join(name)
    }
}

impl Sysctl for ProcSysctl {
    fn read(&self, name: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.path(name))?.trim().to_string())
    }
    fn write(&mut self, name: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.path(name), value)
    }
}

/// The conntrack part of the configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConntrackSettings {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<Duration>,
    pub tcp_close_wait_timeout: Option<Duration>,
    pub tcp_be_liberal: bool,
    pub udp_timeout: Option<Duration>,
    pub udp_stream_timeout: Option<Duration>,
}

/// What to set, in order: (sysctl name, value, why).
pub fn plan_conntrack(s: &ConntrackSettings, cores: usize) -> Vec<(String, String, &'static str)> {
    let mut plan = Vec::new();
    // maxPerCore 0 leaves the limit alone (and ignores min).
    if let Some(per_core) = s.max_per_core.filter(|v| *v > 0) {
        let scaled = i64::from(per_core) * cores as i64;
        let max = scaled.max(i64::from(s.min.unwrap_or(0)));
        plan.push((
            "net/netfilter/nf_conntrack_max".into(),
            max.to_string(),
            "conntrack.maxPerCore x cores, at least conntrack.min",
        ));
    }
    let secs = |d: Duration| d.as_secs().to_string();
    if let Some(d) = s.tcp_established_timeout.filter(|d| !d.is_zero()) {
        plan.push((
            "net/netfilter/nf_conntrack_tcp_timeout_established".into(),
            secs(d),
            "conntrack.tcpEstablishedTimeout",
        ));
    }
    if let Some(d) = s.tcp_close_wait_timeout.filter(|d| !d.is_zero()) {
        plan.push((
            "net/netfilter/nf_conntrack_tcp_timeout_close_wait".into(),
            secs(d),
            "conntrack.tcpCloseWaitTimeout",
        ));
    }
    if s.tcp_be_liberal {
        plan.push((
            "net/netfilter/nf_conntrack_tcp_be_liberal".into(),
            "1".into(),
            "conntrack.tcpBeLiberal",
        ));
    }
    if let Some(d) = s.udp_timeout.filter(|d| !d.is_zero()) {
        plan.push((
            "net/netfilter/nf_conntrack_udp_timeout".into(),
            secs(d),
            "conntrack.udpTimeout",
        ));
    }
    if let Some(d) = s.udp_stream_timeout.filter(|d| !d.is_zero()) {
        plan.push((
            "net/netfilter/nf_conntrack_udp_timeout_stream".into(),
            secs(d),
            "conntrack.udpStreamTimeout",
        ));
    }
    plan
}

/// Outcome of one planned setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingOutcome {
    AlreadySet,
    Set,
    NotPermitted(String),
}

/// Applies the conntrack plan; returns what happened to each setting.
pub fn apply_conntrack(
    sysctl: &mut dyn Sysctl,
    settings: &ConntrackSettings,
    cores: usize,
) -> Vec<(String, SettingOutcome)> {
    plan_conntrack(settings, cores)
        .into_iter()
        .map(|(name, value, why)| {
            let outcome = match sysctl.read(&name) {
                Ok(current) if current == value => SettingOutcome::AlreadySet,
                _ => match sysctl.write(&name, &value) {
                    Ok(()) => {
                        info!(sysctl = %name, %value, reason = why, "set conntrack sysctl");
                        SettingOutcome::Set
                    }
                    Err(e) => {
                        warn!(sysctl = %name, %value, error = %e, "could not set conntrack sysctl");
                        SettingOutcome::NotPermitted(e.to_string())
                    }
                },
            };
            (name, outcome)
        })
        .collect()
}

/// Applies oomScoreAdj to the agent's own process.
pub fn apply_oom_score_adj(value: Option<i32>) -> SettingOutcome {
    let Some(value) = value else {
        return SettingOutcome::AlreadySet;
    };
    match std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        Ok(()) => {
            info!(
                oom_score_adj = value,
                "applied oomScoreAdj to the agent's process"
            );
            SettingOutcome::Set
        }
        Err(e) => {
            warn!(oom_score_adj = value, error = %e, "could not apply oomScoreAdj");
            SettingOutcome::NotPermitted(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Default)]
    struct FakeSysctl {
        values: HashMap<String, String>,
        read_only: bool,
        writes: Vec<(String, String)>,
    }

    impl Sysctl for FakeSysctl {
        fn read(&self, name: &str) -> io::Result<String> {
            self.values
                .get(name)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn write(&mut self, name: &str, value: &str) -> io::Result<()> {
            if self.read_only {
                return Err(io::Error::from(io::ErrorKind::PermissionDenied));
            }
            self.writes.push((name.into(), value.into()));
            self.values.insert(name.into(), value.into());
            Ok(())
        }
    }

    fn upstream_defaults() -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: Some(32768),
            min: Some(131072),
            tcp_established_timeout: Some(Duration::from_secs(86400)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            ..Default::default()
        }
    }

    #[test]
    fn max_is_per_core_times_cores_but_at_least_min() {
        let plan = plan_conntrack(&upstream_defaults(), 2);
        assert_eq!(plan[0].0, "net/netfilter/nf_conntrack_max");
        assert_eq!(plan[0].1, "131072"); // 2 x 32768 < min
        let plan = plan_conntrack(&upstream_defaults(), 8);
        assert_eq!(plan[0].1, "262144");
        let zero = ConntrackSettings {
            max_per_core: Some(0),
            ..upstream_defaults()
        };
        assert!(
            plan_conntrack(&zero, 8)
                .iter()
                .all(|(n, ..)| !n.ends_with("max"))
        );
    }

    #[test]
    fn timeouts_are_seconds_and_zero_means_untouched() {
        let plan = plan_conntrack(&upstream_defaults(), 1);
        let names: Vec<_> = plan
            .iter()
            .map(|(n, v, _)| (n.as_str(), v.as_str()))
            .collect();
        assert!(names.contains(&(
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            "86400"
        )));
        assert!(names.contains(&("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600")));
        let none = ConntrackSettings {
            tcp_established_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(plan_conntrack(&none, 1).is_empty());
    }

    #[test]
    fn values_already_set_are_not_rewritten_and_read_only_is_a_warning() {
        let mut fake = FakeSysctl::default();
        fake.values
            .insert("net/netfilter/nf_conntrack_max".into(), "131072".into());
        let out = apply_conntrack(&mut fake, &upstream_defaults(), 2);
        assert_eq!(out[0].1, SettingOutcome::AlreadySet);
        assert_eq!(fake.writes.len(), 2);

        let mut ro = FakeSysctl {
            read_only: true,
            ..Default::default()
        };
        let out = apply_conntrack(&mut ro, &upstream_defaults(), 2);
        assert!(
            out.iter()
                .all(|(_, o)| matches!(o, SettingOutcome::NotPermitted(_)))
        );
    }
}
