// SPDX-License-Identifier: Apache-2.0
//! Has the agent applied the last change? (pure)
//!
//! Upstream's /healthz cannot tell: when healthy it reports `lastUpdated` as the
//! current time, and it stays healthy while a queued update is younger than the health
//! timeout. The sync metrics can: `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`
//! moves when a change is queued, `..._last_timestamp_seconds` when a sync finishes.
//! /healthz is only the fallback for an agent without those metrics.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::http::{HttpResponse, parse_timestamp};

pub const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
pub const LAST_QUEUED: &str = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";

/// How long a change may go without queueing a sync before the runner decides it
/// needed none (e.g. it did not touch anything the proxy uses).
pub const NOTHING_QUEUED_GRACE: Duration = Duration::from_secs(3);

/// One IP family's sync gauges, in seconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FamilyTimes {
    pub last_sync: Option<f64>,
    pub last_queued: Option<f64>,
}

impl FamilyTimes {
    fn synced(&self) -> bool {
        self.last_sync.is_some_and(|t| t > 0.0)
    }

    /// Something was queued after the last sync finished (or before any sync).
    fn pending(&self) -> bool {
        self.last_queued.unwrap_or(0.0) > self.last_sync.unwrap_or(0.0)
    }
}

/// The sync gauges by their `ip_family` label (`""` for unlabelled ones). Each family is
/// its own proxier upstream: one family's sync says nothing of the other's, and a family
/// a change did not touch queues nothing and keeps its old stamps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncTimes {
    pub families: BTreeMap<String, FamilyTimes>,
}

impl SyncTimes {
    /// The newest sync of any family.
    pub fn last_sync(&self) -> Option<f64> {
        self.families
            .values()
            .filter_map(|f| f.last_sync)
            .reduce(f64::max)
    }

    /// The newest queueing of any family.
    pub fn last_queued(&self) -> Option<f64> {
        self.families
            .values()
            .filter_map(|f| f.last_queued)
            .reduce(f64::max)
    }
}

/// The value of label `name` in a series' label text (`a="x",b="y"`).
fn label_value<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

/// Reads the two gauges from Prometheus text exposition.
pub fn parse_sync_times(text: &str) -> SyncTimes {
    let mut times = SyncTimes::default();
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(labelled) => labelled.split_once('}').unwrap_or(("", "")),
            None => ("", &line[name_end..]),
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let slot: fn(&mut FamilyTimes) -> &mut Option<f64> = match name {
            LAST_SYNC => |f: &mut FamilyTimes| &mut f.last_sync,
            LAST_QUEUED => |f: &mut FamilyTimes| &mut f.last_queued,
            _ => continue,
        };
        let family = label_value(labels, "ip_family").unwrap_or_default();
        let entry = slot(times.families.entry(family.to_string()).or_default());
        *entry = Some(entry.map_or(value, |t: f64| t.max(value)));
    }
    times
}

fn epoch_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the runner knows about one change.
#[derive(Debug, Clone, Copy)]
pub struct Change {
    /// When the runner started writing the change's objects.
    pub started: SystemTime,
    /// When the last write returned. Also the point by which a healthz stamp must be new.
    pub at: SystemTime,
    /// The agent's first sync after starting: nothing needs to be queued for it.
    pub initial: bool,
}

/// How long after its last write the runner gives the agent to hear of a change. Until
/// then a sync may have covered only part of it (the agent can sync between two writes).
pub const SETTLE: Duration = Duration::from_millis(250);

/// How much slower than a normal machine this one runs: a factor on the runner's own
/// waits ([`SETTLE`], [`NOTHING_QUEUED_GRACE`], links coming up). 1 natively; the
/// emulated test VM (10-20x slower) sets it through `SCENARIO_TIME_SCALE`.
static TIME_SCALE: AtomicU32 = AtomicU32::new(1);

pub fn set_time_scale(factor: u32) {
    TIME_SCALE.store(factor.max(1), Ordering::Relaxed);
}

/// `wait` stretched by the time scale.
pub fn scaled(wait: Duration) -> Duration {
    wait * TIME_SCALE.load(Ordering::Relaxed)
}

