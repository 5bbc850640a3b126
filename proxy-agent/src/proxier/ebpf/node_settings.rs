// SPDX-License-Identifier: Apache-2.0
//! What the programs need to know about the proxy's node-wide settings besides the
//! services: the configuration flags that follow from them (masqueradeAll, whether a
//! local-traffic detector exists) and the CIDRs the detector calls local. The desired
//! state is a pure function of the [`NodeContext`]; [`LocalCidrMaps::sync`] writes the
//! difference through the map interface.
//!
//! Why the programs need them (upstream's rules, which ebpf mode follows):
//! - masqueradeAll masquerades every connection to a ClusterIP, pods' included;
//! - with a detector, traffic to a ClusterIP from a source it does not call local (a client
//!   outside the cluster that reaches a routed service CIDR) is masqueraded, so that
//!   endpoints on other nodes answer through this node;
//! - with a detector, pods short-circuit to the cluster-wide endpoints of external
//!   destinations; without one, externalTrafficPolicy applies to them too.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use proxy_common::{
    LB_CFG_LOCAL_DETECTOR, LB_CFG_LOOPBACK_NODEPORTS_REJECT4, LB_CFG_LOOPBACK_NODEPORTS_REJECT6,
    LB_CFG_MASQUERADE_ALL,
};

use super::maps::{KvMap, Prefix, Result};
use crate::{model::IpFamily, proxier::NodeContext};

/// The ports north-south SNAT gives the flows it masquerades, when the kernel's own
/// ephemeral range leaves them free: 61000-65535, just above Linux's default
/// `ip_local_port_range` (32768-60999).
pub const DEFAULT_SNAT_PORTS: (u16, u16) = (61_000, 65_535);
/// The fewest ports a range apart from the kernel's may have before SNAT shares the
/// kernel's instead.
const MIN_SNAT_PORTS: u32 = 1_024;

/// Where north-south SNAT takes its source ports from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnatPorts {
    pub min: u16,
    pub max: u16,
    /// The kernel may give the same ports to the node's own sockets: a node process talking
    /// to a backend from a port a masqueraded flow holds would have its replies taken for
    /// that flow's.
    pub shared_with_kernel: bool,
}

/// The SNAT port range for a node whose kernel gives its own sockets `ephemeral` (its
/// `ip_local_port_range`, when known). A masqueraded flow and a node socket to the same
/// backend must never hold the same port: the tc programs would take the socket's replies
/// for the flow's (netfilter checks its conntrack, which knows local connections too; the
/// BPF conntrack does not know the node's sockets). So the range lies outside the kernel's:
/// the default when it is free, else the larger free span above or below it (never the
/// privileged ports below 1024), else the default, shared, with a warning.
pub fn snat_ports(ephemeral: Option<(u16, u16)>) -> SnatPorts {
    let default = SnatPorts {
        min: DEFAULT_SNAT_PORTS.0,
        max: DEFAULT_SNAT_PORTS.1,
        shared_with_kernel: false,
    };
    let Some((low, high)) = ephemeral else {
        return default;
    };
    if high < default.min || low > default.max {
        return default;
    }
    let above = (high < u16::MAX).then(|| (high + 1, u16::MAX));
    let below = (low > 1_025).then(|| (1_024, low - 1));
    let size = |(a, b): (u16, u16)| u32::from(b) - u32::from(a) + 1;
    match [above, below]
        .into_iter()
        .flatten()
        .filter(|r| size(*r) >= MIN_SNAT_PORTS)
        .max_by_key(|r| size(*r))
    {
        Some((min, max)) => SnatPorts {
            min,
            max,
            shared_with_kernel: false,
        },
        None => SnatPorts {
            shared_with_kernel: true,
            ..default
        },
    }
}

