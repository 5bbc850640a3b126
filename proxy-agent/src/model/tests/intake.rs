// SPDX-License-Identifier: Apache-2.0
//! Many Services and EndpointSlices taken in at once (a cold start's batch) give the model
//! exactly what taking them one by one gives.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::k8s::fixtures::{mk_endpoint, mk_endpointslice, mk_service};
use crate::model::{ClusterState, IpFamily};

/// Enough of each kind for the two kinds to be taken in on two threads.
const MANY: usize = 5_000;

fn service(i: usize, port: i32) -> Arc<Service> {
    Arc::new(
        mk_service("ns1", &format!("svc{i}"))
            .cluster_ip(&format!("172.30.{}.{}", i / 250, i % 250 + 1))
            .port("http", port, "TCP")
            .build(),
    )
}

fn slice(i: usize, endpoints: usize) -> Arc<EndpointSlice> {
    let mut slice = mk_endpointslice("ns1", &format!("svc{i}-1"), &format!("svc{i}"), "IPv4")
        .port("http", 8080, "TCP");
    for e in 1..=endpoints {
        let endpoint = mk_endpoint(&format!("10.{e}.{}.{}", i / 250, i % 250 + 1)).node("node-a");
        slice = slice.endpoint(endpoint.build());
    }
    Arc::new(slice.build())
}

/// Each family's service ports and their endpoints, as text.
fn model_of(cluster: &ClusterState) -> Vec<BTreeMap<String, String>> {
    cluster
        .families()
        .iter()
        .map(|state| {
            state
                .services
                .services()
                .flat_map(|s| state.services.ports_of(s))
                .map(|(name, port)| {
                    let endpoints: Vec<String> = state
                        .endpoints
                        .get(name)
                        .map(|list| list.iter().map(|e| e.to_string()).collect())
                        .unwrap_or_default();
                    (name.to_string(), format!("{port:?} {endpoints:?}"))
                })
                .collect()
        })
        .collect()
}

#[test]
fn a_big_batch_of_both_kinds_makes_the_model_one_by_one_makes() {
    // Each kind in its order: a Service changed later in the batch, a Service deleted
    // before it was ever seen, a slice replaced by a later version, a slice deleted.
    let mut services: Vec<(Arc<Service>, bool)> =
        (0..MANY).map(|i| (service(i, 80), false)).collect();
    services.push((service(7, 81), false));
    services.push((service(MANY + 1, 80), true));
    services.push((service(9, 80), true));
    let mut slices: Vec<(Arc<EndpointSlice>, bool)> =
        (0..MANY).map(|i| (slice(i, 2), false)).collect();
    slices.push((slice(3, 4), false));
    slices.push((slice(4, 2), true));

    let families = [IpFamily::V4, IpFamily::V6];
    let mut together = ClusterState::new(&families, "node-a");
    assert!(together.services_and_slices(&services, &slices));
    let mut one_by_one = ClusterState::new(&families, "node-a");
    for (s, deleted) in &services {
        one_by_one.service(s, *deleted);
    }
    for (s, deleted) in &slices {
        one_by_one.endpoint_slice(s, *deleted);
    }
    let (a, b) = (together.apply_pending(), one_by_one.apply_pending());
    assert_eq!(a.changed, b.changed);
    assert_eq!(a.changed.len(), MANY);
    let model = model_of(&together);
    assert_eq!(model, model_of(&one_by_one));
    assert!(
        model[0]["ns1/svc7:http"].contains("port: 81"),
        "{}",
        model[0]["ns1/svc7:http"]
    );
    assert!(!model[0].contains_key("ns1/svc9:http"));
    assert_eq!(model[0]["ns1/svc3:http"].matches(":8080").count(), 4);
    assert!(model[0]["ns1/svc4:http"].ends_with("[]"));

    // A small batch (one thread) and nothing new: nothing pending.
    assert!(!together.services_and_slices(&services[10..20], &slices[10..20]));
}
