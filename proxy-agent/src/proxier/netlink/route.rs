// SPDX-License-Identifier: Apache-2.0
//! rtnetlink on netlink-packet-route, the few operations the proxiers need: a dummy
//! interface by name (create, find, delete, its kind) and the addresses on a link (list,
//! add, delete). Addresses are host addresses (/32, /128) whose local routes make the
//! kernel accept packets for them.

use std::net::IpAddr;

use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use nix::errno::Errno;

use super::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkError, NetlinkMessage,
    NetlinkSocket, request,
};

type RouteRequest = NetlinkMessage<RouteNetlinkMessage>;

/// A link message naming link `name` (index 0: the kernel looks it up by name).
fn link_named(name: &str) -> LinkMessage {
    let mut link = LinkMessage::default();
    link.attributes
        .push(LinkAttribute::IfName(name.to_string()));
    link
}

/// Creates dummy link `name`.
pub fn new_dummy_request(name: &str) -> RouteRequest {
    let mut link = link_named(name);
    link.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
            InfoKind::Dummy,
        )]));
    request(
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        RouteNetlinkMessage::NewLink(link),
    )
}

fn get_link_request(name: &str) -> RouteRequest {
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        RouteNetlinkMessage::GetLink(link_named(name)),
    )
}

fn delete_link_request(name: &str) -> RouteRequest {
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        RouteNetlinkMessage::DelLink(link_named(name)),
    )
}

/// Adds (`add`) or deletes host address `ip` on link `index`.
pub fn address_request(add: bool, ip: &IpAddr, index: u32) -> RouteRequest {
    let mut address = AddressMessage::default();
    address.header.index = index;
    match ip {
        IpAddr::V4(_) => {
            address.header.family = AddressFamily::Inet;
            address.header.prefix_len = 32;
            address.attributes.push(AddressAttribute::Local(*ip));
        }
        IpAddr::V6(_) => {
            address.header.family = AddressFamily::Inet6;
            address.header.prefix_len = 128;
            // No duplicate address detection: the address is ours alone and must work
            // at once.
            address.header.flags = AddressHeaderFlags::Nodad;
        }
    }
    address.attributes.push(AddressAttribute::Address(*ip));
    if add {
        request(
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            RouteNetlinkMessage::NewAddress(address),
        )
    } else {
        request(
            NLM_F_REQUEST | NLM_F_ACK,
            RouteNetlinkMessage::DelAddress(address),
        )
    }
}

/// The dump of every address of every link.
pub fn list_addresses_request() -> RouteRequest {
    request(
        NLM_F_REQUEST | NLM_F_DUMP,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    )
}

/// One address of a RTM_GETADDR dump: (link index, address).
pub fn parse_address(message: &AddressMessage) -> Option<(u32, IpAddr)> {
    let mut address = None;
    for attribute in &message.attributes {
        match attribute {
            // IFA_LOCAL is the address itself on point-to-point links; prefer it.
            AddressAttribute::Local(ip) => address = Some(*ip),
            AddressAttribute::Address(ip) if address.is_none() => address = Some(*ip),
            _ => {}
        }
    }
    Some((message.header.index, address?))
}

/// IFLA_IFNAME of a link.
fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes
        .iter()
        .find_map(|attribute| match attribute {
            LinkAttribute::IfName(name) => Some(name.as_str()),
            _ => None,
        })
}

/// IFLA_LINKINFO / IFLA_INFO_KIND of a link.
fn link_kind_of(link: &LinkMessage) -> Option<String> {
    link.attributes
        .iter()
        .filter_map(|attribute| match attribute {
            LinkAttribute::LinkInfo(infos) => Some(infos),
            _ => None,
        })
        .flatten()
        .find_map(|info| match info {
            LinkInfo::Kind(kind) => Some(kind.to_string()),
            _ => None,
        })
}

/// The rtnetlink operations on one link.
#[derive(Debug)]
pub struct RouteSocket {
    socket: NetlinkSocket,
}

