// SPDX-License-Identifier: Apache-2.0
//! Chain names upstream's iptables and ipvs proxiers share, and the hash per-service chains
//! are named with (the first 16 characters of the base32 of a SHA-256), so an operator
//! sees the same `KUBE-SVC-XPGD46QRK7WJZT7O` for the same service port that kube-proxy
//! would program. The chain kinds (`KUBE-SVC-`, `KUBE-SEP-`, ...) are the iptables mode's
//! (proxier/iptables/names.rs).

use std::fmt;
use std::net::SocketAddr;

use ring::digest;

use crate::model::Protocol;
#[cfg(test)]
use crate::model::ServicePortName;

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
/// Shared with kubelet (which may program the same localnet rule).
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

/// The 16-character hash part of a per-service chain name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainHash([u8; 16]);

impl ChainHash {
    /// Hashes the concatenation of `parts`, as upstream hashes its concatenated strings.
    fn of(parts: &[&[u8]]) -> Self {
        let mut ctx = digest::Context::new(&digest::SHA256);
        for part in parts {
            ctx.update(part);
        }
        let sum = ctx.finish();
        Self(base32_prefix(sum.as_ref()))
    }

    pub fn as_str(&self) -> &str {
        // Only base32 alphabet bytes are ever stored.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Upstream lowercases the API protocol name before hashing ("tcp").
pub fn protocol_lower(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// The hash shared by a service port's SVC, SVL, EXT and FW chains:
/// sha256("ns/name:port" + "tcp").
pub fn service_port_hash(name_text: &str, protocol: Protocol) -> ChainHash {
    ChainHash::of(&[name_text.as_bytes(), protocol_lower(protocol).as_bytes()])
}

/// The hash of an arbitrary text (the nftables mode names its chains with the first 8
/// characters of the hash of their readable part, as upstream's nftables proxier does).
pub fn text_hash(text: &str) -> ChainHash {
    ChainHash::of(&[text.as_bytes()])
}

/// The hash of an endpoint's SEP chain: sha256("ns/name:port" + "tcp" + "ip:port"), with
/// the endpoint written as upstream does (`[v6]:port` for IPv6).
pub fn endpoint_hash(name_text: &str, protocol: Protocol, endpoint: &SocketAddr) -> ChainHash {
    use std::io::Write;
    let mut addr = [0u8; 64];
    let len = {
        let mut cursor = std::io::Cursor::new(&mut addr[..]);
        // 64 bytes hold the longest "[v6]:port"; a failure would only shorten the input.
        let _ = write!(cursor, "{endpoint}");
        cursor.position() as usize
    };
    ChainHash::of(&[
        name_text.as_bytes(),
        protocol_lower(protocol).as_bytes(),
        &addr[..len],
    ])
}

/// The text upstream hashes for a service port ("ns/name:port", "ns/name" when unnamed).
#[cfg(test)]
pub fn service_port_text(name: &ServicePortName) -> String {
    name.to_string()
}

/// RFC 4648 base32 (standard alphabet) of the first 10 bytes: exactly 16 characters.
fn base32_prefix(bytes: &[u8]) -> [u8; 16] {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = [b'A'; 16];
    // 80 bits, encoded as two 40-bit halves of eight characters each.
    let half = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .unwrap_or_default()
            .iter()
            .fold(0u64, |a, &b| (a << 8) | u64::from(b))
    };
    let (hi, lo) = (half(0..5), half(5..10));
    for (half, value) in [hi, lo].into_iter().enumerate() {
        for i in 0..8 {
            let shift = 35 - 5 * i;
            out[half * 8 + i] = ALPHABET[((value >> shift) & 0x1f) as usize];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NamespacedName;

    fn port(ns: &str, name: &str, port: &str) -> String {
        service_port_text(&ServicePortName::new(
            NamespacedName::new(ns, name),
            port,
            Protocol::Tcp,
        ))
    }

    #[test]
    fn base32_matches_rfc4648_vectors() {
        // RFC 4648 section 10: BASE32("foobar") = "MZXW6YTBOI======"; 10 bytes of "foobarfoob"
        // give 16 full characters.
        let enc = base32_prefix(b"foobarfoob");
        assert_eq!(&enc, b"MZXW6YTBOJTG633C");
    }

    #[test]
    fn hashes_equal_upstreams_for_the_same_service_ports_and_endpoints() {
        // From upstream's TestOverallIPTablesRules expected output (KUBE-SVC-XPGD46QRK7WJZT7O,
        // KUBE-SEP-SXIVWICOYRO3J4NJ).
        let svc1 = port("ns1", "svc1", "p80");
        assert_eq!(
            service_port_hash(&svc1, Protocol::Tcp).as_str(),
            "XPGD46QRK7WJZT7O"
        );
        let endpoint: SocketAddr = "10.180.0.1:80".parse().unwrap();
        assert_eq!(
            endpoint_hash(&svc1, Protocol::Tcp, &endpoint).as_str(),
            "SXIVWICOYRO3J4NJ"
        );
    }
}
