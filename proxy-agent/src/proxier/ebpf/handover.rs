// SPDX-License-Identifier: Apache-2.0
//! Taking a node over from a netfilter mode (iptables, nftables, ipvs, or kube-proxy
//! itself) without breaking the connections that mode translated.
//!
//! An established connection the previous mode DNATed (or masqueraded) is translated by
//! its netfilter conntrack entry, not by rules: every later packet gets the entry's NAT
//! binding. That needs two things the previous mode's rules provided and its cleanup
//! takes away: connection tracking on in the namespace (the kernel turns it off when the
//! last rule that needs it goes — with iptables-nft and nftables, removing our rules is
//! exactly that), and NAT hooks at the four places bindings are applied. Without them the
//! next packet of such a connection leaves untranslated: to a ClusterIP no one owns, or
//! from the wrong address, and the connection is gone. (The programs do not take these
//! flows: a socket program only sees new connections, and tc only translates flows its
//! own conntrack knows.)
//!
//! So at start, when a family's netfilter table holds translated flows, ebpf mode installs
//! a table of its own, [`TABLE`]: empty NAT chains on the four hooks and one rule that
//! reads the connection state (its counter shows the packets of established flows).
//! Nothing in it matches a new flow: those are the programs'. Every maintenance round
//! (10 s) lists the table again, and once no translated flow is left the table goes.
//! Deleting it, like `--cleanup`, is harmless at any time: at worst the flows it kept end.
//!
//! Those flows' answers must stay netfilter's too. A masqueraded flow's answer comes to the
//! node's address at the port netfilter picked, and the programs pick SNAT ports knowing
//! only their own conntrack: a new flow to the same backend given that port would take the
//! old flow's answers, and the backend, seeing a second SYN for a connection it has, would
//! answer with an ACK whose reset (from the new flow's client) ends the old connection.
//! This is no rare case: the flows an earlier ebpf mode handed to netfilter keep the
//! programs' ports. So while the table lives, each masqueraded answer tuple of netfilter's
//! is also written into the BPF conntrack as a reservation ([`Reservations`],
//! `CT_F_NETFILTER`): the programs leave its packets to the stack and give its port to no
//! new flow. Each maintenance round writes the new ones and removes the ended ones.
//!
//! The other way, a netfilter mode taking over from ebpf mode, the flows the programs
//! translated live in the BPF conntrack maps, which go with the programs. The new mode's
//! cleanup of ebpf mode's state (after its own first sync: its rules are in place) first
//! tells the programs to start no flow ([`leave_new_flows_to_netfilter`]): new
//! connections go to the rules from then on, and the BPF conntrack stops growing. Then,
//! before removing the programs, it writes each live TCP and UDP flow into netfilter's
//! table, translated as the programs translated it ([`HeldConntrack::seed_netfilter`]:
//! client -> frontend DNATed to the same backend, masqueraded to the same address and
//! port), so the next packet meets a binding instead of the rules' choice of a backend.
//! Without the first step, a connection the programs started between that copy and their
//! removal met the rules at its second packet: another backend, which reset it.
//!
//! Written by hand because ctnetlink has no "is conntrack on" query; [`translated`],
//! [`flow_of`] and the scripts are pure, the rest runs `nft`, reads the pinned maps and
//! talks ctnetlink.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use aya::maps::{Array, HashMap as AyaHash, Map, MapData};
use proxy_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_CLOSING, CT_F_NETFILTER, CT_F_SNAT, Ct4Key, Ct6Key, CtValue,
    LB_CFG_HANDING_OVER, LbConfig, proto,
};
use tracing::{info, warn};

use crate::model::IpFamily;
use crate::proxier::conntrack::{ConntrackTable, Entry, NatFlow, NetlinkConntrack, Replace, Tuple};
use crate::proxier::nftables::family_keyword;

/// The handover table's name, in the `ip` and `ip6` families.
pub const TABLE: &str = "kube-proxy-ebpf-handover";

/// Whether netfilter translated this flow: its answers do not come from where the client
/// sent it, or do not go back to where it came from.
pub fn translated(entry: &Entry) -> bool {
    entry.reply.src != entry.orig.dst
        || entry.reply.src_port != entry.orig.dst_port
        || entry.reply.dst != entry.orig.src
        || entry.reply.dst_port != entry.orig.src_port
}

/// The answer tuple of a translated netfilter flow whose answers come to a translated
/// destination (it was masqueraded): what the programs must not give a new flow (see the
/// module doc). `None` for other flows, and for protocols the programs do not translate.
pub fn masqueraded_answer(entry: &Entry) -> Option<Tuple> {
    let tracked = [proto::TCP, proto::UDP, proto::SCTP].contains(&entry.reply.protocol);
    let masqueraded =
        entry.reply.dst != entry.orig.src || entry.reply.dst_port != entry.orig.src_port;
    (tracked && masqueraded).then_some(entry.reply)
}

