// SPDX-License-Identifier: Apache-2.0
//! Pure rule generation: one family's model -> `iptables-restore` input for the filter and
//! nat tables, in upstream kube-proxy's layout. No kernel access.
//!
//! The text goes into four buffers (filter chains, filter rules, nat chains, nat rules),
//! as upstream builds it, and is assembled by [`RestoreBuffers::assemble`]. A full
//! generation writes every chain; a partial one writes the top-level chains in full (they
//! are flushed by their chain line) and only the per-service chains of changed services,
//! relying on the unchanged ones still being in the kernel. [`RuleCache`] remembers what
//! the previous generation decided for each service port so that a partial generation
//! costs nothing per unchanged endpoint.

mod cache;
pub(super) mod context;
mod service;

use std::collections::HashSet;
use std::fmt::Write;

pub use cache::RuleCache;
pub use context::{FamilyContext, NfacctCounters, RuleOptions};

use super::names::ChainName;
use crate::model::{EndpointsMap, IpFamily, NamespacedName, ServicePortMap};
use crate::proxier::netfilter::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};
use crate::proxier::netfilter::nfacct;

/// Above this many endpoints, per-endpoint comments are left out and stale chains are
/// looked for less often (upstream's "large cluster mode").
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

/// Writes one line into a buffer; `fmt::Write` for `String` cannot fail.
macro_rules! line {
    ($buf:expr, $($arg:tt)*) => {{
        let _ = writeln!($buf, $($arg)*);
    }};
}
pub(crate) use line;

/// What to regenerate.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Everything.
    Full,
    /// The top-level chains, plus the per-service chains of these services.
    Partial(&'a HashSet<NamespacedName>),
}

impl Scope<'_> {
    pub fn is_full(&self) -> bool {
        matches!(self, Scope::Full)
    }

    fn rewrites(&self, service: &NamespacedName) -> bool {
        match self {
            Scope::Full => true,
            Scope::Partial(changed) => changed.contains(service),
        }
    }
}

/// The restore input under construction. The proxier drops it once the text is assembled
/// (keeping the capacity would keep the largest sync's rules twice).
#[derive(Debug, Default)]
pub struct RestoreBuffers {
    pub filter_chains: String,
    pub filter_rules: String,
    pub nat_chains: String,
    pub nat_rules: String,
}

impl RestoreBuffers {
    pub fn clear(&mut self) {
        self.filter_chains.clear();
        self.filter_rules.clear();
        self.nat_chains.clear();
        self.nat_rules.clear();
    }

    /// Declares stale per-service chains (which flushes them) and deletes them, after
    /// every other rule so nothing refers to them any more.
    pub fn delete_chains(
        &mut self,
        chains: impl IntoIterator<Item = impl std::fmt::Display>,
    ) -> usize {
        let mut count = 0;
        for chain in chains {
            line!(self.nat_chains, ":{chain} - [0:0]");
            line!(self.nat_rules, "-X {chain}");
            count += 1;
        }
        count
    }

    /// Appends the complete input: filter, then nat, each ended by COMMIT.
    pub fn assemble(&self, out: &mut String) {
        out.reserve(
            self.filter_chains.len()
                + self.filter_rules.len()
                + self.nat_chains.len()
                + self.nat_rules.len()
                + 32,
        );
        out.push_str("*filter\n");
        out.push_str(&self.filter_chains);
        out.push_str(&self.filter_rules);
        out.push_str("COMMIT\n*nat\n");
        out.push_str(&self.nat_chains);
        out.push_str(&self.nat_rules);
        out.push_str("COMMIT\n");
    }

    /// Rule lines (not chain declarations) written.
    pub fn rule_lines(&self) -> usize {
        count_lines(&self.filter_rules) + count_lines(&self.nat_rules)
    }

    /// Rule lines written, by table: `(filter, nat)`.
    pub fn rule_lines_by_table(&self) -> (usize, usize) {
        (
            count_lines(&self.filter_rules),
            count_lines(&self.nat_rules),
        )
    }
}

