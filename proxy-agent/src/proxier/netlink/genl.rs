// SPDX-License-Identifier: Apache-2.0
//! Generic netlink: messages carry a `genlmsghdr` (command, version) and go to a family
//! whose id the controller gives for its name. Asking the controller for a family the
//! kernel does not have makes it load the module that provides it (the module alias
//! `net-pf-16-proto-16-family-NAME`), which is how IPVS gets loaded on demand.

use nix::sys::socket::SockProtocol;

use super::{
    Answer, MessageBuilder, NLM_F_ACK, NLM_F_REQUEST, NetlinkError, NetlinkSocket, attrs, u16_ne,
};

pub const GENL_ID_CTRL: u16 = 0x10;
pub const GENL_HDRLEN: usize = 4;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_VERSION: u8 = 2;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// The `genlmsghdr` of a command.
pub fn header(cmd: u8, version: u8) -> [u8; GENL_HDRLEN] {
    [cmd, version, 0, 0]
}

/// The controller's "get family" request for `name`.
pub fn get_family_request(name: &str, seq: u32) -> Vec<u8> {
    let mut msg = MessageBuilder::new(
        GENL_ID_CTRL,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &header(CTRL_CMD_GETFAMILY, CTRL_VERSION),
    );
    msg.attr_str(CTRL_ATTR_FAMILY_NAME, name);
    msg.finish()
}

/// The family id in the controller's answer.
pub fn family_id(answers: &[Answer]) -> Option<u16> {
    answers
        .iter()
        .filter(|a| a.msg_type == GENL_ID_CTRL && a.body.len() >= GENL_HDRLEN)
        .flat_map(|a| attrs(&a.body[GENL_HDRLEN..]))
        .find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, payload)| u16_ne(payload))
}

/// A generic netlink socket bound to one family.
#[derive(Debug)]
pub struct GenlSocket {
    pub socket: NetlinkSocket,
    pub family: u16,
}

impl GenlSocket {
    /// Opens a socket and resolves `name`; ENOENT from the kernel means it has no such
    /// family (and no module providing it could be loaded).
    pub fn open(name: &'static str) -> Result<Self, NetlinkError> {
        let mut socket = NetlinkSocket::open(SockProtocol::NetlinkGeneric)?;
        let seq = socket.next_seq();
        let answers = socket.request(&get_family_request(name, seq), name)?;
        let family = family_id(&answers).ok_or(super::Malformed("no family id in the answer"))?;
        Ok(Self { socket, family })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::{Message, NLMSG_HDRLEN, split_messages, string};

    #[test]
    fn get_family_request_names_the_family() {
        let bytes = get_family_request("IPVS", 3);
        let messages = split_messages(&bytes).unwrap();
        let Message::Data { msg_type, body } = messages[0] else {
            panic!()
        };
        assert_eq!(msg_type, GENL_ID_CTRL);
        assert_eq!(body[0], CTRL_CMD_GETFAMILY);
        let (t, payload) = attrs(&body[GENL_HDRLEN..]).next().unwrap();
        assert_eq!((t, string(payload)), (CTRL_ATTR_FAMILY_NAME, Some("IPVS")));
        assert_eq!(
            u16::from_ne_bytes([bytes[6], bytes[7]]),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(bytes.len(), NLMSG_HDRLEN + GENL_HDRLEN + 12);
    }

    #[test]
    fn family_id_is_read_from_the_answer() {
        let mut reply = MessageBuilder::new(GENL_ID_CTRL, 0, 3, &header(1, 2));
        reply.attr_str(CTRL_ATTR_FAMILY_NAME, "IPVS");
        reply.attr_u16(CTRL_ATTR_FAMILY_ID, 0x1d);
        let bytes = reply.finish();
        let answers: Vec<Answer> = split_messages(&bytes)
            .unwrap()
            .into_iter()
            .map(|m| match m {
                Message::Data { msg_type, body } => Answer {
                    msg_type,
                    body: body.to_vec(),
                },
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(family_id(&answers), Some(0x1d));
        assert_eq!(family_id(&[]), None);
    }
}
