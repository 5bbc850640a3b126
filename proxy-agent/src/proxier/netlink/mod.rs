// SPDX-License-Identifier: Apache-2.0
//! Netlink for every kernel client of the proxiers, on the rust-netlink crates:
//! netlink-packet-core for the framing (`nlmsghdr`, NLMSG_ERROR acknowledgements and
//! errors, NLMSG_DONE ending a dump, attributes), netlink-sys for the socket, and one
//! crate per protocol: netlink-packet-route (`route`: links and addresses; `tc`: BPF
//! filters on clsact hooks and XDP programs per link, for the ebpf mode's cleanup),
//! netlink-packet-generic (`genl`: resolving generic netlink families, and the
//! framing of the IPVS family in `proxier::ipvs::genl`), netlink-packet-netfilter
//! (`proxier::conntrack::netlink`: ctnetlink). sock_diag (`proxier::ebpf::sockets::diag`)
//! sends its fixed-struct bodies as [`RawMessage`]s through the same socket.
//!
//! What stays here is the small blocking request loop of `socket`: send one request,
//! read datagrams until its acknowledgement or the end of its dump. The rust-netlink
//! family's own loop (netlink-proto, and rtnetlink/genetlink above it) is asynchronous:
//! a connection task on a runtime with a channel per request. Our callers are
//! synchronous (the proxiers' sync loops, cleanup, and test fixtures that run in another
//! network namespace on their own thread), one request at a time, so the short loop of
//! [`NetlinkSocket::request`] does the job without a runtime.

pub(super) mod genl;
pub(super) mod route;
pub(super) mod socket;
pub(super) mod tc;

pub use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage,
};
pub use route::RouteSocket;
pub use socket::{NetlinkError, NetlinkSocket, RawMessage};

use netlink_packet_core::{NetlinkHeader, NetlinkPayload, NetlinkSerializable};

/// A request carrying `payload` with header `flags`; [`NetlinkSocket::request`] gives it
/// its sequence number.
pub fn request<T>(flags: u16, payload: T) -> NetlinkMessage<T> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload))
}

/// The bytes of `message` sent as sequence number `seq` (its length and type filled in).
pub fn encode<T: NetlinkSerializable>(message: &mut NetlinkMessage<T>, seq: u32) -> Vec<u8> {
    message.header.sequence_number = seq;
    message.finalize();
    let mut bytes = vec![0u8; message.buffer_len()];
    message.serialize(&mut bytes);
    bytes
}
