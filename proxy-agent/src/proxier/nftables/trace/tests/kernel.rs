// SPDX-License-Identifier: Apache-2.0
//! Every behaviour scenario's flows, traced through the kernel's own listing (root with
//! `nft`, else skipped with a message): each state's ruleset (the model replayed through
//! the trackers, with the state's ServiceCIDRs, as the agent would build it) is loaded
//! into a private network namespace and listed with `nft -j`; each flow that applies to
//! nftables mode (no `modes:`, or one naming nftables) is traced and its verdict checked
//! against the flow's `expect`, `masq` and `sticky`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path as FsPath;

use ipnet::IpNet;
use proxy_common::proto;
use serde_yaml::Value as Yaml;

use std::io::Write as _;
use std::process::{Command, Stdio};

use super::super::{Listing, in_use, inspect_live, trace, trace_live};
use crate::inspect::{Output, Subject};
use crate::k8s::convert::ClusterObject;
use crate::model::IpFamily;
use crate::proxier::HostLayout;
use crate::proxier::iptables::tests::scenario::{Scenario, scenario_files};
use crate::proxier::nftables::tests::kernel::{in_private_netns, unavailable};
use crate::proxier::nftables::{DesiredState, Model, NftContext};
use crate::trace::{Action, ClientKind, Question, TraceRequest, Verdict};

/// One flow of a scenario file.
struct Flow {
    state: usize,
    from: IpAddr,
    to: SocketAddr,
    proto: u8,
    expect: Expect,
    masq: Option<bool>,
    sticky: bool,
    text: String,
}

#[derive(Debug, PartialEq)]
enum Expect {
    Backends(BTreeSet<SocketAddr>),
    Reject,
    Drop,
    /// LOCAL (a listener of the node, the health-check server) or UNTOUCHED: no rule of
    /// the table translates it.
    Untranslated,
}

fn parse_proto(name: Option<&str>) -> u8 {
    match name.unwrap_or("tcp") {
        "udp" => proto::UDP,
        "sctp" => proto::SCTP,
        _ => proto::TCP,
    }
}

/// The flows of every state that apply to nftables mode.
fn nftables_flows(doc: &Yaml) -> Vec<Flow> {
    let mut states = vec![doc];
    states.extend(doc["steps"].as_sequence().into_iter().flatten());
    let mut out = Vec::new();
    for (state, body) in states.into_iter().enumerate() {
        for flow in body["flows"].as_sequence().into_iter().flatten() {
            if let Some(modes) = flow["modes"].as_sequence()
                && !modes.iter().any(|m| m.as_str() == Some("nftables"))
            {
                continue;
            }
            let expect = match &flow["expect"] {
                Yaml::String(s) => match s.as_str() {
                    "REJECT" => Expect::Reject,
                    "DROP" => Expect::Drop,
                    "LOCAL" | "UNTOUCHED" => Expect::Untranslated,
                    other => panic!("unknown expectation {other}"),
                },
                Yaml::Sequence(list) => Expect::Backends(
                    list.iter()
                        .map(|b| b.as_str().unwrap().parse().unwrap())
                        .collect(),
                ),
                other => panic!("unknown expectation {other:?}"),
            };
            out.push(Flow {
                state,
                from: flow["from"].as_str().unwrap().parse().unwrap(),
                to: flow["to"].as_str().unwrap().parse().unwrap(),
                proto: parse_proto(flow["proto"].as_str()),
                expect,
                masq: flow["masq"].as_bool(),
                sticky: flow["sticky"].as_bool().unwrap_or(false),
                text: serde_yaml::to_string(flow)
                    .unwrap_or_default()
                    .replace('\n', " "),
            });
        }
    }
    out
}

/// The ServiceCIDRs among a state's objects.
fn service_cidrs(objects: &[ClusterObject]) -> Vec<IpNet> {
    objects
        .iter()
        .filter_map(|o| match o {
            ClusterObject::ServiceCidr(c) => c.spec.as_ref()?.cidrs.clone(),
            _ => None,
        })
        .flatten()
        .filter_map(|c| c.parse::<IpNet>().ok().map(|n| n.trunc()))
        .collect()
}

