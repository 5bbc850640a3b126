// SPDX-License-Identifier: Apache-2.0
//! The ruleset's shape: the endpoint choice is uniform (the slot maps' and the affinity
//! services' cascade), set objects do not grow with the services, and representative
//! services get upstream's rules.

use std::collections::BTreeMap;

use super::*;
use crate::model::{IpFamily, NamespacedName, Protocol, ServicePortName};
use crate::proxier::netfilter::names::protocol_lower;
use crate::proxier::nftables::names::{ENDPOINT_SLOT_MAPS, SlotKey, endpoint_slot_map};
use crate::proxier::nftables::ruleset::Container;
use crate::proxier::nftables::{DesiredState, NftContext, port_rules};

/// Exact fractions, so that "1/n" is checked exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fraction(u128, u128);

impl Fraction {
    fn times(self, num: u128, den: u128) -> Self {
        let (n, d) = (self.0 * num, self.1 * den);
        let g = gcd(n, d);
        Fraction(n / g, d / g)
    }
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// The probability of each target of a policy chain's endpoint choice, computed from its
/// rules: `numgen random mod M == 0 goto X` takes 1/M of what reaches it, `goto X` all.
fn choice_probabilities(rules: &[String]) -> BTreeMap<String, Fraction> {
    let mut remaining = Fraction(1, 1);
    let mut out = BTreeMap::new();
    for rule in rules {
        if let Some(rest) = rule.strip_prefix("numgen random mod ") {
            let (m, target) = rest.split_once(" == 0 goto ").expect("cascade rule");
            let m: u128 = m.parse().unwrap();
            let previous = out.insert(target.to_string(), remaining.times(1, m));
            assert!(previous.is_none(), "{target} chosen twice");
            remaining = remaining.times(m - 1, m);
        } else if let Some(target) = rule.strip_prefix("goto ") {
            out.insert(target.to_string(), remaining);
            remaining = Fraction(0, 1);
        }
    }
    assert_eq!(remaining, Fraction(0, 1), "the cascade must end in a goto");
    out
}

/// Services with ClientIP affinity keep endpoint chains, chosen by the cascade.
#[test]
fn cascade_is_uniform() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    for n in 1..=40 {
        let name = port_name("ns", "svc", "p");
        let eps = endpoints_of(0, n, false);
        let rules = port_rules(
            &name,
            &with_affinity(cluster_ip("10.96.0.10", 80)),
            &eps,
            &ctx,
        );
        let chain = rules
            .chains
            .iter()
            .find(|c| c.name.starts_with("service-"))
            .unwrap();
        let probabilities = choice_probabilities(&chain.rules);
        let endpoint_chains: Vec<&String> = rules
            .chains
            .iter()
            .map(|c| &c.name)
            .filter(|c| c.starts_with("endpoint-"))
            .collect();
        assert_eq!(probabilities.len(), n as usize);
        for target in endpoint_chains {
            assert_eq!(
                probabilities[target],
                Fraction(1, u128::from(n)),
                "{n} endpoints: {target}"
            );
        }
    }
}

/// The others DNAT in the policy chain through a slot map: one rule drawing `numgen random
/// mod n` (uniform by itself) over a key whose n elements map to the n endpoints, each
/// once, in the map of the service's protocol; no endpoint chain.
#[test]
fn slot_dispatch_maps_each_endpoint_once() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    for (n, protocol) in [(1, Protocol::Tcp), (4, Protocol::Udp), (40, Protocol::Sctp)] {
        let name = ServicePortName::new(NamespacedName::new("ns", "svc"), "p", protocol);
        let mut svc = cluster_ip("10.96.0.10", 80);
        svc.protocol = protocol;
        let eps = endpoints_of(0, n, false);
        let rules = port_rules(&name, &svc, &eps, &ctx);
        assert!(
            rules
                .chains
                .iter()
                .all(|c| !c.name.starts_with("endpoint-"))
        );
        let chain = rules
            .chains
            .iter()
            .find(|c| c.name.starts_with("service-"))
            .unwrap();
        let slots = SlotKey::of_chain(&chain.name);
        let map = endpoint_slot_map(protocol, slots.bucket);
        let l4 = protocol_lower(protocol);
        let dispatch = format!(
            "meta l4proto {l4} dnat ip to numgen random mod 1 offset {} . numgen random mod 1 offset {} . numgen random mod {n} map @{map}",
            slots.hi, slots.lo
        );
        assert_eq!(chain.rules.last(), Some(&dispatch));
        let mapped: BTreeMap<String, String> = rules
            .elements
            .iter()
            .filter(|e| e.container == Container::EndpointSlots(protocol, slots.bucket))
            .map(|e| (e.key.clone(), e.value.data.clone().unwrap()))
            .collect();
        let expected: BTreeMap<String, String> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| (slots.element(i), format!("{} . {}", ep.ip, ep.port)))
            .collect();
        assert_eq!(mapped, expected, "{n} endpoints");
        let hairpin = rules
            .elements
            .iter()
            .filter(|e| e.container == Container::HairpinEndpoints)
            .count();
        assert_eq!(hairpin, n as usize);
    }
}

