// SPDX-License-Identifier: Apache-2.0
//! IPVS over generic netlink (the "IPVS" family, what ipvsadm speaks): the messages to
//! add, edit, delete and list virtual servers and their real servers, and to set the
//! timeouts, built and decoded here (pure); [`IpvsSocket`] sends them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::desired::{RealServer, ServiceKey, VirtualServer};
use crate::model::Protocol;
use crate::proxier::conntrack::ip_protocol;
use crate::proxier::netlink::genl::{GENL_HDRLEN, GenlSocket, header};
use crate::proxier::netlink::{
    Answer, MessageBuilder, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, attrs, string,
    u16_ne, u32_ne,
};

pub const FAMILY_NAME: &str = "IPVS";
const VERSION: u8 = 1;

const CMD_NEW_SERVICE: u8 = 1;
const CMD_SET_SERVICE: u8 = 2;
const CMD_DEL_SERVICE: u8 = 3;
const CMD_GET_SERVICE: u8 = 4;
const CMD_NEW_DEST: u8 = 5;
const CMD_SET_DEST: u8 = 6;
const CMD_DEL_DEST: u8 = 7;
const CMD_GET_DEST: u8 = 8;
const CMD_SET_CONFIG: u8 = 12;

const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_ATTR_AF: u16 = 1;
const SVC_ATTR_PROTOCOL: u16 = 2;
const SVC_ATTR_ADDR: u16 = 3;
const SVC_ATTR_PORT: u16 = 4;
const SVC_ATTR_FWMARK: u16 = 5;
const SVC_ATTR_SCHED_NAME: u16 = 6;
const SVC_ATTR_FLAGS: u16 = 7;
const SVC_ATTR_TIMEOUT: u16 = 8;
const SVC_ATTR_NETMASK: u16 = 9;

const DEST_ATTR_ADDR: u16 = 1;
const DEST_ATTR_PORT: u16 = 2;
const DEST_ATTR_FWD_METHOD: u16 = 3;
const DEST_ATTR_WEIGHT: u16 = 4;
const DEST_ATTR_U_THRESH: u16 = 5;
const DEST_ATTR_L_THRESH: u16 = 6;
const DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const DEST_ATTR_INACT_CONNS: u16 = 8;
const DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// IP_VS_SVC_F_PERSISTENT: ClientIP affinity.
const SVC_F_PERSISTENT: u32 = 0x1;
/// IP_VS_CONN_F_MASQ: NAT to the real server.
const CONN_F_MASQ: u32 = 0x0;
const FWD_METHOD_MASK: u32 = 0x7;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

fn af(ip: &IpAddr) -> u16 {
    match ip {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// An address attribute: the kernel sends 16 bytes (`nf_inet_addr`) whatever the family.
fn parse_ip(family: u16, payload: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(payload.get(..4)?).ok()?,
        ))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(payload.get(..16)?).ok()?,
        ))),
        _ => None,
    }
}

fn protocol_of(number: u16) -> Option<Protocol> {
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| u16::from(ip_protocol(*p)) == number)
}

fn message(cmd: u8, flags: u16, family: u16, seq: u32) -> MessageBuilder {
    MessageBuilder::new(family, flags, seq, &header(cmd, VERSION))
}

fn write_key(msg: &mut MessageBuilder, key: &ServiceKey) {
    msg.attr_u16(SVC_ATTR_AF, af(&key.addr));
    msg.attr_u16(SVC_ATTR_PROTOCOL, u16::from(ip_protocol(key.protocol)));
    msg.attr(SVC_ATTR_ADDR, &ip_bytes(&key.addr));
    msg.attr(SVC_ATTR_PORT, &key.port.to_be_bytes());
}

/// Adds (`edit` false) or edits a virtual server.
pub fn service_request(server: &VirtualServer, edit: bool, family: u16, seq: u32) -> Vec<u8> {
    let cmd = if edit {
        CMD_SET_SERVICE
    } else {
        CMD_NEW_SERVICE
    };
    let mut msg = message(cmd, NLM_F_REQUEST | NLM_F_ACK, family, seq);
    msg.begin_nested(CMD_ATTR_SERVICE);
    write_key(&mut msg, &server.key);
    msg.attr_str(SVC_ATTR_SCHED_NAME, &server.scheduler);
    let flags = if server.persistence_timeout.is_some() {
        SVC_F_PERSISTENT
    } else {
        0
    };
    let mut flag_bytes = flags.to_ne_bytes().to_vec();
    flag_bytes.extend_from_slice(&u32::MAX.to_ne_bytes()); // mask: every flag is set
    msg.attr(SVC_ATTR_FLAGS, &flag_bytes);
    msg.attr_u32(SVC_ATTR_TIMEOUT, server.persistence_timeout.unwrap_or(0));
    let netmask = match server.key.addr {
        IpAddr::V4(_) => u32::MAX,
        IpAddr::V6(_) => 128,
    };
    msg.attr_u32(SVC_ATTR_NETMASK, netmask);
    msg.end_nested();
    msg.finish()
}

