// SPDX-License-Identifier: Apache-2.0
//! The agent's API watchers and model against the test API server: through creates,
//! updates and deletes, a dropped watch, an API outage and a forced 410 Gone, the model
//! converges to exactly what the server holds — and a relist never makes unchanged
//! services flap.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proxy_agent::{
    k8s::{
        fixtures::{mk_endpoint, mk_endpointslice, mk_node, mk_service},
        watch::spawn_watchers,
    },
    model::{ClusterState, IpFamily},
};
use tests::{
    apiserver::{ServerConfig, TestApiServer, Verb},
    model_feed::feed,
};
use tokio::sync::mpsc;

/// How long the model may take to converge.
const WAIT: Duration = Duration::from_secs(20);

/// The model as comparable text: every service port and its endpoints.
fn render(state: &ClusterState) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for family in state.families() {
        for (name, port) in family.services.iter() {
            let endpoints = family
                .endpoints
                .get(name)
                .map(|eps| {
                    let mut v: Vec<String> = eps
                        .iter()
                        .map(|e| format!("{}:{}/{}{}", e.ip, e.port, e.ready, e.is_local))
                        .collect();
                    v.sort();
                    v.join(",")
                })
                .unwrap_or_default();
            out.insert(
                format!("{:?} {name}", family.family),
                format!("{port:?} -> [{endpoints}]"),
            );
        }
    }
    out
}

/// The model the server's objects should produce, built without any watch.
fn expected(server: &TestApiServer) -> BTreeMap<String, String> {
    let mut state = ClusterState::new(&[IpFamily::V4, IpFamily::V6], "node-a");
    for svc in server.list::<Service>().unwrap() {
        state.service(&Arc::new(svc), false);
    }
    for slice in server.list::<EndpointSlice>().unwrap() {
        state.endpoint_slice(&slice, false);
    }
    state.apply_pending();
    render(&state)
}

fn web(ports: &[(&str, i32)], eps: &[(&str, &str)]) -> (Service, EndpointSlice) {
    let mut svc = mk_service("ns1", "web").cluster_ip("172.30.0.10");
    let mut slice = mk_endpointslice("ns1", "web-1", "web", "IPv4");
    for (name, port) in ports {
        svc = svc.port(name, *port, "TCP");
        slice = slice.port(name, *port + 8000, "TCP");
    }
    for (ip, node) in eps {
        slice = slice.endpoint(mk_endpoint(ip).node(node).build());
    }
    (svc.build(), slice.build())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_model_converge_through_changes_drops_outages_and_410() {
    let server = TestApiServer::start_with(ServerConfig {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await
    .unwrap();
    server
        .create(&mk_node("node-a", &[], &["10.0.0.0/24"], &["192.168.0.2"]))
        .unwrap();
    let (svc, slice) = web(
        &[("http", 80)],
        &[("10.0.1.1", "node-a"), ("10.0.1.2", "node-b")],
    );
    server.create(&svc).unwrap();
    server.create(&slice).unwrap();
    server
        .create(
            &mk_service("ns2", "other")
                .cluster_ips(&["172.30.0.20", "fd00::20"])
                .ip_families(&["IPv4", "IPv6"])
                .port("dns", 53, "UDP")
                .build(),
        )
        .unwrap();
    // Not ours: another proxy's service and a headless one are filtered by label.
    server
        .create(
            &mk_service("ns3", "theirs")
                .cluster_ip("172.30.0.30")
                .port("x", 1, "TCP")
                .label("service.kubernetes.io/service-proxy-name", "other-proxy")
                .build(),
        )
        .unwrap();

    let (tx, rx) = mpsc::channel(1024);
    spawn_watchers(
        server.client().unwrap(),
        "node-a",
        &[IpFamily::V4, IpFamily::V6],
        tx,
    );
    let mut consumer = feed(rx, render);
    consumer
        .converged(&expected(&server), WAIT, "initial list")
        .await;
    assert!(
        consumer
            .model
            .borrow()
            .keys()
            .all(|k| !k.contains("theirs")),
        "labelled services stay out"
    );

    // Updates and deletes.
    let (svc2, slice2) = web(
        &[("http", 80), ("https", 443)],
        &[("10.0.1.1", "node-a"), ("10.0.1.3", "node-c")],
    );
    server.apply(&svc2).unwrap();
    server.apply(&slice2).unwrap();
    consumer.converged(&expected(&server), WAIT, "update").await;
    server.delete::<Service>(Some("ns2"), "other").unwrap();
    consumer.converged(&expected(&server), WAIT, "delete").await;

    // A dropped watch: the watchers resume, no relist needed.
    server.drop_watches();
    let (svc3, slice3) = web(&[("http", 8080)], &[("10.0.1.9", "node-a")]);
    server.apply(&svc3).unwrap();
    server.apply(&slice3).unwrap();
    consumer
        .converged(&expected(&server), WAIT, "after a dropped watch")
        .await;

    // An outage during which history is compacted: the watch comes back to a 410 Gone and
    // the watchers relist. Objects that did not change must not flap.
    let lists_before = server.request_count(Verb::List, "services");
    let deletes_before = *consumer.deletes.borrow();
    server.set_unavailable(true);
    server.drop_watches();
    server
        .create(
            &mk_service("ns4", "added-during-outage")
                .cluster_ip("172.30.0.40")
                .port("p", 9, "TCP")
                .build(),
        )
        .unwrap();
    // Bury the history the watchers knew, so resuming needs a relist.
    for i in 0..3 {
        server
            .apply(
                &mk_service("ns5", &format!("churn-{i}"))
                    .cluster_ip(&format!("172.30.5.{i}"))
                    .port("p", 1, "TCP")
                    .build(),
            )
            .unwrap();
    }
    server.compact();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.set_unavailable(false);
    consumer
        .converged(&expected(&server), WAIT, "after an outage and a 410 Gone")
        .await;
    assert!(
        server.request_count(Verb::List, "services") > lists_before,
        "a relist happened"
    );
    assert!(
        server.requests().iter().any(|r| r.expired),
        "the server answered a watch with 410 Gone"
    );
    assert_eq!(
        *consumer.deletes.borrow(),
        deletes_before,
        "a relist of unchanged objects reports no deletion"
    );

    // And everything still flows afterwards.
    server
        .delete::<EndpointSlice>(Some("ns1"), "web-1")
        .unwrap();
    consumer
        .converged(&expected(&server), WAIT, "delete after the relist")
        .await;
}
