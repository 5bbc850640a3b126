// SPDX-License-Identifier: Apache-2.0
//! Match arguments the iptables and ipvs modes both write: which traffic comes from this
//! node's pods (detectLocalMode) and the masquerade mark.

use std::fmt;

use ipnet::IpNet;

use crate::model::IpFamily;
use crate::node::LocalDetector;

/// How this family tells traffic from local pods from the rest (detectLocalMode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalMatch {
    /// No detector for this family.
    None,
    Source(IpNet),
    /// An interface name, `+`-terminated for a prefix.
    Interface(String),
}

impl LocalMatch {
    pub fn of(detector: &LocalDetector, family: IpFamily) -> Self {
        match detector {
            LocalDetector::None => LocalMatch::None,
            // Like upstream, one CIDR per family: iptables cannot negate a list.
            LocalDetector::Cidrs(_) => detector
                .cidrs(family == IpFamily::V6)
                .first()
                .map_or(LocalMatch::None, |cidr| LocalMatch::Source(*cidr)),
            LocalDetector::BridgeInterface(name) => LocalMatch::Interface(name.clone()),
            LocalDetector::InterfaceNamePrefix(prefix) => {
                LocalMatch::Interface(format!("{prefix}+"))
            }
        }
    }

    pub fn is_implemented(&self) -> bool {
        !matches!(self, LocalMatch::None)
    }

    /// Matches local traffic (" -s 10.0.0.0/8").
    pub fn if_local(&self) -> Matcher<'_> {
        Matcher {
            local: self,
            negate: false,
        }
    }

    /// Matches non-local traffic (" ! -s 10.0.0.0/8").
    pub fn if_not_local(&self) -> Matcher<'_> {
        Matcher {
            local: self,
            negate: true,
        }
    }
}

/// The match arguments of a [`LocalMatch`], with a leading space (empty for none).
pub struct Matcher<'a> {
    local: &'a LocalMatch,
    negate: bool,
}

impl fmt::Display for Matcher<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let not = if self.negate { " !" } else { "" };
        match self.local {
            LocalMatch::None => Ok(()),
            LocalMatch::Source(cidr) => write!(f, "{not} -s {cidr}"),
            LocalMatch::Interface(name) => write!(f, "{not} -i {name}"),
        }
    }
}

/// The mark value of masquerade bit `bit` (bits above 31 are clamped to 31).
pub fn masquerade_mark(bit: u32) -> String {
    format!("{:#x}", 1u32 << bit.min(31))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_matchers() {
        let cidr = LocalMatch::Source("10.0.0.0/8".parse().unwrap());
        assert_eq!(cidr.if_local().to_string(), " -s 10.0.0.0/8");
        assert_eq!(cidr.if_not_local().to_string(), " ! -s 10.0.0.0/8");
        let prefix = LocalMatch::of(
            &LocalDetector::InterfaceNamePrefix("veth".into()),
            IpFamily::V4,
        );
        assert_eq!(prefix.if_not_local().to_string(), " ! -i veth+");
        let bridge = LocalMatch::of(&LocalDetector::BridgeInterface("cbr0".into()), IpFamily::V6);
        assert_eq!(bridge.if_local().to_string(), " -i cbr0");
        let v4_only = LocalDetector::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(LocalMatch::of(&v4_only, IpFamily::V6), LocalMatch::None);
        assert_eq!(LocalMatch::None.if_local().to_string(), "");
    }

    #[test]
    fn masquerade_marks_clamp_the_bit() {
        assert_eq!(masquerade_mark(14), "0x4000");
        assert_eq!(masquerade_mark(40), "0x80000000");
    }
}
