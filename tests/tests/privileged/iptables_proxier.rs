// SPDX-License-Identifier: Apache-2.0
//! The iptables proxier against the real kernel, each test in a fresh network namespace
//! (a thread that `setns`-ed into it runs the proxier, so its iptables commands, netlink
//! sockets and sysctls all act there; the root namespace is never touched): a sync
//! programs the chains and translates real connections, a partial sync swaps one
//! endpoint, a flushed nat table is noticed and repaired, stale UDP conntrack entries are
//! deleted over netlink, and cleanup leaves nothing behind.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::Duration;

use proxy_agent::k8s::convert::{ClusterObject, parse_objects};
use proxy_agent::model::{EndpointsChangeTracker, IpFamily, NamespacedName, ServiceChangeTracker};
use proxy_agent::node::{LocalDetector, NodeAddresses, ProcSysctl};
use proxy_agent::proxier::conntrack::{ConntrackTable, NetlinkConntrack};
use proxy_agent::proxier::iptables::{
    CommandBackend, IptablesConfig, IptablesProxier, cleanup_with,
};
use proxy_agent::proxier::{FamilyState, NodeContext, Proxier, StaleConntrack, SyncRequest};
use tests::{privileged::TempNetns, require_root};

/// A shell command in the calling thread's namespace (children inherit it).
fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The model of both families, fed through the real trackers.
struct World {
    node: NodeContext,
    families: Vec<FamilyState>,
    trackers: Vec<(ServiceChangeTracker, EndpointsChangeTracker)>,
    objects: HashMap<NamespacedName, ClusterObject>,
}

impl World {
    fn new() -> Self {
        let node = NodeContext {
            name: "test-node".into(),
            primary_ips: NodeAddresses {
                v4: Some("192.168.0.2".parse().unwrap()),
                v6: None,
            },
            host_addresses: vec!["192.168.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap()],
            // No detector: clients here use node addresses, and masquerading towards a
            // local (dummy-interface) endpoint would leave through lo, which has no
            // address to masquerade to.
            local_detector: LocalDetector::None,
            masquerade_bit: 14,
            localhost_nodeports: true,
            ..Default::default()
        };
        let trackers = [IpFamily::V4, IpFamily::V6]
            .map(|f| {
                (
                    ServiceChangeTracker::new(f),
                    EndpointsChangeTracker::new(f, "test-node"),
                )
            })
            .into_iter()
            .collect();
        Self {
            node,
            families: vec![
                FamilyState::new(IpFamily::V4),
                FamilyState::new(IpFamily::V6),
            ],
            trackers,
            objects: HashMap::new(),
        }
    }

    /// Adds or replaces objects; returns the changed services and the conntrack report.
    fn apply(&mut self, yaml: &str) -> (HashSet<NamespacedName>, StaleConntrack) {
        for object in parse_objects(yaml).unwrap() {
            let name = object.name();
            let previous = self.objects.insert(name, object.clone());
            for (services, endpoints) in &mut self.trackers {
                match (&object, &previous) {
                    (ClusterObject::Service(svc), Some(ClusterObject::Service(old))) => {
                        services.update(Some(old), Some(svc));
                    }
                    (ClusterObject::Service(svc), _) => {
                        services.update(None, Some(svc));
                    }
                    (ClusterObject::EndpointSlice(slice), _) => {
                        endpoints.endpoint_slice_update(slice, false);
                    }
                    _ => {}
                }
            }
        }
        let mut changed = HashSet::new();
        let mut stale = StaleConntrack::default();
        for (state, (services, endpoints)) in self.families.iter_mut().zip(&mut self.trackers) {
            let s = state.services.apply(services);
            let e = state.endpoints.apply(endpoints);
            stale.record(&s, &e);
            changed.extend(s.updated_services);
            changed.extend(e.updated_services);
        }
        (changed, stale)
    }

    fn sync(
        &self,
        proxier: &mut IptablesProxier,
        full: bool,
        changed: &HashSet<NamespacedName>,
        stale: &StaleConntrack,
    ) {
        proxier
            .sync(&SyncRequest {
                families: &self.families,
                node: &self.node,
                full,
                changed,
                stale,
            })
            .expect("sync");
    }
}

fn service(name: &str, ip: &str, protocol: &str, family: &str) -> String {
    format!(
        "- apiVersion: v1
  kind: Service
  metadata: {{name: {name}, namespace: ns}}
  spec:
    type: ClusterIP
    clusterIP: '{ip}'
    clusterIPs: ['{ip}']
    ipFamilies: [{family}]
    ports: [{{name: p, port: 80, protocol: {protocol}, targetPort: 8080}}]
"
    )
}

fn slice(name: &str, ips: &[&str], protocol: &str, family: &str) -> String {
    let endpoints: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{addresses: ['{ip}'], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {name}-{family}, namespace: ns, labels: {{kubernetes.io/service-name: {name}}}}}
  addressType: {family}
  endpoints: [{}]
  ports: [{{name: p, port: 8080, protocol: {protocol}}}]
",
        endpoints.join(", ")
    )
}

