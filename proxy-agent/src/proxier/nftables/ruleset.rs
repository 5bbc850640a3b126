// SPDX-License-Identifier: Apache-2.0
//! The desired state of one family, pure: the fixed part of the table (base chains, the
//! dispatch rules, sets and maps) as text, and for each service port its chains with
//! their rules and its elements in the shared maps.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use super::context::NftContext;
use super::names::*;
use crate::model::{
    Endpoint, EndpointsMap, Protocol, ServicePort, ServicePortMap, ServicePortName,
    categorize_endpoints,
};
use crate::proxier::netfilter::names::protocol_lower;

/// `writeln!` into a `String`, which cannot fail.
macro_rules! line {
    ($buf:expr, $($arg:tt)*) => {{
        let _ = writeln!($buf, $($arg)*);
    }};
}
pub(super) use line;

/// The element containers shared by every service (named sets and maps: one object each,
/// however many services there are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Container {
    ClusterIps,
    ServiceIps,
    ServiceNodePorts,
    NoEndpointServices,
    NoLocalEndpointExternal,
    NoEndpointNodePorts,
    FirewallIps,
    /// `endpoint-slots-<protocol>-<bucket>`: policy chain slot → endpoint address and port.
    EndpointSlots(Protocol, u32),
    HairpinEndpoints,
}

impl Container {
    /// Every container of a family's table.
    pub fn all() -> impl Iterator<Item = Container> {
        [
            Container::ClusterIps,
            Container::ServiceIps,
            Container::ServiceNodePorts,
            Container::NoEndpointServices,
            Container::NoLocalEndpointExternal,
            Container::NoEndpointNodePorts,
            Container::FirewallIps,
            Container::HairpinEndpoints,
        ]
        .into_iter()
        .chain(SLOT_PROTOCOLS.into_iter().flat_map(|protocol| {
            (0..ENDPOINT_SLOT_MAPS).map(move |bucket| Container::EndpointSlots(protocol, bucket))
        }))
    }

    pub fn name(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Container::ClusterIps => CLUSTER_IPS,
            Container::ServiceIps => SERVICE_IPS,
            Container::ServiceNodePorts => SERVICE_NODEPORTS,
            Container::NoEndpointServices => NO_ENDPOINT_SERVICES,
            Container::NoLocalEndpointExternal => NO_LOCAL_ENDPOINT_EXTERNAL,
            Container::NoEndpointNodePorts => NO_ENDPOINT_NODEPORTS,
            Container::FirewallIps => FIREWALL_IPS,
            Container::HairpinEndpoints => HAIRPIN_ENDPOINTS,
            Container::EndpointSlots(protocol, bucket) => {
                return Cow::Owned(endpoint_slot_map(protocol, bucket));
            }
        })
    }

    pub fn is_map(self) -> bool {
        !matches!(self, Container::ClusterIps | Container::HairpinEndpoints)
    }
}

/// The protocols with slot maps of their own.
const SLOT_PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// What one element maps to (maps: a verdict, or an endpoint's address and port) and its
/// comment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementValue {
    pub data: Option<String>,
    pub comment: Option<String>,
}

/// One element of a shared set or map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub container: Container,
    /// "10.96.0.10 . tcp . 80", "tcp . 30080", "10.96.0.10".
    pub key: String,
    pub value: ElementValue,
}

impl Element {
    /// The element as `add element`/`delete element` take it (deletes take the key only).
    pub fn write(&self, out: &mut String, with_value: bool) {
        out.push_str(&self.key);
        if with_value {
            if let Some(comment) = &self.value.comment {
                let _ = write!(out, " comment \"{comment}\"");
            }
            if let Some(data) = &self.value.data {
                let _ = write!(out, " : {data}");
            }
        }
    }
}

/// A per-service chain and its rules (without the `add rule <table> <chain>` prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub rules: Vec<String>,
}

/// Everything one service port contributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRules {
    pub chains: Vec<Chain>,
    pub elements: Vec<Element>,
    /// Internal traffic is dropped: iTP=Local and no local endpoint.
    pub no_local_internal: bool,
    /// External traffic is dropped: eTP=Local and no local endpoint.
    pub no_local_external: bool,
    pub endpoints: usize,
}