/// Whether the verdict is what the flow expects; the disagreement otherwise.
fn agrees(flow: &Flow, v: &Verdict, node_client: bool) -> Result<(), String> {
    match &flow.expect {
        Expect::Reject if v.action == Action::Reject => Ok(()),
        Expect::Drop if v.action == Action::Drop => Ok(()),
        Expect::Untranslated if v.action == Action::Untouched => Ok(()),
        // A destination that is no service, reached directly (headless services).
        Expect::Backends(set)
            if v.action == Action::Untouched && set.len() == 1 && set.contains(&flow.to) =>
        {
            Ok(())
        }
        Expect::Backends(set) if v.action == Action::Forward => {
            let got: BTreeSet<SocketAddr> = v
                .candidates
                .iter()
                .map(|c| SocketAddr::new(c.address, c.port))
                .collect();
            if &got != set {
                return Err(format!("candidates {got:?}, expected {set:?}"));
            }
            if let Some(masq) = flow.masq {
                // The backend sees a node address: masqueraded, or the client is the node.
                let wrong: Vec<String> = v
                    .candidates
                    .iter()
                    .filter(|c| (c.masquerade || node_client) != masq)
                    .map(|c| c.address.to_string())
                    .collect();
                if !wrong.is_empty() {
                    return Err(format!("masq expected {masq}, not so towards {wrong:?}"));
                }
            }
            if flow.sticky && v.affinity.is_none() {
                return Err("sticky expected, no affinity".into());
            }
            Ok(())
        }
        expected => Err(format!("{:?}, expected {expected:?}", v.action)),
    }
}

use crate::proxier::nftables::transport::family_keyword as family_word;

/// Each state's rulesets (`nft -f` text into an empty table), per family with services.
fn rulesets(scenario: &Scenario) -> Vec<Vec<(IpFamily, String)>> {
    let mut replay = scenario.replay();
    let mut out = Vec::new();
    for objects in &scenario.states {
        replay.apply(objects);
        let cidrs = service_cidrs(objects);
        let mut texts = Vec::new();
        for state in &replay.families {
            if state.services.is_empty() {
                continue;
            }
            let ctx = NftContext::new(&replay.node, state.family, &cidrs);
            let model = Model {
                services: &state.services,
                endpoints: &state.endpoints,
            };
            texts.push((
                state.family,
                DesiredState::build(model, &ctx).cold_load(&ctx),
            ));
        }
        out.push(texts);
    }
    out
}

/// Loads each state's rulesets and lists them: per state, per family with services, the
/// kernel's JSON listing.
fn listings(scenario: &Scenario, dir: &FsPath) -> Vec<Vec<(IpFamily, Listing)>> {
    let mut script = String::new();
    for (index, texts) in rulesets(scenario).into_iter().enumerate() {
        for (family, text) in texts {
            let word = family_word(family);
            let file = dir.join(format!("{}-{index}-{word}.nft", scenario.name));
            std::fs::write(&file, text).unwrap();
            script.push_str(&format!(
                "nft -f {}\necho '### {index} {word}'\nnft -j list table {word} kube-proxy\necho\nnft delete table {word} kube-proxy\n",
                file.display()
            ));
        }
    }
    let output = in_private_netns(&script);
    let mut out: Vec<Vec<(IpFamily, Listing)>> =
        (0..scenario.states.len()).map(|_| Vec::new()).collect();
    let mut current: Option<(usize, IpFamily)> = None;
    for line in output.lines() {
        if let Some(header) = line.strip_prefix("### ") {
            let (index, word) = header.split_once(' ').unwrap();
            let family = if word == "ip6" {
                IpFamily::V6
            } else {
                IpFamily::V4
            };
            current = Some((index.parse().unwrap(), family));
        } else if line.starts_with('{') {
            let (index, family) = current.take().expect("a listing after its header");
            let listing = Listing::parse(line).unwrap();
            assert_eq!(listing.family, family);
            out[index].push((family, listing));
        }
    }
    out
}