fn proxier() -> IptablesProxier {
    let world = World::new();
    IptablesProxier::new(
        IptablesConfig::default(),
        &world.node,
        &mut ProcSysctl::default(),
    )
    .expect("iptables is usable")
}

/// Endpoint addresses live on an interface of the namespace (one end of a veth pair, the
/// test kernels lack the dummy driver), which also routes the service range: a connection
/// to a ClusterIP is DNATed in OUTPUT to a local address.
fn network() {
    sh("ip link set lo up
        ip link add kpe0 type veth peer name kpe1
        ip link set kpe1 up && ip link set kpe0 up
        ip addr add 192.168.0.2/24 dev kpe0
        ip addr add 10.180.0.1/32 dev kpe0
        ip addr add 10.180.0.2/32 dev kpe0
        ip route add 172.30.0.0/16 dev kpe0");
}

/// Connects to `to` and returns the local address the listener saw the connection on.
fn served_by(to: &str, listeners: &[TcpListener]) -> Option<SocketAddr> {
    let mut stream =
        TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(2)).ok()?;
    stream.write_all(b"x").ok()?;
    for listener in listeners {
        listener.set_nonblocking(true).unwrap();
        for _ in 0..50 {
            if let Ok((mut conn, _)) = listener.accept() {
                let mut byte = [0u8; 1];
                let _ = conn.read(&mut byte);
                return conn.local_addr().ok();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    None
}

fn save(binary: &str) -> String {
    sh(&format!("{binary}-save"))
}

#[test]
fn sync_programs_the_chains_and_translates_connections() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-sync");
    ns.run(|| {
        network();
        let mut world = World::new();
        let mut proxier = proxier();
        let (changed, stale) = world.apply(
            &[
                service("web", "172.30.0.41", "TCP", "IPv4"),
                slice("web", &["10.180.0.1"], "TCP", "IPv4"),
                service("web6", "fd00:30::41", "TCP", "IPv6"),
                slice("web6", &["fd00:10::1"], "TCP", "IPv6"),
            ]
            .concat(),
        );
        world.sync(&mut proxier, true, &changed, &stale);

        let v4 = save("iptables");
        for expected in [
            ":KUBE-SERVICES",
            ":KUBE-NODEPORTS",
            ":KUBE-POSTROUTING",
            ":KUBE-MARK-MASQ",
            ":KUBE-EXTERNAL-SERVICES",
            ":KUBE-FORWARD",
            ":KUBE-PROXY-FIREWALL",
            ":KUBE-PROXY-CANARY",
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
            "--comment \"ns/web:p cluster IP\"",
            "-j DNAT --to-destination 10.180.0.1:8080",
        ] {
            assert!(v4.contains(expected), "{expected} missing from:\n{v4}");
        }
        assert_eq!(v4.matches(":KUBE-SVC-").count(), 1);
        let v6 = save("ip6tables");
        assert!(
            v6.contains("-j DNAT --to-destination [fd00:10::1]:8080"),
            "{v6}"
        );
        assert!(!v6.contains("KUBE-FIREWALL"));

        let listener = TcpListener::bind("10.180.0.1:8080").unwrap();
        assert_eq!(
            served_by("172.30.0.41:80", &[listener]),
            Some("10.180.0.1:8080".parse().unwrap())
        );

        // A second full sync changes nothing and adds no duplicate jump.
        world.sync(
            &mut proxier,
            true,
            &HashSet::new(),
            &StaleConntrack::default(),
        );
        assert_eq!(save("iptables").matches("-j KUBE-SERVICES").count(), 4);
    });
}

#[test]
fn a_partial_sync_swaps_one_endpoint() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-partial");
    ns.run(|| {
        network();
        let mut world = World::new();
        let mut proxier = proxier();
        let (changed, stale) = world.apply(
            &[
                service("web", "172.30.0.41", "TCP", "IPv4"),
                slice("web", &["10.180.0.1"], "TCP", "IPv4"),
                service("other", "172.30.0.42", "TCP", "IPv4"),
                slice("other", &["10.180.0.1"], "TCP", "IPv4"),
            ]
            .concat(),
        );
        world.sync(&mut proxier, true, &changed, &stale);
        let before = save("iptables");

        let (changed, stale) = world.apply(&slice("web", &["10.180.0.2"], "TCP", "IPv4"));
        assert_eq!(changed.len(), 1);
        world.sync(&mut proxier, false, &changed, &stale);
        let input = proxier.last_restore_input(IpFamily::V4).unwrap();
        assert!(
            !input.contains("ns/other:p -> "),
            "unchanged service rewritten:\n{input}"
        );

        let after = save("iptables");
        assert!(after.contains("--to-destination 10.180.0.2:8080"));
        assert_eq!(after.matches(":KUBE-SEP-").count(), 2, "{after}");
        assert_eq!(before.matches(":KUBE-SEP-").count(), 2);

        let listeners = [
            TcpListener::bind("10.180.0.2:8080").unwrap(),
            TcpListener::bind("10.180.0.1:8080").unwrap(),
        ];
        assert_eq!(
            served_by("172.30.0.41:80", &listeners),
            Some("10.180.0.2:8080".parse().unwrap())
        );
        assert_eq!(
            served_by("172.30.0.42:80", &listeners),
            Some("10.180.0.1:8080".parse().unwrap())
        );
    });
}

#[test]
fn a_flushed_nat_table_is_repaired_by_the_next_sync() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-flush");
    ns.run(|| {
        network();
        let mut world = World::new();
        let mut proxier = proxier();
        let (changed, stale) = world.apply(
            &[
                service("web", "172.30.0.41", "TCP", "IPv4"),
                slice("web", &["10.180.0.1"], "TCP", "IPv4"),
            ]
            .concat(),
        );
        world.sync(&mut proxier, true, &changed, &stale);
        let listener = TcpListener::bind("10.180.0.1:8080").unwrap();
        let listeners = [listener];
        assert!(served_by("172.30.0.41:80", &listeners).is_some());
        assert!(!proxier.needs_full_resync());

        sh("iptables -t nat -F");
        assert!(
            served_by("172.30.0.41:80", &listeners).is_none(),
            "flushed: no DNAT"
        );
        assert!(proxier.needs_full_resync(), "the flush is noticed");
        // The runner's next sync, even a partial one with nothing changed, repairs it.
        world.sync(
            &mut proxier,
            false,
            &HashSet::new(),
            &StaleConntrack::default(),
        );
        assert!(served_by("172.30.0.41:80", &listeners).is_some());
        assert!(!proxier.needs_full_resync());

        // A firewall reload deleting every chain is noticed through the canary.
        sh("iptables -t mangle -F && iptables -t mangle -X");
        assert!(proxier.needs_full_resync());
        world.sync(
            &mut proxier,
            false,
            &HashSet::new(),
            &StaleConntrack::default(),
        );
        assert!(save("iptables").contains(":KUBE-PROXY-CANARY"));
    });
}