/// The whole desired state of one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    /// The fixed part (see [`base`]).
    pub base: String,
    pub ports: BTreeMap<ServicePortName, PortRules>,
}

/// One family's model.
#[derive(Clone, Copy, Debug)]
pub struct Model<'a> {
    pub services: &'a ServicePortMap,
    pub endpoints: &'a EndpointsMap,
}

impl Model<'_> {
    pub fn endpoints_of(&self, name: &ServicePortName) -> &[Arc<Endpoint>] {
        self.endpoints.get(name).map(Vec::as_slice).unwrap_or(&[])
    }
}

impl DesiredState {
    /// The desired state of every service port of the model.
    pub fn build(model: Model<'_>, ctx: &NftContext<'_>) -> Self {
        Self::from_ports(
            model
                .services
                .iter()
                .map(|(name, svc)| (name, svc.as_ref(), model.endpoints_of(name))),
            ctx,
        )
    }

    /// The desired state of these service ports (the model's, or any others: benchmarks
    /// build ports without trackers).
    pub fn from_ports<'p>(
        ports: impl IntoIterator<Item = (&'p ServicePortName, &'p ServicePort, &'p [Arc<Endpoint>])>,
        ctx: &NftContext<'_>,
    ) -> Self {
        Self {
            base: base(ctx),
            ports: ports
                .into_iter()
                .map(|(name, svc, eps)| (name.clone(), port_rules(name, svc, eps, ctx)))
                .collect(),
        }
    }
}

/// The verdict for traffic that has nowhere to go: no endpoint anywhere (REJECT, via a
/// chain because `reject` is not a verdict), or a Local policy with no local endpoint
/// (DROP).
fn refusal(has_endpoints: bool) -> String {
    if has_endpoints {
        "drop".to_string()
    } else {
        format!("goto {REJECT_CHAIN}")
    }
}

