// SPDX-License-Identifier: Apache-2.0
//! The iptables rules of the ipvs mode (pure): upstream's chains, matching the ipsets
//! rather than listing services, so their number stays small whatever the cluster's
//! size. Every sync rewrites all of them (each chain is flushed by its declaration).
//!
//! - nat: KUBE-SERVICES marks traffic that needs masquerading (off-cluster clients of
//!   ClusterIPs, external IPs, LB IPs, NodePorts; hairpin via KUBE-LOOP-BACK in
//!   KUBE-POSTROUTING) and accepts traffic for the virtual servers;
//! - filter: KUBE-PROXY-FIREWALL / KUBE-SOURCE-RANGES-FIREWALL enforce
//!   loadBalancerSourceRanges, KUBE-IPVS-FILTER refuses connections to ports of service
//!   addresses that are no service (the addresses are local on kube-ipvs0) and drops
//!   traffic a Local policy without local endpoints must not carry, KUBE-IPVS-OUT-FILTER
//!   keeps the node from LB IPs whose source ranges exclude it, KUBE-FORWARD accepts
//!   marked and established traffic, KUBE-NODE-PORT admits health-check node ports.

use std::fmt::Write;

use super::desired::{DropRule, DropTarget, FamilyDesired};
use super::sets::SetKind;
use crate::model::IpFamily;
use crate::proxier::netfilter::matches::LocalMatch;
use crate::proxier::netfilter::names::{
    KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_POSTROUTING, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
    protocol_lower,
};
use crate::proxier::netfilter::{Jump, Table};

pub const KUBE_NODE_PORT: &str = "KUBE-NODE-PORT";
pub const KUBE_LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
pub const KUBE_SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
pub const KUBE_IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
pub const KUBE_IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";

pub const NAT_CHAINS: [&str; 5] = [
    KUBE_SERVICES,
    KUBE_POSTROUTING,
    KUBE_NODE_PORT,
    KUBE_LOAD_BALANCER,
    KUBE_MARK_MASQ,
];
pub const FILTER_CHAINS: [&str; 6] = [
    KUBE_FORWARD,
    KUBE_NODE_PORT,
    KUBE_PROXY_FIREWALL,
    KUBE_SOURCE_RANGES_FIREWALL,
    KUBE_IPVS_FILTER,
    KUBE_IPVS_OUT_FILTER,
];

/// Chains only this mode has (their presence shows that ipvs mode ran).
pub fn ipvs_only_chain(table: Table, chain: &str) -> bool {
    match table {
        Table::Nat => [KUBE_NODE_PORT, KUBE_LOAD_BALANCER].contains(&chain),
        Table::Filter => [
            KUBE_NODE_PORT,
            KUBE_SOURCE_RANGES_FIREWALL,
            KUBE_IPVS_FILTER,
            KUBE_IPVS_OUT_FILTER,
        ]
        .contains(&chain),
        Table::Mangle => false,
    }
}

/// Every chain this mode writes.
pub fn ipvs_chain(table: Table, chain: &str) -> bool {
    match table {
        Table::Nat => NAT_CHAINS.contains(&chain),
        Table::Filter => FILTER_CHAINS.contains(&chain),
        Table::Mangle => false,
    }
}

const PORTALS: &str = "kubernetes service portals";
const IPVS_FILTER: &str = "kubernetes ipvs access filter";
const FIREWALL: &str = "kube-proxy firewall rules";

/// Upstream's jumps from the built-in chains.
pub const JUMPS: &[Jump] = &[
    Jump {
        table: Table::Nat,
        from: "OUTPUT",
        to: KUBE_SERVICES,
        comment: PORTALS,
        extra: "",
    },
    Jump {
        table: Table::Nat,
        from: "PREROUTING",
        to: KUBE_SERVICES,
        comment: PORTALS,
        extra: "",
    },
    Jump {
        table: Table::Nat,
        from: "POSTROUTING",
        to: KUBE_POSTROUTING,
        comment: "kubernetes postrouting rules",
        extra: "",
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
        to: KUBE_NODE_PORT,
        comment: "kubernetes health check rules",
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_PROXY_FIREWALL,
        comment: FIREWALL,
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "FORWARD",
        to: KUBE_PROXY_FIREWALL,
        comment: FIREWALL,
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "INPUT",
        to: KUBE_IPVS_FILTER,
        comment: IPVS_FILTER,
        extra: "",
    },
    Jump {
        table: Table::Filter,
        from: "OUTPUT",
        to: KUBE_IPVS_OUT_FILTER,
        comment: IPVS_FILTER,
        extra: "",
    },
];

