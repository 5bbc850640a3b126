// SPDX-License-Identifier: Apache-2.0
//! ctnetlink (NETLINK_NETFILTER, subsystem CTNETLINK): dump one family's conntrack table,
//! delete entries by their original tuple. The message layout is small enough to write here:
//! `nlmsghdr`, `nfgenmsg`, then netlink attributes (CTA_*), nested for tuples.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::{ConntrackTable, Entry, Error, Result, Tuple};
use crate::model::IpFamily;
use crate::proxier::netlink::{
    Malformed, Message, MessageBuilder, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attrs, split_messages,
};
#[cfg(test)]
use crate::proxier::netlink::{NLM_F_MULTI, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, take4};

const NFGENMSG_LEN: usize = 4;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

fn af(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => AF_INET,
        IpFamily::V6 => AF_INET6,
    }
}

/// A ctnetlink message: the subsystem in the type's high byte, then `nfgenmsg` (family,
/// NFNETLINK_V0, res_id 0).
fn ct_message(msg_type: u16, flags: u16, seq: u32, family: u8) -> MessageBuilder {
    MessageBuilder::new(
        (NFNL_SUBSYS_CTNETLINK << 8) | msg_type,
        flags,
        seq,
        &[family, 0, 0, 0],
    )
}

/// A dump of every entry of one family (the kernel filters on the nfgenmsg family).
pub fn dump_request(family: IpFamily, seq: u32) -> Vec<u8> {
    ct_message(
        IPCTNL_MSG_CT_GET,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        af(family),
    )
    .finish()
}

/// Deletes `entry`, identified by its original tuple (and zone).
pub fn delete_request(entry: &Entry, seq: u32) -> Vec<u8> {
    let mut msg = ct_message(
        IPCTNL_MSG_CT_DELETE,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        af(entry.family),
    );
    let t = &entry.orig;
    msg.begin_nested(CTA_TUPLE_ORIG);
    msg.begin_nested(CTA_TUPLE_IP);
    match (t.src, t.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            msg.attr(CTA_IP_V4_SRC, &src.octets());
            msg.attr(CTA_IP_V4_DST, &dst.octets());
        }
        (src, dst) => {
            msg.attr(CTA_IP_V6_SRC, &v6(src).octets());
            msg.attr(CTA_IP_V6_DST, &v6(dst).octets());
        }
    }
    msg.end_nested();
    msg.begin_nested(CTA_TUPLE_PROTO);
    msg.attr(CTA_PROTO_NUM, &[t.protocol]);
    msg.attr(CTA_PROTO_SRC_PORT, &t.src_port.to_be_bytes());
    msg.attr(CTA_PROTO_DST_PORT, &t.dst_port.to_be_bytes());
    msg.end_nested();
    msg.end_nested();
    if entry.zone != 0 {
        msg.attr(CTA_ZONE, &entry.zone.to_be_bytes());
    }
    msg.finish()
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(v6) => v6,
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
    }
}

/// One message of a kernel reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A conntrack entry (its nfgenmsg family and attributes).
    Entry {
        family: u8,
        attrs: &'a [u8],
    },
    /// An error (or, with 0, an ACK).
    Error(i32),
    Done,
    Other,
}

/// Splits a datagram into messages.
pub fn parse_replies(data: &[u8]) -> Result<Vec<Reply<'_>>> {
    let messages = split_messages(data).map_err(|Malformed(what)| Error::Malformed(what))?;
    messages
        .into_iter()
        .map(|message| {
            Ok(match message {
                Message::Done(_) => Reply::Done,
                Message::Error(code) => Reply::Error(code),
                Message::Data { msg_type, body } if msg_type >> 8 == NFNL_SUBSYS_CTNETLINK => {
                    if body.len() < NFGENMSG_LEN {
                        return Err(Error::Malformed("nfgenmsg"));
                    }
                    Reply::Entry {
                        family: body[0],
                        attrs: &body[NFGENMSG_LEN..],
                    }
                }
                Message::Data { .. } => Reply::Other,
            })
        })
        .collect()
}