impl RouteSocket {
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_ROUTE)?,
        })
    }

    /// Link `name`, `None` when there is no such link.
    fn link(&mut self, name: &str) -> Result<Option<LinkMessage>, NetlinkError> {
        match self.socket.request(get_link_request(name), "get link") {
            Ok(answers) => Ok(answers.into_iter().find_map(|answer| match answer {
                RouteNetlinkMessage::NewLink(link) if link_name(&link) == Some(name) => Some(link),
                _ => None,
            })),
            Err(err) if err.errno() == Some(Errno::ENODEV) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The index of link `name`, `None` when there is none.
    pub fn link_index(&mut self, name: &str) -> Result<Option<u32>, NetlinkError> {
        Ok(self
            .link(name)?
            .map(|link| link.header.index)
            .filter(|index| i32::try_from(*index).is_ok()))
    }

    /// The kind of link `name` (`veth`, `dummy`, `bridge`, ...; `None` for a physical
    /// device, which has no link info, or when there is no such link).
    pub fn link_kind(&mut self, name: &str) -> Result<Option<String>, NetlinkError> {
        Ok(self.link(name)?.and_then(|link| link_kind_of(&link)))
    }

    /// Makes sure dummy link `name` exists; returns its index.
    pub fn ensure_dummy(&mut self, name: &str) -> Result<u32, NetlinkError> {
        if let Some(index) = self.link_index(name)? {
            return Ok(index);
        }
        match self
            .socket
            .request(new_dummy_request(name), "create dummy link")
        {
            Ok(_) => {}
            Err(err) if err.errno() == Some(Errno::EEXIST) => {}
            Err(err) => return Err(err),
        }
        self.link_index(name)?.ok_or(NetlinkError::Kernel {
            operation: "create dummy link",
            errno: Errno::ENODEV,
        })
    }

    /// Deletes link `name`; false when there was none.
    pub fn delete_link(&mut self, name: &str) -> Result<bool, NetlinkError> {
        match self
            .socket
            .request(delete_link_request(name), "delete link")
        {
            Ok(_) => Ok(true),
            Err(err) if err.errno() == Some(Errno::ENODEV) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The addresses on link `index`.
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, NetlinkError> {
        let answers = self
            .socket
            .request(list_addresses_request(), "list addresses")?;
        Ok(answers
            .iter()
            .filter_map(|answer| match answer {
                RouteNetlinkMessage::NewAddress(address) => parse_address(address),
                _ => None,
            })
            .filter(|(i, _)| *i == index)
            .map(|(_, ip)| ip)
            .collect())
    }

    /// Adds host address `ip` to link `index` (already there is fine).
    pub fn add_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        match self
            .socket
            .request(address_request(true, ip, index), "add address")
        {
            Err(err) if err.errno() != Some(Errno::EEXIST) => Err(err),
            _ => Ok(()),
        }
    }

    /// Deletes host address `ip` from link `index` (already gone is fine).
    pub fn delete_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        match self
            .socket
            .request(address_request(false, ip, index), "delete address")
        {
            Err(err) if err.errno() != Some(Errno::EADDRNOTAVAIL) => Err(err),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::encode;
    use crate::proxier::netlink::socket::{Received, split_datagram};

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Decodes what was encoded, as the kernel's answers are.
    fn round_trip(mut message: RouteRequest) -> RouteNetlinkMessage {
        match split_datagram(&encode(&mut message, 1)).unwrap().pop() {
            Some(Received::Data(answer)) => answer,
            other => panic!("{other:?}"),
        }
    }

    // The requests' bytes as the former hand-written encoder produced them.
    // One bit differs: the former encoder flagged IFLA_LINKINFO NLA_F_NESTED (0x8012),
    // netlink-packet-route does not (0x0012), like iproute2; rtnetlink parses
    // IFLA_LINKINFO as nested either way (nla_parse_nested_deprecated).
    const NEW_DUMMY: &str = "40000000100005060100000000000000000000000000000000000000000000000f0003006b7562652d69707673300000100012000a00010064756d6d79000000";
    const GET_LINK: &str = "30000000120005000200000000000000000000000000000000000000000000000f0003006b7562652d69707673300000";
    const DEL_LINK: &str = "30000000110005000300000000000000000000000000000000000000000000000f0003006b7562652d69707673300000";
    const ADD_V4: &str =
        "280000001400050604000000000000000220000007000000080002000a60000a080001000a60000a";
    const DEL_V4: &str =
        "280000001500050005000000000000000220000007000000080002000a60000a080001000a60000a";
    const ADD_V6: &str =
        "2c0000001400050606000000000000000a8002000900000014000100fd000000000000000000000000000010";
    const DEL_V6: &str =
        "2c0000001500050007000000000000000a8002000900000014000100fd000000000000000000000000000010";
    const DUMP_ADDRESSES: &str = "180000001600010308000000000000000000000000000000";

    #[test]
    fn requests_are_byte_for_byte_the_former_ones() {
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let v6: IpAddr = "fd00::10".parse().unwrap();
        assert_eq!(
            hex(&encode(&mut new_dummy_request("kube-ipvs0"), 1)),
            NEW_DUMMY
        );
        assert_eq!(
            hex(&encode(&mut get_link_request("kube-ipvs0"), 2)),
            GET_LINK
        );
        assert_eq!(
            hex(&encode(&mut delete_link_request("kube-ipvs0"), 3)),
            DEL_LINK
        );
        assert_eq!(hex(&encode(&mut address_request(true, &v4, 7), 4)), ADD_V4);
        assert_eq!(hex(&encode(&mut address_request(false, &v4, 7), 5)), DEL_V4);
        assert_eq!(hex(&encode(&mut address_request(true, &v6, 9), 6)), ADD_V6);
        assert_eq!(hex(&encode(&mut address_request(false, &v6, 9), 7)), DEL_V6);
        assert_eq!(
            hex(&encode(&mut list_addresses_request(), 8)),
            DUMP_ADDRESSES
        );
    }

    #[test]
    fn dummy_link_request() {
        let RouteNetlinkMessage::NewLink(link) = round_trip(new_dummy_request("kube-ipvs0")) else {
            panic!()
        };
        assert_eq!(link_name(&link), Some("kube-ipvs0"));
        // A link message carries the same attributes: its kind is read back.
        assert_eq!(link_kind_of(&link).as_deref(), Some("dummy"));
        assert_eq!(link_kind_of(&link_named("eth0")), None);
    }

    #[test]
    fn address_requests_and_dumps() {
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let RouteNetlinkMessage::NewAddress(address) = round_trip(address_request(true, &v4, 7))
        else {
            panic!()
        };
        assert_eq!(address.header.prefix_len, 32);
        assert_eq!(parse_address(&address), Some((7, v4)));
        let v6: IpAddr = "fd00::10".parse().unwrap();
        let RouteNetlinkMessage::DelAddress(address) = round_trip(address_request(false, &v6, 9))
        else {
            panic!()
        };
        assert_eq!(address.header.flags, AddressHeaderFlags::Nodad);
        assert_eq!(parse_address(&address), Some((9, v6)));
        assert_eq!(parse_address(&AddressMessage::default()), None);
    }
}
