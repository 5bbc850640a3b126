// SPDX-License-Identifier: Apache-2.0
//! Upstream's health-check tests (pkg/proxy/healthcheck/healthcheck_test.go, the newest
//! version: TestServer, TestHealthzServer, TestLivezServer, TestServerWithSelectiveListeningAddress;
//! and the IPVS proxier's Test_HealthCheckNodePortWhenTerminating) restated against the real
//! servers over HTTP: the proxy health server (`serve::healthz_router`: /healthz, /livez) and the
//! health-check node port servers (`ServiceHealthServers`), fed the way the agent feeds them
//! (objects -> `ClusterState` -> `sync`). No privileges: everything listens on loopback.
//!
//! Upstream steps a fake clock; the handlers here read the real one, so "an update queued
//! 25 s ago" is a `queued_update` stamped 25 s in the past (the health timeout is 10 s, as
//! in upstream's fixture).

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, SystemTime},
};

use proxy_agent::serve::{
    self, Family, Metrics, ProxyHealth, ServiceHealthServers, TO_BE_DELETED_TAINT,
};
use serde_json::Value;
use tests::scenario::{http::parse_timestamp, readiness::parse_any_time};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use upstream_support::Cluster;

mod upstream_support;

const HEALTH_TIMEOUT: Duration = Duration::from_secs(10);
const LATE: Duration = Duration::from_secs(25);
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// One HTTP answer. The scenario runner's `http::get` keeps only status and body; these
/// tests need the headers too.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

