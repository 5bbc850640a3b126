// SPDX-License-Identifier: Apache-2.0
//! The stale UDP conntrack reconciler: upstream's cleanup_test.go restated case by case
//! (TestCleanStaleEntries, TestPerformanceCleanStaleEntries, TestServiceWithoutEndpoints,
//! TestDeletedUDPServices, TestDeletedUDPServicesIPReuse), then what this project adds
//! (changed frontends, NodePorts on node addresses) and when the reconciler runs.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::fake::{FakeConntrack, entry, udp_entry};
use super::*;
use crate::k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service};
use crate::model::{EndpointsChangeTracker, ServiceChangeTracker};
use crate::model::{FamilyState, StaleConntrack};
use crate::proxier::NodeContext;

const CLUSTER_IP: &str = "172.30.1.1";
const EXTERNAL_IP: &str = "192.168.99.100";
const LOAD_BALANCER_IP: &str = "1.2.3.4";
const SERVING_ENDPOINT: &str = "10.240.0.4";
const NON_SERVING_ENDPOINT: &str = "10.240.1.5";
const DELETED_ENDPOINT: &str = "10.240.2.6";
/// An endpoint that kept its IP but changed port.
const OLD_ENDPOINT_PORT: u16 = 8080;
const ENDPOINT_PORT: u16 = 9090;
const SERVICE_PORT: u16 = 8000;
const NODE_PORT: u16 = 32000;
/// Flows to a service IP on a port no service has: not the proxy's.
const NON_SERVICE_PORT: u16 = 3000;
/// This node's address (NodePorts are reached there)...
const NODE_IP: &str = "192.168.0.2";
/// ...and another host's.
const OTHER_HOST: &str = "192.168.0.77";

const TCP: u8 = IPPROTO_TCP;
const UDP: u8 = IPPROTO_UDP;
const SCTP: u8 = IPPROTO_SCTP;

