// SPDX-License-Identifier: Apache-2.0
//! Upstream's two nfacct-based metrics of iptables mode, read at scrape time:
//! `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` and
//! `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`.
//!
//! As upstream, the mode creates the nfacct objects at start ([`ensure_nfacct_counters`]),
//! its rules feed those that exist (`-m nfacct`), and the metrics read the objects'
//! packet counts, which survive rule rewrites and restarts. An object that cannot be
//! created is logged and its counter left out of the rules, as upstream does.
//!
//! Without nfacct (the kernel lacks nfnetlink_acct or xt_nfacct), upstream exports no
//! sample of either metric. For the INVALID counter this mode keeps a fallback instead:
//! the `[packets:bytes]` counters of the `KUBE-FORWARD ... --ctstate INVALID -j DROP`
//! rule, which `iptables-save --counters` prints, summed over both families (upstream's
//! one nfacct object is shared by the iptables and ip6tables rules too); they restart
//! when a full sync rewrites the chain. The localhost counter has no such fallback: its
//! rule exists only to feed nfacct.

use super::rules::NfacctCounters;
use crate::model::IpFamily;
use crate::proxier::netfilter::exec::run_program;
use crate::proxier::netfilter::names::KUBE_FORWARD;
use crate::proxier::netfilter::nfacct::{self, Nfacct};
use crate::proxier::netfilter::save::{self, Line, Op};
use crate::proxier::netfilter::{ExecError, Table};

/// The filter table of `family` with counters, from PATH's `iptables-save` (the command
/// the mode detected at start; `IptablesBackend::save` prints no counters, hence this).
fn saved_filter_with_counters(family: IpFamily) -> Result<String, ExecError> {
    let program = match family {
        IpFamily::V4 => "iptables-save",
        IpFamily::V6 => "ip6tables-save",
    };
    run_program(program, &["--counters", "-t", Table::Filter.as_str()], None)
}

/// Packets the INVALID-drop rule of this saved filter table dropped; `None` when the
/// rule is not there (conntrack.tcpBeLiberal set, or nothing synced yet).
pub fn invalid_dropped_in(saved: &str) -> Option<u64> {
    let mut found = None;
    for line in saved.lines() {
        let Line::Command(command) = save::parse_line(line) else {
            continue;
        };
        if command.op != Op::Append || command.chain != KUBE_FORWARD {
            continue;
        }
        let words: Vec<_> = command.tokens().collect();
        let invalid = words
            .windows(2)
            .any(|w| w[0] == "--ctstate" && w[1] == "INVALID");
        if invalid && command.target().is_some_and(|t| t == "DROP") {
            let packets = command.counters.map_or(0, |c| c.packets);
            found = Some(found.unwrap_or(0) + packets);
        }
    }
    found
}

/// Creates upstream's nfacct objects unless they exist, and says which exist. Failures
/// are logged (the counter is then not used), never fatal.
pub fn ensure_nfacct_counters() -> NfacctCounters {
    let mut counters = NfacctCounters::default();
    let mut nfacct = match Nfacct::open() {
        Ok(nfacct) => nfacct,
        Err(err) => {
            tracing::error!(reason = %err, "cannot use nfacct: nfacct-based metrics will not be available");
            return counters;
        }
    };
    for (name, exists) in [
        (
            nfacct::CT_STATE_INVALID_DROPPED,
            &mut counters.ct_state_invalid_dropped,
        ),
        (
            nfacct::LOCALHOST_NODEPORTS_ACCEPTED,
            &mut counters.localhost_nodeports_accepted,
        ),
    ] {
        match nfacct.ensure(name) {
            Ok(()) => *exists = true,
            Err(err) => tracing::error!(
                counter = name,
                reason = %err,
                "cannot create the nfacct counter; the corresponding metric will not be updated"
            ),
        }
    }
    counters
}

/// `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`: the packets its
/// nfacct object counted; `None` (no sample) without it.
pub fn localhost_nodeports_accepted_packets() -> Option<u64> {
    nfacct::packets_of(nfacct::LOCALHOST_NODEPORTS_ACCEPTED)
}

/// `kubeproxy_iptables_ct_state_invalid_dropped_packets_total`: the packets its nfacct
/// object counted, or without it, the INVALID-drop rules' own counters.
pub fn ct_state_invalid_dropped_packets() -> Option<u64> {
    nfacct::packets_of(nfacct::CT_STATE_INVALID_DROPPED).or_else(invalid_dropped_by_rules)
}

/// The packets both families' INVALID-drop rules dropped; `None` (no sample) when
/// neither family has the rule or its table cannot be read.
fn invalid_dropped_by_rules() -> Option<u64> {
    let mut total = None;
    for family in [IpFamily::V4, IpFamily::V6] {
        match saved_filter_with_counters(family) {
            Ok(saved) => {
                if let Some(packets) = invalid_dropped_in(&saved) {
                    total = Some(total.unwrap_or(0) + packets);
                }
            }
            Err(err) => {
                tracing::debug!(family = %family, reason = %err, "cannot read the INVALID-drop counter");
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invalid_drop_rules_counters_are_read() {
        let saved = "# Generated by iptables-save\n*filter\n:KUBE-FORWARD - [0:0]\n\
            [7:420] -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
            [3:180] -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
            [9:900] -A OTHER -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n";
        assert_eq!(invalid_dropped_in(saved), Some(7));
    }

    #[test]
    fn the_counters_of_a_rule_feeding_nfacct_are_read_too() {
        let saved = "*filter\n:KUBE-FORWARD - [0:0]\n\
            [5:300] -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP\nCOMMIT\n";
        assert_eq!(invalid_dropped_in(saved), Some(5));
    }

    #[test]
    fn no_rule_is_no_value() {
        let saved = "*filter\n:KUBE-FORWARD - [0:0]\n\
            [3:180] -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n";
        assert_eq!(invalid_dropped_in(saved), None);
    }
}