/// The BPF conntrack's reservations of netfilter's answer tuples (`CT_F_NETFILTER` reply
/// entries), per family.
pub trait Reservations: Send {
    /// Every reservation of the family.
    fn list(&mut self, family: IpFamily) -> Result<BTreeSet<Tuple>, String>;
    fn reserve(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String>;
    fn release(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String>;
}

/// The family's reservations made to be `wanted`: (written, removed), and the first error.
fn reconcile(
    reservations: &mut dyn Reservations,
    family: IpFamily,
    wanted: &BTreeSet<Tuple>,
) -> Result<(usize, usize), String> {
    let held = reservations.list(family)?;
    let mut written = 0;
    for answer in wanted.difference(&held) {
        reservations.reserve(family, answer)?;
        written += 1;
    }
    let mut removed = 0;
    for answer in held.difference(wanted) {
        reservations.release(family, answer)?;
        removed += 1;
    }
    Ok((written, removed))
}

/// The BPF conntrack key and value reserving `answer` (see [`CT_F_NETFILTER`]): a reply
/// entry that describes no translation, never expiring (the agent removes it).
fn reservation_value(answer: &Tuple) -> CtValue {
    let at = |ip: IpAddr| match ip {
        IpAddr::V4(ip) => {
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&ip.octets());
            bytes
        }
        IpAddr::V6(ip) => ip.octets(),
    };
    CtValue {
        frontend_addr: at(answer.src),
        backend_addr: at(answer.src),
        client_addr: at(answer.dst),
        frontend_port: answer.src_port.to_be(),
        backend_port: answer.src_port.to_be(),
        client_port: answer.dst_port.to_be(),
        flags: CT_F_NETFILTER,
        expires: u32::MAX,
        ..CtValue::default()
    }
}

fn reservation_key4(answer: &Tuple) -> Option<Ct4Key> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (answer.src, answer.dst) else {
        return None;
    };
    Some(Ct4Key {
        saddr: u32::from_ne_bytes(src.octets()),
        daddr: u32::from_ne_bytes(dst.octets()),
        sport: answer.src_port.to_be(),
        dport: answer.dst_port.to_be(),
        proto: answer.protocol,
        dir: CT_DIR_REPLY,
        _pad: [0; 2],
    })
}

fn reservation_key6(answer: &Tuple) -> Option<Ct6Key> {
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (answer.src, answer.dst) else {
        return None;
    };
    Some(Ct6Key {
        saddr: src.octets(),
        daddr: dst.octets(),
        sport: answer.src_port.to_be(),
        dport: answer.dst_port.to_be(),
        proto: answer.protocol,
        dir: CT_DIR_REPLY,
        _pad: [0; 2],
    })
}

/// The answer tuple a reservation's key stands for.
fn answer_of4(key: &Ct4Key) -> Tuple {
    Tuple {
        src: IpAddr::V4(Ipv4Addr::from(key.saddr.to_ne_bytes())),
        dst: IpAddr::V4(Ipv4Addr::from(key.daddr.to_ne_bytes())),
        protocol: key.proto,
        src_port: u16::from_be(key.sport),
        dst_port: u16::from_be(key.dport),
    }
}

fn answer_of6(key: &Ct6Key) -> Tuple {
    Tuple {
        src: IpAddr::V6(Ipv6Addr::from(key.saddr)),
        dst: IpAddr::V6(Ipv6Addr::from(key.daddr)),
        protocol: key.proto,
        src_port: u16::from_be(key.sport),
        dst_port: u16::from_be(key.dport),
    }
}

/// The transaction that (re)creates the family's table.
pub fn create_script(family: IpFamily) -> String {
    let ip = family_keyword(family);
    format!(
        "add table {ip} {TABLE}\n\
         delete table {ip} {TABLE}\n\
         table {ip} {TABLE} {{\n\
         \tchain nat-prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}\n\
         \tchain nat-input {{ type nat hook input priority 100; policy accept; }}\n\
         \tchain nat-output {{ type nat hook output priority -100; policy accept; }}\n\
         \tchain nat-postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         \tchain established {{\n\
         \t\ttype filter hook prerouting priority -150; policy accept;\n\
         \t\tct state established,related counter\n\
         \t}}\n\
         }}\n"
    )
}

/// The transaction that removes the family's table (whether or not it exists).
pub fn delete_script(family: IpFamily) -> String {
    let ip = family_keyword(family);
    format!("add table {ip} {TABLE}\ndelete table {ip} {TABLE}\n")
}