fn at(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Upstream's test service: the same port number over TCP, UDP (with a NodePort) and SCTP,
/// with an external IP and a load-balancer IP.
fn test_service(name: &str) -> Service {
    mk_service("test", name)
        .type_("LoadBalancer")
        .cluster_ip(CLUSTER_IP)
        .external_ips(&[EXTERNAL_IP])
        .port("test-tcp", SERVICE_PORT.into(), "TCP")
        .node_port("test-udp", SERVICE_PORT.into(), "UDP", NODE_PORT.into())
        .node_port("test-sctp", SERVICE_PORT.into(), "SCTP", NODE_PORT.into())
        .lb_ingress(LOAD_BALANCER_IP, None)
        .build()
}

/// A UDP-only variant (the later upstream tests use one).
fn udp_service(name: &str) -> Service {
    mk_service("test", name)
        .type_("LoadBalancer")
        .cluster_ip(CLUSTER_IP)
        .external_ips(&[EXTERNAL_IP])
        .node_port("test-udp", SERVICE_PORT.into(), "UDP", NODE_PORT.into())
        .lb_ingress(LOAD_BALANCER_IP, None)
        .build()
}

/// A slice of `service` with a serving and a non-serving endpoint on `ports`.
fn test_slice(service: &str, ports: &[&str]) -> EndpointSlice {
    let mut slice = mk_endpointslice("test", &format!("{service}-0"), service, "IPv4")
        .endpoint(mk_endpoint(SERVING_ENDPOINT).conditions(true, true, false))
        .endpoint(mk_endpoint(NON_SERVING_ENDPOINT).conditions(false, false, false));
    for port in ports {
        slice = slice.port(
            &format!("test-{}", port.to_lowercase()),
            ENDPOINT_PORT.into(),
            port,
        );
    }
    slice.build()
}

/// One family's model fed through the real trackers, with what they report.
struct Cluster {
    state: FamilyState,
    services: ServiceChangeTracker,
    endpoints: EndpointsChangeTracker,
    stale: StaleConntrack,
}

impl Cluster {
    fn new(family: IpFamily) -> Self {
        Self {
            state: FamilyState::new(family),
            services: ServiceChangeTracker::new(family),
            endpoints: EndpointsChangeTracker::new(family, "test-worker"),
            stale: StaleConntrack::default(),
        }
    }

    fn service(&mut self, previous: Option<&Service>, current: Option<&Service>) -> &mut Self {
        self.services.update(previous, current);
        self.apply()
    }

    fn slice(&mut self, slice: &EndpointSlice) -> &mut Self {
        self.endpoints.endpoint_slice_update(slice, false);
        self.apply()
    }

    fn apply(&mut self) -> &mut Self {
        let services = self.state.services.apply(&mut self.services);
        let endpoints = self.state.endpoints.apply(&mut self.endpoints);
        self.stale.record(&services, &endpoints);
        self
    }

    /// The report so far, as one sync would get it; starts a new one.
    fn take_stale(&mut self) -> StaleConntrack {
        std::mem::take(&mut self.stale)
    }

    fn frontends(&self, stale: &StaleConntrack) -> UdpFrontends {
        UdpFrontends::new(
            &self.state,
            stale.replaced_udp_ports.iter().map(Arc::as_ref),
            &[NODE_IP.parse().unwrap()],
        )
    }
}

/// Entries with distinct client ports (a real table never holds two entries with one
/// original tuple), sorted the way [`FakeConntrack::entries`] returns them.
#[derive(Default)]
struct Flows {
    all: Vec<Entry>,
    kept: Vec<Entry>,
    next_port: u16,
}

impl Flows {
    fn add(&mut self, protocol: u8, orig_dst: &str, reply_src: &str, kept: bool) {
        self.next_port += 1;
        let client = at("10.0.0.2", 10_000 + self.next_port);
        let e = entry(protocol, &client, orig_dst, reply_src);
        self.all.push(e);
        if kept {
            self.kept.push(e);
        }
    }

    fn expected(&self) -> Vec<Entry> {
        let mut kept = self.kept.clone();
        kept.sort();
        kept
    }
}

/// Runs the decision over `flows` and returns what is left.
fn after_cleanup(frontends: &UdpFrontends, flows: &Flows) -> Vec<Entry> {
    let stale: HashSet<Entry> = stale_udp_entries(frontends, &flows.all)
        .into_iter()
        .copied()
        .collect();
    let mut left: Vec<Entry> = flows
        .all
        .iter()
        .filter(|e| !stale.contains(e))
        .copied()
        .collect();
    left.sort();
    left
}

fn node(addresses: &[&str]) -> NodeContext {
    NodeContext {
        host_addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        ..Default::default()
    }
}

fn request<'a>(
    families: &'a [FamilyState],
    node: &'a NodeContext,
    changed: &'a HashSet<crate::model::NamespacedName>,
    stale: &'a StaleConntrack,
) -> SyncRequest<'a> {
    SyncRequest {
        families,
        node,
        full: false,
        changed,
        stale,
    }
}

/// TestCleanStaleEntries: every UDP flow to a service IP:port or to the NodePort that is not
/// translated to a serving endpoint (IP and port) goes; TCP, SCTP, other ports stay.
#[test]
fn clean_stale_entries() {
    let mut cluster = Cluster::new(IpFamily::V4);
    cluster
        .service(None, Some(&test_service("cleanup-test")))
        .slice(&test_slice("cleanup-test", &["TCP", "UDP", "SCTP"]));
    // The model the test relies on.
    assert_eq!(cluster.state.services.len(), 3);
    assert_eq!(cluster.state.endpoints.len(), 3);
    for endpoints in cluster.state.endpoints.values() {
        let serving: Vec<bool> = endpoints.iter().map(|e| e.serving).collect();
        assert_eq!(serving, [true, false]);
    }

    let service_ips = [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP];
    let mut flows = Flows::default();
    // The endpoint changed port, keeping its IP: the old flows are stale.
    for ip in service_ips {
        flows.add(
            UDP,
            &at(ip, SERVICE_PORT),
            &at(SERVING_ENDPOINT, OLD_ENDPOINT_PORT),
            false,
        );
    }
    for endpoint in [SERVING_ENDPOINT, NON_SERVING_ENDPOINT, DELETED_ENDPOINT] {
        for protocol in [TCP, UDP, SCTP] {
            for ip in service_ips {
                for port in [SERVICE_PORT, NON_SERVICE_PORT] {
                    let stale =
                        protocol == UDP && port == SERVICE_PORT && endpoint != SERVING_ENDPOINT;
                    flows.add(
                        protocol,
                        &at(ip, port),
                        &at(endpoint, ENDPOINT_PORT),
                        !stale,
                    );
                }
            }
            // *:NodePort (here: on the node's address).
            let stale = protocol == UDP && endpoint != SERVING_ENDPOINT;
            flows.add(
                protocol,
                &at(NODE_IP, NODE_PORT),
                &at(endpoint, ENDPOINT_PORT),
                !stale,
            );
        }
    }
    // Not translated at all (a proxy without REJECT rules leaves these): the reply comes
    // from the service IP itself. Stale on the service port only.
    for ip in service_ips {
        for port in [SERVICE_PORT, NON_SERVICE_PORT] {
            flows.add(UDP, &at(ip, port), &at(ip, port), port != SERVICE_PORT);
        }
    }

    // Through the reconciler, as a proxier runs it: the reported count is the metric's.
    let stale = cluster.take_stale();
    assert!(stale.cleanup_required());
    let fake = FakeConntrack::with(flows.all.clone());
    let mut reconciler = UdpConntrackReconciler::new(Box::new(fake.clone()));
    let families = [cluster.state];
    let node = node(&[NODE_IP]);
    let changed = HashSet::new();
    let reports = reconciler.after_sync(&request(&families, &node, &changed, &stale));
    assert_eq!(fake.entries(), flows.expected());
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].family, IpFamily::V4);
    assert_eq!(reports[0].deleted, flows.all.len() - flows.kept.len());
}

