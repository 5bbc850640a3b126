// SPDX-License-Identifier: Apache-2.0
//! A netlink socket in the caller's network namespace that sends one request at a time
//! and collects its answer: the data messages until the acknowledgement (requests with
//! `NLM_F_ACK`) or the end of the dump (`NLM_F_DUMP`). The socket is netlink-sys's, the
//! messages netlink-packet-core's; see the parent module for why this loop is ours.

use netlink_packet_core::{
    DecodeError, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, NetlinkBuffer,
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::Socket;
use nix::errno::Errno;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(#[source] Errno),
    #[error("netlink {operation}: {source}")]
    Io {
        operation: &'static str,
        #[source]
        source: Errno,
    },
    /// The kernel refused the request (its errno).
    #[error("{operation}: {errno}")]
    Kernel {
        operation: &'static str,
        errno: Errno,
    },
    #[error("malformed netlink message in {operation}: {reason}")]
    Malformed {
        operation: &'static str,
        reason: String,
    },
}

impl NetlinkError {
    /// The errno the kernel answered with, if it refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NetlinkError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn errno_of(err: &std::io::Error) -> Errno {
    err.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// A message of a protocol we have no crate type for (sock_diag): its type and body,
/// the protocol's fixed header and attributes as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMessage {
    pub msg_type: u16,
    pub body: Vec<u8>,
}

impl NetlinkSerializable for RawMessage {
    fn message_type(&self) -> u16 {
        self.msg_type
    }

    fn buffer_len(&self) -> usize {
        self.body.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..self.body.len()].copy_from_slice(&self.body);
    }
}

impl NetlinkDeserializable for RawMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        Ok(RawMessage {
            msg_type: header.message_type,
            body: payload.to_vec(),
        })
    }
}

/// What one message of an answer says.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<T> {
    /// A data message.
    Data(T),
    /// A data message whose body its protocol's crate does not decode; skipped, as a
    /// kernel newer than the crate may send what it does not know.
    Undecodable,
    /// The acknowledgement, or the end of a dump: the answer is complete.
    Complete,
    /// The kernel refused the request (a positive errno).
    Refused(i32),
}

/// The messages of one datagram, in order.
pub fn split_datagram<T: NetlinkDeserializable>(
    mut data: &[u8],
) -> Result<Vec<Received<T>>, DecodeError> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let header = NetlinkBuffer::new_checked(data)?;
        let (length, message_type) = (header.length() as usize, header.message_type());
        match NetlinkMessage::<T>::deserialize(&data[..length]) {
            Ok(message) => match message.payload {
                NetlinkPayload::InnerMessage(inner) => out.push(Received::Data(inner)),
                NetlinkPayload::Error(error) => match error.code {
                    None => out.push(Received::Complete),
                    Some(code) => out.push(Received::Refused(-code.get())),
                },
                NetlinkPayload::Done(done) if done.code == 0 => out.push(Received::Complete),
                NetlinkPayload::Done(done) => out.push(Received::Refused(-done.code)),
                // NLMSG_NOOP, and NLMSG_OVERRUN, which the kernel does not send.
                _ => {}
            },
            // Framing and control messages must parse; a data message that does not is
            // the protocol crate's business.
            Err(err)
                if matches!(
                    message_type,
                    NLMSG_NOOP | NLMSG_ERROR | NLMSG_DONE | NLMSG_OVERRUN
                ) =>
            {
                return Err(err);
            }
            Err(err) => {
                tracing::debug!(message_type, error = %err, "skipping an undecodable netlink message");
                out.push(Received::Undecodable);
            }
        }
        // Messages are 4-byte aligned in a datagram.
        data = &data[length.next_multiple_of(4).min(data.len())..];
    }
    Ok(out)
}

#[derive(Debug)]
pub struct NetlinkSocket {
    socket: Socket,
    seq: u32,
    /// One datagram: its capacity is what a receive reads at most.
    buf: Vec<u8>,
}

impl NetlinkSocket {
    /// `protocol`: one of [`netlink_sys::protocols`].
    pub fn open(protocol: isize) -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(protocol).map_err(|e| NetlinkError::Socket(errno_of(&e)))?;
        socket
            .bind_auto()
            .map_err(|e| NetlinkError::Socket(errno_of(&e)))?;
        // A kernel that never answers must not hang the sync loop.
        setsockopt(&socket, sockopt::ReceiveTimeout, &TimeVal::new(5, 0))
            .map_err(NetlinkError::Socket)?;
        // Dumps of large tables arrive in big datagrams.
        let _ = socket.set_rx_buf_sz(1usize << 20);
        Ok(Self {
            socket,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// Sends `request` with the next sequence number and returns the data messages of
    /// its answer. The request must ask for an acknowledgement or be a dump, or this
    /// waits for the receive timeout.
    pub fn request<T>(
        &mut self,
        mut request: NetlinkMessage<T>,
        operation: &'static str,
    ) -> Result<Vec<T>, NetlinkError>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        self.seq = self.seq.wrapping_add(1);
        let bytes = super::encode(&mut request, self.seq);
        self.socket.send(&bytes, 0).map_err(|e| NetlinkError::Io {
            operation,
            source: errno_of(&e),
        })?;
        let mut answers = Vec::new();
        loop {
            self.buf.clear();
            self.socket
                .recv(&mut self.buf, 0)
                .map_err(|e| NetlinkError::Io {
                    operation,
                    source: errno_of(&e),
                })?;
            let received =
                split_datagram::<T>(&self.buf).map_err(|err| NetlinkError::Malformed {
                    operation,
                    reason: err.to_string(),
                })?;
            for message in received {
                match message {
                    Received::Data(inner) => answers.push(inner),
                    Received::Undecodable => {}
                    Received::Complete => return Ok(answers),
                    Received::Refused(errno) => {
                        return Err(NetlinkError::Kernel {
                            operation,
                            errno: Errno::from_raw(errno),
                        });
                    }
                }
            }
        }
    }
}