/// The nftables operations of the handover.
pub trait Nft: Send {
    /// Runs one `nft -f -` transaction.
    fn run(&mut self, script: &str) -> Result<(), String>;
    /// Whether the family's handover table exists (false where nft is missing).
    fn table_exists(&mut self, family: IpFamily) -> bool;
}

/// `nft` on PATH.
#[derive(Debug, Default)]
pub struct NftCommand;

impl Nft for NftCommand {
    fn run(&mut self, script: &str) -> Result<(), String> {
        crate::proxier::nftables::nft(&["-f", "-"], Some(script))
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn table_exists(&mut self, family: IpFamily) -> bool {
        crate::proxier::nftables::nft(&["list", "table", family_keyword(family), TABLE], None)
            .is_ok()
    }
}

/// The handover of one agent: which families hold the table.
pub struct NetfilterHandover {
    conntrack: Box<dyn ConntrackTable>,
    nft: Box<dyn Nft>,
    reservations: Box<dyn Reservations>,
    active: BTreeSet<IpFamily>,
}

impl NetfilterHandover {
    pub fn new(
        conntrack: Box<dyn ConntrackTable>,
        nft: Box<dyn Nft>,
        reservations: Box<dyn Reservations>,
    ) -> Self {
        Self {
            conntrack,
            nft,
            reservations,
            active: BTreeSet::new(),
        }
    }

    /// The family's netfilter flows that were translated; `None` when the table cannot be
    /// listed (then nothing is known, and nothing is installed or removed).
    fn translated_flows(&mut self, family: IpFamily) -> Option<Vec<Entry>> {
        match self.conntrack.list(family) {
            Ok(mut entries) => {
                entries.retain(translated);
                Some(entries)
            }
            Err(error) => {
                warn!(%family, %error, "listing netfilter conntrack for the handover");
                None
            }
        }
    }

    /// Makes the family's reservations those of `flows`' masqueraded answers.
    fn reserve_answers(&mut self, family: IpFamily, flows: &[Entry]) {
        let wanted: BTreeSet<Tuple> = flows.iter().filter_map(masqueraded_answer).collect();
        match reconcile(self.reservations.as_mut(), family, &wanted) {
            Ok((0, 0)) => {}
            Ok((written, removed)) => info!(
                %family,
                written,
                removed,
                reserved = wanted.len(),
                "SNAT ports of netfilter's masqueraded flows reserved in the BPF conntrack"
            ),
            Err(error) => warn!(
                %family,
                %error,
                "reserving the SNAT ports of netfilter's flows: a new flow may take one over"
            ),
        }
    }

    /// At start, before the previous mode's rules go and before the first sync gives the
    /// programs a frontend: every family with translated flows gets the table and the
    /// reservations of their answers. A table left by an earlier agent (an upgrade during
    /// a handover) is kept while its flows live, and removed otherwise.
    pub fn begin(&mut self, families: &[IpFamily]) {
        for &family in families {
            let flows = match self.translated_flows(family) {
                Some(flows) if flows.is_empty() => {
                    if self.nft.table_exists(family) {
                        self.active.insert(family);
                    }
                    continue;
                }
                Some(flows) => flows,
                None => continue,
            };
            match self.nft.run(&create_script(family)) {
                Ok(()) => {
                    info!(
                        %family,
                        flows = flows.len(),
                        table = TABLE,
                        "keeping netfilter conntrack and NAT on for the flows the previous mode translated"
                    );
                    self.active.insert(family);
                    self.reserve_answers(family, &flows);
                }
                Err(error) => warn!(
                    %family,
                    flows = flows.len(),
                    %error,
                    "could not keep netfilter NAT on: the previous mode's established flows will break"
                ),
            }
        }
        // Tables whose flows are already gone (left by an earlier agent) go at once.
        self.maintain();
    }

    /// Follows the translated flows: their reservations as they are, and the table of
    /// every family whose flows have all ended removed (with the last reservations).
    pub fn maintain(&mut self) {
        for family in self.active.clone() {
            let Some(flows) = self.translated_flows(family) else {
                continue;
            };
            self.reserve_answers(family, &flows);
            if !flows.is_empty() {
                continue;
            }
            match self.nft.run(&delete_script(family)) {
                Ok(()) => {
                    info!(%family, table = TABLE, "the previous mode's flows have ended; handover table removed");
                    self.active.remove(&family);
                }
                Err(error) => warn!(%family, %error, "removing the handover table"),
            }
        }
    }

