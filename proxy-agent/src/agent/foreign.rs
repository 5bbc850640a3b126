// SPDX-License-Identifier: Apache-2.0
//! Another proxy programming this node: kube-proxy come back (a `kubeadm upgrade apply`
//! re-adds its DaemonSet unless told not to) or left running beside the agent. Two
//! proxies on one node fight over its rules and connections; nothing else would say so.
//!
//! After each full sync the agent asks every mode it does not run what of that mode's
//! dataplane is on the node (`ModeEntry::written_beside`): the running mode removed all
//! of it after its first sync, so what is there now was written since. A change in what
//! is found is logged, recorded as a Node event and shown by
//! `kubeproxy_foreign_proxy_detected`.

use crate::{config::ProxyMode, proxier::MODES};

/// What the other modes' probes found, one description each (empty: nothing).
pub fn written_beside(running: ProxyMode) -> Vec<String> {
    MODES
        .iter()
        .filter(|entry| entry.mode != running)
        .flat_map(|entry| (entry.written_beside)(running))
        .collect()
}

/// A change in what another proxy has written on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForeignChange {
    /// Found now, or found more than before: what is there.
    Found(Vec<String>),
    /// Nothing is there any more.
    Gone,
}

/// Remembers what was found, so that each change is reported once. (pure)
#[derive(Debug, Default)]
pub struct ForeignProxyWatch {
    found: Vec<String>,
}

impl ForeignProxyWatch {
    pub fn observe(&mut self, mut found: Vec<String>) -> Option<ForeignChange> {
        found.sort();
        found.dedup();
        if found == self.found {
            return None;
        }
        let change = if found.is_empty() {
            ForeignChange::Gone
        } else {
            ForeignChange::Found(found.clone())
        };
        self.found = found;
        Some(change)
    }

    /// Whether anything is found at the moment.
    pub fn detected(&self) -> bool {
        !self.found.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_is_reported_once() {
        let mut watch = ForeignProxyWatch::default();
        assert_eq!(watch.observe(Vec::new()), None);
        let table = "nftables table ip kube-proxy".to_string();
        assert_eq!(
            watch.observe(vec![table.clone(), table.clone()]),
            Some(ForeignChange::Found(vec![table.clone()]))
        );
        assert!(watch.detected());
        assert_eq!(watch.observe(vec![table.clone()]), None);
        let chain = "iptables chain KUBE-SERVICES (IPv4)".to_string();
        assert_eq!(
            watch.observe(vec![table.clone(), chain.clone()]),
            Some(ForeignChange::Found(vec![chain, table]))
        );
        assert_eq!(watch.observe(Vec::new()), Some(ForeignChange::Gone));
        assert!(!watch.detected());
    }

    /// Our ebpf mode is nobody else's: no mode probes for it, and the probes run without
    /// privileges (they find nothing they cannot read).
    #[test]
    fn the_probes_run_for_every_mode_but_the_running_one() {
        for entry in MODES {
            let _ = written_beside(entry.mode);
        }
    }
}
