// SPDX-License-Identifier: Apache-2.0
//! Upstream iptables/nftables proxier tests (pkg/proxy/{iptables,nftables}/proxier_test.go)
//! whose subject is not a packet outcome, restated as unit tests: the endpoints map after
//! slice changes (TestUpdateEndpointsMap), the local ready endpoints a health-check node
//! port counts (TestHealthCheckNodePortWhenTerminating) and the "no local endpoints"
//! gauges a sync reports (TestNoEndpointsMetric), and three rule-text properties
//! (TestComputeProbability, TestMasqueradeRule, TestDropInvalidRule). The packet-level
//! tests are scenario files (tests/scenarios/p*.yaml, ../shared/scenarios).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::partial::{new_proxier, scenario_yaml, service_yaml, sync};
use super::scenario::Scenario;
use crate::k8s::fixtures::{EndpointSliceBuilder, mk_endpoint, mk_endpointslice};
use crate::model::{EndpointsChangeTracker, EndpointsMap, IpFamily, NamespacedName};
use crate::proxier::Proxier;
use crate::proxier::conntrack::fake::FakeConntrack;
use crate::proxier::iptables::fake::SharedFake;
use crate::proxier::iptables::rules::Probabilities;
use crate::proxier::iptables::{IptablesConfig, IptablesProxier, NfacctCounters, RuleOptions};

const NODE: &str = "test-node";

/// An endpoint as upstream's table writes it: no conditions (ready by API default), on
/// this node or not.
fn endpoint(ip: &str, local: bool) -> k8s_openapi::api::discovery::v1::Endpoint {
    let builder = mk_endpoint(ip).no_conditions();
    if local {
        builder.node(NODE).build()
    } else {
        builder.build()
    }
}

/// Slice `<service>-<number>` in `namespace` with UDP ports (name, number) and endpoints
/// (ip, on this node).
fn slice(
    namespace: &str,
    service: &str,
    number: u8,
    ports: &[(&str, i32)],
    endpoints: &[(&str, bool)],
) -> EndpointSlice {
    let mut builder: EndpointSliceBuilder =
        mk_endpointslice(namespace, &format!("{service}-{number}"), service, "IPv4");
    for (name, port) in ports {
        builder = builder.port(name, *port, "UDP");
    }
    for (ip, local) in endpoints {
        builder = builder.endpoint(endpoint(ip, *local));
    }
    builder.build()
}

/// (namespace, service, port name) -> ["ip:port", is local], as upstream's expectations.
type Expected = BTreeMap<(String, String, String), Vec<(String, bool)>>;

/// One expected service port as upstream writes it: namespace, service, port name and its
/// endpoints ("ip:port", is local).
type ExpectedPort<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, bool)]);

