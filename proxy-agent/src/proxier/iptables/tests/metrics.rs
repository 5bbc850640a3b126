// SPDX-License-Identifier: Apache-2.0
//! What a sync reports for the `kubeproxy_sync_proxy_rules_iptables_*` metrics: the rule
//! counts (checked against the in-memory kernel) and which restore failed.

use super::partial::{new_proxier, scenario_yaml, service_yaml, slice_yaml};
use super::scenario::Scenario;
use crate::model::IpFamily;
use crate::proxier::iptables::fake::SharedFake;
use crate::proxier::netfilter::Table;
use crate::proxier::{Proxier, RestoreFailure, SyncStats, TableRules};

/// Rules in the kernel's chains of ours (every chain but the built-in ones, whose rules
/// are the jumps into ours).
fn kernel_rules(fake: &SharedFake, table: Table) -> usize {
    let mut fake = fake.lock();
    let builtin = table.builtin_chains();
    fake.table(IpFamily::V4, table)
        .chains
        .iter()
        .filter(|(chain, _)| !builtin.contains(&chain.as_str()))
        .map(|(_, rules)| rules.len())
        .sum()
}

fn rules_of(stats: &SyncStats, table: Table) -> TableRules {
    let report = stats
        .per_family
        .iter()
        .find(|r| r.family == IpFamily::V4)
        .expect("IPv4 reported");
    report
        .iptables_rules
        .iter()
        .find(|r| r.table == table.as_str())
        .cloned()
        .expect("table reported")
}

fn two_services(second_endpoint: &str) -> String {
    [
        service_yaml("svc1", "172.30.0.41", "TCP"),
        slice_yaml("svc1", &["10.180.0.1", second_endpoint], "TCP"),
        service_yaml("svc2", "172.30.0.42", "TCP"),
        slice_yaml("svc2", &["10.180.0.3", "10.180.0.4", "10.180.0.5"], "TCP"),
    ]
    .concat()
}

#[test]
fn rule_counts_are_the_rules_of_our_chains_in_the_kernel() {
    let scenario = Scenario::parse(&scenario_yaml(&[
        two_services("10.180.0.2"),
        two_services("10.180.0.9"),
    ]));
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();

    let step = replay.apply(&scenario.states[0]);
    let request = replay.request(&step, true);
    let stats = proxier.sync(&request).unwrap();
    for table in [Table::Filter, Table::Nat] {
        let rules = rules_of(&stats, table);
        assert_eq!(
            rules.total,
            kernel_rules(&fake, table),
            "{table} after a full sync"
        );
        assert_eq!(
            rules.last, rules.total,
            "{table}: a full sync writes every rule"
        );
    }
    assert!(rules_of(&stats, Table::Nat).total > 10);

    // svc1's second endpoint changes: a partial sync rewrites svc1's chains and the
    // top-level ones, and svc2's chains stay as they were.
    let step = replay.apply(&scenario.states[1]);
    assert!(!step.changed.is_empty());
    let request = replay.request(&step, false);
    let stats = proxier.sync(&request).unwrap();
    let nat = rules_of(&stats, Table::Nat);
    assert_eq!(
        nat.total,
        kernel_rules(&fake, Table::Nat),
        "nat after a partial sync"
    );
    assert!(
        nat.last < nat.total,
        "svc2's chains were not rewritten: {nat:?}"
    );
    let filter = rules_of(&stats, Table::Filter);
    assert_eq!(filter.total, kernel_rules(&fake, Table::Filter));
}

#[test]
fn a_failed_restore_says_which_family_and_whether_the_sync_was_partial() {
    let scenario = Scenario::parse(&scenario_yaml(&[
        two_services("10.180.0.2"),
        two_services("10.180.0.9"),
    ]));
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);

    // The first sync is full.
    fake.lock().fail_next_restore = true;
    let request = replay.request(&step, false);
    let err = proxier.sync(&request).unwrap_err();
    assert_eq!(
        err.restore_failed,
        Some(RestoreFailure {
            family: IpFamily::V4,
            partial: false
        })
    );
    proxier.sync(&request).unwrap();

    // A partial sync whose restore fails.
    let step = replay.apply(&scenario.states[1]);
    fake.lock().fail_next_restore = true;
    let request = replay.request(&step, false);
    let err = proxier.sync(&request).unwrap_err();
    assert_eq!(
        err.restore_failed,
        Some(RestoreFailure {
            family: IpFamily::V4,
            partial: true
        })
    );
}

/// The proxier's reports reach the metrics as the agent passes them on.
#[test]
fn a_failed_restore_and_the_rule_counts_reach_the_metrics() {
    use crate::serve::{Metrics, MetricsMode};

    let scenario = Scenario::parse(&scenario_yaml(&[
        two_services("10.180.0.2"),
        two_services("10.180.0.9"),
    ]));
    let fake = SharedFake::default();
    let (mut proxier, _) = new_proxier(&fake);
    let mut replay = scenario.replay();
    let metrics = Metrics::new();
    metrics.register_mode(MetricsMode::Iptables, &[IpFamily::V4, IpFamily::V6]);

    let step = replay.apply(&scenario.states[0]);
    let request = replay.request(&step, true);
    let stats = proxier.sync(&request).unwrap();
    metrics.family_reports(&stats.per_family);
    let nat = kernel_rules(&fake, Table::Nat);
    let filter = kernel_rules(&fake, Table::Filter);
    let page = metrics.render();
    for (table, count) in [("nat", nat), ("filter", filter)] {
        for family in ["total", "last"] {
            let line = format!(
                "kubeproxy_sync_proxy_rules_iptables_{family}{{ip_family=\"IPv4\",table=\"{table}\"}} {count}"
            );
            assert!(page.contains(&line), "no {line}:\n{page}");
        }
    }

    let step = replay.apply(&scenario.states[1]);
    fake.lock().fail_next_restore = true;
    let request = replay.request(&step, false);
    let err = proxier.sync(&request).unwrap_err();
    metrics.restore_failed(err.mode, &err.restore_failed.expect("a restore failed"));
    let page = metrics.render();
    for counter in ["restore", "partial_restore"] {
        let line = format!(
            "kubeproxy_sync_proxy_rules_iptables_{counter}_failures_total{{ip_family=\"IPv4\"}} 1"
        );
        assert!(page.contains(&line), "no {line}:\n{page}");
        let v6 = format!(
            "kubeproxy_sync_proxy_rules_iptables_{counter}_failures_total{{ip_family=\"IPv6\"}} 0"
        );
        assert!(page.contains(&v6), "no {v6}:\n{page}");
    }
}
