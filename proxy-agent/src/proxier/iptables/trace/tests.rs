// SPDX-License-Identifier: Apache-2.0
//! The iptables trace against saved rules shaped like the proxier's.

use super::*;

const NAT: &str = r#"*nat
-A KUBE-SERVICES -d 172.30.0.45/32 -p tcp -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns5/svc5:p80" -m tcp --dport 3002 -j KUBE-EXT-A
-A KUBE-EXT-A -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-A -j KUBE-SVC-A
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SVC-A ! -s 10.0.0.0/8 -d 172.30.0.45/32 -p tcp -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-A -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -j KUBE-SEP-1
-A KUBE-SVC-A -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-1
-A KUBE-SVC-A -m comment --comment "ns5/svc5:p80 -> 10.180.1.3:80" -j KUBE-SEP-2
-A KUBE-SEP-1 -s 10.180.0.3/32 -m comment --comment "ns5/svc5:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-1 -p tcp -m comment --comment "ns5/svc5:p80" -m recent --set --name KUBE-SEP-1 --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-2 -s 10.180.1.3/32 -m comment --comment "ns5/svc5:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-2 -p tcp -m comment --comment "ns5/svc5:p80" -m tcp -j DNAT --to-destination 10.180.1.3:80
COMMIT
"#;
const FILTER: &str = r#"*filter
-A KUBE-SERVICES -d 172.30.0.46/32 -p tcp -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns7/svc7:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 3007 -j DROP
COMMIT
"#;

fn q(from: &str, to: &str, client: ClientKind) -> Question {
    Question {
        from: from.parse().unwrap(),
        to: to.parse().unwrap(),
        proto: proto::TCP,
        client,
    }
}

fn node() -> Vec<IpAddr> {
    vec!["192.168.0.2".parse().unwrap()]
}

fn cands(v: &Verdict) -> Vec<String> {
    v.candidates
        .iter()
        .map(|c| SocketAddr::new(c.address, c.port).to_string())
        .collect()
}

#[test]
fn clusterip_from_a_pod_reaches_every_endpoint_unmasqueraded() {
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &RecentLists::new(),
        &q("10.0.0.2", "172.30.0.45:80", ClientKind::Pod),
    );
    assert_eq!(v.action, Action::Forward);
    assert_eq!(cands(&v), ["10.180.0.3:80", "10.180.1.3:80"]);
    assert!(!v.masquerade);
    assert_eq!(v.affinity.as_ref().unwrap().timeout_seconds, 10800);
    assert_eq!(
        v.frontend
            .as_ref()
            .unwrap()
            .service
            .as_ref()
            .unwrap()
            .to_string(),
        "ns5/svc5:p80"
    );
    // A client in an endpoint's recent list is pinned to it.
    let recent = RecentLists::from([(
        "KUBE-SEP-2".to_string(),
        parse_recent("src=10.0.0.2 ttl: 64 last_seen: 4296 oldest_pkt: 1 4296\n"),
    )]);
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &recent,
        &q("10.0.0.2", "172.30.0.45:80", ClientKind::Pod),
    );
    assert_eq!(
        v.affinity.unwrap().pinned_backend,
        Some("10.180.1.3:80".parse().unwrap())
    );
    // Hairpin: the endpoint itself is masqueraded on its own branch only.
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &RecentLists::new(),
        &q("10.180.0.3", "172.30.0.45:80", ClientKind::Pod),
    );
    assert!(!v.masquerade);
    let masq: Vec<bool> = v.candidates.iter().map(|c| c.masquerade).collect();
    assert_eq!(masq, [true, false]);
    assert!(
        v.steps.iter().any(|s| s.contains("hairpin")),
        "{:?}",
        v.steps
    );
}

#[test]
fn nodeport_from_outside_is_masqueraded_and_filter_verdicts_apply() {
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &RecentLists::new(),
        &q("203.0.113.9", "192.168.0.2:3002", ClientKind::External),
    );
    assert_eq!(v.action, Action::Forward);
    assert!(v.masquerade);
    assert_eq!(v.backend_sees_source, Some("192.168.0.2".parse().unwrap()));
    assert_eq!(v.frontend.as_ref().unwrap().kind, FrontendKind::NodePort);
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &RecentLists::new(),
        &q("10.0.0.2", "172.30.0.46:80", ClientKind::Pod),
    );
    assert_eq!(v.action, Action::Reject);
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &RecentLists::new(),
        &q("203.0.113.9", "192.168.0.2:3007", ClientKind::External),
    );
    assert_eq!(v.action, Action::Drop);
    let v = trace(
        NAT,
        FILTER,
        &node(),
        &RecentLists::new(),
        &q("10.0.0.2", "172.30.0.99:80", ClientKind::Pod),
    );
    assert_eq!(v.action, Action::Untouched);
}