/// Set objects a text creates: named sets and maps, and anonymous ones (a `{` in a rule,
/// other than the affinity update's element).
fn set_objects(text: &str) -> usize {
    text.lines()
        .filter(|l| {
            l.starts_with("add set ")
                || l.starts_with("add map ")
                || (l.starts_with("add rule ") && l.contains('{') && !l.contains("update @"))
        })
        .count()
}

#[test]
fn set_objects_do_not_grow_with_services() {
    let node = node();
    let cidrs = ["10.96.0.0/12".parse().unwrap()];
    let ctx = NftContext::new(&node, IpFamily::V4, &cidrs);
    let count = |services: u32| {
        let ports = mixed_services(services, 4, false);
        let desired =
            DesiredState::from_ports(ports.iter().map(|(n, s, e)| (n, s, e.as_slice())), &ctx);
        let text = desired.cold_load(&ctx);
        assert!(!text.contains("vmap {"), "an anonymous verdict map");
        set_objects(&text)
    };
    let small = count(16);
    assert_eq!(small, count(2000));
    // cluster-ips, six maps, affinity, nodeport-ips, the ServiceCIDRs, hairpin-endpoints,
    // and the slot maps of three protocols.
    assert_eq!(small, 11 + 3 * ENDPOINT_SLOT_MAPS as usize);
}

fn rules_of(rules: &crate::proxier::nftables::PortRules) -> String {
    let mut out = String::new();
    for chain in &rules.chains {
        out.push_str(&format!("chain {}\n", chain.name));
        for rule in &chain.rules {
            out.push_str(&format!("  {rule}\n"));
        }
    }
    for element in &rules.elements {
        let mut text = String::new();
        element.write(&mut text, true);
        out.push_str(&format!(
            "element {} {{ {text} }}\n",
            element.container.name()
        ));
    }
    out
}

#[test]
fn clusterip_with_affinity_and_hairpin() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let name = port_name("ns1", "svc1", "p80");
    let eps = vec![
        endpoint("10.180.0.1:80", false),
        endpoint("10.180.0.2:80", true),
    ];
    let text = rules_of(&port_rules(
        &name,
        &with_affinity(cluster_ip("172.30.0.41", 80)),
        &eps,
        &ctx,
    ));
    let slot = |chain: &str| crate::proxier::nftables::affinity_slot(chain);
    let e1 = "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80";
    let e2_name =
        crate::proxier::nftables::PortNames::new(&name).endpoint(&"10.180.0.2:80".parse().unwrap());
    let e2 = e2_name.as_str();
    let expected = format!(
        "chain service-ULMVA6XW-ns1/svc1/tcp/p80
  ip saddr . numgen random mod 1 offset {s1} @affinity goto {e1}
  ip saddr . numgen random mod 1 offset {s2} @affinity goto {e2}
  numgen random mod 2 == 0 goto {e1}
  goto {e2}
chain {e1}
  ip saddr 10.180.0.1 jump mark-for-masquerade
  update @affinity {{ ip saddr . numgen random mod 1 offset {s1} timeout 10800s }}
  meta l4proto tcp dnat to 10.180.0.1:80
chain {e2}
  ip saddr 10.180.0.2 jump mark-for-masquerade
  update @affinity {{ ip saddr . numgen random mod 1 offset {s2} timeout 10800s }}
  meta l4proto tcp dnat to 10.180.0.2:80
element cluster-ips {{ 172.30.0.41 }}
element service-ips {{ 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }}
",
        s1 = slot(e1),
        s2 = slot(e2),
    );
    assert_eq!(text, expected);
}

