// SPDX-License-Identifier: Apache-2.0
//! The kernel objects the apply step reads and writes, behind traits so the diff logic
//! is testable without privileges: the IPVS table ([`IpvsSocket`] over generic netlink)
//! and the addresses of the kube-ipvs0 dummy interface ([`RouteSocket`] over rtnetlink).

use std::net::IpAddr;

use super::desired::{RealServer, ServiceKey, VirtualServer};
use super::genl::{IpvsSocket, RealServerStatus};
use crate::proxier::netlink::NetlinkError;
use crate::proxier::netlink::route::RouteSocket;

/// The dummy interface holding the service addresses.
pub const DUMMY_DEVICE: &str = crate::node::IPVS_DUMMY_DEVICE;

pub trait IpvsTable: Send {
    fn services(&mut self) -> Result<Vec<VirtualServer>, NetlinkError>;
    fn add_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError>;
    fn edit_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError>;
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), NetlinkError>;
    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<RealServerStatus>, NetlinkError>;
    fn add_dest(
        &mut self,
        key: &ServiceKey,
        rs: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError>;
    fn edit_dest(
        &mut self,
        key: &ServiceKey,
        rs: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError>;
    fn delete_dest(&mut self, key: &ServiceKey, rs: &RealServer) -> Result<(), NetlinkError>;
}

impl IpvsTable for IpvsSocket {
    fn services(&mut self) -> Result<Vec<VirtualServer>, NetlinkError> {
        IpvsSocket::services(self)
    }
    fn add_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        IpvsSocket::add_service(self, server)
    }
    fn edit_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        IpvsSocket::edit_service(self, server)
    }
    fn delete_service(&mut self, key: &ServiceKey) -> Result<(), NetlinkError> {
        IpvsSocket::delete_service(self, key)
    }
    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<RealServerStatus>, NetlinkError> {
        IpvsSocket::dests(self, key)
    }
    fn add_dest(
        &mut self,
        key: &ServiceKey,
        rs: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError> {
        IpvsSocket::add_dest(self, key, rs, weight)
    }
    fn edit_dest(
        &mut self,
        key: &ServiceKey,
        rs: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError> {
        IpvsSocket::edit_dest(self, key, rs, weight)
    }
    fn delete_dest(&mut self, key: &ServiceKey, rs: &RealServer) -> Result<(), NetlinkError> {
        IpvsSocket::delete_dest(self, key, rs)
    }
}

/// The addresses of the dummy interface.
pub trait DummyAddresses: Send {
    /// Creates the interface if needed; returns its index.
    fn ensure_link(&mut self) -> Result<u32, NetlinkError>;
    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, NetlinkError>;
    fn add_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError>;
    fn delete_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError>;
}

impl DummyAddresses for RouteSocket {
    fn ensure_link(&mut self) -> Result<u32, NetlinkError> {
        self.ensure_dummy(DUMMY_DEVICE)
    }
    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, NetlinkError> {
        RouteSocket::addresses(self, index)
    }
    fn add_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        RouteSocket::add_address(self, index, ip)
    }
    fn delete_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        RouteSocket::delete_address(self, index, ip)
    }
}
