// SPDX-License-Identifier: Apache-2.0
//! The proxy health server (healthzBindAddress, default 0.0.0.0:10256) with upstream's
//! semantics: per IP family, an update queued (a Service or EndpointSlice change seen) and
//! not applied within the health timeout (2 x syncPeriod) makes the proxy unhealthy;
//! /healthz also turns 503 while the Node is being deleted or is tainted for deletion by the
//! cluster autoscaler (so load balancers drain it), /livez ignores the Node. Both answer
//! upstream's current ProxyHealth JSON (lastUpdated, currentTime, healthy, a per-family
//! status, and nodeEligible on /healthz). `/proxyMode` answers the mode actually running.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tracing::info;

use super::metrics::Metrics;

/// Taint the cluster autoscaler puts on nodes it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

#[derive(Debug)]
struct Inner {
    last_updated: HashMap<Family, SystemTime>,
    oldest_pending_queued: HashMap<Family, SystemTime>,
    node_eligible: bool,
    proxy_mode: String,
}

/// Shared health state, written by the sync loop and read by the HTTP handlers.
#[derive(Clone, Debug)]
pub struct ProxyHealth {
    inner: Arc<Mutex<Inner>>,
    timeout: Duration,
}

/// One proxier's health (upstream's ProxierHealth).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FamilyHealth {
    pub last_updated: SystemTime,
    pub healthy: bool,
}

/// One health verdict (upstream's ProxyHealth, without the Node's eligibility).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every proxier is healthy.
    pub healthy: bool,
    /// The newest update of any proxier (upstream keeps this field for compatibility).
    pub last_updated: Option<SystemTime>,
    /// Per IP family that has synced at least once.
    pub families: BTreeMap<Family, FamilyHealth>,
}

impl Family {
    /// The name upstream's JSON uses (v1.IPFamily).
    pub fn api_name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

impl ProxyHealth {
    pub fn new(timeout: Duration, proxy_mode: &str) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                last_updated: HashMap::new(),
                oldest_pending_queued: HashMap::new(),
                // Eligible while starting up, until a Node event says otherwise.
                node_eligible: true,
                proxy_mode: proxy_mode.to_string(),
            })),
            timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means a handler panicked mid-read; the data is still sound.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The proxier of `family` applied everything it had been told.
    pub fn updated(&self, family: Family, now: SystemTime) {
        let mut inner = self.lock();
        inner.oldest_pending_queued.remove(&family);
        inner.last_updated.insert(family, now);
    }

    /// A change for `family` arrived and is not applied yet.
    pub fn queued_update(&self, family: Family, now: SystemTime) {
        self.lock()
            .oldest_pending_queued
            .entry(family)
            .or_insert(now);
    }

    /// Node eligibility from the Node object: not deleted, not tainted for deletion.
    pub fn sync_node(&self, deleting: bool, taint_keys: &[&str]) {
        self.lock().node_eligible = !deleting && !taint_keys.contains(&TO_BE_DELETED_TAINT);
    }

    pub fn set_proxy_mode(&self, mode: &str) {
        self.lock().proxy_mode = mode.to_string();
    }

    pub fn proxy_mode(&self) -> String {
        self.lock().proxy_mode.clone()
    }

    pub fn node_eligible(&self) -> bool {
        self.lock().node_eligible
    }

    /// Health ignoring the Node (upstream's Health() / livez): a proxier that has not
    /// synced yet, or has nothing queued, or whose oldest queued update is younger than the
    /// timeout, is healthy.
    pub fn verdict(&self, now: SystemTime) -> Verdict {
        let inner = self.lock();
        let mut verdict = Verdict {
            healthy: true,
            last_updated: inner.last_updated.values().max().copied(),
            families: BTreeMap::new(),
        };
        for (family, updated) in &inner.last_updated {
            let late = inner
                .oldest_pending_queued
                .get(family)
                .is_some_and(|queued| {
                    now.duration_since(*queued).unwrap_or_default() >= self.timeout
                });
            verdict.healthy &= !late;
            verdict.families.insert(
                *family,
                FamilyHealth {
                    last_updated: *updated,
                    healthy: !late,
                },
            );
        }
        verdict
    }
}

