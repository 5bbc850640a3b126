// SPDX-License-Identifier: Apache-2.0
//! The rules of one service port: its entries in the top-level chains (always written)
//! and its own SVC/SVL/EXT/FW/SEP chains (written when the service changed).

use std::fmt::Write;
use std::sync::Arc;

use super::cache::{PortFlags, PortState};
use super::{FamilyContext, Probabilities, RestoreBuffers, line};
use crate::model::{Endpoint, ServicePort, ServicePortName, categorize_endpoints};
use crate::proxier::iptables::names::{ChainKind, ChainName};
use crate::proxier::netfilter::names::{
    ChainHash, KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL,
    KUBE_SERVICES, endpoint_hash, protocol_lower, service_port_hash,
};
use crate::proxier::netfilter::nfacct;

pub(super) struct ServiceWriter<'a, 'c> {
    pub ctx: &'a FamilyContext<'c>,
    pub large_cluster: bool,
    pub probabilities: &'a mut Probabilities,
    pub out: &'a mut RestoreBuffers,
}

/// The chains one port routes through, derived from its flags.
struct Routing {
    svc: ChainName,
    svl: ChainName,
    ext: ChainName,
    fw: ChainName,
    internal: ChainName,
    external_policy: ChainName,
    uses_ext: bool,
    uses_fw: bool,
}

impl Routing {
    fn new(svc: &ServicePort, hash: ChainHash, flags: PortFlags) -> Self {
        let chain = |kind| ChainName::new(kind, hash);
        let (svc_chain, svl_chain) = (chain(ChainKind::Svc), chain(ChainKind::Svl));
        Self {
            svc: svc_chain,
            svl: svl_chain,
            ext: chain(ChainKind::Ext),
            fw: chain(ChainKind::Fw),
            internal: if svc.internal_policy_local {
                svl_chain
            } else {
                svc_chain
            },
            external_policy: if svc.external_policy_local {
                svl_chain
            } else {
                svc_chain
            },
            // Needed even without external endpoints: it short-circuits local traffic.
            uses_ext: flags.has_endpoints && svc.externally_accessible(),
            uses_fw: flags.has_endpoints
                && svc.load_balancer_vips().next().is_some()
                && !svc.load_balancer_source_ranges.is_empty(),
        }
    }

    fn load_balancer(&self) -> ChainName {
        if self.uses_fw { self.fw } else { self.ext }
    }
}

/// Where and why traffic without usable endpoints stops.
struct Refusal {
    target: &'static str,
    reason: &'static str,
}

impl Refusal {
    fn internal(flags: PortFlags) -> Option<Self> {
        if !flags.has_endpoints {
            Some(Self::no_endpoints())
        } else if !flags.has_internal {
            Some(Self::no_local())
        } else {
            None
        }
    }

    fn external(flags: PortFlags) -> Option<Self> {
        if !flags.has_endpoints {
            Some(Self::no_endpoints())
        } else if !flags.has_external {
            Some(Self::no_local())
        } else {
            None
        }
    }

    fn no_endpoints() -> Self {
        Self {
            target: "REJECT",
            reason: "has no endpoints",
        }
    }

    fn no_local() -> Self {
        Self {
            target: "DROP",
            reason: "has no local endpoints",
        }
    }
}

impl ServiceWriter<'_, '_> {
    /// Writes everything for a (changed) port and returns what the cache keeps.
    pub fn write_service(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        endpoints: &[Arc<Endpoint>],
    ) -> PortState {
        let name_text = name.to_string();
        let hash = service_port_hash(&name_text, svc.protocol);
        let sets = categorize_endpoints(endpoints, svc, self.ctx.node_name, self.ctx.node_labels);
        let has_endpoints = sets.has_any_endpoints;
        let flags = PortFlags {
            has_endpoints,
            has_internal: has_endpoints && !(svc.internal_policy_local && sets.local.is_empty()),
            has_external: has_endpoints && !(svc.external_policy_local && sets.local.is_empty()),
        };
        self.write_top_level(name, svc, hash, flags);
        // Everything below goes into the port's own chains (nat).
        let chains_start = self.out.nat_rules.len();

        let routing = Routing::new(svc, hash, flags);
        let mut chains = Vec::new();
        self.write_internal_masquerade(name, svc, &routing, flags);
        if routing.uses_ext {
            chains.push(routing.ext);
            self.write_external_chain(name, svc, &routing, flags);
        }
        if routing.uses_fw {
            chains.push(routing.fw);
            self.write_firewall_chain(name, svc, &routing);
        }
        let protocol = svc.protocol;
        let sep = |ep: &Endpoint| {
            ChainName::new(
                ChainKind::Sep,
                endpoint_hash(&name_text, protocol, &ep.addr()),
            )
        };
        if !sets.cluster.is_empty() && svc.uses_cluster_endpoints() {
            chains.push(routing.svc);
            self.write_dispatch(name, svc, routing.svc, &sets.cluster, &sep);
        }
        if !sets.local.is_empty() && svc.uses_local_endpoints() {
            chains.push(routing.svl);
            self.write_dispatch(name, svc, routing.svl, &sets.local, &sep);
        }
        for ep in &sets.all_reachable {
            let chain = sep(ep);
            chains.push(chain);
            self.write_endpoint_chain(name, svc, chain, ep);
        }
        let chain_rules = self.out.nat_rules[chains_start..]
            .bytes()
            .filter(|b| *b == b'\n')
            .count();
        PortState {
            name: name.clone(),
            hash,
            flags,
            chains,
            chain_rules,
        }
    }

