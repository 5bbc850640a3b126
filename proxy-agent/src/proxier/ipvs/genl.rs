// SPDX-License-Identifier: Apache-2.0
//! IPVS over generic netlink (the "IPVS" family, what ipvsadm speaks): the messages to
//! add, edit, delete and list virtual servers and their real servers, and to set the
//! timeouts, built and decoded here (pure); [`IpvsSocket`] sends them.
//!
//! The framing (netlink header, `genlmsghdr`, attribute encoding, acknowledgements and
//! dumps) is netlink-packet-generic's and netlink-packet-core's. The IPVS commands and
//! attributes (`linux/ip_vs.h`) are defined here: no maintained crate has them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized, emit_u16, emit_u32, parse_string, parse_u16, parse_u16_be, parse_u32,
};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};

use super::desired::{RealServer, ServiceKey, VirtualServer};
use crate::model::Protocol;
use crate::proxier::conntrack::ip_protocol;
use crate::proxier::netlink::genl::GenlSocket;
use crate::proxier::netlink::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, NetlinkMessage, request,
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

/// One IPVS message: its command and top-level attributes (`IPVS_CMD_ATTR_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsMessage {
    pub command: u8,
    pub attributes: Vec<IpvsAttribute>,
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.command
    }

    fn version(&self) -> u8 {
        VERSION
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attributes.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attributes.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Self {
            command: header.cmd,
            attributes: parse_nested(buf).context("IPVS message attributes")?,
        })
    }
}

/// The attributes nested in `payload`.
fn parse_nested<A>(payload: &[u8]) -> Result<Vec<A>, DecodeError>
where
    A: for<'b> Parseable<NlaBuffer<&'b [u8]>>,
{
    NlasIterator::new(payload)
        .map(|nla| nla.and_then(|nla| A::parse(&nla)))
        .collect()
}

fn emit_all<A: Nla>(attributes: &[A], buffer: &mut [u8]) {
    attributes.emit(buffer)
}

/// `IPVS_CMD_ATTR_*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpvsAttribute {
    Service(Vec<ServiceAttribute>),
    Dest(Vec<DestAttribute>),
    TimeoutTcp(u32),
    TimeoutTcpFin(u32),
    TimeoutUdp(u32),
    Other(DefaultNla),
}

impl Nla for IpvsAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::Service(nested) => nested.as_slice().buffer_len(),
            Self::Dest(nested) => nested.as_slice().buffer_len(),
            Self::TimeoutTcp(_) | Self::TimeoutTcpFin(_) | Self::TimeoutUdp(_) => 4,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Service(_) => CMD_ATTR_SERVICE,
            Self::Dest(_) => CMD_ATTR_DEST,
            Self::TimeoutTcp(_) => CMD_ATTR_TIMEOUT_TCP,
            Self::TimeoutTcpFin(_) => CMD_ATTR_TIMEOUT_TCP_FIN,
            Self::TimeoutUdp(_) => CMD_ATTR_TIMEOUT_UDP,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Service(nested) => emit_all(nested, buffer),
            Self::Dest(nested) => emit_all(nested, buffer),
            Self::TimeoutTcp(value) | Self::TimeoutTcpFin(value) | Self::TimeoutUdp(value) => {
                emit_u32_into(buffer, *value)
            }
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }

    fn is_nested(&self) -> bool {
        matches!(self, Self::Service(_) | Self::Dest(_))
    }
}