/// A timestamp as upstream's JSON carries it: Go's encoding of a time.Time, RFC 3339 with
/// nanoseconds (trailing zeros trimmed), here always in UTC; Go's zero time before the
/// first sync.
fn go_json_time(t: Option<SystemTime>) -> String {
    match t {
        Some(t) => format_rfc3339(t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()),
        None => "0001-01-01T00:00:00Z".to_string(),
    }
}

/// UTC civil time, RFC 3339 with the fraction's trailing zeros trimmed, as Go prints it.
fn format_rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs() as i64;
    let nanos = since_epoch.subsec_nanos();
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    let mut frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}")
    };
    while frac.ends_with('0') {
        frac.pop();
    }
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}{frac}Z")
}

/// Upstream's ProxyHealth as JSON. A healthy answer reports "now" as lastUpdated (upstream
/// keeps that for compatibility with older releases); `node_eligible` only on /healthz.
fn health_body(
    verdict: &Verdict,
    healthy: bool,
    now: SystemTime,
    node_eligible: Option<bool>,
) -> String {
    let last = if healthy {
        Some(now)
    } else {
        verdict.last_updated
    };
    let mut body = serde_json::Map::new();
    body.insert("lastUpdated".into(), go_json_time(last).into());
    body.insert("currentTime".into(), go_json_time(Some(now)).into());
    if let Some(eligible) = node_eligible {
        body.insert("nodeEligible".into(), eligible.into());
    }
    body.insert("healthy".into(), verdict.healthy.into());
    if !verdict.families.is_empty() {
        let status: serde_json::Map<String, serde_json::Value> = verdict
            .families
            .iter()
            .map(|(family, health)| {
                (
                    family.api_name().to_string(),
                    serde_json::json!({
                        "lastUpdated": go_json_time(Some(health.last_updated)),
                        "healthy": health.healthy,
                    }),
                )
            })
            .collect();
        body.insert("status".into(), status.into());
    }
    serde_json::Value::Object(body).to_string()
}

#[derive(Clone)]
struct AppState {
    health: ProxyHealth,
    metrics: Option<Metrics>,
}

async fn healthz(State(app): State<AppState>) -> impl IntoResponse {
    let now = SystemTime::now();
    let verdict = app.health.verdict(now);
    let eligible = app.health.node_eligible();
    let healthy = verdict.healthy && eligible;
    if let Some(m) = &app.metrics {
        m.healthz_total(healthy);
    }
    respond(healthy, health_body(&verdict, healthy, now, Some(eligible)))
}

async fn livez(State(app): State<AppState>) -> impl IntoResponse {
    let now = SystemTime::now();
    let verdict = app.health.verdict(now);
    if let Some(m) = &app.metrics {
        m.livez_total(verdict.healthy);
    }
    respond(
        verdict.healthy,
        health_body(&verdict, verdict.healthy, now, None),
    )
}

async fn proxy_mode(State(app): State<AppState>) -> impl IntoResponse {
    app.health.proxy_mode()
}

