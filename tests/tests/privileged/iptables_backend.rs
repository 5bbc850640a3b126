// SPDX-License-Identifier: Apache-2.0
//! The agent uses the iptables backend the host's rules are in (upstream's image does so
//! with kubernetes-sigs/iptables-wrappers): each test builds a fresh network namespace
//! whose "host" rules sit in one backend — a kubelet-like canary chain, or only more
//! rules — and checks that the agent's detection (`CommandBackend::detect`, which every
//! iptables-based mode and cleanup use) runs that backend's commands. The rules go away
//! with the namespace, and are deleted first; the root namespace is never touched.

use proxy_agent::proxier::iptables::CommandBackend;
use proxy_agent::proxier::netfilter::{Variant, host_backend};
use tests::{privileged::TempNetns, require_root};

fn sh(ns: &TempNetns, script: &str) {
    let out = ns.sh(script);
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Both backends must be installed for there to be a choice (Debian's `iptables` package
/// ships both, as the image does).
fn both_backends_installed(ns: &TempNetns) -> bool {
    ns.sh(
        "command -v iptables-legacy-save && command -v iptables-nft-save && \
           command -v ip6tables-legacy && command -v ip6tables-nft",
    )
    .status
    .success()
}

/// What the agent detects in `ns`, uncached and through the cached entry point.
fn detected(ns: &TempNetns) -> ((&'static str, &'static str), Variant) {
    ns.run(|| {
        let names = host_backend::decide();
        let backend = CommandBackend::detect().expect("detecting iptables");
        (names, backend.version.variant)
    })
}

#[test]
fn a_kubelet_canary_in_legacy_makes_the_agent_use_legacy() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-legacy");
    if !both_backends_installed(&ns) {
        eprintln!("SKIP: iptables-legacy and iptables-nft are not both installed");
        return;
    }
    // The kubelet's chain in legacy, and more rules in nf_tables (a firewall): the
    // kubelet's chain decides.
    sh(&ns, "iptables-legacy -t mangle -N KUBE-KUBELET-CANARY");
    sh(
        &ns,
        "iptables-nft -N FW && iptables-nft -A INPUT -j FW && iptables-nft -A FW -j ACCEPT",
    );
    assert_eq!(
        detected(&ns),
        (("iptables-legacy", "ip6tables-legacy"), Variant::Legacy)
    );
    sh(
        &ns,
        "iptables-legacy -t mangle -X KUBE-KUBELET-CANARY && iptables-nft -F && iptables-nft -X",
    );
}

#[test]
fn a_kubelet_hint_in_nf_tables_makes_the_agent_use_nf_tables() {
    require_root!();
    let ns = TempNetns::new("kpe-ipt-nft");
    if !both_backends_installed(&ns) {
        eprintln!("SKIP: iptables-legacy and iptables-nft are not both installed");
        return;
    }
    // IPv6 only, with more rules in legacy: the nf_tables hint still decides.
    sh(&ns, "ip6tables-nft -t mangle -N KUBE-IPTABLES-HINT");
    sh(
        &ns,
        "iptables-legacy -A INPUT -i lo -j ACCEPT && iptables-legacy -A OUTPUT -o lo -j ACCEPT",
    );
    assert_eq!(
        detected(&ns),
        (("iptables-nft", "ip6tables-nft"), Variant::Nft)
    );
    sh(
        &ns,
        "ip6tables-nft -t mangle -X KUBE-IPTABLES-HINT && iptables-legacy -F",
    );
}

#[test]
fn without_a_kubelet_chain_the_backend_with_rules_wins_and_an_empty_host_keeps_path() {
    require_root!();
    let empty = TempNetns::new("kpe-ipt-empty");
    if !both_backends_installed(&empty) {
        eprintln!("SKIP: iptables-legacy and iptables-nft are not both installed");
        return;
    }
    // Nothing in either backend: PATH's iptables, whatever backend it is.
    let (names, _) = detected(&empty);
    assert_eq!(names, host_backend::PATH_COMMANDS);

    // A legacy firewall and nothing in nf_tables: legacy, even where PATH's is nf_tables.
    let legacy = TempNetns::new("kpe-ipt-count");
    sh(
        &legacy,
        "iptables-legacy -A INPUT -i lo -j ACCEPT && ip6tables-legacy -A INPUT -i lo -j ACCEPT",
    );
    assert_eq!(
        detected(&legacy),
        (("iptables-legacy", "ip6tables-legacy"), Variant::Legacy)
    );
    sh(&legacy, "iptables-legacy -F && ip6tables-legacy -F");
}
