// SPDX-License-Identifier: Apache-2.0
//! The apply diff against an in-memory IPVS table: creation, edits, removal with
//! graceful termination, partial scopes and excluded ranges.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use nix::errno::Errno;

use crate::model::{IpFamily, Protocol, ServicePortName};
use crate::proxier::ipvs::apply::{Counts, ServiceApply, apply_addresses};
use crate::proxier::ipvs::desired::{DesiredService, RealServer, ServiceKey, VirtualServer};
use crate::proxier::ipvs::genl::RealServerStatus;
use crate::proxier::ipvs::graceful::Draining;
use crate::proxier::ipvs::kernel::{DummyAddresses, IpvsTable};
use crate::proxier::netlink::NetlinkError;

#[derive(Default)]
struct FakeTable {
    services: BTreeMap<ServiceKey, (VirtualServer, BTreeMap<RealServer, RealServerStatus>)>,
    calls: Vec<String>,
}

fn missing() -> NetlinkError {
    NetlinkError::Kernel {
        operation: "fake",
        errno: Errno::ESRCH,
    }
}

impl IpvsTable for FakeTable {
    fn services(&mut self) -> Result<Vec<VirtualServer>, NetlinkError> {
        Ok(self.services.values().map(|(s, _)| s.clone()).collect())
    }
    fn add_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        self.calls.push(format!("add {}", server.key));
        self.services
            .insert(server.key, (server.clone(), BTreeMap::new()));
        Ok(())
    }
    fn edit_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        self.calls.push(format!("edit {}", server.key));
        self.services.get_mut(&server.key).ok_or_else(missing)?.0 = server.clone();
        Ok(())
    }
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), NetlinkError> {
        self.calls.push(format!("delete {key}"));
        self.services.remove(key).map(drop).ok_or_else(missing)
    }
    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<RealServerStatus>, NetlinkError> {
        Ok(self
            .services
            .get(key)
            .ok_or_else(missing)?
            .1
            .values()
            .copied()
            .collect())
    }
    fn add_dest(
        &mut self,
        key: &ServiceKey,
        rs: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError> {
        self.calls.push(format!("add {key} {rs} {weight}"));
        let status = RealServerStatus {
            server: *rs,
            weight,
            masquerading: true,
            active_connections: 0,
            inactive_connections: 0,
        };
        self.services
            .get_mut(key)
            .ok_or_else(missing)?
            .1
            .insert(*rs, status);
        Ok(())
    }
    fn edit_dest(
        &mut self,
        key: &ServiceKey,
        rs: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError> {
        self.calls.push(format!("edit {key} {rs} {weight}"));
        let dests = &mut self.services.get_mut(key).ok_or_else(missing)?.1;
        dests.get_mut(rs).ok_or_else(missing)?.weight = weight;
        Ok(())
    }
    fn delete_dest(&mut self, key: &ServiceKey, rs: &RealServer) -> Result<(), NetlinkError> {
        self.calls.push(format!("delete {key} {rs}"));
        self.services.get_mut(key).ok_or_else(missing)?.1.remove(rs);
        Ok(())
    }
}

fn key(addr: &str, port: u16, protocol: Protocol) -> ServiceKey {
    ServiceKey {
        addr: addr.parse().unwrap(),
        protocol,
        port,
    }
}

fn rs(addr: &str) -> RealServer {
    RealServer {
        addr: addr.parse().unwrap(),
        port: 8080,
    }
}

fn want(key: ServiceKey, servers: &[&str], persistence: Option<u32>) -> DesiredService {
    DesiredService {
        server: VirtualServer {
            key,
            scheduler: "rr".into(),
            persistence_timeout: persistence,
        },
        real_servers: servers.iter().map(|s| rs(s)).collect(),
        owner: ServicePortName::new(
            crate::model::NamespacedName::new("ns", "web"),
            "http",
            key.protocol,
        ),
    }
}

fn run(
    table: &mut FakeTable,
    draining: &mut Draining,
    desired: &[DesiredService],
    scope: Option<&BTreeSet<ServiceKey>>,
    exclude: &[ipnet::IpNet],
) -> Counts {
    let map: BTreeMap<ServiceKey, &DesiredService> =
        desired.iter().map(|d| (d.server.key, d)).collect();
    let mut apply = ServiceApply {
        table,
        draining,
        exclude,
        families: &[IpFamily::V4],
        counts: Counts::default(),
    };
    apply.apply(&map, scope).unwrap();
    apply.counts
}

#[test]
fn create_edit_drain_and_delete() {
    let (mut table, mut draining) = (FakeTable::default(), Draining::default());
    let vip = key("10.96.0.10", 80, Protocol::Tcp);
    let counts = run(
        &mut table,
        &mut draining,
        &[want(vip, &["10.0.0.2", "10.0.0.3"], None)],
        None,
        &[],
    );
    assert_eq!(
        counts,
        Counts {
            written: 3,
            deleted: 0
        }
    );
    assert_eq!(table.services[&vip].1.len(), 2);

    // Nothing changed: nothing written.
    table.calls.clear();
    let counts = run(
        &mut table,
        &mut draining,
        &[want(vip, &["10.0.0.2", "10.0.0.3"], None)],
        None,
        &[],
    );
    assert_eq!(counts, Counts::default());
    assert!(table.calls.is_empty(), "{:?}", table.calls);

    // Affinity turned on: the service is edited; 10.0.0.3 leaves while it carries a
    // connection, so it drains at weight 0.
    table
        .services
        .get_mut(&vip)
        .unwrap()
        .1
        .get_mut(&rs("10.0.0.3"))
        .unwrap()
        .active_connections = 1;
    run(
        &mut table,
        &mut draining,
        &[want(vip, &["10.0.0.2"], Some(60))],
        None,
        &[],
    );
    assert_eq!(table.services[&vip].0.persistence_timeout, Some(60));
    assert_eq!(table.services[&vip].1[&rs("10.0.0.3")].weight, 0);
    assert!(draining.contains(&vip, &rs("10.0.0.3")));

    // Still busy on the next sync (scope without this service): kept.
    let other = key("10.96.0.11", 80, Protocol::Tcp);
    let scope: BTreeSet<ServiceKey> = [other].into_iter().collect();
    run(
        &mut table,
        &mut draining,
        &[want(vip, &["10.0.0.2"], Some(60)), want(other, &[], None)],
        Some(&scope),
        &[],
    );
    assert!(table.services[&vip].1.contains_key(&rs("10.0.0.3")));
    // Its connections end: the next sync deletes it.
    table
        .services
        .get_mut(&vip)
        .unwrap()
        .1
        .get_mut(&rs("10.0.0.3"))
        .unwrap()
        .active_connections = 0;
    run(
        &mut table,
        &mut draining,
        &[want(vip, &["10.0.0.2"], Some(60)), want(other, &[], None)],
        Some(&scope),
        &[],
    );
    assert!(!table.services[&vip].1.contains_key(&rs("10.0.0.3")));
    assert!(draining.is_empty());

    // A draining server that is wanted again gets its weight back.
    table
        .services
        .get_mut(&vip)
        .unwrap()
        .1
        .get_mut(&rs("10.0.0.2"))
        .unwrap()
        .inactive_connections = 2;
    run(
        &mut table,
        &mut draining,
        &[want(vip, &[], Some(60)), want(other, &[], None)],
        None,
        &[],
    );
    assert_eq!(table.services[&vip].1[&rs("10.0.0.2")].weight, 0);
    assert!(draining.contains(&vip, &rs("10.0.0.2")));
    run(
        &mut table,
        &mut draining,
        &[want(vip, &["10.0.0.2"], Some(60)), want(other, &[], None)],
        None,
        &[],
    );
    assert_eq!(table.services[&vip].1[&rs("10.0.0.2")].weight, 1);
    assert!(draining.is_empty());

    // A stale virtual server goes at once, and with it what drained on it.
    table
        .services
        .get_mut(&vip)
        .unwrap()
        .1
        .get_mut(&rs("10.0.0.2"))
        .unwrap()
        .active_connections = 1;
    run(
        &mut table,
        &mut draining,
        &[want(vip, &[], Some(60)), want(other, &[], None)],
        None,
        &[],
    );
    assert!(!draining.is_empty());
    run(
        &mut table,
        &mut draining,
        &[want(other, &[], None)],
        None,
        &[],
    );
    assert!(
        !table.services.contains_key(&vip),
        "stale virtual server deleted at once"
    );
    assert!(draining.is_empty(), "its draining servers are forgotten");
}

#[test]
fn udp_goes_at_once_and_excluded_ranges_stay() {
    let (mut table, mut draining) = (FakeTable::default(), Draining::default());
    let dns = key("10.96.0.53", 53, Protocol::Udp);
    run(
        &mut table,
        &mut draining,
        &[want(dns, &["10.0.0.2"], None)],
        None,
        &[],
    );
    table
        .services
        .get_mut(&dns)
        .unwrap()
        .1
        .get_mut(&rs("10.0.0.2"))
        .unwrap()
        .active_connections = 4;
    run(
        &mut table,
        &mut draining,
        &[want(dns, &[], None)],
        None,
        &[],
    );
    assert!(
        table.services[&dns].1.is_empty(),
        "UDP real servers never drain"
    );

    // Someone else's virtual server inside excludeCIDRs survives a full sync.
    let foreign = key("192.168.50.5", 443, Protocol::Tcp);
    table.add_service(&want(foreign, &[], None).server).unwrap();
    let v6 = key("fd00::1", 80, Protocol::Tcp);
    table.add_service(&want(v6, &[], None).server).unwrap();
    run(
        &mut table,
        &mut draining,
        &[],
        None,
        &["192.168.50.0/24".parse().unwrap()],
    );
    assert!(table.services.contains_key(&foreign));
    assert!(
        table.services.contains_key(&v6),
        "a family this sync does not cover"
    );
    assert!(!table.services.contains_key(&dns));
}

#[derive(Default)]
struct FakeDummy {
    addresses: BTreeSet<IpAddr>,
}

impl DummyAddresses for FakeDummy {
    fn ensure_link(&mut self) -> Result<u32, NetlinkError> {
        Ok(7)
    }
    fn addresses(&mut self, _: u32) -> Result<Vec<IpAddr>, NetlinkError> {
        Ok(self.addresses.iter().copied().collect())
    }
    fn add_address(&mut self, _: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        self.addresses.insert(*ip);
        Ok(())
    }
    fn delete_address(&mut self, _: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        self.addresses.remove(ip);
        Ok(())
    }
}

#[test]
fn addresses_follow_the_desired_set_per_family() {
    let mut dummy = FakeDummy::default();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    dummy.addresses.extend([ip("10.96.0.99"), ip("fd00::99")]);
    let desired: BTreeSet<IpAddr> = [ip("10.96.0.10")].into_iter().collect();
    let mut counts = Counts::default();
    apply_addresses(&mut dummy, &desired, &[IpFamily::V4], &mut counts).unwrap();
    assert_eq!(
        dummy.addresses,
        [ip("10.96.0.10"), ip("fd00::99")].into_iter().collect()
    );
    assert_eq!(
        counts,
        Counts {
            written: 1,
            deleted: 1
        }
    );
}
