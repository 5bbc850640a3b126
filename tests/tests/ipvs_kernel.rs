// SPDX-License-Identifier: Apache-2.0
//! The ipvs proxier against a real IPVS kernel, in fresh network namespaces: a "node"
//! namespace runs the proxier (a thread `setns`-ed into it, so its netlink sockets,
//! ipset/iptables commands and sysctls act there) and two "pod" namespaces behind veth
//! pairs serve TCP. Checks: the virtual and real servers read back over netlink, the
//! sets, kube-ipvs0's addresses, real connections through the VIP spread over both
//! backends, an endpoint change (the removed backend drains, new connections avoid it),
//! a deleted service, and a cleanup that leaves nothing.
//!
//! This machine's kernel may have no IPVS (the CI host has none): the test then prints
//! why and passes as skipped. It runs for real in the qemu guest
//! (`cargo xtask vm -- <test binary>`, see ../shared/ipvs-vm.md).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use proxy_agent::k8s::convert::{ClusterObject, parse_objects};
use proxy_agent::model::Protocol;
use proxy_agent::model::{EndpointsChangeTracker, IpFamily, NamespacedName, ServiceChangeTracker};
use proxy_agent::node::{LocalDetector, NodeAddresses, ProcSysctl};
use proxy_agent::proxier::ipvs::desired::{RealServer, ServiceKey};
use proxy_agent::proxier::ipvs::genl::IpvsSocket;
use proxy_agent::proxier::ipvs::{IpvsConfig, IpvsProxier, cleanup};
use proxy_agent::proxier::netlink::route::RouteSocket;
use proxy_agent::proxier::{FamilyState, NodeContext, Proxier, StaleConntrack, SyncRequest};
use tests::{privileged::TempNetns, require_root};

const VIP: &str = "10.96.0.10";

/// Runs `body` on a thread that lives in `ns`.
fn in_netns<T: Send>(ns: &TempNetns, body: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter(ns);
                body()
            })
            .join()
            .expect("the namespaced thread panicked")
    })
}

fn enter(ns: &TempNetns) {
    let file = File::open(ns.path()).expect("open the namespace");
    setns(file, CloneFlags::CLONE_NEWNET).expect("setns");
}

fn sh(ns: &TempNetns, script: &str) -> String {
    let out = ns.sh(script);
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Why this kernel cannot run the test, if it cannot (checked in a fresh namespace).
fn ipvs_missing() -> Option<String> {
    let ns = TempNetns::new("ipvs-probe");
    in_netns(&ns, || match IpvsSocket::open() {
        Ok(_) => None,
        Err(err) => Some(format!("no IPVS in this kernel ({err})")),
    })
    .or_else(|| {
        Command::new("ipset")
            .arg("version")
            .output()
            .is_err()
            .then(|| "ipset is not installed".to_string())
    })
}

/// The model, fed through the real trackers.
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
                v4: Some("10.0.1.1".parse().unwrap()),
                v6: None,
            },
            host_addresses: vec!["10.0.1.1".parse().unwrap(), "10.0.2.1".parse().unwrap()],
            local_detector: LocalDetector::None,
            masquerade_bit: 14,
            ..Default::default()
        };
        Self {
            node,
            families: vec![FamilyState::new(IpFamily::V4)],
            trackers: vec![(
                ServiceChangeTracker::new(IpFamily::V4),
                EndpointsChangeTracker::new(IpFamily::V4, "test-node"),
            )],
            objects: HashMap::new(),
        }
    }

    /// Adds, replaces (`yaml`) or deletes (`delete`) objects; returns what changed.
    fn apply(&mut self, yaml: &str, delete: &[&str]) -> HashSet<NamespacedName> {
        let mut updates: Vec<(Option<ClusterObject>, Option<ClusterObject>)> = Vec::new();
        for object in parse_objects(yaml).unwrap() {
            let previous = self.objects.insert(object.name(), object.clone());
            updates.push((previous, Some(object)));
        }
        for name in delete {
            let name = NamespacedName::new("ns", *name);
            updates.push((self.objects.remove(&name), None));
        }
        let (services, endpoints) = &mut self.trackers[0];
        for (old, new) in updates {
            match (old, new) {
                (old, Some(ClusterObject::Service(svc))) => {
                    let old = match old {
                        Some(ClusterObject::Service(o)) => Some(o),
                        _ => None,
                    };
                    services.update(old.as_ref(), Some(&svc));
                }
                (Some(ClusterObject::Service(old)), None) => {
                    services.update(Some(&old), None);
                }
                (_, Some(ClusterObject::EndpointSlice(slice))) => {
                    endpoints.endpoint_slice_update(&slice, false);
                }
                (Some(ClusterObject::EndpointSlice(slice)), None) => {
                    endpoints.endpoint_slice_update(&slice, true);
                }
                _ => {}
            }
        }
        let state = &mut self.families[0];
        let mut changed = HashSet::new();
        changed.extend(state.services.apply(services).updated_services);
        changed.extend(state.endpoints.apply(endpoints).updated_services);
        changed
    }

    fn sync(&self, proxier: &mut IpvsProxier, full: bool, changed: &HashSet<NamespacedName>) {
        proxier
            .sync(&SyncRequest {
                families: &self.families,
                node: &self.node,
                full,
                changed,
                stale: &StaleConntrack::default(),
            })
            .expect("sync");
    }
}