async fn answer(addr: SocketAddr, path: &str) -> Answer {
    get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// Whether nothing listens at `addr` (a closed server may take a scheduler turn to go).
async fn closed(addr: SocketAddr) -> bool {
    for _ in 0..50 {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    false
}

/// A loopback port nobody uses right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind((LOOPBACK, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn ago(d: Duration) -> SystemTime {
    SystemTime::now() - d
}

// ---------------------------------------------------------------------------------------
// The proxy health server: /healthz and /livez.

struct HealthServer {
    addr: SocketAddr,
    health: ProxyHealth,
    metrics: Metrics,
}

async fn health_server() -> HealthServer {
    let health = ProxyHealth::new(HEALTH_TIMEOUT, "ebpf");
    let metrics = Metrics::new();
    let listener = TcpListener::bind((LOOPBACK, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let app = serve::healthz_router(health.clone(), Some(metrics.clone()));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    HealthServer {
        addr,
        health,
        metrics,
    }
}

impl HealthServer {
    async fn status(&self, path: &str) -> u16 {
        let a = answer(self.addr, path).await;
        assert_eq!(a.header("content-type"), Some("application/json"), "{path}");
        assert_eq!(
            a.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        a.status
    }

    fn counter(&self, name: &str, code: &str) -> u64 {
        let prefix = format!("kubeproxy_{name}{{code=\"{code}\"}} ");
        self.metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }
}

/// Answers counted by code, as upstream's test tracks them for the metrics.
#[derive(Default)]
struct Tally {
    ok: u64,
    unavailable: u64,
}

impl HealthServer {
    async fn expect(&self, path: &str, tally: &mut Tally, code: u16, step: &str) {
        assert_eq!(self.status(path).await, code, "{path}: {step}");
        match code {
            200 => tally.ok += 1,
            _ => tally.unavailable += 1,
        }
    }
}

/// upstream's testProxyHealthUpdater: the verdicts of one path through the per-family
/// queued/updated sequence.
async fn proxy_health_updater(s: &HealthServer, path: &str) -> Tally {
    let h = &s.health;
    let mut t = Tally::default();
    let now = SystemTime::now;
    s.expect(path, &mut t, 200, "healthy by default, before any sync")
        .await;
    h.updated(Family::V4, now());
    h.updated(Family::V6, now());
    s.expect(path, &mut t, 200, "after the first update of both proxiers")
        .await;
    h.updated(Family::V4, ago(LATE));
    h.updated(Family::V6, ago(LATE));
    s.expect(
        path,
        &mut t,
        200,
        "still healthy long after, with no update queued",
    )
    .await;
    h.queued_update(Family::V4, ago(LATE));
    s.expect(
        path,
        &mut t,
        503,
        "the IPv4 proxier exceeded the update-processing time",
    )
    .await;
    h.updated(Family::V4, now());
    h.updated(Family::V6, now());
    s.expect(path, &mut t, 200, "both proxiers processed their updates")
        .await;
    h.queued_update(Family::V6, ago(LATE));
    s.expect(
        path,
        &mut t,
        503,
        "the IPv6 proxier exceeded the update-processing time",
    )
    .await;
    h.updated(Family::V4, now());
    h.updated(Family::V6, now());
    s.expect(path, &mut t, 200, "both proxiers processed their updates")
        .await;
    h.queued_update(Family::V4, ago(LATE));
    h.queued_update(Family::V6, ago(LATE));
    s.expect(path, &mut t, 503, "both proxiers are late").await;
    h.updated(Family::V4, now());
    h.updated(Family::V6, now());
    s.expect(path, &mut t, 200, "both updated again").await;
    h.queued_update(Family::V6, ago(LATE));
    s.expect(path, &mut t, 503, "IPv6 is late").await;
    h.updated(Family::V4, now());
    s.expect(
        path,
        &mut t,
        503,
        "updating the IPv4 proxier does not help the late IPv6 one",
    )
    .await;
    h.updated(Family::V6, now());
    s.expect(path, &mut t, 200, "IPv6 updated").await;
    h.queued_update(Family::V4, ago(LATE));
    h.queued_update(Family::V6, ago(LATE));
    s.expect(path, &mut t, 503, "both late").await;
    h.updated(Family::V4, now());
    s.expect(path, &mut t, 503, "not healthy until both updated")
        .await;
    h.updated(Family::V6, now());
    s.expect(path, &mut t, 200, "both updated").await;
    h.queued_update(Family::V4, ago(Duration::from_secs(5)));
    s.expect(
        path,
        &mut t,
        200,
        "an update queued 5 s ago is not late yet (timeout 10 s)",
    )
    .await;
    h.updated(Family::V4, now());
    t
}

/// A node as the event loop hands it over: deleting, and its taint keys.
fn sync_node(h: &ProxyHealth, deleting: bool, taint: Option<&str>) {
    h.sync_node(deleting, taint.as_slice());
}

#[tokio::test]
async fn healthz_follows_the_proxiers_and_the_node() {
    let s = health_server().await;
    sync_node(&s.health, false, None);
    let Tally { ok, unavailable } = proxy_health_updater(&s, "/healthz").await;

    sync_node(&s.health, false, Some("other"));
    assert_eq!(
        s.status("/healthz").await,
        200,
        "a node tainted otherwise is eligible"
    );
    sync_node(&s.health, false, Some(TO_BE_DELETED_TAINT));
    assert_eq!(
        s.status("/healthz").await,
        503,
        "a node the cluster autoscaler is about to delete is not"
    );
    sync_node(&s.health, false, Some("other"));
    assert_eq!(s.status("/healthz").await, 200, "eligible again");
    sync_node(&s.health, true, None);
    assert_eq!(
        s.status("/healthz").await,
        503,
        "a node being deleted is not"
    );

    // kubeproxy_proxy_healthz_total counts every answer by code; /livez is not counted there.
    assert_eq!(s.counter("proxy_healthz_total", "200"), ok + 2);
    assert_eq!(s.counter("proxy_healthz_total", "503"), unavailable + 2);
    assert_eq!(s.counter("proxy_livez_total", "200"), 0);
}

#[tokio::test]
async fn livez_follows_the_proxiers_and_ignores_the_node() {
    let s = health_server().await;
    let Tally { ok, unavailable } = proxy_health_updater(&s, "/livez").await;
    for (deleting, taint) in [
        (false, Some("other")),
        (false, Some(TO_BE_DELETED_TAINT)),
        (false, Some("other")),
        (true, None),
    ] {
        sync_node(&s.health, deleting, taint);
        assert_eq!(
            s.status("/livez").await,
            200,
            "/livez ignores the node (deleting {deleting}, taint {taint:?})"
        );
    }
    assert_eq!(s.counter("proxy_livez_total", "200"), ok + 4);
    assert_eq!(s.counter("proxy_livez_total", "503"), unavailable);
    assert_eq!(s.counter("proxy_healthz_total", "200"), 0);
}

#[tokio::test]
async fn a_family_that_never_synced_is_not_judged() {
    // Upstream judges only proxiers that reported an update: one that queued changes but
    // never synced is still starting up.
    let s = health_server().await;
    s.health.updated(Family::V4, SystemTime::now());
    s.health
        .queued_update(Family::V6, ago(Duration::from_secs(60)));
    assert_eq!(s.status("/healthz").await, 200);
    assert_eq!(s.status("/livez").await, 200);
}

/// RFC 3339 (Go's time.Time JSON encoding), as upstream's ProxyHealth carries its times.
fn rfc3339(v: &Value, field: &str) -> SystemTime {
    let text = v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v}"));
    parse_timestamp(text)
        .unwrap_or_else(|| panic!("{field} {text:?} is not an RFC 3339 time"))
        .0
}

fn close_to(a: SystemTime, b: SystemTime) -> bool {
    let d = a.duration_since(b).unwrap_or_else(|e| e.duration());
    d < Duration::from_secs(2)
}

#[tokio::test]
async fn healthz_and_livez_bodies_are_upstreams_proxy_health_json() {
    // The newest upstream answers with its ProxyHealth struct as JSON: lastUpdated and
    // currentTime (time.Time, RFC 3339), healthy, nodeEligible (/healthz only), and status:
    // per IP family {lastUpdated, healthy} (TestHealthzServer/TestLivezServer decode it).
    let s = health_server().await;
    s.health.updated(Family::V4, SystemTime::now());
    s.health.updated(Family::V6, SystemTime::now());
    for path in ["/healthz", "/livez"] {
        let body = answer(s.addr, path).await.json();
        let now = SystemTime::now();
        assert!(
            close_to(rfc3339(&body, "currentTime"), now),
            "{path}: {body}"
        );
        assert!(
            close_to(rfc3339(&body, "lastUpdated"), now),
            "{path}: a healthy answer reports lastUpdated = now: {body}"
        );
        assert_eq!(body["healthy"], true, "{path}: {body}");
        for family in ["IPv4", "IPv6"] {
            assert_eq!(body["status"][family]["healthy"], true, "{path}: {body}");
            rfc3339(&body["status"][family], "lastUpdated");
        }
        match path {
            "/healthz" => assert_eq!(body["nodeEligible"], true, "{body}"),
            _ => assert!(body.get("nodeEligible").is_none(), "/livez: {body}"),
        }
    }
    s.health.queued_update(Family::V4, ago(LATE));
    let body = answer(s.addr, "/healthz").await.json();
    assert_eq!(body["healthy"], false, "{body}");
    assert_eq!(body["status"]["IPv4"]["healthy"], false, "{body}");
    assert_eq!(body["status"]["IPv6"]["healthy"], true, "{body}");
    sync_node(&s.health, false, Some(TO_BE_DELETED_TAINT));
    s.health.updated(Family::V4, SystemTime::now());
    let body = answer(s.addr, "/healthz").await.json();
    assert_eq!(body["healthy"], true, "the proxiers are healthy: {body}");
    assert_eq!(body["nodeEligible"], false, "the node is not: {body}");
}

#[tokio::test]
async fn an_unhealthy_answer_reports_the_newest_update() {
    // Upstream's lastUpdated is the most recent Updated() of any proxier (kept for
    // backward compatibility); a healthy answer reports the current time instead. Times are
    // read in either format here, so only their values are judged.
    let s = health_server().await;
    let old = ago(Duration::from_secs(60));
    let recent = ago(Duration::from_secs(10));
    s.health.updated(Family::V6, old);
    s.health
        .queued_update(Family::V6, ago(Duration::from_secs(30)));
    s.health.updated(Family::V4, recent);
    let a = answer(s.addr, "/healthz").await;
    assert_eq!(a.status, 503, "IPv6 is late");
    let body = a.json();
    let stamp = body["lastUpdated"].as_str().unwrap_or_default();
    let (last, _) = parse_any_time(stamp).unwrap_or_else(|| panic!("lastUpdated {stamp:?}"));
    assert!(
        close_to(last, recent),
        "lastUpdated should be the IPv4 update ({recent:?}), the newest, not the late IPv6 one's: {body}"
    );
}

// ---------------------------------------------------------------------------------------
// Health-check node ports.

/// The agent's model of the objects given, and the health-check servers synced to it.
struct ServiceHealth {
    cluster: Cluster,
    servers: ServiceHealthServers,
    health: ProxyHealth,
}

fn lb_service(namespace: &str, name: &str, health_check_node_port: u16) -> String {
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: {namespace}}}
  spec:
    type: LoadBalancer
    clusterIP: 172.30.0.41
    clusterIPs: [172.30.0.41]
    ipFamilies: [IPv4]
    ports: [{{name: p80, port: 80, protocol: TCP, nodePort: 3001}}]
    externalTrafficPolicy: Local
    healthCheckNodePort: {health_check_node_port}
"
    )
}

