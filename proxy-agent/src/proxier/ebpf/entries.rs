// SPDX-License-Identifier: Apache-2.0
//! Map entries in family-neutral form (IpAddr instead of u32 / [u8; 16]), and their
//! conversion to the kernel layouts of proxy-common at the map boundary.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;
use proxy_common::{
    BACKEND_F_LOCAL, BACKEND_F_TERMINATING, Backend4Value, Backend6Value, NodeAddr4Key,
    NodeAddr6Key, RevNat4Value, RevNat6Value, SOURCE_RANGE_PREFIX_BITS, SourceRange4, SourceRange6,
    Svc4Key, Svc6Key, SvcValue,
};

use super::{
    desired::{BackendAddr, FrontendKey},
    maps::{LbMaps, Map, Prefix, Result},
};

/// One slot of one scope of a frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SvcEntryKey {
    pub frontend: FrontendKey,
    pub scope: u8,
    pub slot: u16,
}

impl SvcEntryKey {
    /// The key a kernel IPv4 service-map key stands for.
    pub fn from_svc4(k: &Svc4Key) -> Self {
        SvcEntryKey {
            frontend: FrontendKey {
                addr: IpAddr::V4(v4_from_raw(k.addr)),
                port: u16::from_be(k.dport),
                proto: k.proto,
            },
            scope: k.scope,
            slot: k.slot,
        }
    }

    /// The key a kernel IPv6 service-map key stands for.
    pub fn from_svc6(k: &Svc6Key) -> Self {
        SvcEntryKey {
            frontend: FrontendKey {
                addr: IpAddr::V6(Ipv6Addr::from(k.addr)),
                port: u16::from_be(k.dport),
                proto: k.proto,
            },
            scope: k.scope,
            slot: k.slot,
        }
    }

    /// Whether this entry holds its frontend's reverse-NAT id for adoption: slot 0 of the
    /// external scope, and not a ClusterIP wildcard (which has no id).
    pub fn names_frontend(&self, flags: u16) -> bool {
        self.slot == 0
            && self.scope == proxy_common::SCOPE_EXTERNAL
            && flags & proxy_common::svc_flags::WILDCARD == 0
    }

    /// The ClusterIP wildcard entry of `ip` (any port, any protocol).
    pub fn wildcard(ip: IpAddr) -> Self {
        SvcEntryKey {
            frontend: FrontendKey {
                addr: ip,
                port: 0,
                proto: 0,
            },
            scope: proxy_common::SCOPE_EXTERNAL,
            slot: 0,
        }
    }
}

/// A backend as stored: address and flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendEntry {
    pub addr: BackendAddr,
    pub local: bool,
    pub terminating: bool,
}

/// Everything in the LB maps, family-neutral. The three big tables hash with foldhash, as
/// the apply stage's own do: a full sync of 100,000 services reads 2.2 million entries
/// into them, and builds as many for what it expects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub svc: foldhash::HashMap<SvcEntryKey, SvcValue>,
    pub backends: foldhash::HashMap<(bool, u32), BackendEntry>,
    pub rev_nat: foldhash::HashMap<(bool, u32), (IpAddr, u16)>,
    pub src_ranges: HashSet<(u32, IpNet)>,
    pub nodeport_addrs: HashSet<IpAddr>,
    pub svc_cidrs: HashSet<IpNet>,
}

