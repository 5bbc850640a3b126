// SPDX-License-Identifier: Apache-2.0
//! What was written to the kernel, and the transactions that move it to a new desired
//! state: a full one (every chain rewritten, the shared maps flushed and refilled) and a
//! partial one (only the changed service ports' chains rewritten, element adds and
//! deletes instead of a map flush). Pure: the caller runs the text with `nft -f -` and
//! calls [`Written::reset`] when that fails.
//!
//! Chains a service port stops using are flushed at once and deleted by a later
//! transaction ([`Written::stale_chain_deletion`]) at least [`STALE_CHAIN_DELAY`] after:
//! before kernel 6.2 the kernel notices only a little later that a deleted map element no
//! longer references its chain, so deleting both in one transaction can fail.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write;
use std::time::{Duration, Instant};

use super::context::NftContext;
use super::names::{TABLE, is_port_chain};
use super::ruleset::{
    BASE_CHAINS, Container, DesiredState, Element, ElementValue, Model, PortRules, base, line,
    port_rules,
};

use crate::model::{NamespacedName, ServicePortName};

impl DesiredState {
    /// The `nft -f` text loading this state into a table that holds no per-service chain
    /// (a first start): [`Written::full`] without history. (Here, beside [`Written`], so
    /// that the ruleset does not depend on the record of what was written.)
    pub fn cold_load(&self, ctx: &NftContext<'_>) -> String {
        let mut written = Written::default();
        written.full(self, ctx, Some(&[]), Instant::now()).0
    }
}

/// How long a flushed chain waits before it is deleted (upstream: one second).
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// What one service port owns in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PortRecord {
    chains: Vec<String>,
    elements: Vec<(Container, String)>,
    /// Its traffic policies drop traffic for want of a local endpoint (internal,
    /// external): for `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
    no_local: (bool, bool),
}

/// Who wants one element: its value per owning service port. Two ports can claim the same
/// key (an external IP and port listed by two services); the first port by name wins, in
/// full and partial syncs alike.
#[derive(Clone, Debug, Default)]
struct Claims {
    owners: BTreeMap<ServicePortName, ElementValue>,
    /// The value in the kernel.
    written: Option<ElementValue>,
}

impl Claims {
    fn wanted(&self) -> Option<&ElementValue> {
        self.owners.values().next()
    }
}

/// The state of one family's table as this agent wrote it.
#[derive(Debug, Default)]
pub struct Written {
    /// The fixed part last written; `None` before the first sync.
    base: Option<String>,
    ports: HashMap<ServicePortName, PortRecord>,
    elements: HashMap<(Container, String), Claims>,
    /// Flushed chains waiting for deletion, and since when.
    stale_chains: HashMap<String, Instant>,
}

/// What a transaction did, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransactionStats {
    pub chains_written: usize,
    pub chains_flushed_stale: usize,
    pub elements_added: usize,
    pub elements_deleted: usize,
}