impl<'b, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'b T>> for IpvsAttribute {
    fn parse(buf: &NlaBuffer<&'b T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            CMD_ATTR_SERVICE => Self::Service(parse_nested(value).context("IPVS service")?),
            CMD_ATTR_DEST => Self::Dest(parse_nested(value).context("IPVS dest")?),
            CMD_ATTR_TIMEOUT_TCP => Self::TimeoutTcp(parse_u32(value)?),
            CMD_ATTR_TIMEOUT_TCP_FIN => Self::TimeoutTcpFin(parse_u32(value)?),
            CMD_ATTR_TIMEOUT_UDP => Self::TimeoutUdp(parse_u32(value)?),
            _ => Self::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// `IPVS_SVC_ATTR_*`. Addresses are raw `nf_inet_addr` bytes: we send 4 or 16, the
/// kernel sends 16 whatever the family, which is the sibling `AddressFamily`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceAttribute {
    AddressFamily(u16),
    Protocol(u16),
    Address(Vec<u8>),
    /// Network byte order on the wire.
    Port(u16),
    Fwmark(u32),
    Scheduler(String),
    /// `struct ip_vs_flags`: the flags and the mask of those to change.
    Flags {
        flags: u32,
        mask: u32,
    },
    Timeout(u32),
    Netmask(u32),
    Other(DefaultNla),
}

impl Nla for ServiceAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::AddressFamily(_) | Self::Protocol(_) | Self::Port(_) => 2,
            Self::Address(bytes) => bytes.len(),
            Self::Scheduler(name) => name.len() + 1,
            Self::Flags { .. } => 8,
            Self::Fwmark(_) | Self::Timeout(_) | Self::Netmask(_) => 4,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::AddressFamily(_) => SVC_ATTR_AF,
            Self::Protocol(_) => SVC_ATTR_PROTOCOL,
            Self::Address(_) => SVC_ATTR_ADDR,
            Self::Port(_) => SVC_ATTR_PORT,
            Self::Fwmark(_) => SVC_ATTR_FWMARK,
            Self::Scheduler(_) => SVC_ATTR_SCHED_NAME,
            Self::Flags { .. } => SVC_ATTR_FLAGS,
            Self::Timeout(_) => SVC_ATTR_TIMEOUT,
            Self::Netmask(_) => SVC_ATTR_NETMASK,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::AddressFamily(value) | Self::Protocol(value) => emit_u16_into(buffer, *value),
            Self::Port(port) => buffer[..2].copy_from_slice(&port.to_be_bytes()),
            Self::Address(bytes) => buffer[..bytes.len()].copy_from_slice(bytes),
            // NUL-terminated, as the kernel's NLA_NUL_STRING wants it.
            Self::Scheduler(name) => {
                buffer[..name.len()].copy_from_slice(name.as_bytes());
                buffer[name.len()] = 0;
            }
            Self::Flags { flags, mask } => {
                emit_u32_into(&mut buffer[..4], *flags);
                emit_u32_into(&mut buffer[4..8], *mask);
            }
            Self::Fwmark(value) | Self::Timeout(value) | Self::Netmask(value) => {
                emit_u32_into(buffer, *value)
            }
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'b, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'b T>> for ServiceAttribute {
    fn parse(buf: &NlaBuffer<&'b T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            SVC_ATTR_AF => Self::AddressFamily(parse_u16(value)?),
            SVC_ATTR_PROTOCOL => Self::Protocol(parse_u16(value)?),
            SVC_ATTR_ADDR => Self::Address(value.to_vec()),
            SVC_ATTR_PORT => Self::Port(parse_u16_be(value)?),
            SVC_ATTR_FWMARK => Self::Fwmark(parse_u32(value)?),
            SVC_ATTR_SCHED_NAME => Self::Scheduler(parse_string(value)?),
            SVC_ATTR_FLAGS if value.len() == 8 => Self::Flags {
                flags: parse_u32(&value[..4])?,
                mask: parse_u32(&value[4..])?,
            },
            SVC_ATTR_TIMEOUT => Self::Timeout(parse_u32(value)?),
            SVC_ATTR_NETMASK => Self::Netmask(parse_u32(value)?),
            _ => Self::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// `IPVS_DEST_ATTR_*` (the address as in [`ServiceAttribute`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DestAttribute {
    Address(Vec<u8>),
    /// Network byte order on the wire.
    Port(u16),
    ForwardMethod(u32),
    Weight(u32),
    UpperThreshold(u32),
    LowerThreshold(u32),
    ActiveConnections(u32),
    InactiveConnections(u32),
    AddressFamily(u16),
    Other(DefaultNla),
}

impl Nla for DestAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::Address(bytes) => bytes.len(),
            Self::Port(_) | Self::AddressFamily(_) => 2,
            Self::ForwardMethod(_)
            | Self::Weight(_)
            | Self::UpperThreshold(_)
            | Self::LowerThreshold(_)
            | Self::ActiveConnections(_)
            | Self::InactiveConnections(_) => 4,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Address(_) => DEST_ATTR_ADDR,
            Self::Port(_) => DEST_ATTR_PORT,
            Self::ForwardMethod(_) => DEST_ATTR_FWD_METHOD,
            Self::Weight(_) => DEST_ATTR_WEIGHT,
            Self::UpperThreshold(_) => DEST_ATTR_U_THRESH,
            Self::LowerThreshold(_) => DEST_ATTR_L_THRESH,
            Self::ActiveConnections(_) => DEST_ATTR_ACTIVE_CONNS,
            Self::InactiveConnections(_) => DEST_ATTR_INACT_CONNS,
            Self::AddressFamily(_) => DEST_ATTR_ADDR_FAMILY,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Address(bytes) => buffer[..bytes.len()].copy_from_slice(bytes),
            Self::Port(port) => buffer[..2].copy_from_slice(&port.to_be_bytes()),
            Self::AddressFamily(value) => emit_u16_into(buffer, *value),
            Self::ForwardMethod(value)
            | Self::Weight(value)
            | Self::UpperThreshold(value)
            | Self::LowerThreshold(value)
            | Self::ActiveConnections(value)
            | Self::InactiveConnections(value) => emit_u32_into(buffer, *value),
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'b, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'b T>> for DestAttribute {
    fn parse(buf: &NlaBuffer<&'b T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            DEST_ATTR_ADDR => Self::Address(value.to_vec()),
            DEST_ATTR_PORT => Self::Port(parse_u16_be(value)?),
            DEST_ATTR_FWD_METHOD => Self::ForwardMethod(parse_u32(value)?),
            DEST_ATTR_WEIGHT => Self::Weight(parse_u32(value)?),
            DEST_ATTR_U_THRESH => Self::UpperThreshold(parse_u32(value)?),
            DEST_ATTR_L_THRESH => Self::LowerThreshold(parse_u32(value)?),
            DEST_ATTR_ACTIVE_CONNS => Self::ActiveConnections(parse_u32(value)?),
            DEST_ATTR_INACT_CONNS => Self::InactiveConnections(parse_u32(value)?),
            DEST_ATTR_ADDR_FAMILY => Self::AddressFamily(parse_u16(value)?),
            _ => Self::Other(DefaultNla::parse(buf)?),
        })
    }
}