fn expected(entries: &[ExpectedPort<'_>]) -> Expected {
    entries
        .iter()
        .map(|(ns, svc, port, eps)| {
            (
                (ns.to_string(), svc.to_string(), port.to_string()),
                eps.iter().map(|(e, l)| (e.to_string(), *l)).collect(),
            )
        })
        .collect()
}

fn actual(map: &EndpointsMap) -> Expected {
    map.iter()
        .map(|(name, eps)| {
            (
                (
                    name.service.namespace().to_string(),
                    name.service.name().to_string(),
                    name.port_name.to_string(),
                ),
                eps.iter().map(|e| (e.to_string(), e.is_local)).collect(),
            )
        })
        .collect()
}

struct EndpointsCase {
    name: &'static str,
    previous: Vec<Option<EndpointSlice>>,
    current: Vec<Option<EndpointSlice>>,
    old: Expected,
    new: Expected,
    conntrack_cleanup_required: bool,
    local_ready: HashMap<NamespacedName, usize>,
}

fn local_ready(entries: &[(&str, &str, usize)]) -> HashMap<NamespacedName, usize> {
    entries
        .iter()
        .map(|(ns, name, n)| (NamespacedName::new(*ns, *name), *n))
        .collect()
}

/// TestUpdateEndpointsMap: every case of upstream's table, in its order.
fn endpoints_cases() -> Vec<EndpointsCase> {
    // Upstream's empty slice has no addressType, ports or endpoints.
    let empty = mk_endpointslice("ns1", "ep1-1", "ep1", "").build();
    let subset1 = |n| slice("ns1", "ep1", n, &[("p11", 11)], &[("10.1.1.1", false)]);
    let subset2 = |n| slice("ns1", "ep1", n, &[("p12", 12)], &[("10.1.1.2", false)]);
    let named_port_local = slice("ns1", "ep1", 1, &[("p11", 11)], &[("10.1.1.1", true)]);
    let named_port = subset1(1);
    let named_port_renamed = slice("ns1", "ep1", 1, &[("p11-2", 11)], &[("10.1.1.1", false)]);
    let named_port_renumbered = slice("ns1", "ep1", 1, &[("p11", 22)], &[("10.1.1.1", false)]);
    let named_ports_local_no_local = slice(
        "ns1",
        "ep1",
        1,
        &[("p11", 11), ("p12", 12)],
        &[("10.1.1.1", false), ("10.1.1.2", true)],
    );
    let multiple_subsets = vec![Some(subset1(1)), Some(subset2(2))];
    let subset_local = slice("ns1", "ep1", 2, &[("p12", 12)], &[("10.1.1.2", true)]);
    let multiple_subsets_with_local = vec![Some(subset1(1)), Some(subset_local)];
    let multiple_subsets_multiple_ports_local = vec![
        Some(slice(
            "ns1",
            "ep1",
            1,
            &[("p11", 11), ("p12", 12)],
            &[("10.1.1.1", true)],
        )),
        Some(slice(
            "ns1",
            "ep1",
            2,
            &[("p13", 13)],
            &[("10.1.1.3", false)],
        )),
    ];
    let multiple_subsets_ips_ports = vec![
        Some(slice(
            "ns1",
            "ep1",
            1,
            &[("p11", 11), ("p12", 12)],
            &[("10.1.1.1", false), ("10.1.1.2", true)],
        )),
        Some(slice(
            "ns1",
            "ep1",
            2,
            &[("p13", 13), ("p14", 14)],
            &[("10.1.1.3", false), ("10.1.1.4", true)],
        )),
        Some(slice(
            "ns2",
            "ep2",
            1,
            &[("p21", 21), ("p22", 22)],
            &[("10.2.2.1", false), ("10.2.2.2", true)],
        )),
    ];
    let complex_before = vec![
        Some(subset1(1)),
        None,
        Some(slice(
            "ns2",
            "ep2",
            1,
            &[("p22", 22)],
            &[("10.2.2.2", true), ("10.2.2.22", true)],
        )),
        Some(slice(
            "ns2",
            "ep2",
            2,
            &[("p23", 23)],
            &[("10.2.2.3", true)],
        )),
        None,
        Some(slice(
            "ns4",
            "ep4",
            1,
            &[("p44", 44)],
            &[("10.4.4.4", true), ("10.4.4.5", true)],
        )),
        Some(slice(
            "ns4",
            "ep4",
            2,
            &[("p45", 45)],
            &[("10.4.4.6", true)],
        )),
    ];
    let complex_after = vec![
        Some(slice(
            "ns1",
            "ep1",
            1,
            &[("p11", 11)],
            &[("10.1.1.1", false), ("10.1.1.11", false)],
        )),
        Some(slice(
            "ns1",
            "ep1",
            2,
            &[("p12", 12), ("p122", 122)],
            &[("10.1.1.2", false)],
        )),
        None,
        None,
        Some(slice(
            "ns3",
            "ep3",
            1,
            &[("p33", 33)],
            &[("10.3.3.3", false)],
        )),
        Some(slice(
            "ns4",
            "ep4",
            1,
            &[("p44", 44)],
            &[("10.4.4.4", true)],
        )),
        None,
    ];

    let p11_local = expected(&[("ns1", "ep1", "p11", &[("10.1.1.1:11", true)])]);
    let p11_remote = expected(&[("ns1", "ep1", "p11", &[("10.1.1.1:11", false)])]);
    let p11_p12_remote = expected(&[
        ("ns1", "ep1", "p11", &[("10.1.1.1:11", false)]),
        ("ns1", "ep1", "p12", &[("10.1.1.2:12", false)]),
    ]);
    let local_no_local = expected(&[
        (
            "ns1",
            "ep1",
            "p11",
            &[("10.1.1.1:11", false), ("10.1.1.2:11", true)],
        ),
        (
            "ns1",
            "ep1",
            "p12",
            &[("10.1.1.1:12", false), ("10.1.1.2:12", true)],
        ),
    ]);
    let multiple_ports_local = expected(&[
        ("ns1", "ep1", "p11", &[("10.1.1.1:11", true)]),
        ("ns1", "ep1", "p12", &[("10.1.1.1:12", true)]),
        ("ns1", "ep1", "p13", &[("10.1.1.3:13", false)]),
    ]);
    let ips_ports = expected(&[
        (
            "ns1",
            "ep1",
            "p11",
            &[("10.1.1.1:11", false), ("10.1.1.2:11", true)],
        ),
        (
            "ns1",
            "ep1",
            "p12",
            &[("10.1.1.1:12", false), ("10.1.1.2:12", true)],
        ),
        (
            "ns1",
            "ep1",
            "p13",
            &[("10.1.1.3:13", false), ("10.1.1.4:13", true)],
        ),
        (
            "ns1",
            "ep1",
            "p14",
            &[("10.1.1.3:14", false), ("10.1.1.4:14", true)],
        ),
        (
            "ns2",
            "ep2",
            "p21",
            &[("10.2.2.1:21", false), ("10.2.2.2:21", true)],
        ),
        (
            "ns2",
            "ep2",
            "p22",
            &[("10.2.2.1:22", false), ("10.2.2.2:22", true)],
        ),
    ]);

    vec![
        EndpointsCase {
            name: "nothing",
            previous: vec![],
            current: vec![],
            old: Expected::new(),
            new: Expected::new(),
            conntrack_cleanup_required: false,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "no change, named port, local",
            previous: vec![Some(named_port_local.clone())],
            current: vec![Some(named_port_local.clone())],
            old: p11_local.clone(),
            new: p11_local.clone(),
            conntrack_cleanup_required: false,
            local_ready: local_ready(&[("ns1", "ep1", 1)]),
        },
        EndpointsCase {
            name: "no change, multiple subsets",
            previous: multiple_subsets.clone(),
            current: multiple_subsets.clone(),
            old: p11_p12_remote.clone(),
            new: p11_p12_remote.clone(),
            conntrack_cleanup_required: false,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "no change, multiple subsets, multiple ports, local",
            previous: multiple_subsets_multiple_ports_local.clone(),
            current: multiple_subsets_multiple_ports_local,
            old: multiple_ports_local.clone(),
            new: multiple_ports_local,
            conntrack_cleanup_required: false,
            local_ready: local_ready(&[("ns1", "ep1", 1)]),
        },
        EndpointsCase {
            name: "no change, multiple endpoints, subsets, IPs, and ports",
            previous: multiple_subsets_ips_ports.clone(),
            current: multiple_subsets_ips_ports,
            old: ips_ports.clone(),
            new: ips_ports,
            conntrack_cleanup_required: false,
            local_ready: local_ready(&[("ns1", "ep1", 2), ("ns2", "ep2", 1)]),
        },
        EndpointsCase {
            name: "add an Endpoints",
            previous: vec![None],
            current: vec![Some(named_port_local.clone())],
            old: Expected::new(),
            new: p11_local.clone(),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[("ns1", "ep1", 1)]),
        },
        EndpointsCase {
            name: "remove an Endpoints",
            previous: vec![Some(named_port_local)],
            current: vec![None],
            old: p11_local,
            new: Expected::new(),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "add an IP and port",
            previous: vec![Some(named_port.clone())],
            current: vec![Some(named_ports_local_no_local.clone())],
            old: p11_remote.clone(),
            new: local_no_local.clone(),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[("ns1", "ep1", 1)]),
        },
        EndpointsCase {
            name: "remove an IP and port",
            previous: vec![Some(named_ports_local_no_local)],
            current: vec![Some(named_port.clone())],
            old: local_no_local,
            new: p11_remote.clone(),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "add a subset",
            previous: vec![Some(named_port.clone()), None],
            current: multiple_subsets_with_local,
            old: p11_remote.clone(),
            new: expected(&[
                ("ns1", "ep1", "p11", &[("10.1.1.1:11", false)]),
                ("ns1", "ep1", "p12", &[("10.1.1.2:12", true)]),
            ]),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[("ns1", "ep1", 1)]),
        },
        EndpointsCase {
            name: "remove a subset",
            previous: multiple_subsets,
            current: vec![Some(named_port.clone()), None],
            old: p11_p12_remote,
            new: p11_remote.clone(),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "rename a port",
            previous: vec![Some(named_port.clone())],
            current: vec![Some(named_port_renamed)],
            old: p11_remote.clone(),
            new: expected(&[("ns1", "ep1", "p11-2", &[("10.1.1.1:11", false)])]),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "renumber a port",
            previous: vec![Some(named_port.clone())],
            current: vec![Some(named_port_renumbered)],
            old: p11_remote.clone(),
            new: expected(&[("ns1", "ep1", "p11", &[("10.1.1.1:22", false)])]),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[]),
        },
        EndpointsCase {
            name: "complex add and remove",
            previous: complex_before,
            current: complex_after,
            old: expected(&[
                ("ns1", "ep1", "p11", &[("10.1.1.1:11", false)]),
                (
                    "ns2",
                    "ep2",
                    "p22",
                    &[("10.2.2.22:22", true), ("10.2.2.2:22", true)],
                ),
                ("ns2", "ep2", "p23", &[("10.2.2.3:23", true)]),
                (
                    "ns4",
                    "ep4",
                    "p44",
                    &[("10.4.4.4:44", true), ("10.4.4.5:44", true)],
                ),
                ("ns4", "ep4", "p45", &[("10.4.4.6:45", true)]),
            ]),
            new: expected(&[
                (
                    "ns1",
                    "ep1",
                    "p11",
                    &[("10.1.1.11:11", false), ("10.1.1.1:11", false)],
                ),
                ("ns1", "ep1", "p12", &[("10.1.1.2:12", false)]),
                ("ns1", "ep1", "p122", &[("10.1.1.2:122", false)]),
                ("ns3", "ep3", "p33", &[("10.3.3.3:33", false)]),
                ("ns4", "ep4", "p44", &[("10.4.4.4:44", true)]),
            ]),
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[("ns4", "ep4", 1)]),
        },
        EndpointsCase {
            name: "change from 0 endpoint address to 1 unnamed port",
            previous: vec![Some(empty)],
            current: vec![Some(named_port)],
            old: Expected::new(),
            new: p11_remote,
            conntrack_cleanup_required: true,
            local_ready: local_ready(&[]),
        },
    ]
}

