// SPDX-License-Identifier: Apache-2.0
//! Tests of the ipvs mode without privileges: the desired state of every behaviour
//! scenario, the netlink messages, the rules, the ipset batches and the apply diff
//! against an in-memory IPVS table.

mod apply;
mod genl;
mod rules;
mod scenarios;

use std::collections::BTreeSet;

use super::desired::FamilyDesired;
use super::sets::SetKind;
use crate::model::IpFamily;

/// The desired state as lines: "VS TCP 10.96.0.10:80 rr persist=- -> a,b",
/// "SET KUBE-CLUSTER-IP 10.96.0.10,tcp:80", "ADDR 10.96.0.10", "DROP ...".
pub fn render(desired: &FamilyDesired, family: IpFamily) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (key, svc) in &desired.services {
        let servers: Vec<String> = svc.real_servers.iter().map(|r| r.to_string()).collect();
        let persist = svc
            .server
            .persistence_timeout
            .map_or("-".to_string(), |t| t.to_string());
        out.insert(format!(
            "VS {key} {} persist={persist} -> {}",
            svc.server.scheduler,
            servers.join(",")
        ));
    }
    for (kind, entries) in &desired.sets {
        for entry in entries {
            out.insert(format!("SET {} {entry}", kind.name(family)));
        }
    }
    for ip in &desired.addresses {
        out.insert(format!("ADDR {ip}"));
    }
    for drop in &desired.drops {
        out.insert(format!(
            "DROP {} {:?} {} {} external_only={}",
            drop.owner, drop.target, drop.protocol, drop.port, drop.external_only
        ));
    }
    for key in &desired.lb_no_node_access {
        out.insert(format!("NO-NODE-ACCESS {key}"));
    }
    out
}

/// Every set kind is present (possibly empty) in a desired state.
pub fn has_every_set(desired: &FamilyDesired) -> bool {
    SetKind::ALL.iter().all(|k| desired.sets.contains_key(k))
}