fn count_lines(text: &str) -> usize {
    text.bytes().filter(|b| *b == b'\n').count()
}

/// Upstream's probabilities, "%0.10f" of 1/n, computed once per n.
#[derive(Debug, Default)]
pub struct Probabilities(Vec<String>);

impl Probabilities {
    pub fn get(&mut self, n: usize) -> &str {
        while self.0.len() <= n {
            let k = self.0.len();
            self.0.push(format!("{:.10}", 1.0 / k.max(1) as f64));
        }
        &self.0[n]
    }
}

/// One family's model.
#[derive(Clone, Copy, Debug)]
pub struct Model<'a> {
    pub services: &'a ServicePortMap,
    pub endpoints: &'a EndpointsMap,
}

/// What a generation decided, for the apply step, logs and metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Generated {
    pub service_ports: usize,
    pub endpoints: usize,
    pub large_cluster: bool,
    pub no_local_endpoints_internal: usize,
    pub no_local_endpoints_external: usize,
    /// Per-service chains the changed services owned before and no longer use (partial
    /// generations; a full one finds stale chains by listing the kernel's).
    pub stale_chains: Vec<ChainName>,
    /// Rules (nat) of the per-service chains a partial generation did not rewrite: they
    /// stay in the kernel as the previous generations wrote them.
    pub kept_nat_rules: usize,
}

/// Generates the rules of one family into `out` (cleared first), updating `cache`.
pub fn generate(
    model: Model<'_>,
    ctx: &FamilyContext<'_>,
    scope: Scope<'_>,
    cache: &mut RuleCache,
    probabilities: &mut Probabilities,
    out: &mut RestoreBuffers,
) -> Generated {
    out.clear();
    let mut ports: Vec<_> = model.services.iter().collect();
    ports.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let endpoints: usize = ports
        .iter()
        .map(|(name, _)| model.endpoints.get(*name).map_or(0, Vec::len))
        .sum();
    let mut generated = Generated {
        service_ports: ports.len(),
        endpoints,
        large_cluster: endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
        ..Default::default()
    };
    reserve(out, &generated, scope);

    write_fixed_chains(ctx, out);

    let mut stale = match scope {
        Scope::Full => {
            cache.clear();
            Vec::new()
        }
        Scope::Partial(changed) => cache.take_services(changed),
    };

    let mut writer = service::ServiceWriter {
        ctx,
        large_cluster: generated.large_cluster,
        probabilities,
        out,
    };
    for (name, svc) in ports {
        let eps = model.endpoints.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let state = if scope.rewrites(&name.service) {
            None
        } else {
            cache.get(name)
        };
        let flags = match state {
            Some(state) => {
                writer.write_top_level(name, svc, state.hash, state.flags);
                generated.kept_nat_rules += state.chain_rules;
                state.flags
            }
            None => {
                // A port missing from the cache in a partial generation has never been
                // written: treat it as changed.
                let state = writer.write_service(name, svc, eps);
                let flags = state.flags;
                cache.insert(state);
                flags
            }
        };
        generated.no_local_endpoints_internal += usize::from(flags.drops_internal());
        generated.no_local_endpoints_external += usize::from(flags.drops_external());
    }

    if let Scope::Partial(changed) = scope {
        // Chains a changed service had before and still has were just rewritten.
        let current = cache.chains_of(changed);
        stale.retain(|chain| !current.contains(chain));
        if cache.port_count() > generated.service_ports {
            // Ports vanished without their service being reported as changed.
            tracing::warn!("service ports disappeared without a change notice; cleaning up");
            stale.extend(cache.retain_only(model.services));
        }
    }
    stale.sort_unstable();
    stale.dedup();
    generated.stale_chains = stale;

    write_nodeport_jumps(ctx, out);
    write_forward_rules(ctx, out);
    generated
}