    /// Whether a family still holds the table.
    pub fn active(&self) -> bool {
        !self.active.is_empty()
    }
}

/// Removes both families' tables (`--cleanup`, another mode starting); returns how many
/// existed, and the errors of the ones that could not go.
pub fn remove_tables(nft: &mut dyn Nft) -> (usize, Vec<String>) {
    let mut removed = 0;
    let mut errors = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        // Only a table that exists counts, and a node without nft has none.
        if !nft.table_exists(family) {
            continue;
        }
        match nft.run(&delete_script(family)) {
            Ok(()) => removed += 1,
            Err(e) => errors.push(format!("nft table {} {TABLE}: {e}", family_keyword(family))),
        }
    }
    (removed, errors)
}

/// The netfilter entry of a live flow the programs translated (a forward entry of the
/// BPF conntrack map: `proto` and `dir` from its key), with `now` in the map's clock
/// (CLOCK_MONOTONIC_COARSE seconds); `None` for reply entries, closing or expired flows and
/// protocols netfilter cannot be handed (SCTP).
pub fn flow_of(
    family: IpFamily,
    protocol: u8,
    dir: u8,
    value: &CtValue,
    now: u32,
) -> Option<NatFlow> {
    if dir != CT_DIR_FORWARD
        || (protocol != proto::TCP && protocol != proto::UDP)
        || value.flags & CT_F_CLOSING != 0
        || value.expires <= now
    {
        return None;
    }
    let ip = |bytes: &[u8; 16]| match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(*bytes)),
    };
    let at = |bytes: &[u8; 16], port: u16| SocketAddr::new(ip(bytes), u16::from_be(port));
    let (client, frontend) = (
        at(&value.client_addr, value.client_port),
        at(&value.frontend_addr, value.frontend_port),
    );
    Some(NatFlow {
        family,
        orig: Tuple {
            src: client.ip(),
            dst: frontend.ip(),
            protocol,
            src_port: client.port(),
            dst_port: frontend.port(),
        },
        dnat_to: at(&value.backend_addr, value.backend_port),
        snat_to: (value.flags & CT_F_SNAT != 0).then(|| at(&value.snat_addr, value.snat_port)),
        timeout: value.expires - now,
    })
}

/// Tells the programs whose maps are pinned under `maps_dir` that a netfilter mode, whose
/// rules are in place, is taking the node over (`LB_CFG_HANDING_OVER`): they start no flow
/// from then on, so the conntrack handed to netfilter cannot grow behind the copy, and
/// what they would have translated goes to the rules. Programs built before the flag
/// existed ignore it (the second copy, after they go, is what covers their flows).
/// Returns whether it was set: a node without the configuration slot has no programs that
/// read it.
pub fn leave_new_flows_to_netfilter(maps_dir: &Path) -> Result<bool, String> {
    let path = maps_dir.join(proxy_common::maps::LB_CONFIG);
    if !path.exists() {
        return Ok(false);
    }
    let failed = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let data = MapData::from_pin(&path).map_err(|e| failed(&e))?;
    let mut config: Array<MapData, LbConfig> =
        Array::try_from(Map::Array(data)).map_err(|e| failed(&e))?;
    let mut slot = config.get(&0, 0).map_err(|e| failed(&e))?;
    slot.flags |= LB_CFG_HANDING_OVER;
    config.set(0, slot, 0).map_err(|e| failed(&e))?;
    Ok(true)
}

fn open_ct<K: aya::Pod>(path: &Path) -> Result<AyaHash<MapData, K, CtValue>, String> {
    let data = MapData::from_pin(path).map_err(|e| format!("{}: {e}", path.display()))?;
    AyaHash::try_from(Map::LruHashMap(data)).map_err(|e| format!("{}: {e}", path.display()))
}

/// The BPF conntrack maps of both families, held open: a held map outlives its pin, so the
/// flows the programs add while they are being removed can still be read afterwards.
pub struct HeldConntrack {
    ct4: Option<AyaHash<MapData, Ct4Key, CtValue>>,
    ct6: Option<AyaHash<MapData, Ct6Key, CtValue>>,
    errors: Vec<String>,
}

impl HeldConntrack {
    /// Opens the pinned maps under `maps_dir`; a map that is not there has no flows.
    pub fn open(maps_dir: &Path) -> Self {
        let mut errors = Vec::new();
        let open = |name: &str| {
            let path = maps_dir.join(name);
            path.exists().then_some(path)
        };
        let ct4 = open(proxy_common::maps::CT4)
            .and_then(|path| open_ct::<Ct4Key>(&path).map_err(|e| errors.push(e)).ok());
        let ct6 = open(proxy_common::maps::CT6)
            .and_then(|path| open_ct::<Ct6Key>(&path).map_err(|e| errors.push(e)).ok());
        Self { ct4, ct6, errors }
    }