/// `net.ipv4.ip_local_port_range` as `(low, high)`.
pub fn parse_port_range(text: &str) -> Option<(u16, u16)> {
    let mut words = text.split_whitespace().map(|w| w.parse::<u16>().ok());
    match (words.next()?, words.next()?) {
        (Some(low), Some(high)) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// The `LbConfig::flags` bits that follow from the node's settings.
pub fn config_flags(node: &NodeContext) -> u32 {
    let mut flags = 0;
    if node.masquerade_all {
        flags |= LB_CFG_MASQUERADE_ALL;
    }
    if node.local_detector.is_implemented() {
        flags |= LB_CFG_LOCAL_DETECTOR;
    }
    if node.rejects_loopback_nodeports(IpFamily::V4) {
        flags |= LB_CFG_LOOPBACK_NODEPORTS_REJECT4;
    }
    if node.rejects_loopback_nodeports(IpFamily::V6) {
        flags |= LB_CFG_LOOPBACK_NODEPORTS_REJECT6;
    }
    flags
}

/// The flag bits [`config_flags`] owns (the rest of `flags` belongs to others).
pub const NODE_FLAGS: u32 = LB_CFG_MASQUERADE_ALL
    | LB_CFG_LOCAL_DETECTOR
    | LB_CFG_LOOPBACK_NODEPORTS_REJECT4
    | LB_CFG_LOOPBACK_NODEPORTS_REJECT6;

/// The sources the local-traffic detector calls local, both families (empty for the
/// interface-based detectors: nothing that arrives on an uplink is local then).
pub fn local_cidrs(node: &NodeContext) -> BTreeSet<IpNet> {
    let mut out: BTreeSet<IpNet> = node.local_detector.cidrs(false).into_iter().collect();
    out.extend(node.local_detector.cidrs(true));
    out.into_iter().map(|n| n.trunc()).collect()
}

/// The `LOCAL_CIDRS*` tries.
pub struct LocalCidrMaps {
    pub v4: Box<dyn KvMap<Prefix<[u8; 4]>, u8>>,
    pub v6: Box<dyn KvMap<Prefix<[u8; 16]>, u8>>,
}

impl LocalCidrMaps {
    /// What the tries hold now.
    pub fn read(&self) -> Result<BTreeSet<IpNet>> {
        let mut out = BTreeSet::new();
        for (p, _) in self.v4.entries()? {
            if let Ok(net) = ipnet::Ipv4Net::new(Ipv4Addr::from(p.data), p.len as u8) {
                out.insert(IpNet::V4(net));
            }
        }
        for (p, _) in self.v6.entries()? {
            if let Ok(net) = ipnet::Ipv6Net::new(Ipv6Addr::from(p.data), p.len as u8) {
                out.insert(IpNet::V6(net));
            }
        }
        Ok(out)
    }

    /// Makes the tries hold exactly `desired`: additions first, so that a source never
    /// falls out of the set while it is being replaced by a wider one. Returns the entries
    /// written and deleted.
    pub fn sync(&mut self, desired: &BTreeSet<IpNet>) -> Result<(usize, usize)> {
        let actual = self.read()?;
        let mut written = 0;
        for net in desired.difference(&actual) {
            self.put(net)?;
            written += 1;
        }
        let mut deleted = 0;
        for net in actual.difference(desired) {
            self.delete(net)?;
            deleted += 1;
        }
        Ok((written, deleted))
    }

    fn put(&mut self, net: &IpNet) -> Result<()> {
        match net {
            IpNet::V4(n) => self.v4.put(
                &Prefix {
                    len: u32::from(n.prefix_len()),
                    data: n.network().octets(),
                },
                &1,
            ),
            IpNet::V6(n) => self.v6.put(
                &Prefix {
                    len: u32::from(n.prefix_len()),
                    data: n.network().octets(),
                },
                &1,
            ),
        }
    }

    fn delete(&mut self, net: &IpNet) -> Result<()> {
        match net {
            IpNet::V4(n) => self.v4.delete(&Prefix {
                len: u32::from(n.prefix_len()),
                data: n.network().octets(),
            }),
            IpNet::V6(n) => self.v6.delete(&Prefix {
                len: u32::from(n.prefix_len()),
                data: n.network().octets(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::LocalDetector;
    use crate::proxier::ebpf::maps::{MemMap, OpLog};

    fn ports(min: u16, max: u16, shared: bool) -> SnatPorts {
        SnatPorts {
            min,
            max,
            shared_with_kernel: shared,
        }
    }

    #[test]
    fn snat_ports_stay_out_of_the_kernels_ephemeral_range() {
        // Linux's default leaves 61000-65535 free.
        assert_eq!(
            snat_ports(Some((32_768, 60_999))),
            ports(61_000, 65_535, false)
        );
        assert_eq!(snat_ports(None), ports(61_000, 65_535, false));
        // A range reaching the top: the span below it.
        assert_eq!(
            snat_ports(Some((40_000, 65_535))),
            ports(1_024, 39_999, false)
        );
        // A range overlapping the default from below: what is left above it.
        assert_eq!(
            snat_ports(Some((20_000, 63_000))),
            ports(1_024, 19_999, false)
        );
        assert_eq!(
            snat_ports(Some((3_000, 62_000))),
            ports(62_001, 65_535, false)
        );
        // Everything taken: shared, and said so.
        assert_eq!(
            snat_ports(Some((1_024, 65_535))),
            ports(61_000, 65_535, true)
        );
        assert_eq!(
            snat_ports(Some((1_500, 65_000))),
            ports(61_000, 65_535, true)
        );
    }

    #[test]
    fn the_kernels_port_range_is_read_as_it_prints_it() {
        assert_eq!(parse_port_range("32768\t60999"), Some((32_768, 60_999)));
        assert_eq!(parse_port_range("1024 65535\n"), Some((1_024, 65_535)));
        assert_eq!(parse_port_range("60999 32768"), None);
        assert_eq!(parse_port_range("x y"), None);
    }

    fn node(detector: LocalDetector, masquerade_all: bool) -> NodeContext {
        NodeContext {
            local_detector: detector,
            masquerade_all,
            ..Default::default()
        }
    }

    fn nets(list: &[&str]) -> BTreeSet<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn flags_follow_masquerade_all_and_the_detector() {
        let cidrs = LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(config_flags(&node(LocalDetector::None, false)), 0);
        assert_eq!(
            config_flags(&node(cidrs.clone(), false)),
            LB_CFG_LOCAL_DETECTOR
        );
        assert_eq!(
            config_flags(&node(LocalDetector::None, true)),
            LB_CFG_MASQUERADE_ALL
        );
        assert_eq!(
            config_flags(&node(cidrs, true)),
            LB_CFG_LOCAL_DETECTOR | LB_CFG_MASQUERADE_ALL
        );
        let bridge = LocalDetector::BridgeInterface("cbr0".into());
        assert_eq!(config_flags(&node(bridge, false)), LB_CFG_LOCAL_DETECTOR);
    }

    #[test]
    fn loopback_nodeports_are_refused_per_family_where_the_gate_is_on_and_none_is_listed() {
        let mut n = node(LocalDetector::None, false);
        n.loopback_nodeport_families = vec![IpFamily::V4];
        assert_eq!(config_flags(&n), 0, "the gate is off");
        n.loopback_nodeports_gate = true;
        assert_eq!(config_flags(&n), LB_CFG_LOOPBACK_NODEPORTS_REJECT6);
        n.loopback_nodeport_families.clear();
        assert_eq!(
            config_flags(&n),
            LB_CFG_LOOPBACK_NODEPORTS_REJECT4 | LB_CFG_LOOPBACK_NODEPORTS_REJECT6
        );
    }

    #[test]
    fn local_cidrs_are_the_detectors_of_both_families_and_none_for_interfaces() {
        let dual = LocalDetector::Cidrs(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fd00:10::1/64".parse().unwrap(),
        ]);
        assert_eq!(
            local_cidrs(&node(dual, false)),
            nets(&["10.0.0.0/8", "fd00:10::/64"])
        );
        let prefix = LocalDetector::InterfaceNamePrefix("veth".into());
        assert!(local_cidrs(&node(prefix, false)).is_empty());
        assert!(local_cidrs(&node(LocalDetector::None, false)).is_empty());
    }

    #[test]
    fn sync_writes_the_difference_additions_first() {
        let log = OpLog::default();
        let mut maps = LocalCidrMaps {
            v4: Box::new(MemMap::new("LOCAL_CIDRS4_V1", 8, log.clone())),
            v6: Box::new(MemMap::new("LOCAL_CIDRS6_V1", 8, log.clone())),
        };
        assert_eq!(
            maps.sync(&nets(&["10.0.0.0/16", "fd00:10::/64"])).unwrap(),
            (2, 0)
        );
        assert_eq!(maps.sync(&nets(&["10.0.0.0/8"])).unwrap(), (1, 2));
        assert_eq!(maps.read().unwrap(), nets(&["10.0.0.0/8"]));
        let ops = log.lock().unwrap().clone();
        let first_delete = ops
            .iter()
            .position(|o| matches!(o, crate::proxier::ebpf::maps::Op::Delete { .. }))
            .unwrap();
        assert!(matches!(
            ops[first_delete - 1],
            crate::proxier::ebpf::maps::Op::Put { .. }
        ));
        assert_eq!(maps.sync(&nets(&["10.0.0.0/8"])).unwrap(), (0, 0));
    }
}
