// SPDX-License-Identifier: Apache-2.0
//! nfacct (netfilter extended accounting, nfnetlink subsystem `NFNL_SUBSYS_ACCT`): named
//! packet/byte counters that iptables rules feed with `-m nfacct --nfacct-name <name>`.
//! The iptables mode creates upstream's two objects at start and its metrics read them at
//! each scrape, as upstream's iptables proxier does.
//!
//! Why partly by hand: netlink-packet-netfilter (already our ctnetlink crate) knows the
//! ctnetlink, nflog and nftables subsystems but not the accounting one. Its framing does
//! carry any other subsystem as a generic message (`NetfilterMessageInner::Other`, with
//! the attributes as netlink-packet-core `DefaultNla`s), so only the accounting message
//! and attribute numbers (from the kernel's `uapi/linux/netfilter/nfnetlink_acct.h`) and
//! the decoding of the two counters are written here. No other maintained crate covers
//! nfacct (the `nfacct` command line tool is not in our images and would be a process
//! per scrape); the socket loop is the project's own [`NetlinkSocket`].

use netlink_packet_core::{DefaultNla, NLA_TYPE_MASK, Nla};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    NetfilterSubsystem,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::errno::Errno;

use crate::proxier::netlink::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NetlinkError, NetlinkMessage, NetlinkSocket, request,
};

/// `NFNL_SUBSYS_ACCT`.
const NFNL_SUBSYS_ACCT: u8 = 7;
/// `NFNL_MSG_ACCT_NEW`: creates an object; also the type of the kernel's answers.
const NFNL_MSG_ACCT_NEW: u8 = 0;
/// `NFNL_MSG_ACCT_GET`: one object by name (or all of them as a dump).
const NFNL_MSG_ACCT_GET: u8 = 1;

/// `NFACCT_NAME`: the object's name, NUL-terminated.
const NFACCT_NAME: u16 = 1;
/// `NFACCT_PKTS`: packets counted, big-endian u64.
const NFACCT_PKTS: u16 = 2;
/// `NFACCT_BYTES`: bytes counted, big-endian u64.
const NFACCT_BYTES: u16 = 3;

/// `NFACCT_NAME_MAX`: the kernel's name buffer, the terminating NUL included.
pub const NAME_MAX: usize = 32;

/// NFNETLINK_V0.
const NFNETLINK_VERSION: u8 = 0;

/// Upstream's object counting the packets the KUBE-FORWARD INVALID rule drops.
pub const CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// Upstream's object counting the packets accepted to a NodePort on 127.0.0.0/8.
pub const LOCALHOST_NODEPORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

#[derive(Debug, thiserror::Error)]
pub enum NfacctError {
    #[error("nfacct name {name:?} is empty, longer than {} bytes or contains NUL", NAME_MAX - 1)]
    InvalidName { name: String },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("nfacct object {name:?} does not exist")]
    NotFound { name: String },
    #[error("malformed nfacct answer for {name:?}: {reason}")]
    Malformed { name: String, reason: String },
}

pub type Result<T, E = NfacctError> = std::result::Result<T, E>;

/// What an object has counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() >= NAME_MAX || name.contains('\0') {
        return Err(NfacctError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// An accounting message about `name`: nfgenmsg (AF_UNSPEC, NFNETLINK_V0, res_id 0), then
/// the name attribute.
fn acct_request(message_type: u8, flags: u16, name: &str) -> NetlinkMessage<NetfilterMessage> {
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    let header = NetfilterHeader::new(NetfilterProtoFamily::Unspec, NFNETLINK_VERSION, 0);
    let inner = NetfilterMessageInner::Other {
        subsys: NetfilterSubsystem::Other(NFNL_SUBSYS_ACCT),
        message_type,
        attributes: vec![DefaultNla::new(NFACCT_NAME, value)],
    };
    request(flags, NetfilterMessage::new(header, inner))
}

/// Creates the object `name` (the kernel refuses an existing name with EBUSY).
pub fn new_request(name: &str) -> NetlinkMessage<NetfilterMessage> {
    acct_request(
        NFNL_MSG_ACCT_NEW,
        NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
        name,
    )
}

/// Asks for the object `name`; the kernel answers with one NEW message, then the ack.
pub fn get_request(name: &str) -> NetlinkMessage<NetfilterMessage> {
    acct_request(NFNL_MSG_ACCT_GET, NLM_F_REQUEST | NLM_F_ACK, name)
}

/// An attribute's value (netlink-packet-core's `DefaultNla` only emits it).
fn nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut value = vec![0u8; nla.value_len()];
    nla.emit_value(&mut value);
    value
}