#[test]
fn update_endpoints_map_follows_every_slice_change() {
    for case in endpoints_cases() {
        assert_eq!(case.previous.len(), case.current.len(), "{}", case.name);
        let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, NODE);
        let mut map = EndpointsMap::new();
        for slice in case.previous.iter().flatten() {
            tracker.endpoint_slice_update(slice, false);
        }
        map.apply(&mut tracker);
        assert_eq!(actual(&map), case.old, "{}: before the change", case.name);

        for (previous, current) in case.previous.iter().zip(&case.current) {
            match (previous, current) {
                (_, Some(current)) => {
                    tracker.endpoint_slice_update(current, false);
                }
                (Some(previous), None) => {
                    tracker.endpoint_slice_update(previous, true);
                }
                (None, None) => {}
            }
        }
        let result = map.apply(&mut tracker);
        assert_eq!(actual(&map), case.new, "{}: after the change", case.name);
        assert_eq!(
            result.conntrack_cleanup_required, case.conntrack_cleanup_required,
            "{}: conntrack cleanup",
            case.name
        );
        assert_eq!(
            map.local_ready_endpoints(),
            case.local_ready,
            "{}: local ready endpoints",
            case.name
        );
    }
}

/// TestHealthCheckNodePortWhenTerminating: three ready local endpoints (and a not-ready
/// one) count as one service with local endpoints; once every local endpoint is
/// terminating (or merely not ready), the service has none, so its health-check node port
/// reports no local endpoint.
#[test]
fn health_check_counts_no_local_endpoint_once_all_terminate() {
    let slice_with = |conditions: [(bool, bool, bool); 4]| {
        let mut builder = mk_endpointslice("ns1", "svc1-1", "svc1", "IPv4").port("", 80, "TCP");
        for (i, (ready, serving, terminating)) in conditions.into_iter().enumerate() {
            builder = builder.endpoint(
                mk_endpoint(&format!("10.0.1.{}", i + 1))
                    .node(NODE)
                    .conditions(ready, serving, terminating),
            );
        }
        builder.build()
    };
    let mut tracker = EndpointsChangeTracker::new(IpFamily::V4, NODE);
    let mut map = EndpointsMap::new();

    // Upstream sets only `ready`; serving follows it and terminating is false.
    tracker.endpoint_slice_update(
        &slice_with([
            (true, true, false),
            (true, true, false),
            (true, true, false),
            (false, false, false),
        ]),
        false,
    );
    map.apply(&mut tracker);
    assert_eq!(
        map.local_ready_endpoints(),
        HashMap::from([(NamespacedName::new("ns1", "svc1"), 3)])
    );

    tracker.endpoint_slice_update(
        &slice_with([
            (false, true, false),
            (false, true, true),
            (false, true, true),
            (false, false, true),
        ]),
        false,
    );
    map.apply(&mut tracker);
    assert!(map.local_ready_endpoints().is_empty());
}

