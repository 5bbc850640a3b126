// SPDX-License-Identifier: Apache-2.0
//! ctnetlink (NETLINK_NETFILTER, subsystem CTNETLINK) on netlink-packet-netfilter: dump
//! one family's conntrack table, delete entries by their original tuple. The crate has
//! the messages and the tuple attributes; the zone (`CTA_ZONE`, which it does not
//! define) travels as a plain attribute.

use std::net::{IpAddr, Ipv6Addr};

use netlink_packet_core::{DefaultNla, NLA_TYPE_MASK, Nla};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Tuple as CtTuple,
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