pub fn delete_service_request(key: &ServiceKey, family: u16, seq: u32) -> Vec<u8> {
    let mut msg = message(CMD_DEL_SERVICE, NLM_F_REQUEST | NLM_F_ACK, family, seq);
    msg.begin_nested(CMD_ATTR_SERVICE);
    write_key(&mut msg, key);
    msg.end_nested();
    msg.finish()
}

pub fn list_services_request(family: u16, seq: u32) -> Vec<u8> {
    message(CMD_GET_SERVICE, NLM_F_REQUEST | NLM_F_DUMP, family, seq).finish()
}

/// Adds (`edit` false) or edits real server `server` of `key` with `weight`.
pub fn dest_request(
    key: &ServiceKey,
    server: &RealServer,
    weight: u32,
    edit: bool,
    family: u16,
    seq: u32,
) -> Vec<u8> {
    let cmd = if edit { CMD_SET_DEST } else { CMD_NEW_DEST };
    let mut msg = message(cmd, NLM_F_REQUEST | NLM_F_ACK, family, seq);
    msg.begin_nested(CMD_ATTR_SERVICE);
    write_key(&mut msg, key);
    msg.end_nested();
    msg.begin_nested(CMD_ATTR_DEST);
    msg.attr(DEST_ATTR_ADDR, &ip_bytes(&server.addr));
    msg.attr(DEST_ATTR_PORT, &server.port.to_be_bytes());
    msg.attr_u32(DEST_ATTR_FWD_METHOD, CONN_F_MASQ);
    msg.attr_u32(DEST_ATTR_WEIGHT, weight);
    msg.attr_u32(DEST_ATTR_U_THRESH, 0);
    msg.attr_u32(DEST_ATTR_L_THRESH, 0);
    msg.attr_u16(DEST_ATTR_ADDR_FAMILY, af(&server.addr));
    msg.end_nested();
    msg.finish()
}

pub fn delete_dest_request(
    key: &ServiceKey,
    server: &RealServer,
    family: u16,
    seq: u32,
) -> Vec<u8> {
    let mut msg = message(CMD_DEL_DEST, NLM_F_REQUEST | NLM_F_ACK, family, seq);
    msg.begin_nested(CMD_ATTR_SERVICE);
    write_key(&mut msg, key);
    msg.end_nested();
    msg.begin_nested(CMD_ATTR_DEST);
    msg.attr(DEST_ATTR_ADDR, &ip_bytes(&server.addr));
    msg.attr(DEST_ATTR_PORT, &server.port.to_be_bytes());
    msg.end_nested();
    msg.finish()
}

pub fn list_dests_request(key: &ServiceKey, family: u16, seq: u32) -> Vec<u8> {
    let mut msg = message(CMD_GET_DEST, NLM_F_REQUEST | NLM_F_DUMP, family, seq);
    msg.begin_nested(CMD_ATTR_SERVICE);
    write_key(&mut msg, key);
    msg.end_nested();
    msg.finish()
}

/// Timeouts in seconds; 0 leaves the kernel's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

pub fn set_timeouts_request(timeouts: &Timeouts, family: u16, seq: u32) -> Vec<u8> {
    let mut msg = message(CMD_SET_CONFIG, NLM_F_REQUEST | NLM_F_ACK, family, seq);
    msg.attr_u32(CMD_ATTR_TIMEOUT_TCP, timeouts.tcp);
    msg.attr_u32(CMD_ATTR_TIMEOUT_TCP_FIN, timeouts.tcp_fin);
    msg.attr_u32(CMD_ATTR_TIMEOUT_UDP, timeouts.udp);
    msg.finish()
}

/// A virtual server as the kernel lists it. Firewall-mark services (not ours) have no
/// key and are skipped by [`parse_service`].
pub fn parse_service(answer: &Answer) -> Option<VirtualServer> {
    let body = answer.body.get(GENL_HDRLEN..)?;
    let (_, nested) = attrs(body).find(|(t, _)| *t == CMD_ATTR_SERVICE)?;
    let mut family = None;
    let (mut protocol, mut addr, mut port, mut scheduler) = (None, None, None, None);
    let (mut flags, mut timeout, mut fwmark) = (0, 0, 0);
    for (t, payload) in attrs(nested) {
        match t {
            SVC_ATTR_AF => family = u16_ne(payload),
            SVC_ATTR_PROTOCOL => protocol = u16_ne(payload).and_then(protocol_of),
            SVC_ATTR_ADDR => addr = Some(payload),
            SVC_ATTR_PORT if payload.len() >= 2 => {
                port = Some(u16::from_be_bytes([payload[0], payload[1]]))
            }
            SVC_ATTR_FWMARK => fwmark = u32_ne(payload).unwrap_or(0),
            SVC_ATTR_SCHED_NAME => scheduler = string(payload).map(str::to_string),
            SVC_ATTR_FLAGS => flags = u32_ne(payload).unwrap_or(0),
            SVC_ATTR_TIMEOUT => timeout = u32_ne(payload).unwrap_or(0),
            _ => {}
        }
    }
    if fwmark != 0 {
        return None;
    }
    Some(VirtualServer {
        key: ServiceKey {
            addr: parse_ip(family?, addr?)?,
            protocol: protocol?,
            port: port?,
        },
        scheduler: scheduler.unwrap_or_default(),
        persistence_timeout: (flags & SVC_F_PERSISTENT != 0).then_some(timeout),
    })
}