/// `Ok` when the proxy has applied the change; otherwise why not yet.
///
/// The proxy queues a sync whenever it hears of a change and stamps the queue time, per
/// IP family; once the change has settled, it is applied when something was queued since
/// the change began and no family has a sync queued that has not finished. A change the
/// proxy needs no sync for queues nothing: after a grace period the last sync counts. The
/// first sync after a start must be seen in every family of `required` (upstream's
/// kube-proxy shows a family's gauges only from its first sync on, and its families sync
/// one after the other).
pub fn judge_metrics(
    times: &SyncTimes,
    change: Change,
    now: SystemTime,
    required: &[&str],
) -> Result<(), String> {
    if !times.families.values().any(FamilyTimes::synced) {
        return Err("no sync yet".into());
    }
    if let Some(family) = required
        .iter()
        .find(|f| !times.families.get(**f).is_some_and(FamilyTimes::synced))
    {
        return Err(format!("no {family} sync yet"));
    }
    if let Some((family, pending)) = times.families.iter().find(|(_, f)| f.pending()) {
        let family = if family.is_empty() {
            ""
        } else {
            family.as_str()
        };
        return Err(format!(
            "a sync is queued{}{} ({:.3} s after the last one)",
            if family.is_empty() { "" } else { " for " },
            family,
            pending.last_queued.unwrap_or(0.0) - pending.last_sync.unwrap_or(0.0)
        ));
    }
    if change.initial {
        return Ok(());
    }
    let queued = times.last_queued().unwrap_or(0.0);
    let since_write = now.duration_since(change.at).unwrap_or_default();
    if since_write < scaled(SETTLE) {
        return Err("the change is settling".into());
    }
    let started = epoch_secs(change.started);
    if queued >= started || since_write >= scaled(NOTHING_QUEUED_GRACE) {
        Ok(())
    } else {
        Err("the change has not been queued yet".into())
    }
}

/// Upstream prints Go's `time.Time.String()` (`2025-01-02 03:04:05.5 +0000 UTC m=+1.2`);
/// RFC 3339 is accepted too.
pub fn parse_any_time(text: &str) -> Option<(SystemTime, bool)> {
    if let Some(parsed) = parse_timestamp(text) {
        return Some(parsed);
    }
    let mut words = text.split_whitespace();
    let (date, time, offset) = (words.next()?, words.next()?, words.next()?);
    let (sign, digits) = offset.split_at(1);
    if !matches!(sign, "+" | "-") || digits.len() != 4 {
        return None;
    }
    parse_timestamp(&format!(
        "{date}T{time}{sign}{}:{}",
        &digits[..2],
        &digits[2..]
    ))
}