impl Written {
    /// Forgets everything: the next sync must be [`Written::full`] (after a failed
    /// transaction nobody knows what the kernel holds).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    pub fn is_empty(&self) -> bool {
        self.base.is_none()
    }

    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// Service ports in the table whose internal and external traffic (in that order) is
    /// dropped for want of a local endpoint.
    pub fn no_local_endpoints(&self) -> (usize, usize) {
        self.ports.values().fold((0, 0), |(i, e), p| {
            (i + usize::from(p.no_local.0), e + usize::from(p.no_local.1))
        })
    }

    /// Chains flushed and waiting for deletion.
    pub fn stale_chains(&self) -> impl Iterator<Item = &str> {
        self.stale_chains.keys().map(String::as_str)
    }

    /// The full transaction to `desired`. `kernel_chains`: the table's chains as listed
    /// from the kernel (finds chains a previous run left); `None` when unknown (a fresh
    /// table, or listing failed).
    pub fn full(
        &mut self,
        desired: &DesiredState,
        ctx: &NftContext<'_>,
        kernel_chains: Option<&[String]>,
        now: Instant,
    ) -> (String, TransactionStats) {
        let t = format!("{} {TABLE}", ctx.ip());
        let chains: usize = desired.ports.values().map(|p| p.chains.len()).sum();
        let mut out = String::with_capacity(chains * 200 + 8192);
        line!(
            out,
            "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
        );
        if self.base.is_none() {
            // Once per run: recreate the base chains, so that a table left with other
            // chain properties (another version's priorities) does not fail the
            // transaction.
            for chain in BASE_CHAINS {
                line!(out, "add chain {t} {chain}");
                line!(out, "delete chain {t} {chain}");
            }
        }
        out.push_str(&desired.base);
        for container in Container::all() {
            line!(
                out,
                "flush {} {t} {}",
                set_or_map(container),
                container.name()
            );
        }
        let before: HashSet<String> = self
            .ports
            .values()
            .flat_map(|p| p.chains.iter().cloned())
            .chain(self.stale_chains.keys().cloned())
            .chain(
                kernel_chains
                    .into_iter()
                    .flatten()
                    .filter(|c| is_port_chain(c))
                    .cloned(),
            )
            .collect();
        // Without a listing, any chain may be there already (flush it); with one, only
        // the listed and remembered ones.
        let listed = kernel_chains.is_some();

        self.ports.clear();
        self.elements.clear();
        let mut stats = TransactionStats::default();
        let mut active = HashSet::with_capacity(chains);
        for rules in desired.ports.values() {
            for chain in &rules.chains {
                declare_chain(
                    &mut out,
                    &t,
                    &chain.name,
                    !listed || before.contains(&chain.name),
                );
                active.insert(chain.name.as_str());
                stats.chains_written += 1;
            }
        }
        for (name, rules) in &desired.ports {
            write_rules(&mut out, &t, rules);
            self.record(name, rules);
        }
        let mut adds: BTreeMap<Container, Vec<&Element>> = BTreeMap::new();
        for rules in desired.ports.values() {
            for element in &rules.elements {
                let claims = &self.elements[&(element.container, element.key.clone())];
                // Each key once, with the value of its first owner.
                if claims.written.is_none() && claims.wanted() == Some(&element.value) {
                    adds.entry(element.container).or_default().push(element);
                    self.mark_written(element);
                }
            }
        }
        write_elements(&mut out, &t, "add", &adds, true);
        stats.elements_added = adds.values().map(Vec::len).sum();

        let mut stale: Vec<&String> = before
            .iter()
            .filter(|c| !active.contains(c.as_str()))
            .collect();
        stale.sort();
        self.stale_chains
            .retain(|c, _| !active.contains(c.as_str()));
        for chain in stale {
            line!(out, "flush chain {t} {chain}");
            self.stale_chains.entry(chain.clone()).or_insert(now);
            stats.chains_flushed_stale += 1;
        }
        self.base = Some(desired.base.clone());
        (out, stats)
    }

    /// The partial transaction after the services in `changed` changed: `ports` holds the
    /// current rules of every port those services have now (their other ports are gone).
    /// The fixed part is rewritten only if it differs from what was written.
    pub fn partial(
        &mut self,
        base: &str,
        changed: &HashSet<NamespacedName>,
        ports: &BTreeMap<ServicePortName, PortRules>,
        ctx: &NftContext<'_>,
        now: Instant,
    ) -> (String, TransactionStats) {
        let t = format!("{} {TABLE}", ctx.ip());
        let mut out = String::new();
        let mut stats = TransactionStats::default();
        line!(
            out,
            "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
        );
        if self.base.as_deref() != Some(base) {
            out.push_str(base);
            self.base = Some(base.to_string());
        }

        // The ports these services had, and the chains they owned.
        let mut old_chains: HashSet<String> = HashSet::new();
        let gone: Vec<ServicePortName> = self
            .ports
            .keys()
            .filter(|p| changed.contains(&p.service) || ports.contains_key(*p))
            .cloned()
            .collect();
        let mut touched: BTreeSet<(Container, String)> = BTreeSet::new();
        for port in gone {
            if let Some(record) = self.ports.remove(&port) {
                old_chains.extend(record.chains);
                for key in record.elements {
                    if let Some(claims) = self.elements.get_mut(&key) {
                        claims.owners.remove(&port);
                    }
                    touched.insert(key);
                }
            }
        }

        let mut active: HashSet<&str> = HashSet::new();
        for rules in ports.values() {
            for chain in &rules.chains {
                let existed = old_chains.contains(&chain.name)
                    || self.stale_chains.remove(&chain.name).is_some();
                declare_chain(&mut out, &t, &chain.name, existed);
                active.insert(&chain.name);
                stats.chains_written += 1;
            }
        }
        for (name, rules) in ports {
            write_rules(&mut out, &t, rules);
            self.record(name, rules);
            touched.extend(rules.elements.iter().map(|e| (e.container, e.key.clone())));
        }

        // Element changes: a key whose wanted value differs from the kernel's is deleted
        // (when present) and added again; a key nobody wants any more is deleted.
        let mut deletes: BTreeMap<Container, Vec<Element>> = BTreeMap::new();
        let mut adds: BTreeMap<Container, Vec<Element>> = BTreeMap::new();
        for key in touched {
            let Some(claims) = self.elements.get_mut(&key) else {
                continue;
            };
            let wanted = claims.wanted().cloned();
            if wanted == claims.written {
                if wanted.is_none() {
                    self.elements.remove(&key);
                }
                continue;
            }
            let (container, text) = key.clone();
            if let Some(old) = claims.written.take() {
                deletes.entry(container).or_default().push(Element {
                    container,
                    key: text.clone(),
                    value: old,
                });
            }
            match wanted {
                Some(value) => {
                    claims.written = Some(value.clone());
                    adds.entry(container).or_default().push(Element {
                        container,
                        key: text,
                        value,
                    });
                }
                None => {
                    self.elements.remove(&key);
                }
            }
        }
        write_elements(&mut out, &t, "delete", &as_refs(&deletes), false);
        write_elements(&mut out, &t, "add", &as_refs(&adds), true);
        stats.elements_deleted = deletes.values().map(Vec::len).sum();
        stats.elements_added = adds.values().map(Vec::len).sum();

        let mut stale: Vec<&String> = old_chains
            .iter()
            .filter(|c| !active.contains(c.as_str()))
            .collect();
        stale.sort();
        for chain in stale {
            line!(out, "flush chain {t} {chain}");
            self.stale_chains.insert(chain.clone(), now);
            stats.chains_flushed_stale += 1;
        }
        (out, stats)
    }

    /// The partial transaction for a sync of `model` after `changed` changed: the rules of
    /// those services' ports only (each service costs its own endpoints, the rest
    /// nothing). Ports that vanished, or appeared, without their service being reported
    /// are handled too (a scan of the port names, no endpoint work).
    pub fn partial_from_model(
        &mut self,
        model: Model<'_>,
        ctx: &NftContext<'_>,
        changed: &HashSet<NamespacedName>,
        now: Instant,
    ) -> (String, TransactionStats) {
        let mut changed = changed.clone();
        let unreported: Vec<NamespacedName> = self
            .vanished(|p| model.services.contains_key(p))
            .into_iter()
            .chain(
                model
                    .services
                    .keys()
                    .filter(|p| !self.ports.contains_key(*p))
                    .map(|p| p.service.clone()),
            )
            .filter(|s| !changed.contains(s))
            .collect();
        if !unreported.is_empty() {
            tracing::warn!(
                services = unreported.len(),
                "service ports changed without a change notice; rewriting them"
            );
            changed.extend(unreported);
        }
        let ports: BTreeMap<ServicePortName, PortRules> = changed
            .iter()
            .flat_map(|service| model.services.ports_of(service))
            .map(|(name, svc)| {
                (
                    name.clone(),
                    port_rules(name, svc, model.endpoints_of(name), ctx),
                )
            })
            .collect();
        self.partial(&base(ctx), &changed, &ports, ctx, now)
    }

    /// Service ports this state holds that `exists` denies (ports that disappeared
    /// without their service being reported as changed): the caller adds their services
    /// to the changed set.
    pub fn vanished(&self, exists: impl Fn(&ServicePortName) -> bool) -> Vec<NamespacedName> {
        let mut services: Vec<NamespacedName> = self
            .ports
            .keys()
            .filter(|p| !exists(p))
            .map(|p| p.service.clone())
            .collect();
        services.sort();
        services.dedup();
        services
    }

    /// The transaction deleting chains flushed at least [`STALE_CHAIN_DELAY`] before
    /// `now`, run before the sync's own (upstream's order); `None` when there are none.
    /// They are forgotten here: if the deletion fails they stay in the kernel, and the next
    /// full sync finds them in the chain listing.
    pub fn stale_chain_deletion(&mut self, ctx: &NftContext<'_>, now: Instant) -> Option<String> {
        let mut due: Vec<String> = self
            .stale_chains
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= STALE_CHAIN_DELAY)
            .map(|(c, _)| c.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        due.sort();
        let t = format!("{} {TABLE}", ctx.ip());
        let mut out = String::new();
        for chain in due {
            line!(out, "delete chain {t} {chain}");
            self.stale_chains.remove(&chain);
        }
        Some(out)
    }

    fn record(&mut self, name: &ServicePortName, rules: &PortRules) {
        let mut record = PortRecord {
            chains: rules.chains.iter().map(|c| c.name.clone()).collect(),
            elements: Vec::with_capacity(rules.elements.len()),
            no_local: (rules.no_local_internal, rules.no_local_external),
        };
        for element in &rules.elements {
            let key = (element.container, element.key.clone());
            self.elements
                .entry(key.clone())
                .or_default()
                .owners
                .insert(name.clone(), element.value.clone());
            record.elements.push(key);
        }
        self.ports.insert(name.clone(), record);
    }

    fn mark_written(&mut self, element: &Element) {
        if let Some(claims) = self
            .elements
            .get_mut(&(element.container, element.key.clone()))
        {
            claims.written = Some(element.value.clone());
        }
    }
}

