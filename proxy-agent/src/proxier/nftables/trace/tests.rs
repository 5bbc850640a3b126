// SPDX-License-Identifier: Apache-2.0
//! The nftables trace: the JSON parser and the walk on captured kernel listings (pure,
//! committed next to this file: `a1-overall.json` is the a1 scenario's first state as `nft
//! -j list table ip kube-proxy` prints it, `k1-session-affinity-pinned.json` the k1
//! scenario's with one live affinity entry added), and, as root with `nft`, every
//! behaviour scenario's flows traced through the tables the kernel lists after loading
//! each state's ruleset in a private network namespace.

use super::*;

const A1: &str = include_str!("a1-overall.json");
const K1_PINNED: &str = include_str!("k1-session-affinity-pinned.json");

fn a1() -> Listing {
    Listing::parse(A1).unwrap()
}

/// The a1 and k1 node: its three addresses and loopback.
fn node() -> Vec<IpAddr> {
    [
        "192.168.0.2",
        "192.168.1.2",
        "192.168.99.11",
        "127.0.0.1",
        "::1",
    ]
    .iter()
    .map(|a| a.parse().unwrap())
    .collect()
}

fn q(from: &str, to: &str, client: ClientKind) -> Question {
    Question {
        from: from.parse().unwrap(),
        to: to.parse().unwrap(),
        proto: proto::TCP,
        client,
    }
}

fn cands(v: &Verdict) -> Vec<String> {
    v.candidates
        .iter()
        .map(|c| SocketAddr::new(c.address, c.port).to_string())
        .collect()
}

#[test]
fn the_kernel_listing_parses_into_chains_sets_and_maps() {
    let listing = a1();
    assert_eq!(listing.family, IpFamily::V4);
    let hook = listing.chains["nat-prerouting"].hook.clone().unwrap();
    assert_eq!(
        (hook.kind.as_str(), hook.hook.as_str(), hook.priority),
        ("nat", "prerouting", -100)
    );
    assert!(listing.chains["services"].hook.is_none());
    assert_eq!(listing.sets[SERVICE_IPS].elements.len(), 9);
    // A verdict map element: the key concatenation and its goto.
    let nodeport = listing.sets[SERVICE_NODEPORTS]
        .elements
        .iter()
        .find(|e| e.key == Expr::Concat(vec![Expr::Text("tcp".into()), Expr::Number(3001)]))
        .unwrap();
    assert_eq!(
        nodeport.verdict,
        Some(RuleVerdict::Goto(
            "external-42NFTM6N-ns2/svc2/tcp/p80".into()
        ))
    );
    // Elements with attributes keep their comment.
    let no_endpoints = &listing.sets[NO_ENDPOINT_SERVICES].elements;
    assert!(
        no_endpoints
            .iter()
            .any(|e| e.comment.as_deref() == Some("ns6/svc6:p80")
                && e.verdict == Some(RuleVerdict::Goto("reject-chain".into())))
    );
    // The kernel's forms: a prefix, `fib`, the mark arithmetic.
    let service = &listing.chains["service-ULMVA6XW-ns1/svc1/tcp/p80"].rules[0];
    assert_eq!(
        service.statements[2],
        Statement::Match {
            negate: true,
            left: Expr::Payload {
                protocol: "ip".into(),
                field: "saddr".into()
            },
            right: Expr::Prefix("10.0.0.0/8".parse().unwrap()),
        }
    );
    assert_eq!(
        render_rule(service),
        "ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade"
    );
    assert_eq!(
        render_rule(&listing.chains["masquerading"].rules[0]),
        "meta mark and 0x4000 == 0 return"
    );
    assert_eq!(
        render_rule(&listing.chains["mark-for-masquerade"].rules[0]),
        "meta mark set meta mark or 0x4000"
    );
    assert_eq!(
        render_rule(&listing.chains["services"].rules[1]),
        "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"
    );
}

