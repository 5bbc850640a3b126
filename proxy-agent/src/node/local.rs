// SPDX-License-Identifier: Apache-2.0
//! The local-traffic detector (detectLocalMode): how the dataplanes tell traffic from this
//! node's pods from everything else.

use ipnet::IpNet;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalDetector {
    /// No detector (clusterCIDR empty in ClusterCIDR mode): nothing counts as local.
    #[default]
    None,
    /// Source address inside these CIDRs (clusterCIDR or the Node's podCIDRs).
    Cidrs(Vec<IpNet>),
    /// Arriving from this bridge interface.
    BridgeInterface(String),
    /// Arriving from any interface whose name starts with this prefix.
    InterfaceNamePrefix(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LocalDetectorError {
    #[error("detectLocalMode NodeCIDR needs the Node's podCIDRs, and the Node has none")]
    NoPodCidrs,
    #[error("detectLocalMode {0} needs detectLocal.{1}")]
    Missing(&'static str, &'static str),
}

/// Inputs as the configuration gives them.
#[derive(Clone, Copy, Debug)]
pub enum Mode<'a> {
    ClusterCidr(&'a [IpNet]),
    NodeCidr(&'a [IpNet]),
    BridgeInterface(&'a str),
    InterfaceNamePrefix(&'a str),
}

impl LocalDetector {
    pub fn new(mode: Mode<'_>) -> Result<Self, LocalDetectorError> {
        Ok(match mode {
            Mode::ClusterCidr([]) => Self::None,
            Mode::ClusterCidr(cidrs) => Self::Cidrs(cidrs.to_vec()),
            Mode::NodeCidr([]) => return Err(LocalDetectorError::NoPodCidrs),
            Mode::NodeCidr(cidrs) => Self::Cidrs(cidrs.to_vec()),
            Mode::BridgeInterface("") => {
                return Err(LocalDetectorError::Missing(
                    "BridgeInterface",
                    "bridgeInterface",
                ));
            }
            Mode::BridgeInterface(name) => Self::BridgeInterface(name.to_string()),
            Mode::InterfaceNamePrefix("") => {
                return Err(LocalDetectorError::Missing(
                    "InterfaceNamePrefix",
                    "interfaceNamePrefix",
                ));
            }
            Mode::InterfaceNamePrefix(p) => Self::InterfaceNamePrefix(p.to_string()),
        })
    }

    pub fn is_implemented(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// The CIDRs of one family (for CIDR-based detectors).
    pub fn cidrs(&self, v6: bool) -> Vec<IpNet> {
        match self {
            Self::Cidrs(c) => c
                .iter()
                .filter(|n| matches!(n, IpNet::V6(_)) == v6)
                .copied()
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn modes() {
        let cluster = nets(&["10.0.0.0/8", "fd00::/48"]);
        let d = LocalDetector::new(Mode::ClusterCidr(&cluster)).unwrap();
        assert_eq!(d.cidrs(false), nets(&["10.0.0.0/8"]));
        assert_eq!(d.cidrs(true), nets(&["fd00::/48"]));
        assert_eq!(
            LocalDetector::new(Mode::ClusterCidr(&[])),
            Ok(LocalDetector::None)
        );
        assert_eq!(
            LocalDetector::new(Mode::NodeCidr(&[])),
            Err(LocalDetectorError::NoPodCidrs)
        );
        assert_eq!(
            LocalDetector::new(Mode::BridgeInterface("cbr0")),
            Ok(LocalDetector::BridgeInterface("cbr0".into()))
        );
        assert!(LocalDetector::new(Mode::InterfaceNamePrefix("")).is_err());
        assert!(!LocalDetector::None.is_implemented());
    }
}
