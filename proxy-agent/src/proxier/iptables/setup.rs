// SPDX-License-Identifier: Apache-2.0
//! The kernel settings upstream's iptables proxier looks at when it starts: it sets
//! `route_localnet` for localhost NodePorts, reads `nf_conntrack_tcp_be_liberal` (which
//! makes the INVALID-drop rule unnecessary) and warns when bridged pod traffic would
//! bypass iptables. Each decision is logged.

use super::Error;
use super::rules::context::localhost_nodeports_in_effect;
use crate::model::IpFamily;
use crate::node::Sysctl;
use crate::proxier::NodeContext;

pub const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";
pub const TCP_BE_LIBERAL: &str = "net/netfilter/nf_conntrack_tcp_be_liberal";
pub const BRIDGE_NF_CALL_IPTABLES: &str = "net/bridge/bridge-nf-call-iptables";

/// What the settings mean for the rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostSettings {
    pub conntrack_tcp_be_liberal: bool,
    pub route_localnet_set: bool,
}

/// Applies and reads the settings. Failing to set `route_localnet` while localhost
/// NodePorts are wanted is an error, as upstream's: those NodePorts would silently not
/// work.
pub fn apply(sysctl: &mut dyn Sysctl, node: &NodeContext) -> Result<HostSettings, Error> {
    let mut settings = HostSettings::default();
    if localhost_nodeports_in_effect(node, IpFamily::V4) {
        tracing::info!(
            sysctl = ROUTE_LOCALNET,
            "setting route_localnet=1 to allow NodePorts on localhost; to change this, disable iptables.localhostNodePorts or leave loopback out of nodePortAddresses"
        );
        match sysctl.read(ROUTE_LOCALNET) {
            Ok(value) if value == "1" => {}
            _ => sysctl
                .write(ROUTE_LOCALNET, "1")
                .map_err(|source| Error::Sysctl {
                    name: ROUTE_LOCALNET,
                    source,
                })?,
        }
        settings.route_localnet_set = true;
    }

    if let Ok(value) = sysctl.read(TCP_BE_LIBERAL)
        && value != "0"
    {
        settings.conntrack_tcp_be_liberal = true;
        tracing::info!(
            sysctl = TCP_BE_LIBERAL,
            "nf_conntrack_tcp_be_liberal is set: not installing the DROP rule for INVALID packets"
        );
    }

    // Pods on a Linux bridge reach services only if bridged traffic goes through
    // iptables; plugins usually arrange that, so this is only worth a warning.
    match sysctl.read(BRIDGE_NF_CALL_IPTABLES) {
        Ok(value) if value == "1" => {}
        Ok(value) => tracing::warn!(
            sysctl = BRIDGE_NF_CALL_IPTABLES,
            %value,
            "bridge-nf-call-iptables is not set: traffic from pods on a Linux bridge may bypass the service rules"
        ),
        Err(_) => tracing::warn!(
            sysctl = BRIDGE_NF_CALL_IPTABLES,
            "the br_netfilter module is not loaded: traffic from pods on a Linux bridge may bypass the service rules"
        ),
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io;

    use super::*;

    #[derive(Default)]
    struct FakeSysctl {
        values: HashMap<String, String>,
        read_only: bool,
    }

    impl Sysctl for FakeSysctl {
        fn read(&self, name: &str) -> io::Result<String> {
            self.values
                .get(name)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn write(&mut self, name: &str, value: &str) -> io::Result<()> {
            if self.read_only {
                return Err(io::Error::from(io::ErrorKind::PermissionDenied));
            }
            self.values.insert(name.into(), value.into());
            Ok(())
        }
    }

    #[test]
    fn route_localnet_is_set_only_for_localhost_nodeports() {
        let mut sysctl = FakeSysctl::default();
        let node = NodeContext {
            localhost_nodeports: true,
            ..Default::default()
        };
        let settings = apply(&mut sysctl, &node).unwrap();
        assert!(settings.route_localnet_set);
        assert_eq!(sysctl.values[ROUTE_LOCALNET], "1");

        let mut untouched = FakeSysctl::default();
        let primary_only = NodeContext {
            localhost_nodeports: true,
            nodeport_addresses: Some(vec!["192.168.0.2".parse().unwrap()]),
            ..Default::default()
        };
        assert!(
            !apply(&mut untouched, &primary_only)
                .unwrap()
                .route_localnet_set
        );
        assert!(!untouched.values.contains_key(ROUTE_LOCALNET));

        let mut read_only = FakeSysctl {
            read_only: true,
            ..Default::default()
        };
        assert!(matches!(
            apply(&mut read_only, &node),
            Err(Error::Sysctl {
                name: ROUTE_LOCALNET,
                ..
            })
        ));
    }

    #[test]
    fn tcp_be_liberal_is_read() {
        let mut sysctl = FakeSysctl::default();
        sysctl.values.insert(TCP_BE_LIBERAL.into(), "1".into());
        let settings = apply(&mut sysctl, &NodeContext::default()).unwrap();
        assert!(settings.conntrack_tcp_be_liberal);
        sysctl.values.insert(TCP_BE_LIBERAL.into(), "0".into());
        assert!(
            !apply(&mut sysctl, &NodeContext::default())
                .unwrap()
                .conntrack_tcp_be_liberal
        );
    }
}
