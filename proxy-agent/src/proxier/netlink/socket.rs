// SPDX-License-Identifier: Apache-2.0
//! A netlink socket in the caller's network namespace that sends one request at a time
//! and collects its answer: the data messages until the acknowledgement (requests with
//! `NLM_F_ACK`) or the end of the dump (`NLM_F_DUMP`).

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::{Malformed, Message, split_messages};

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(#[source] nix::Error),
    #[error("netlink {operation}: {source}")]
    Io {
        operation: &'static str,
        #[source]
        source: nix::Error,
    },
    /// The kernel refused the request (its errno).
    #[error("{operation}: {errno}")]
    Kernel {
        operation: &'static str,
        errno: Errno,
    },
    #[error(transparent)]
    Malformed(#[from] Malformed),
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

/// One data message of an answer: its type and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub msg_type: u16,
    pub body: Vec<u8>,
}

#[derive(Debug)]
pub struct NetlinkSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl NetlinkSocket {
    pub fn open(protocol: SockProtocol) -> Result<Self, NetlinkError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            protocol,
        )
        .map_err(NetlinkError::Socket)?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(NetlinkError::Socket)?;
        // A kernel that never answers must not hang the sync loop.
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(5, 0))
            .map_err(NetlinkError::Socket)?;
        // Dumps of large tables arrive in big datagrams.
        let _ = setsockopt(&fd, sockopt::RcvBuf, &(1 << 20));
        Ok(Self {
            fd,
            seq: 0,
            buf: vec![0u8; 1 << 16],
        })
    }

    /// The sequence number for the next request.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `request` (built with the last [`NetlinkSocket::next_seq`]) and returns the
    /// data messages of its answer. The request must ask for an acknowledgement or be a
    /// dump, or this waits for the receive timeout.
    pub fn request(
        &mut self,
        request: &[u8],
        operation: &'static str,
    ) -> Result<Vec<Answer>, NetlinkError> {
        sendto(
            self.fd.as_raw_fd(),
            request,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(|source| NetlinkError::Io { operation, source })?;
        let mut answers = Vec::new();
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())
                .map_err(|source| NetlinkError::Io { operation, source })?;
            for message in split_messages(&self.buf[..n])? {
                match message {
                    Message::Data { msg_type, body } => answers.push(Answer {
                        msg_type,
                        body: body.to_vec(),
                    }),
                    Message::Error(0) | Message::Done(0) => return Ok(answers),
                    Message::Error(code) | Message::Done(code) => {
                        return Err(NetlinkError::Kernel {
                            operation,
                            errno: Errno::from_raw(-code),
                        });
                    }
                }
            }
        }
    }
}
