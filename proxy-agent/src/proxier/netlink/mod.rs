// SPDX-License-Identifier: Apache-2.0
//! Netlink, hand-written and shared by every kernel client of the proxiers: ctnetlink
//! (conntrack cleanup), generic netlink (IPVS) and rtnetlink (the kube-ipvs0 dummy
//! interface). This module holds what they have in common: building a message
//! (`nlmsghdr`, the protocol's own fixed header, then attributes, nested where needed),
//! splitting a datagram into messages and iterating attributes. [`socket`] sends
//! requests and collects answers; [`genl`] resolves generic netlink families; [`route`]
//! manages links and addresses.

pub mod genl;
pub mod route;
pub mod socket;

pub use socket::{Answer, NetlinkError, NetlinkSocket};

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_NOOP: u16 = 1;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLA_F_NESTED: u16 = 1 << 15;
pub const NLA_TYPE_MASK: u16 = 0x3fff;

pub fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// A message that does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink message: {0}")]
pub struct Malformed(pub &'static str);

/// Builds one netlink message: the header, the protocol's fixed header (`nfgenmsg`,
/// `genlmsghdr`, `ifinfomsg`...), then attributes.
#[derive(Debug)]
pub struct MessageBuilder {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl MessageBuilder {
    pub fn new(msg_type: u16, flags: u16, seq: u32, fixed_header: &[u8]) -> Self {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in finish()
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        buf.extend_from_slice(fixed_header);
        buf.resize(align4(buf.len()), 0);
        Self {
            buf,
            nests: Vec::new(),
        }
    }

    pub fn attr(&mut self, attr_type: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&attr_type.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    pub fn attr_u16(&mut self, attr_type: u16, value: u16) {
        self.attr(attr_type, &value.to_ne_bytes());
    }

    pub fn attr_u32(&mut self, attr_type: u16, value: u32) {
        self.attr(attr_type, &value.to_ne_bytes());
    }

    /// A NUL-terminated string, as the kernel's NLA_NUL_STRING / NLA_STRING want it.
    pub fn attr_str(&mut self, attr_type: u16, value: &str) {
        let mut payload = Vec::with_capacity(value.len() + 1);
        payload.extend_from_slice(value.as_bytes());
        payload.push(0);
        self.attr(attr_type, &payload);
    }

    pub fn begin_nested(&mut self, attr_type: u16) {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(attr_type | NLA_F_NESTED).to_ne_bytes());
    }

    pub fn end_nested(&mut self) {
        if let Some(start) = self.nests.pop() {
            let len = (self.buf.len() - start) as u16;
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
    }

    pub fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// One message of a kernel reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A data message: its type and body (fixed header and attributes).
    Data { msg_type: u16, body: &'a [u8] },
    /// An error, or with 0 an acknowledgement.
    Error(i32),
    /// The end of a dump, with the dump's status (0 or a negative errno).
    Done(i32),
}

/// Splits a datagram into messages.
pub fn split_messages(mut data: &[u8]) -> Result<Vec<Message<'_>>, Malformed> {
    let mut out = Vec::new();
    while data.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(take4(data, 0)) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(Malformed("message length"));
        }
        let msg_type = u16::from_ne_bytes([data[4], data[5]]);
        let body = &data[NLMSG_HDRLEN..len];
        let status = || (body.len() >= 4).then(|| i32::from_ne_bytes(take4(body, 0)));
        match msg_type {
            NLMSG_NOOP => {}
            NLMSG_DONE => out.push(Message::Done(status().unwrap_or(0))),
            NLMSG_ERROR => out.push(Message::Error(status().ok_or(Malformed("error message"))?)),
            _ => out.push(Message::Data { msg_type, body }),
        }
        data = &data[align4(len).min(data.len())..];
    }
    Ok(out)
}

pub fn take4(data: &[u8], at: usize) -> [u8; 4] {
    let mut out = [0; 4];
    out.copy_from_slice(&data[at..at + 4]);
    out
}

/// Iterates netlink attributes: (type without flags, payload). Stops at the first
/// truncated one.
pub fn attrs(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let attr_type = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > data.len() {
            return None;
        }
        let payload = &data[4..len];
        data = &data[align4(len).min(data.len())..];
        Some((attr_type, payload))
    })
}

pub fn u16_ne(payload: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(payload.get(..2)?.try_into().ok()?))
}

pub fn u32_ne(payload: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
}

/// A string attribute without its terminating NUL.
pub fn string(payload: &[u8]) -> Option<&str> {
    let end = payload
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(payload.len());
    std::str::from_utf8(&payload[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let mut msg = MessageBuilder::new(0x20, NLM_F_REQUEST, 7, &[1, 2, 3]);
        msg.attr_u16(1, 0x1234);
        msg.begin_nested(2);
        msg.attr_str(3, "IPVS");
        msg.end_nested();
        let bytes = msg.finish();
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(u32::from_ne_bytes(take4(&bytes, 0)) as usize, bytes.len());
        let messages = split_messages(&bytes).unwrap();
        let Message::Data { msg_type, body } = messages[0] else {
            panic!("{messages:?}")
        };
        assert_eq!(msg_type, 0x20);
        assert_eq!(&body[..4], &[1, 2, 3, 0], "fixed header padded to 4 bytes");
        let found: Vec<_> = attrs(&body[4..]).collect();
        assert_eq!(found[0], (1, &0x1234u16.to_ne_bytes()[..]));
        assert_eq!(found[1].0, 2, "nested flag masked off");
        let inner: Vec<_> = attrs(found[1].1).collect();
        assert_eq!(string(inner[0].1), Some("IPVS"));
        assert_eq!(inner[0].1.len(), 5, "NUL-terminated");
    }

    #[test]
    fn errors_done_and_truncation() {
        let mut ack = MessageBuilder::new(NLMSG_ERROR, 0, 1, &(-17i32).to_ne_bytes()).finish();
        let mut done =
            MessageBuilder::new(NLMSG_DONE, NLM_F_MULTI, 1, &0i32.to_ne_bytes()).finish();
        ack.append(&mut done);
        assert_eq!(
            split_messages(&ack).unwrap(),
            vec![Message::Error(-17), Message::Done(0)]
        );
        let mut bad = ack.clone();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert_eq!(split_messages(&bad), Err(Malformed("message length")));
        assert_eq!(attrs(&[8, 0, 1, 0, 1]).count(), 0, "truncated attribute");
    }
}
