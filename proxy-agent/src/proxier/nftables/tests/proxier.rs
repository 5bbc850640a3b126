// SPDX-License-Identifier: Apache-2.0
//! The proxier over a recording transport: which transaction each sync runs (full first,
//! partial after, full again after a failure or a flush), what it reports, and the
//! stale-chain deletion as a transaction of its own before the sync's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use super::golden::all_scenarios;
use crate::model::{IpFamily, NamespacedName};
use crate::proxier::conntrack::fake::FakeConntrack;
use crate::proxier::iptables::tests::scenario::{Replay, Scenario};
use crate::proxier::netfilter::ExecError;
use crate::proxier::nftables::{NftTransport, NftablesProxier};
use crate::proxier::{Proxier, StaleConntrack, SyncRequest};

/// What the fake kernel saw and how it answers.
#[derive(Debug, Default)]
struct Kernel {
    scripts: Vec<String>,
    /// The next `run` fails.
    fail_next: bool,
    /// Whether the dispatch chain holds rules (false: someone flushed the table).
    dispatch_present: bool,
}

#[derive(Clone, Default)]
struct FakeNft(Arc<Mutex<Kernel>>);

impl FakeNft {
    fn kernel(&self) -> std::sync::MutexGuard<'_, Kernel> {
        self.0.lock().unwrap()
    }

    fn take_scripts(&self) -> Vec<String> {
        std::mem::take(&mut self.kernel().scripts)
    }
}

impl NftTransport for FakeNft {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let mut kernel = self.kernel();
        if std::mem::take(&mut kernel.fail_next) {
            return Err(ExecError::Failed {
                program: "nft -f -".into(),
                status: "exit status: 1".into(),
                stderr:
                    "/dev/stdin:3:1-4: Error: Could not process rule: No such file or directory"
                        .into(),
                line: None,
            });
        }
        kernel.scripts.push(script.to_string());
        kernel.dispatch_present = true;
        Ok(())
    }

    fn list_chains(&mut self, _: IpFamily) -> Result<Vec<String>, ExecError> {
        Ok(Vec::new())
    }

    fn chain_has_rules(&mut self, _: IpFamily, _: &str) -> Result<bool, ExecError> {
        Ok(self.kernel().dispatch_present)
    }
}

fn proxier() -> (NftablesProxier, FakeNft) {
    let fake = FakeNft::default();
    let proxier = NftablesProxier::new(Box::new(fake.clone()), Box::new(FakeConntrack::default()));
    (proxier, fake)
}

fn scenario(name: &str) -> Scenario {
    all_scenarios()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name}"))
}

/// A proxier that synced the scenario's first state (its transactions taken), with the
/// replay it came from.
fn after_first_sync(scenario: &Scenario) -> (Replay, NftablesProxier, FakeNft) {
    let mut replay = scenario.replay();
    let (mut proxier, fake) = proxier();
    let step = replay.apply(&scenario.states[0]);
    proxier.sync(&replay.request(&step, false)).unwrap();
    fake.take_scripts();
    (replay, proxier, fake)
}

fn is_full(script: &str) -> bool {
    script.contains("flush map ip kube-proxy service-ips")
        || script.contains("flush map ip6 kube-proxy service-ips")
}

#[test]
fn first_sync_is_full_then_partial_with_only_the_changed_service() {
    let scenario = scenario("l5-incremental-updates");
    let mut replay = scenario.replay();
    let (mut proxier, fake) = proxier();
    let step = replay.apply(&scenario.states[0]);
    let stats = proxier.sync(&replay.request(&step, false)).unwrap();
    let scripts = fake.take_scripts();
    // One transaction per family with a model (both families are synced).
    assert_eq!(scripts.len(), 2, "{scripts:#?}");
    assert!(scripts.iter().all(|s| is_full(s)), "{scripts:#?}");
    assert!(scripts[0].contains("add table ip kube-proxy"));
    assert!(scripts[1].contains("add table ip6 kube-proxy"));
    assert!(stats.services > 0 && stats.written > 0, "{stats:?}");
    assert_eq!(stats.per_family.len(), 2);

    for (i, state) in scenario.states.iter().enumerate().skip(1) {
        let step = replay.apply(state);
        proxier.sync(&replay.request(&step, false)).unwrap();
        let scripts = fake.take_scripts();
        assert!(
            scripts.iter().all(|s| !is_full(s)),
            "state {i}: a partial sync flushed a map: {scripts:#?}"
        );
        for script in &scripts {
            // Only the changed services' chains are written.
            for line in script.lines().filter(|l| l.starts_with("add rule")) {
                let chain = line.split_whitespace().nth(4).unwrap();
                if !chain.starts_with("service-")
                    && !chain.starts_with("endpoint-")
                    && !chain.starts_with("external-")
                    && !chain.starts_with("firewall-")
                {
                    continue;
                }
                assert!(
                    step.changed.iter().any(|svc| chain.contains(&format!(
                        "{}/{}/",
                        svc.namespace(),
                        svc.name()
                    ))),
                    "state {i}: {chain} written though its service did not change ({:?})",
                    step.changed
                );
            }
        }
    }
}

