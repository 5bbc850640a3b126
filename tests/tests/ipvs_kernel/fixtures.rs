// SPDX-License-Identifier: Apache-2.0
//! Fixtures of the IPVS kernel tests: namespaces (a node, two pods behind veth pairs
//! serving TCP), the model fed through the real trackers, and readers of the kernel's
//! state (IPVS over netlink, ipset, iptables-save).

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
use proxy_agent::model::{EndpointsChangeTracker, IpFamily, NamespacedName, ServiceChangeTracker};
use proxy_agent::node::{LocalDetector, NodeAddresses};
use proxy_agent::proxier::ipvs::IpvsConfig;
use proxy_agent::proxier::ipvs::IpvsSocket;
use proxy_agent::proxier::netlink::RouteSocket;
use proxy_agent::proxier::{FamilyState, NodeContext, Proxier, StaleConntrack, SyncRequest};
use tests::privileged::TempNetns;

pub const VIP: &str = "10.96.0.10";

pub fn sh(ns: &TempNetns, script: &str) -> String {
    let out = ns.sh(script);
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Why this kernel cannot run the test, if it cannot (checked in a fresh namespace).
pub fn ipvs_missing(test: &str) -> Option<String> {
    let ns = TempNetns::new(&format!("probe-{test}"));
    ns.run(|| match IpvsSocket::open() {
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
pub struct World {
    pub node: NodeContext,
    families: Vec<FamilyState>,
    trackers: Vec<(ServiceChangeTracker, EndpointsChangeTracker)>,
    objects: HashMap<NamespacedName, ClusterObject>,
}

impl World {
    /// A node whose pods sit behind `10.0.{1,2}.1` (IPv4) or `fd00:{1,2}::1` (IPv6).
    pub fn new(family: IpFamily) -> Self {
        let [a, b] = node_ips(family);
        let node = NodeContext {
            name: "test-node".into(),
            primary_ips: match family {
                IpFamily::V4 => NodeAddresses {
                    v4: Some(a.parse().unwrap()),
                    v6: None,
                },
                IpFamily::V6 => NodeAddresses {
                    v4: None,
                    v6: Some(a.parse().unwrap()),
                },
            },
            host_addresses: vec![a.parse().unwrap(), b.parse().unwrap()],
            local_detector: LocalDetector::None,
            masquerade_bit: 14,
            ..Default::default()
        };
        Self {
            node,
            families: vec![FamilyState::new(family)],
            trackers: vec![(
                ServiceChangeTracker::new(family),
                EndpointsChangeTracker::new(family, "test-node"),
            )],
            objects: HashMap::new(),
        }
    }

    /// Adds, replaces (`yaml`) or deletes (`delete`) objects; returns what changed.
    pub fn apply(&mut self, yaml: &str, delete: &[&str]) -> HashSet<NamespacedName> {
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

    pub fn sync(&self, proxier: &mut dyn Proxier, full: bool, changed: &HashSet<NamespacedName>) {
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

pub fn node_ips(family: IpFamily) -> [&'static str; 2] {
    match family {
        IpFamily::V4 => ["10.0.1.1", "10.0.2.1"],
        IpFamily::V6 => ["fd00:1::1", "fd00:2::1"],
    }
}

pub fn pod_ips(family: IpFamily) -> [&'static str; 2] {
    match family {
        IpFamily::V4 => ["10.0.1.2", "10.0.2.2"],
        IpFamily::V6 => ["fd00:1::2", "fd00:2::2"],
    }
}

pub fn vip(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => VIP,
        IpFamily::V6 => "fd00:96::10",
    }
}

pub fn service(family: IpFamily) -> String {
    let ip = vip(family);
    format!(
        "
- apiVersion: v1
  kind: Service
  metadata: {{name: web, namespace: ns}}
  spec:
    type: NodePort
    clusterIP: '{ip}'
    clusterIPs: ['{ip}']
    ipFamilies: [{family}]
    ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}}]
"
    )
}

pub fn slice(family: IpFamily, ips: &[&str]) -> String {
    let endpoints: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{addresses: ['{ip}'], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: web-1, namespace: ns, labels: {{kubernetes.io/service-name: web}}}}
  addressType: {family}
  endpoints: [{}]
  ports: [{{name: http, port: 8080, protocol: TCP}}]
",
        endpoints.join(", ")
    )
}

/// A node namespace with two pod namespaces behind veth pairs, each pod serving TCP
/// on port 8080 with its name.
pub struct Cluster {
    pub node: TempNetns,
    pods: [TempNetns; 2],
    backends: Vec<Backend>,
}

impl Cluster {
    pub fn new(family: IpFamily, tag: &str) -> Self {
        let node = TempNetns::new(&format!("ipvs-{tag}-node"));
        let pods = [
            TempNetns::new(&format!("ipvs-{tag}-pod1")),
            TempNetns::new(&format!("ipvs-{tag}-pod2")),
        ];
        let (hosts, pod_ips) = (node_ips(family), pod_ips(family));
        let (prefix, nodad) = match family {
            IpFamily::V4 => (24, ""),
            IpFamily::V6 => (64, " nodad"),
        };
        for (i, pod) in pods.iter().enumerate() {
            let host_if = format!("vh{}", i + 1);
            let (host, pod_ip) = (hosts[i], pod_ips[i]);
            sh(
                &node,
                &format!(
                    "ip link add {host_if} type veth peer name eth0 netns {pod} && \
                     ip addr add {host}/{prefix} dev {host_if}{nodad} && ip link set {host_if} up && \
                     sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.{host_if}.rp_filter=0 \
                     net.ipv6.conf.all.forwarding=1",
                    pod = pod.name
                ),
            );
            sh(
                pod,
                &format!(
                    "ip addr add {pod_ip}/{prefix} dev eth0{nodad} && ip link set eth0 up && \
                     ip route add default via {host}"
                ),
            );
        }
        let backends = vec![
            Backend::start(&pods[0], pod_ips[0], "pod1"),
            Backend::start(&pods[1], pod_ips[1], "pod2"),
        ];
        Self {
            node,
            pods,
            backends,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The listeners go before their namespaces.
        self.backends.clear();
        let _ = &self.pods;
    }
}

/// A TCP server in a pod namespace answering with its name, until dropped.
pub struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    pub fn start(ns: &TempNetns, ip: &str, name: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = SocketAddr::new(ip.parse().unwrap(), 8080);
        let path = ns.path();
        let flag = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            setns(File::open(path).unwrap(), CloneFlags::CLONE_NEWNET).unwrap();
            let listener = TcpListener::bind(addr).unwrap();
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

/// One connection to `ip`:`port`; the name of the backend that answered.
pub fn ask(ip: &str, port: u16) -> String {
    let addr = SocketAddr::new(ip.parse().unwrap(), port);
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

/// (virtual servers, real servers of the VIP with weights) as the kernel lists them.
pub fn read_back(ipvs: &mut IpvsSocket, vip: &str) -> (BTreeSet<String>, BTreeSet<(String, u32)>) {
    let services = ipvs.services().unwrap();
    let names = services
        .iter()
        .map(|s| format!("{} {}", s.key, s.scheduler))
        .collect();
    let vip = services
        .iter()
        .find(|s| s.key.addr.to_string() == vip)
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

pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

pub fn ipvs_config() -> IpvsConfig {
    IpvsConfig {
        scheduler: "rr".into(),
        ..Default::default()
    }
}

pub fn ipset_save() -> String {
    String::from_utf8(Command::new("ipset").arg("save").output().unwrap().stdout).unwrap()
}

pub fn iptables_save(family: IpFamily, table: &str) -> String {
    let program = match family {
        IpFamily::V4 => "iptables-save",
        IpFamily::V6 => "ip6tables-save",
    };
    let out = Command::new(program).args(["-t", table]).output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// No virtual server, kube-ipvs0, KUBE ipset or KUBE iptables chain in this namespace.
pub fn assert_nothing_left(ipvs: &mut IpvsSocket, route: &mut RouteSocket) {
    assert!(ipvs.services().unwrap().is_empty());
    assert_eq!(route.link_index("kube-ipvs0").unwrap(), None);
    let sets = ipset_save();
    assert!(!sets.contains("KUBE-"), "{sets}");
    for family in [IpFamily::V4, IpFamily::V6] {
        for table in ["nat", "filter", "mangle"] {
            let saved = iptables_save(family, table);
            assert!(!saved.contains("KUBE-"), "{family} {table}: {saved}");
        }
    }
}
