// SPDX-License-Identifier: Apache-2.0
//! Generic netlink: messages carry a `genlmsghdr` (command, version) and go to a family
//! whose id the controller gives for its name (netlink-packet-generic's `GenlCtrl`).
//! Asking the controller for a family the kernel does not have makes it load the module
//! that provides it (the module alias `net-pf-16-proto-16-family-NAME`), which is how
//! IPVS gets loaded on demand.

use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_sys::protocols::NETLINK_GENERIC;

use super::{NLM_F_ACK, NLM_F_REQUEST, NetlinkError, NetlinkMessage, NetlinkSocket, request};

/// The controller's "get family" request for `name`.
pub fn get_family_request(name: &str) -> NetlinkMessage<GenlMessage<GenlCtrl>> {
    request(
        NLM_F_REQUEST | NLM_F_ACK,
        GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(name.to_string())],
        }),
    )
}

/// The family id in the controller's answer.
pub fn family_id(answers: &[GenlMessage<GenlCtrl>]) -> Option<u16> {
    answers
        .iter()
        .flat_map(|answer| &answer.payload.nlas)
        .find_map(|attr| match attr {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
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
        let mut socket = NetlinkSocket::open(NETLINK_GENERIC)?;
        let answers = socket.request(get_family_request(name), name)?;
        let family = family_id(&answers).ok_or(NetlinkError::Malformed {
            operation: name,
            reason: "no family id in the answer".into(),
        })?;
        Ok(Self { socket, family })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::encode;
    use crate::proxier::netlink::socket::{Received, split_datagram};

    /// The request's bytes, as the former hand-written encoder produced them.
    const GET_IPVS: &str = "2000000010000500030000000000000003020000090002004950565300000000";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn get_family_request_names_the_family() {
        let bytes = encode(&mut get_family_request("IPVS"), 3);
        assert_eq!(hex(&bytes), GET_IPVS);
    }

    #[test]
    fn family_id_is_read_from_the_answer() {
        let mut reply = request(
            0,
            GenlMessage::from_payload(GenlCtrl {
                cmd: GenlCtrlCmd::NewFamily,
                nlas: vec![
                    GenlCtrlAttrs::FamilyName("IPVS".into()),
                    GenlCtrlAttrs::FamilyId(0x1d),
                ],
            }),
        );
        let bytes = encode(&mut reply, 3);
        let answers: Vec<GenlMessage<GenlCtrl>> = split_datagram(&bytes)
            .unwrap()
            .into_iter()
            .map(|m| match m {
                Received::Data(answer) => answer,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(family_id(&answers), Some(0x1d));
        assert_eq!(family_id(&[]), None);
    }
}