// The buffers come from `value_len`, so the crate's emitters cannot fail here.
fn emit_u16_into(buffer: &mut [u8], value: u16) {
    if emit_u16(buffer, value).is_err() {
        debug_assert!(false, "attribute buffer sized by value_len");
    }
}

fn emit_u32_into(buffer: &mut [u8], value: u32) {
    if emit_u32(buffer, value).is_err() {
        debug_assert!(false, "attribute buffer sized by value_len");
    }
}

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

/// A request to the IPVS family, whose id the controller gave.
pub type IpvsRequest = NetlinkMessage<GenlMessage<IpvsMessage>>;

fn ipvs_request(
    command: u8,
    flags: u16,
    family: u16,
    attributes: Vec<IpvsAttribute>,
) -> IpvsRequest {
    let mut message = GenlMessage::from_payload(IpvsMessage {
        command,
        attributes,
    });
    message.set_resolved_family_id(family);
    request(flags, message)
}

/// The attributes that identify a virtual server.
fn key_attributes(key: &ServiceKey) -> Vec<ServiceAttribute> {
    vec![
        ServiceAttribute::AddressFamily(af(&key.addr)),
        ServiceAttribute::Protocol(u16::from(ip_protocol(key.protocol))),
        ServiceAttribute::Address(ip_bytes(&key.addr)),
        ServiceAttribute::Port(key.port),
    ]
}