/// TestPerformanceCleanStaleEntries: a table full of UDP flows to the external IP on
/// other ports costs one listing and one delete per stale entry, nothing else.
#[test]
fn performance_clean_stale_entries() {
    let mut cluster = Cluster::new(IpFamily::V4);
    cluster
        .service(None, Some(&udp_service("cleanup-test")))
        .slice(&test_slice("cleanup-test", &["UDP"]));
    let mut all = vec![
        udp_entry(
            "10.0.0.2:1",
            &at(EXTERNAL_IP, SERVICE_PORT),
            &at(SERVING_ENDPOINT, ENDPOINT_PORT),
        ),
        udp_entry(
            "10.0.0.2:2",
            &at(EXTERNAL_IP, SERVICE_PORT),
            &at(DELETED_ENDPOINT, ENDPOINT_PORT),
        ),
    ];
    let (mut expected_kept, mut expected_deleted) = (1, 1);
    // Deterministic pseudo-random destination ports (a linear congruential generator).
    let mut seed: u32 = 12345;
    for i in 0..200_000u32 {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let port = (seed >> 16) as u16;
        if port == SERVICE_PORT {
            expected_deleted += 1;
        } else {
            expected_kept += 1;
        }
        let client = format!("10.{}.{}.{}:7", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff);
        all.push(udp_entry(
            &client,
            &at(EXTERNAL_IP, port),
            &at(DELETED_ENDPOINT, ENDPOINT_PORT),
        ));
    }
    let stale = cluster.take_stale();
    let fake = FakeConntrack::with(all);
    let mut reconciler = UdpConntrackReconciler::new(Box::new(fake.clone()));
    let families = [cluster.state];
    let node = node(&[NODE_IP]);
    let changed = HashSet::new();
    let reports = reconciler.after_sync(&request(&families, &node, &changed, &stale));
    assert_eq!(reports[0].deleted, expected_deleted);
    let table = fake.table();
    assert_eq!(table.entries.len(), expected_kept);
    assert_eq!(table.lists, 1);
    assert_eq!(table.deletes, expected_deleted);
}