    fn live_flows(&self, now: u32) -> Vec<NatFlow> {
        let mut flows = Vec::new();
        if let Some(map) = &self.ct4 {
            flows.extend(map.iter().filter_map(|entry| {
                let (key, value) = entry.ok()?;
                flow_of(IpFamily::V4, key.proto, key.dir, &value, now)
            }));
        }
        if let Some(map) = &self.ct6 {
            flows.extend(map.iter().filter_map(|entry| {
                let (key, value) = entry.ok()?;
                flow_of(IpFamily::V6, key.proto, key.dir, &value, now)
            }));
        }
        flows
    }

    /// Hands the live flows to netfilter (see the module doc): once before the programs
    /// go, and once after, for the connections that started meanwhile (the ones handed
    /// over already exist there and are left alone). Returns how many were created, and
    /// what went wrong (opening the maps included, reported by the first call).
    ///
    /// Before the programs go (`Replace::Existing`), an entry netfilter has for a live
    /// flow is replaced: it is older than the programs' translation. A UDP flow that a
    /// netfilter mode translated before this ebpf mode started keeps its idle entry (the
    /// programs took the flow over and its packets bypass netfilter), and left in place
    /// it would send the next datagram to the old backend while the answer to the one in
    /// flight, from the programs' backend, found no entry to translate it back.
    pub fn seed_netfilter(&mut self, now: u32, replace: Replace) -> (usize, Vec<String>) {
        let mut errors = std::mem::take(&mut self.errors);
        let flows = self.live_flows(now);
        if flows.is_empty() {
            return (0, errors);
        }
        match NetlinkConntrack::new().create_translated(&flows, replace) {
            Ok(created) => {
                info!(
                    flows = flows.len(),
                    created, "handed the ebpf dataplane's live flows to netfilter conntrack"
                );
                (created, errors)
            }
            Err(e) => {
                errors.push(format!("handing flows to netfilter conntrack: {e}"));
                (0, errors)
            }
        }
    }
}

/// The reservations in the conntrack maps pinned under a directory: the ones the
/// programs read, opened again at each listing (a reconciliation starts with one), so
/// that a map replaced since (resized by a later start) is never written behind.
pub struct PinnedReservations {
    maps_dir: std::path::PathBuf,
    maps: HeldConntrack,
}

impl PinnedReservations {
    pub fn new(maps_dir: &Path) -> Self {
        Self {
            maps_dir: maps_dir.to_path_buf(),
            maps: HeldConntrack::open(maps_dir),
        }
    }
}

impl Reservations for PinnedReservations {
    fn list(&mut self, family: IpFamily) -> Result<BTreeSet<Tuple>, String> {
        self.maps = HeldConntrack::open(&self.maps_dir);
        if let Some(error) = self.maps.errors.first() {
            return Err(error.clone());
        }
        Ok(self.maps.reservations(family))
    }

