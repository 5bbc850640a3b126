// SPDX-License-Identifier: Apache-2.0
//! parse_objects: YAML -> typed cluster objects.

use crate::k8s::convert::objects::{
    Error, json_items_split_from, objects_from_value, parse_json_objects_fingerprinted,
    top_level_split,
};
use crate::k8s::convert::{ClusterObject, parse_objects};
use crate::model::{NamespacedName, ObjectKind};

const SCENARIO_OBJECTS: &str = "
- apiVersion: v1
  kind: Node
  metadata:
    name: test-node
    labels: {kubernetes.io/hostname: test-node, topology.kubernetes.io/zone: zone-a}
  spec: {podCIDR: 10.0.0.0/8, podCIDRs: [10.0.0.0/8]}
  status:
    addresses:
    - {type: InternalIP, address: 192.168.0.2}
- apiVersion: v1
  kind: Service
  metadata: {name: svc1, namespace: ns1}
  spec: {clusterIP: 172.30.0.41, ports: [{name: http, port: 80, protocol: TCP}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: svc1-abc, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}
  addressType: IPv4
  endpoints: [{addresses: [10.180.0.1], nodeName: test-node, conditions: {ready: true}}]
  ports: [{name: http, port: 80, protocol: TCP}]
- apiVersion: networking.k8s.io/v1
  kind: ServiceCIDR
  metadata: {name: kubernetes}
  spec: {cidrs: [172.30.0.0/16, 'fd00:30::/112']}
";

#[test]
fn a_scenario_objects_list() {
    let objects = parse_objects(SCENARIO_OBJECTS).unwrap();
    let kinds: Vec<_> = objects.iter().map(|o| (o.kind(), o.name())).collect();
    assert_eq!(
        kinds,
        [
            (ObjectKind::Node, NamespacedName::new("", "test-node")),
            (ObjectKind::Service, NamespacedName::new("ns1", "svc1")),
            (
                ObjectKind::EndpointSlice,
                NamespacedName::new("ns1", "svc1-abc")
            ),
            (
                ObjectKind::ServiceCidr,
                NamespacedName::new("", "kubernetes")
            ),
        ]
    );
    let ClusterObject::Node(node) = &objects[0] else {
        panic!()
    };
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"],
        "zone-a"
    );
    let ClusterObject::Service(svc) = &objects[1] else {
        panic!()
    };
    assert_eq!(
        svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
        80
    );
    let ClusterObject::ServiceCidr(cidr) = &objects[3] else {
        panic!()
    };
    assert_eq!(cidr.spec.as_ref().unwrap().cidrs.as_ref().unwrap().len(), 2);

    let value: serde_yaml::Value = serde_yaml::from_str(SCENARIO_OBJECTS).unwrap();
    assert_eq!(objects_from_value(value).unwrap(), objects);
}

#[test]
fn multiple_documents_and_lists() {
    let yaml = "
---
apiVersion: v1
kind: Service
metadata: {name: a, namespace: ns}
spec: {clusterIP: 10.0.0.1}
---
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: b, namespace: ns}
- apiVersion: v1
  kind: Node
  metadata: {name: n}
";
    let names: Vec<String> = parse_objects(yaml)
        .unwrap()
        .iter()
        .map(|o| format!("{}:{}", o.kind(), o.name()))
        .collect();
    assert_eq!(names, ["Service:ns/a", "Service:ns/b", "Node:/n"]);
    assert!(parse_objects("").unwrap().is_empty());
}

#[test]
fn errors_say_which_object() {
    let unsupported = parse_objects("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n");
    assert!(matches!(
        unsupported,
        Err(Error::UnsupportedKind { ref kind, .. }) if kind == "Pod"
    ));
    let wrong_group = parse_objects("apiVersion: v1\nkind: EndpointSlice\nmetadata: {name: p}\n");
    assert!(matches!(wrong_group, Err(Error::UnsupportedKind { .. })));

    let untyped = parse_objects("- metadata: {name: x}\n");
    assert!(matches!(
        untyped,
        Err(Error::MissingTypeMeta {
            document: 0,
            index: 0
        })
    ));

    let second_bad = "
- apiVersion: v1
  kind: Service
  metadata: {name: ok}
- apiVersion: v1
  kind: Service
  metadata: {name: bad}
  spec: {ports: [{port: eighty}]}
";
    assert!(matches!(
        parse_objects(second_bad),
        Err(Error::Decode {
            index: 1,
            kind: ObjectKind::Service,
            ..
        })
    ));

    assert!(matches!(
        parse_objects("a: [unclosed"),
        Err(Error::Yaml { .. })
    ));
}

