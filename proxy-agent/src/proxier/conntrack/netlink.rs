// SPDX-License-Identifier: Apache-2.0
//! ctnetlink (NETLINK_NETFILTER, subsystem CTNETLINK) on netlink-packet-netfilter: dump
//! one family's conntrack table, delete entries by their original tuple, create entries
//! that carry a NAT binding ([`NatFlow`]). The crate has the messages, the tuple and TCP
//! attributes; the zone (`CTA_ZONE`) and the NAT ranges (`CTA_NAT_DST`, `CTA_NAT_SRC`),
//! which it does not define, travel as plain attributes encoded here.

use std::net::{IpAddr, Ipv6Addr};

use netlink_packet_core::{DefaultNla, NLA_TYPE_MASK, Nla};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, TCPFlags,
    Tuple as CtTuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::errno::Errno;

use super::{ConntrackTable, Entry, Error, Result, Tuple};
use crate::model::IpFamily;
use crate::proxier::netlink::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, NetlinkMessage, NetlinkSocket, request,
};

/// NLM_F_CREATE and NLM_F_EXCL: a new entry, never a change to an existing one.
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_EXCL: u16 = 0x200;
/// `CTA_NAT_SRC`, `CTA_NAT_DST` and their nested attributes (linux/netfilter/nfnetlink_conntrack.h).
const CTA_NAT_SRC: u16 = 6;
const CTA_NAT_DST: u16 = 13;
const CTA_NAT_V4_MINIP: u16 = 1;
const CTA_NAT_V4_MAXIP: u16 = 2;
const CTA_NAT_PROTO: u16 = 3;
const CTA_NAT_V6_MINIP: u16 = 4;
const CTA_NAT_V6_MAXIP: u16 = 5;
const CTA_PROTONAT_PORT_MIN: u16 = 1;
const CTA_PROTONAT_PORT_MAX: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
/// TCP_CONNTRACK_ESTABLISHED, and IP_CT_TCP_FLAG_BE_LIBERAL: the entry knows no window yet,
/// so its first packets are not judged against one.
const TCP_CONNTRACK_ESTABLISHED: u8 = 3;
const IP_CT_TCP_FLAG_BE_LIBERAL: u8 = 0x08;

/// A connection to create in netfilter's table already translated: its original tuple, the
/// destination it is DNATed to and, when masqueraded, the source it is SNATed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatFlow {
    pub family: IpFamily,
    pub orig: Tuple,
    pub dnat_to: std::net::SocketAddr,
    pub snat_to: Option<std::net::SocketAddr>,
    /// Seconds until netfilter forgets it without traffic.
    pub timeout: u32,
}

/// One netlink attribute (header, payload, padding to 4 bytes).
fn nla_bytes(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut bytes = Vec::with_capacity(len.next_multiple_of(4));
    bytes.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(payload);
    bytes.resize(len.next_multiple_of(4), 0);
    bytes
}

/// A NAT range of exactly one address and port (`CTA_NAT_*`'s nested attributes).
fn nat_range(to: std::net::SocketAddr) -> Vec<u8> {
    let mut value = match to.ip() {
        IpAddr::V4(ip) => [
            nla_bytes(CTA_NAT_V4_MINIP, &ip.octets()),
            nla_bytes(CTA_NAT_V4_MAXIP, &ip.octets()),
        ]
        .concat(),
        IpAddr::V6(ip) => [
            nla_bytes(CTA_NAT_V6_MINIP, &ip.octets()),
            nla_bytes(CTA_NAT_V6_MAXIP, &ip.octets()),
        ]
        .concat(),
    };
    let port = to.port().to_be_bytes();
    let ports = [
        nla_bytes(CTA_PROTONAT_PORT_MIN, &port),
        nla_bytes(CTA_PROTONAT_PORT_MAX, &port),
    ]
    .concat();
    value.extend(nla_bytes(CTA_NAT_PROTO | NLA_F_NESTED, &ports));
    value
}

/// Creates `flow`: the original tuple and its untranslated reply, then the NAT bindings,
/// from which the kernel computes the translated reply tuple (as a rule's DNAT and
/// masquerade would have).
pub fn create_request(flow: &NatFlow) -> NetlinkMessage<NetfilterMessage> {
    let reply = Tuple {
        src: flow.orig.dst,
        dst: flow.orig.src,
        protocol: flow.orig.protocol,
        src_port: flow.orig.dst_port,
        dst_port: flow.orig.src_port,
    };
    let mut attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(&flow.orig)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(&reply)),
        ConntrackAttribute::CtaTimeout(flow.timeout),
        ConntrackAttribute::Other(DefaultNla::new(
            CTA_NAT_DST | NLA_F_NESTED,
            nat_range(flow.dnat_to),
        )),
    ];
    if let Some(snat) = flow.snat_to {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_NAT_SRC | NLA_F_NESTED,
            nat_range(snat),
        )));
    }
    if flow.orig.protocol == super::IPPROTO_TCP {
        let liberal = || TCPFlags::parse(&[IP_CT_TCP_FLAG_BE_LIBERAL, IP_CT_TCP_FLAG_BE_LIBERAL]);
        let mut tcp = vec![ProtoInfoTCP::State(TCP_CONNTRACK_ESTABLISHED)];
        if let (Ok(original), Ok(reply)) = (liberal(), liberal()) {
            tcp.push(ProtoInfoTCP::OriginalFlags(original));
            tcp.push(ProtoInfoTCP::ReplyFlags(reply));
        }
        attributes.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(tcp)]));
    }
    ct_request(
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        flow.family,
        ConntrackMessage::New(attributes),
    )
}