/// A real server as the kernel lists it, with its weight and connection counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RealServerStatus {
    pub server: RealServer,
    pub weight: u32,
    pub masquerading: bool,
    pub active_connections: u32,
    pub inactive_connections: u32,
}

/// `service_family` (AF_INET/AF_INET6) is the family the destination's address is in,
/// when the kernel does not say.
pub fn parse_dest(answer: &Answer, service_family: u16) -> Option<RealServerStatus> {
    let body = answer.body.get(GENL_HDRLEN..)?;
    let (_, nested) = attrs(body).find(|(t, _)| *t == CMD_ATTR_DEST)?;
    let (mut family, mut addr, mut port) = (service_family, None, None);
    let (mut weight, mut method, mut active, mut inactive) = (0, 0, 0, 0);
    for (t, payload) in attrs(nested) {
        match t {
            DEST_ATTR_ADDR => addr = Some(payload),
            DEST_ATTR_PORT if payload.len() >= 2 => {
                port = Some(u16::from_be_bytes([payload[0], payload[1]]))
            }
            DEST_ATTR_FWD_METHOD => method = u32_ne(payload).unwrap_or(0),
            DEST_ATTR_WEIGHT => weight = u32_ne(payload).unwrap_or(0),
            DEST_ATTR_ACTIVE_CONNS => active = u32_ne(payload).unwrap_or(0),
            DEST_ATTR_INACT_CONNS => inactive = u32_ne(payload).unwrap_or(0),
            DEST_ATTR_ADDR_FAMILY => family = u16_ne(payload).unwrap_or(family),
            _ => {}
        }
    }
    Some(RealServerStatus {
        server: RealServer {
            addr: parse_ip(family, addr?)?,
            port: port?,
        },
        weight,
        masquerading: method & FWD_METHOD_MASK == CONN_F_MASQ,
        active_connections: active,
        inactive_connections: inactive,
    })
}

/// A socket speaking IPVS. Opening it loads the ip_vs module if the kernel can.
#[derive(Debug)]
pub struct IpvsSocket {
    genl: GenlSocket,
}

impl IpvsSocket {
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self {
            genl: GenlSocket::open(FAMILY_NAME)?,
        })
    }

    fn request(
        &mut self,
        build: impl FnOnce(u16, u32) -> Vec<u8>,
        operation: &'static str,
    ) -> Result<Vec<Answer>, NetlinkError> {
        let seq = self.genl.socket.next_seq();
        let request = build(self.genl.family, seq);
        self.genl.socket.request(&request, operation)
    }

    pub fn services(&mut self) -> Result<Vec<VirtualServer>, NetlinkError> {
        let answers = self.request(list_services_request, "list IPVS services")?;
        Ok(answers.iter().filter_map(parse_service).collect())
    }

    pub fn add_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        self.request(
            |f, s| service_request(server, false, f, s),
            "add IPVS service",
        )
        .map(drop)
    }

    pub fn edit_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        self.request(
            |f, s| service_request(server, true, f, s),
            "edit IPVS service",
        )
        .map(drop)
    }

    pub fn delete_service(&mut self, key: &ServiceKey) -> Result<(), NetlinkError> {
        self.request(
            |f, s| delete_service_request(key, f, s),
            "delete IPVS service",
        )
        .map(drop)
    }

    pub fn dests(&mut self, key: &ServiceKey) -> Result<Vec<RealServerStatus>, NetlinkError> {
        let family = af(&key.addr);
        let answers = self.request(|f, s| list_dests_request(key, f, s), "list IPVS dests")?;
        Ok(answers
            .iter()
            .filter_map(|a| parse_dest(a, family))
            .collect())
    }

    pub fn add_dest(
        &mut self,
        key: &ServiceKey,
        server: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError> {
        self.request(
            |f, s| dest_request(key, server, weight, false, f, s),
            "add IPVS dest",
        )
        .map(drop)
    }

    pub fn edit_dest(
        &mut self,
        key: &ServiceKey,
        server: &RealServer,
        weight: u32,
    ) -> Result<(), NetlinkError> {
        self.request(
            |f, s| dest_request(key, server, weight, true, f, s),
            "edit IPVS dest",
        )
        .map(drop)
    }

    pub fn delete_dest(
        &mut self,
        key: &ServiceKey,
        server: &RealServer,
    ) -> Result<(), NetlinkError> {
        self.request(
            |f, s| delete_dest_request(key, server, f, s),
            "delete IPVS dest",
        )
        .map(drop)
    }

    pub fn set_timeouts(&mut self, timeouts: &Timeouts) -> Result<(), NetlinkError> {
        self.request(
            |f, s| set_timeouts_request(timeouts, f, s),
            "set IPVS timeouts",
        )
        .map(drop)
    }
}