fn respond(healthy: bool, body: String) -> impl IntoResponse {
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

pub fn router(health: ProxyHealth, metrics: Option<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/proxyMode", get(proxy_mode))
        .with_state(AppState { health, metrics })
}

/// Binds and serves until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    health: ProxyHealth,
    metrics: Option<Metrics>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, "healthz server listening");
    axum::serve(listener, router(health, metrics)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn healthy_while_starting_and_when_synced() {
        let h = ProxyHealth::new(Duration::from_secs(60), "ebpf");
        assert!(h.verdict(t(0)).healthy);
        h.queued_update(Family::V4, t(1));
        // Nothing applied yet and no proxier reported: still "starting up".
        assert!(h.verdict(t(100)).healthy);
        h.updated(Family::V4, t(2));
        let v = h.verdict(t(3));
        assert!(v.healthy);
        assert_eq!(v.last_updated, Some(t(2)));
        assert_eq!(
            v.families[&Family::V4],
            FamilyHealth {
                last_updated: t(2),
                healthy: true
            }
        );
    }

    #[test]
    fn a_queued_update_left_unapplied_past_the_timeout_is_unhealthy() {
        let h = ProxyHealth::new(Duration::from_secs(60), "ebpf");
        h.updated(Family::V4, t(0));
        h.queued_update(Family::V4, t(10));
        h.queued_update(Family::V4, t(50)); // the oldest counts
        assert!(h.verdict(t(69)).healthy);
        let v = h.verdict(t(70));
        assert!(!v.healthy);
        assert_eq!(v.last_updated, Some(t(0)));
        assert!(!v.families[&Family::V4].healthy);
        h.updated(Family::V4, t(71));
        assert!(h.verdict(t(72)).healthy);
    }

    #[test]
    fn each_family_is_judged_on_its_own() {
        let h = ProxyHealth::new(Duration::from_secs(10), "iptables");
        h.updated(Family::V4, t(0));
        h.updated(Family::V6, t(0));
        h.queued_update(Family::V6, t(1));
        h.updated(Family::V4, t(20));
        let v = h.verdict(t(20));
        assert!(!v.healthy);
        assert!(v.families[&Family::V4].healthy && !v.families[&Family::V6].healthy);
        // The newest update of any family, not the late family's (upstream's Health()).
        assert_eq!(v.last_updated, Some(t(20)));
    }

    #[test]
    fn bodies_are_upstreams_proxy_health_json() {
        let h = ProxyHealth::new(Duration::from_secs(10), "ebpf");
        let v = h.verdict(t(0));
        let body: serde_json::Value =
            serde_json::from_str(&health_body(&v, true, t(0), Some(true))).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "lastUpdated": "2023-11-14T22:13:20Z",
                "currentTime": "2023-11-14T22:13:20Z",
                "nodeEligible": true,
                "healthy": true,
            })
        );
        h.updated(Family::V4, t(1));
        h.updated(Family::V6, t(2));
        h.queued_update(Family::V6, t(3));
        let v = h.verdict(t(30));
        let body: serde_json::Value =
            serde_json::from_str(&health_body(&v, false, t(30), None)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "lastUpdated": "2023-11-14T22:13:22Z",
                "currentTime": "2023-11-14T22:13:50Z",
                "healthy": false,
                "status": {
                    "IPv4": {"lastUpdated": "2023-11-14T22:13:21Z", "healthy": true},
                    "IPv6": {"lastUpdated": "2023-11-14T22:13:22Z", "healthy": false},
                },
            })
        );
    }

    #[test]
    fn node_eligibility_follows_deletion_and_the_autoscaler_taint() {
        let h = ProxyHealth::new(Duration::from_secs(10), "ebpf");
        assert!(h.node_eligible());
        h.sync_node(
            false,
            &["node.kubernetes.io/unschedulable", TO_BE_DELETED_TAINT],
        );
        assert!(!h.node_eligible());
        h.sync_node(false, &[]);
        assert!(h.node_eligible());
        h.sync_node(true, &[]);
        assert!(!h.node_eligible());
    }

    #[test]
    fn timestamps_print_like_go_json() {
        assert_eq!(go_json_time(None), "0001-01-01T00:00:00Z");
        let d = Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(format_rfc3339(d), "2023-11-14T22:13:20.123456789Z");
        assert_eq!(
            format_rfc3339(Duration::new(0, 500_000_000)),
            "1970-01-01T00:00:00.5Z"
        );
        assert_eq!(
            format_rfc3339(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }
}
