// SPDX-License-Identifier: Apache-2.0
//! The iptables mode's rules that hook its chains into the built-in chains (upstream's,
//! in upstream's order), shared by the full sync (which inserts the missing ones), the
//! flush check and the cleanup. How a jump is written and recognised is
//! [`crate::proxier::netfilter::jumps`].

use crate::proxier::netfilter::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};
use crate::proxier::netfilter::{Jump, Table};

const NEW: &str = "-m conntrack --ctstate NEW";

/// Upstream's jump rules, in upstream's order; each is inserted at the top of its built-in
/// chain, so the last one of a chain ends up first.
pub const JUMPS: &[Jump] = &[
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_EXTERNAL_SERVICES,
        comment: "kubernetes externally-visible service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_EXTERNAL_SERVICES,
        comment: "kubernetes externally-visible service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_NODEPORTS,
        comment: "kubernetes health check service ports",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_FORWARD,
        comment: "kubernetes forwarding rules",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_PROXY_FIREWALL,
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_PROXY_FIREWALL,
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_PROXY_FIREWALL,
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: Table::Nat,
        from: "OUTPUT",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: "",
    },
    Jump {
        table: Table::Nat,
        from: "PREROUTING",
        to: KUBE_SERVICES,
        comment: "kubernetes service portals",
        extra: "",
    },
    Jump {
        table: Table::Nat,
        from: "POSTROUTING",
        to: KUBE_POSTROUTING,
        comment: "kubernetes postrouting rules",
        extra: "",
    },
];

/// The localnet protection chain's hooks (as kubelet installs them: no comment). Only
/// installed while localhost NodePorts are enabled, when the chain has a rule.
pub const LOCALNET_JUMPS: &[Jump] = &[
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_FIREWALL,
        comment: "",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_FIREWALL,
        comment: "",
        extra: "",
    },
];

/// The jumps whose absence shows that someone flushed the rules of a table (the canary
/// chain only shows that chains were deleted).
pub const FLUSH_WITNESSES: &[Jump] = &[JUMPS[10], JUMPS[5]];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_matching() {
        let mut spec = String::new();
        JUMPS[0].write_spec(&mut spec);
        assert_eq!(
            spec,
            "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
        );
        let saved = "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES";
        assert!(JUMPS[0].matches(saved));
        assert!(!JUMPS[1].matches(saved), "other built-in chain");
        assert!(!JUMPS[2].matches(saved), "other target");
        assert!(!JUMPS[0].matches("-A INPUTX -j KUBE-EXTERNAL-SERVICES"));
        assert!(LOCALNET_JUMPS[0].matches("-A INPUT -j KUBE-FIREWALL"));
        assert_eq!(FLUSH_WITNESSES[0].from, "PREROUTING");
        assert_eq!(FLUSH_WITNESSES[1].to, KUBE_FORWARD);
    }
}
