// SPDX-License-Identifier: Apache-2.0
//! NETLINK_SOCK_DIAG for UDP: list the connected UDP sockets of the caller's network
//! namespace, and destroy one by its identity (`SOCK_DESTROY`, which needs
//! `CONFIG_INET_DIAG_DESTROY` and CAP_NET_ADMIN).
//!
//! The dump asks for connected sockets only (state `TCP_ESTABLISHED`, which connected UDP
//! sockets report; unconnected ones report `TCP_CLOSE`). Each comes with its addresses and
//! its cookie, which together say whether our connect() program translated it (see
//! `translations`). The kernel could also return each socket's value in our
//! socket-storage map (`INET_DIAG_REQ_SK_BPF_STORAGES`), but 6.18 returns it for TCP only
//! (checked on this project's test kernel), so the cookie is what identifies ours.
//!
//! The messages are netlink-packet-sock-diag's (`inet_diag_req_v2`, `inet_diag_msg`,
//! `SOCK_DESTROY`), framed and acknowledged by netlink-packet-core through
//! `proxier::netlink`; what stays here is the mapping to [`SockId`] (the cookie's two
//! host-order words).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use netlink_packet_sock_diag::{
    SockDiagDestroy, SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::{
    model::IpFamily,
    proxier::netlink::{
        NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, NetlinkMessage, NetlinkSocket, request,
    },
};

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

/// The kernel's socket cookie travels as two host-order u32 words, low word first.
fn cookie_words(cookie: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&(cookie as u32).to_ne_bytes());
    out[4..].copy_from_slice(&((cookie >> 32) as u32).to_ne_bytes());
    out
}

fn cookie_of(words: [u8; 8]) -> u64 {
    let [a, b, c, d, e, f, g, h] = words;
    u64::from(u32::from_ne_bytes([a, b, c, d]))
        | (u64::from(u32::from_ne_bytes([e, f, g, h])) << 32)
}

fn socket_id(id: &SockId) -> SocketId {
    SocketId {
        source_port: id.local.port(),
        destination_port: id.peer.port(),
        source_address: id.local.ip(),
        destination_address: id.peer.ip(),
        interface_id: id.ifindex,
        cookie: cookie_words(id.cookie),
    }
}

fn udp_request(family: IpFamily, states: StateFlags, id: &SockId) -> SockDiagMessage {
    SockDiagMessage::InetRequest(InetRequest {
        family: match family {
            IpFamily::V4 => AF_INET,
            IpFamily::V6 => AF_INET6,
        },
        protocol: IPPROTO_UDP,
        extensions: ExtensionFlags::empty(),
        states,
        socket_id: socket_id(id),
    })
}

/// The dump request: connected UDP sockets of `family` (connected UDP sockets report
/// TCP_ESTABLISHED, unconnected ones TCP_CLOSE).
pub fn dump_request(family: IpFamily) -> NetlinkMessage<SockDiagMessage> {
    let unspecified = SockId {
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        ifindex: 0,
        cookie: u64::MAX, // INET_DIAG_NOCOOKIE
    };
    request(
        NLM_F_REQUEST | NLM_F_DUMP,
        udp_request(family, StateFlags::ESTABLISHED, &unspecified),
    )
}

/// The request that destroys the socket `id` (matched by its addresses, ports and cookie).
pub fn destroy_request(id: &SockId) -> NetlinkMessage<SockDiagDestroy> {
    let family = IpFamily::of(&id.local.ip());
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        SockDiagDestroy::new(udp_request(
            family,
            StateFlags::from_bits_retain(u32::MAX),
            id,
        )),
    )
}