    /// The port's rules in KUBE-SERVICES, KUBE-NODEPORTS and the filter chains.
    pub fn write_top_level(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        hash: ChainHash,
        flags: PortFlags,
    ) {
        let routing = Routing::new(svc, hash, flags);
        let out = &mut *self.out;
        let p = protocol_lower(svc.protocol);
        let port = svc.port;

        match Refusal::internal(flags) {
            None => line!(
                out.nat_rules,
                "-A {KUBE_SERVICES} -m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {} --dport {port} -j {}",
                svc.cluster_ip,
                routing.internal
            ),
            Some(refusal) => line!(
                out.filter_rules,
                "-A {KUBE_SERVICES} -m comment --comment \"{name} {}\" -m {p} -p {p} -d {} --dport {port} -j {}",
                refusal.reason,
                svc.cluster_ip,
                refusal.target
            ),
        }

        let external_refusal = Refusal::external(flags);
        for ip in &svc.external_ips {
            if flags.has_endpoints {
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} -m comment --comment \"{name} external IP\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
                    routing.ext
                );
            }
            if let Some(refusal) = &external_refusal {
                line!(
                    out.filter_rules,
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment \"{name} {}\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
                    refusal.reason,
                    refusal.target
                );
            }
        }

        for ip in svc.load_balancer_vips() {
            if flags.has_endpoints {
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} -m comment --comment \"{name} loadbalancer IP\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
                    routing.load_balancer()
                );
            }
            if routing.uses_fw {
                line!(
                    out.filter_rules,
                    "-A {KUBE_PROXY_FIREWALL} -m comment --comment \"{name} traffic not accepted by {}\" -m {p} -p {p} -d {ip} --dport {port} -j DROP",
                    routing.fw
                );
            }
        }
        if let Some(refusal) = &external_refusal {
            for ip in svc.load_balancer_vips() {
                line!(
                    out.filter_rules,
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment \"{name} {}\" -m {p} -p {p} -d {ip} --dport {port} -j {}",
                    refusal.reason,
                    refusal.target
                );
            }
        }

        if let Some(node_port) = svc.node_port {
            // NodePorts are not subject to loadBalancerSourceRanges (upstream behaviour
            // that cannot change any more).
            if flags.has_endpoints {
                if self.ctx.localhost_nodeports
                    && self.ctx.options.nfacct.localhost_nodeports_accepted
                {
                    // The same jump for 127.0.0.0/8 first, only to count those packets in
                    // nfacct (kubeproxy_iptables_localhost_nodeports_accepted_packets_total).
                    const COUNTER: &str = nfacct::LOCALHOST_NODEPORTS_ACCEPTED;
                    line!(
                        out.nat_rules,
                        "-A {KUBE_NODEPORTS} -m comment --comment {name} -m {p} -p {p} -d 127.0.0.0/8 --dport {node_port} -m nfacct --nfacct-name {COUNTER} -j {}",
                        routing.ext
                    );
                }
                line!(
                    out.nat_rules,
                    "-A {KUBE_NODEPORTS} -m comment --comment {name} -m {p} -p {p} --dport {node_port} -j {}",
                    routing.ext
                );
            }
            if let Some(refusal) = &external_refusal {
                line!(
                    out.filter_rules,
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment \"{name} {}\" -m addrtype --dst-type LOCAL -m {p} -p {p} --dport {node_port} -j {}",
                    refusal.reason,
                    refusal.target
                );
            }
        }

        if let Some(hc) = svc.health_check_node_port {
            // Accepted whether or not there are local endpoints: the health check
            // answers either way.
            line!(
                out.filter_rules,
                "-A {KUBE_NODEPORTS} -m comment --comment \"{name} health check node port\" -m tcp -p tcp --dport {hc} -j ACCEPT"
            );
        }
    }

    /// Off-cluster traffic to a ClusterIP (a static route to the service range via any
    /// node) may leave the node again, so it is masqueraded.
    fn write_internal_masquerade(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        routing: &Routing,
        flags: PortFlags,
    ) {
        if !flags.has_internal || !(self.ctx.masquerade_all || self.ctx.local.is_implemented()) {
            return;
        }
        let p = protocol_lower(svc.protocol);
        let out = &mut self.out.nat_rules;
        let _ = write!(
            out,
            "-A {} -m comment --comment \"{name} cluster IP\" -m {p} -p {p} -d {} --dport {}",
            routing.internal, svc.cluster_ip, svc.port
        );
        if !self.ctx.masquerade_all {
            let _ = write!(out, "{}", self.ctx.local.if_not_local());
        }
        line!(out, " -j {KUBE_MARK_MASQ}");
    }

    fn write_external_chain(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        routing: &Routing,
        flags: PortFlags,
    ) {
        let ext = routing.ext;
        let out = &mut *self.out;
        line!(out.nat_chains, ":{ext} - [0:0]");
        if !svc.external_policy_local {
            // Endpoints may be on other nodes: the reply must come back through here.
            line!(
                out.nat_rules,
                "-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j {KUBE_MARK_MASQ}"
            );
        } else {
            if self.ctx.local.is_implemented() {
                // Pod traffic to an external destination is subject to neither traffic
                // policy, as if it had gone out to the load balancer and come back.
                line!(
                    out.nat_rules,
                    "-A {ext} -m comment --comment \"pod traffic for {name} external destinations\"{} -j {}",
                    self.ctx.local.if_local(),
                    routing.svc
                );
            }
            // The node itself picks a local address (the LB IP, say) as source, which
            // the endpoint could not answer: masquerade, and use every endpoint.
            line!(
                out.nat_rules,
                "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}"
            );
            line!(
                out.nat_rules,
                "-A {ext} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {}",
                routing.svc
            );
        }
        if flags.has_external {
            line!(out.nat_rules, "-A {ext} -j {}", routing.external_policy);
        }
    }

    /// loadBalancerSourceRanges; it only works for load balancers that keep the client's
    /// address. Traffic falling off the end is dropped by KUBE-PROXY-FIREWALL.
    fn write_firewall_chain(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        routing: &Routing,
    ) {
        let (fw, ext) = (routing.fw, routing.ext);
        let out = &mut *self.out;
        line!(out.nat_chains, ":{fw} - [0:0]");
        let mut allow_from_node = false;
        for cidr in &svc.load_balancer_source_ranges {
            line!(
                out.nat_rules,
                "-A {fw} -m comment --comment \"{name} loadbalancer IP\" -s {cidr} -j {ext}"
            );
            allow_from_node |= self.ctx.node_ip.is_some_and(|ip| cidr.contains(&ip));
        }
        if allow_from_node {
            // An LB IP installed as a local address makes node-to-LB traffic loop back
            // with the LB IP as its source.
            for ip in svc.load_balancer_vips() {
                line!(
                    out.nat_rules,
                    "-A {fw} -m comment --comment \"{name} loadbalancer IP\" -s {ip} -j {ext}"
                );
            }
        }
        line!(
            out.nat_rules,
            "-A {fw} -m comment --comment \"other traffic to {name} will be dropped by KUBE-PROXY-FIREWALL\""
        );
    }

    /// Session affinity first, then one probabilistic jump per endpoint.
    fn write_dispatch(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        chain: ChainName,
        endpoints: &[Arc<Endpoint>],
        sep: &dyn Fn(&Endpoint) -> ChainName,
    ) {
        let out = &mut *self.out;
        line!(out.nat_chains, ":{chain} - [0:0]");
        let comments = !self.large_cluster;
        if let Some(affinity) = svc.session_affinity {
            for ep in endpoints {
                let target = sep(ep);
                let _ = write!(out.nat_rules, "-A {chain}");
                if comments {
                    let _ = write!(out.nat_rules, " -m comment --comment \"{name} -> {ep}\"");
                }
                line!(
                    out.nat_rules,
                    " -m recent --name {target} --rcheck --seconds {} --reap -j {target}",
                    affinity.timeout_seconds
                );
            }
        }
        let n = endpoints.len();
        for (i, ep) in endpoints.iter().enumerate() {
            let _ = write!(out.nat_rules, "-A {chain}");
            if comments {
                let _ = write!(out.nat_rules, " -m comment --comment \"{name} -> {ep}\"");
            }
            if i + 1 < n {
                let _ = write!(
                    out.nat_rules,
                    " -m statistic --mode random --probability {}",
                    self.probabilities.get(n - i)
                );
            }
            line!(out.nat_rules, " -j {}", sep(ep));
        }
    }

    fn write_endpoint_chain(
        &mut self,
        name: &ServicePortName,
        svc: &ServicePort,
        chain: ChainName,
        ep: &Endpoint,
    ) {
        let out = &mut *self.out;
        line!(out.nat_chains, ":{chain} - [0:0]");
        let comment = if self.large_cluster { None } else { Some(name) };
        let _ = write!(out.nat_rules, "-A {chain}");
        if let Some(name) = comment {
            let _ = write!(out.nat_rules, " -m comment --comment {name}");
        }
        // Hairpin: an endpoint reaching its own service must see the reply come back
        // through the node.
        line!(out.nat_rules, " -s {} -j {KUBE_MARK_MASQ}", ep.ip);
        let _ = write!(out.nat_rules, "-A {chain}");
        if let Some(name) = comment {
            let _ = write!(out.nat_rules, " -m comment --comment {name}");
        }
        if svc.session_affinity.is_some() {
            let _ = write!(out.nat_rules, " -m recent --name {chain} --set");
        }
        let p = protocol_lower(svc.protocol);
        line!(
            out.nat_rules,
            " -m {p} -p {p} -j DNAT --to-destination {}",
            ep.addr()
        );
    }
}