/// Capacity guesses from the sizes upstream's rules have, so that a 10,000-service
/// generation grows its buffers a few times at most.
fn reserve(out: &mut RestoreBuffers, generated: &Generated, scope: Scope<'_>) {
    let ports = generated.service_ports;
    let per_endpoint = if scope.is_full() { 400 } else { 0 };
    out.nat_rules
        .reserve(ports * 180 + generated.endpoints * per_endpoint + 2048);
    out.nat_chains.reserve(
        if scope.is_full() {
            (ports * 2 + generated.endpoints) * 36
        } else {
            0
        } + 512,
    );
    out.filter_rules.reserve(1024);
}

fn write_fixed_chains(ctx: &FamilyContext<'_>, out: &mut RestoreBuffers) {
    for chain in [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ] {
        line!(out.filter_chains, ":{chain} - [0:0]");
    }
    for chain in [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_POSTROUTING,
        KUBE_MARK_MASQ,
    ] {
        line!(out.nat_chains, ":{chain} - [0:0]");
    }
    let mark = &ctx.mark;
    line!(
        out.nat_rules,
        "-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"
    );
    // Clearing the mark keeps a packet that traverses the stack again from being
    // masqueraded twice.
    line!(
        out.nat_rules,
        "-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}"
    );
    line!(
        out.nat_rules,
        "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if ctx.options.random_fully {
            " --random-fully"
        } else {
            ""
        }
    );
    line!(
        out.nat_rules,
        "-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}"
    );

    if ctx.localhost_nodeports {
        // route_localnet opens 127.0.0.0/8 to the network (issue 90259); this is the
        // mitigation, identical to kubelet's copy of the rule.
        line!(out.filter_chains, ":{KUBE_FIREWALL} - [0:0]");
        line!(
            out.filter_rules,
            "-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
        );
    }
}

/// The tail of KUBE-SERVICES: hand packets for node addresses to KUBE-NODEPORTS. It must
/// stay the last rule of the chain.
fn write_nodeport_jumps(ctx: &FamilyContext<'_>, out: &mut RestoreBuffers) {
    const COMMENT: &str =
        "\"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
    match &ctx.nodeport_addresses {
        None => {
            let localhost = match ctx.family {
                // Localhost NodePorts never work on IPv6.
                IpFamily::V6 => " ! -d ::1/128",
                IpFamily::V4 if !ctx.localhost_nodeports => " ! -d 127.0.0.0/8",
                IpFamily::V4 => "",
            };
            line!(
                out.nat_rules,
                "-A {KUBE_SERVICES} -m comment --comment {COMMENT} -m addrtype --dst-type LOCAL{localhost} -j {KUBE_NODEPORTS}"
            );
        }
        Some(addresses) => {
            for ip in addresses {
                if ip.is_loopback() && (ctx.family == IpFamily::V6 || !ctx.localhost_nodeports) {
                    tracing::error!(
                        address = %ip,
                        "nodePortAddresses includes localhost, but localhost NodePorts are disabled or unsupported (IPv6); skipping it"
                    );
                    continue;
                }
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} -m comment --comment {COMMENT} -d {ip} -j {KUBE_NODEPORTS}"
                );
            }
        }
    }
}

fn write_forward_rules(ctx: &FamilyContext<'_>, out: &mut RestoreBuffers) {
    if !ctx.options.conntrack_tcp_be_liberal {
        // Out-of-window packets are INVALID; letting them through makes the host answer
        // them with resets that kill the connection (issues 74839, 117924).
        // With its nfacct object, the rule also counts what it drops (the metric
        // kubeproxy_iptables_ct_state_invalid_dropped_packets_total).
        let counted = if ctx.options.nfacct.ct_state_invalid_dropped {
            const NAME: &str = nfacct::CT_STATE_INVALID_DROPPED;
            format!(" -m nfacct --nfacct-name {NAME}")
        } else {
            String::new()
        };
        line!(
            out.filter_rules,
            "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{counted} -j DROP"
        );
    }
    let mark = &ctx.mark;
    line!(
        out.filter_rules,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    );
    line!(
        out.filter_rules,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
}