/// `CTA_ZONE`: a big-endian u16, present when the entry is not in zone 0.
const CTA_ZONE: u16 = 18;

/// NFNETLINK_V0.
const NFNETLINK_VERSION: u8 = 0;

fn proto_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// A ctnetlink request: `nfgenmsg` (family, NFNETLINK_V0, res_id 0), then the message.
fn ct_request(
    flags: u16,
    family: IpFamily,
    message: ConntrackMessage,
) -> NetlinkMessage<NetfilterMessage> {
    let header = NetfilterHeader::new(proto_family(family), NFNETLINK_VERSION, 0);
    request(flags, NetfilterMessage::new(header, message))
}

/// A dump of every entry of one family (the kernel filters on the nfgenmsg family).
pub fn dump_request(family: IpFamily) -> NetlinkMessage<NetfilterMessage> {
    ct_request(
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        ConntrackMessage::Get(Vec::new()),
    )
}

/// A tuple's attributes: addresses (both IPv4, or both as IPv6), protocol and ports.
fn tuple_attributes(t: &Tuple) -> Vec<CtTuple> {
    let (src, dst) = match (t.src, t.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => (IpAddr::V4(src), IpAddr::V4(dst)),
        (src, dst) => (IpAddr::V6(v6(src)), IpAddr::V6(v6(dst))),
    };
    vec![
        CtTuple::Ip(vec![
            IPTuple::SourceAddress(src),
            IPTuple::DestinationAddress(dst),
        ]),
        CtTuple::Proto(vec![
            ProtoTuple::Protocol(t.protocol.into()),
            ProtoTuple::SourcePort(t.src_port),
            ProtoTuple::DestinationPort(t.dst_port),
        ]),
    ]
}

/// Deletes `entry`, identified by its original tuple (and zone).
pub fn delete_request(entry: &Entry) -> NetlinkMessage<NetfilterMessage> {
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(
        &entry.orig,
    ))];
    if entry.zone != 0 {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            entry.zone.to_be_bytes().to_vec(),
        )));
    }
    ct_request(
        NLM_F_REQUEST | NLM_F_ACK,
        entry.family,
        ConntrackMessage::Delete(attributes),
    )
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(v6) => v6,
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
    }
}

/// Decodes a dumped entry; `None` for messages that are not conntrack entries and for
/// entries this cleanup has no use for (no ports, unknown family).
pub fn parse_entry(message: &NetfilterMessage) -> Option<Entry> {
    let family = match message.header.family {
        NetfilterProtoFamily::IPv4 => IpFamily::V4,
        NetfilterProtoFamily::IPv6 => IpFamily::V6,
        _ => return None,
    };
    let attributes = match &message.inner {
        NetfilterMessageInner::Conntrack(
            ConntrackMessage::New(attributes)
            | ConntrackMessage::Get(attributes)
            | ConntrackMessage::Delete(attributes),
        ) => attributes,
        _ => return None,
    };
    let (mut orig, mut reply, mut zone) = (None, None, 0);
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(t) => orig = parse_tuple(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = parse_tuple(t),
            ConntrackAttribute::Other(nla) if nla.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                let mut value = vec![0u8; nla.value_len()];
                nla.emit_value(&mut value);
                if let [a, b, ..] = value[..] {
                    zone = u16::from_be_bytes([a, b]);
                }
            }
            _ => {}
        }
    }
    Some(Entry {
        family,
        orig: orig?,
        reply: reply?,
        zone,
    })
}

fn parse_tuple(attributes: &[CtTuple]) -> Option<Tuple> {
    let (mut src, mut dst, mut protocol, mut sport, mut dport) = (None, None, None, 0, 0);
    for attribute in attributes {
        match attribute {
            CtTuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(addr) => src = Some(*addr),
                        IPTuple::DestinationAddress(addr) => dst = Some(*addr),
                        _ => {}
                    }
                }
            }
            CtTuple::Proto(protos) => {
                for proto in protos {
                    match proto {
                        ProtoTuple::Protocol(p) => protocol = Some(u8::from(*p)),
                        ProtoTuple::SourcePort(port) => sport = *port,
                        ProtoTuple::DestinationPort(port) => dport = *port,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        src: src?,
        dst: dst?,
        protocol: protocol?,
        src_port: sport,
        dst_port: dport,
    })
}

