// SPDX-License-Identifier: Apache-2.0
//! Typed views of the string fields, for the rest of the agent.
//!
//! Each accessor parses with the same rules validation uses and returns the same
//! `FieldError` validation would, so on a validated configuration they do not fail.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::duration::Duration;
use super::field::FieldError;
use super::net::{is_ipv4_like, parse_cidr_sloppy};
use super::types::KubeProxyConfiguration;
use crate::model::LoadBalancerAlgorithm;

/// Which dataplane programs the services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    /// Ours, and the default when `mode` is empty.
    Ebpf,
    Iptables,
    Ipvs,
    /// Parsed for compatibility; validation refuses it because the agent does not implement it.
    Nftables,
}

impl ProxyMode {
    /// `""` is the default mode, `ebpf`. `None` for anything else unknown ("kernelspace"
    /// included: it is Windows-only).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "" | "ebpf" => ProxyMode::Ebpf,
            "iptables" => ProxyMode::Iptables,
            "ipvs" => ProxyMode::Ipvs,
            "nftables" => ProxyMode::Nftables,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Ebpf => "ebpf",
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How traffic from local pods is recognised (`detectLocalMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LocalMode {
    ClusterCidr,
    NodeCidr,
    BridgeInterface,
    InterfaceNamePrefix,
}

impl LocalMode {
    /// `""` is the platform default, ClusterCIDR.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "" | "ClusterCIDR" => LocalMode::ClusterCidr,
            "NodeCIDR" => LocalMode::NodeCidr,
            "BridgeInterface" => LocalMode::BridgeInterface,
            "InterfaceNamePrefix" => LocalMode::InterfaceNamePrefix,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LocalMode::ClusterCidr => "ClusterCIDR",
            LocalMode::NodeCidr => "NodeCIDR",
            LocalMode::BridgeInterface => "BridgeInterface",
            LocalMode::InterfaceNamePrefix => "InterfaceNamePrefix",
        }
    }
}

/// How the XDP program is attached, if at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XdpMode {
    Off,
    Generic,
    Native,
}

impl XdpMode {
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "" | "off" => XdpMode::Off,
            "generic" => XdpMode::Generic,
            "native" => XdpMode::Native,
            _ => return None,
        })
    }
}

/// One entry of `nodePortAddresses`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodePortAddress {
    /// The node's primary IPv4 and/or IPv6 address from the Node object.
    Primary,
    /// 127.0.0.0/8 and ::1/128.
    Localhost,
    /// 0.0.0.0/0 and ::/0.
    All,
    Cidr(IpNet),
}

impl NodePortAddress {
    pub fn parse(entry: &str) -> Option<Self> {
        Some(match entry {
            "primary" => NodePortAddress::Primary,
            "localhost" => NodePortAddress::Localhost,
            "all" => NodePortAddress::All,
            cidr => NodePortAddress::Cidr(parse_cidr_sloppy(cidr)?),
        })
    }
}

/// The parsed `nodePortAddresses` list. Empty means "all local IPs" in every mode but
/// nftables (where defaulting has already turned it into `primary`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePortAddresses {
    pub entries: Vec<NodePortAddress>,
}

impl NodePortAddresses {
    pub fn is_unset(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the list includes the node's primary IP(s), which the caller resolves.
    pub fn includes_primary(&self) -> bool {
        self.entries.contains(&NodePortAddress::Primary)
    }

    /// Whether NodePorts are served on every local address.
    pub fn matches_all(&self) -> bool {
        self.entries.is_empty() || self.cidrs().iter().any(|cidr| cidr.prefix_len() == 0)
    }

    /// The CIDR ranges with `localhost` and `all` expanded; `primary` needs the Node object
    /// and is left to the caller (see `includes_primary`).
    pub fn cidrs(&self) -> Vec<IpNet> {
        let mut cidrs = Vec::new();
        for entry in &self.entries {
            match *entry {
                NodePortAddress::Primary => {}
                NodePortAddress::Localhost => {
                    cidrs.push(IpNet::V4(Ipv4Net::new_assert(
                        Ipv4Addr::new(127, 0, 0, 0),
                        8,
                    )));
                    cidrs.push(IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::LOCALHOST, 128)));
                }
                NodePortAddress::All => {
                    cidrs.push(IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::UNSPECIFIED, 0)));
                    cidrs.push(IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::UNSPECIFIED, 0)));
                }
                NodePortAddress::Cidr(cidr) => cidrs.push(cidr),
            }
        }
        cidrs
    }

    /// Whether the list names a loopback range of `v6`'s family itself (`localhost`,
    /// 127.0.0.1/32, ::1/128: a range whose network address is loopback), as upstream's
    /// `ContainsExplicitLoopback`; a catch-all range that merely holds one does not count.
    pub fn lists_loopback_explicitly(&self, v6: bool) -> bool {
        self.cidrs()
            .iter()
            .any(|cidr| cidr.addr().is_ipv6() == v6 && cidr.network().is_loopback())
    }

    /// Whether `ip` is covered by an explicit range (keywords expanded, `primary` excluded).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidrs().iter().any(|cidr| cidr.contains(&ip))
    }
}

/// The resync interval and the minimum gap between syncs, for one proxy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPeriods {
    pub sync: Duration,
    pub min_sync: Duration,
}

pub(crate) const NODE_PORT_KEYWORDS_DETAIL: &str =
    "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'";

impl KubeProxyConfiguration {
    pub fn proxy_mode(&self) -> Result<ProxyMode, FieldError> {
        ProxyMode::parse(&self.mode).ok_or_else(|| invalid_mode(&self.mode))
    }

    pub fn local_mode(&self) -> Result<LocalMode, FieldError> {
        LocalMode::parse(&self.detect_local_mode)
            .ok_or_else(|| unsupported_local_mode(&self.detect_local_mode))
    }

    pub fn xdp_mode(&self) -> Result<XdpMode, FieldError> {
        XdpMode::parse(&self.ebpf.xdp_mode).ok_or_else(|| unsupported_xdp_mode(&self.ebpf.xdp_mode))
    }

    /// `ebpf.loadBalancerAlgorithm` (blank: random).
    pub fn load_balancer_algorithm(&self) -> Result<LoadBalancerAlgorithm, FieldError> {
        let name = &self.ebpf.load_balancer_algorithm;
        if name.is_empty() {
            return Ok(LoadBalancerAlgorithm::default());
        }
        LoadBalancerAlgorithm::parse(name).ok_or_else(|| unsupported_lb_algorithm(name))
    }

    /// `clusterCIDR` split into one CIDR or a dual-stack pair; empty when unset.
    pub fn cluster_cidrs(&self) -> Result<Vec<IpNet>, FieldError> {
        match cluster_cidr_errors(&self.cluster_cidr).into_iter().next() {
            Some(error) => Err(error),
            None if self.cluster_cidr.is_empty() => Ok(Vec::new()),
            None => Ok(self
                .cluster_cidr
                .split(',')
                .filter_map(parse_cidr_sloppy)
                .collect()),
        }
    }

    pub fn node_port_addresses(&self) -> Result<NodePortAddresses, FieldError> {
        let mut entries = Vec::with_capacity(self.node_port_addresses.len());
        for (index, entry) in self.node_port_addresses.iter().enumerate() {
            let parsed = NodePortAddress::parse(entry).ok_or_else(|| {
                FieldError::invalid(
                    format!("nodePortAddresses[{index}]"),
                    entry,
                    NODE_PORT_KEYWORDS_DETAIL,
                )
            })?;
            entries.push(parsed);
        }
        Ok(NodePortAddresses { entries })
    }

    pub fn ipvs_exclude_cidrs(&self) -> Result<Vec<IpNet>, FieldError> {
        self.ipvs
            .exclude_cidrs
            .iter()
            .enumerate()
            .map(|(index, cidr)| {
                parse_cidr_sloppy(cidr).ok_or_else(|| {
                    FieldError::invalid(
                        format!("ipvs.excludeCIDRs[{index}]"),
                        cidr,
                        "must be a valid CIDR",
                    )
                })
            })
            .collect()
    }

    /// The sync periods `mode` runs with. Upstream keeps one pair internally and fills it
    /// from the section of the selected mode: `ipvs.*` for ipvs, `nftables.*` for nftables
    /// and `iptables.*` for every other mode. eBPF falls in "every other mode", so it runs
    /// with `iptables.syncPeriod` / `iptables.minSyncPeriod` (30s / 1s by default), which is
    /// also what a kube-proxy configuration without a mode would have used.
    pub fn effective_sync_periods(&self, mode: ProxyMode) -> SyncPeriods {
        match mode {
            ProxyMode::Ipvs => SyncPeriods {
                sync: self.ipvs.sync_period,
                min_sync: self.ipvs.min_sync_period,
            },
            ProxyMode::Nftables => SyncPeriods {
                sync: self.nftables.sync_period,
                min_sync: self.nftables.min_sync_period,
            },
            ProxyMode::Ebpf | ProxyMode::Iptables => SyncPeriods {
                sync: self.iptables.sync_period,
                min_sync: self.iptables.min_sync_period,
            },
        }
    }

    /// Upstream's conversion reads masqueradeAll from `nftables` in nftables mode and from
    /// `iptables` otherwise.
    pub fn masquerade_all(&self, mode: ProxyMode) -> bool {
        match mode {
            ProxyMode::Nftables => self.nftables.masquerade_all,
            _ => self.iptables.masquerade_all,
        }
    }

    /// The fwmark bit for masquerading: upstream reads `nftables.masqueradeBit` in
    /// nftables mode and `iptables.masqueradeBit` otherwise (default 14; validation keeps
    /// it within 0..=31).
    pub fn masquerade_bit(&self, mode: ProxyMode) -> u32 {
        let bit = match mode {
            ProxyMode::Nftables => self.nftables.masquerade_bit,
            _ => self.iptables.masquerade_bit,
        };
        bit.and_then(|b| u32::try_from(b).ok())
            .filter(|b| *b <= 31)
            .unwrap_or(14)
    }

    /// The section name whose sync periods `mode` uses, for field paths.
    pub(crate) fn sync_section(mode: &str) -> &'static str {
        match mode {
            "ipvs" => "ipvs",
            "nftables" => "nftables",
            _ => "iptables",
        }
    }
}

// The errors of the accessors above, which validation reports too (one wording for both).

const LOCAL_MODES: &[&str] = &[
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
    "",
];

const XDP_MODES: &[&str] = &["off", "generic", "native"];

const DUAL_STACK_DETAIL: &str = "must be either a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)";

pub(crate) fn invalid_mode(mode: &str) -> FieldError {
    FieldError::invalid(
        "mode",
        mode,
        "must be ebpf, iptables, ipvs, nftables or blank (blank means the best-available proxy [currently ebpf])",
    )
}

pub(crate) fn unsupported_local_mode(mode: &str) -> FieldError {
    FieldError::not_supported("detectLocalMode", mode, LOCAL_MODES)
}

pub(crate) fn unsupported_xdp_mode(mode: &str) -> FieldError {
    FieldError::not_supported("ebpf.xdpMode", mode, XDP_MODES)
}

pub(crate) fn unsupported_lb_algorithm(name: &str) -> FieldError {
    FieldError::not_supported(
        "ebpf.loadBalancerAlgorithm",
        name,
        LoadBalancerAlgorithm::NAMES,
    )
}

/// The clusterCIDR checks upstream applies in ClusterCIDR mode: one CIDR or a pair of
/// different families, each a valid CIDR.
pub(crate) fn cluster_cidr_errors(cluster_cidr: &str) -> Vec<FieldError> {
    if cluster_cidr.is_empty() {
        return Vec::new();
    }
    let parts: Vec<&str> = cluster_cidr.split(',').collect();
    if parts.len() > 2 {
        return vec![FieldError::invalid(
            "clusterCIDR",
            cluster_cidr,
            DUAL_STACK_DETAIL,
        )];
    }
    let mut errors = Vec::new();
    let mut parsed = Vec::new();
    for part in &parts {
        match parse_cidr_sloppy(part) {
            Some(cidr) => parsed.push(cidr),
            None => errors.push(FieldError::invalid(
                "clusterCIDR",
                *part,
                "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            )),
        }
    }
    if let [first, second] = parsed.as_slice()
        && is_ipv4_like(first.network()) == is_ipv4_like(second.network())
    {
        errors.push(FieldError::invalid(
            "clusterCIDR",
            cluster_cidr,
            DUAL_STACK_DETAIL,
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults::default_config;

    #[test]
    fn modes_parse() {
        assert_eq!(ProxyMode::parse(""), Some(ProxyMode::Ebpf));
        assert_eq!(ProxyMode::parse("ebpf"), Some(ProxyMode::Ebpf));
        assert_eq!(ProxyMode::parse("iptables"), Some(ProxyMode::Iptables));
        assert_eq!(ProxyMode::parse("ipvs"), Some(ProxyMode::Ipvs));
        assert_eq!(ProxyMode::parse("nftables"), Some(ProxyMode::Nftables));
        assert_eq!(ProxyMode::parse("kernelspace"), None);
        assert_eq!(ProxyMode::parse("IPVS"), None);
        assert_eq!(LocalMode::parse("NodeCIDR"), Some(LocalMode::NodeCidr));
        assert_eq!(LocalMode::parse("nodecidr"), None);
        assert_eq!(XdpMode::parse("native"), Some(XdpMode::Native));
        assert_eq!(XdpMode::parse("offload"), None);
    }

    #[test]
    fn node_port_addresses_expand_keywords() {
        let mut config = default_config();
        config.node_port_addresses = vec![
            "primary".into(),
            "localhost".into(),
            "192.168.0.0/16".into(),
        ];
        let addresses = config.node_port_addresses().unwrap();
        assert!(addresses.includes_primary());
        assert!(!addresses.matches_all());
        assert_eq!(
            addresses.cidrs(),
            vec![
                "127.0.0.0/8".parse().unwrap(),
                "::1/128".parse().unwrap(),
                "192.168.0.0/16".parse().unwrap()
            ]
        );
        assert!(addresses.contains("127.0.0.1".parse().unwrap()));
        assert!(addresses.contains("192.168.3.4".parse().unwrap()));
        assert!(!addresses.contains("10.0.0.1".parse().unwrap()));

        config.node_port_addresses = vec!["all".into()];
        assert!(config.node_port_addresses().unwrap().matches_all());
        config.node_port_addresses = vec!["0.0.0.0/0".into()];
        assert!(config.node_port_addresses().unwrap().matches_all());
        config.node_port_addresses.clear();
        assert!(config.node_port_addresses().unwrap().matches_all());
        assert!(config.node_port_addresses().unwrap().is_unset());

        config.node_port_addresses = vec!["10.0.0.0/8".into(), "Localhost".into()];
        assert_eq!(
            config.node_port_addresses().unwrap_err().to_string(),
            r#"nodePortAddresses[1]: Invalid value: "Localhost": must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"#
        );
    }

    #[test]
    fn cluster_cidrs_split_the_dual_stack_pair() {
        let mut config = default_config();
        assert_eq!(config.cluster_cidrs().unwrap(), Vec::<IpNet>::new());
        config.cluster_cidr = "10.244.0.0/16,fd00:10:244::/56".into();
        assert_eq!(
            config.cluster_cidrs().unwrap(),
            vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:10:244::/56".parse::<IpNet>().unwrap()
            ]
        );
        config.cluster_cidr = "10.244.0.0/16,10.245.0.0/16".into();
        assert!(config.cluster_cidrs().is_err());
    }

    #[test]
    fn sync_periods_follow_the_mode_section() {
        let mut config = default_config();
        config.iptables.sync_period = Duration::from_secs(31);
        config.iptables.min_sync_period = Duration::from_secs(2);
        config.ipvs.sync_period = Duration::from_secs(32);
        config.ipvs.min_sync_period = Duration::from_secs(3);
        config.nftables.sync_period = Duration::from_secs(33);
        config.nftables.min_sync_period = Duration::from_secs(4);
        let periods = |mode| config.effective_sync_periods(mode);
        assert_eq!(
            periods(ProxyMode::Ebpf),
            SyncPeriods {
                sync: Duration::from_secs(31),
                min_sync: Duration::from_secs(2)
            }
        );
        assert_eq!(periods(ProxyMode::Iptables), periods(ProxyMode::Ebpf));
        assert_eq!(
            periods(ProxyMode::Ipvs),
            SyncPeriods {
                sync: Duration::from_secs(32),
                min_sync: Duration::from_secs(3)
            }
        );
        assert_eq!(
            periods(ProxyMode::Nftables),
            SyncPeriods {
                sync: Duration::from_secs(33),
                min_sync: Duration::from_secs(4)
            }
        );
    }

    #[test]
    fn masquerade_all_follows_the_mode_section() {
        let mut config = default_config();
        config.nftables.masquerade_all = true;
        assert!(config.masquerade_all(ProxyMode::Nftables));
        assert!(!config.masquerade_all(ProxyMode::Ebpf));
        config.iptables.masquerade_all = true;
        assert!(config.masquerade_all(ProxyMode::Ipvs));
    }

    #[test]
    fn masquerade_bit_comes_from_the_section_of_the_mode() {
        let mut config = default_config();
        assert_eq!(config.masquerade_bit(ProxyMode::Nftables), 14);
        config.nftables.masquerade_bit = Some(20);
        config.iptables.masquerade_bit = Some(5);
        assert_eq!(config.masquerade_bit(ProxyMode::Nftables), 20);
        assert_eq!(config.masquerade_bit(ProxyMode::Iptables), 5);
        assert_eq!(config.masquerade_bit(ProxyMode::Ebpf), 5);
    }

    /// Upstream's Test_useLocalhostNodePortProxy, row by row: (family is IPv6, list, served).
    #[test]
    fn loopback_ranges_count_only_when_listed_themselves() {
        let rows: &[(bool, &[&str], bool)] = &[
            (false, &["127.0.0.0/8"], true),
            (true, &["::1/128"], true),
            (false, &["::1/128"], false),
            (true, &["127.0.0.0/8"], false),
            (false, &["0.0.0.0/0"], false),
            (true, &["::/0"], false),
            (false, &["127.0.0.0/8", "0.0.0.0/0"], true),
            (false, &["0.0.0.0/0", "127.0.0.0/8"], true),
            (false, &["192.168.1.1/32"], false),
            (false, &[], false),
            // Ours: the keywords expand first.
            (false, &["localhost"], true),
            (true, &["localhost"], true),
            (false, &["all"], false),
            (false, &["primary"], false),
        ];
        for (v6, list, served) in rows {
            let addresses = NodePortAddresses {
                entries: list
                    .iter()
                    .map(|e| NodePortAddress::parse(e).unwrap())
                    .collect(),
            };
            assert_eq!(
                addresses.lists_loopback_explicitly(*v6),
                *served,
                "{list:?}, IPv6: {v6}"
            );
        }
    }
}