    fn reserve(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String> {
        self.maps.reserve(family, answer)
    }

    fn release(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String> {
        self.maps.release(family, answer)
    }
}

impl HeldConntrack {
    /// The answer tuples the family's map reserves.
    fn reservations(&self, family: IpFamily) -> BTreeSet<Tuple> {
        let reserved = |value: &CtValue| value.flags & CT_F_NETFILTER != 0;
        match family {
            IpFamily::V4 => self.ct4.as_ref().map_or_else(BTreeSet::new, |map| {
                map.iter()
                    .filter_map(Result::ok)
                    .filter(|(key, value)| key.dir == CT_DIR_REPLY && reserved(value))
                    .map(|(key, _)| answer_of4(&key))
                    .collect()
            }),
            IpFamily::V6 => self.ct6.as_ref().map_or_else(BTreeSet::new, |map| {
                map.iter()
                    .filter_map(Result::ok)
                    .filter(|(key, value)| key.dir == CT_DIR_REPLY && reserved(value))
                    .map(|(key, _)| answer_of6(&key))
                    .collect()
            }),
        }
    }

    fn reserve(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String> {
        let value = reservation_value(answer);
        let written = match family {
            IpFamily::V4 => self
                .ct4
                .as_mut()
                .zip(reservation_key4(answer))
                .map(|(map, key)| map.insert(key, value, 0)),
            IpFamily::V6 => self
                .ct6
                .as_mut()
                .zip(reservation_key6(answer))
                .map(|(map, key)| map.insert(key, value, 0)),
        };
        match written {
            Some(result) => result.map_err(|e| format!("reserving {answer:?}: {e}")),
            None => Err(format!(
                "no {family} conntrack map to reserve {answer:?} in"
            )),
        }
    }

    fn release(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String> {
        let removed = match family {
            IpFamily::V4 => self
                .ct4
                .as_mut()
                .zip(reservation_key4(answer))
                .map(|(map, key)| map.remove(&key)),
            IpFamily::V6 => self
                .ct6
                .as_mut()
                .zip(reservation_key6(answer))
                .map(|(map, key)| map.remove(&key)),
        };
        match removed {
            // Gone meanwhile (evicted, or a stale flow's cleanup) is what was wanted.
            Some(Ok(())) | None => Ok(()),
            Some(Err(e)) if super::maps::is_not_found(&e) => Ok(()),
            Some(Err(e)) => Err(format!("releasing {answer:?}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::proxier::conntrack::Tuple;

    fn entry(orig: (&str, u16, &str, u16), reply: (&str, u16, &str, u16)) -> Entry {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        Entry {
            family: IpFamily::V4,
            orig: Tuple {
                src: ip(orig.0),
                src_port: orig.1,
                dst: ip(orig.2),
                dst_port: orig.3,
                protocol: 6,
            },
            reply: Tuple {
                src: ip(reply.0),
                src_port: reply.1,
                dst: ip(reply.2),
                dst_port: reply.3,
                protocol: 6,
            },
            zone: 0,
        }
    }

    fn ct_value(snat: bool, expires: u32, flags: u8) -> CtValue {
        let v4 = |a: [u8; 4]| {
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&a);
            bytes
        };
        CtValue {
            client_addr: v4([203, 0, 113, 1]),
            frontend_addr: v4([192, 168, 0, 11]),
            backend_addr: v4([10, 2, 0, 10]),
            snat_addr: v4([192, 168, 0, 11]),
            client_port: 40000u16.to_be(),
            frontend_port: 30081u16.to_be(),
            backend_port: 9001u16.to_be(),
            snat_port: 40001u16.to_be(),
            flags: flags | if snat { CT_F_SNAT } else { 0 },
            expires,
            ..CtValue::default()
        }
    }

    #[test]
    fn a_live_forward_entry_becomes_a_dnat_and_masquerade_flow() {
        let flow = flow_of(
            IpFamily::V4,
            proto::TCP,
            CT_DIR_FORWARD,
            &ct_value(true, 1100, 0),
            1000,
        )
        .expect("a live TCP flow");
        assert_eq!(flow.orig.src, "203.0.113.1".parse::<IpAddr>().unwrap());
        assert_eq!((flow.orig.src_port, flow.orig.dst_port), (40000, 30081));
        assert_eq!(flow.orig.dst, "192.168.0.11".parse::<IpAddr>().unwrap());
        assert_eq!(flow.dnat_to, "10.2.0.10:9001".parse().unwrap());
        assert_eq!(flow.snat_to, Some("192.168.0.11:40001".parse().unwrap()));
        assert_eq!(flow.timeout, 100);
        let unmasqueraded = flow_of(
            IpFamily::V4,
            proto::UDP,
            CT_DIR_FORWARD,
            &ct_value(false, 1100, 0),
            1000,
        );
        assert_eq!(unmasqueraded.map(|f| f.snat_to), Some(None));
    }

    #[test]
    fn reply_entries_dead_flows_and_sctp_are_not_handed_over() {
        let live = ct_value(true, 1100, 0);
        assert!(
            flow_of(IpFamily::V4, proto::TCP, 1, &live, 1000).is_none(),
            "reply entry"
        );
        assert!(flow_of(IpFamily::V4, proto::SCTP, CT_DIR_FORWARD, &live, 1000).is_none());
        assert!(
            flow_of(IpFamily::V4, proto::TCP, CT_DIR_FORWARD, &live, 1100).is_none(),
            "expired"
        );
        let closing = ct_value(true, 1100, CT_F_CLOSING);
        assert!(flow_of(IpFamily::V4, proto::TCP, CT_DIR_FORWARD, &closing, 1000).is_none());
    }

    #[test]
    fn dnat_and_masquerade_are_translated_plain_flows_are_not() {
        let dnat = entry(
            ("10.1.0.10", 4000, "172.30.0.10", 81),
            ("10.2.0.10", 9001, "10.1.0.10", 4000),
        );
        let masquerade = entry(
            ("203.0.113.1", 4000, "10.2.0.10", 9001),
            ("10.2.0.10", 9001, "192.168.0.11", 4001),
        );
        let plain = entry(
            ("10.1.0.10", 4000, "10.2.0.10", 9001),
            ("10.2.0.10", 9001, "10.1.0.10", 4000),
        );
        assert!(translated(&dnat));
        assert!(translated(&masquerade));
        assert!(!translated(&plain));
    }

    #[test]
    fn scripts_name_the_family_and_every_nat_hook() {
        let v4 = create_script(IpFamily::V4);
        assert!(v4.starts_with("add table ip kube-proxy-ebpf-handover\ndelete table ip"));
        for hook in ["prerouting", "input", "output", "postrouting"] {
            assert!(
                v4.contains(&format!("type nat hook {hook} ")),
                "{hook} in {v4}"
            );
        }
        // Connection tracking stays on only while a rule reads it.
        assert!(v4.contains("ct state established,related counter"));
        assert!(create_script(IpFamily::V6).contains("table ip6 kube-proxy-ebpf-handover {"));
        assert_eq!(
            delete_script(IpFamily::V6),
            "add table ip6 kube-proxy-ebpf-handover\ndelete table ip6 kube-proxy-ebpf-handover\n"
        );
    }

    /// A conntrack table whose entries the test sets.
    struct Listed(Arc<Mutex<Vec<Entry>>>);

    impl ConntrackTable for Listed {
        fn list(&mut self, family: IpFamily) -> crate::proxier::conntrack::Result<Vec<Entry>> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.family == family)
                .copied()
                .collect())
        }

        fn delete(&mut self, _: &[Entry]) -> crate::proxier::conntrack::Result<usize> {
            Ok(0)
        }
    }

    /// Reservations held in memory, shared with the test.
    #[derive(Default, Clone)]
    struct Reserved(Arc<Mutex<BTreeSet<(IpFamily, Tuple)>>>);

    impl Reservations for Reserved {
        fn list(&mut self, family: IpFamily) -> Result<BTreeSet<Tuple>, String> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|(f, _)| *f == family)
                .map(|(_, t)| *t)
                .collect())
        }

        fn reserve(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String> {
            self.0.lock().unwrap().insert((family, *answer));
            Ok(())
        }

        fn release(&mut self, family: IpFamily, answer: &Tuple) -> Result<(), String> {
            self.0.lock().unwrap().remove(&(family, *answer));
            Ok(())
        }
    }

    struct Recorded(Arc<Mutex<Vec<String>>>);

    impl Nft for Recorded {
        fn run(&mut self, script: &str) -> Result<(), String> {
            self.0.lock().unwrap().push(script.to_string());
            Ok(())
        }

        /// The last script run for the family created it.
        fn table_exists(&mut self, family: IpFamily) -> bool {
            let name = format!("table {} {TABLE} {{", family_keyword(family));
            self.0
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|s| s.contains(&format!(" {} {TABLE}\n", family_keyword(family))))
                .is_some_and(|s| s.contains(&name))
        }
    }

    #[test]
    fn the_table_lives_while_translated_flows_do() {
        let entries = Arc::new(Mutex::new(vec![entry(
            ("10.1.0.10", 4000, "172.30.0.10", 81),
            ("10.2.0.10", 9001, "10.1.0.10", 4000),
        )]));
        let scripts = Arc::new(Mutex::new(Vec::new()));
        let mut handover = NetfilterHandover::new(
            Box::new(Listed(entries.clone())),
            Box::new(Recorded(scripts.clone())),
            Box::new(Reserved::default()),
        );
        handover.begin(&[IpFamily::V4, IpFamily::V6]);
        assert!(handover.active());
        assert_eq!(*scripts.lock().unwrap(), vec![create_script(IpFamily::V4)]);

        handover.maintain();
        assert!(handover.active(), "the flow still lives");
        assert_eq!(scripts.lock().unwrap().len(), 1);

        // Only untranslated flows are left: the table goes, once.
        *entries.lock().unwrap() = vec![entry(
            ("10.1.0.10", 4000, "10.2.0.10", 9001),
            ("10.2.0.10", 9001, "10.1.0.10", 4000),
        )];
        handover.maintain();
        handover.maintain();
        assert!(!handover.active());
        assert_eq!(
            *scripts.lock().unwrap(),
            vec![create_script(IpFamily::V4), delete_script(IpFamily::V4)]
        );
    }

    #[test]
    fn a_node_without_translated_flows_gets_no_table() {
        let scripts = Arc::new(Mutex::new(Vec::new()));
        let mut handover = NetfilterHandover::new(
            Box::new(Listed(Arc::new(Mutex::new(Vec::new())))),
            Box::new(Recorded(scripts.clone())),
            Box::new(Reserved::default()),
        );
        handover.begin(&[IpFamily::V4, IpFamily::V6]);
        assert!(!handover.active());
        assert!(scripts.lock().unwrap().is_empty());
    }

    #[test]
    fn a_table_left_by_an_earlier_agent_goes_once_its_flows_have() {
        let scripts = Arc::new(Mutex::new(vec![create_script(IpFamily::V4)]));
        let mut handover = NetfilterHandover::new(
            Box::new(Listed(Arc::new(Mutex::new(Vec::new())))),
            Box::new(Recorded(scripts.clone())),
            Box::new(Reserved::default()),
        );
        handover.begin(&[IpFamily::V4, IpFamily::V6]);
        assert!(!handover.active());
        assert_eq!(
            scripts.lock().unwrap().last(),
            Some(&delete_script(IpFamily::V4))
        );
        let (removed, errors) = remove_tables(&mut Recorded(scripts.clone()));
        assert_eq!((removed, errors.len()), (0, 0), "nothing is left to remove");
    }

    #[test]
    fn only_masqueraded_answers_of_translated_protocols_are_reserved() {
        let masquerade = entry(
            ("203.0.113.1", 4000, "192.168.0.11", 30081),
            ("10.2.0.10", 9001, "192.168.0.11", 62001),
        );
        assert_eq!(masqueraded_answer(&masquerade), Some(masquerade.reply));
        // Its answers go to the client itself: no port of the node is taken.
        let dnat_only = entry(
            ("10.1.0.10", 4000, "172.30.0.10", 81),
            ("10.2.0.10", 9001, "10.1.0.10", 4000),
        );
        assert_eq!(masqueraded_answer(&dnat_only), None);
        let mut icmp = masquerade;
        icmp.orig.protocol = 1;
        icmp.reply.protocol = 1;
        assert_eq!(masqueraded_answer(&icmp), None);
    }

    #[test]
    fn a_reservation_is_keyed_as_the_programs_key_answers_and_translates_nothing() {
        let answer = entry(
            ("203.0.113.1", 4000, "192.168.0.11", 30081),
            ("10.2.0.10", 9001, "192.168.0.11", 62001),
        )
        .reply;
        let key = reservation_key4(&answer).expect("an IPv4 tuple");
        // As a packet carries them: addresses and ports in network order.
        assert_eq!(key.saddr.to_ne_bytes(), [10, 2, 0, 10]);
        assert_eq!(key.dport, 62001u16.to_be());
        assert_eq!((key.proto, key.dir), (proto::TCP, CT_DIR_REPLY));
        assert_eq!(answer_of4(&key), answer);
        assert!(reservation_key6(&answer).is_none());

        let value = reservation_value(&answer);
        assert_eq!(value.flags, CT_F_NETFILTER, "no SNAT: nothing to rewrite");
        assert_eq!(value.frontend_addr, value.backend_addr);
        assert_eq!(value.frontend_port, value.backend_port);
        // Not a flow to hand back to netfilter should a netfilter mode take over.
        assert!(flow_of(IpFamily::V4, proto::TCP, CT_DIR_REPLY, &value, 1000).is_none());

        let v6 = Tuple {
            src: "fd00::10".parse().unwrap(),
            dst: "fd00::1".parse().unwrap(),
            protocol: proto::UDP,
            src_port: 53,
            dst_port: 61234,
        };
        assert_eq!(answer_of6(&reservation_key6(&v6).unwrap()), v6);
    }

    #[test]
    fn reservations_follow_netfilters_masqueraded_flows_and_end_with_the_table() {
        let first = entry(
            ("203.0.113.1", 4000, "192.168.0.11", 30081),
            ("10.2.0.10", 9001, "192.168.0.11", 62001),
        );
        let second = entry(
            ("203.0.113.1", 4001, "192.168.0.11", 30081),
            ("10.2.0.11", 9001, "192.168.0.11", 62002),
        );
        let entries = Arc::new(Mutex::new(vec![first]));
        let reserved = Reserved::default();
        // One left by an earlier agent for a flow that has ended since.
        let ended = entry(
            ("203.0.113.1", 4002, "192.168.0.11", 30081),
            ("10.2.0.10", 9001, "192.168.0.11", 62003),
        );
        reserved
            .0
            .lock()
            .unwrap()
            .insert((IpFamily::V4, ended.reply));
        let mut handover = NetfilterHandover::new(
            Box::new(Listed(entries.clone())),
            Box::new(Recorded(Arc::new(Mutex::new(Vec::new())))),
            Box::new(reserved.clone()),
        );
        let held = || reserved.0.lock().unwrap().clone();
        handover.begin(&[IpFamily::V4, IpFamily::V6]);
        assert_eq!(held(), BTreeSet::from([(IpFamily::V4, first.reply)]));

        *entries.lock().unwrap() = vec![second];
        handover.maintain();
        assert_eq!(held(), BTreeSet::from([(IpFamily::V4, second.reply)]));

        entries.lock().unwrap().clear();
        handover.maintain();
        assert!(!handover.active());
        assert!(held().is_empty(), "no reservation outlives the handover");
    }
}