/// The conntrack module's errors for the shared socket's.
fn conntrack_error(err: NetlinkError) -> Error {
    match err {
        NetlinkError::Socket(errno) => Error::Socket(errno),
        NetlinkError::Io { operation, source } => Error::Kernel { operation, source },
        NetlinkError::Kernel { operation, errno } => Error::Kernel {
            operation,
            source: errno,
        },
        NetlinkError::Malformed { .. } => Error::Malformed("ctnetlink answer"),
    }
}

/// The production cleaner: a NETLINK_NETFILTER socket in the caller's network namespace,
/// opened per cleanup (cleanups are rare; an idle socket would only hold memory).
#[derive(Debug, Default)]
pub struct NetlinkConntrack;

impl NetlinkConntrack {
    pub fn new() -> Self {
        Self
    }

    fn open() -> Result<NetlinkSocket> {
        NetlinkSocket::open(NETLINK_NETFILTER).map_err(conntrack_error)
    }
}

impl NetlinkConntrack {
    /// Creates each flow (see `create_request`); returns how many were created. One the
    /// table already has is left as it is, or replaced (see [`Replace`]).
    pub fn create_translated(&mut self, flows: &[NatFlow], replace: Replace) -> Result<usize> {
        if flows.is_empty() {
            return Ok(0);
        }
        let mut socket = Self::open()?;
        let mut created = 0;
        for flow in flows {
            match socket.request(create_request(flow), "create") {
                Ok(_) => created += 1,
                Err(err) if err.errno() == Some(Errno::EEXIST) => {
                    if replace == Replace::Existing {
                        created += usize::from(replace_entry(&mut socket, flow)?);
                    }
                }
                Err(err) => return Err(conntrack_error(err)),
            }
        }
        Ok(created)
    }
}

/// What [`NetlinkConntrack::create_translated`] does with a flow netfilter already has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// Leaves the entry as it is.
    Nothing,
    /// Deletes it and creates the flow as given: the caller's translation is the live
    /// one, and the entry netfilter has is older.
    Existing,
}

/// Deletes the entry with `flow`'s original tuple and creates `flow` in its place. Returns
/// whether it was created (not when a packet made a new entry in between).
fn replace_entry(socket: &mut NetlinkSocket, flow: &NatFlow) -> Result<bool> {
    let stale = Entry {
        family: flow.family,
        orig: flow.orig,
        // A delete names the original direction only.
        reply: flow.orig,
        zone: 0,
    };
    match socket.request(delete_request(&stale), "delete") {
        Ok(_) => {}
        Err(err) if err.errno() == Some(Errno::ENOENT) => {}
        Err(err) => return Err(conntrack_error(err)),
    }
    match socket.request(create_request(flow), "create") {
        Ok(_) => Ok(true),
        Err(err) if err.errno() == Some(Errno::EEXIST) => Ok(false),
        Err(err) => Err(conntrack_error(err)),
    }
}

impl ConntrackTable for NetlinkConntrack {
    fn list(&mut self, family: IpFamily) -> Result<Vec<Entry>> {
        let mut socket = Self::open()?;
        let answers = socket
            .request(dump_request(family), "dump")
            .map_err(conntrack_error)?;
        Ok(answers
            .iter()
            .filter_map(parse_entry)
            // A kernel that ignores the requested family still gets it right.
            .filter(|entry| entry.family == family)
            .collect())
    }