/// Adds (`edit` false) or edits a virtual server.
pub fn service_request(server: &VirtualServer, edit: bool, family: u16) -> IpvsRequest {
    let command = if edit {
        CMD_SET_SERVICE
    } else {
        CMD_NEW_SERVICE
    };
    let flags = if server.persistence_timeout.is_some() {
        SVC_F_PERSISTENT
    } else {
        0
    };
    let netmask = match server.key.addr {
        IpAddr::V4(_) => u32::MAX,
        IpAddr::V6(_) => 128,
    };
    let mut service = key_attributes(&server.key);
    service.extend([
        ServiceAttribute::Scheduler(server.scheduler.clone()),
        // The mask has every flag set: the flags are set as a whole.
        ServiceAttribute::Flags {
            flags,
            mask: u32::MAX,
        },
        ServiceAttribute::Timeout(server.persistence_timeout.unwrap_or(0)),
        ServiceAttribute::Netmask(netmask),
    ]);
    ipvs_request(
        command,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        vec![IpvsAttribute::Service(service)],
    )
}

pub fn delete_service_request(key: &ServiceKey, family: u16) -> IpvsRequest {
    ipvs_request(
        CMD_DEL_SERVICE,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        vec![IpvsAttribute::Service(key_attributes(key))],
    )
}

pub fn list_services_request(family: u16) -> IpvsRequest {
    ipvs_request(
        CMD_GET_SERVICE,
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        Vec::new(),
    )
}

/// Adds (`edit` false) or edits real server `server` of `key` with `weight`.
pub fn dest_request(
    key: &ServiceKey,
    server: &RealServer,
    weight: u32,
    edit: bool,
    family: u16,
) -> IpvsRequest {
    let command = if edit { CMD_SET_DEST } else { CMD_NEW_DEST };
    let dest = vec![
        DestAttribute::Address(ip_bytes(&server.addr)),
        DestAttribute::Port(server.port),
        DestAttribute::ForwardMethod(CONN_F_MASQ),
        DestAttribute::Weight(weight),
        DestAttribute::UpperThreshold(0),
        DestAttribute::LowerThreshold(0),
        DestAttribute::AddressFamily(af(&server.addr)),
    ];
    ipvs_request(
        command,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        vec![
            IpvsAttribute::Service(key_attributes(key)),
            IpvsAttribute::Dest(dest),
        ],
    )
}

pub fn delete_dest_request(key: &ServiceKey, server: &RealServer, family: u16) -> IpvsRequest {
    let dest = vec![
        DestAttribute::Address(ip_bytes(&server.addr)),
        DestAttribute::Port(server.port),
    ];
    ipvs_request(
        CMD_DEL_DEST,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        vec![
            IpvsAttribute::Service(key_attributes(key)),
            IpvsAttribute::Dest(dest),
        ],
    )
}

pub fn list_dests_request(key: &ServiceKey, family: u16) -> IpvsRequest {
    ipvs_request(
        CMD_GET_DEST,
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        vec![IpvsAttribute::Service(key_attributes(key))],
    )
}

/// Timeouts in seconds; 0 leaves the kernel's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

pub fn set_timeouts_request(timeouts: &Timeouts, family: u16) -> IpvsRequest {
    ipvs_request(
        CMD_SET_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        family,
        vec![
            IpvsAttribute::TimeoutTcp(timeouts.tcp),
            IpvsAttribute::TimeoutTcpFin(timeouts.tcp_fin),
            IpvsAttribute::TimeoutUdp(timeouts.udp),
        ],
    )
}