#[test]
fn numgen_offsets_and_affinity_elements_read_as_unsigned_slots() {
    let listing = Listing::parse(K1_PINNED).unwrap();
    // The kernel prints slot 3682007676 as the signed -612959620.
    let policy = &listing.chains["service-HVFWP5L3-ns5/svc5/tcp/p80"].rules;
    let offsets: Vec<u32> = policy
        .iter()
        .flat_map(|r| &r.statements)
        .filter_map(|s| match s {
            Statement::Match {
                left: Expr::Concat(parts),
                ..
            } => parts.iter().find_map(|p| match p {
                Expr::Numgen { offset, .. } => Some(*offset),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    assert_eq!(offsets, [3_682_007_676, 1_782_996_785, 1_087_874_847]);
    assert_eq!(
        offsets[0],
        crate::proxier::nftables::affinity_slot(
            "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
        )
    );
    assert_eq!(
        listing.affinity_entries(),
        [(
            "10.0.0.2".parse::<IpAddr>().unwrap(),
            1_782_996_785,
            Some(10_799)
        )]
    );
    let update = &listing.chains["endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"].rules[1];
    assert!(
        matches!(
            &update.statements[0],
            Statement::SetUpdate { set, timeout: Some(10_800), .. } if set == AFFINITY
        ),
        "{update:?}"
    );
}

#[test]
fn bad_listings_are_errors_and_unknown_expressions_never_match() {
    assert!(Listing::parse("not json").is_err());
    assert!(Listing::parse("{\"something\": []}").is_err());
    // A rule with an expression this reader does not know is skipped, not followed.
    let json = r#"{"nftables": [
        {"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
        {"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 2,
                   "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
        {"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "handle": 3,
                  "expr": [{"match": {"op": "==", "left": {"osf": {"key": "name"}}, "right": "Linux"}},
                           {"dnat": {"addr": "10.180.0.9", "port": 80}}]}},
        {"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "handle": 4,
                  "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                                      "right": "172.30.0.9"}},
                           {"counter": {"packets": 0, "bytes": 0}},
                           {"dnat": {"addr": "10.180.0.1", "port": 8080}}]}}
    ]}"#;
    let listing = Listing::parse(json).unwrap();
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "172.30.0.9:80", ClientKind::External),
    );
    assert_eq!(v.action, Action::Forward);
    assert_eq!(cands(&v), ["10.180.0.1:8080"]);
    // A question of the other family gets an answer, not a panic.
    let v = trace(
        &listing,
        &node(),
        &q("fd00::2", "[fd00::9]:80", ClientKind::External),
    );
    assert_eq!(v.action, Action::Untouched);
    assert!(v.steps[0].contains("not in its family"), "{:?}", v.steps);
}

#[test]
fn an_anonymous_numgen_verdict_map_is_a_branch_per_value() {
    // Upstream's endpoint choice, as the kernel lists `ip daddr 172.30.0.9 numgen random
    // mod 2 vmap { 0 : goto a, 1 : goto b }`.
    let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
        {"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
        {"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
        {"chain": {"family": "ip", "table": "kube-proxy", "name": "a", "handle": 2}},
        {"chain": {"family": "ip", "table": "kube-proxy", "name": "b", "handle": 3}},
        {"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "handle": 5, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "172.30.0.9"}}, {"vmap": {"key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "data": {"set": [[0, {"goto": {"target": "a"}}], [1, {"goto": {"target": "b"}}]]}}}]}},
        {"rule": {"family": "ip", "table": "kube-proxy", "chain": "a", "handle": 6, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"addr": "10.1.0.1", "port": 80}}]}},
        {"rule": {"family": "ip", "table": "kube-proxy", "chain": "b", "handle": 7, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"addr": "10.1.0.2", "port": 80}}]}}]}"#;
    let listing = Listing::parse(json).unwrap();
    assert_eq!(
        render_rule(&listing.chains["nat-prerouting"].rules[0]),
        "ip daddr 172.30.0.9 numgen random mod 2 vmap { 0 : goto a, 1 : goto b }"
    );
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "172.30.0.9:80", ClientKind::External),
    );
    assert_eq!(cands(&v), ["10.1.0.1:80", "10.1.0.2:80"]);
    assert!(
        v.steps
            .iter()
            .any(|s| s.contains("finds 1 : goto b, 1 in 2 of the connections")),
        "{:?}",
        v.steps
    );
    // Another protocol: the endpoint chains' `meta l4proto tcp` does not match.
    let udp = Question {
        proto: proto::UDP,
        ..q("203.0.113.2", "172.30.0.9:80", ClientKind::External)
    };
    assert_eq!(trace(&listing, &node(), &udp).action, Action::Untouched);
}