/// `count` local endpoints with the given conditions (ready, serving, terminating), plus
/// one ready remote endpoint that never counts.
fn slice(namespace: &str, service: &str, count: u8, conditions: (bool, bool, bool)) -> String {
    let (ready, serving, terminating) = conditions;
    let mut yaml = format!(
        "- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {service}-1, namespace: {namespace}, labels: {{kubernetes.io/service-name: {service}}}}}
  addressType: IPv4
  ports: [{{name: p80, port: 80, protocol: TCP}}]
  endpoints:
  - {{addresses: [10.181.0.1], nodeName: node-2, conditions: {{ready: true}}}}
"
    );
    for i in 1..=count {
        yaml += &format!(
            "  - {{addresses: [10.180.0.{i}], nodeName: test-node, conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}}}\n"
        );
    }
    yaml
}

const READY: (bool, bool, bool) = (true, true, false);

impl ServiceHealth {
    fn new(addresses: Option<Vec<IpAddr>>) -> Self {
        let health = ProxyHealth::new(HEALTH_TIMEOUT, "ebpf");
        health.updated(Family::V4, SystemTime::now());
        Self {
            cluster: Cluster::new("test-node"),
            servers: ServiceHealthServers::new(health.clone(), addresses),
            health,
        }
    }

    /// Makes the cluster hold exactly these objects, then syncs the servers (fully).
    fn set(&mut self, yaml: &str) {
        self.cluster.set(yaml);
        self.servers
            .sync(self.cluster.families(), &HashSet::new(), true);
    }
}

