// SPDX-License-Identifier: Apache-2.0
//! Bad input through the agent's watchers and model, against the test API server (which,
//! unlike a real one, stores whatever it is given): Services and EndpointSlices with
//! invalid or non-canonical addresses, ports out of range, repeated ports, unknown
//! protocols, mismatched families, a slice of 10,000 endpoints, a slice without the
//! service-name label, unicode names and huge annotations, mixed with good objects. The
//! model must hold exactly the good objects (normalised where upstream normalises), each
//! bad object must be reported exactly once, and changes keep flowing afterwards.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Service;
use proxy_agent::{
    k8s::{
        fixtures::{mk_endpoint, mk_endpointslice, mk_node, mk_service},
        watch::spawn_watchers,
    },
    model::{ClusterState, IpFamily, ObjectKind},
};
use tests::{
    apiserver::TestApiServer,
    model_feed::{Model, Reports, feed},
};
use tokio::sync::mpsc;

/// How long the model may take to converge.
const WAIT: Duration = Duration::from_secs(30);

// The model: service ports per family as "V4 ns/name:port/PROTO" -> "clusterIP:port
// [endpoints]"; long endpoint lists are summarised (count, first, last, and a digest of all
// of them).

fn endpoint_list(mut endpoints: Vec<String>) -> String {
    endpoints.sort();
    if endpoints.len() <= 8 {
        return endpoints.join(",");
    }
    // FNV-1a over the sorted list: equal lists, equal digests.
    let digest = endpoints
        .iter()
        .flat_map(|e| e.bytes().chain([b',']))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    format!(
        "{} endpoints {}..{} #{digest:016x}",
        endpoints.len(),
        endpoints[0],
        endpoints[endpoints.len() - 1]
    )
}

fn render(state: &ClusterState) -> Model {
    let mut out = Model::new();
    for family in state.families() {
        for (name, port) in family.services.iter() {
            let endpoints = family
                .endpoints
                .get(name)
                .map(|eps| eps.iter().map(|e| e.to_string()).collect())
                .unwrap_or_default();
            out.insert(
                format!("{:?} {name}/{}", family.family, name.protocol),
                format!(
                    "{} [{}]",
                    std::net::SocketAddr::new(port.cluster_ip, port.port),
                    endpoint_list(endpoints)
                ),
            );
        }
    }
    out
}

fn entry(model: &mut Model, key: &str, value: &str) {
    model.insert(key.to_owned(), value.to_owned());
}

const BIG: u32 = 10_000;

fn big_ip(i: u32) -> String {
    format!("10.9.{}.{}", i >> 8, i & 0xff)
}