/// The rules and elements of one service port, after upstream's nftables proxier: the
/// endpoint sets come from the model's categorisation (topology, traffic policies,
/// terminating fallback).
pub fn port_rules(
    name: &ServicePortName,
    svc: &ServicePort,
    endpoints: &[Arc<Endpoint>],
    ctx: &NftContext<'_>,
) -> PortRules {
    let names = PortNames::new(name);
    let sets = categorize_endpoints(endpoints, svc, ctx.node_name, ctx.node_labels);
    let has_endpoints = sets.has_any_endpoints;
    let local_missing = sets.local.is_empty();
    let has_internal = has_endpoints && !(svc.internal_policy_local && local_missing);
    let has_external = has_endpoints && !(svc.external_policy_local && local_missing);

    let cluster_chain = names.chain(PortChain::Cluster);
    let local_chain = names.chain(PortChain::Local);
    let external_chain = names.chain(PortChain::External);
    let firewall_chain = names.chain(PortChain::Firewall);
    let internal_chain = if svc.internal_policy_local {
        &local_chain
    } else {
        &cluster_chain
    };
    let external_policy_chain = if svc.external_policy_local {
        &local_chain
    } else {
        &cluster_chain
    };
    let uses_cluster = !sets.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local = !local_missing && svc.uses_local_endpoints();
    // Needed without external endpoints too: it short-circuits local traffic.
    let uses_external = has_endpoints && svc.externally_accessible();
    let lb_vips: Vec<_> = svc.load_balancer_vips().collect();
    let uses_firewall = !lb_vips.is_empty() && !svc.load_balancer_source_ranges.is_empty();

    let mut out = PortRules {
        no_local_internal: has_endpoints && !has_internal,
        no_local_external: has_endpoints && !has_external,
        endpoints: sets.all_reachable.len(),
        ..Default::default()
    };
    let proto = protocol_lower(svc.protocol);
    let port = svc.port;
    let comment = Some(name.to_string());
    let mut element = |container, key: String, data: Option<String>, comment: Option<String>| {
        out.elements.push(Element {
            container,
            key,
            value: ElementValue { data, comment },
        });
    };
    let internal_refusal = refusal(has_endpoints);
    let external_refusal = refusal(has_endpoints);

    element(
        Container::ClusterIps,
        svc.cluster_ip.to_string(),
        None,
        None,
    );
    let cluster_key = format!("{} . {proto} . {port}", svc.cluster_ip);
    if has_internal {
        element(
            Container::ServiceIps,
            cluster_key,
            Some(format!("goto {internal_chain}")),
            None,
        );
    } else {
        element(
            Container::NoEndpointServices,
            cluster_key,
            Some(internal_refusal),
            comment.clone(),
        );
    }
    // No endpoint at all: REJECT whoever sends (this node too). Endpoints elsewhere only,
    // with eTP=Local: DROP what comes from elsewhere; this node's own traffic is
    // short-circuited to every endpoint by the external chain, as in iptables mode (and
    // as upstream's comment intends: its filter-output check drops it before the
    // short-circuit).
    let external_refusals = if has_endpoints {
        Container::NoLocalEndpointExternal
    } else {
        Container::NoEndpointServices
    };
    for ip in &svc.external_ips {
        let key = format!("{ip} . {proto} . {port}");
        if has_endpoints {
            element(
                Container::ServiceIps,
                key.clone(),
                Some(format!("goto {external_chain}")),
                None,
            );
        }
        if !has_external {
            element(
                external_refusals,
                key,
                Some(external_refusal.clone()),
                comment.clone(),
            );
        }
    }
    for ip in &lb_vips {
        let key = format!("{ip} . {proto} . {port}");
        if has_endpoints {
            element(
                Container::ServiceIps,
                key.clone(),
                Some(format!("goto {external_chain}")),
                None,
            );
        }
        if uses_firewall {
            element(
                Container::FirewallIps,
                key.clone(),
                Some(format!("goto {firewall_chain}")),
                None,
            );
        }
        if !has_external {
            element(
                external_refusals,
                key,
                Some(external_refusal.clone()),
                comment.clone(),
            );
        }
    }
    if let Some(node_port) = svc.node_port {
        let key = format!("{proto} . {node_port}");
        // NodePorts are not subject to loadBalancerSourceRanges (upstream behaviour that
        // cannot change any more).
        if has_endpoints {
            element(
                Container::ServiceNodePorts,
                key.clone(),
                Some(format!("goto {external_chain}")),
                None,
            );
        }
        if !has_external {
            element(
                Container::NoEndpointNodePorts,
                key,
                Some(external_refusal.clone()),
                comment.clone(),
            );
        }
    }

    let ip = ctx.ip();
    let mut chains: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    // Off-cluster traffic to a ClusterIP is masqueraded by one rule of `services` (see
    // `base`), not one per service; the internal chain exists for its endpoints.
    if has_internal {
        chains.entry(internal_chain).or_default();
    }

    if uses_external {
        let rules = chains.entry(&external_chain).or_default();
        if !svc.external_policy_local {
            // Endpoints may be on other nodes: the reply must come back through here.
            rules.push(format!("jump {MARK_FOR_MASQUERADE}"));
        } else {
            if ctx.local.is_implemented() {
                // Pod traffic to an external destination is subject to neither traffic
                // policy, as if it had gone out to the load balancer and come back.
                rules.push(format!(
                    "{} goto {cluster_chain} comment \"short-circuit pod traffic\"",
                    ctx.if_local().to_string().trim_start()
                ));
            }
            // The node itself picks a local address (the LB IP, say) as source, which
            // the endpoint could not answer: masquerade, and use every endpoint.
            rules.push(format!(
                "fib saddr type local jump {MARK_FOR_MASQUERADE} comment \"masquerade local traffic\""
            ));
            rules.push(format!(
                "fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""
            ));
        }
        if has_external {
            rules.push(format!("goto {external_policy_chain}"));
        }
    }

    if uses_firewall {
        // loadBalancerSourceRanges: admitted sources return to firewall-check, the rest
        // is dropped. One rule per range rather than an anonymous set per service.
        let rules = chains.entry(&firewall_chain).or_default();
        let mut allow_from_node = false;
        for cidr in &svc.load_balancer_source_ranges {
            rules.push(format!("{ip} saddr {cidr} return"));
            allow_from_node |= ctx.node_ip.is_some_and(|node| cidr.contains(&node));
        }
        if allow_from_node {
            // An LB IP installed as a local address makes node-to-LB traffic loop back
            // with the LB IP as its source.
            for vip in &lb_vips {
                rules.push(format!("{ip} saddr {vip} return"));
            }
        }
        rules.push("drop".to_string());
    }

    // ClientIP affinity remembers an endpoint by its chain, so those services keep
    // upstream's endpoint chains; the others DNAT straight from the policy chain through the
    // slot maps (one chain per endpoint made most of the table's chains, and nft reads
    // every chain of the table before each transaction).
    let affinity = svc.session_affinity.is_some();
    let endpoint_chain = |ep: &Endpoint| names.endpoint(&ep.addr());
    let mut slot_elements = Vec::new();
    for (policy_chain, endpoints, used) in [
        (&cluster_chain, &sets.cluster, uses_cluster),
        (&local_chain, &sets.local, uses_local),
    ] {
        if !used {
            continue;
        }
        let rules = chains.entry(policy_chain).or_default();
        if affinity {
            dispatch(rules, ip, svc, endpoints, &endpoint_chain);
        } else {
            let slots = SlotKey::of_chain(policy_chain);
            rules.push(format!(
                "meta l4proto {proto} dnat {ip} to {} . {} . numgen random mod {} map @{}",
                slot_expr(slots.hi),
                slot_expr(slots.lo),
                endpoints.len(),
                endpoint_slot_map(svc.protocol, slots.bucket)
            ));
            slot_elements.extend(endpoints.iter().enumerate().map(|(i, ep)| Element {
                container: Container::EndpointSlots(svc.protocol, slots.bucket),
                key: slots.element(i),
                value: ElementValue {
                    data: Some(format!("{} . {}", ep.ip, ep.port)),
                    comment: None,
                },
            }));
        }
    }
    // Chains in a stable order: the port's own, then its endpoints' in model order.
    let mut port_chains: Vec<Chain> = chains
        .into_iter()
        .map(|(name, rules)| Chain {
            name: name.to_string(),
            rules,
        })
        .collect();
    out.elements.extend(slot_elements);
    if !affinity {
        let mut hairpin: Vec<_> = sets.all_reachable.iter().map(|ep| ep.ip).collect();
        hairpin.sort();
        hairpin.dedup();
        out.elements.extend(hairpin.into_iter().map(|ip| Element {
            container: Container::HairpinEndpoints,
            key: format!("{ip} . {ip}"),
            value: ElementValue {
                data: None,
                comment: None,
            },
        }));
    }
    for ep in sets.all_reachable.iter().filter(|_| affinity) {
        let name = endpoint_chain(ep);
        let mut rules = Vec::with_capacity(3);
        // Hairpin: an endpoint reaching its own service must see the reply come back
        // through the node.
        rules.push(format!("{ip} saddr {} jump {MARK_FOR_MASQUERADE}", ep.ip));
        if let Some(affinity) = svc.session_affinity {
            rules.push(format!(
                "update @{AFFINITY} {{ {ip} saddr . {} timeout {}s }}",
                slot_expr(affinity_slot(&name)),
                affinity.timeout_seconds
            ));
        }
        rules.push(format!("meta l4proto {proto} dnat to {}", ep.addr()));
        port_chains.push(Chain { name, rules });
    }
    out.chains = port_chains;
    out
}

