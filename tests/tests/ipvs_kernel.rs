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
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use proxy_agent::cleanup::{cleanup_all, cleanup_other_modes};
use proxy_agent::config::ProxyMode;
use proxy_agent::k8s::convert::{ClusterObject, parse_objects};
use proxy_agent::model::Protocol;
use proxy_agent::model::{EndpointsChangeTracker, IpFamily, NamespacedName, ServiceChangeTracker};
use proxy_agent::node::{LocalDetector, NodeAddresses, ProcSysctl};
use proxy_agent::proxier::iptables::{IptablesConfig, IptablesProxier};
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
fn ipvs_missing(test: &str) -> Option<String> {
    let ns = TempNetns::new(&format!("probe-{test}"));
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
    /// A node whose pods sit behind `10.0.{1,2}.1` (IPv4) or `fd00:{1,2}::1` (IPv6).
    fn new(family: IpFamily) -> Self {
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

    fn sync(&self, proxier: &mut dyn Proxier, full: bool, changed: &HashSet<NamespacedName>) {
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

fn node_ips(family: IpFamily) -> [&'static str; 2] {
    match family {
        IpFamily::V4 => ["10.0.1.1", "10.0.2.1"],
        IpFamily::V6 => ["fd00:1::1", "fd00:2::1"],
    }
}

fn pod_ips(family: IpFamily) -> [&'static str; 2] {
    match family {
        IpFamily::V4 => ["10.0.1.2", "10.0.2.2"],
        IpFamily::V6 => ["fd00:1::2", "fd00:2::2"],
    }
}

fn vip(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => VIP,
        IpFamily::V6 => "fd00:96::10",
    }
}

fn service(family: IpFamily) -> String {
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

fn slice(family: IpFamily, ips: &[&str]) -> String {
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
struct Cluster {
    node: TempNetns,
    pods: [TempNetns; 2],
    backends: Vec<Backend>,
}

impl Cluster {
    fn new(family: IpFamily, tag: &str) -> Self {
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
                     sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.{host_if}.rp_filter=0",
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
struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    fn start(ns: &TempNetns, ip: &str, name: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = SocketAddr::new(ip.parse().unwrap(), 8080);
        let path = ns.path();
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

/// One connection to `ip`:`port`; the name of the backend that answered.
fn ask(ip: &str, port: u16) -> String {
    let addr = SocketAddr::new(ip.parse().unwrap(), port);
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
}

/// (virtual servers, real servers of the VIP with weights) as the kernel lists them.
fn read_back(ipvs: &mut IpvsSocket, vip: &str) -> (BTreeSet<String>, BTreeSet<(String, u32)>) {
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

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn ipvs_config() -> IpvsConfig {
    IpvsConfig {
        scheduler: "rr".into(),
        ..Default::default()
    }
}

fn ipset_save() -> String {
    String::from_utf8(Command::new("ipset").arg("save").output().unwrap().stdout).unwrap()
}

fn iptables_save(family: IpFamily, table: &str) -> String {
    let program = match family {
        IpFamily::V4 => "iptables-save",
        IpFamily::V6 => "ip6tables-save",
    };
    let out = Command::new(program).args(["-t", table]).output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// Sync, read back, connect, change endpoints, delete, clean up: one family.
fn proxier_lifecycle(family: IpFamily, tag: &str) {
    let cluster = Cluster::new(family, tag);
    let (vip, [node_a, node_b], [pod1, pod2]) = (vip(family), node_ips(family), pod_ips(family));
    let sets = |name: &str| match family {
        IpFamily::V4 => name.to_string(),
        IpFamily::V6 => name.replacen("KUBE-", "KUBE-6-", 1),
    };
    let mut world = World::new(family);
    let changed = world.apply(
        &format!("{}{}", service(family), slice(family, &[pod1, pod2])),
        &[],
    );
    in_netns(&cluster.node, || {
        let mut proxier = IpvsProxier::new(ipvs_config(), &mut ProcSysctl::default())
            .expect("ipvs proxier starts");
        let mut ipvs = IpvsSocket::open().unwrap();
        world.sync(&mut proxier, true, &changed);

        // Read back: the ClusterIP and the NodePort on both node addresses.
        let (services, dests) = read_back(&mut ipvs, vip);
        let addr = |ip: &str, port: u16| SocketAddr::new(ip.parse().unwrap(), port).to_string();
        assert_eq!(
            services,
            set(&[
                &format!("TCP {} rr", addr(node_a, 30080)),
                &format!("TCP {} rr", addr(node_b, 30080)),
                &format!("TCP {} rr", addr(vip, 80)),
            ])
        );
        assert_eq!(
            dests,
            [(addr(pod1, 8080), 1), (addr(pod2, 8080), 1)]
                .into_iter()
                .collect()
        );
        let mut route = RouteSocket::open().unwrap();
        let index = route.link_index("kube-ipvs0").unwrap().expect("kube-ipvs0");
        assert_eq!(
            route.addresses(index).unwrap(),
            vec![vip.parse::<std::net::IpAddr>().unwrap()]
        );
        let saved = ipset_save();
        for entry in [
            format!("add {} {vip},tcp:80", sets("KUBE-CLUSTER-IP")),
            format!("add {} 30080", sets("KUBE-NODE-PORT-TCP")),
            format!("add {} {vip}", sets("KUBE-IPVS-IPS")),
            format!("add {} {pod1},tcp:8080,{pod1}", sets("KUBE-LOOP-BACK")),
        ] {
            assert!(saved.contains(&entry), "{entry} in {saved}");
        }
        if let Ok(out) = Command::new("ipvsadm").arg("-Ln").output() {
            println!(
                "{family}: ipvsadm -Ln after the first sync:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }

        // Real connections through the VIP reach both backends (round robin).
        let answers: Vec<String> = (0..4).map(|_| ask(vip, 80)).collect();
        println!("{family}: answers through the VIP: {answers:?}");
        assert_eq!(
            answers.iter().cloned().collect::<BTreeSet<_>>(),
            set(&["pod1", "pod2"])
        );
        // And through a NodePort.
        let via_nodeport = ask(node_b, 30080);
        assert!(via_nodeport == "pod1" || via_nodeport == "pod2");

        // pod1 leaves: a partial sync; its closed connections (TIME_WAIT) keep it
        // draining with weight 0, and new connections only reach pod2.
        let changed = world.apply(&slice(family, &[pod2]), &[]);
        world.sync(&mut proxier, false, &changed);
        let (_, dests) = read_back(&mut ipvs, vip);
        let pod1_entry = dests.iter().find(|(rs, _)| *rs == addr(pod1, 8080));
        assert!(
            pod1_entry.is_none_or(|(_, weight)| *weight == 0),
            "removed real server is gone or draining: {dests:?}"
        );
        assert!(dests.contains(&(addr(pod2, 8080), 1)));
        if pod1_entry.is_some() {
            // Only where pod1 had connections: the VIP's.
            let key = ServiceKey {
                addr: vip.parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            };
            let server = RealServer {
                addr: pod1.parse().unwrap(),
                port: 8080,
            };
            assert!(proxier.draining().contains(&key, &server));
        }
        let answers: Vec<String> = (0..3).map(|_| ask(vip, 80)).collect();
        assert_eq!(answers, vec!["pod2"; 3]);

        // The service goes: its virtual servers and its address go too.
        let changed = world.apply("[]", &["web", "web-1"]);
        world.sync(&mut proxier, false, &changed);
        let (services, _) = read_back(&mut ipvs, vip);
        assert!(services.is_empty(), "{services:?}");
        assert!(route.addresses(index).unwrap().is_empty());

        // Cleanup leaves nothing of the mode.
        world.apply(
            &format!("{}{}", service(family), slice(family, &[pod2])),
            &[],
        );
        world.sync(&mut proxier, true, &HashSet::new());
        let report = cleanup::cleanup(&[], false).expect("cleanup");
        assert!(
            report.virtual_servers >= 3 && report.link && report.sets > 0,
            "{report:?}"
        );
        assert_nothing_left(&mut ipvs, &mut route);
        let again = cleanup::cleanup(&[], false).expect("second cleanup");
        assert_eq!(again.total(), 0, "{again:?}");
    });
}

/// No virtual server, kube-ipvs0, KUBE ipset or KUBE iptables chain in this namespace.
fn assert_nothing_left(ipvs: &mut IpvsSocket, route: &mut RouteSocket) {
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

/// Skips (passing) when the kernel has no IPVS.
macro_rules! require_ipvs {
    ($name:literal) => {
        require_root!();
        if let Some(reason) = ipvs_missing($name) {
            eprintln!(
                "SKIP {} ({}): {reason}; run it in the IPVS guest (cargo xtask vm)",
                module_path!(),
                $name
            );
            return;
        }
    };
}

#[test]
fn ipvs_proxier_on_a_real_kernel_v4() {
    require_ipvs!("ipvs-v4");
    proxier_lifecycle(IpFamily::V4, "v4");
}

#[test]
fn ipvs_proxier_on_a_real_kernel_v6() {
    require_ipvs!("ipvs-v6");
    proxier_lifecycle(IpFamily::V6, "v6");
}

/// ipvs -> iptables -> ipvs on one node, as the agent does when its mode changes: each
/// start removes what the other mode left (seed 002), and the mode that runs works.
#[test]
fn switching_modes_leaves_no_leftovers() {
    require_ipvs!("ipvs-switch");
    let cluster = Cluster::new(IpFamily::V4, "switch");
    let mut world = World::new(IpFamily::V4);
    let [pod1, pod2] = pod_ips(IpFamily::V4);
    let changed = world.apply(
        &format!(
            "{}{}",
            service(IpFamily::V4),
            slice(IpFamily::V4, &[pod1, pod2])
        ),
        &[],
    );
    let no_bpffs = Path::new("/nonexistent-bpffs-root");
    in_netns(&cluster.node, || {
        let mut ipvs = IpvsSocket::open().unwrap();
        let mut route = RouteSocket::open().unwrap();
        let mut proxier = IpvsProxier::new(ipvs_config(), &mut ProcSysctl::default()).unwrap();
        world.sync(&mut proxier, true, &changed);
        assert!(!ipvs.services().unwrap().is_empty());
        drop(proxier);

        // iptables mode starts: the ipvs mode's state goes, iptables serves the VIP.
        let mut iptables = IptablesProxier::new(
            IptablesConfig::default(),
            &world.node,
            &mut ProcSysctl::default(),
        )
        .unwrap();
        cleanup_other_modes(ProxyMode::Iptables, no_bpffs, &[]);
        assert!(ipvs.services().unwrap().is_empty());
        assert_eq!(route.link_index("kube-ipvs0").unwrap(), None);
        assert!(!ipset_save().contains("KUBE-"));
        for table in ["nat", "filter"] {
            let saved = iptables_save(IpFamily::V4, table);
            assert!(
                !saved.contains("KUBE-IPVS")
                    && !saved.contains("KUBE-NODE-PORT")
                    && !saved.contains("--match-set"),
                "{table}: {saved}"
            );
        }
        world.sync(&mut iptables, true, &changed);
        assert!(iptables_save(IpFamily::V4, "nat").contains("KUBE-SVC-"));
        // The VIP is not local any more: route it towards pod2's side so that the
        // iptables DNAT (not IPVS) is what answers.
        Command::new("ip")
            .args(["route", "add", "10.96.0.0/16", "dev", "vh2"])
            .status()
            .unwrap();
        let answer = ask(VIP, 80);
        assert!(answer == "pod1" || answer == "pod2");
        Command::new("ip")
            .args(["route", "del", "10.96.0.0/16", "dev", "vh2"])
            .status()
            .unwrap();
        drop(iptables);

        // And back to ipvs: the iptables mode's own chains go, the shared ones are
        // rewritten by the first sync.
        let mut proxier = IpvsProxier::new(ipvs_config(), &mut ProcSysctl::default()).unwrap();
        cleanup_other_modes(ProxyMode::Ipvs, no_bpffs, &[]);
        for table in ["nat", "filter"] {
            let saved = iptables_save(IpFamily::V4, table);
            for chain in [
                "KUBE-SVC-",
                "KUBE-SEP-",
                "KUBE-EXT-",
                "KUBE-EXTERNAL-SERVICES",
                "KUBE-NODEPORTS",
                "KUBE-PROXY-CANARY",
            ] {
                assert!(!saved.contains(chain), "{table} {chain}: {saved}");
            }
        }
        world.sync(&mut proxier, true, &HashSet::new());
        let answers: BTreeSet<String> = (0..4).map(|_| ask(VIP, 80)).collect();
        assert_eq!(answers, set(&["pod1", "pod2"]));
        assert!(!iptables_save(IpFamily::V4, "filter").contains("KUBE-EXTERNAL-SERVICES"));

        cleanup_all(no_bpffs, &[]);
        assert_nothing_left(&mut ipvs, &mut route);
    });
}