fn good_objects(server: &TestApiServer) {
    // A plain service with two slices; a third slice of it is bad (below).
    server
        .create(
            &mk_service("ns1", "web")
                .cluster_ip("172.30.0.10")
                .port("http", 80, "TCP")
                .build(),
        )
        .unwrap();
    server
        .create(
            &mk_endpointslice("ns1", "web-1", "web", "IPv4")
                .port("http", 8080, "TCP")
                .endpoint(mk_endpoint("10.0.1.1").node("node-a"))
                .endpoint(mk_endpoint("10.0.1.2").node("node-b"))
                .build(),
        )
        .unwrap();
    // Dual-stack, with a slice per family.
    server
        .create(
            &mk_service("ns1", "dual")
                .cluster_ips(&["172.30.0.11", "fd00::11"])
                .port("dns", 53, "UDP")
                .build(),
        )
        .unwrap();
    server
        .create(
            &mk_endpointslice("ns1", "dual-v4", "dual", "IPv4")
                .port("dns", 5353, "UDP")
                .endpoint(mk_endpoint("10.0.2.1"))
                .build(),
        )
        .unwrap();
    server
        .create(
            &mk_endpointslice("ns1", "dual-v6", "dual", "IPv6")
                .port("dns", 5353, "UDP")
                .endpoint(mk_endpoint("fd00:0::0002:0001"))
                .build(),
        )
        .unwrap();
    // Normalised: leading zeros, a malformed external IP (skipped), duplicate addresses.
    server
        .create(
            &mk_service("ns1", "odd")
                .cluster_ip("172.030.000.012")
                .port("p", 81, "TCP")
                .external_ips(&["bogus", "192.168.001.002"])
                .build(),
        )
        .unwrap();
    server
        .create(
            &mk_endpointslice("ns1", "odd-1", "odd", "IPv4")
                .port("p", 8081, "TCP")
                .endpoint(mk_endpoint("010.000.003.001"))
                .endpoint(mk_endpoint("10.0.3.1"))
                .build(),
        )
        .unwrap();
    // Slice ports of one name merge (as upstream).
    server
        .create(
            &mk_service("ns1", "merged")
                .cluster_ip("172.30.0.13")
                .port("http", 80, "TCP")
                .build(),
        )
        .unwrap();
    server
        .create(
            &mk_endpointslice("ns1", "merged-1", "merged", "IPv4")
                .port("http", 8080, "TCP")
                .port("http", 8081, "TCP")
                .endpoint(mk_endpoint("10.0.4.1"))
                .build(),
        )
        .unwrap();
    // Unicode names and a huge annotation.
    server
        .create(
            &mk_service("ns1", "wéb-☃")
                .cluster_ip("172.30.0.14")
                .port("ℌttp", 80, "TCP")
                .annotation("example.com/blob", &"☃".repeat(200_000))
                .build(),
        )
        .unwrap();
    server
        .create(
            &mk_endpointslice("ns1", "wéb-☃-1", "wéb-☃", "IPv4")
                .port("ℌttp", 8080, "TCP")
                .endpoint(mk_endpoint("10.0.5.1").node("node-a"))
                .annotation(
                    "endpoints.kubernetes.io/last-change-trigger-time",
                    &"x".repeat(100_000),
                )
                .build(),
        )
        .unwrap();
    // 10,000 endpoints in one slice.
    server
        .create(
            &mk_service("ns1", "big")
                .cluster_ip("172.30.0.15")
                .port("http", 80, "TCP")
                .build(),
        )
        .unwrap();
    let mut big = mk_endpointslice("ns1", "big-1", "big", "IPv4").port("http", 8080, "TCP");
    for i in 0..BIG {
        big = big.endpoint(mk_endpoint(&big_ip(i)).node(&format!("node-{}", i % 50)));
    }
    server.create(&big.build()).unwrap();
}

fn bad_objects(server: &TestApiServer) {
    let service = |name: &str| mk_service("ns2", name).cluster_ip("172.30.1.1");
    for svc in [
        mk_service("ns2", "bad-ip")
            .cluster_ip("172.30.1.x")
            .port("p", 80, "TCP"),
        service("bad-port").port("p", 70_000, "TCP"),
        service("dup-port")
            .port("a", 80, "TCP")
            .port("b", 80, "TCP"),
        service("bad-proto").port("p", 80, "ICMP"),
        service("bad-family")
            .ip_families(&["IPv6"])
            .port("p", 80, "TCP"),
    ] {
        server.create(&svc.build()).unwrap();
    }

    // Bad slices of the good service "web": refused, while web-1 still counts.
    let slice = |name: &str| mk_endpointslice("ns1", name, "web", "IPv4");
    for bad in [
        slice("web-bad-ip")
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.1.256")),
        slice("web-mixed")
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.1.3"))
            .endpoint(mk_endpoint("fd00::3")),
        slice("web-bad-port")
            .port("http", 70_000, "TCP")
            .endpoint(mk_endpoint("10.0.1.4")),
        slice("web-bad-proto")
            .port("http", 8080, "HTTP")
            .endpoint(mk_endpoint("10.0.1.5")),
        // No service-name label: ignored (logged), not refused, and not web's either.
        slice("web-orphan")
            .port("http", 8080, "TCP")
            .endpoint(mk_endpoint("10.0.1.6"))
            .with(|s| s.metadata.labels = None),
    ] {
        server.create(&bad.build()).unwrap();
    }
}

fn expected_good() -> Model {
    let mut want = Model::new();
    entry(
        &mut want,
        "V4 ns1/web:http/TCP",
        "172.30.0.10:80 [10.0.1.1:8080,10.0.1.2:8080]",
    );
    entry(
        &mut want,
        "V4 ns1/dual:dns/UDP",
        "172.30.0.11:53 [10.0.2.1:5353]",
    );
    entry(
        &mut want,
        "V6 ns1/dual:dns/UDP",
        "[fd00::11]:53 [[fd00::2:1]:5353]",
    );
    entry(
        &mut want,
        "V4 ns1/odd:p/TCP",
        "172.30.0.12:81 [10.0.3.1:8081]",
    );
    entry(
        &mut want,
        "V4 ns1/merged:http/TCP",
        "172.30.0.13:80 [10.0.4.1:8080,10.0.4.1:8081]",
    );
    entry(
        &mut want,
        "V4 ns1/wéb-☃:ℌttp/TCP",
        "172.30.0.14:80 [10.0.5.1:8080]",
    );
    let big: Vec<String> = (0..BIG).map(|i| format!("{}:8080", big_ip(i))).collect();
    entry(
        &mut want,
        "V4 ns1/big:http/TCP",
        &format!("172.30.0.15:80 [{}]", endpoint_list(big)),
    );
    want
}