/// What the rules depend on besides the desired state.
#[derive(Clone, Debug)]
pub struct RuleContext {
    pub family: IpFamily,
    /// The masquerade mark ("0x4000").
    pub mark: String,
    pub local: LocalMatch,
    pub masquerade_all: bool,
    pub random_fully: bool,
}

macro_rules! line {
    ($buf:expr, $($arg:tt)*) => {{
        let _ = writeln!($buf, $($arg)*);
    }};
}

/// The rules of one family as `iptables-restore --noflush` input (filter, then nat).
/// `extra_filter` / `extra_nat` are prepended rule lines (the missing jumps).
pub fn generate(desired: &FamilyDesired, ctx: &RuleContext) -> (String, String) {
    let mut nat = String::with_capacity(4096);
    let mut filter = String::with_capacity(4096);
    for chain in NAT_CHAINS {
        line!(nat, ":{chain} - [0:0]");
    }
    for chain in FILTER_CHAINS {
        line!(filter, ":{chain} - [0:0]");
    }
    let name = |kind: SetKind| kind.name(ctx.family);
    let has = |kind: SetKind| desired.sets.get(&kind).is_some_and(|s| !s.is_empty());
    let mark = &ctx.mark;

    // Connections from the node to itself need no service handling.
    let loopback = match ctx.family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    line!(nat, "-A {KUBE_SERVICES} -s {loopback} -j RETURN");

    // The sets that route traffic into chains, in upstream's order.
    let set_rules: [(SetKind, Table, &str, &str, &str); 12] = [
        (
            SetKind::LoopBack,
            Table::Nat,
            KUBE_POSTROUTING,
            "MASQUERADE",
            "",
        ),
        (
            SetKind::LoadBalancer,
            Table::Nat,
            KUBE_SERVICES,
            KUBE_LOAD_BALANCER,
            "",
        ),
        (
            SetKind::LoadBalancerLocal,
            Table::Nat,
            KUBE_LOAD_BALANCER,
            "RETURN",
            "",
        ),
        (
            SetKind::NodePortLocalTcp,
            Table::Nat,
            KUBE_NODE_PORT,
            "RETURN",
            "tcp",
        ),
        (
            SetKind::NodePortTcp,
            Table::Nat,
            KUBE_NODE_PORT,
            KUBE_MARK_MASQ,
            "tcp",
        ),
        (
            SetKind::NodePortLocalUdp,
            Table::Nat,
            KUBE_NODE_PORT,
            "RETURN",
            "udp",
        ),
        (
            SetKind::NodePortUdp,
            Table::Nat,
            KUBE_NODE_PORT,
            KUBE_MARK_MASQ,
            "udp",
        ),
        (
            SetKind::NodePortLocalSctp,
            Table::Nat,
            KUBE_NODE_PORT,
            "RETURN",
            "sctp",
        ),
        (
            SetKind::NodePortSctp,
            Table::Nat,
            KUBE_NODE_PORT,
            KUBE_MARK_MASQ,
            "sctp",
        ),
        (
            SetKind::LoadBalancerFw,
            Table::Filter,
            KUBE_PROXY_FIREWALL,
            KUBE_SOURCE_RANGES_FIREWALL,
            "",
        ),
        (
            SetKind::LoadBalancerSourceCidr,
            Table::Filter,
            KUBE_SOURCE_RANGES_FIREWALL,
            "RETURN",
            "",
        ),
        (
            SetKind::LoadBalancerSourceIp,
            Table::Filter,
            KUBE_SOURCE_RANGES_FIREWALL,
            "RETURN",
            "",
        ),
    ];
    for (kind, table, chain, target, protocol) in set_rules {
        if !has(kind) {
            continue;
        }
        let out = if table == Table::Nat {
            &mut nat
        } else {
            &mut filter
        };
        let _ = write!(out, "-A {chain}");
        if !protocol.is_empty() {
            let _ = write!(out, " -p {protocol}");
        }
        line!(
            out,
            " -m comment --comment \"{}\" -m set --match-set {} {} -j {target}",
            kind.comment(),
            name(kind),
            kind.match_flags()
        );
    }

    if has(SetKind::ClusterIp) {
        let prefix = format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{}\" -m set --match-set {}",
            SetKind::ClusterIp.comment(),
            name(SetKind::ClusterIp)
        );
        if ctx.masquerade_all {
            line!(nat, "{prefix} dst,dst -j {KUBE_MARK_MASQ}");
        } else if ctx.local.is_implemented() {
            // Off-cluster clients of a ClusterIP (a static route to the service range
            // via this node) may be sent to another node: masquerade them.
            line!(
                nat,
                "{prefix} dst,dst{} -j {KUBE_MARK_MASQ}",
                ctx.local.if_not_local()
            );
        } else {
            // The node reaching a VIP picks the VIP itself as source (it is local on
            // kube-ipvs0); the reply could not come back without masquerading.
            line!(nat, "{prefix} src,dst -j {KUBE_MARK_MASQ}");
        }
    }
    for (kind, masquerade) in [
        (SetKind::ExternalIp, true),
        (SetKind::ExternalIpLocal, false),
    ] {
        if !has(kind) {
            continue;
        }
        let prefix = format!(
            "-A {KUBE_SERVICES} -m comment --comment \"{}\" -m set --match-set {} dst,dst",
            kind.comment(),
            name(kind)
        );
        if masquerade {
            line!(nat, "{prefix} -j {KUBE_MARK_MASQ}");
        }
        // Traffic from off the node (not bridged from a pod, not local) and traffic to
        // external IPs that are local addresses is accepted for IPVS.
        line!(
            nat,
            "{prefix} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        );
        line!(nat, "{prefix} -m addrtype --dst-type LOCAL -j ACCEPT");
    }
    line!(
        nat,
        "-A {KUBE_SERVICES} -m addrtype --dst-type LOCAL -j {KUBE_NODE_PORT}"
    );
    line!(nat, "-A {KUBE_LOAD_BALANCER} -j {KUBE_MARK_MASQ}");
    line!(filter, "-A {KUBE_SOURCE_RANGES_FIREWALL} -j DROP");
    for key in &desired.lb_no_node_access {
        let p = protocol_lower(key.protocol);
        line!(
            filter,
            "-A {KUBE_IPVS_OUT_FILTER} -s {ip} -m ipvs --vaddr {ip} --vproto {p} --vport {port} -j DROP",
            ip = key.addr,
            port = key.port
        );
    }
    // Accept traffic for the virtual servers whatever later rules say; these must stay
    // the last rules of KUBE-SERVICES.
    for kind in [SetKind::ClusterIp, SetKind::LoadBalancer] {
        if has(kind) {
            line!(
                nat,
                "-A {KUBE_SERVICES} -m set --match-set {} {} -j ACCEPT",
                name(kind),
                kind.match_flags()
            );
        }
    }

    line!(
        filter,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    );
    line!(
        filter,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    let hc = SetKind::HealthCheckNodePort;
    line!(
        filter,
        "-A {KUBE_NODE_PORT} -m comment --comment \"{}\" -m set --match-set {} dst -j ACCEPT",
        hc.comment(),
        name(hc)
    );

    for drop in &desired.drops {
        write_drop(&mut filter, drop, ctx);
    }
    for kind in [
        SetKind::LoadBalancer,
        SetKind::ClusterIp,
        SetKind::ExternalIp,
        SetKind::ExternalIpLocal,
        SetKind::HealthCheckNodePort,
    ] {
        line!(
            filter,
            "-A {KUBE_IPVS_FILTER} -m set --match-set {} {} -j RETURN",
            name(kind),
            kind.match_flags()
        );
    }
    // Service addresses are local: without this, any port of the host would answer on
    // them (issue 72236).
    line!(
        filter,
        "-A {KUBE_IPVS_FILTER} -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        name(SetKind::IpvsIps)
    );

    line!(
        nat,
        "-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"
    );
    line!(nat, "-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}");
    line!(
        nat,
        "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if ctx.random_fully {
            " --random-fully"
        } else {
            ""
        }
    );
    line!(nat, "-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}");
    (filter, nat)
}