#[test]
fn no_endpoints_reject_and_local_policy_drops() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let name = port_name("ns2", "svc2", "p80");
    let mut svc = cluster_ip("172.30.0.42", 80);
    svc.node_port = Some(3001);
    svc.external_ips = vec!["192.168.99.22".parse().unwrap()];
    let none = port_rules(&name, &svc, &[], &ctx);
    assert_eq!(
        rules_of(&none),
        "element cluster-ips { 172.30.0.42 }
element no-endpoint-services { 172.30.0.42 . tcp . 80 comment \"ns2/svc2:p80\" : goto reject-chain }
element no-endpoint-services { 192.168.99.22 . tcp . 80 comment \"ns2/svc2:p80\" : goto reject-chain }
element no-endpoint-nodeports { tcp . 3001 comment \"ns2/svc2:p80\" : goto reject-chain }
"
    );
    // eTP=Local without a local endpoint: external traffic dropped, except what the
    // external chain short-circuits (pods, the node itself).
    svc.external_policy_local = true;
    let remote = port_rules(&name, &svc, &[endpoint("10.180.0.2:80", false)], &ctx);
    assert!(remote.no_local_external && !remote.no_local_internal);
    let text = rules_of(&remote);
    let ext = "external-";
    assert!(text.contains(&format!("chain {ext}")), "{text}");
    assert!(
        text.contains("  ip saddr 10.0.0.0/8 goto service-"),
        "{text}"
    );
    assert!(text.contains(
        "  fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n"
    ));
    assert!(
        text.contains("  fib saddr type local goto service-"),
        "{text}"
    );
    assert!(!text.contains("goto local-"), "no local endpoint: {text}");
    assert!(
        text.contains(
            "element no-endpoint-nodeports { tcp . 3001 comment \"ns2/svc2:p80\" : drop }"
        )
    );
    // Dropped when it comes from elsewhere only: not in the map filter-output checks.
    assert!(text.contains(
        "element no-local-endpoint-external { 192.168.99.22 . tcp . 80 comment \"ns2/svc2:p80\" : drop }"
    ));
    assert!(!text.contains("element no-endpoint-services { 192.168.99.22"));
    assert!(text.contains("element service-nodeports { tcp . 3001 : goto external-"));
    // iTP=Local without a local endpoint: the ClusterIP drops.
    let mut itp = cluster_ip("172.30.0.43", 80);
    itp.internal_policy_local = true;
    let text = rules_of(&port_rules(
        &name,
        &itp,
        &[endpoint("10.180.0.2:80", false)],
        &ctx,
    ));
    assert_eq!(
        text,
        "element cluster-ips { 172.30.0.43 }
element no-endpoint-services { 172.30.0.43 . tcp . 80 comment \"ns2/svc2:p80\" : drop }
"
    );
}

#[test]
fn load_balancer_source_ranges_admit_the_node_and_lb_ips() {
    let node = node();
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let name = port_name("ns5", "svc5", "p80");
    let mut svc = cluster_ip("172.30.0.45", 80);
    svc.node_port = Some(3002);
    svc.load_balancer_ingress = vec![crate::model::LoadBalancerIngress {
        ip: "5.6.7.8".parse().unwrap(),
        ip_mode: crate::model::LoadBalancerIpMode::Vip,
    }];
    svc.load_balancer_source_ranges = vec![
        "203.0.113.0/25".parse().unwrap(),
        "192.168.0.0/24".parse().unwrap(),
    ];
    let rules = port_rules(&name, &svc, &[endpoint("10.180.0.3:80", false)], &ctx);
    let fw = rules
        .chains
        .iter()
        .find(|c| c.name.starts_with("firewall-"))
        .unwrap();
    // 192.168.0.0/24 holds the node's address: LB IPs may be sources too.
    assert_eq!(
        fw.rules,
        [
            "ip saddr 203.0.113.0/25 return",
            "ip saddr 192.168.0.0/24 return",
            "ip saddr 5.6.7.8 return",
            "drop"
        ]
    );
    let text = rules_of(&rules);
    assert!(text.contains(&format!(
        "element firewall-ips {{ 5.6.7.8 . tcp . 80 : goto {} }}",
        fw.name
    )));
    assert!(text.contains("element service-ips { 5.6.7.8 . tcp . 80 : goto external-"));
    assert!(text.contains("element service-nodeports { tcp . 3002 : goto external-"));
    // eTP=Cluster: external traffic is masqueraded, then the cluster chain.
    let ext = rules
        .chains
        .iter()
        .find(|c| c.name.starts_with("external-"))
        .unwrap();
    assert_eq!(ext.rules[0], "jump mark-for-masquerade");
    assert!(ext.rules[1].starts_with("goto service-"));
}

#[test]
fn ipv6_service() {
    let node = node();
    let cidrs = ["fd00:96::/112".parse().unwrap()];
    let ctx = NftContext::new(&node, IpFamily::V6, &cidrs);
    let name = port_name("ns6", "svc6", "p80");
    let mut svc = cluster_ip("fd00:96::10", 80);
    svc.node_port = Some(3006);
    let rules = port_rules(&name, &svc, &[endpoint("[fd00:10::3]:8080", true)], &ctx);
    let text = rules_of(&rules);
    assert!(
        text.contains(" numgen random mod 1 map @endpoint-slots-tcp-"),
        "{text}"
    );
    assert!(text.contains(" : fd00:10::3 . 8080 }"), "{text}");
    assert!(
        text.contains("element hairpin-endpoints { fd00:10::3 . fd00:10::3 }"),
        "{text}"
    );
    // With affinity: upstream's endpoint chains.
    let with_chains = rules_of(&port_rules(
        &name,
        &with_affinity(svc.clone()),
        &[endpoint("[fd00:10::3]:8080", true)],
        &ctx,
    ));
    assert!(
        with_chains
            .contains("__fd00.10..3/8080\n  ip6 saddr fd00:10::3 jump mark-for-masquerade\n"),
        "{with_chains}"
    );
    assert!(
        with_chains.contains("  meta l4proto tcp dnat to [fd00:10::3]:8080\n"),
        "{with_chains}"
    );
    assert!(text.contains("element service-ips { fd00:96::10 . tcp . 80 : goto service-"));
    let base = crate::proxier::nftables::base(&ctx);
    assert!(
        base.contains("add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:96::/112 } drop")
    );
    assert!(base.contains("add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports"));
    assert!(base.contains("typeof ip6 saddr . numgen random mod 1"));
    assert!(base.contains(
        "add rule ip6 kube-proxy services ip6 daddr @cluster-ips ip6 saddr != fd00:10::/64 jump mark-for-masquerade\n"
    ));
    assert!(base.contains(": ip6 daddr . udp dport ; }"));
    assert!(base.contains(
        "ct status dnat ip6 saddr . ip6 daddr @hairpin-endpoints jump mark-for-masquerade"
    ));
}

#[test]
fn nodeport_addresses_and_masquerade_all() {
    let mut node = node();
    node.nodeport_addresses = Some(vec![
        "192.168.0.2".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
    ]);
    node.masquerade_all = true;
    let ctx = NftContext::new(&node, IpFamily::V4, &[]);
    let base = crate::proxier::nftables::base(&ctx);
    // Loopback is never a NodePort address in this mode.
    assert!(
        base.contains("add element ip kube-proxy nodeport-ips { 192.168.0.2 }\n"),
        "{base}"
    );
    assert!(base.contains("add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n"));
    assert!(base.contains("add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports\n"));
    assert!(
        !base.contains("cluster-ips-check ip daddr {"),
        "no ServiceCIDRs known"
    );
    // masqueradeAll: every connection to a ClusterIP, whatever its source, before the
    // dispatch to the service's chain.
    let marks = base
        .find("add rule ip kube-proxy services ip daddr @cluster-ips jump mark-for-masquerade\n")
        .expect("the masquerade-all rule");
    let dispatch = base
        .find("add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n")
        .expect("the dispatch");
    assert!(marks < dispatch, "{base}");
}
