// SPDX-License-Identifier: Apache-2.0
//! The IPVS netlink messages: the bytes of each request, and list replies decoded.

use crate::model::Protocol;
use crate::proxier::ipvs::desired::{RealServer, ServiceKey, VirtualServer};
use crate::proxier::ipvs::genl::*;
use crate::proxier::netlink::genl::GENL_HDRLEN;
use crate::proxier::netlink::{
    Answer, Message, MessageBuilder, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attrs, split_messages,
    string,
};

const FAMILY: u16 = 0x1d;

fn key() -> ServiceKey {
    ServiceKey {
        addr: "10.96.0.10".parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
    }
}

fn server(persistence: Option<u32>) -> VirtualServer {
    VirtualServer {
        key: key(),
        scheduler: "rr".into(),
        persistence_timeout: persistence,
    }
}

/// (type, flags, genl command, top-level attributes).
fn decode(bytes: &[u8]) -> (u16, u16, u8, Vec<(u16, Vec<u8>)>) {
    assert_eq!(
        u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
        bytes.len()
    );
    let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
    let Message::Data { msg_type, body } = &split_messages(bytes).unwrap()[0] else {
        panic!()
    };
    assert_eq!(body[1], 1, "IPVS genl version");
    let found = attrs(&body[GENL_HDRLEN..])
        .map(|(t, p)| (t, p.to_vec()))
        .collect();
    (*msg_type, flags, body[0], found)
}

fn nested(payload: &[u8]) -> Vec<(u16, Vec<u8>)> {
    attrs(payload).map(|(t, p)| (t, p.to_vec())).collect()
}

#[test]
fn new_service_carries_key_scheduler_flags_and_netmask() {
    let (msg_type, flags, cmd, top) =
        decode(&service_request(&server(Some(10800)), false, FAMILY, 4));
    assert_eq!((msg_type, cmd), (FAMILY, 1), "IPVS_CMD_NEW_SERVICE");
    assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK);
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].0, 1, "IPVS_CMD_ATTR_SERVICE");
    let svc = nested(&top[0].1);
    let types: Vec<u16> = svc.iter().map(|(t, _)| *t).collect();
    assert_eq!(types, vec![1, 2, 3, 4, 6, 7, 8, 9]);
    assert_eq!(svc[0].1, 2u16.to_ne_bytes(), "AF_INET");
    assert_eq!(svc[1].1, 6u16.to_ne_bytes(), "IPPROTO_TCP");
    assert_eq!(svc[2].1, vec![10, 96, 0, 10]);
    assert_eq!(svc[3].1, vec![0, 80], "port in network order");
    assert_eq!(string(&svc[4].1), Some("rr"));
    let mut flag_bytes = 1u32.to_ne_bytes().to_vec();
    flag_bytes.extend(u32::MAX.to_ne_bytes());
    assert_eq!(svc[5].1, flag_bytes, "persistent, mask all");
    assert_eq!(svc[6].1, 10800u32.to_ne_bytes());
    assert_eq!(svc[7].1, u32::MAX.to_ne_bytes(), "IPv4 netmask");

    let (_, _, cmd, top) = decode(&service_request(&server(None), true, FAMILY, 5));
    assert_eq!(cmd, 2, "IPVS_CMD_SET_SERVICE");
    let svc = nested(&top[0].1);
    assert_eq!(svc[5].1[..4], 0u32.to_ne_bytes(), "not persistent");
}