#[test]
fn a_failed_transaction_is_reported_and_the_next_sync_is_full() {
    let scenario = scenario("l5-incremental-updates");
    let (mut replay, mut proxier, fake) = after_first_sync(&scenario);

    let step = replay.apply(&scenario.states[1]);
    fake.kernel().fail_next = true;
    let err = proxier.sync(&replay.request(&step, false)).unwrap_err();
    assert_eq!(err.mode, "nftables");
    let failure = err.restore_failed.expect("the failed transaction is named");
    assert_eq!(failure.family, IpFamily::V4);
    assert!(failure.partial, "a partial sync failed");
    assert!(
        err.to_string().contains("nftables transaction failed"),
        "{err}"
    );

    // The runner retries; even a partial request is then full.
    proxier.sync(&replay.request(&step, false)).unwrap();
    let scripts = fake.take_scripts();
    assert!(is_full(&scripts[0]), "{}", scripts[0]);
}

#[test]
fn a_flushed_table_is_noticed_and_rewritten_in_full() {
    let scenario = scenario("c1-clusterip-general");
    let (replay, mut proxier, fake) = after_first_sync(&scenario);
    assert!(!proxier.needs_full_resync(), "nothing happened yet");

    fake.kernel().dispatch_present = false;
    assert!(proxier.needs_full_resync());
    let empty = crate::proxier::iptables::tests::scenario::Step {
        changed: HashSet::<NamespacedName>::new(),
        stale: StaleConntrack::default(),
    };
    proxier.sync(&replay.request(&empty, false)).unwrap();
    let scripts = fake.take_scripts();
    assert!(is_full(&scripts[0]), "{}", scripts[0]);
}

#[test]
fn stale_chains_are_deleted_by_a_transaction_of_their_own_a_second_later() {
    let scenario = scenario("l5-incremental-updates");
    let (mut replay, mut proxier, fake) = after_first_sync(&scenario);
    // A state without the services: their chains are flushed, not deleted.
    let step = replay.apply(&[]);
    proxier.sync(&replay.request(&step, false)).unwrap();
    let scripts = fake.take_scripts();
    assert!(
        scripts
            .iter()
            .any(|s| s.contains("flush chain ip kube-proxy service-")),
        "{scripts:#?}"
    );
    assert!(scripts.iter().all(|s| !s.contains("delete chain")));

    std::thread::sleep(crate::proxier::nftables::STALE_CHAIN_DELAY);
    let nothing = replay.apply(&[]);
    let stats = proxier.sync(&replay.request(&nothing, false)).unwrap();
    let scripts = fake.take_scripts();
    let deletion = &scripts[0];
    assert!(
        deletion
            .lines()
            .all(|l| l.starts_with("delete chain ip kube-proxy ")),
        "{deletion}"
    );
    assert!(stats.deleted >= deletion.lines().count(), "{stats:?}");
    assert!(stats.per_family.iter().all(|f| !f.nftables_cleanup_failed));
}

#[test]
fn no_local_endpoint_counts_cover_the_whole_table_in_partial_syncs() {
    let mut seen = (0, 0);
    for scenario in all_scenarios() {
        let mut replay = scenario.replay();
        let (mut proxier, _fake) = proxier();
        for (i, state) in scenario.states.iter().enumerate() {
            let step = replay.apply(state);
            let stats = proxier.sync(&replay.request(&step, false)).unwrap();
            let (mut fresh, _) = self::proxier();
            let expected = fresh.sync(&replay.request(&step, true)).unwrap();
            let counts = |s: &crate::proxier::SyncStats| {
                (s.no_local_endpoints_internal, s.no_local_endpoints_external)
            };
            assert_eq!(
                counts(&stats),
                counts(&expected),
                "{} state {i}",
                scenario.name
            );
            seen.0 += stats.no_local_endpoints_internal;
            seen.1 += stats.no_local_endpoints_external;
        }
    }
    assert!(
        seen.0 > 0 && seen.1 > 0,
        "the scenarios have services of both policies without a local endpoint: {seen:?}"
    );
}

#[test]
fn request_families_without_services_still_get_their_table() {
    let (mut proxier, fake) = proxier();
    let replay = Scenario::parse(
        "name: empty\nnode: {name: test-node, addresses: [192.168.0.2/24]}\nobjects: []\n",
    )
    .replay();
    let step = crate::proxier::iptables::tests::scenario::Step {
        changed: HashSet::new(),
        stale: StaleConntrack::default(),
    };
    let request: SyncRequest<'_> = replay.request(&step, true);
    proxier.sync(&request).unwrap();
    let scripts = fake.take_scripts();
    assert_eq!(scripts.len(), 2);
    assert!(scripts[0].contains("add chain ip kube-proxy nat-prerouting"));
}
