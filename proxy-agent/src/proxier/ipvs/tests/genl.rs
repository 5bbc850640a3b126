// SPDX-License-Identifier: Apache-2.0
//! The IPVS netlink messages: the bytes of each request (byte for byte those of the
//! former hand-written encoder), and list replies decoded.

use netlink_packet_core::{DefaultNla, NLA_F_NESTED, NetlinkPayload};
use netlink_packet_generic::GenlMessage;

use crate::model::Protocol;
use crate::proxier::ipvs::desired::{RealServer, ServiceKey, VirtualServer};
use crate::proxier::ipvs::genl::*;
use crate::proxier::netlink::socket::{Received, split_datagram};
use crate::proxier::netlink::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, encode, request};

const FAMILY: u16 = 0x1d;

fn key() -> ServiceKey {
    ServiceKey {
        addr: "10.96.0.10".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
    }
}

fn key_v6() -> ServiceKey {
    ServiceKey {
        addr: "fd00::10".parse().unwrap(),
        protocol: Protocol::Udp,
        port: 53,
    }
}

fn server(persistence: Option<u32>) -> VirtualServer {
    VirtualServer {
        key: key(),
        scheduler: "rr".into(),
        persistence_timeout: persistence,
    }
}

fn real_v6() -> RealServer {
    RealServer {
        addr: "fd00::2".parse().unwrap(),
        port: 8080,
    }
}

fn real_v4() -> RealServer {
    RealServer {
        addr: "10.180.0.1".parse().unwrap(),
        port: 9376,
    }
}