/// UDP packets to the service from the namespace create conntrack entries; netlink
/// deletion removes exactly the matching ones.
#[test]
fn stale_udp_conntrack_entries_are_deleted_over_netlink() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-ct");
    ns.run(|| {
        network();
        let mut world = World::new();
        let mut proxier = proxier();
        let (changed, stale) = world.apply(
            &[
                service("dns", "172.30.0.53", "UDP", "IPv4"),
                slice("dns", &["10.180.0.1", "10.180.0.2"], "UDP", "IPv4"),
            ]
            .concat(),
        );
        world.sync(&mut proxier, true, &changed, &stale);
        let sockets: Vec<UdpSocket> = (0..8)
            .map(|_| {
                let socket = UdpSocket::bind("192.168.0.2:0").unwrap();
                socket.send_to(b"q", "172.30.0.53:80").unwrap();
                socket
            })
            .collect();
        let mut table = NetlinkConntrack::new();
        let entries = table.list(IpFamily::V4).unwrap();
        let service_ip = "172.30.0.53".parse::<std::net::IpAddr>().unwrap();
        let to_service: Vec<_> = entries
            .iter()
            .filter(|e| e.orig.dst == service_ip)
            .collect();
        assert_eq!(to_service.len(), sockets.len(), "{entries:?}");
        let via_1 = to_service
            .iter()
            .filter(|e| e.reply.src == "10.180.0.1".parse::<std::net::IpAddr>().unwrap())
            .count();

        // Endpoint 10.180.0.1 goes away: the proxier's sync deletes its entries only.
        let (changed, stale) = world.apply(&slice("dns", &["10.180.0.2"], "UDP", "IPv4"));
        assert!(stale.udp_endpoints_changed);
        world.sync(&mut proxier, false, &changed, &stale);
        let left: Vec<_> = table
            .list(IpFamily::V4)
            .unwrap()
            .into_iter()
            .filter(|e| e.orig.dst == service_ip)
            .collect();
        assert_eq!(left.len(), sockets.len() - via_1);
        assert!(
            left.iter()
                .all(|e| e.reply.src == "10.180.0.2".parse::<std::net::IpAddr>().unwrap())
        );

        // And deleting by tuple takes the rest; `conntrack -L` (only to check) agrees.
        let deleted = table.delete(&left).unwrap();
        assert_eq!(deleted, left.len());
        let listed = Command::new("conntrack").args(["-L", "-p", "udp"]).output();
        if let Ok(out) = listed {
            assert!(!String::from_utf8_lossy(&out.stdout).contains("172.30.0.53"));
        }
    });
}