#[test]
fn mk_node_builds_what_the_api_serves() {
    let objects = parse_objects(SCENARIO_OBJECTS).unwrap();
    let ClusterObject::Node(parsed) = &objects[0] else {
        panic!("a Node first")
    };
    let built = crate::k8s::fixtures::mk_node(
        "test-node",
        &[
            ("kubernetes.io/hostname", "test-node"),
            ("topology.kubernetes.io/zone", "zone-a"),
        ],
        &["10.0.0.0/8"],
        &["192.168.0.2"],
    );
    assert_eq!(&built, parsed);
}

/// The JSON text of each object of [`SCENARIO_OBJECTS`].
fn scenario_objects_as_json() -> Vec<String> {
    let value: serde_yaml::Value = serde_yaml::from_str(SCENARIO_OBJECTS).unwrap();
    let serde_yaml::Value::Sequence(items) = value else {
        panic!("a sequence")
    };
    items
        .iter()
        .map(|item| serde_json::to_string(item).unwrap())
        .collect()
}

fn parse_json(text: &str) -> Result<Vec<(ClusterObject, u64)>, Error> {
    parse_json_objects_fingerprinted(text, |object, fingerprint| (object, fingerprint))
}

fn objects_of(parsed: Vec<(ClusterObject, u64)>) -> Vec<ClusterObject> {
    parsed.into_iter().map(|(object, _)| object).collect()
}

#[test]
fn json_in_every_form_gives_the_objects_the_yaml_form_gives() {
    let expected = parse_objects(SCENARIO_OBJECTS).unwrap();
    let items = scenario_objects_as_json();

    let array = format!("[{}]", items.join(","));
    assert_eq!(objects_of(parse_json(&array).unwrap()), expected);

    // Values one after the other: one object, null (nothing), a List, an array.
    let list = format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [{}, {}]}}"#,
        items[1], items[2]
    );
    let stream = format!("{}\nnull\n{list}\n  [ {} ]\n", items[0], items[3]);
    assert_eq!(objects_of(parse_json(&stream).unwrap()), expected);
    // A List whose kind is spelled with an escape is still a List.
    let escaped = format!(
        r#"{{"apiVersion": "v1", "kind": "Li\u0073t", "items": [{}, {}, {}, {}]}}"#,
        items[0], items[1], items[2], items[3]
    );
    assert_eq!(objects_of(parse_json(&escaped).unwrap()), expected);
    assert!(parse_json("").unwrap().is_empty());
    assert!(parse_json("[]").unwrap().is_empty());
}

#[test]
fn a_json_fingerprint_follows_the_objects_text() {
    let items = scenario_objects_as_json();
    let text = format!("[{}]", items.join(","));
    let first: Vec<u64> = parse_json(&text)
        .unwrap()
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    let again: Vec<u64> = parse_json(&text)
        .unwrap()
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    assert_eq!(first, again, "the same text, the same fingerprints");
    let distinct: std::collections::HashSet<u64> = first.iter().copied().collect();
    assert_eq!(distinct.len(), first.len());

    let changed = text.replace("172.30.0.41", "172.30.0.42");
    let after: Vec<u64> = parse_json(&changed)
        .unwrap()
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    let moved: Vec<bool> = first.iter().zip(&after).map(|(a, b)| a != b).collect();
    assert_eq!(
        moved,
        [false, true, false, false],
        "only the Service changed"
    );
}

#[test]
fn json_errors_say_which_object_as_the_yaml_ones_do() {
    assert!(matches!(
        parse_json(r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}"#),
        Err(Error::UnsupportedKind { ref kind, .. }) if kind == "Pod"
    ));
    assert!(matches!(
        parse_json(r#"[{"metadata": {"name": "x"}}]"#),
        Err(Error::MissingTypeMeta {
            document: 0,
            index: 0
        })
    ));
    assert!(matches!(
        parse_json(r#"{"apiVersion": "v1", "kind": "Service"} [7]"#),
        Err(Error::MissingTypeMeta {
            document: 1,
            index: 0
        })
    ));
    let second_bad = r#"[
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ok"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad"},
         "spec": {"ports": [{"port": "eighty"}]}}
    ]"#;
    assert!(matches!(
        parse_json(second_bad),
        Err(Error::DecodeJson {
            index: 1,
            kind: ObjectKind::Service,
            ..
        })
    ));
    assert!(matches!(
        parse_json(r#"[{"apiVersion": "v1""#),
        Err(Error::Json { document: 0, .. })
    ));
    assert!(matches!(
        parse_json("apiVersion: v1\nkind: Service\n"),
        Err(Error::Json { .. })
    ));
}