/// TestNoEndpointsMetric: a Service (NodePort 123 when it has an external policy) whose
/// internal and/or external traffic policy is Local, with endpoints on this node, only on
/// other nodes, or none at all. Only "Local policy, endpoints exist, none here" counts, per
/// policy.
#[test]
fn no_local_endpoints_gauges_count_local_policies_left_without_local_endpoints() {
    struct Case {
        name: &'static str,
        internal_local: bool,
        external_local: bool,
        endpoints: &'static [(&'static str, &'static str)],
        internal: usize,
        external: usize,
    }
    const LOCAL_EPS: &[(&str, &str)] = &[
        ("10.0.1.1", NODE),
        ("10.0.1.2", "node1"),
        ("10.0.1.3", "node2"),
    ];
    const REMOTE_EPS: &[(&str, &str)] = &[
        ("10.0.1.1", "node0"),
        ("10.0.1.2", "node1"),
        ("10.0.1.3", "node2"),
    ];
    let cases = [
        Case {
            name: "internalTrafficPolicy is set and there are local endpoints",
            internal_local: true,
            external_local: false,
            endpoints: LOCAL_EPS,
            internal: 0,
            external: 0,
        },
        Case {
            name: "externalTrafficPolicy is set and there are local endpoints",
            internal_local: false,
            external_local: true,
            endpoints: LOCAL_EPS,
            internal: 0,
            external: 0,
        },
        Case {
            name: "both policies are set and there are local endpoints",
            internal_local: true,
            external_local: true,
            endpoints: LOCAL_EPS,
            internal: 0,
            external: 0,
        },
        Case {
            name: "internalTrafficPolicy is set and there are no local endpoints",
            internal_local: true,
            external_local: false,
            endpoints: REMOTE_EPS,
            internal: 1,
            external: 0,
        },
        Case {
            name: "externalTrafficPolicy is set and there are no local endpoints",
            internal_local: false,
            external_local: true,
            endpoints: REMOTE_EPS,
            internal: 0,
            external: 1,
        },
        Case {
            name: "both policies are set and there are no local endpoints",
            internal_local: true,
            external_local: true,
            endpoints: REMOTE_EPS,
            internal: 1,
            external: 1,
        },
        Case {
            name: "both policies are set and there are no endpoints at all",
            internal_local: true,
            external_local: true,
            endpoints: &[],
            internal: 0,
            external: 0,
        },
    ];
    for case in cases {
        let itp = if case.internal_local {
            "Local"
        } else {
            "Cluster"
        };
        let (service_type, node_port, etp) = if case.external_local {
            (
                "NodePort",
                ", nodePort: 123",
                "\n    externalTrafficPolicy: Local",
            )
        } else {
            ("ClusterIP", "", "")
        };
        let endpoints: Vec<String> = case
            .endpoints
            .iter()
            .map(|(ip, node)| {
                format!("{{addresses: [{ip}], conditions: {{ready: true}}, nodeName: {node}}}")
            })
            .collect();
        let objects = format!(
            "- apiVersion: v1
  kind: Service
  metadata: {{name: svc1, namespace: ns1}}
  spec:
    type: {service_type}
    clusterIP: 172.30.1.1
    clusterIPs: [172.30.1.1]
    ipFamilies: [IPv4]
    ports: [{{name: '', port: 80, protocol: TCP, targetPort: 80{node_port}}}]
    internalTrafficPolicy: {itp}{etp}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: svc1-1, namespace: ns1, labels: {{kubernetes.io/service-name: svc1}}}}
  addressType: IPv4
  endpoints: [{}]
  ports: [{{name: '', port: 80, protocol: TCP}}]
",
            endpoints.join(", ")
        );
        let scenario = Scenario::parse(&scenario_yaml(&[objects]));
        let fake = SharedFake::default();
        let (mut proxier, _) = new_proxier(&fake);
        let mut replay = scenario.replay();
        let step = replay.apply(&scenario.states[0]);
        let stats = proxier
            .sync(&replay.request(&step, true))
            .unwrap_or_else(|e| panic!("{}: sync failed: {e}", case.name));
        assert_eq!(
            (
                stats.no_local_endpoints_internal,
                stats.no_local_endpoints_external
            ),
            (case.internal, case.external),
            "{}",
            case.name
        );
    }
}

