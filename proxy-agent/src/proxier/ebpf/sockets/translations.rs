// SPDX-License-Identifier: Apache-2.0
//! Which connected UDP sockets our connect() program translated, and from which frontend.
//!
//! When it translates a UDP connect(), the program writes the socket's cookie and the
//! backend it chose, with the frontend asked for, into `SOCK_REV_NAT{4,6}_V1` (the map the
//! sendmsg() program fills for unconnected sockets); a UDP connect() it does not translate
//! removes the entry for the address connected to. So a connected socket whose cookie and
//! current peer have an entry was translated to that peer, from that frontend; a socket
//! connected to a pod directly has none. sock_diag reports both cookie and peer on every
//! kernel. (The socket's own storage, `SOCK_FRONTEND_V1`, holds the same translation, but
//! sock_diag does not return it for UDP on 6.18.) The map is LRU: an entry evicted under
//! pressure makes its socket look untranslated, which leaves it alone (the sweep misses
//! it; it never hits a socket it should not).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
};

use aya::maps::{HashMap as AyaHash, Map, MapData, MapError};
use proxy_common::{SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value};

use super::{diag::SockId, namespaces::Netns};

#[derive(Debug, thiserror::Error)]
#[error("reading {map}: {source}")]
pub struct TranslationsError {
    pub map: PathBuf,
    #[source]
    pub source: MapError,
}

/// A connected UDP socket our connect() program translated: its identity, the frontend
/// the application asked for, and the backend it was given (its peer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TranslatedUdp {
    pub id: SockId,
    pub frontend: SocketAddr,
    pub backend: SocketAddr,
}

impl TranslatedUdp {
    pub fn family(&self) -> crate::model::IpFamily {
        crate::model::IpFamily::of(&self.backend.ip())
    }
}

/// Looks the sockets up: those our program translated, with their frontends.
pub trait Translations: Send {
    fn translated(
        &mut self,
        sockets: &[(Netns, SockId)],
    ) -> Result<Vec<(Netns, TranslatedUdp)>, TranslationsError>;
}

/// The pinned maps (opened afresh at each sweep: a resize replaces them under their pins).
pub struct PinnedRevNat {
    pub v4: PathBuf,
    pub v6: PathBuf,
}

fn open<K: aya::Pod, V: aya::Pod>(
    path: &Path,
) -> Result<AyaHash<MapData, K, V>, TranslationsError> {
    let error = |source| TranslationsError {
        map: path.to_path_buf(),
        source,
    };
    let data = MapData::from_pin(path).map_err(error)?;
    AyaHash::try_from(Map::LruHashMap(data)).map_err(error)
}

/// The map key of a socket's translation (addresses and ports in network byte order, as
/// the programs keep them).
pub fn key4(cookie: u64, peer: &SocketAddr) -> Option<SockRevNat4Key> {
    let IpAddr::V4(ip) = peer.ip() else {
        return None;
    };
    Some(SockRevNat4Key {
        cookie,
        addr: u32::from_ne_bytes(ip.octets()),
        port: peer.port().to_be(),
        _pad: 0,
    })
}

pub fn key6(cookie: u64, peer: &SocketAddr) -> Option<SockRevNat6Key> {
    let IpAddr::V6(ip) = peer.ip() else {
        return None;
    };
    Some(SockRevNat6Key {
        cookie,
        addr: ip.octets(),
        port: peer.port().to_be(),
        _pad: [0; 6],
    })
}

pub fn frontend4(value: &SockRevNat4Value) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::from(value.addr.to_ne_bytes())),
        u16::from_be(value.port),
    )
}

pub fn frontend6(value: &SockRevNat6Value) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::from(value.addr)),
        u16::from_be(value.port),
    )
}

fn found<V>(result: Result<V, MapError>, map: &Path) -> Result<Option<V>, TranslationsError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(source) => Err(TranslationsError {
            map: map.to_path_buf(),
            source,
        }),
    }
}

impl Translations for PinnedRevNat {
    fn translated(
        &mut self,
        sockets: &[(Netns, SockId)],
    ) -> Result<Vec<(Netns, TranslatedUdp)>, TranslationsError> {
        let v4 = open::<SockRevNat4Key, SockRevNat4Value>(&self.v4)?;
        // A node without IPv6 still has the map (the programs define both).
        let v6 = open::<SockRevNat6Key, SockRevNat6Value>(&self.v6)?;
        let mut out = Vec::new();
        for (netns, id) in sockets {
            let frontend = if let Some(key) = key4(id.cookie, &id.peer) {
                found(v4.get(&key, 0), &self.v4)?.map(|v| frontend4(&v))
            } else if let Some(key) = key6(id.cookie, &id.peer) {
                found(v6.get(&key, 0), &self.v6)?.map(|v| frontend6(&v))
            } else {
                None
            };
            if let Some(frontend) = frontend {
                out.push((
                    netns.clone(),
                    TranslatedUdp {
                        id: *id,
                        frontend,
                        backend: id.peer,
                    },
                ));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_in_network_byte_order() {
        let peer: SocketAddr = "10.180.0.1:9000".parse().unwrap();
        let key = key4(7, &peer).unwrap();
        assert_eq!(key.addr.to_ne_bytes(), [10, 180, 0, 1]);
        assert_eq!(key.port.to_ne_bytes(), 9000u16.to_be_bytes());
        assert!(key6(7, &peer).is_none());
        let value = SockRevNat4Value {
            addr: u32::from_ne_bytes([172, 30, 0, 41]),
            port: 80u16.to_be(),
            _pad: 0,
            rev_nat_id: 3,
        };
        assert_eq!(frontend4(&value), "172.30.0.41:80".parse().unwrap());
        let peer6: SocketAddr = "[fd00:180::1]:9000".parse().unwrap();
        let key = key6(9, &peer6).unwrap();
        assert_eq!(key.addr[..2], [0xfd, 0]);
        let value = SockRevNat6Value {
            addr: "fd00:30::41".parse::<Ipv6Addr>().unwrap().octets(),
            port: 53u16.to_be(),
            _pad: 0,
            rev_nat_id: 1,
        };
        assert_eq!(frontend6(&value), "[fd00:30::41]:53".parse().unwrap());
    }
}
