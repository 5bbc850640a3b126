// SPDX-License-Identifier: Apache-2.0
//! NETLINK_SOCK_DIAG for UDP: list the connected UDP sockets of the caller's network
//! namespace, and destroy one by its identity (`SOCK_DESTROY`, which needs
//! `CONFIG_INET_DIAG_DESTROY` and CAP_NET_ADMIN).
//!
//! The dump asks for connected sockets only (state `TCP_ESTABLISHED`, which connected UDP
//! sockets report; unconnected ones report `TCP_CLOSE`). Each comes with its addresses and
//! its cookie, which together say whether our connect() program translated it (see
//! [`super::translations`]). The kernel could also return each socket's value in our
//! socket-storage map (`INET_DIAG_REQ_SK_BPF_STORAGES`), but 6.18 returns it for TCP only
//! (checked on this project's test kernel), so the cookie is what identifies ours.
//!
//! The netlink framing, acknowledgements and dumps are netlink-packet-core's (through
//! `proxier::netlink`); the sock_diag bodies (`linux/inet_diag.h`, `linux/sock_diag.h`:
//! two fixed structs, no attributes we send or read) are still encoded and decoded here
//! and checked byte for byte. netlink-packet-sock-diag 0.5 (on the same netlink-packet-core)
//! has them, SOCK_DESTROY included, and is the next step for this file; the netlink move
//! of issue 16 kept the ebpf mode's socket code to its call sites.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netlink_packet_core::parse_u32;
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::{
    model::IpFamily,
    proxier::netlink::{
        NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, NetlinkMessage, NetlinkSocket,
        RawMessage, request,
    },
};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const IPPROTO_UDP: u8 = 17;
/// Connected UDP sockets report TCP_ESTABLISHED; unconnected ones TCP_CLOSE.
const TCP_ESTABLISHED: u32 = 1;

/// `struct inet_diag_sockid`: ports, addresses, interface, cookie.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, extensions, pad, states, sockid.
const REQ_V2_LEN: usize = 8 + SOCKID_LEN;
/// `struct inet_diag_msg`: family, state, timer, retrans, sockid, five u32.
const DIAG_MSG_LEN: usize = 4 + SOCKID_LEN + 20;

#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

impl DiagError {
    pub fn errno(&self) -> Option<Errno> {
        match self {
            DiagError::Netlink(e) => e.errno(),
        }
    }
}

pub type Result<T, E = DiagError> = std::result::Result<T, E>;

/// A socket's identity as sock_diag gives it and takes it back for `SOCK_DESTROY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SockId {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub ifindex: u32,
    pub cookie: u64,
}

fn af(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => libc::AF_INET as u8,
        IpFamily::V6 => libc::AF_INET6 as u8,
    }
}

fn addr_words(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn encode_sockid(id: &SockId) -> [u8; SOCKID_LEN] {
    let mut out = [0u8; SOCKID_LEN];
    out[0..2].copy_from_slice(&id.local.port().to_be_bytes());
    out[2..4].copy_from_slice(&id.peer.port().to_be_bytes());
    out[4..20].copy_from_slice(&addr_words(id.local.ip()));
    out[20..36].copy_from_slice(&addr_words(id.peer.ip()));
    out[36..40].copy_from_slice(&id.ifindex.to_ne_bytes());
    // The cookie travels as two host-order u32 words, low word first.
    out[40..44].copy_from_slice(&(id.cookie as u32).to_ne_bytes());
    out[44..48].copy_from_slice(&((id.cookie >> 32) as u32).to_ne_bytes());
    out
}

fn ip_from(family: u8, bytes: &[u8]) -> Option<IpAddr> {
    if family == libc::AF_INET as u8 {
        let octets: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(octets)))
    } else if family == libc::AF_INET6 as u8 {
        let octets: [u8; 16] = bytes.get(..16)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(octets)))
    } else {
        None
    }
}

fn be16(bytes: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(..2)?.try_into().ok()?))
}

fn u32_ne(bytes: &[u8]) -> Option<u32> {
    parse_u32(bytes).ok()
}

fn decode_sockid(family: u8, b: &[u8]) -> Option<SockId> {
    let b = b.get(..SOCKID_LEN)?;
    let low = u32_ne(&b[40..44])?;
    let high = u32_ne(&b[44..48])?;
    Some(SockId {
        local: SocketAddr::new(ip_from(family, &b[4..20])?, be16(&b[0..2])?),
        peer: SocketAddr::new(ip_from(family, &b[20..36])?, be16(&b[2..4])?),
        ifindex: u32_ne(&b[36..40])?,
        cookie: u64::from(low) | (u64::from(high) << 32),
    })
}

fn req_v2(family: IpFamily, states: u32, id: &SockId) -> [u8; REQ_V2_LEN] {
    let mut out = [0u8; REQ_V2_LEN];
    out[0] = af(family);
    out[1] = IPPROTO_UDP;
    out[4..8].copy_from_slice(&states.to_ne_bytes());
    out[8..].copy_from_slice(&encode_sockid(id));
    out
}

/// The dump request: connected UDP sockets of `family`.
pub fn dump_request(family: IpFamily) -> NetlinkMessage<RawMessage> {
    let unspecified = SockId {
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        ifindex: 0,
        cookie: u64::MAX, // INET_DIAG_NOCOOKIE
    };
    request(
        NLM_F_REQUEST | NLM_F_DUMP,
        RawMessage {
            msg_type: SOCK_DIAG_BY_FAMILY,
            body: req_v2(family, 1 << TCP_ESTABLISHED, &unspecified).to_vec(),
        },
    )
}

