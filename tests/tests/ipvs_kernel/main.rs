// SPDX-License-Identifier: Apache-2.0
//! The ipvs proxier against a real IPVS kernel, in fresh network namespaces: a "node"
//! namespace runs the proxier (a thread `setns`-ed into it, so its netlink sockets,
//! ipset/iptables commands and sysctls act there) and two "pod" namespaces behind veth
//! pairs serve TCP. Checks: the virtual and real servers read back over netlink, the
//! sets, kube-ipvs0's addresses, real connections through the VIP spread over both
//! backends, an endpoint change (the removed backend drains, new connections avoid it),
//! a deleted service, and a cleanup that leaves nothing — for IPv4 and IPv6; and a node
//! switched from ipvs to iptables mode and back, with no leftovers either way.
//!
//! This machine's kernel may have no IPVS (the CI host has none): the test then prints
//! why and passes as skipped. It runs for real in the qemu guest
//! (`cargo xtask vm -- <test binary>`, see ../shared/ipvs-vm.md).

mod fixtures;

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use fixtures::*;
use proxy_agent::cleanup::{cleanup_all, cleanup_other_modes};
use proxy_agent::config::ProxyMode;
use proxy_agent::model::{IpFamily, Protocol};
use proxy_agent::node::ProcSysctl;
use proxy_agent::proxier::iptables::{IptablesConfig, IptablesProxier};
use proxy_agent::proxier::ipvs::{IpvsProxier, IpvsSocket, RealServer, ServiceKey, cleanup};
use proxy_agent::proxier::netlink::RouteSocket;
use tests::require_root;

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
    cluster.node.run(|| {
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
        let report = cleanup(&[], false).expect("cleanup");
        assert!(
            report.virtual_servers >= 3 && report.link && report.sets > 0,
            "{report:?}"
        );
        assert_nothing_left(&mut ipvs, &mut route);
        let again = cleanup(&[], false).expect("second cleanup");
        assert_eq!(again.total(), 0, "{again:?}");
    });
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
    cluster.node.run(|| {
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