/// A stream of `count` Service objects, one per line, `bad` (if any) with a port that is
/// not a number.
fn many_services_json(count: usize, bad: Option<usize>) -> String {
    (0..count)
        .map(|i| {
            let port = if Some(i) == bad {
                r#""eighty""#.to_string()
            } else {
                "80".to_string()
            };
            format!(
                r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"namespace":"ns","name":"svc-{i}"}},"spec":{{"clusterIP":"10.96.{}.{}","ports":[{{"port":{port}}}]}}}}"#,
                i / 250,
                i % 250 + 1
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_big_json_manifest_is_decoded_in_parallel_in_order_and_as_one_thread_would() {
    // Above the size where decoding is split among threads, and not a whole round.
    let count = 9_000;
    let text = many_services_json(count, None);
    let parsed = parse_json(&text).unwrap();
    assert_eq!(parsed.len(), count);
    for (i, (object, _)) in parsed.iter().enumerate() {
        let ClusterObject::Service(service) = object else {
            panic!("object {i} is not a Service")
        };
        assert_eq!(
            service.metadata.name.as_deref(),
            Some(format!("svc-{i}").as_str())
        );
    }
    // Each object alone gives the same object and fingerprint as in the big manifest.
    for i in [0, 1_023, 1_024, 4_095, 8_999] {
        let alone = parse_json(text.lines().nth(i).unwrap()).unwrap();
        assert_eq!(alone, vec![parsed[i].clone()], "object {i}");
    }
}

#[test]
fn a_big_json_manifest_reports_the_first_error_in_text_order() {
    let count = 9_000;
    // A bad object decoded by a second thread is reported with its own position.
    let bad = many_services_json(count, Some(6_000));
    assert!(matches!(
        parse_json(&bad),
        Err(Error::DecodeJson {
            document: 6_000,
            index: 0,
            ..
        })
    ));
    // A decoding error before a broken text is met first, as it comes first.
    let broken_after = format!("{bad}\n{{\"apiVersion\": ");
    assert!(matches!(
        parse_json(&broken_after),
        Err(Error::DecodeJson {
            document: 6_000,
            ..
        })
    ));
    // With every object good, the broken text is the error.
    let good_then_broken = format!("{}\n{{\"apiVersion\": ", many_services_json(count, None));
    assert!(matches!(
        parse_json(&good_then_broken),
        Err(Error::Json {
            document: 9_000,
            ..
        })
    ));
}

/// The objects' texts a scan finds (with their document and index) and its error, as text.
fn scanned(text: &str, split_from: usize) -> (Vec<(usize, usize, &str)>, Option<String>) {
    let (items, error) = json_items_split_from(text, split_from);
    (
        items
            .into_iter()
            .map(|(document, index, item)| (document, index, item.get()))
            .collect(),
        error.map(|e| e.to_string()),
    )
}

#[test]
fn a_text_scanned_in_halves_gives_what_one_scan_gives() {
    let services = many_services_json(400, None);
    let lines: Vec<&str> = services.lines().collect();
    // Documents of every form, one per line: objects, arrays, Lists, nulls.
    let mixed = lines
        .chunks(3)
        .enumerate()
        .map(|(i, three)| match i % 4 {
            0 => format!("[{}]", three.join(",")),
            1 => format!(r#"{{"kind":"List","items":[{}]}}"#, three.join(",")),
            2 => format!("{}\nnull", three.join("\n")),
            _ => three.join("\n"),
        })
        .collect::<Vec<_>>()
        .join("\n");
    // A `{` that starts a line inside a value, at the middle: the split is not sound.
    let inside = format!("[\n{}\n]", lines.join(",\n"));
    // Errors in either half: their line and column count from the start of the text.
    let broken_tail = format!("{services}\n{{\"apiVersion\": ");
    let broken_head = format!("{{\"apiVersion\": \n{services}");
    for (what, text, splits) in [
        ("services", &services, true),
        ("mixed", &mixed, true),
        ("inside", &inside, true),
        ("broken tail", &broken_tail, true),
        ("broken head", &broken_head, true),
        (
            "indented",
            &serde_json::to_string_pretty(
                &serde_json::json!({"kind": "List", "items": [{"a": 1}, {"b": 2}]}),
            )
            .unwrap(),
            false,
        ),
    ] {
        assert_eq!(top_level_split(text).is_some(), splits, "{what}");
        let whole = scanned(text, usize::MAX);
        assert_eq!(scanned(text, 0), whole, "{what}");
        assert!(!whole.0.is_empty() || what == "broken head", "{what}");
    }
    // What the halves give is the objects in order, numbered across the whole text.
    let (items, error) = scanned(&mixed, 0);
    assert_eq!(error, None);
    assert_eq!(items.len(), 400);
    assert!(
        items.last().unwrap().0 > 200,
        "documents numbered from the text's start"
    );
    assert!(scanned(&broken_tail, 0).1.unwrap().contains("line 401"));
}
