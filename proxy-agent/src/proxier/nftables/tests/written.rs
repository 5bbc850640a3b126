// SPDX-License-Identifier: Apache-2.0
//! The written-state bookkeeping: what partial transactions add, replace and delete, and
//! when stale chains go.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::model::{IpFamily, Protocol};
use crate::proxier::nftables::names::{PortChain, SlotKey, endpoint_slot_map};
use crate::proxier::nftables::{
    DesiredState, NftContext, PortNames, PortRules, Written, port_rules,
};

type Port = (ServicePortName, ServicePort, Vec<Arc<Endpoint>>);

fn desired(ports: &[Port], ctx: &NftContext<'_>) -> DesiredState {
    DesiredState::from_ports(ports.iter().map(|(n, s, e)| (n, s, e.as_slice())), ctx)
}

/// The partial transaction for `changed` services given the ports they have now.
fn partial(
    written: &mut Written,
    ports: &[Port],
    changed: &[&str],
    ctx: &NftContext<'_>,
    now: Instant,
) -> String {
    let changed: HashSet<NamespacedName> = changed
        .iter()
        .map(|n| NamespacedName::new("ns", *n))
        .collect();
    let rules: BTreeMap<ServicePortName, PortRules> = ports
        .iter()
        .filter(|(n, _, _)| changed.contains(&n.service))
        .map(|(n, s, e)| (n.clone(), port_rules(n, s, e, ctx)))
        .collect();
    let base = crate::proxier::nftables::base(ctx);
    written.partial(&base, &changed, &rules, ctx, now).0
}

fn lines_with<'a>(text: &'a str, part: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(part)).collect()
}

/// Two services with ClientIP affinity: they have endpoint chains, whose retirement the
/// tests follow.
fn two_services() -> Vec<Port> {
    two_services_without_affinity()
        .into_iter()
        .map(|(name, svc, eps)| (name, with_affinity(svc), eps))
        .collect()
}

/// The same two, DNATing through the slot maps.
fn two_services_without_affinity() -> Vec<Port> {
    vec![
        (
            port_name("ns", "a", "p"),
            cluster_ip("10.96.0.1", 80),
            vec![
                endpoint("10.1.0.1:80", false),
                endpoint("10.1.0.2:80", false),
            ],
        ),
        (
            port_name("ns", "b", "p"),
            cluster_ip("10.96.0.2", 80),
            vec![endpoint("10.1.0.3:80", false)],
        ),
    ]
}

#[test]
fn nothing_changed_writes_nothing_but_the_table() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let ports = two_services();
    let mut written = Written::default();
    let now = Instant::now();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), now);
    let text = partial(&mut written, &ports, &[], &ctx, now);
    assert_eq!(
        text,
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n"
    );
    // A reported but identical service: its chains are rewritten, no element moves.
    let text = partial(&mut written, &ports, &["a"], &ctx, now);
    assert!(lines_with(&text, "element").is_empty(), "{text}");
    assert_eq!(lines_with(&text, "flush chain").len(), 3, "{text}");
    assert!(lines_with(&text, "ns/b/").is_empty(), "{text}");
}

#[test]
fn a_removed_endpoint_rewrites_its_service_and_retires_its_chain() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let mut ports = two_services();
    let mut written = Written::default();
    let t0 = Instant::now();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), t0);
    ports[0].2.pop();
    let text = partial(&mut written, &ports, &["a"], &ctx, t0);
    let gone = crate::proxier::nftables::PortNames::new(&ports[0].0)
        .endpoint(&"10.1.0.2:80".parse().unwrap());
    assert!(
        text.ends_with(&format!("flush chain ip kube-proxy {gone}\n")),
        "{text}"
    );
    assert!(!text.contains(&format!("add chain ip kube-proxy {gone}")));
    assert!(lines_with(&text, "element").is_empty(), "{text}");
    assert!(text.contains("numgen") || text.contains(" goto endpoint-"));
    assert_eq!(written.stale_chains().collect::<Vec<_>>(), [gone.as_str()]);
    // Deleted a second later, in a transaction of its own.
    assert_eq!(
        written.stale_chain_deletion(&ctx, t0 + Duration::from_millis(500)),
        None
    );
    assert_eq!(
        written.stale_chain_deletion(&ctx, t0 + Duration::from_secs(1)),
        Some(format!("delete chain ip kube-proxy {gone}\n"))
    );
    assert_eq!(written.stale_chains().count(), 0);
}