/// A Local policy without local endpoints: its traffic is dropped before IPVS sees it.
fn write_drop(out: &mut String, drop: &DropRule, ctx: &RuleContext) {
    let p = protocol_lower(drop.protocol);
    let _ = write!(
        out,
        "-A {KUBE_IPVS_FILTER} -m comment --comment \"{} has no local endpoints\" -m {p} -p {p}",
        drop.owner
    );
    match drop.target {
        DropTarget::Address(ip) => {
            let _ = write!(out, " -d {ip}");
        }
        DropTarget::NodePort => {
            let _ = write!(out, " -m addrtype --dst-type LOCAL");
        }
    }
    let _ = write!(out, " --dport {}", drop.port);
    if drop.external_only {
        let _ = write!(
            out,
            "{} -m addrtype ! --src-type LOCAL",
            ctx.local.if_not_local()
        );
    }
    line!(out, " -j DROP");
}

/// The complete restore input: filter, then nat, each with its extra lines (missing
/// jumps) after the rules.
pub fn assemble(filter: &str, nat: &str, extra_filter: &str, extra_nat: &str) -> String {
    let mut out = String::with_capacity(filter.len() + nat.len() + 64);
    out.push_str("*filter\n");
    out.push_str(filter);
    out.push_str(extra_filter);
    out.push_str("COMMIT\n*nat\n");
    out.push_str(nat);
    out.push_str(extra_nat);
    out.push_str("COMMIT\n");
    out
}
