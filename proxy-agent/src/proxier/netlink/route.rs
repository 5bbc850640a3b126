// SPDX-License-Identifier: Apache-2.0
//! rtnetlink, the few operations the ipvs mode needs: a dummy interface by name (create,
//! find, delete) and the addresses on it (list, add, delete). Addresses are host
//! addresses (/32, /128) whose local routes make the kernel accept packets for them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nix::errno::Errno;
use nix::sys::socket::SockProtocol;

use super::{
    MessageBuilder, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkError,
    NetlinkSocket, attrs, string,
};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// No duplicate address detection: the address is ours alone and must work at once.
const IFA_F_NODAD: u8 = 0x02;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;

/// `ifinfomsg` for a link `index` (0: any).
fn ifinfomsg(index: i32) -> [u8; IFINFOMSG_LEN] {
    let mut out = [0u8; IFINFOMSG_LEN];
    out[4..8].copy_from_slice(&index.to_ne_bytes());
    out
}

fn ifaddrmsg(ip: &IpAddr, index: u32) -> [u8; IFADDRMSG_LEN] {
    let (family, prefix, flags) = match ip {
        IpAddr::V4(_) => (AF_INET, 32, 0),
        IpAddr::V6(_) => (AF_INET6, 128, IFA_F_NODAD),
    };
    let mut out = [family, prefix, flags, 0, 0, 0, 0, 0];
    out[4..8].copy_from_slice(&index.to_ne_bytes());
    out
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Creates dummy link `name`.
pub fn new_dummy_request(name: &str, seq: u32) -> Vec<u8> {
    let mut msg = MessageBuilder::new(
        RTM_NEWLINK,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
        &ifinfomsg(0),
    );
    msg.attr_str(IFLA_IFNAME, name);
    msg.begin_nested(IFLA_LINKINFO);
    msg.attr_str(IFLA_INFO_KIND, "dummy");
    msg.end_nested();
    msg.finish()
}

fn link_by_name_request(msg_type: u16, name: &str, seq: u32) -> Vec<u8> {
    let mut msg = MessageBuilder::new(msg_type, NLM_F_REQUEST | NLM_F_ACK, seq, &ifinfomsg(0));
    msg.attr_str(IFLA_IFNAME, name);
    msg.finish()
}

/// Adds (`add`) or deletes host address `ip` on link `index`.
pub fn address_request(add: bool, ip: &IpAddr, index: u32, seq: u32) -> Vec<u8> {
    let (msg_type, flags) = if add {
        (
            RTM_NEWADDR,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
    } else {
        (RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK)
    };
    let mut msg = MessageBuilder::new(msg_type, flags, seq, &ifaddrmsg(ip, index));
    let bytes = ip_bytes(ip);
    if ip.is_ipv4() {
        msg.attr(IFA_LOCAL, &bytes);
    }
    msg.attr(IFA_ADDRESS, &bytes);
    msg.finish()
}

/// One address of a RTM_GETADDR dump: (link index, address).
pub fn parse_address(body: &[u8]) -> Option<(u32, IpAddr)> {
    if body.len() < IFADDRMSG_LEN {
        return None;
    }
    let family = body[0];
    let index = u32::from_ne_bytes(body[4..8].try_into().ok()?);
    let mut address = None;
    for (t, payload) in attrs(&body[IFADDRMSG_LEN..]) {
        let ip = match (family, payload.len()) {
            (AF_INET, 4) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(payload).ok()?)),
            (AF_INET6, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(payload).ok()?)),
            _ => continue,
        };
        // IFA_LOCAL is the address itself on point-to-point links; prefer it.
        if t == IFA_LOCAL || (t == IFA_ADDRESS && address.is_none()) {
            address = Some(ip);
        }
    }
    Some((index, address?))
}

/// IFLA_LINKINFO / IFLA_INFO_KIND of a link message's attributes.
fn link_kind_of(link_attrs: &[u8]) -> Option<String> {
    attrs(link_attrs)
        .filter(|(t, _)| *t == IFLA_LINKINFO)
        .flat_map(|(_, info)| attrs(info))
        .find(|(t, _)| *t == IFLA_INFO_KIND)
        .and_then(|(_, kind)| string(kind))
        .map(str::to_string)
}

/// The rtnetlink operations on one link.
#[derive(Debug)]
pub struct RouteSocket {
    socket: NetlinkSocket,
}