/// The socket one message of a dump describes (`None` for anything but an inet socket).
pub fn decode_socket(message: &SockDiagMessage) -> Option<SockId> {
    let SockDiagMessage::InetResponse(response) = message else {
        return None;
    };
    let id = &response.header.socket_id;
    Some(SockId {
        local: SocketAddr::new(id.source_address, id.source_port),
        peer: SocketAddr::new(id.destination_address, id.destination_port),
        ifindex: id.interface_id,
        cookie: cookie_of(id.cookie),
    })
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
        Ok(answers.iter().filter_map(decode_socket).collect())
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
    use netlink_packet_core::{DefaultNla, Emitable, NetlinkSerializable, ParseableParametrized};
    use netlink_packet_sock_diag::SOCK_DIAG_BY_FAMILY;

    use super::*;
    use crate::proxier::netlink::encode;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// `struct inet_diag_sockid` as `linux/inet_diag.h` lays it out, written by the test
    /// itself: ports (big endian), addresses, interface, the cookie's two words.
    fn sockid_bytes(id: &SockId) -> Vec<u8> {
        let words = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => {
                let mut out = [0u8; 16];
                out[..4].copy_from_slice(&v4.octets());
                out
            }
            IpAddr::V6(v6) => v6.octets(),
        };
        let mut out = Vec::new();
        out.extend_from_slice(&id.local.port().to_be_bytes());
        out.extend_from_slice(&id.peer.port().to_be_bytes());
        out.extend_from_slice(&words(id.local.ip()));
        out.extend_from_slice(&words(id.peer.ip()));
        out.extend_from_slice(&id.ifindex.to_ne_bytes());
        out.extend_from_slice(&(id.cookie as u32).to_ne_bytes());
        out.extend_from_slice(&((id.cookie >> 32) as u32).to_ne_bytes());
        out
    }

    /// An `inet_diag_msg` as the kernel sends it, with a few attributes after it.
    fn diag_msg(family: u8, id: &SockId) -> Vec<u8> {
        let mut body = vec![family, 1 /* TCP_ESTABLISHED */, 0, 0];
        body.extend_from_slice(&sockid_bytes(id));
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

    fn decoded(body: &[u8]) -> Option<SockId> {
        SockDiagMessage::parse_with_param(body, SOCK_DIAG_BY_FAMILY)
            .ok()
            .as_ref()
            .and_then(decode_socket)
    }

    #[test]
    fn sockets_are_decoded_with_their_cookie() {
        let id = SockId {
            local: sa("10.0.0.2:40000"),
            peer: sa("10.180.0.1:9000"),
            ifindex: 0,
            cookie: 0x1_0000_0005,
        };
        assert_eq!(decoded(&diag_msg(AF_INET, &id)), Some(id));
        let v6 = SockId {
            local: sa("[fd00::2]:40000"),
            peer: sa("[fd00:180::1]:9000"),
            ifindex: 3,
            cookie: 9,
        };
        assert_eq!(decoded(&diag_msg(AF_INET6, &v6)), Some(v6));
        assert_eq!(decoded(&[2, 1, 0]), None, "truncated");
        assert_eq!(decoded(&diag_msg(1 /* AF_UNIX */, &id)), None);
    }

    #[test]
    fn the_dump_asks_for_connected_udp_sockets() {
        // The bytes the former hand-written encoder produced: AF_INET6, UDP, no
        // extensions, states 1 << TCP_ESTABLISHED, an unspecified socket, no cookie.
        let mut dump = dump_request(IpFamily::V6);
        assert_eq!(
            hex(&encode(&mut dump, 5)),
            "480000001400010305000000000000000a1100000200000000000000000000000000000000000000000000000000000000000000000000000000000000000000ffffffffffffffff"
        );
        assert_eq!(dump.header.message_type, SOCK_DIAG_BY_FAMILY);
    }

    #[test]
    fn destroy_names_the_socket_exactly() {
        let id = SockId {
            local: sa("10.0.0.2:40000"),
            peer: sa("10.180.0.1:9000"),
            ifindex: 0,
            cookie: 0xdead_beef_0000_0001,
        };
        let mut destroy = destroy_request(&id);
        let bytes = encode(&mut destroy, 9);
        assert_eq!(
            hex(&bytes),
            "4800000015000500090000000000000002110000ffffffff9c4023280a0000020000000000000000000000000ab400010000000000000000000000000000000001000000efbeadde"
        );
        // The identity in the request is the test's own layout of it.
        assert_eq!(&bytes[16 + 8..], sockid_bytes(&id).as_slice());
        let netlink_packet_core::NetlinkPayload::InnerMessage(inner) = &destroy.payload else {
            panic!("a request");
        };
        assert_eq!(inner.message_type(), netlink_packet_sock_diag::SOCK_DESTROY);
    }
}