/// The fallback: a 200 whose `lastUpdated` is after the change.
pub fn judge_healthz(response: &HttpResponse, change: Change) -> Result<(), String> {
    if response.status != 200 {
        return Err(format!("/healthz answered {}", response.status));
    }
    let body: serde_json::Value = serde_json::from_str(&response.body)
        .map_err(|_| format!("/healthz body is not JSON: {}", response.body))?;
    let stamp = body
        .get("lastUpdated")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let (updated, fine) =
        parse_any_time(stamp).ok_or_else(|| format!("/healthz lastUpdated {stamp:?}"))?;
    // A whole-second stamp cannot be ordered within its second; accept that second.
    let slack = if fine {
        Duration::ZERO
    } else {
        Duration::from_secs(1)
    };
    if updated + slack > change.at {
        Ok(())
    } else {
        Err(format!("/healthz lastUpdated {stamp} is before the change"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(secs)
    }

    const T: f64 = 1_750_000_000.5;

    #[test]
    fn parses_gauges_with_and_without_labels() {
        let text = format!(
            "# HELP {LAST_SYNC} The last time proxy rules were successfully synced\n\
             # TYPE {LAST_SYNC} gauge\n\
             {LAST_SYNC}{{ip_family=\"IPv4\"}} 1.7500000015e+09\n\
             {LAST_SYNC}{{ip_family=\"IPv6\"}} 1.7500000012e+09\n\
             {LAST_QUEUED} 1.75e+09\n\
             {LAST_SYNC}_other 5\n"
        );
        let times = parse_sync_times(&text);
        assert_eq!(times.last_sync(), Some(1.7500000015e9));
        assert_eq!(times.last_queued(), Some(1.75e9));
        assert_eq!(times.families["IPv6"].last_sync, Some(1.7500000012e9));
        assert_eq!(times.families[""].last_queued, Some(1.75e9));
        assert_eq!(parse_sync_times("up 1\n"), SyncTimes::default());
    }

    #[test]
    fn metrics_decide_readiness() {
        let change = Change {
            started: at(T - 0.1),
            at: at(T),
            initial: false,
        };
        let times = |sync: f64, queued: f64| SyncTimes {
            families: BTreeMap::from([(
                "IPv4".to_string(),
                FamilyTimes {
                    last_sync: Some(sync),
                    last_queued: Some(queued),
                },
            )]),
        };
        let judge_metrics = |t: SyncTimes, c, now| super::judge_metrics(&t, c, now, &[]);
        let soon = at(T + 0.5);
        assert!(judge_metrics(times(T + 0.2, T + 0.1), change, soon).is_ok());
        // The agent heard of the change while it was being written and synced before the
        // last write returned: that sync counts.
        assert!(judge_metrics(times(T - 0.01, T - 0.05), change, soon).is_ok());
        // Too early to tell: the change has not settled.
        assert!(judge_metrics(times(T + 0.01, T + 0.005), change, at(T + 0.1)).is_err());
        // Queued after the change, not synced yet.
        assert!(judge_metrics(times(T - 5.0, T + 0.1), change, soon).is_err());
        // A sync, but the change itself not queued yet: wait a little.
        assert!(judge_metrics(times(T + 0.2, T - 5.0), change, soon).is_err());
        assert!(judge_metrics(times(T + 0.2, T - 5.0), change, at(T + 4.0)).is_ok());
        assert!(judge_metrics(SyncTimes::default(), change, soon).is_err());

        let start = Change {
            started: at(T),
            at: at(T),
            initial: true,
        };
        assert!(judge_metrics(times(T + 0.3, 0.0), start, soon).is_ok());
        let never = SyncTimes {
            families: BTreeMap::from([("IPv4".to_string(), FamilyTimes::default())]),
        };
        assert!(judge_metrics(never, start, soon).is_err());
    }

    /// Upstream's families are two proxiers: IPv4 synced says nothing of IPv6, which may
    /// not even show its gauges yet; one family queued and not synced keeps the change
    /// pending though the other synced since.
    #[test]
    fn every_family_counts() {
        let family = |sync: f64, queued: Option<f64>| FamilyTimes {
            last_sync: Some(sync),
            last_queued: queued,
        };
        let start = Change {
            started: at(T),
            at: at(T),
            initial: true,
        };
        let both = ["IPv4", "IPv6"];
        let v4_only = SyncTimes {
            families: BTreeMap::from([("IPv4".to_string(), family(T + 0.1, None))]),
        };
        let err = judge_metrics(&v4_only, start, at(T + 0.5), &both).unwrap_err();
        assert_eq!(err, "no IPv6 sync yet");
        assert!(judge_metrics(&v4_only, start, at(T + 0.5), &[]).is_ok());

        let change = Change {
            started: at(T - 0.1),
            at: at(T),
            initial: false,
        };
        let mut times = SyncTimes {
            families: BTreeMap::from([
                ("IPv4".to_string(), family(T + 0.3, Some(T + 0.2))),
                ("IPv6".to_string(), family(T - 9.0, Some(T + 0.1))),
            ]),
        };
        let err = judge_metrics(&times, change, at(T + 0.5), &both).unwrap_err();
        assert!(err.starts_with("a sync is queued for IPv6"), "{err}");
        times
            .families
            .insert("IPv6".into(), family(T + 0.4, Some(T + 0.1)));
        assert!(judge_metrics(&times, change, at(T + 0.5), &both).is_ok());
        // A family the change did not touch keeps its old stamps.
        times
            .families
            .insert("IPv6".into(), family(T - 9.0, Some(T - 9.5)));
        assert!(judge_metrics(&times, change, at(T + 0.5), &both).is_ok());
    }

    #[test]
    fn go_time_strings() {
        let (go, fine) = parse_any_time("2025-01-02 05:04:05.25 +0200 EET m=+12.5").unwrap();
        let (rfc, _) = parse_timestamp("2025-01-02T03:04:05.25Z").unwrap();
        assert!(fine);
        assert_eq!(go, rfc);
        assert!(parse_any_time("2025-01-02 03:04:05 UTC").is_none());
    }

    #[test]
    fn healthz_fallback() {
        let change = Change {
            started: at(T),
            at: at(T),
            initial: false,
        };
        let answer = |status, stamp: &str| HttpResponse {
            status,
            body: format!("{{\"lastUpdated\": \"{stamp}\",\"currentTime\": \"{stamp}\"}}"),
        };
        let after = "2025-06-15 15:06:40.7 +0000 UTC m=+3.0";
        let before = "2025-06-15 15:06:40.3 +0000 UTC m=+3.0";
        assert!(judge_healthz(&answer(200, after), change).is_ok());
        assert!(judge_healthz(&answer(200, before), change).is_err());
        assert!(judge_healthz(&answer(503, after), change).is_err());
        assert!(judge_healthz(&answer(200, "2025-06-15T15:06:40Z"), change).is_ok());
        assert!(judge_healthz(&answer(200, "0001-01-01 00:00:00 +0000 UTC"), change).is_err());
    }
}