#[test]
fn a_returning_chain_is_no_longer_stale() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let mut ports = two_services();
    let full = ports.clone();
    let mut written = Written::default();
    let t0 = Instant::now();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), t0);
    ports[0].2.pop();
    partial(&mut written, &ports, &["a"], &ctx, t0);
    let text = partial(&mut written, &full, &["a"], &ctx, t0);
    let back = crate::proxier::nftables::PortNames::new(&full[0].0)
        .endpoint(&"10.1.0.2:80".parse().unwrap());
    // It may still hold rules (flushed, not deleted): flushed again, then written.
    assert!(
        text.contains(&format!(
            "add chain ip kube-proxy {back}\nflush chain ip kube-proxy {back}\n"
        )),
        "{text}"
    );
    assert_eq!(written.stale_chains().count(), 0);
    assert_eq!(
        written.stale_chain_deletion(&ctx, t0 + Duration::from_secs(5)),
        None
    );
}

#[test]
fn a_removed_service_loses_its_elements_and_chains() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let ports = two_services();
    let mut written = Written::default();
    let now = Instant::now();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), now);
    let text = partial(&mut written, &ports[1..], &["a"], &ctx, now);
    assert_eq!(
        lines_with(&text, "element"),
        [
            "delete element ip kube-proxy cluster-ips { 10.96.0.1 }",
            "delete element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 }",
        ]
    );
    assert_eq!(lines_with(&text, "flush chain").len(), 3);
    assert!(
        lines_with(&text, "add ").len() == 1,
        "only the table: {text}"
    );
    assert_eq!(written.port_count(), 1);
}

#[test]
fn losing_every_endpoint_moves_the_service_to_the_reject_map() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let mut ports = two_services();
    let mut written = Written::default();
    let now = Instant::now();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), now);
    ports[1].2.clear();
    let text = partial(&mut written, &ports, &["b"], &ctx, now);
    assert_eq!(
        lines_with(&text, "element"),
        [
            "delete element ip kube-proxy service-ips { 10.96.0.2 . tcp . 80 }",
            "add element ip kube-proxy no-endpoint-services { 10.96.0.2 . tcp . 80 comment \"ns/b:p\" : goto reject-chain }",
        ]
    );
}

#[test]
fn a_key_two_services_claim_goes_to_the_first_by_name() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let mut ports = two_services();
    for (_, svc, _) in &mut ports {
        svc.external_ips = vec!["192.0.2.1".parse().unwrap()];
    }
    let mut written = Written::default();
    let now = Instant::now();
    let (full, _) = written.full(&desired(&ports, &ctx), &ctx, Some(&[]), now);
    let external = |svc: &str| {
        let chain = crate::proxier::nftables::PortNames::new(&port_name("ns", svc, "p"))
            .chain(crate::proxier::nftables::names::PortChain::External);
        format!("192.0.2.1 . tcp . 80 : goto {chain}")
    };
    assert!(full.contains(&external("a")));
    assert!(!full.contains(&external("b")));
    let text = partial(&mut written, &ports[1..], &["a"], &ctx, now);
    assert!(text.contains("delete element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80, 192.0.2.1 . tcp . 80 }"), "{text}");
    assert!(
        text.contains(&format!(
            "add element ip kube-proxy service-ips {{ {} }}",
            external("b")
        )),
        "{text}"
    );
}

