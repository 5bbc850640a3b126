// SPDX-License-Identifier: Apache-2.0
//! What the last generation decided per service port: enough to write an unchanged
//! port's top-level rules without looking at its endpoints, and the chains it owns, so a
//! partial generation knows which ones a changed service no longer needs.

use std::collections::{HashMap, HashSet};

use crate::model::{NamespacedName, ServicePortMap, ServicePortName};
use crate::proxier::iptables::names::ChainName;
use crate::proxier::netfilter::names::ChainHash;

/// The endpoint facts the top-level rules depend on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortFlags {
    /// Some usable endpoint exists somewhere (otherwise: REJECT).
    pub has_endpoints: bool,
    /// Internal traffic has endpoints (otherwise, with `has_endpoints`: DROP, iTP Local).
    pub has_internal: bool,
    /// External traffic has endpoints (otherwise, with `has_endpoints`: DROP, eTP Local).
    pub has_external: bool,
}

impl PortFlags {
    pub fn drops_internal(&self) -> bool {
        self.has_endpoints && !self.has_internal
    }

    pub fn drops_external(&self) -> bool {
        self.has_endpoints && !self.has_external
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortState {
    pub name: ServicePortName,
    /// The hash of the port's SVC/SVL/EXT/FW chains.
    pub hash: ChainHash,
    pub flags: PortFlags,
    /// Every per-service chain the port's rules declared.
    pub chains: Vec<ChainName>,
    /// The rules (nat) in those chains, which stay in the kernel while a partial sync
    /// leaves the port alone: `kubeproxy_sync_proxy_rules_iptables_total` counts them.
    pub chain_rules: usize,
}

#[derive(Debug, Default)]
pub struct RuleCache {
    services: HashMap<NamespacedName, Vec<PortState>>,
    ports: usize,
}

impl RuleCache {
    pub fn clear(&mut self) {
        self.services.clear();
        self.ports = 0;
    }

    pub fn port_count(&self) -> usize {
        self.ports
    }

    pub fn get(&self, name: &ServicePortName) -> Option<&PortState> {
        self.services
            .get(&name.service)?
            .iter()
            .find(|state| state.name == *name)
    }

    pub fn insert(&mut self, state: PortState) {
        let ports = self.services.entry(state.name.service.clone()).or_default();
        match ports.iter_mut().find(|s| s.name == state.name) {
            Some(existing) => *existing = state,
            None => {
                ports.push(state);
                self.ports += 1;
            }
        }
    }

    /// Forgets these services, returning the chains they owned.
    pub fn take_services(&mut self, services: &HashSet<NamespacedName>) -> Vec<ChainName> {
        let mut chains = Vec::new();
        for service in services {
            if let Some(ports) = self.services.remove(service) {
                self.ports -= ports.len();
                chains.extend(ports.into_iter().flat_map(|p| p.chains));
            }
        }
        chains
    }

    /// The chains these services own now.
    pub fn chains_of(&self, services: &HashSet<NamespacedName>) -> HashSet<ChainName> {
        services
            .iter()
            .filter_map(|service| self.services.get(service))
            .flatten()
            .flat_map(|port| port.chains.iter().copied())
            .collect()
    }

    /// Drops ports that are not in `services`, returning their chains. A full scan.
    pub fn retain_only(&mut self, services: &ServicePortMap) -> Vec<ChainName> {
        let mut dropped = Vec::new();
        for ports in self.services.values_mut() {
            ports.retain(|port| {
                let keep = services.contains_key(&port.name);
                if !keep {
                    dropped.extend(port.chains.iter().copied());
                }
                keep
            });
        }
        self.services.retain(|_, ports| !ports.is_empty());
        self.ports = self.services.values().map(Vec::len).sum();
        dropped
    }

    /// Every chain owned by some port.
    pub fn all_chains(&self) -> impl Iterator<Item = &ChainName> {
        self.services
            .values()
            .flatten()
            .flat_map(|port| port.chains.iter())
    }
}