fn expected_reports() -> Reports {
    let service = |name: &str, reason: &str| {
        (
            ObjectKind::Service,
            format!("ns2/{name}"),
            reason.to_owned(),
        )
    };
    let slice = |name: &str, reason: &str| {
        (
            ObjectKind::EndpointSlice,
            format!("ns1/{name}"),
            reason.to_owned(),
        )
    };
    let mut reports = vec![
        service("bad-ip", "clusterIP \"172.30.1.x\" is not an IP address"),
        service("bad-port", "port \"p\": port 70000 is out of range"),
        service("dup-port", "port \"b\": duplicate port 80/TCP"),
        service("bad-proto", "port \"p\": unknown protocol \"ICMP\""),
        service(
            "bad-family",
            "clusterIPs[0] 172.30.1.1 is not of family IPv6",
        ),
        slice(
            "web-bad-ip",
            "endpoint address \"10.0.1.256\" is not an IP address",
        ),
        slice(
            "web-mixed",
            "endpoint address fd00::3 is not of addressType IPv4",
        ),
        slice("web-bad-port", "port \"http\": 70000 is out of range"),
        slice("web-bad-proto", "port \"http\": unknown protocol \"HTTP\""),
    ];
    reports.sort();
    reports
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_objects_are_refused_once_and_good_ones_all_reach_the_model() {
    let server = TestApiServer::start().await.unwrap();
    server
        .create(&mk_node("node-a", &[], &["10.0.0.0/24"], &["192.168.0.2"]))
        .unwrap();
    good_objects(&server);
    bad_objects(&server);

    let (tx, rx) = mpsc::channel(1024);
    spawn_watchers(
        server.client().unwrap(),
        "node-a",
        &[IpFamily::V4, IpFamily::V6],
        tx,
    );
    let mut consumer = feed(rx, render);
    let mut want = expected_good();
    consumer.converged(&want, WAIT, "initial list").await;
    consumer
        .reported(&expected_reports(), WAIT, "initial list")
        .await;

    // A bad object updated without changing why it is bad is not reported again; a new
    // good service still reaches the model.
    let mut bad = server
        .get::<Service>(Some("ns2"), "bad-port")
        .unwrap()
        .expect("stored");
    bad.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert("touched".into(), "yes".into());
    server.update(&bad).unwrap();
    server
        .create(
            &mk_service("ns1", "late")
                .cluster_ip("172.30.0.16")
                .port("p", 82, "TCP")
                .build(),
        )
        .unwrap();
    entry(&mut want, "V4 ns1/late:p/TCP", "172.30.0.16:82 []");
    consumer
        .converged(&want, WAIT, "after a late service")
        .await;
    assert_eq!(consumer.sorted_reports(), expected_reports());

    // Fixing a refused object brings it in; fixing a refused slice adds its endpoints.
    let fixed = mk_service("ns2", "bad-port")
        .cluster_ip("172.30.1.1")
        .port("p", 7000, "TCP")
        .build();
    server.apply(&fixed).unwrap();
    let fixed_slice = mk_endpointslice("ns1", "web-bad-ip", "web", "IPv4")
        .port("http", 8080, "TCP")
        .endpoint(mk_endpoint("10.0.1.7"))
        .build();
    server.apply(&fixed_slice).unwrap();
    entry(&mut want, "V4 ns2/bad-port:p/TCP", "172.30.1.1:7000 []");
    entry(
        &mut want,
        "V4 ns1/web:http/TCP",
        "172.30.0.10:80 [10.0.1.1:8080,10.0.1.2:8080,10.0.1.7:8080]",
    );
    consumer.converged(&want, WAIT, "after fixes").await;
    assert_eq!(consumer.sorted_reports(), expected_reports());
}