fn v4_raw(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

fn v4_from_raw(raw: u32) -> Ipv4Addr {
    Ipv4Addr::from(raw.to_ne_bytes())
}

fn svc4_key(k: &SvcEntryKey, a: Ipv4Addr) -> Svc4Key {
    Svc4Key {
        addr: v4_raw(a),
        dport: k.frontend.port.to_be(),
        slot: k.slot,
        proto: k.frontend.proto,
        scope: k.scope,
        _pad: [0; 2],
    }
}

fn svc6_key(k: &SvcEntryKey, a: Ipv6Addr) -> Svc6Key {
    Svc6Key {
        addr: a.octets(),
        dport: k.frontend.port.to_be(),
        slot: k.slot,
        proto: k.frontend.proto,
        scope: k.scope,
        _pad: [0; 2],
    }
}

fn backend_flags(b: &BackendEntry) -> u8 {
    let mut f = 0;
    if b.local {
        f |= BACKEND_F_LOCAL;
    }
    if b.terminating {
        f |= BACKEND_F_TERMINATING;
    }
    f
}

fn prefix_bits(net: &IpNet) -> u32 {
    SOURCE_RANGE_PREFIX_BITS + u32::from(net.prefix_len())
}

/// One entry in its family's kernel layout.
enum ByFamily<A, B> {
    V4(A),
    V6(B),
}

/// Writes `entries` in order into `map4` and `map6`, each family's runs in as few system
/// calls as the map allows: a change of family ends the other family's run. A run is sized
/// once, on its first entry, for all the entries left (grown by doubling, it copied a cold
/// sync's million entries several times, and a one-service sync's few dozen twice or three
/// times).
fn put_family_runs<K4: Copy, V4: Copy, K6: Copy, V6: Copy>(
    entries: impl Iterator<Item = ByFamily<(K4, V4), (K6, V6)>>,
    map4: &mut Map<K4, V4>,
    map6: &mut Map<K6, V6>,
) -> Result<()> {
    let (least, most) = entries.size_hint();
    let room = most.unwrap_or(least);
    let mut run4: Vec<(K4, V4)> = Vec::new();
    let mut run6: Vec<(K6, V6)> = Vec::new();
    for entry in entries {
        match entry {
            ByFamily::V4(item) => {
                if !run6.is_empty() {
                    map6.put_many(&std::mem::take(&mut run6))?;
                }
                if run4.capacity() == 0 {
                    run4.reserve(room);
                }
                run4.push(item);
            }
            ByFamily::V6(item) => {
                if !run4.is_empty() {
                    map4.put_many(&std::mem::take(&mut run4))?;
                }
                if run6.capacity() == 0 {
                    run6.reserve(room);
                }
                run6.push(item);
            }
        }
    }
    map4.put_many(&run4)?;
    map6.put_many(&run6)
}

/// Writes `parts` into `map4` and `map6`: each part in order, the parts at once where the
/// maps allow (see [`KvMap::put_parts`](super::maps::KvMap::put_parts)).
fn put_family_parts<K4: Copy, V4: Copy, K6: Copy, V6: Copy, P>(
    parts: impl IntoIterator<Item = P>,
    map4: &mut Map<K4, V4>,
    map6: &mut Map<K6, V6>,
) -> Result<()>
where
    P: Iterator<Item = ByFamily<(K4, V4), (K6, V6)>>,
{
    let mut v4: Vec<Vec<(K4, V4)>> = Vec::new();
    let mut v6: Vec<Vec<(K6, V6)>> = Vec::new();
    for part in parts {
        let (mut part4, mut part6) = (Vec::with_capacity(part.size_hint().0), Vec::new());
        for entry in part {
            match entry {
                ByFamily::V4(item) => part4.push(item),
                ByFamily::V6(item) => part6.push(item),
            }
        }
        v4.push(part4);
        v6.push(part6);
    }
    map4.put_parts(&v4.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
    map6.put_parts(&v6.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// A service entry in its family's layout.
fn svc_entry(k: &SvcEntryKey, v: &SvcValue) -> ByFamily<(Svc4Key, SvcValue), (Svc6Key, SvcValue)> {
    match k.frontend.addr {
        IpAddr::V4(a) => ByFamily::V4((svc4_key(k, a), *v)),
        IpAddr::V6(a) => ByFamily::V6((svc6_key(k, a), *v)),
    }
}

/// A backend entry in its family's layout.
fn backend_entry(
    id: u32,
    b: &BackendEntry,
) -> ByFamily<(u32, Backend4Value), (u32, Backend6Value)> {
    let (port, proto, flags) = (b.addr.port.to_be(), b.addr.proto, backend_flags(b));
    match b.addr.addr {
        IpAddr::V4(a) => ByFamily::V4((
            id,
            Backend4Value {
                addr: v4_raw(a),
                port,
                proto,
                flags,
            },
        )),
        IpAddr::V6(a) => ByFamily::V6((
            id,
            Backend6Value {
                addr: a.octets(),
                port,
                proto,
                flags,
            },
        )),
    }
}

/// A reverse-NAT entry in its family's layout.
fn rev_nat_entry(
    id: u32,
    addr: IpAddr,
    port: u16,
) -> ByFamily<(u32, RevNat4Value), (u32, RevNat6Value)> {
    match addr {
        IpAddr::V4(a) => ByFamily::V4((
            id,
            RevNat4Value {
                addr: v4_raw(a),
                port: port.to_be(),
                _pad: 0,
            },
        )),
        IpAddr::V6(a) => ByFamily::V6((
            id,
            RevNat6Value {
                addr: a.octets(),
                port: port.to_be(),
                _pad: 0,
            },
        )),
    }
}

/// Typed writes through [`LbMaps`].
impl LbMaps {
    pub fn put_svc(&mut self, k: &SvcEntryKey, v: &SvcValue) -> Result<()> {
        match k.frontend.addr {
            IpAddr::V4(a) => self.svc4.put(&svc4_key(k, a), v),
            IpAddr::V6(a) => self.svc6.put(&svc6_key(k, a), v),
        }
    }

    /// Writes service entries in order, each family's runs in as few system calls as the
    /// map allows.
    pub fn put_svcs<'a>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a SvcEntryKey, &'a SvcValue)>,
    ) -> Result<()> {
        let entries = entries.into_iter().map(|(k, v)| svc_entry(k, v));
        put_family_runs(entries, &mut self.svc4, &mut self.svc6)
    }

    /// Writes service entries in `parts`: each part in order, the parts at once where the
    /// maps allow (see [`KvMap::put_parts`]); each frontend's entries must be in one part.
    pub fn put_svcs_in_parts<'a, P>(&mut self, parts: impl IntoIterator<Item = P>) -> Result<()>
    where
        P: IntoIterator<Item = (&'a SvcEntryKey, &'a SvcValue)>,
    {
        let parts = parts
            .into_iter()
            .map(|part| part.into_iter().map(|(k, v)| svc_entry(k, v)));
        put_family_parts(parts, &mut self.svc4, &mut self.svc6)
    }

    /// Writes backend entries in order, in as few system calls as the maps allow.
    pub fn put_backends<'a>(
        &mut self,
        entries: impl IntoIterator<Item = (u32, &'a BackendEntry)>,
    ) -> Result<()> {
        let entries = entries.into_iter().map(|(id, b)| backend_entry(id, b));
        put_family_runs(entries, &mut self.backends4, &mut self.backends6)
    }

    /// Writes backend entries in `parts`, at once where the maps allow (for entries nothing
    /// refers to yet, whose order does not matter).
    pub fn put_backends_in_parts<'a, P>(&mut self, parts: impl IntoIterator<Item = P>) -> Result<()>
    where
        P: IntoIterator<Item = (u32, &'a BackendEntry)>,
    {
        let parts = parts
            .into_iter()
            .map(|part| part.into_iter().map(|(id, b)| backend_entry(id, b)));
        put_family_parts(parts, &mut self.backends4, &mut self.backends6)
    }

    /// Writes reverse-NAT entries in order, in as few system calls as the maps allow.
    pub fn put_rev_nats(
        &mut self,
        entries: impl IntoIterator<Item = (u32, IpAddr, u16)>,
    ) -> Result<()> {
        let entries = entries
            .into_iter()
            .map(|(id, addr, port)| rev_nat_entry(id, addr, port));
        put_family_runs(entries, &mut self.rev_nat4, &mut self.rev_nat6)
    }

    /// Writes reverse-NAT entries in `parts`, at once where the maps allow (as
    /// [`LbMaps::put_backends_in_parts`]).
    pub fn put_rev_nats_in_parts<P>(&mut self, parts: impl IntoIterator<Item = P>) -> Result<()>
    where
        P: IntoIterator<Item = (u32, IpAddr, u16)>,
    {
        let parts = parts.into_iter().map(|part| {
            part.into_iter()
                .map(|(id, addr, port)| rev_nat_entry(id, addr, port))
        });
        put_family_parts(parts, &mut self.rev_nat4, &mut self.rev_nat6)
    }

    pub fn del_svc(&mut self, k: &SvcEntryKey) -> Result<()> {
        match k.frontend.addr {
            IpAddr::V4(a) => self.svc4.delete(&svc4_key(k, a)),
            IpAddr::V6(a) => self.svc6.delete(&svc6_key(k, a)),
        }
    }

    pub fn put_backend(&mut self, id: u32, b: &BackendEntry) -> Result<()> {
        let port = b.addr.port.to_be();
        match b.addr.addr {
            IpAddr::V4(a) => self.backends4.put(
                &id,
                &Backend4Value {
                    addr: v4_raw(a),
                    port,
                    proto: b.addr.proto,
                    flags: backend_flags(b),
                },
            ),
            IpAddr::V6(a) => self.backends6.put(
                &id,
                &Backend6Value {
                    addr: a.octets(),
                    port,
                    proto: b.addr.proto,
                    flags: backend_flags(b),
                },
            ),
        }
    }

    pub fn del_backend(&mut self, v6: bool, id: u32) -> Result<()> {
        if v6 {
            self.backends6.delete(&id)
        } else {
            self.backends4.delete(&id)
        }
    }

    pub fn put_rev_nat(&mut self, id: u32, addr: IpAddr, port: u16) -> Result<()> {
        match addr {
            IpAddr::V4(a) => self.rev_nat4.put(
                &id,
                &RevNat4Value {
                    addr: v4_raw(a),
                    port: port.to_be(),
                    _pad: 0,
                },
            ),
            IpAddr::V6(a) => self.rev_nat6.put(
                &id,
                &RevNat6Value {
                    addr: a.octets(),
                    port: port.to_be(),
                    _pad: 0,
                },
            ),
        }
    }

    pub fn del_rev_nat(&mut self, v6: bool, id: u32) -> Result<()> {
        if v6 {
            self.rev_nat6.delete(&id)
        } else {
            self.rev_nat4.delete(&id)
        }
    }

    pub fn put_src_range(&mut self, id: u32, net: &IpNet) -> Result<()> {
        match net {
            IpNet::V4(n) => self.src_ranges4.put(
                &Prefix {
                    len: prefix_bits(net),
                    data: SourceRange4 {
                        rev_nat_id: id.to_be(),
                        addr: v4_raw(n.network()),
                    },
                },
                &1,
            ),
            IpNet::V6(n) => self.src_ranges6.put(
                &Prefix {
                    len: prefix_bits(net),
                    data: SourceRange6 {
                        rev_nat_id: id.to_be(),
                        addr: n.network().octets(),
                    },
                },
                &1,
            ),
        }
    }

    pub fn del_src_range(&mut self, id: u32, net: &IpNet) -> Result<()> {
        match net {
            IpNet::V4(n) => self.src_ranges4.delete(&Prefix {
                len: prefix_bits(net),
                data: SourceRange4 {
                    rev_nat_id: id.to_be(),
                    addr: v4_raw(n.network()),
                },
            }),
            IpNet::V6(n) => self.src_ranges6.delete(&Prefix {
                len: prefix_bits(net),
                data: SourceRange6 {
                    rev_nat_id: id.to_be(),
                    addr: n.network().octets(),
                },
            }),
        }
    }

    pub fn put_nodeport_addr(&mut self, ip: IpAddr) -> Result<()> {
        match ip {
            IpAddr::V4(a) => self
                .nodeport_addrs4
                .put(&NodeAddr4Key { addr: v4_raw(a) }, &1),
            IpAddr::V6(a) => self
                .nodeport_addrs6
                .put(&NodeAddr6Key { addr: a.octets() }, &1),
        }
    }

    pub fn del_nodeport_addr(&mut self, ip: IpAddr) -> Result<()> {
        match ip {
            IpAddr::V4(a) => self
                .nodeport_addrs4
                .delete(&NodeAddr4Key { addr: v4_raw(a) }),
            IpAddr::V6(a) => self
                .nodeport_addrs6
                .delete(&NodeAddr6Key { addr: a.octets() }),
        }
    }

    pub fn put_svc_cidr(&mut self, net: &IpNet) -> Result<()> {
        match net {
            IpNet::V4(n) => self.svc_cidrs4.put(
                &Prefix {
                    len: u32::from(n.prefix_len()),
                    data: n.network().octets(),
                },
                &1,
            ),
            IpNet::V6(n) => self.svc_cidrs6.put(
                &Prefix {
                    len: u32::from(n.prefix_len()),
                    data: n.network().octets(),
                },
                &1,
            ),
        }
    }

    pub fn del_svc_cidr(&mut self, net: &IpNet) -> Result<()> {
        match net {
            IpNet::V4(n) => self.svc_cidrs4.delete(&Prefix {
                len: u32::from(n.prefix_len()),
                data: n.network().octets(),
            }),
            IpNet::V6(n) => self.svc_cidrs6.delete(&Prefix {
                len: u32::from(n.prefix_len()),
                data: n.network().octets(),
            }),
        }
    }

    /// Everything the maps hold now (a full sync compares against it).
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut s = Snapshot::default();
        // Each table sized once for what was read (a million entries grew by doubling).
        let (svc4, svc6) = (self.svc4.entries()?, self.svc6.entries()?);
        s.svc.reserve(svc4.len() + svc6.len());
        for (k, v) in svc4 {
            s.svc.insert(SvcEntryKey::from_svc4(&k), v);
        }
        for (k, v) in svc6 {
            s.svc.insert(SvcEntryKey::from_svc6(&k), v);
        }
        let (backends4, backends6) = (self.backends4.entries()?, self.backends6.entries()?);
        s.backends.reserve(backends4.len() + backends6.len());
        for (id, v) in backends4 {
            s.backends.insert(
                (false, id),
                BackendEntry {
                    addr: BackendAddr {
                        addr: IpAddr::V4(v4_from_raw(v.addr)),
                        port: u16::from_be(v.port),
                        proto: v.proto,
                    },
                    local: v.flags & BACKEND_F_LOCAL != 0,
                    terminating: v.flags & BACKEND_F_TERMINATING != 0,
                },
            );
        }
        for (id, v) in backends6 {
            s.backends.insert(
                (true, id),
                BackendEntry {
                    addr: BackendAddr {
                        addr: IpAddr::V6(Ipv6Addr::from(v.addr)),
                        port: u16::from_be(v.port),
                        proto: v.proto,
                    },
                    local: v.flags & BACKEND_F_LOCAL != 0,
                    terminating: v.flags & BACKEND_F_TERMINATING != 0,
                },
            );
        }
        let (rev_nat4, rev_nat6) = (self.rev_nat4.entries()?, self.rev_nat6.entries()?);
        s.rev_nat.reserve(rev_nat4.len() + rev_nat6.len());
        for (id, v) in rev_nat4 {
            s.rev_nat.insert(
                (false, id),
                (IpAddr::V4(v4_from_raw(v.addr)), u16::from_be(v.port)),
            );
        }
        for (id, v) in rev_nat6 {
            s.rev_nat.insert(
                (true, id),
                (IpAddr::V6(Ipv6Addr::from(v.addr)), u16::from_be(v.port)),
            );
        }
        for (p, _) in self.src_ranges4.entries()? {
            let len = p.len.saturating_sub(SOURCE_RANGE_PREFIX_BITS) as u8;
            if let Ok(net) = ipnet::Ipv4Net::new(v4_from_raw(p.data.addr), len) {
                s.src_ranges
                    .insert((u32::from_be(p.data.rev_nat_id), IpNet::V4(net)));
            }
        }
        for (p, _) in self.src_ranges6.entries()? {
            let len = p.len.saturating_sub(SOURCE_RANGE_PREFIX_BITS) as u8;
            if let Ok(net) = ipnet::Ipv6Net::new(Ipv6Addr::from(p.data.addr), len) {
                s.src_ranges
                    .insert((u32::from_be(p.data.rev_nat_id), IpNet::V6(net)));
            }
        }
        for (k, _) in self.nodeport_addrs4.entries()? {
            s.nodeport_addrs.insert(IpAddr::V4(v4_from_raw(k.addr)));
        }
        for (k, _) in self.nodeport_addrs6.entries()? {
            s.nodeport_addrs.insert(IpAddr::V6(Ipv6Addr::from(k.addr)));
        }
        for (p, _) in self.svc_cidrs4.entries()? {
            if let Ok(net) = ipnet::Ipv4Net::new(Ipv4Addr::from(p.data), p.len as u8) {
                s.svc_cidrs.insert(IpNet::V4(net));
            }
        }
        for (p, _) in self.svc_cidrs6.entries()? {
            if let Ok(net) = ipnet::Ipv6Net::new(Ipv6Addr::from(p.data), p.len as u8) {
                s.svc_cidrs.insert(IpNet::V6(net));
            }
        }
        Ok(s)
    }
}