/// GET the health-check node port and check upstream's answer: the status, the JSON body
/// naming the service, the local endpoint count and the proxy's health, and the headers.
async fn check(port: u16, service: (&str, &str), local_endpoints: u64, proxy_healthy: bool) {
    let addr = SocketAddr::new(LOOPBACK, port);
    let a = answer(addr, "/").await;
    let want_status = if local_endpoints > 0 && proxy_healthy {
        200
    } else {
        503
    };
    let body = a.json();
    let context = format!("{}/{} on {port}: {a:?}", service.0, service.1);
    assert_eq!(a.status, want_status, "{context}");
    assert_eq!(body["service"]["namespace"], service.0, "{context}");
    assert_eq!(body["service"]["name"], service.1, "{context}");
    assert_eq!(body["localEndpoints"], local_endpoints, "{context}");
    assert_eq!(body["serviceProxyHealthy"], proxy_healthy, "{context}");
    assert_eq!(
        a.header("content-type"),
        Some("application/json"),
        "{context}"
    );
    assert_eq!(
        a.header("x-content-type-options"),
        Some("nosniff"),
        "{context}"
    );
    assert_eq!(
        a.header("x-load-balancing-endpoint-weight"),
        Some(local_endpoints.to_string().as_str()),
        "{context}"
    );
}

async fn assert_closed(port: u16, why: &str) {
    assert!(
        closed(SocketAddr::new(LOOPBACK, port)).await,
        "port {port}: {why}"
    );
}