/// TestComputeProbability: upstream's ten-digit "1/n" strings, strictly growing as n falls.
#[test]
fn probabilities_are_upstreams_ten_digit_fractions() {
    let mut probabilities = Probabilities::default();
    for (n, text) in [
        (1, "1.0000000000"),
        (2, "0.5000000000"),
        (10, "0.1000000000"),
        (100, "0.0100000000"),
        (1000, "0.0010000000"),
        (10000, "0.0001000000"),
        (100000, "0.0000100000"),
        (100001, "0.0000099999"),
    ] {
        assert_eq!(probabilities.get(n), text, "1/{n}");
    }
    let mut previous = 0.0;
    for n in (2..=100000).rev() {
        let current: f64 = probabilities.get(n).parse().unwrap();
        assert!(current > previous, "1/{n} = {current} <= {previous}");
        previous = current;
    }
}

/// The restore input of a full sync of one ClusterIP Service with the given host facts.
fn restore_input_with(options: RuleOptions) -> String {
    let scenario = Scenario::parse(&scenario_yaml(&[service_yaml(
        "svc1",
        "172.30.0.41",
        "TCP",
    )]));
    let fake = SharedFake::default();
    let mut proxier = IptablesProxier::with_parts(
        Box::new(fake.clone()),
        Box::new(FakeConntrack::default()),
        options,
        IptablesConfig::default(),
    );
    let mut replay = scenario.replay();
    let step = replay.apply(&scenario.states[0]);
    sync(&mut proxier, &replay, &step, true);
    proxier
        .last_restore_input(IpFamily::V4)
        .unwrap()
        .to_string()
}