#[test]
fn every_scenario_flow_traces_to_its_expected_outcome() {
    if let Some(why) = unavailable() {
        eprintln!("SKIP nftables trace kernel test: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("nft-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in scenario_files() {
        let doc: Yaml = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let flows = nftables_flows(&doc);
        if flows.is_empty() {
            continue;
        }
        let scenario = Scenario::load(&path);
        let tables = listings(&scenario, &dir);
        let node: Vec<IpNet> = doc["node"]["addresses"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().parse().unwrap())
            .collect();
        let pods: Option<IpNet> = doc["node"]["podCIDR"].as_str().map(|c| c.parse().unwrap());
        let mut node_addresses: Vec<IpAddr> = node.iter().map(IpNet::addr).collect();
        node_addresses.extend(["127.0.0.1", "::1"].map(|a| a.parse::<IpAddr>().unwrap()));
        for flow in &flows {
            let client = if node_addresses.contains(&flow.from) || flow.from.is_loopback() {
                ClientKind::Node
            } else if pods.is_some_and(|p| p.contains(&flow.from)) {
                ClientKind::Pod
            } else {
                ClientKind::External
            };
            let family = if flow.to.is_ipv6() {
                IpFamily::V6
            } else {
                IpFamily::V4
            };
            let question = Question {
                from: flow.from,
                to: flow.to,
                proto: flow.proto,
                client,
            };
            // No table of the family: nothing is translated.
            let empty = Listing {
                family,
                chains: Default::default(),
                sets: Default::default(),
            };
            let listing = tables[flow.state]
                .iter()
                .find(|(f, _)| *f == family)
                .map_or(&empty, |(_, l)| l);
            let verdict = trace(listing, &node_addresses, &question);
            checked += 1;
            if let Err(why) = agrees(flow, &verdict, client == ClientKind::Node) {
                failures.push(format!(
                    "{} state {}: {}\n  {why}\n{}",
                    scenario.name,
                    flow.state,
                    flow.text,
                    verdict.to_text()
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{checked} nftables flows traced: {} agree with their scenario",
        checked - failures.len()
    );
    assert!(checked > 100, "only {checked} flows found");
    assert!(
        failures.is_empty(),
        "{} of {checked} flows disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// IPv6 (the nftables module's own n1 scenario, which has no flows): its first state's
/// `table ip6 kube-proxy`, traced.
#[test]
fn ipv6_services_trace_through_the_ip6_table() {
    if let Some(why) = unavailable() {
        eprintln!("SKIP nftables trace kernel test: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("nft-trace-v6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = Scenario::parse(include_str!("../../tests/scenarios/n1-ipv6.yaml"));
    let tables = listings(&scenario, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let [(IpFamily::V6, listing)] = tables[0].as_slice() else {
        panic!("expected one ip6 table in state 0");
    };
    let node: Vec<IpAddr> = ["fd00:192::2", "::1", "127.0.0.1"]
        .map(|a| a.parse().unwrap())
        .to_vec();
    let ask = |from: &str, to: &str, proto: u8, client| {
        trace(
            listing,
            &node,
            &Question {
                from: from.parse().unwrap(),
                to: to.parse().unwrap(),
                proto,
                client,
            },
        )
    };
    let backends = |v: &Verdict| -> BTreeSet<(String, bool, bool)> {
        v.candidates
            .iter()
            .map(|c| {
                (
                    SocketAddr::new(c.address, c.port).to_string(),
                    c.masquerade,
                    c.local,
                )
            })
            .collect()
    };
    let set = |items: &[(&str, bool, bool)]| -> BTreeSet<(String, bool, bool)> {
        items
            .iter()
            .map(|(a, m, l)| (a.to_string(), *m, *l))
            .collect()
    };
    // ClusterIP with affinity, from a pod, and from an endpoint (hairpin on its branch).
    let v = ask(
        "fd00:10::9",
        "[fd00:172::41]:80",
        proto::TCP,
        ClientKind::Pod,
    );
    assert_eq!(
        backends(&v),
        set(&[
            ("[fd00:10::1]:80", false, false),
            ("[fd00:10:1::2]:80", false, false)
        ])
    );
    assert_eq!(v.affinity.as_ref().unwrap().timeout_seconds, 600);
    let v = ask(
        "fd00:10::1",
        "[fd00:172::41]:80",
        proto::TCP,
        ClientKind::Pod,
    );
    assert_eq!(
        backends(&v),
        set(&[
            ("[fd00:10::1]:80", true, false),
            ("[fd00:10:1::2]:80", false, false)
        ]),
        "{}",
        v.to_text()
    );
    // NodePort with eTP=Local from outside: the local endpoint only, source kept.
    let v = ask(
        "fd00:203::5",
        "[fd00:192::2]:3001",
        proto::TCP,
        ClientKind::External,
    );
    assert_eq!(
        backends(&v),
        set(&[("[fd00:10::3]:8080", false, true)]),
        "{}",
        v.to_text()
    );
    // loadBalancerSourceRanges: admitted, or dropped before NAT.
    let v = ask(
        "fd00:203::5",
        "[fd00:5::8]:80",
        proto::TCP,
        ClientKind::External,
    );
    assert_eq!(backends(&v), set(&[("[fd00:10:1::4]:80", true, false)]));
    assert_eq!(v.backend_sees_source, Some("fd00:192::2".parse().unwrap()));
    let v = ask(
        "fd00:999::1",
        "[fd00:5::8]:80",
        proto::TCP,
        ClientKind::External,
    );
    assert_eq!(
        (v.action, v.decided_by),
        (Action::Drop, "filter-prerouting")
    );
    // No endpoints (UDP), and a port the ClusterIP does not serve: REJECT.
    let v = ask(
        "fd00:10::9",
        "[fd00:172::44]:53",
        proto::UDP,
        ClientKind::Pod,
    );
    assert_eq!((v.action, v.decided_by), (Action::Reject, "filter-forward"));
    let v = ask(
        "fd00:10::9",
        "[fd00:172::41]:443",
        proto::TCP,
        ClientKind::Pod,
    );
    assert_eq!(v.action, Action::Reject);
    // The same port over another protocol is no service either.
    let v = ask(
        "fd00:10::9",
        "[fd00:172::41]:80",
        proto::UDP,
        ClientKind::Pod,
    );
    assert_eq!(v.action, Action::Reject, "{}", v.to_text());
}

/// Set in the copy of the test binary that runs inside a private network namespace.
const IN_PRIVATE_NETNS: &str = "NFT_TRACE_TEST_IN_PRIVATE_NETNS";

/// The registered tools on the live table of their network namespace: the test binary
/// runs this test again under `unshare -n`, where no table exists until it loads a1's.
#[test]
fn live_tools_read_the_table_of_this_network_namespace() {
    const NAME: &str = "proxier::nftables::trace::tests::kernel::live_tools_read_the_table_of_this_network_namespace";
    if std::env::var_os(IN_PRIVATE_NETNS).is_none() {
        if let Some(why) = unavailable() {
            eprintln!("SKIP nftables trace kernel test: {why}");
            return;
        }
        let out = Command::new("unshare")
            .arg("-n")
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(IN_PRIVATE_NETNS, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The inner run did run the test (a filter matching nothing also succeeds).
        assert!(stdout.contains("1 passed"), "{stdout}");
        return;
    }

    let layout = HostLayout {
        bpffs_root: std::path::PathBuf::new(),
        ipvs_exclude: Vec::new(),
    };
    assert!(!in_use(&layout));
    let empty = inspect_live(&layout, Subject::Rules, Output::Text).unwrap();
    assert!(empty.contains("no table ip kube-proxy"), "{empty}");
    let request = TraceRequest {
        from: "10.0.0.2".parse().unwrap(),
        to: "172.30.0.44:80".parse().unwrap(),
        proto: proto::TCP,
        client: Some(ClientKind::Pod),
    };
    let missing = trace_live(&layout, &request).unwrap_err();
    assert!(missing.contains("no table ip kube-proxy"), "{missing}");

    let a1 = scenario_files()
        .into_iter()
        .find(|p| p.ends_with("a1-overall.yaml"))
        .unwrap();
    let texts = rulesets(&Scenario::load(&a1));
    let [(IpFamily::V4, text)] = texts[0].as_slice() else {
        panic!("a1's first state has one IPv4 table");
    };
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    nft.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(nft.wait().unwrap().success());

    assert!(in_use(&layout));
    let listing = inspect_live(&layout, Subject::Rules, Output::Text).unwrap();
    assert!(listing.starts_with("table ip kube-proxy {"), "{listing}");
    assert!(listing.contains("chain services {"), "{listing}");
    let json = inspect_live(&layout, Subject::Rules, Output::Json).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        doc["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["table"]["name"] == "kube-proxy"),
        "{json}"
    );
    assert!(inspect_live(&layout, Subject::Services, Output::Text).is_err());
    let none = inspect_live(&layout, Subject::Affinity, Output::Text).unwrap();
    assert_eq!(none, "no ClientIP affinity entries\n");

    let v = trace_live(&layout, &request).unwrap();
    assert_eq!(v.action, Action::Forward);
    let backends: BTreeSet<SocketAddr> = v
        .candidates
        .iter()
        .map(|c| SocketAddr::new(c.address, c.port))
        .collect();
    assert_eq!(
        backends,
        BTreeSet::from([
            "10.180.0.4:80".parse().unwrap(),
            "10.180.0.5:80".parse().unwrap()
        ])
    );
    // A live affinity entry: inspect names it, trace follows it.
    let slot = crate::proxier::nftables::affinity_slot(
        "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80",
    );
    let added = Command::new("nft")
        .args([
            "add",
            "element",
            "ip",
            "kube-proxy",
            "affinity",
            &format!("{{ 203.0.113.2 . {slot} timeout 600s }}"),
        ])
        .status()
        .unwrap();
    assert!(added.success());
    let entries = inspect_live(&layout, Subject::Affinity, Output::Json).unwrap();
    let entries: serde_json::Value = serde_json::from_str(&entries).unwrap();
    assert_eq!(entries[0]["client"], "203.0.113.2", "{entries}");
    assert_eq!(entries[0]["backend"], "10.180.0.3:80", "{entries}");
    let pinned = trace_live(
        &layout,
        &TraceRequest {
            from: "203.0.113.2".parse().unwrap(),
            to: "5.6.7.8:80".parse().unwrap(),
            proto: proto::TCP,
            client: Some(ClientKind::External),
        },
    )
    .unwrap();
    assert_eq!(
        pinned.affinity.and_then(|a| a.pinned_backend),
        Some("10.180.0.3:80".parse().unwrap())
    );
    // The other family has no table here.
    let v6 = TraceRequest {
        from: "fd00:10::2".parse().unwrap(),
        to: "[fd00:172::41]:80".parse().unwrap(),
        proto: proto::TCP,
        client: Some(ClientKind::Pod),
    };
    assert!(
        trace_live(&layout, &v6)
            .unwrap_err()
            .contains("no table ip6")
    );
}