/// A virtual server as the kernel lists it. Firewall-mark services (not ours) have no
/// key and are skipped by [`parse_service`].
pub fn parse_service(answer: &GenlMessage<IpvsMessage>) -> Option<VirtualServer> {
    let nested = answer
        .payload
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            IpvsAttribute::Service(nested) => Some(nested),
            _ => None,
        })?;
    let mut family = None;
    let (mut protocol, mut addr, mut port, mut scheduler) = (None, None, None, None);
    let (mut flags, mut timeout, mut fwmark) = (0, 0, 0);
    for attribute in nested {
        match attribute {
            ServiceAttribute::AddressFamily(value) => family = Some(*value),
            ServiceAttribute::Protocol(value) => protocol = protocol_of(*value),
            ServiceAttribute::Address(bytes) => addr = Some(bytes.as_slice()),
            ServiceAttribute::Port(value) => port = Some(*value),
            ServiceAttribute::Fwmark(value) => fwmark = *value,
            ServiceAttribute::Scheduler(name) => scheduler = Some(name.clone()),
            ServiceAttribute::Flags { flags: value, .. } => flags = *value,
            ServiceAttribute::Timeout(value) => timeout = *value,
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
pub fn parse_dest(
    answer: &GenlMessage<IpvsMessage>,
    service_family: u16,
) -> Option<RealServerStatus> {
    let nested = answer
        .payload
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            IpvsAttribute::Dest(nested) => Some(nested),
            _ => None,
        })?;
    let (mut family, mut addr, mut port) = (service_family, None, None);
    let (mut weight, mut method, mut active, mut inactive) = (0, 0, 0, 0);
    for attribute in nested {
        match attribute {
            DestAttribute::Address(bytes) => addr = Some(bytes.as_slice()),
            DestAttribute::Port(value) => port = Some(*value),
            DestAttribute::ForwardMethod(value) => method = *value,
            DestAttribute::Weight(value) => weight = *value,
            DestAttribute::ActiveConnections(value) => active = *value,
            DestAttribute::InactiveConnections(value) => inactive = *value,
            DestAttribute::AddressFamily(value) => family = *value,
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
        build: impl FnOnce(u16) -> IpvsRequest,
        operation: &'static str,
    ) -> Result<Vec<GenlMessage<IpvsMessage>>, NetlinkError> {
        let request = build(self.genl.family);
        self.genl.socket.request(request, operation)
    }

    pub fn services(&mut self) -> Result<Vec<VirtualServer>, NetlinkError> {
        let answers = self.request(list_services_request, "list IPVS services")?;
        Ok(answers.iter().filter_map(parse_service).collect())
    }

    pub fn add_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        self.request(|f| service_request(server, false, f), "add IPVS service")
            .map(drop)
    }

    pub fn edit_service(&mut self, server: &VirtualServer) -> Result<(), NetlinkError> {
        self.request(|f| service_request(server, true, f), "edit IPVS service")
            .map(drop)
    }

    pub fn delete_service(&mut self, key: &ServiceKey) -> Result<(), NetlinkError> {
        self.request(|f| delete_service_request(key, f), "delete IPVS service")
            .map(drop)
    }

    pub fn dests(&mut self, key: &ServiceKey) -> Result<Vec<RealServerStatus>, NetlinkError> {
        let family = af(&key.addr);
        let answers = self.request(|f| list_dests_request(key, f), "list IPVS dests")?;
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
            |f| dest_request(key, server, weight, false, f),
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
            |f| dest_request(key, server, weight, true, f),
            "edit IPVS dest",
        )
        .map(drop)
    }

    pub fn delete_dest(
        &mut self,
        key: &ServiceKey,
        server: &RealServer,
    ) -> Result<(), NetlinkError> {
        self.request(|f| delete_dest_request(key, server, f), "delete IPVS dest")
            .map(drop)
    }

    pub fn set_timeouts(&mut self, timeouts: &Timeouts) -> Result<(), NetlinkError> {
        self.request(|f| set_timeouts_request(timeouts, f), "set IPVS timeouts")
            .map(drop)
    }
}