#[test]
fn cleanup_leaves_no_kube_chains_and_can_run_twice() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-clean");
    ns.run(|| {
        network();
        let mut world = World::new();
        let mut proxier = proxier();
        let (changed, stale) = world.apply(
            &[
                service("web", "172.30.0.41", "TCP", "IPv4"),
                slice("web", &["10.180.0.1"], "TCP", "IPv4"),
                service("web6", "fd00:30::41", "TCP", "IPv6"),
                slice("web6", &["fd00:10::1"], "TCP", "IPv6"),
            ]
            .concat(),
        );
        world.sync(&mut proxier, true, &changed, &stale);
        sh("iptables -N OTHER && iptables -A INPUT -j OTHER");
        assert!(save("iptables").contains("KUBE-"));

        let mut backend = CommandBackend::detect().unwrap();
        let report = cleanup_with(&mut backend, &[IpFamily::V4, IpFamily::V6]).unwrap();
        assert!(report.chains_deleted > 0);
        for binary in ["iptables", "ip6tables"] {
            let saved = save(binary);
            assert!(
                !saved.contains("KUBE-"),
                "{binary}-save still has KUBE-:\n{saved}"
            );
        }
        assert!(
            save("iptables").contains("-A INPUT -j OTHER"),
            "other rules stay"
        );
        let again = cleanup_with(&mut backend, &[IpFamily::V4, IpFamily::V6]).unwrap();
        assert_eq!(again.chains_deleted, 0);
    });
}

// The sync benchmark against raw iptables-restore lives in bench/src/sync
// (`cargo xtask bench sync --mode iptables`).