#[tokio::test]
async fn health_check_node_ports_follow_services_and_local_endpoints() {
    let [p1, p2, p3, p3b, p4] = std::array::from_fn(|_| free_port());
    let mut hc = ServiceHealth::new(Some(vec![LOOPBACK]));

    hc.set("");
    assert_closed(p1, "no service, no server").await;
    hc.set(&slice("a", "b", 3, READY));
    assert_closed(p1, "endpoints of an unknown service open nothing").await;

    let svc_ab = lb_service("a", "b", p1);
    hc.set(&svc_ab);
    check(p1, ("a", "b"), 0, true).await;
    hc.set(&format!("{svc_ab}{}", slice("a", "b", 18, READY)));
    check(p1, ("a", "b"), 18, true).await;
    hc.set(&format!("{svc_ab}{}", slice("a", "b", 0, READY)));
    check(p1, ("a", "b"), 0, true).await;
    hc.set(&format!("{svc_ab}{}", slice("a", "b", 11, READY)));
    check(p1, ("a", "b"), 11, true).await;
    hc.set(&svc_ab);
    check(p1, ("a", "b"), 0, true).await;
    hc.set(&format!("{svc_ab}{}", slice("a", "b", 18, READY)));
    check(p1, ("a", "b"), 18, true).await;
    hc.set("");
    assert_closed(p1, "the service was deleted").await;

    // Several services.
    let three = format!(
        "{}{}{}",
        lb_service("a", "b", p1),
        lb_service("c", "d", p2),
        lb_service("e", "f", p3)
    );
    hc.set(&three);
    check(p1, ("a", "b"), 0, true).await;
    check(p2, ("c", "d"), 0, true).await;
    check(p3, ("e", "f"), 0, true).await;
    let with_endpoints = format!(
        "{three}{}{}{}",
        slice("a", "b", 9, READY),
        slice("c", "d", 3, READY),
        slice("e", "f", 7, READY)
    );
    hc.set(&with_endpoints);
    check(p1, ("a", "b"), 9, true).await;
    check(p2, ("c", "d"), 3, true).await;
    check(p3, ("e", "f"), 7, true).await;

    // a/b removed, c/d kept, e/f moved to another port, g/h added.
    let services = format!(
        "{}{}{}",
        lb_service("c", "d", p2),
        lb_service("e", "f", p3b),
        lb_service("g", "h", p4)
    );
    hc.set(&format!(
        "{services}{}{}{}",
        slice("a", "b", 9, READY),
        slice("c", "d", 3, READY),
        slice("e", "f", 7, READY)
    ));
    assert_closed(p1, "a/b removed").await;
    assert_closed(p3, "e/f moved away from its old port").await;
    check(p2, ("c", "d"), 3, true).await;
    check(p3b, ("e", "f"), 7, true).await;
    check(p4, ("g", "h"), 0, true).await;
    hc.set(&format!(
        "{services}{}{}{}",
        slice("c", "d", 3, READY),
        slice("e", "f", 7, READY),
        slice("g", "h", 6, READY)
    ));
    check(p4, ("g", "h"), 6, true).await;
    hc.set(&format!(
        "{services}{}{}",
        slice("e", "f", 7, READY),
        slice("g", "h", 6, READY)
    ));
    check(p2, ("c", "d"), 0, true).await;
    check(p3b, ("e", "f"), 7, true).await;
    check(p4, ("g", "h"), 6, true).await;

    // The proxy itself unhealthy: every port answers 503, counts unchanged.
    hc.health.queued_update(Family::V4, ago(LATE));
    check(p2, ("c", "d"), 0, false).await;
    check(p3b, ("e", "f"), 7, false).await;
    check(p4, ("g", "h"), 6, false).await;
    hc.health.updated(Family::V4, SystemTime::now());
    check(p2, ("c", "d"), 0, true).await;
    check(p3b, ("e", "f"), 7, true).await;
    check(p4, ("g", "h"), 6, true).await;
}

#[tokio::test]
async fn terminating_local_endpoints_do_not_count() {
    // IPVS Test_HealthCheckNodePortWhenTerminating: local ready endpoints count; once every
    // local endpoint is terminating (serving or not) the count is 0 and the port says 503.
    let port = free_port();
    let mut hc = ServiceHealth::new(Some(vec![LOOPBACK]));
    let svc = lb_service("ns1", "svc1", port);
    hc.set(&format!("{svc}{}", slice("ns1", "svc1", 2, READY)));
    check(port, ("ns1", "svc1"), 2, true).await;
    hc.set(&format!(
        "{svc}{}",
        slice("ns1", "svc1", 2, (false, true, true))
    ));
    check(port, ("ns1", "svc1"), 0, true).await;
    hc.set(&format!(
        "{svc}{}",
        slice("ns1", "svc1", 2, (false, false, true))
    ));
    check(port, ("ns1", "svc1"), 0, true).await;
}

#[tokio::test]
async fn health_check_node_ports_listen_only_on_the_selected_addresses() {
    // TestServerWithSelectiveListeningAddress: with nodePortAddresses limiting the
    // addresses, the server listens on 127.0.0.1 only; 127.0.0.2 (also loopback) is not
    // served.
    let port = free_port();
    let mut hc = ServiceHealth::new(Some(vec![LOOPBACK]));
    hc.set(&lb_service("a", "b", port));
    check(port, ("a", "b"), 0, true).await;
    let other = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), port);
    assert!(closed(other).await, "{other} must not be served");
}