#[test]
fn clusterip_from_a_pod_reaches_every_endpoint_and_the_hairpin_is_masqueraded() {
    let listing = a1();
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.2", "172.30.0.44:80", ClientKind::Pod),
    );
    assert_eq!(v.mode, "nftables");
    assert_eq!(v.decided_by, "nat-prerouting");
    assert_eq!(v.action, Action::Forward);
    assert_eq!(cands(&v), ["10.180.0.4:80", "10.180.0.5:80"]);
    assert!(!v.masquerade);
    assert_eq!(v.backend_sees_source, Some("10.0.0.2".parse().unwrap()));
    let frontend = v.frontend.as_ref().unwrap();
    assert_eq!(frontend.kind, FrontendKind::ClusterIp);
    assert_eq!(
        frontend.service.as_ref().unwrap().to_string(),
        "ns4/svc4:p80"
    );
    assert!(
        v.steps
            .iter()
            .any(|s| s.contains("vmap @service-ips finds 172.30.0.44 . tcp . 80")),
        "{:?}",
        v.steps
    );
    assert!(
        v.steps.iter().any(|s| s.contains(
            "numgen random mod 2 == 0 goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 (taken by 1 in 2"
        )),
        "{:?}",
        v.steps
    );
    // The endpoint reaching its own service is masqueraded (the only endpoint here).
    let v = trace(
        &listing,
        &node(),
        &q("10.180.0.1", "172.30.0.41:80", ClientKind::Pod),
    );
    assert_eq!(cands(&v), ["10.180.0.1:80"]);
    assert!(v.masquerade);
    assert_eq!(v.backend_sees_source, Some("192.168.0.2".parse().unwrap()));
    // A ClusterIP reached from outside the cluster is masqueraded.
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "172.30.0.41:80", ClientKind::External),
    );
    assert!(v.masquerade, "{}", v.to_text());
    let text = v.to_text();
    assert!(text.contains("nftables mode"), "{text}");
    assert!(
        text.contains("FORWARD to one of [10.180.0.1:80], masqueraded"),
        "{text}"
    );
}

#[test]
fn external_destinations_follow_their_traffic_policy() {
    let listing = a1();
    // eTP=Cluster: every external client is masqueraded.
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "192.168.99.33:80", ClientKind::External),
    );
    assert_eq!(v.action, Action::Forward);
    assert!(v.masquerade);
    assert_eq!(v.frontend.as_ref().unwrap().kind, FrontendKind::ExternalIp);
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "192.168.0.2:3003", ClientKind::External),
    );
    assert_eq!(cands(&v), ["10.180.0.3:80"]);
    assert_eq!(v.frontend.as_ref().unwrap().kind, FrontendKind::NodePort);
    // From the node: output's NAT chain.
    let v = trace(
        &listing,
        &node(),
        &q("192.168.0.2", "192.168.99.33:80", ClientKind::Node),
    );
    assert_eq!(v.decided_by, "nat-output");
    assert_eq!(cands(&v), ["10.180.0.4:80", "10.180.0.5:80"]);
    assert!(v.masquerade);
    // eTP=Local without a local endpoint: pods short-circuit to the cluster chain;
    // outside clients are dropped on input (a NodePort) or forward (an external IP), and
    // so are the node's own processes, in output before NAT (checked in the kernel too:
    // see kernel.rs).
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.2", "1.2.3.4:80", ClientKind::Pod),
    );
    assert_eq!(cands(&v), ["10.180.0.2:80"]);
    assert!(!v.masquerade);
    let v = trace(
        &listing,
        &node(),
        &q("192.168.0.2", "192.168.99.22:80", ClientKind::Node),
    );
    assert_eq!((v.action, v.decided_by), (Action::Drop, "filter-output"));
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "192.168.0.2:3001", ClientKind::External),
    );
    assert_eq!((v.action, v.decided_by), (Action::Drop, "filter-input"));
    assert_eq!(v.frontend.as_ref().unwrap().kind, FrontendKind::NodePort);
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "1.2.3.4:80", ClientKind::External),
    );
    assert_eq!((v.action, v.decided_by), (Action::Drop, "filter-forward"));
    assert_eq!(
        v.frontend
            .as_ref()
            .unwrap()
            .service
            .as_ref()
            .unwrap()
            .to_string(),
        "ns2/svc2:p80"
    );
    // loadBalancerSourceRanges: an admitted source reaches the endpoint, another one is
    // dropped before NAT.
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.2", "5.6.7.8:80", ClientKind::External),
    );
    assert_eq!(cands(&v), ["10.180.0.3:80"]);
    assert_eq!(
        v.frontend.as_ref().unwrap().kind,
        FrontendKind::LoadBalancer
    );
    assert_eq!(v.affinity.as_ref().unwrap().timeout_seconds, 10_800);
    let v = trace(
        &listing,
        &node(),
        &q("203.0.113.130", "5.6.7.8:80", ClientKind::External),
    );
    assert_eq!(
        (v.action, v.decided_by),
        (Action::Drop, "filter-prerouting")
    );
}