/// TestServiceWithoutEndpoints (upstream PR 139629): with no serving endpoint, every UDP
/// flow to the service's IPs goes, whichever endpoint it was translated to.
#[test]
fn service_without_endpoints() {
    let mut cluster = Cluster::new(IpFamily::V4);
    // The slice belongs to another service: this one has no endpoints.
    cluster
        .service(None, Some(&udp_service("cleanup-test")))
        .slice(&test_slice("non-existing-service", &["UDP"]));
    let stale = cluster.take_stale();
    let frontends = cluster.frontends(&stale);

    let mut flows = Flows::default();
    for ip in [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP] {
        for endpoint in [SERVING_ENDPOINT, DELETED_ENDPOINT] {
            flows.add(
                UDP,
                &at(ip, SERVICE_PORT),
                &at(endpoint, ENDPOINT_PORT),
                false,
            );
        }
    }
    let deleted = at(DELETED_ENDPOINT, ENDPOINT_PORT);
    // Not a service frontend, not UDP: kept.
    flows.add(UDP, &at(EXTERNAL_IP, NON_SERVICE_PORT), &deleted, true);
    flows.add(TCP, &at(EXTERNAL_IP, SERVICE_PORT), &deleted, true);
    // Divergence: upstream keeps every *:NodePort flow of a service without endpoints
    // (matching on the port alone would hit other hosts' flows). Matching the node's own
    // addresses only, the NodePort's flows are cleaned like the others'...
    flows.add(UDP, &at(NODE_IP, NODE_PORT), &deleted, false);
    // ...and another host's flow to that port number is left alone, as upstream wants.
    flows.add(UDP, &at(OTHER_HOST, NODE_PORT), &deleted, true);
    assert_eq!(after_cleanup(&frontends, &flows), flows.expected());
}

/// TestDeletedUDPServices (upstream PR 141371): the frontends of a deleted service are no
/// longer in the model; its ports are reported, and every flow to them goes.
#[test]
fn deleted_udp_services() {
    let mut cluster = Cluster::new(IpFamily::V4);
    let svc = udp_service("cleanup-test");
    cluster.service(None, Some(&svc));
    cluster.take_stale();
    cluster.service(Some(&svc), None);
    assert!(cluster.state.services.is_empty());
    let stale = cluster.take_stale();
    assert_eq!(stale.replaced_udp_ports.len(), 1);
    let frontends = cluster.frontends(&stale);

    let mut flows = Flows::default();
    for ip in [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP] {
        for endpoint in [SERVING_ENDPOINT, DELETED_ENDPOINT] {
            flows.add(
                UDP,
                &at(ip, SERVICE_PORT),
                &at(endpoint, ENDPOINT_PORT),
                false,
            );
        }
    }
    let deleted = at(DELETED_ENDPOINT, ENDPOINT_PORT);
    flows.add(UDP, &at(EXTERNAL_IP, NON_SERVICE_PORT), &deleted, true);
    flows.add(TCP, &at(EXTERNAL_IP, SERVICE_PORT), &deleted, true);
    // Divergence (see service_without_endpoints): the deleted NodePort is cleaned on the
    // node's addresses, and only there.
    flows.add(UDP, &at(NODE_IP, NODE_PORT), &deleted, false);
    flows.add(UDP, &at(OTHER_HOST, NODE_PORT), &deleted, true);
    assert_eq!(after_cleanup(&frontends, &flows), flows.expected());
}

/// TestDeletedUDPServicesIPReuse: a live service that took over the deleted one's
/// frontends keeps the flows to its serving endpoints.
#[test]
fn deleted_udp_services_ip_reuse() {
    let mut cluster = Cluster::new(IpFamily::V4);
    let svc = udp_service("cleanup-test");
    cluster.service(None, Some(&svc));
    cluster.take_stale();
    cluster.service(Some(&svc), None);
    let reused = udp_service("cleanup-test-reused");
    let slice = mk_endpointslice(
        "test",
        "cleanup-test-reused-0",
        "cleanup-test-reused",
        "IPv4",
    )
    .endpoint(mk_endpoint(SERVING_ENDPOINT).conditions(true, true, false))
    .port("test-udp", ENDPOINT_PORT.into(), "UDP")
    .build();
    cluster.service(None, Some(&reused)).slice(&slice);
    let stale = cluster.take_stale();
    let frontends = cluster.frontends(&stale);

    let mut flows = Flows::default();
    let serving = at(SERVING_ENDPOINT, ENDPOINT_PORT);
    let deleted = at(DELETED_ENDPOINT, ENDPOINT_PORT);
    for ip in [CLUSTER_IP, LOAD_BALANCER_IP, EXTERNAL_IP] {
        flows.add(UDP, &at(ip, SERVICE_PORT), &serving, true);
        flows.add(UDP, &at(ip, SERVICE_PORT), &deleted, false);
    }
    flows.add(UDP, &at(EXTERNAL_IP, NON_SERVICE_PORT), &deleted, true);
    flows.add(TCP, &at(EXTERNAL_IP, SERVICE_PORT), &deleted, true);
    flows.add(UDP, &at(NODE_IP, NODE_PORT), &serving, true);
    flows.add(UDP, &at(NODE_IP, NODE_PORT), &deleted, false);
    assert_eq!(after_cleanup(&frontends, &flows), flows.expected());
}