fn be_u64(value: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(value.try_into().ok()?))
}

/// The counters of `name` in the kernel's answer: the accounting message carrying that
/// name. Other subsystems' messages and other objects are ignored.
pub fn counter_in(answers: &[NetfilterMessage], name: &str) -> Result<Counter> {
    let malformed = |reason: &str| NfacctError::Malformed {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    for message in answers {
        let NetfilterMessageInner::Other {
            subsys: NetfilterSubsystem::Other(NFNL_SUBSYS_ACCT),
            message_type: NFNL_MSG_ACCT_NEW,
            attributes,
        } = &message.inner
        else {
            continue;
        };
        let mut object_name = None;
        let (mut packets, mut bytes) = (None, None);
        for nla in attributes {
            let value = nla_value(nla);
            match nla.kind() & NLA_TYPE_MASK {
                NFACCT_NAME => {
                    let text = value.split(|b| *b == 0).next().unwrap_or_default();
                    object_name = Some(String::from_utf8_lossy(text).into_owned());
                }
                NFACCT_PKTS => {
                    packets = Some(be_u64(&value).ok_or_else(|| malformed("packets not 8 bytes"))?)
                }
                NFACCT_BYTES => {
                    bytes = Some(be_u64(&value).ok_or_else(|| malformed("bytes not 8 bytes"))?)
                }
                _ => {}
            }
        }
        if object_name.as_deref() != Some(name) {
            continue;
        }
        return Ok(Counter {
            packets: packets.ok_or_else(|| malformed("no packet count"))?,
            bytes: bytes.ok_or_else(|| malformed("no byte count"))?,
        });
    }
    Err(malformed("no accounting object in the answer"))
}

/// nfacct in the caller's network namespace.
pub struct Nfacct {
    socket: NetlinkSocket,
}

impl Nfacct {
    pub fn open() -> Result<Self> {
        Ok(Self {
            socket: NetlinkSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// The counters of `name`; [`NfacctError::NotFound`] when there is no such object.
    pub fn get(&mut self, name: &str) -> Result<Counter> {
        check_name(name)?;
        match self.socket.request(get_request(name), "nfacct get") {
            Ok(answers) => counter_in(&answers, name),
            Err(err) if err.errno() == Some(Errno::ENOENT) => Err(NfacctError::NotFound {
                name: name.to_string(),
            }),
            Err(err) => Err(err.into()),
        }
    }

    /// Creates `name` unless it exists (its counts are then kept, as upstream keeps them
    /// across restarts).
    pub fn ensure(&mut self, name: &str) -> Result<()> {
        match self.get(name) {
            Ok(_) => return Ok(()),
            Err(NfacctError::NotFound { .. }) => {}
            Err(err) => return Err(err),
        }
        match self.socket.request(new_request(name), "nfacct new") {
            Ok(_) => Ok(()),
            // Created meanwhile by someone else: it exists, which is what was asked.
            Err(err) if matches!(err.errno(), Some(Errno::EBUSY | Errno::EEXIST)) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }
}

/// The packets object `name` counted, for a metric read at scrape time; `None` (and a
/// debug log) when nfacct or the object is unavailable.
pub fn packets_of(name: &str) -> Option<u64> {
    match Nfacct::open().and_then(|mut nfacct| nfacct.get(name)) {
        Ok(counter) => Some(counter.packets),
        Err(err) => {
            tracing::debug!(counter = name, reason = %err, "cannot read the nfacct counter");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::netlink::encode;
    use crate::proxier::netlink::socket::{Received, split_datagram};

    /// An nlattr: length (header included), type, value padded to 4 bytes.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    /// A message as the kernel sends it: nlmsghdr, nfgenmsg, attributes.
    fn kernel_message(msg_type: u16, attributes: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = [vec![0u8, 0, 0, 0]]
            .into_iter()
            .chain(attributes.iter().cloned())
            .flatten()
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&msg_type.to_ne_bytes());
        out.extend_from_slice(&0u16.to_ne_bytes());
        out.extend_from_slice(&7u32.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn a_get_request_is_encoded_as_the_kernel_expects() {
        let bytes = encode(&mut get_request(LOCALHOST_NODEPORTS_ACCEPTED), 9);
        let name = b"localhost_nps_accepted_pkts\0";
        let mut expected = Vec::new();
        let total = 16 + 4 + (4 + name.len()).next_multiple_of(4);
        expected.extend_from_slice(&u32::try_from(total).unwrap().to_ne_bytes());
        // NFNL_SUBSYS_ACCT << 8 | NFNL_MSG_ACCT_GET
        expected.extend_from_slice(&0x0701u16.to_ne_bytes());
        expected.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        expected.extend_from_slice(&9u32.to_ne_bytes());
        expected.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: AF_UNSPEC, NFNETLINK_V0, res_id 0.
        expected.extend_from_slice(&[0, 0, 0, 0]);
        expected.extend(nla(NFACCT_NAME, name));
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_new_request_creates_with_an_ack() {
        let bytes = encode(&mut new_request(CT_STATE_INVALID_DROPPED), 1);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 0x0700);
        assert_eq!(
            u16::from_ne_bytes([bytes[6], bytes[7]]),
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK
        );
        assert!(
            bytes
                .windows(CT_STATE_INVALID_DROPPED.len() + 1)
                .any(|w| w == b"ct_state_invalid_dropped_pkts\0")
        );
    }

    fn decoded(datagram: &[u8]) -> Vec<NetfilterMessage> {
        split_datagram::<NetfilterMessage>(datagram)
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                Received::Data(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_kernels_answer_is_decoded() {
        // As nfnl_acct_fill_info writes it: name, packets and bytes (each with the 64-bit
        // padding attribute before it when needed), use count, flags.
        let answer = kernel_message(
            0x0700,
            &[
                nla(NFACCT_NAME, b"localhost_nps_accepted_pkts\0"),
                nla(NFACCT_PKTS, &5u64.to_be_bytes()),
                nla(NFACCT_BYTES, &300u64.to_be_bytes()),
                nla(4, &1u32.to_be_bytes()),
            ],
        );
        let messages = decoded(&answer);
        assert_eq!(
            counter_in(&messages, LOCALHOST_NODEPORTS_ACCEPTED).unwrap(),
            Counter {
                packets: 5,
                bytes: 300
            }
        );
        assert!(matches!(
            counter_in(&messages, CT_STATE_INVALID_DROPPED),
            Err(NfacctError::Malformed { .. })
        ));
    }

    #[test]
    fn bad_kernel_data_is_an_error_not_a_panic() {
        let short = kernel_message(
            0x0700,
            &[
                nla(NFACCT_NAME, b"x\0"),
                nla(NFACCT_PKTS, &[1, 2, 3]),
                nla(NFACCT_BYTES, &1u64.to_be_bytes()),
            ],
        );
        assert!(matches!(
            counter_in(&decoded(&short), "x"),
            Err(NfacctError::Malformed { .. })
        ));
        let no_packets = kernel_message(0x0700, &[nla(NFACCT_NAME, b"x\0")]);
        assert!(counter_in(&decoded(&no_packets), "x").is_err());
        // Another subsystem's message is not an accounting answer.
        let other = kernel_message(0x0100, &[nla(NFACCT_NAME, b"x\0")]);
        assert!(counter_in(&decoded(&other), "x").is_err());
    }

    /// Against the kernel (root only; skipped otherwise), in a network namespace of this
    /// test's own thread (nfacct objects are per namespace): a missing object is
    /// NotFound, `ensure` creates it and is idempotent, a new object has counted nothing.
    #[test]
    fn the_kernel_creates_and_reads_objects() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (a network namespace)");
            return;
        }
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let mut nfacct = Nfacct::open().expect("nfnetlink socket");
            assert!(matches!(
                nfacct.get(LOCALHOST_NODEPORTS_ACCEPTED),
                Err(NfacctError::NotFound { .. })
            ));
            nfacct.ensure(LOCALHOST_NODEPORTS_ACCEPTED).expect("create");
            nfacct.ensure(LOCALHOST_NODEPORTS_ACCEPTED).expect("exists");
            assert_eq!(
                nfacct.get(LOCALHOST_NODEPORTS_ACCEPTED).expect("read"),
                Counter::default()
            );
            assert!(nfacct.get(CT_STATE_INVALID_DROPPED).is_err());
        })
        .join()
        .expect("the namespace thread");
    }

    #[test]
    fn names_the_kernel_would_refuse_are_refused_here() {
        assert!(check_name("").is_err());
        assert!(check_name(&"a".repeat(NAME_MAX)).is_err());
        assert!(check_name("a\0b").is_err());
        assert!(check_name(&"a".repeat(NAME_MAX - 1)).is_ok());
        assert!(check_name(CT_STATE_INVALID_DROPPED).is_ok());
        assert!(check_name(LOCALHOST_NODEPORTS_ACCEPTED).is_ok());
    }
}