#[test]
fn a_first_full_sync_recreates_base_chains_and_retires_listed_chains() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let ports = two_services();
    let mut written = Written::default();
    let old = "service-OLDHASH1-ns/old/tcp/p".to_string();
    let listing = [old.clone(), "services".to_string()];
    let (text, stats) = written.full(&desired(&ports, &ctx), &ctx, Some(&listing), Instant::now());
    assert!(text.contains(
        "add chain ip kube-proxy nat-prerouting\ndelete chain ip kube-proxy nat-prerouting\n"
    ));
    assert!(
        text.ends_with(&format!("flush chain ip kube-proxy {old}\n")),
        "{text}"
    );
    assert_eq!(stats.chains_flushed_stale, 1);
    assert_eq!(written.stale_chains().collect::<Vec<_>>(), [old.as_str()]);
    // Listed: only listed chains are flushed. Unlisted: every chain may exist.
    let flushed_port_chains = |text: &str| {
        lines_with(text, "flush chain")
            .into_iter()
            .filter(|l| l.contains('/'))
            .count()
    };
    assert_eq!(flushed_port_chains(&text), 1);
    let (again, _) = Written::default().full(&desired(&ports, &ctx), &ctx, None, Instant::now());
    assert_eq!(flushed_port_chains(&again), 5);
    // The second full sync of a run keeps the base chains.
    let (second, _) = written.full(&desired(&ports, &ctx), &ctx, Some(&[]), Instant::now());
    assert!(!second.contains("delete chain"));
    assert_eq!(flushed_port_chains(&second), 5 + 1);
}

#[test]
fn vanished_ports_are_found() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let ports = two_services();
    let mut written = Written::default();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), Instant::now());
    let vanished = written.vanished(|p| p.service.name() == "a");
    assert_eq!(vanished, [NamespacedName::new("ns", "b")]);
}

/// Without affinity an endpoint change moves elements only: the policy chain is rewritten
/// (its `mod n`), the slot past the end and the endpoint's hairpin pair go, and no chain is
/// retired. A hairpin pair two services claim stays while one still does.
#[test]
fn slot_elements_follow_endpoint_changes() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let mut ports = two_services_without_affinity();
    ports[1].2.push(endpoint("10.1.0.2:8080", false));
    let mut written = Written::default();
    let t0 = Instant::now();
    written.full(&desired(&ports, &ctx), &ctx, Some(&[]), t0);
    let chain = PortNames::new(&ports[0].0).chain(PortChain::Cluster);
    let slots = SlotKey::of_chain(&chain);
    let map = endpoint_slot_map(Protocol::Tcp, slots.bucket);

    ports[0].2.pop();
    let text = partial(&mut written, &ports, &["a"], &ctx, t0);
    assert_eq!(
        lines_with(&text, "element"),
        [format!(
            "delete element ip kube-proxy {map} {{ {} }}",
            slots.element(1)
        )],
        "10.1.0.2 is still b's endpoint: its hairpin pair stays\n{text}"
    );
    assert_eq!(
        lines_with(&text, "flush chain"),
        [format!("flush chain ip kube-proxy {chain}")]
    );
    assert!(text.contains(" numgen random mod 1 map @"), "{text}");
    assert_eq!(written.stale_chains().count(), 0);

    ports[1].2.pop();
    let text = partial(&mut written, &ports, &["b"], &ctx, t0);
    assert!(
        text.contains("delete element ip kube-proxy hairpin-endpoints { 10.1.0.2 . 10.1.0.2 }"),
        "{text}"
    );

    ports[0].2.push(endpoint("10.1.0.9:80", false));
    let text = partial(&mut written, &ports, &["a"], &ctx, t0);
    assert_eq!(
        lines_with(&text, "element"),
        [
            format!(
                "add element ip kube-proxy {map} {{ {} : 10.1.0.9 . 80 }}",
                slots.element(1)
            ),
            "add element ip kube-proxy hairpin-endpoints { 10.1.0.9 . 10.1.0.9 }".to_string(),
        ]
    );
}