/// Beyond upstream: a port that changed reports its previous version, so an external IP,
/// an LB IP or a NodePort that went away is cleaned while the frontends it kept are
/// judged by their endpoints.
#[test]
fn frontends_a_changed_port_dropped_are_cleaned() {
    let mut cluster = Cluster::new(IpFamily::V4);
    let before = udp_service("cleanup-test");
    cluster
        .service(None, Some(&before))
        .slice(&test_slice("cleanup-test", &["UDP"]));
    cluster.take_stale();
    // No external IP, no LB IP, another NodePort.
    let after = mk_service("test", "cleanup-test")
        .type_("NodePort")
        .cluster_ip(CLUSTER_IP)
        .node_port("test-udp", SERVICE_PORT.into(), "UDP", 32001)
        .build();
    cluster.service(Some(&before), Some(&after));
    let stale = cluster.take_stale();
    assert!(stale.cleanup_required());
    assert!(!stale.udp_endpoints_changed);
    let frontends = cluster.frontends(&stale);

    let mut flows = Flows::default();
    let serving = at(SERVING_ENDPOINT, ENDPOINT_PORT);
    flows.add(UDP, &at(CLUSTER_IP, SERVICE_PORT), &serving, true);
    flows.add(UDP, &at(EXTERNAL_IP, SERVICE_PORT), &serving, false);
    flows.add(UDP, &at(LOAD_BALANCER_IP, SERVICE_PORT), &serving, false);
    flows.add(UDP, &at(NODE_IP, NODE_PORT), &serving, false);
    flows.add(UDP, &at(NODE_IP, 32001), &serving, true);
    assert_eq!(after_cleanup(&frontends, &flows), flows.expected());
}

/// What the endpoints tracker used to report as deleted UDP endpoints is now decided
/// from the endpoints themselves: an endpoint that stops serving loses its flows, one that
/// terminates while still serving keeps them, a new one needs nothing.
#[test]
fn serving_not_ready_decides() {
    let mut cluster = Cluster::new(IpFamily::V4);
    let svc = udp_service("dns");
    let slice = |endpoints: &[(&str, bool, bool, bool)]| {
        let mut builder = mk_endpointslice("test", "dns-0", "dns", "IPv4").port(
            "test-udp",
            ENDPOINT_PORT.into(),
            "UDP",
        );
        for (ip, ready, serving, terminating) in endpoints {
            builder = builder.endpoint(mk_endpoint(ip).conditions(*ready, *serving, *terminating));
        }
        builder.build()
    };
    cluster.service(None, Some(&svc)).slice(&slice(&[
        ("10.0.1.1", true, true, false),
        ("10.0.1.2", true, true, false),
        ("10.0.1.3", true, true, false),
    ]));
    cluster.take_stale();
    // 10.0.1.1 goes, 10.0.1.2 stops serving, 10.0.1.3 terminates but serves, 10.0.1.4 arrives.
    cluster.slice(&slice(&[
        ("10.0.1.2", false, false, false),
        ("10.0.1.3", false, true, true),
        ("10.0.1.4", true, true, false),
    ]));
    let stale = cluster.take_stale();
    assert!(stale.udp_endpoints_changed);
    assert!(stale.replaced_udp_ports.is_empty());
    let frontends = cluster.frontends(&stale);
    let mut flows = Flows::default();
    for (endpoint, kept) in [
        ("10.0.1.1", false),
        ("10.0.1.2", false),
        ("10.0.1.3", true),
        ("10.0.1.4", true),
    ] {
        flows.add(
            UDP,
            &at(CLUSTER_IP, SERVICE_PORT),
            &at(endpoint, ENDPOINT_PORT),
            kept,
        );
    }
    assert_eq!(after_cleanup(&frontends, &flows), flows.expected());
}

