// SPDX-License-Identifier: Apache-2.0
//! The shapes, without privileges.

use std::net::{Ipv4Addr, SocketAddrV4};

use super::{
    iptables::{probability, sep_chain, svc_chain},
    nft::{endpoint_chain, service_chain},
    *,
};

fn svc(ns: &str, name: &str, port_name: &str, ip: [u8; 4], eps: &[[u8; 4]]) -> ShapedService {
    ShapedService {
        namespace: ns.into(),
        name: name.into(),
        port_name: port_name.into(),
        cluster_ip: Ipv4Addr::from(ip),
        port: 80,
        endpoints: eps
            .iter()
            .map(|ip| SocketAddrV4::new(Ipv4Addr::from(*ip), 80))
            .collect(),
    }
}

fn opts() -> ShapedOptions {
    ShapedOptions {
        cluster_cidr: Some("10.0.0.0/8".parse().unwrap()),
    }
}

fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

/// Upstream's test data names these chains so: same hash, same names.
#[test]
fn chain_names_are_upstreams() {
    let s = svc("ns1", "svc1", "p80", [172, 30, 0, 41], &[[10, 180, 0, 1]]);
    assert_eq!(svc_chain(&s), "KUBE-SVC-XPGD46QRK7WJZT7O");
    assert_eq!(sep_chain(&s, &s.endpoints[0]), "KUBE-SEP-SXIVWICOYRO3J4NJ");
    assert_eq!(service_chain(&s), "service-ULMVA6XW-ns1/svc1/tcp/p80");
    assert_eq!(
        endpoint_chain(&s, &s.endpoints[0]),
        "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    );
    let s2 = svc("ns2", "svc2", "p80", [172, 30, 0, 42], &[[10, 180, 0, 2]]);
    assert_eq!(svc_chain(&s2), "KUBE-SVC-GNZBNJ2PO5MGZ6GT");
    assert_eq!(
        sep_chain(&s2, &s2.endpoints[0]),
        "KUBE-SEP-RS4RBKLTHTF2IUXJ"
    );
}

#[test]
fn iptables_full_has_upstreams_rule_shapes() {
    let s = svc(
        "ns4",
        "svc4",
        "p80",
        [172, 30, 0, 44],
        &[[10, 180, 0, 4], [10, 180, 0, 5]],
    );
    let text = iptables_full(std::slice::from_ref(&s), &opts());
    for line in [
        "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK",
        "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
        "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.4:80\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC",
        "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.5:80\" -j KUBE-SEP-C6EBXVWJJZMIWKLZ",
        "-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ",
        "-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        ":KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    assert!(text.starts_with("*nat\n") && text.ends_with("COMMIT\n"));
    // The NodePort rule stays last in KUBE-SERVICES.
    let services = lines_with(&text, "-A KUBE-SERVICES");
    assert!(services.last().unwrap().contains("KUBE-NODEPORTS"));
    // Without a cluster CIDR, no masquerade rule for outside sources.
    let plain = iptables_full(&[s], &ShapedOptions::default());
    assert!(lines_with(&plain, "! -s").is_empty());
}

#[test]
fn probabilities_pick_each_endpoint_evenly() {
    let s = &fillers(1, 4)[0];
    let text = iptables_full(std::slice::from_ref(s), &ShapedOptions::default());
    let rules = lines_with(&text, &format!("-A {} ", svc_chain(s)));
    let probs: Vec<&str> = rules
        .iter()
        .map(|r| r.split("--probability ").nth(1).map_or("", |p| &p[..12]))
        .collect();
    assert_eq!(probs, ["0.2500000000", "0.3333333333", "0.5000000000", ""]);
    assert_eq!(probability(1), "1.0000000000");
}

#[test]
fn services_keep_the_given_order_and_output_is_deterministic() {
    let mut list = fillers(5, 2);
    list.rotate_left(2);
    let text = iptables_full(&list, &ShapedOptions::default());
    assert_eq!(text, iptables_full(&list, &ShapedOptions::default()));
    let order: Vec<String> = lines_with(&text, "-A KUBE-SERVICES")
        .iter()
        .filter_map(|l| l.split("-j ").nth(1).map(str::to_string))
        .collect();
    let mut expected: Vec<String> = list.iter().map(svc_chain).collect();
    expected.push("KUBE-NODEPORTS".into());
    assert_eq!(order, expected);
    let nft = nft_full(&list, &ShapedOptions::default());
    assert_eq!(nft, nft_full(&list, &ShapedOptions::default()));
    let first = nft.find(&service_chain(&list[0])).unwrap();
    let last = nft.find(&service_chain(&list[4])).unwrap();
    assert!(first < last);
}

#[test]
fn fillers_have_distinct_addresses() {
    let list = fillers(3000, 4);
    let ips: std::collections::BTreeSet<_> = list.iter().map(|s| s.cluster_ip).collect();
    let eps: std::collections::BTreeSet<_> =
        list.iter().flat_map(|s| s.endpoints.clone()).collect();
    assert_eq!(ips.len(), 3000);
    assert_eq!(eps.len(), 12_000);
    let scaled = Change::ScaleTo {
        service: 2999,
        endpoints: 40,
    }
    .apply(&list);
    let more: std::collections::BTreeSet<_> =
        scaled.iter().flat_map(|s| s.endpoints.clone()).collect();
    assert_eq!(more.len(), 12_036);
    assert_eq!(scaled[2999].endpoints[..4], list[2999].endpoints[..]);
}

/// The chain declarations (and deletions) of a partial text.
fn declared(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix(':').and_then(|l| l.split(' ').next()))
        .collect()
}

#[test]
fn iptables_partial_writes_only_what_changed() {
    let before = fillers(10, 4);
    let o = ShapedOptions::default();

    // Add a service: top-level chains, its SVC and SEP chains, nothing else.
    let new = svc("ns", "new", "", [10, 99, 0, 1], &[[10, 98, 0, 1]]);
    let after = Change::AddService(new.clone()).apply(&before);
    let text = iptables_partial(&before, &after, &o);
    let mut want = vec![
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ];
    let (svc_new, sep_new) = (svc_chain(&new), sep_chain(&new, &new.endpoints[0]));
    want.extend([svc_new.as_str(), sep_new.as_str()]);
    assert_eq!(declared(&text), want);
    assert_eq!(lines_with(&text, "-A KUBE-SERVICES").len(), 12);
    assert!(lines_with(&text, "-X").is_empty());
    assert!(lines_with(&text, "PREROUTING").is_empty());
    assert!(
        lines_with(&text, &svc_chain(&before[0])).len() == 1,
        "only its jump"
    );

    // Remove an endpoint: the SVC and remaining SEP chains rewritten, the lost SEP deleted.
    let after = Change::RemoveEndpoint { service: 3 }.apply(&before);
    let text = iptables_partial(&before, &after, &o);
    let gone = sep_chain(&before[3], &before[3].endpoints[3]);
    let decl = declared(&text);
    assert_eq!(decl.len(), 4 + 1 + 3 + 1);
    assert!(decl.contains(&gone.as_str()));
    assert_eq!(lines_with(&text, "-X "), [format!("-X {gone}")]);
    assert_eq!(lines_with(&text, &format!("-A {gone}")).len(), 0);
    assert_eq!(lines_with(&text, "--probability").len(), 2);

    // Scale 4 -> 40: one SVC chain with 40 endpoint rules, 40 SEP chains, no deletion.
    let after = Change::ScaleTo {
        service: 9,
        endpoints: 40,
    }
    .apply(&before);
    let text = iptables_partial(&before, &after, &o);
    assert_eq!(declared(&text).len(), 4 + 1 + 40);
    assert_eq!(
        lines_with(&text, &format!("-A {} ", svc_chain(&after[9]))).len(),
        40
    );
    assert!(lines_with(&text, "-X").is_empty());

    // Nothing changed: only the top-level chains.
    assert_eq!(declared(&iptables_partial(&before, &before, &o)).len(), 4);

    // A removed service: its chains flushed and deleted.
    let text = iptables_partial(&before, &before[1..], &o);
    assert_eq!(lines_with(&text, "-X ").len(), 5);
}

#[test]
fn nft_full_has_upstreams_shapes() {
    let s = svc("ns1", "svc1", "p80", [172, 30, 0, 41], &[[10, 180, 0, 1]]);
    let text = nft_full(std::slice::from_ref(&s), &opts());
    for line in [
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }",
        "flush table ip kube-proxy",
        "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }",
        "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
        "add rule ip kube-proxy nat-output jump services",
        "add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80",
        "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
        "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }",
        "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade",
        "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80",
        "add element ip kube-proxy cluster-ips { 172.30.0.41 }",
        "add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    let four = &fillers(1, 4)[0];
    let text = nft_full(std::slice::from_ref(four), &ShapedOptions::default());
    let vmap = lines_with(&text, "numgen");
    assert_eq!(vmap.len(), 1);
    assert!(vmap[0].contains("mod 4 vmap { 0 : goto endpoint-"));
    assert!(vmap[0].contains(" , 3 : goto endpoint-"));
    assert!(lines_with(&text, "flush chain").is_empty());
}

#[test]
fn nft_update_writes_only_what_changed() {
    let before = fillers(10, 4);
    let o = ShapedOptions::default();
    let only_table = |t: &str| t.lines().filter(|l| !l.starts_with("add table")).count();

    let new = svc("ns", "new", "", [10, 99, 0, 1], &[[10, 98, 0, 1]]);
    let text = nft_update(&before, &Change::AddService(new.clone()).apply(&before), &o);
    assert_eq!(lines_with(&text, "add chain").len(), 2);
    assert_eq!(lines_with(&text, "add element").len(), 2);
    assert!(lines_with(&text, "flush").is_empty() && lines_with(&text, "delete").is_empty());
    assert!(
        text.lines()
            .all(|l| l.starts_with("add table") || l.contains("/new/") || l.contains("10.99.0.1 "))
    );

    let text = nft_update(
        &before,
        &Change::RemoveEndpoint { service: 3 }.apply(&before),
        &o,
    );
    let gone = endpoint_chain(&before[3], &before[3].endpoints[3]);
    assert_eq!(
        lines_with(&text, "delete chain"),
        [format!("delete chain ip kube-proxy {gone}")]
    );
    assert!(lines_with(&text, "numgen")[0].contains("mod 3 vmap"));
    assert!(lines_with(&text, "element").is_empty());
    // The service chain is emptied before the endpoint chain it referenced is deleted.
    let flush_svc = text.find(&format!(
        "flush chain ip kube-proxy {}",
        service_chain(&before[3])
    ));
    assert!(flush_svc.unwrap() < text.find("delete chain").unwrap());

    let text = nft_update(
        &before,
        &Change::ScaleTo {
            service: 0,
            endpoints: 40,
        }
        .apply(&before),
        &o,
    );
    assert_eq!(lines_with(&text, "add chain").len(), 41);
    assert!(lines_with(&text, "numgen")[0].contains("mod 40 vmap"));
    assert!(lines_with(&text, "delete").is_empty());
    assert!(
        text.lines()
            .all(|l| l.starts_with("add table") || l.contains("/filler-0/"))
    );

    assert_eq!(only_table(&nft_update(&before, &before, &o)), 0);
    let text = nft_update(&before, &before[1..], &o);
    assert_eq!(lines_with(&text, "delete element").len(), 2);
    assert_eq!(lines_with(&text, "delete chain").len(), 5);
}