fn hex(mut request: IpvsRequest, seq: u32) -> String {
    encode(&mut request, seq)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Header flags and the decoded message, as the kernel reads the request.
fn decode(mut request: IpvsRequest) -> (u16, GenlMessage<IpvsMessage>) {
    let flags = request.header.flags;
    let bytes = encode(&mut request, 1);
    match split_datagram(&bytes).unwrap().pop() {
        Some(Received::Data(message)) => (flags, message),
        other => panic!("{other:?}"),
    }
}

#[test]
fn service_requests_are_byte_for_byte_the_former_ones() {
    let sctp = ServiceKey {
        addr: "10.96.0.11".parse().unwrap(),
        protocol: Protocol::Sctp,
        port: 7777,
    };
    let v6server = VirtualServer {
        key: key_v6(),
        scheduler: "wrr".into(),
        persistence_timeout: None,
    };
    // NEW_SERVICE: AF_INET, IPPROTO_TCP, 10.96.0.10, port 80 in network order, "rr",
    // flags persistent with every flag in the mask, timeout 10800, netmask /32.
    assert_eq!(
        hex(service_request(&server(Some(10800)), false, FAMILY), 4),
        "5c0000001d0005000400000000000000010100004800018006000100020000000600020006000000080003000a60000a060004000050000007000600727200000c00070001000000ffffffff08000800302a000008000900ffffffff"
    );
    assert_eq!(
        hex(service_request(&server(None), true, FAMILY), 5),
        "5c0000001d0005000500000000000000020100004800018006000100020000000600020006000000080003000a60000a060004000050000007000600727200000c00070000000000ffffffff080008000000000008000900ffffffff"
    );
    assert_eq!(
        hex(service_request(&v6server, false, FAMILY), 6),
        "680000001d00050006000000000000000101000054000180060001000a000000060002001100000014000300fd000000000000000000000000000010060004000035000008000600777272000c00070000000000ffffffff08000800000000000800090080000000"
    );
    assert_eq!(
        hex(delete_service_request(&key(), FAMILY), 9),
        "380000001d0005000900000000000000030100002400018006000100020000000600020006000000080003000a60000a0600040000500000"
    );
    assert_eq!(
        hex(delete_service_request(&sctp, FAMILY), 10),
        "380000001d0005000a00000000000000030100002400018006000100020000000600020084000000080003000a60000b060004001e610000"
    );
    assert_eq!(
        hex(list_services_request(FAMILY), 1),
        "140000001d000103010000000000000004010000"
    );
}

#[test]
fn dest_and_config_requests_are_byte_for_byte_the_former_ones() {
    assert_eq!(
        hex(dest_request(&key_v6(), &real_v6(), 1, false, FAMILY), 6),
        "8c0000001d00050006000000000000000501000030000180060001000a000000060002001100000014000300fd00000000000000000000000000001006000400003500004800028014000100fd000000000000000000000000000002060002001f900000080003000000000008000400010000000800050000000000080006000000000006000b000a000000"
    );
    assert_eq!(
        hex(dest_request(&key(), &real_v4(), 0, true, FAMILY), 7),
        "740000001d0005000700000000000000060100002400018006000100020000000600020006000000080003000a60000a06000400005000003c000280080001000ab400010600020024a00000080003000000000008000400000000000800050000000000080006000000000006000b0002000000"
    );
    assert_eq!(
        hex(delete_dest_request(&key_v6(), &real_v6(), FAMILY), 8),
        "640000001d00050008000000000000000701000030000180060001000a000000060002001100000014000300fd00000000000000000000000000001006000400003500002000028014000100fd000000000000000000000000000002060002001f900000"
    );
    assert_eq!(
        hex(delete_dest_request(&key(), &real_v4(), FAMILY), 11),
        "4c0000001d0005000b00000000000000070100002400018006000100020000000600020006000000080003000a60000a060004000050000014000280080001000ab400010600020024a00000"
    );
    assert_eq!(
        hex(list_dests_request(&key(), FAMILY), 2),
        "380000001d0001030200000000000000080100002400018006000100020000000600020006000000080003000a60000a0600040000500000"
    );
    let timeouts = Timeouts {
        tcp: 900,
        tcp_fin: 120,
        udp: 300,
    };
    assert_eq!(
        hex(set_timeouts_request(&timeouts, FAMILY), 3),
        "2c0000001d00050003000000000000000c01000008000400840300000800050078000000080006002c010000"
    );
}

#[test]
fn requests_decode_to_what_was_asked() {
    let (flags, message) = decode(service_request(&server(Some(10800)), false, FAMILY));
    assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK);
    assert_eq!(message.resolved_family_id(), FAMILY);
    assert_eq!((message.header.cmd, message.header.version), (1, 1));
    let answer = parse_service(&message).unwrap();
    assert_eq!(answer, server(Some(10800)));

    let (flags, message) = decode(list_dests_request(&key(), FAMILY));
    assert_eq!((message.header.cmd, flags), (8, NLM_F_REQUEST | NLM_F_DUMP));
    assert_eq!(
        message.payload.attributes,
        vec![IpvsAttribute::Service(vec![
            ServiceAttribute::AddressFamily(2),
            ServiceAttribute::Protocol(6),
            ServiceAttribute::Address(vec![10, 96, 0, 10]),
            ServiceAttribute::Port(80),
        ])]
    );

    let (_, message) = decode(dest_request(&key_v6(), &real_v6(), 0, true, FAMILY));
    assert_eq!(message.header.cmd, 6, "IPVS_CMD_SET_DEST");
    let status = parse_dest(&message, 10).unwrap();
    assert_eq!(status.server, real_v6());
    assert_eq!(
        (status.weight, status.masquerading),
        (0, true),
        "drain weight"
    );
}