/// Each family is judged by its own model: IPv6 frontends, and replaced ports of the
/// other family ignored.
#[test]
fn families_are_separate() {
    let mut v6 = Cluster::new(IpFamily::V6);
    let svc = mk_service("test", "dns6")
        .cluster_ip("fd00:30::101")
        .node_port("dns", 53, "UDP", 30053)
        .build();
    let slice = mk_endpointslice("test", "dns6-0", "dns6", "IPv6")
        .endpoint(mk_endpoint("fd00:10::1").conditions(true, true, false))
        .port("dns", 53, "UDP")
        .build();
    v6.service(None, Some(&svc)).slice(&slice);
    let mut stale = v6.take_stale();
    let mut v4 = Cluster::new(IpFamily::V4);
    let v4_svc = udp_service("gone");
    v4.service(None, Some(&v4_svc));
    v4.take_stale();
    v4.service(Some(&v4_svc), None);
    stale.merge(v4.take_stale());
    assert_eq!(stale.replaced_udp_ports.len(), 1);

    let frontends = UdpFrontends::new(
        &v6.state,
        stale.replaced_udp_ports.iter().map(Arc::as_ref),
        &["fd00:168:0::2".parse().unwrap(), NODE_IP.parse().unwrap()],
    );
    let mut flows = Flows::default();
    flows.add(UDP, "[fd00:30::101]:53", "[fd00:10::1]:53", true);
    flows.add(UDP, "[fd00:30::101]:53", "[fd00:10::9]:53", false);
    flows.add(UDP, "[fd00:168::2]:30053", "[fd00:10::9]:53", false);
    assert_eq!(after_cleanup(&frontends, &flows), flows.expected());
    assert_eq!(
        frontends.verdict(
            "172.30.1.1:8000".parse().unwrap(),
            "10.240.2.6:9090".parse().unwrap()
        ),
        FlowVerdict::Unknown,
        "the IPv4 service's frontends are not the IPv6 model's"
    );
}

/// The reconciler runs at its first sync and when the trackers report a UDP change; a
/// failed listing makes it run again, with the replaced ports it could not process.
#[test]
fn the_reconciler_runs_when_needed_and_retries() {
    struct Failing(FakeConntrack, bool);
    impl ConntrackTable for Failing {
        fn list(&mut self, family: IpFamily) -> Result<Vec<Entry>> {
            if self.1 {
                self.1 = false;
                return Err(Error::Malformed("test"));
            }
            self.0.list(family)
        }
        fn delete(&mut self, entries: &[Entry]) -> Result<usize> {
            self.0.delete(entries)
        }
    }

    let mut cluster = Cluster::new(IpFamily::V4);
    let svc = udp_service("cleanup-test");
    cluster.service(None, Some(&svc));
    let fake = FakeConntrack::default();
    let mut reconciler = UdpConntrackReconciler::new(Box::new(Failing(fake.clone(), false)));
    let node = node(&[NODE_IP]);
    let changed = HashSet::new();
    let nothing = StaleConntrack::default();

    let families = [std::mem::replace(
        &mut cluster.state,
        FamilyState::new(IpFamily::V4),
    )];
    assert_eq!(
        reconciler
            .after_sync(&request(&families, &node, &changed, &nothing))
            .len(),
        1,
        "the first sync reconciles"
    );
    assert!(
        reconciler
            .after_sync(&request(&families, &node, &changed, &nothing))
            .is_empty(),
        "nothing reported: nothing to do"
    );
    assert_eq!(fake.table().lists, 1);

    // The service goes while the table cannot be listed: its flows go at the next sync,
    // even though that sync reports nothing.
    cluster.state = families.into_iter().next().unwrap();
    cluster.take_stale();
    cluster.service(Some(&svc), None);
    let stale = cluster.take_stale();
    let families = [std::mem::replace(
        &mut cluster.state,
        FamilyState::new(IpFamily::V4),
    )];
    fake.table().entries = vec![udp_entry(
        "10.0.0.2:5000",
        &at(CLUSTER_IP, SERVICE_PORT),
        &at(SERVING_ENDPOINT, ENDPOINT_PORT),
    )];
    let mut failing = UdpConntrackReconciler::new(Box::new(Failing(fake.clone(), true)));
    failing.due = false;
    assert!(
        failing
            .after_sync(&request(&families, &node, &changed, &stale))
            .is_empty()
    );
    assert_eq!(fake.entries().len(), 1);
    let reports = failing.after_sync(&request(&families, &node, &changed, &nothing));
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].deleted, 1);
    assert!(fake.entries().is_empty());
}