fn as_refs(elements: &BTreeMap<Container, Vec<Element>>) -> BTreeMap<Container, Vec<&Element>> {
    elements
        .iter()
        .map(|(c, v)| (*c, v.iter().collect()))
        .collect()
}

fn set_or_map(container: Container) -> &'static str {
    if container.is_map() { "map" } else { "set" }
}

/// `add chain`, plus `flush chain` when it may hold rules already.
fn declare_chain(out: &mut String, t: &str, chain: &str, may_exist: bool) {
    line!(out, "add chain {t} {chain}");
    if may_exist {
        line!(out, "flush chain {t} {chain}");
    }
}

fn write_rules(out: &mut String, t: &str, rules: &PortRules) {
    for chain in &rules.chains {
        for rule in &chain.rules {
            line!(out, "add rule {t} {} {rule}", chain.name);
        }
    }
}

/// One statement per container, elements comma-separated (fewer netlink messages than a
/// statement each).
fn write_elements(
    out: &mut String,
    t: &str,
    verb: &str,
    elements: &BTreeMap<Container, Vec<&Element>>,
    with_value: bool,
) {
    for (container, list) in elements {
        if list.is_empty() {
            continue;
        }
        let _ = write!(out, "{verb} element {t} {} {{ ", container.name());
        for (i, element) in list.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            element.write(out, with_value);
        }
        out.push_str(" }\n");
    }
}