#[test]
fn refusals_and_untouched_traffic() {
    let listing = a1();
    // No endpoints: REJECT (forwarded from a pod, or in output from the node).
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.2", "172.30.0.46:80", ClientKind::Pod),
    );
    assert_eq!((v.action, v.decided_by), (Action::Reject, "filter-forward"));
    assert!(
        v.steps.iter().any(|s| s.contains("ns6/svc6:p80")),
        "{:?}",
        v.steps
    );
    let v = trace(
        &listing,
        &node(),
        &q("192.168.0.2", "172.30.0.46:80", ClientKind::Node),
    );
    assert_eq!((v.action, v.decided_by), (Action::Reject, "filter-output"));
    // A port the ClusterIP does not serve.
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.2", "172.30.0.41:443", ClientKind::Pod),
    );
    assert_eq!(v.action, Action::Reject);
    assert!(
        v.steps.iter().any(|s| s.contains("cluster-ips-check")),
        "{:?}",
        v.steps
    );
    // Neither a service nor a NodePort.
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.2", "10.0.0.3:80", ClientKind::Pod),
    );
    assert_eq!(v.action, Action::Untouched);
    assert_eq!(
        v.steps.last().map(String::as_str),
        Some("passed on untouched")
    );
    // NodePorts are never served on loopback in this mode.
    let v = trace(
        &listing,
        &node(),
        &q("127.0.0.1", "127.0.0.1:3003", ClientKind::Node),
    );
    assert_eq!(v.action, Action::Untouched);
}

#[test]
fn a_live_affinity_entry_pins_its_client() {
    let listing = Listing::parse(K1_PINNED).unwrap();
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.2", "172.30.0.45:80", ClientKind::Pod),
    );
    assert_eq!(cands(&v), ["10.180.1.3:80"]);
    let affinity = v.affinity.as_ref().unwrap();
    assert_eq!(affinity.timeout_seconds, 10_800);
    assert_eq!(
        affinity.pinned_backend,
        Some("10.180.1.3:80".parse().unwrap())
    );
    assert!(
        v.steps
            .iter()
            .any(|s| s.contains("@affinity holds 10.0.0.2 . 1782996785")),
        "{:?}",
        v.steps
    );
    // Another client has no entry: every endpoint, remembered once chosen.
    let v = trace(
        &listing,
        &node(),
        &q("10.0.0.9", "172.30.0.45:80", ClientKind::Pod),
    );
    assert_eq!(
        cands(&v),
        ["10.180.0.3:80", "10.180.1.3:80", "10.180.2.3:80"]
    );
    assert_eq!(v.affinity.unwrap().pinned_backend, None);
}

#[test]
fn live_affinity_entries_name_their_service_and_backend() {
    let entries = live_affinity(&Listing::parse(K1_PINNED).unwrap());
    assert_eq!(
        entries,
        [LiveAffinity {
            client: "10.0.0.2".parse().unwrap(),
            slot: 1_782_996_785,
            service: Some(PortRef {
                namespace: "ns5".into(),
                name: "svc5".into(),
                port_name: "p80".into(),
            }),
            backend: Some("10.180.1.3:80".parse().unwrap()),
            expires_seconds: Some(10_799),
        }]
    );
    let text = affinity_text(&entries);
    assert!(text.starts_with("SERVICE"), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("ns5/svc5:p80")
                && l.contains(" 10.0.0.2 ")
                && l.contains(" 10.180.1.3:80 ")
                && l.ends_with(" 10799s")),
        "{text}"
    );
    assert_eq!(live_affinity(&a1()), []);
    assert_eq!(affinity_text(&[]), "no ClientIP affinity entries\n");
}

#[test]
fn json_listings_of_both_families_merge_into_one_document() {
    let v6 = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"table": {"family": "ip6", "name": "kube-proxy", "handle": 2}}]}"#;
    let merged = merge_json_listings(&[A1.to_string(), v6.to_string()]).unwrap();
    let doc: Value = serde_json::from_str(&merged).unwrap();
    let items = doc["nftables"].as_array().unwrap();
    assert_eq!(
        items.iter().filter(|i| i.get("metainfo").is_some()).count(),
        1
    );
    let tables: Vec<&str> = items
        .iter()
        .filter_map(|i| i["table"]["family"].as_str())
        .collect();
    assert_eq!(tables, ["ip", "ip6"]);
    assert!(merge_json_listings(&["[]".to_string()]).is_err());
}

mod kernel;