const SERVICE: &str = "
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: ns}
  spec:
    type: NodePort
    clusterIP: 10.96.0.10
    clusterIPs: [10.96.0.10]
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
";

fn slice(ips: &[&str]) -> String {
    let endpoints: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{addresses: ['{ip}'], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: web-1, namespace: ns, labels: {{kubernetes.io/service-name: web}}}}
  addressType: IPv4
  endpoints: [{}]
  ports: [{{name: http, port: 8080, protocol: TCP}}]
",
        endpoints.join(", ")
    )
}

/// A TCP server in a pod namespace answering with its name, until dropped.
struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    fn start(ns: &TempNetns, ip: &str, name: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (path, addr) = (ns.path(), format!("{ip}:8080"));
        let flag = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            setns(File::open(path).unwrap(), CloneFlags::CLONE_NEWNET).unwrap();
            let listener = TcpListener::bind(&addr).unwrap();
            listener.set_nonblocking(true).unwrap();
            ready_tx.send(()).unwrap();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.write_all(name.as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        ready_rx.recv().unwrap();
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One connection to `addr`; the name of the backend that answered.
fn ask(addr: &str) -> String {
    let addr: SocketAddr = addr.parse().unwrap();
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

/// (virtual servers, real servers of the VIP with weights) as the kernel lists them.
fn read_back(ipvs: &mut IpvsSocket) -> (BTreeSet<String>, BTreeSet<(String, u32)>) {
    let services = ipvs.services().unwrap();
    let names = services
        .iter()
        .map(|s| format!("{} {}", s.key, s.scheduler))
        .collect();
    let vip = services
        .iter()
        .find(|s| s.key.addr.to_string() == VIP)
        .map(|s| s.key);
    let dests = match vip {
        Some(key) => ipvs
            .dests(&key)
            .unwrap()
            .iter()
            .map(|d| {
                assert!(d.masquerading, "real servers are NAT");
                (d.server.to_string(), d.weight)
            })
            .collect(),
        None => BTreeSet::new(),
    };
    (names, dests)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn ipvs_proxier_on_a_real_kernel() {
    require_root!();
    if let Some(reason) = ipvs_missing() {
        eprintln!(
            "SKIP ipvs_proxier_on_a_real_kernel: {reason}; run it in the IPVS guest (cargo xtask vm)"
        );
        return;
    }
    let node = TempNetns::new("ipvs-node");
    let pods = [TempNetns::new("ipvs-pod1"), TempNetns::new("ipvs-pod2")];
    for (i, pod) in pods.iter().enumerate() {
        let n = i + 1;
        let host_if = format!("vh{n}-{}", std::process::id() % 100000);
        sh(
            &node,
            &format!(
                "ip link add {host_if} type veth peer name eth0 netns {pod} && \
                 ip addr add 10.0.{n}.1/24 dev {host_if} && ip link set {host_if} up && \
                 sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.{host_if}.rp_filter=0",
                pod = pod.name
            ),
        );
        sh(
            pod,
            &format!(
                "ip addr add 10.0.{n}.2/24 dev eth0 && ip link set eth0 up && \
                 ip route add default via 10.0.{n}.1"
            ),
        );
    }
    let _backends = [
        Backend::start(&pods[0], "10.0.1.2", "pod1"),
        Backend::start(&pods[1], "10.0.2.2", "pod2"),
    ];

    let mut world = World::new();
    let changed = world.apply(
        &format!("{SERVICE}{}", slice(&["10.0.1.2", "10.0.2.2"])),
        &[],
    );
    in_netns(&node, || {
        let config = IpvsConfig {
            scheduler: "rr".into(),
            ..Default::default()
        };
        let mut proxier =
            IpvsProxier::new(config, &mut ProcSysctl::default()).expect("ipvs proxier starts");
        let mut ipvs = IpvsSocket::open().unwrap();
        world.sync(&mut proxier, true, &changed);

        // Read back: the ClusterIP and the NodePort on both node addresses.
        let (services, dests) = read_back(&mut ipvs);
        assert_eq!(
            services,
            set(&[
                "TCP 10.0.1.1:30080 rr",
                "TCP 10.0.2.1:30080 rr",
                "TCP 10.96.0.10:80 rr"
            ])
        );
        assert_eq!(
            dests,
            [
                ("10.0.1.2:8080".to_string(), 1),
                ("10.0.2.2:8080".to_string(), 1)
            ]
            .into_iter()
            .collect()
        );
        let mut route = RouteSocket::open().unwrap();
        let index = route.link_index("kube-ipvs0").unwrap().expect("kube-ipvs0");
        assert_eq!(
            route.addresses(index).unwrap(),
            vec![VIP.parse::<std::net::IpAddr>().unwrap()]
        );
        let sets =
            String::from_utf8(Command::new("ipset").arg("save").output().unwrap().stdout).unwrap();
        assert!(
            sets.contains("add KUBE-CLUSTER-IP 10.96.0.10,tcp:80"),
            "{sets}"
        );
        assert!(sets.contains("add KUBE-NODE-PORT-TCP 30080"), "{sets}");
        assert!(sets.contains("add KUBE-IPVS-IPS 10.96.0.10"), "{sets}");
        if let Ok(out) = Command::new("ipvsadm").arg("-Ln").output() {
            println!(
                "ipvsadm -Ln after the first sync:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }

        // Real connections through the VIP reach both backends (round robin).
        let answers: Vec<String> = (0..4).map(|_| ask("10.96.0.10:80")).collect();
        println!("answers through the VIP: {answers:?}");
        assert_eq!(
            answers.iter().cloned().collect::<BTreeSet<_>>(),
            set(&["pod1", "pod2"])
        );
        // And through a NodePort.
        let via_nodeport = ask("10.0.2.1:30080");
        assert!(via_nodeport == "pod1" || via_nodeport == "pod2");

        // pod1 leaves: a partial sync; its closed connections (TIME_WAIT) keep it
        // draining with weight 0, and new connections only reach pod2.
        let changed = world.apply(&slice(&["10.0.2.2"]), &[]);
        world.sync(&mut proxier, false, &changed);
        let (_, dests) = read_back(&mut ipvs);
        let pod1 = dests.iter().find(|(rs, _)| rs == "10.0.1.2:8080");
        assert!(
            pod1.is_none_or(|(_, weight)| *weight == 0),
            "removed real server is gone or draining: {dests:?}"
        );
        assert!(dests.contains(&("10.0.2.2:8080".to_string(), 1)));
        if pod1.is_some() {
            // Only where pod1 had connections: the VIP's; the NodePorts' went at once.
            let vip = ServiceKey {
                addr: VIP.parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            };
            let server = RealServer {
                addr: "10.0.1.2".parse().unwrap(),
                port: 8080,
            };
            assert!(proxier.draining().contains(&vip, &server));
        }
        let answers: Vec<String> = (0..3).map(|_| ask("10.96.0.10:80")).collect();
        assert_eq!(answers, vec!["pod2"; 3]);

        // The service goes: its virtual servers and its address go too.
        let changed = world.apply("[]", &["web", "web-1"]);
        world.sync(&mut proxier, false, &changed);
        let (services, _) = read_back(&mut ipvs);
        assert!(services.is_empty(), "{services:?}");
        assert!(route.addresses(index).unwrap().is_empty());

        // Cleanup leaves nothing of the mode.
        world.apply(&format!("{SERVICE}{}", slice(&["10.0.2.2"])), &[]);
        world.sync(&mut proxier, true, &HashSet::new());
        let report = cleanup::cleanup(&[], false).expect("cleanup");
        assert!(
            report.virtual_servers >= 3 && report.link && report.sets > 0,
            "{report:?}"
        );
        let (services, _) = read_back(&mut ipvs);
        assert!(services.is_empty());
        assert_eq!(route.link_index("kube-ipvs0").unwrap(), None);
        let sets = String::from_utf8(
            Command::new("ipset")
                .arg("list")
                .arg("-n")
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(!sets.contains("KUBE-"), "{sets}");
        for table in ["nat", "filter"] {
            let saved = String::from_utf8(
                Command::new("iptables-save")
                    .args(["-t", table])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .unwrap();
            assert!(!saved.contains("KUBE-"), "{table}: {saved}");
        }
        let again = cleanup::cleanup(&[], false).expect("second cleanup");
        assert_eq!(again.total(), 0, "{again:?}");
    });
}