/// The request that destroys the socket `id` (matched by its addresses, ports and cookie).
pub fn destroy_request(id: &SockId) -> NetlinkMessage<RawMessage> {
    let family = IpFamily::of(&id.local.ip());
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        RawMessage {
            msg_type: SOCK_DESTROY,
            body: req_v2(family, u32::MAX, id).to_vec(),
        },
    )
}

/// Decodes one `inet_diag_msg` of a dump.
pub fn decode_socket(body: &[u8]) -> Option<SockId> {
    if body.len() < DIAG_MSG_LEN {
        return None;
    }
    decode_sockid(body[0], &body[4..4 + SOCKID_LEN])
}

/// A NETLINK_SOCK_DIAG socket in the network namespace of the thread that opened it.
pub struct DiagSocket {
    socket: NetlinkSocket,
}

impl DiagSocket {
    pub fn open() -> Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_SOCK_DIAG)?,
        })
    }

    /// The connected UDP sockets of `family` in this namespace.
    pub fn connected_udp(&mut self, family: IpFamily) -> Result<Vec<SockId>> {
        let answers = self
            .socket
            .request(dump_request(family), "dumping UDP sockets")?;
        Ok(answers
            .iter()
            .filter(|a| a.msg_type == SOCK_DIAG_BY_FAMILY)
            .filter_map(|a| decode_socket(&a.body))
            .collect())
    }

    /// Destroys the socket `id`: the application's next receive fails with
    /// ECONNABORTED and its next send without an address with EDESTADDRREQ; it may
    /// connect again.
    pub fn destroy(&mut self, id: &SockId) -> Result<()> {
        self.socket
            .request(destroy_request(id), "destroying a UDP socket")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::encode;
    use netlink_packet_core::{DefaultNla, Emitable, NetlinkPayload};

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn body(message: NetlinkMessage<RawMessage>) -> (u16, Vec<u8>) {
        match message.payload {
            NetlinkPayload::InnerMessage(raw) => (raw.msg_type, raw.body),
            other => panic!("{other:?}"),
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// An `inet_diag_msg` as the kernel sends it, with a few attributes after it.
    fn diag_msg(id: &SockId) -> Vec<u8> {
        let family = af(IpFamily::of(&id.local.ip()));
        let mut body = vec![family, TCP_ESTABLISHED as u8, 0, 0];
        body.extend_from_slice(&encode_sockid(id));
        body.extend_from_slice(&[0u8; 20]);
        let attributes = [
            DefaultNla::new(8, vec![0]),                    // INET_DIAG_SHUTDOWN
            DefaultNla::new(15, 0u32.to_ne_bytes().into()), // INET_DIAG_MARK
        ];
        let mut encoded = vec![0u8; attributes.as_slice().buffer_len()];
        attributes.as_slice().emit(&mut encoded);
        body.extend_from_slice(&encoded);
        body
    }

    #[test]
    fn sockets_are_decoded_with_their_cookie() {
        let id = SockId {
            local: sa("10.0.0.2:40000"),
            peer: sa("10.180.0.1:9000"),
            ifindex: 0,
            cookie: 0x1_0000_0005,
        };
        assert_eq!(decode_socket(&diag_msg(&id)), Some(id));
        let v6 = SockId {
            local: sa("[fd00::2]:40000"),
            peer: sa("[fd00:180::1]:9000"),
            ifindex: 3,
            cookie: 9,
        };
        assert_eq!(decode_socket(&diag_msg(&v6)), Some(v6));
        assert_eq!(decode_socket(&[2, 1, 0]), None, "truncated");
        let mut other_family = diag_msg(&id);
        other_family[0] = 1; // AF_UNIX
        assert_eq!(decode_socket(&other_family), None);
    }

    #[test]
    fn the_dump_asks_for_connected_udp_sockets() {
        // The bytes the former hand-written encoder produced.
        assert_eq!(
            hex(&encode(&mut dump_request(IpFamily::V6), 5)),
            "480000001400010305000000000000000a1100000200000000000000000000000000000000000000000000000000000000000000000000000000000000000000ffffffffffffffff"
        );
        let (msg_type, body) = body(dump_request(IpFamily::V6));
        assert_eq!(msg_type, SOCK_DIAG_BY_FAMILY);
        assert_eq!(body[0], libc::AF_INET6 as u8);
        assert_eq!(body[1], IPPROTO_UDP);
        assert_eq!(u32_ne(&body[4..8]), Some(1 << TCP_ESTABLISHED));
        assert_eq!(body.len(), REQ_V2_LEN, "no attributes");
    }

    #[test]
    fn destroy_names_the_socket_exactly() {
        let id = SockId {
            local: sa("10.0.0.2:40000"),
            peer: sa("10.180.0.1:9000"),
            ifindex: 0,
            cookie: 0xdead_beef_0000_0001,
        };
        assert_eq!(
            hex(&encode(&mut destroy_request(&id), 9)),
            "4800000015000500090000000000000002110000ffffffff9c4023280a0000020000000000000000000000000ab400010000000000000000000000000000000001000000efbeadde"
        );
        let (msg_type, body) = body(destroy_request(&id));
        assert_eq!(msg_type, SOCK_DESTROY);
        assert_eq!(body[1], IPPROTO_UDP);
        assert_eq!(decode_sockid(body[0], &body[8..]), Some(id));
    }
}