    fn delete(&mut self, entries: &[Entry]) -> Result<usize> {
        if entries.is_empty() {
            return Ok(0);
        }
        let mut socket = Self::open()?;
        let mut deleted = 0;
        for entry in entries {
            match socket.request(delete_request(entry), "delete") {
                Ok(_) => deleted += 1,
                // Gone meanwhile (it expired, or another cleanup took it).
                Err(err) if err.errno() == Some(Errno::ENOENT) => {}
                Err(err) => return Err(conntrack_error(err)),
            }
        }
        Ok(deleted)
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

    fn entry() -> Entry {
        Entry {
            family: IpFamily::V4,
            orig: Tuple {
                src: "10.0.0.2".parse().unwrap(),
                dst: "172.30.0.42".parse().unwrap(),
                protocol: super::super::IPPROTO_UDP,
                src_port: 40000,
                dst_port: 53,
            },
            reply: Tuple {
                src: "10.180.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                protocol: super::super::IPPROTO_UDP,
                src_port: 53,
                dst_port: 40000,
            },
            zone: 7,
        }
    }

    fn entry_v6() -> Entry {
        Entry {
            family: IpFamily::V6,
            orig: Tuple {
                src: "fd00::2".parse().unwrap(),
                dst: "fd00::42".parse().unwrap(),
                protocol: super::super::IPPROTO_UDP,
                src_port: 40001,
                dst_port: 53,
            },
            reply: Tuple {
                src: "fd00::1".parse().unwrap(),
                dst: "fd00::2".parse().unwrap(),
                protocol: super::super::IPPROTO_UDP,
                src_port: 53,
                dst_port: 40001,
            },
            zone: 0,
        }
    }

    // The requests' bytes as the former hand-written encoder produced them.
    const DUMP_V4: &str = "1400000001010103010000000000000002000000";
    const DUMP_V6: &str = "140000000101010302000000000000000a000000";
    const DELETE_V4: &str = "50000000020105000900000000000000020000003400018014000180080001000a00000208000200ac1e002a1c0002800500010011000000060002009c40000006000300003500000600120000070000";
    const DELETE_V6: &str = "60000000020105000a000000000000000a0000004c0001802c00018014000300fd00000000000000000000000000000214000400fd0000000000000000000000000000421c0002800500010011000000060002009c4100000600030000350000";

    #[test]
    fn requests_are_byte_for_byte_the_former_ones() {
        assert_eq!(hex(&encode(&mut dump_request(IpFamily::V4), 1)), DUMP_V4);
        assert_eq!(hex(&encode(&mut dump_request(IpFamily::V6), 2)), DUMP_V6);
        assert_eq!(hex(&encode(&mut delete_request(&entry()), 9)), DELETE_V4);
        assert_eq!(
            hex(&encode(&mut delete_request(&entry_v6()), 10)),
            DELETE_V6
        );
    }

    /// A dumped entry as the kernel sends it (IPCTNL_MSG_CT_NEW): both tuples, the zone.
    fn dumped(entry: &Entry) -> Vec<u8> {
        let mut attributes = vec![
            ConntrackAttribute::CtaTupleOrig(tuple_attributes(&entry.orig)),
            ConntrackAttribute::CtaTupleReply(tuple_attributes(&entry.reply)),
        ];
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            entry.zone.to_be_bytes().to_vec(),
        )));
        let mut message = ct_request(0, entry.family, ConntrackMessage::New(attributes));
        encode(&mut message, 1)
    }

    fn decode(datagram: &[u8]) -> Vec<Received<NetfilterMessage>> {
        split_datagram(datagram).unwrap()
    }

    #[test]
    fn dumped_entries_decode() {
        let mut datagram = dumped(&entry());
        datagram.extend(dumped(&entry_v6()));
        // NLMSG_DONE with status 0.
        datagram.extend(hex_bytes("1400000003000200010000000000000000000000"));
        let replies = decode(&datagram);
        assert_eq!(replies.len(), 3);
        let decoded: Vec<Entry> = replies
            .iter()
            .filter_map(|r| match r {
                Received::Data(message) => parse_entry(message),
                _ => None,
            })
            .collect();
        assert_eq!(decoded, vec![entry(), entry_v6()]);
        assert_eq!(replies[2], Received::Complete);
    }

    fn hex_bytes(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn delete_requests_carry_the_original_tuple_and_zone() {
        let bytes = encode(&mut delete_request(&entry()), 9);
        let [Received::Data(message)] = &decode(&bytes)[..] else {
            panic!()
        };
        let NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attributes)) = &message.inner
        else {
            panic!("{message:?}")
        };
        assert_eq!(attributes.len(), 2, "no reply tuple is needed to delete");
        let ConntrackAttribute::CtaTupleOrig(orig) = &attributes[0] else {
            panic!()
        };
        assert_eq!(parse_tuple(orig), Some(entry().orig));
        assert_eq!(attributes[1].kind(), CTA_ZONE);
    }

    #[test]
    fn errors_and_truncation() {
        // NLMSG_ERROR with -ENOENT, then the request's header.
        let nack =
            hex_bytes("24000000020000000100000000000000feffffff1000000001010100090000000000000000");
        let nack = &nack[..36];
        assert_eq!(decode(nack), vec![Received::Refused(2)]);
        let mut bad = nack.to_vec();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(split_datagram::<NetfilterMessage>(&bad).is_err());
        let mut other = ct_request(0, IpFamily::V4, ConntrackMessage::New(Vec::new()));
        other.payload = netlink_packet_core::NetlinkPayload::InnerMessage(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Other(99), 0, 0),
            ConntrackMessage::New(Vec::new()),
        ));
        let [Received::Data(message)] = &decode(&encode(&mut other, 1))[..] else {
            panic!()
        };
        assert_eq!(parse_entry(message), None, "unknown family");
    }
}