/// Decodes a dumped entry; `None` for entries this cleanup has no use for (no ports,
/// unknown family).
pub fn parse_entry(family: u8, data: &[u8]) -> Option<Entry> {
    let family = match family {
        AF_INET => IpFamily::V4,
        AF_INET6 => IpFamily::V6,
        _ => return None,
    };
    let (mut orig, mut reply, mut zone) = (None, None, 0);
    for (attr_type, payload) in attrs(data) {
        match attr_type {
            CTA_TUPLE_ORIG => orig = parse_tuple(payload),
            CTA_TUPLE_REPLY => reply = parse_tuple(payload),
            CTA_ZONE if payload.len() >= 2 => zone = u16::from_be_bytes([payload[0], payload[1]]),
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

fn parse_tuple(data: &[u8]) -> Option<Tuple> {
    let (mut src, mut dst, mut protocol, mut sport, mut dport) = (None, None, None, 0, 0);
    for (attr_type, payload) in attrs(data) {
        match attr_type {
            CTA_TUPLE_IP => {
                for (ip_type, ip) in attrs(payload) {
                    let addr = match ip.len() {
                        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(ip).ok()?)),
                        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip).ok()?)),
                        _ => continue,
                    };
                    match ip_type {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(addr),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(addr),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (proto_type, value) in attrs(payload) {
                    match (proto_type, value) {
                        (CTA_PROTO_NUM, [num, ..]) => protocol = Some(*num),
                        (CTA_PROTO_SRC_PORT, [a, b, ..]) => sport = u16::from_be_bytes([*a, *b]),
                        (CTA_PROTO_DST_PORT, [a, b, ..]) => dport = u16::from_be_bytes([*a, *b]),
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

/// The production cleaner: a NETLINK_NETFILTER socket in the caller's network namespace,
/// opened per cleanup (cleanups are rare; an idle socket would only hold memory).
#[derive(Debug, Default)]
pub struct NetlinkConntrack {
    seq: u32,
}

impl NetlinkConntrack {
    pub fn new() -> Self {
        Self::default()
    }

    fn open() -> Result<OwnedFd> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(Error::Socket)?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(Error::Socket)?;
        // A kernel that never answers must not hang the sync loop.
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(5, 0)).map_err(Error::Socket)?;
        Ok(fd)
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn dump_on(&mut self, fd: &OwnedFd, family: IpFamily) -> Result<Vec<Entry>> {
        let request = dump_request(family, self.next_seq());
        send(fd, &request, "dump")?;
        let mut entries = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(|source| {
                Error::Kernel {
                    operation: "dump",
                    source,
                }
            })?;
            for reply in parse_replies(&buf[..n])? {
                match reply {
                    // A kernel that ignores the requested family still gets it right.
                    Reply::Entry { family: af, attrs } => entries
                        .extend(parse_entry(af, attrs).filter(|entry| entry.family == family)),
                    Reply::Done => return Ok(entries),
                    Reply::Error(0) | Reply::Other => {}
                    Reply::Error(code) => {
                        return Err(Error::Kernel {
                            operation: "dump",
                            source: Errno::from_raw(-code),
                        });
                    }
                }
            }
        }
    }

    fn delete_entry(&mut self, fd: &OwnedFd, entry: &Entry, buf: &mut [u8]) -> Result<bool> {
        let request = delete_request(entry, self.next_seq());
        send(fd, &request, "delete")?;
        let n = recv(fd.as_raw_fd(), buf, MsgFlags::empty()).map_err(|source| Error::Kernel {
            operation: "delete",
            source,
        })?;
        for reply in parse_replies(&buf[..n])? {
            match reply {
                Reply::Error(0) => return Ok(true),
                // Gone meanwhile (it expired, or another cleanup took it).
                Reply::Error(code) if -code == Errno::ENOENT as i32 => return Ok(false),
                Reply::Error(code) => {
                    return Err(Error::Kernel {
                        operation: "delete",
                        source: Errno::from_raw(-code),
                    });
                }
                _ => {}
            }
        }
        Err(Error::Malformed("no acknowledgement"))
    }
}

fn send(fd: &OwnedFd, request: &[u8], operation: &'static str) -> Result<()> {
    sendto(
        fd.as_raw_fd(),
        request,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map(drop)
    .map_err(|source| Error::Kernel { operation, source })
}

impl ConntrackTable for NetlinkConntrack {
    fn list(&mut self, family: IpFamily) -> Result<Vec<Entry>> {
        let fd = Self::open()?;
        self.dump_on(&fd, family)
    }

    fn delete(&mut self, entries: &[Entry]) -> Result<usize> {
        if entries.is_empty() {
            return Ok(0);
        }
        let fd = Self::open()?;
        let mut buf = vec![0u8; 8192];
        let mut deleted = 0;
        for entry in entries {
            deleted += usize::from(self.delete_entry(&fd, entry, &mut buf)?);
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A dumped entry as the kernel sends it: both tuples, the zone.
    fn dumped(entry: &Entry) -> Vec<u8> {
        let mut msg = ct_message(0, NLM_F_MULTI, 1, af(entry.family));
        for (attr, t) in [
            (CTA_TUPLE_ORIG, &entry.orig),
            (CTA_TUPLE_REPLY, &entry.reply),
        ] {
            msg.begin_nested(attr);
            msg.begin_nested(CTA_TUPLE_IP);
            match (t.src, t.dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    msg.attr(CTA_IP_V4_SRC, &s.octets());
                    msg.attr(CTA_IP_V4_DST, &d.octets());
                }
                (s, d) => {
                    msg.attr(CTA_IP_V6_SRC, &v6(s).octets());
                    msg.attr(CTA_IP_V6_DST, &v6(d).octets());
                }
            }
            msg.end_nested();
            msg.begin_nested(CTA_TUPLE_PROTO);
            msg.attr(CTA_PROTO_NUM, &[t.protocol]);
            msg.attr(CTA_PROTO_SRC_PORT, &t.src_port.to_be_bytes());
            msg.attr(CTA_PROTO_DST_PORT, &t.dst_port.to_be_bytes());
            msg.end_nested();
            msg.end_nested();
        }
        msg.attr(CTA_ZONE, &entry.zone.to_be_bytes());
        msg.finish()
    }

    #[test]
    fn dumped_entries_decode() {
        let e = entry();
        let mut datagram = dumped(&e);
        let mut v6 = e;
        v6.family = IpFamily::V6;
        v6.orig.dst = "fd00::42".parse().unwrap();
        v6.orig.src = "fd00::2".parse().unwrap();
        v6.reply.src = "fd00::1".parse().unwrap();
        v6.reply.dst = "fd00::2".parse().unwrap();
        datagram.extend(dumped(&v6));
        let done = MessageBuilder::new(NLMSG_DONE, NLM_F_MULTI, 1, &0i32.to_ne_bytes()).finish();
        datagram.extend(done);
        let replies = parse_replies(&datagram).unwrap();
        assert_eq!(replies.len(), 3);
        let decoded: Vec<Entry> = replies
            .iter()
            .filter_map(|r| match r {
                Reply::Entry { family, attrs } => parse_entry(*family, attrs),
                _ => None,
            })
            .collect();
        assert_eq!(decoded, vec![e, v6]);
        assert_eq!(replies[2], Reply::Done);
    }

    #[test]
    fn delete_requests_carry_the_original_tuple_and_zone() {
        let e = entry();
        let request = delete_request(&e, 9);
        assert_eq!(
            u32::from_ne_bytes(take4(&request, 0)) as usize,
            request.len()
        );
        assert_eq!(
            u16::from_ne_bytes([request[4], request[5]]),
            (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
        );
        assert_eq!(
            u16::from_ne_bytes([request[6], request[7]]),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(request[NLMSG_HDRLEN], AF_INET);
        let body = &request[NLMSG_HDRLEN + NFGENMSG_LEN..];
        let found: Vec<(u16, Option<Tuple>)> = attrs(body)
            .map(|(t, payload)| {
                (
                    t,
                    (t == CTA_TUPLE_ORIG)
                        .then(|| parse_tuple(payload))
                        .flatten(),
                )
            })
            .collect();
        assert_eq!(found[0], (CTA_TUPLE_ORIG, Some(e.orig)));
        assert_eq!(found[1].0, CTA_ZONE);
        assert_eq!(found.len(), 2, "no reply tuple is needed to delete");
    }

    #[test]
    fn errors_and_truncation() {
        let ack = MessageBuilder::new(NLMSG_ERROR, 0, 1, &(-2i32).to_ne_bytes()).finish();
        assert_eq!(parse_replies(&ack).unwrap(), vec![Reply::Error(-2)]);
        let mut bad = ack.clone();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse_replies(&bad).is_err());
        assert_eq!(parse_entry(99, &[]), None);
    }
}