/// The rules with upstream's nfacct counting, as `iptables-save` prints them (it puts two
/// spaces after `--nfacct-name`): the localhost NodePort rule before the NodePort's own,
/// and the INVALID-drop rule.
const NAT_WITH_NFACCT: &str = r#"*nat
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "ns5/svc5:p80" -m tcp --dport 3002 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT-A
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns5/svc5:p80" -m tcp --dport 3002 -j KUBE-EXT-A
-A KUBE-EXT-A -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-A -j KUBE-SVC-A
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SVC-A -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-1
-A KUBE-SEP-1 -s 10.180.0.3/32 -m comment --comment "ns5/svc5:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-1 -p tcp -m comment --comment "ns5/svc5:p80" -m tcp -j DNAT --to-destination 10.180.0.3:80
COMMIT
"#;
const FILTER_WITH_NFACCT: &str = "*filter\n\
    [4:240] -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP\n\
    COMMIT\n";

#[test]
fn rules_counting_in_nfacct_are_read_by_the_parser_trace_and_inspect() {
    // The tokenizer keeps the object name as the option's value and the jump intact.
    let counting = save::rules(NAT_WITH_NFACCT)
        .find(|r| r.get("--nfacct-name").is_some())
        .unwrap();
    assert_eq!(counting.chain, "KUBE-NODEPORTS");
    assert_eq!(
        counting.get("--nfacct-name"),
        Some("localhost_nps_accepted_pkts")
    );
    assert_eq!(counting.get("-d"), Some("127.0.0.0/8"));
    assert_eq!(counting.get("-j"), Some("KUBE-EXT-A"));
    let invalid = save::rules(FILTER_WITH_NFACCT).next().unwrap();
    assert_eq!(invalid.get("--ctstate"), Some("INVALID"));
    assert_eq!(invalid.get("-j"), Some("DROP"));
    // The INVALID-drop rule's own counters (the fallback without nfacct) still read.
    assert_eq!(
        crate::proxier::iptables::counters::invalid_dropped_in(FILTER_WITH_NFACCT),
        Some(4)
    );

    // trace: a node process connecting to 127.0.0.1:<nodePort> takes the counting rule
    // to the same external chain; the node's address takes the NodePort's own rule.
    for to in ["127.0.0.1:3002", "192.168.0.2:3002"] {
        let v = trace(
            NAT_WITH_NFACCT,
            FILTER_WITH_NFACCT,
            &node(),
            &RecentLists::new(),
            &q("127.0.0.1", to, ClientKind::Node),
        );
        assert_eq!(v.action, Action::Forward, "{to}");
        assert_eq!(cands(&v), ["10.180.0.3:80"], "{to}");
        assert_eq!(
            v.frontend.as_ref().unwrap().kind,
            FrontendKind::NodePort,
            "{to}"
        );
    }

    // A pod's 127.0.0.1 is its own: the node's rules never see it.
    let from_pod = trace(
        NAT_WITH_NFACCT,
        FILTER_WITH_NFACCT,
        &node(),
        &RecentLists::new(),
        &q("10.0.0.2", "127.0.0.1:3002", ClientKind::Pod),
    );
    assert_eq!(from_pod.action, Action::Untouched);

    // inspect rules: both rules are the service's NodePort frontends, the counting one
    // for 127.0.0.0/8.
    let summary = crate::proxier::netfilter::inspect::summarise(
        IpFamily::V4,
        NAT_WITH_NFACCT,
        FILTER_WITH_NFACCT,
    );
    assert_eq!(summary.len(), 1);
    let frontends: Vec<(Option<&str>, Option<u16>, &str)> = summary[0]
        .frontends
        .iter()
        .map(|f| (f.address.as_deref(), f.port, f.chain.as_str()))
        .collect();
    assert_eq!(
        frontends,
        [
            (Some("127.0.0.0/8"), Some(3002), "KUBE-EXT-A"),
            (None, Some(3002), "KUBE-EXT-A"),
        ]
    );
    assert!(summary[0].frontends.iter().all(|f| f.kind == "nodeport"));
    assert_eq!(summary[0].endpoints.len(), 1);
}
