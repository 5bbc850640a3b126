// SPDX-License-Identifier: Apache-2.0
//! The kernel settings the ipvs mode needs, as upstream sets them when it starts (the
//! `net/ipv4/vs/*` ones exist once ip_vs is loaded, and are per network namespace):
//! - `vs/conntrack=1`: IPVS keeps conntrack entries, which the masquerade rules need;
//! - `vs/expire_nodest_conn=1`, `vs/expire_quiescent_template=1`: connections to a
//!   deleted (or weight-0, for persistence templates) real server end on their next
//!   packet rather than hanging;
//! - `ip_forward=1`; IPv6 forwarding is the network plugin's business (turning it on
//!   makes the host ignore router advertisements), so it is only checked and logged;
//! - strictARP: `arp_ignore=1`, `arp_announce=2`, so the node does not answer ARP for
//!   the addresses on kube-ipvs0 (needed behind L2 load balancers).

use super::Error;
use crate::node::Sysctl;

pub const VS_CONNTRACK: &str = "net/ipv4/vs/conntrack";
pub const VS_EXPIRE_NODEST_CONN: &str = "net/ipv4/vs/expire_nodest_conn";
pub const VS_EXPIRE_QUIESCENT_TEMPLATE: &str = "net/ipv4/vs/expire_quiescent_template";
pub const IP_FORWARD: &str = "net/ipv4/ip_forward";
pub const IPV6_FORWARDING: &str = "net/ipv6/conf/all/forwarding";
pub const ARP_IGNORE: &str = "net/ipv4/conf/all/arp_ignore";
pub const ARP_ANNOUNCE: &str = "net/ipv4/conf/all/arp_announce";

fn ensure(sysctl: &mut dyn Sysctl, name: &'static str, value: &str) -> Result<(), Error> {
    match sysctl.read(name) {
        Ok(current) if current == value => Ok(()),
        _ => {
            tracing::info!(sysctl = name, value, "setting sysctl for ipvs mode");
            sysctl
                .write(name, value)
                .map_err(|source| Error::Sysctl { name, source })
        }
    }
}

/// Applies the settings.
pub fn apply(sysctl: &mut dyn Sysctl, strict_arp: bool) -> Result<(), Error> {
    ensure(sysctl, VS_CONNTRACK, "1")?;
    ensure(sysctl, VS_EXPIRE_NODEST_CONN, "1")?;
    ensure(sysctl, VS_EXPIRE_QUIESCENT_TEMPLATE, "1")?;
    ensure(sysctl, IP_FORWARD, "1")?;
    if let Ok(value) = sysctl.read(IPV6_FORWARDING)
        && value == "0"
    {
        tracing::warn!(
            sysctl = IPV6_FORWARDING,
            "IPv6 forwarding is off: IPv6 services are not reachable from other hosts"
        );
    }
    if strict_arp {
        ensure(sysctl, ARP_IGNORE, "1")?;
        ensure(sysctl, ARP_ANNOUNCE, "2")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io;

    use super::*;

    #[derive(Default)]
    struct FakeSysctl(HashMap<String, String>);

    impl Sysctl for FakeSysctl {
        fn read(&self, name: &str) -> io::Result<String> {
            self.0
                .get(name)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn write(&mut self, name: &str, value: &str) -> io::Result<()> {
            self.0.insert(name.into(), value.into());
            Ok(())
        }
    }

    #[test]
    fn settings_and_strict_arp_only_when_configured() {
        let mut sysctl = FakeSysctl::default();
        apply(&mut sysctl, false).unwrap();
        assert_eq!(sysctl.0[VS_CONNTRACK], "1");
        assert_eq!(sysctl.0[VS_EXPIRE_NODEST_CONN], "1");
        assert!(!sysctl.0.contains_key(ARP_IGNORE));
        sysctl.0.insert(IPV6_FORWARDING.into(), "0".into());
        apply(&mut sysctl, true).unwrap();
        assert_eq!(sysctl.0[ARP_IGNORE], "1");
        assert_eq!(sysctl.0[ARP_ANNOUNCE], "2");
        assert_eq!(sysctl.0[IPV6_FORWARDING], "0", "left to the network plugin");
    }
}