/// A constant inside a set-key concatenation: nft cannot type a literal there, but
/// `numgen random mod 1` is always 0, so with an offset it is that constant, typed as the
/// set's key (`typeof ... numgen random mod 1`).
fn slot_expr(slot: u32) -> String {
    format!("numgen random mod 1 offset {slot}")
}

/// A policy chain's rules: ClientIP affinity lookups first, then the endpoint choice.
///
/// The choice is a cascade, not upstream's `numgen random mod N vmap { 0 : goto e0, ... }`
/// (an anonymous set per service, which the kernel loads super-linearly): rule `i` (of
/// `n` endpoints, from 0) is `numgen random mod (n - i) == 0 goto e_i`, each drawing a
/// fresh number, and the last endpoint takes what falls through. Endpoint `k` is chosen
/// when rules 0..k all miss and rule k hits:
///
/// P(k) = prod_{i<k} (1 - 1/(n-i)) * 1/(n-k) = prod_{i<k} (n-i-1)/(n-i) * 1/(n-k)
///      = (n-k)/n * 1/(n-k) = 1/n
///
/// (the product telescopes), and the last one gets the rest, (n-(n-1))/n = 1/n: every
/// endpoint 1/n, as upstream. `cascade_is_uniform` checks it on the generated rules.
fn dispatch(
    rules: &mut Vec<String>,
    ip: &str,
    svc: &ServicePort,
    endpoints: &[Arc<Endpoint>],
    endpoint_chain: &dyn Fn(&Endpoint) -> String,
) {
    if svc.session_affinity.is_some() {
        for ep in endpoints {
            let chain = endpoint_chain(ep);
            rules.push(format!(
                "{ip} saddr . {} @{AFFINITY} goto {chain}",
                slot_expr(affinity_slot(&chain))
            ));
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let chain = endpoint_chain(ep);
        if i + 1 < n {
            rules.push(format!("numgen random mod {} == 0 goto {chain}", n - i));
        } else {
            rules.push(format!("goto {chain}"));
        }
    }
}

/// The base chains: name, type, hook, priority. Upstream's priorities, numerically (nft
/// 1.0.6 refuses `dstnat - 10` in a filter chain of the output hook): filtering at
/// dstnat - 10, before DNAT, so on the service's own address; the ClusterIP check in
/// output at dstnat + 10, after it; NAT at dstnat and srcnat.
pub const BASE_CHAIN_HOOKS: [(&str, &str, &str, &str); 8] = [
    (FILTER_PREROUTING, "filter", "prerouting", "-110"),
    (FILTER_INPUT, "filter", "input", "-110"),
    (FILTER_FORWARD, "filter", "forward", "-110"),
    (FILTER_OUTPUT, "filter", "output", "-110"),
    (FILTER_OUTPUT_POST_DNAT, "filter", "output", "-90"),
    (NAT_PREROUTING, "nat", "prerouting", "-100"),
    (NAT_OUTPUT, "nat", "output", "-100"),
    (NAT_POSTROUTING, "nat", "postrouting", "100"),
];

pub const BASE_CHAINS: [&str; 8] = [
    FILTER_PREROUTING,
    FILTER_INPUT,
    FILTER_FORWARD,
    FILTER_OUTPUT,
    FILTER_OUTPUT_POST_DNAT,
    NAT_PREROUTING,
    NAT_OUTPUT,
    NAT_POSTROUTING,
];

/// Upper bound of the affinity set (the kernel gives dynamic sets 65,535 by default, which
/// one family-wide set could outgrow; upstream's per-endpoint sets have 65,535 each).
pub const AFFINITY_SET_SIZE: u32 = 1 << 22;

/// The fixed part of the table: every chain except the per-service ones (added and
/// flushed, so their rules are exactly these), the jumps into them, and the sets and maps
/// (added; their elements are managed by [`super::Written`]). `nodeport-ips` is filled
/// here (it follows the node, not the services).
pub fn base(ctx: &NftContext<'_>) -> String {
    let t = format!("{} {TABLE}", ctx.ip());
    let ip = ctx.ip();
    let addr = ctx.addr_type();
    let mut out = String::with_capacity(4096);
    for (chain, kind, hook, priority) in BASE_CHAIN_HOOKS {
        line!(
            out,
            "add chain {t} {chain} {{ type {kind} hook {hook} priority {priority} ; }}"
        );
        line!(out, "flush chain {t} {chain}");
    }
    for chain in [
        NODEPORT_ENDPOINTS_CHECK,
        SERVICE_ENDPOINTS_CHECK,
        EXTERNAL_ENDPOINTS_CHECK,
        FIREWALL_CHECK,
        SERVICES,
        MASQUERADING,
        CLUSTER_IPS_CHECK,
        MARK_FOR_MASQUERADE,
    ] {
        line!(out, "add chain {t} {chain}");
        line!(out, "flush chain {t} {chain}");
    }
    line!(
        out,
        "add chain {t} {REJECT_CHAIN} {{ comment \"helper for @{NO_ENDPOINT_SERVICES} / @{NO_ENDPOINT_NODEPORTS}\" ; }}"
    );
    line!(out, "flush chain {t} {REJECT_CHAIN}");
    line!(out, "add rule {t} {REJECT_CHAIN} reject");

    // The checks REJECT, which older kernels allow only in input, forward and output.
    for (from, to) in [
        (FILTER_INPUT, NODEPORT_ENDPOINTS_CHECK),
        (FILTER_INPUT, SERVICE_ENDPOINTS_CHECK),
        (FILTER_FORWARD, SERVICE_ENDPOINTS_CHECK),
        (FILTER_OUTPUT, SERVICE_ENDPOINTS_CHECK),
        (FILTER_INPUT, EXTERNAL_ENDPOINTS_CHECK),
        (FILTER_FORWARD, EXTERNAL_ENDPOINTS_CHECK),
        (FILTER_PREROUTING, FIREWALL_CHECK),
        (FILTER_OUTPUT, FIREWALL_CHECK),
        (FILTER_FORWARD, CLUSTER_IPS_CHECK),
        (FILTER_OUTPUT_POST_DNAT, CLUSTER_IPS_CHECK),
    ] {
        line!(out, "add rule {t} {from} ct state new jump {to}");
    }
    for (from, to) in [
        (NAT_OUTPUT, SERVICES),
        (NAT_PREROUTING, SERVICES),
        (NAT_POSTROUTING, MASQUERADING),
    ] {
        line!(out, "add rule {t} {from} jump {to}");
    }

    let mark = &ctx.mark;
    line!(
        out,
        "add rule {t} {MARK_FOR_MASQUERADE} mark set mark or {mark}"
    );

    let service_key = format!("{addr} . inet_proto . inet_service");
    for (name, key, value, comment) in [
        (CLUSTER_IPS, addr.to_string(), "", "Active ClusterIPs"),
        (
            NO_ENDPOINT_SERVICES,
            service_key.clone(),
            " : verdict",
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            NO_LOCAL_ENDPOINT_EXTERNAL,
            service_key.clone(),
            " : verdict",
            "vmap to drop packets from elsewhere to external IPs of eTP=Local services without local endpoints",
        ),
        (
            NO_ENDPOINT_NODEPORTS,
            "inet_proto . inet_service".to_string(),
            " : verdict",
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            FIREWALL_IPS,
            service_key.clone(),
            " : verdict",
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            SERVICE_IPS,
            service_key,
            " : verdict",
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (
            SERVICE_NODEPORTS,
            "inet_proto . inet_service".to_string(),
            " : verdict",
            "NodePort traffic",
        ),
    ] {
        let kind = if value.is_empty() { "set" } else { "map" };
        line!(
            out,
            "add {kind} {t} {name} {{ type {key}{value} ; comment \"{comment}\" ; }}"
        );
    }
    line!(
        out,
        "add set {t} {AFFINITY} {{ typeof {ip} saddr . numgen random mod 1 ; flags dynamic,timeout ; size {AFFINITY_SET_SIZE} ; comment \"ClientIP affinity: client . endpoint slot\" ; }}"
    );
    for protocol in SLOT_PROTOCOLS {
        let l4 = protocol_lower(protocol);
        for bucket in 0..ENDPOINT_SLOT_MAPS {
            line!(
                out,
                "add map {t} {} {{ typeof numgen random mod 1 . numgen random mod 1 . numgen random mod 1 : {ip} daddr . {l4} dport ; }}",
                endpoint_slot_map(protocol, bucket)
            );
        }
    }
    line!(
        out,
        "add set {t} {HAIRPIN_ENDPOINTS} {{ type {addr} . {addr} ; comment \"endpoint . endpoint: an endpoint reaching itself through its service\" ; }}"
    );
    // Hairpin: the endpoint must see the reply come back through the node.
    line!(
        out,
        "add rule {t} {MASQUERADING} ct status dnat {ip} saddr . {ip} daddr @{HAIRPIN_ENDPOINTS} jump {MARK_FOR_MASQUERADE}"
    );
    line!(
        out,
        "add rule {t} {MASQUERADING} mark and {mark} == 0 return"
    );
    // Clearing the mark keeps a packet that traverses the stack again from being
    // masqueraded twice.
    line!(out, "add rule {t} {MASQUERADING} mark set mark xor {mark}");
    line!(out, "add rule {t} {MASQUERADING} masquerade fully-random");

    line!(
        out,
        "add rule {t} {CLUSTER_IPS_CHECK} {ip} daddr @{CLUSTER_IPS} reject comment \"Reject traffic to invalid ports of ClusterIPs\""
    );
    if !ctx.service_cidrs.is_empty() {
        let cidrs: Vec<String> = ctx.service_cidrs.iter().map(|c| c.to_string()).collect();
        line!(
            out,
            "add rule {t} {CLUSTER_IPS_CHECK} {ip} daddr {{ {} }} drop comment \"Drop traffic to unallocated ClusterIPs\"",
            cidrs.join(", ")
        );
    }

    // NodePort destinations: the listed addresses, or every local one but loopback
    // (NodePorts are never served on localhost in this mode).
    line!(
        out,
        "add set {t} {NODEPORT_IPS} {{ type {addr} ; comment \"IPs that accept NodePort traffic\" ; }}"
    );
    let nodeport_match = match &ctx.nodeport_addresses {
        None => {
            line!(out, "delete set {t} {NODEPORT_IPS}");
            format!("{ip} daddr != {}", ctx.loopback())
        }
        Some(addresses) => {
            line!(out, "flush set {t} {NODEPORT_IPS}");
            let usable: Vec<String> = addresses
                .iter()
                .filter(|a| {
                    if a.is_loopback() {
                        tracing::error!(
                            address = %a,
                            "nodePortAddresses includes localhost, but localhost NodePorts are not supported in nftables mode; skipping it"
                        );
                    }
                    !a.is_loopback()
                })
                .map(|a| a.to_string())
                .collect();
            if !usable.is_empty() {
                line!(
                    out,
                    "add element {t} {NODEPORT_IPS} {{ {} }}",
                    usable.join(", ")
                );
            }
            format!("{ip} daddr @{NODEPORT_IPS}")
        }
    };
    line!(
        out,
        "add rule {t} {SERVICE_ENDPOINTS_CHECK} {ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"
    );
    line!(
        out,
        "add rule {t} {EXTERNAL_ENDPOINTS_CHECK} {ip} daddr . meta l4proto . th dport vmap @{NO_LOCAL_ENDPOINT_EXTERNAL}"
    );
    line!(
        out,
        "add rule {t} {NODEPORT_ENDPOINTS_CHECK} {nodeport_match} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
    );
    line!(
        out,
        "add rule {t} {FIREWALL_CHECK} {ip} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"
    );
    // Off-cluster traffic to a ClusterIP (a static route to the service range via any
    // node) may leave the node again, so it is masqueraded. Upstream writes this rule into
    // every service's internal chain (`ip daddr <ClusterIP> tcp dport <port> ...`); one
    // rule over @cluster-ips marks the same packets: a ClusterIP's traffic to a port it
    // does not serve, or to a service without usable endpoints, is rejected or dropped by
    // the filter chains before postrouting looks at the mark.
    if ctx.masquerade_all || ctx.local.is_implemented() {
        let not_local = if ctx.masquerade_all {
            String::new()
        } else {
            ctx.if_not_local().to_string()
        };
        line!(
            out,
            "add rule {t} {SERVICES} {ip} daddr @{CLUSTER_IPS}{not_local} jump {MARK_FOR_MASQUERADE}"
        );
    }
    line!(
        out,
        "add rule {t} {SERVICES} {ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"
    );
    let fib = if ctx.nodeport_addresses.is_none() {
        "fib daddr type local "
    } else {
        ""
    };
    line!(
        out,
        "add rule {t} {SERVICES} {fib}{nodeport_match} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
    );
    out
}