/// A list reply as the kernel sends it: 16-byte addresses, stats we ignore.
fn service_reply(
    addr: [u8; 16],
    af: u16,
    proto: u16,
    port: u16,
    flags: u32,
    fwmark: u32,
) -> GenlMessage<IpvsMessage> {
    let mut service = vec![ServiceAttribute::AddressFamily(af)];
    if fwmark != 0 {
        service.push(ServiceAttribute::Fwmark(fwmark));
    } else {
        service.extend([
            ServiceAttribute::Protocol(proto),
            ServiceAttribute::Address(addr.to_vec()),
            ServiceAttribute::Port(port),
        ]);
    }
    service.extend([
        ServiceAttribute::Scheduler("wrr".into()),
        ServiceAttribute::Flags {
            flags,
            mask: u32::MAX,
        },
        ServiceAttribute::Timeout(600),
        ServiceAttribute::Netmask(u32::MAX),
        // IPVS_SVC_ATTR_STATS, nested: IPVS_STATS_ATTR_CONNS 42.
        ServiceAttribute::Other(DefaultNla::new(
            10 | NLA_F_NESTED,
            vec![8, 0, 1, 0, 42, 0, 0, 0],
        )),
    ]);
    let mut message = GenlMessage::from_payload(IpvsMessage {
        command: 4,
        attributes: vec![IpvsAttribute::Service(service)],
    });
    message.set_resolved_family_id(FAMILY);
    reply(message)
}

/// `message` through the kernel's bytes.
fn reply(message: GenlMessage<IpvsMessage>) -> GenlMessage<IpvsMessage> {
    let mut message = request(0, message);
    let bytes = encode(&mut message, 1);
    match split_datagram(&bytes).unwrap().pop() {
        Some(Received::Data(answer)) => answer,
        other => panic!("{other:?}"),
    }
}

#[test]
fn list_replies_decode() {
    let mut v4 = [0u8; 16];
    v4[..4].copy_from_slice(&[10, 96, 0, 10]);
    let decoded = parse_service(&service_reply(v4, 2, 6, 80, 0x1 | 0x2, 0)).unwrap();
    assert_eq!(decoded.key, key());
    assert_eq!(decoded.scheduler, "wrr");
    assert_eq!(
        decoded.persistence_timeout,
        Some(600),
        "hashed flag ignored"
    );
    let plain = parse_service(&service_reply(v4, 2, 6, 80, 0x2, 0)).unwrap();
    assert_eq!(plain.persistence_timeout, None);
    let v6: std::net::Ipv6Addr = "fd00::10".parse().unwrap();
    let decoded = parse_service(&service_reply(v6.octets(), 10, 132, 53, 0, 0)).unwrap();
    assert_eq!(decoded.key.addr, std::net::IpAddr::V6(v6));
    assert_eq!(decoded.key.protocol, Protocol::Sctp);
    assert!(
        parse_service(&service_reply(v4, 2, 6, 80, 0, 7)).is_none(),
        "fwmark services are not ours"
    );

    let mut message = GenlMessage::from_payload(IpvsMessage {
        command: 8,
        attributes: vec![IpvsAttribute::Dest(vec![
            DestAttribute::Address(v4.to_vec()),
            DestAttribute::Port(8080),
            DestAttribute::ForwardMethod(0),
            DestAttribute::Weight(0),
            DestAttribute::ActiveConnections(3),
            DestAttribute::InactiveConnections(5),
            DestAttribute::AddressFamily(2),
        ])],
    });
    message.set_resolved_family_id(FAMILY);
    let status = parse_dest(&reply(message), 2).unwrap();
    assert_eq!(status.server.to_string(), "10.96.0.10:8080");
    assert_eq!(
        (
            status.weight,
            status.masquerading,
            status.active_connections,
            status.inactive_connections
        ),
        (0, true, 3, 5)
    );
}

#[test]
fn replies_without_a_service_or_dest_are_skipped() {
    let message = reply({
        let mut m = GenlMessage::from_payload(IpvsMessage {
            command: 4,
            attributes: Vec::new(),
        });
        m.set_resolved_family_id(FAMILY);
        m
    });
    assert!(parse_service(&message).is_none());
    assert!(parse_dest(&message, 2).is_none());
    // An ack ends the answer.
    let ack: Vec<Received<GenlMessage<IpvsMessage>>> = split_datagram(&[
        0x24, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x1d, 0, 5,
        0, 1, 0, 0, 0, 0, 0, 0, 0,
    ])
    .unwrap();
    assert_eq!(ack, vec![Received::Complete]);
    let _ = NetlinkPayload::<IpvsMessage>::Noop;
}