impl RouteSocket {
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self {
            socket: NetlinkSocket::open(SockProtocol::NetlinkRoute)?,
        })
    }

    /// The RTM_NEWLINK body (ifinfomsg and attributes) of link `name`, `None` when there
    /// is no such link.
    fn link(&mut self, name: &str) -> Result<Option<Vec<u8>>, NetlinkError> {
        let seq = self.socket.next_seq();
        match self
            .socket
            .request(&link_by_name_request(RTM_GETLINK, name, seq), "get link")
        {
            Ok(answers) => Ok(answers
                .into_iter()
                .filter(|a| a.msg_type == RTM_NEWLINK && a.body.len() >= IFINFOMSG_LEN)
                .find(|a| {
                    attrs(&a.body[IFINFOMSG_LEN..])
                        .any(|(t, p)| t == IFLA_IFNAME && string(p) == Some(name))
                })
                .map(|a| a.body)),
            Err(err) if err.errno() == Some(Errno::ENODEV) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The index of link `name`, `None` when there is none.
    pub fn link_index(&mut self, name: &str) -> Result<Option<u32>, NetlinkError> {
        Ok(self
            .link(name)?
            .and_then(|body| body[4..8].try_into().ok().map(i32::from_ne_bytes))
            .and_then(|index| u32::try_from(index).ok()))
    }

    /// The kind of link `name` (`veth`, `dummy`, `bridge`, ...; `None` for a physical
    /// device, which has no link info, or when there is no such link).
    pub fn link_kind(&mut self, name: &str) -> Result<Option<String>, NetlinkError> {
        Ok(self
            .link(name)?
            .and_then(|body| link_kind_of(&body[IFINFOMSG_LEN..])))
    }

    /// Makes sure dummy link `name` exists; returns its index.
    pub fn ensure_dummy(&mut self, name: &str) -> Result<u32, NetlinkError> {
        if let Some(index) = self.link_index(name)? {
            return Ok(index);
        }
        let seq = self.socket.next_seq();
        match self
            .socket
            .request(&new_dummy_request(name, seq), "create dummy link")
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
        let seq = self.socket.next_seq();
        match self
            .socket
            .request(&link_by_name_request(RTM_DELLINK, name, seq), "delete link")
        {
            Ok(_) => Ok(true),
            Err(err) if err.errno() == Some(Errno::ENODEV) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The addresses on link `index`.
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, NetlinkError> {
        let seq = self.socket.next_seq();
        let request = MessageBuilder::new(
            RTM_GETADDR,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            &[0u8; IFADDRMSG_LEN],
        )
        .finish();
        let answers = self.socket.request(&request, "list addresses")?;
        Ok(answers
            .iter()
            .filter(|a| a.msg_type == RTM_NEWADDR)
            .filter_map(|a| parse_address(&a.body))
            .filter(|(i, _)| *i == index)
            .map(|(_, ip)| ip)
            .collect())
    }

    /// Adds host address `ip` to link `index` (already there is fine).
    pub fn add_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        let seq = self.socket.next_seq();
        match self
            .socket
            .request(&address_request(true, ip, index, seq), "add address")
        {
            Err(err) if err.errno() != Some(Errno::EEXIST) => Err(err),
            _ => Ok(()),
        }
    }

    /// Deletes host address `ip` from link `index` (already gone is fine).
    pub fn delete_address(&mut self, index: u32, ip: &IpAddr) -> Result<(), NetlinkError> {
        let seq = self.socket.next_seq();
        match self
            .socket
            .request(&address_request(false, ip, index, seq), "delete address")
        {
            Err(err) if err.errno() != Some(Errno::EADDRNOTAVAIL) => Err(err),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::{Message, NLMSG_HDRLEN, split_messages};

    fn body(bytes: &[u8]) -> (u16, Vec<u8>) {
        match &split_messages(bytes).unwrap()[0] {
            Message::Data { msg_type, body } => (*msg_type, body.to_vec()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dummy_link_request() {
        let (t, body) = body(&new_dummy_request("kube-ipvs0", 1));
        assert_eq!(t, RTM_NEWLINK);
        let found: Vec<_> = attrs(&body[IFINFOMSG_LEN..]).collect();
        assert_eq!(found[0].0, IFLA_IFNAME);
        assert_eq!(string(found[0].1), Some("kube-ipvs0"));
        assert_eq!(found[1].0, IFLA_LINKINFO);
        let kind: Vec<_> = attrs(found[1].1).collect();
        assert_eq!(
            (kind[0].0, string(kind[0].1)),
            (IFLA_INFO_KIND, Some("dummy"))
        );
        // A link message carries the same attributes: its kind is read back.
        assert_eq!(
            link_kind_of(&body[IFINFOMSG_LEN..]).as_deref(),
            Some("dummy")
        );
        assert_eq!(
            link_kind_of(&body[IFINFOMSG_LEN..][..found[0].1.len() + 4]),
            None
        );
    }

    #[test]
    fn address_requests_and_dumps() {
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let bytes = address_request(true, &v4, 7, 2);
        let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
        assert_eq!(flags & NLM_F_CREATE, NLM_F_CREATE);
        let (t, body) = body(&bytes);
        assert_eq!(t, RTM_NEWADDR);
        assert_eq!(&body[..4], &[AF_INET, 32, 0, 0]);
        assert_eq!(parse_address(&body), Some((7, v4)));
        let v6: IpAddr = "fd00::10".parse().unwrap();
        let (t, body) = self::body(&address_request(false, &v6, 9, 3));
        assert_eq!(t, RTM_DELADDR);
        assert_eq!(&body[..3], &[AF_INET6, 128, IFA_F_NODAD]);
        assert_eq!(parse_address(&body), Some((9, v6)));
        assert_eq!(parse_address(&[0; 4]), None);
        assert!(bytes.len() > NLMSG_HDRLEN + IFADDRMSG_LEN);
    }
}