#[test]
fn destinations_and_deletions() {
    let rs = RealServer {
        addr: "fd00::2".parse().unwrap(),
        port: 8080,
    };
    let v6 = ServiceKey {
        addr: "fd00::10".parse().unwrap(),
        protocol: Protocol::Udp,
        port: 53,
    };
    let (_, _, cmd, top) = decode(&dest_request(&v6, &rs, 1, false, FAMILY, 6));
    assert_eq!(cmd, 5, "IPVS_CMD_NEW_DEST");
    assert_eq!(top.iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![1, 2]);
    let svc = nested(&top[0].1);
    assert_eq!(svc.len(), 4, "only the key identifies the service");
    assert_eq!(svc[0].1, 10u16.to_ne_bytes(), "AF_INET6");
    assert_eq!(svc[1].1, 17u16.to_ne_bytes());
    let dest = nested(&top[1].1);
    assert_eq!(
        dest.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6, 11]
    );
    assert_eq!(
        dest[0].1,
        rs.addr
            .to_string()
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()
    );
    assert_eq!(dest[1].1, 8080u16.to_be_bytes());
    assert_eq!(dest[2].1, 0u32.to_ne_bytes(), "masquerading");
    assert_eq!(dest[3].1, 1u32.to_ne_bytes(), "weight");

    let (_, _, cmd, top) = decode(&dest_request(&v6, &rs, 0, true, FAMILY, 7));
    assert_eq!(cmd, 6, "IPVS_CMD_SET_DEST");
    assert_eq!(nested(&top[1].1)[3].1, 0u32.to_ne_bytes(), "drain weight");

    let (_, _, cmd, top) = decode(&delete_dest_request(&v6, &rs, FAMILY, 8));
    assert_eq!(cmd, 7, "IPVS_CMD_DEL_DEST");
    assert_eq!(nested(&top[1].1).len(), 2, "address and port");

    let (_, _, cmd, top) = decode(&delete_service_request(&key(), FAMILY, 9));
    assert_eq!(cmd, 3, "IPVS_CMD_DEL_SERVICE");
    assert_eq!(nested(&top[0].1).len(), 4);
}

#[test]
fn lists_and_timeouts() {
    let (_, flags, cmd, top) = decode(&list_services_request(FAMILY, 1));
    assert_eq!((cmd, flags), (4, NLM_F_REQUEST | NLM_F_DUMP));
    assert!(top.is_empty());
    let (_, flags, cmd, top) = decode(&list_dests_request(&key(), FAMILY, 2));
    assert_eq!((cmd, flags), (8, NLM_F_REQUEST | NLM_F_DUMP));
    assert_eq!(top[0].0, 1);
    let timeouts = Timeouts {
        tcp: 900,
        tcp_fin: 120,
        udp: 300,
    };
    let (_, _, cmd, top) = decode(&set_timeouts_request(&timeouts, FAMILY, 3));
    assert_eq!(cmd, 12, "IPVS_CMD_SET_CONFIG");
    assert_eq!(
        top,
        vec![
            (4, 900u32.to_ne_bytes().to_vec()),
            (5, 120u32.to_ne_bytes().to_vec()),
            (6, 300u32.to_ne_bytes().to_vec())
        ]
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
) -> Answer {
    let mut msg = MessageBuilder::new(FAMILY, 0, 1, &[4, 1, 0, 0]);
    msg.begin_nested(1);
    msg.attr_u16(1, af);
    if fwmark != 0 {
        msg.attr_u32(5, fwmark);
    } else {
        msg.attr_u16(2, proto);
        msg.attr(3, &addr);
        msg.attr(4, &port.to_be_bytes());
    }
    msg.attr_str(6, "wrr");
    let mut f = flags.to_ne_bytes().to_vec();
    f.extend(u32::MAX.to_ne_bytes());
    msg.attr(7, &f);
    msg.attr_u32(8, 600);
    msg.attr_u32(9, u32::MAX);
    msg.begin_nested(10);
    msg.attr_u32(1, 42);
    msg.end_nested();
    msg.end_nested();
    let bytes = msg.finish();
    let Message::Data { msg_type, body } = &split_messages(&bytes).unwrap()[0] else {
        panic!()
    };
    Answer {
        msg_type: *msg_type,
        body: body.to_vec(),
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

    let mut msg = MessageBuilder::new(FAMILY, 0, 1, &[8, 1, 0, 0]);
    msg.begin_nested(2);
    msg.attr(1, &v4);
    msg.attr(2, &8080u16.to_be_bytes());
    msg.attr_u32(3, 0);
    msg.attr_u32(4, 0);
    msg.attr_u32(7, 3);
    msg.attr_u32(8, 5);
    msg.attr_u16(11, 2);
    msg.end_nested();
    let bytes = msg.finish();
    let Message::Data { msg_type, body } = &split_messages(&bytes).unwrap()[0] else {
        panic!()
    };
    let answer = Answer {
        msg_type: *msg_type,
        body: body.to_vec(),
    };
    let status = parse_dest(&answer, 2).unwrap();
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