fn chain_rules(input: &str, chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    input
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// TestMasqueradeRule: KUBE-POSTROUTING returns unmarked packets, clears the mark and
/// masquerades, fully random when iptables can.
#[test]
fn masquerade_rule_is_fully_random_when_iptables_can() {
    for random_fully in [false, true] {
        let input = restore_input_with(RuleOptions {
            random_fully,
            ..RuleOptions::default()
        });
        let suffix = if random_fully { " --random-fully" } else { "" };
        assert_eq!(
            chain_rules(&input, "KUBE-POSTROUTING"),
            [
                "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".to_string(),
                "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000".to_string(),
                format!(
                    "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic \
                     requiring SNAT\" -j MASQUERADE{suffix}"
                ),
            ],
            "random_fully {random_fully}"
        );
    }
}

/// TestDropInvalidRule: KUBE-FORWARD drops conntrack-INVALID packets first, unless
/// nf_conntrack_tcp_be_liberal is set (then they are let through); with its nfacct object
/// available, the drop rule counts in it.
#[test]
fn invalid_packets_are_dropped_unless_conntrack_is_liberal() {
    let accept_rules = [
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark \
         0x4000/0x4000 -j ACCEPT",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m \
         conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ];
    for nfacct in [false, true] {
        for liberal in [false, true] {
            let input = restore_input_with(RuleOptions {
                conntrack_tcp_be_liberal: liberal,
                nfacct: NfacctCounters {
                    ct_state_invalid_dropped: nfacct,
                    localhost_nodeports_accepted: nfacct,
                },
                ..RuleOptions::default()
            });
            let mut expected: Vec<&str> = Vec::new();
            if !liberal && nfacct {
                expected.push(
                    "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name \
                     ct_state_invalid_dropped_pkts -j DROP",
                );
            } else if !liberal {
                expected.push("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
            }
            expected.extend(accept_rules);
            assert_eq!(
                chain_rules(&input, "KUBE-FORWARD"),
                expected,
                "tcp_be_liberal {liberal}, nfacct {nfacct}"
            );
        }
    }
}
