// SPDX-License-Identifier: Apache-2.0
//! kube-rs clients (watcher, reflector, events Recorder, plain Api calls) against the
//! test API server, including its faults: dropped watches, compaction (410), outages.

use std::{collections::BTreeMap, fmt::Debug, future::Future, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        core::v1::{Node, ObjectReference, Service, ServiceSpec},
        discovery::v1::{Endpoint, EndpointSlice},
        networking::v1::{ServiceCIDR, ServiceCIDRSpec},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        WatchStreamExt,
        events::{Event as RecorderEvent, EventType, Recorder, Reporter},
        reflector::{self, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use serde_json::json;
use tests::apiserver::{Outage, ServerConfig, TestApiServer, Verb};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn meta(namespace: Option<&str>, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: (!labels.is_empty()).then(|| {
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        }),
        ..Default::default()
    }
}

fn service(name: &str, cluster_ip: &str, labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: meta(Some("default"), name, labels),
        spec: Some(ServiceSpec {
            cluster_ip: Some(cluster_ip.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn endpoint_slice(name: &str, service: &str, addresses: &[&str]) -> EndpointSlice {
    EndpointSlice {
        metadata: meta(
            Some("default"),
            name,
            &[("kubernetes.io/service-name", service)],
        ),
        address_type: "IPv4".to_string(),
        endpoints: Some(
            addresses
                .iter()
                .map(|a| Endpoint {
                    addresses: vec![a.to_string()],
                    ..Default::default()
                })
                .collect(),
        ),
        ports: None,
    }
}

fn node(name: &str, zone: &str) -> Node {
    Node {
        metadata: meta(None, name, &[("topology.kubernetes.io/zone", zone)]),
        ..Default::default()
    }
}

/// A reflector running in the background; aborted when dropped.
struct Reflected<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    task: JoinHandle<()>,
}

impl<K: Resource<DynamicType = ()> + 'static> Drop for Reflected<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn reflect<K>(api: Api<K>, config: watcher::Config) -> Reflected<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(WAIT, store.wait_until_ready())
        .await
        .expect("reflector ready in time")
        .expect("reflector writer alive");
    Reflected { store, task }
}

/// `namespace/name -> resourceVersion` of every object in a reflector store.
fn store_state<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<K>,
) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                o.resource_version().unwrap_or_default(),
            )
        })
        .collect()
}

/// The same for what the server holds.
fn server_state<K>(server: &TestApiServer) -> BTreeMap<String, String>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    server
        .list::<K>()
        .unwrap()
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                o.resource_version().unwrap_or_default(),
            )
        })
        .collect()
}

fn names<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<String> {
    let mut names: Vec<String> = store.state().iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

/// Polls `condition` until it holds, failing the test after [`WAIT`].
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
}

async fn start() -> (TestApiServer, Client) {
    init_tracing();
    let server = TestApiServer::start().await.unwrap();
    let client = server.client().unwrap();
    (server, client)
}

fn rv_param(uri: &str) -> Option<u64> {
    uri.split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn kubeconfig_client_lists_gets_and_discovers() {
    init_tracing();
    let server = TestApiServer::start().await.unwrap();
    server.create(&service("web", "10.0.0.10", &[])).unwrap();
    server.create(&node("node-a", "z1")).unwrap();

    let path = std::env::temp_dir().join(format!(
        "test-apiserver-{}-{}.yaml",
        std::process::id(),
        server.addr().port()
    ));
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(
        config.cluster_url.to_string().trim_end_matches('/'),
        server.url()
    );
    let client = Client::try_from(config).unwrap();

    let version = within("version", client.apiserver_version()).await.unwrap();
    assert_eq!(version.major, "1");

    let services: Api<Service> = Api::default_namespaced(client.clone());
    let list = within("list", services.list(&ListParams::default()))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let web = within("get", services.get("web")).await.unwrap();
    assert_eq!(web.spec.unwrap().cluster_ip.as_deref(), Some("10.0.0.10"));
    assert!(web.metadata.uid.is_some() && web.metadata.creation_timestamp.is_some());

    let err = within("get missing", services.get("missing"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );

    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        within("list nodes", nodes.list(&ListParams::default()))
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    let discovery = within("discovery", kube::Discovery::new(client).run())
        .await
        .unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for group in ["", "discovery.k8s.io", "networking.k8s.io", "events.k8s.io"] {
        assert!(
            groups.iter().any(|g| g == group),
            "group {group:?} in {groups:?}"
        );
    }
    assert_eq!(server.request_count(Verb::Get, "services"), 2);
    assert_eq!(server.request_count(Verb::List, "services"), 1);
}

#[tokio::test]
async fn reflectors_follow_services_and_endpoint_slices() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    server
        .create(&endpoint_slice("a-1", "a", &["10.1.0.1"]))
        .unwrap();

    let services = reflect(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .await;
    let slices = reflect(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .await;
    assert_eq!(names(&services.store), ["a"]);
    assert_eq!(names(&slices.store), ["a-1"]);
    // kube-rs pages its initial list and asks for bookmarks.
    let first_list = server
        .requests()
        .into_iter()
        .find(|r| r.is(Verb::List, "services"))
        .unwrap();
    assert!(first_list.uri.contains("limit=500"), "{}", first_list.uri);
    eventually("watches open", || {
        server.open_watches("services") == 1 && server.open_watches("endpointslices") == 1
    })
    .await;
    let first_watch = server
        .requests()
        .into_iter()
        .find(|r| r.is(Verb::Watch, "services"))
        .unwrap();
    assert!(
        first_watch.uri.contains("allowWatchBookmarks=true"),
        "{}",
        first_watch.uri
    );

    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    server
        .create(&endpoint_slice("b-1", "b", &["10.1.0.2"]))
        .unwrap();
    let mut a = server.get::<Service>(None, "a").unwrap().unwrap();
    a.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.99".into());
    server.update(&a).unwrap();
    server
        .apply(&endpoint_slice("a-1", "a", &["10.1.0.1", "10.1.0.3"]))
        .unwrap();
    server.delete::<Service>(Some("default"), "b").unwrap();

    eventually("services converge", || {
        store_state(&services.store) == server_state::<Service>(&server)
    })
    .await;
    eventually("slices converge", || {
        store_state(&slices.store) == server_state::<EndpointSlice>(&server)
    })
    .await;
    let a = services
        .store
        .state()
        .into_iter()
        .find(|s| s.name_any() == "a")
        .unwrap();
    assert_eq!(
        a.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("10.0.0.99")
    );
    let a1 = slices
        .store
        .state()
        .into_iter()
        .find(|s| s.name_any() == "a-1")
        .unwrap();
    assert_eq!(a1.endpoints.as_ref().map(Vec::len), Some(2));
    assert_eq!(
        server.request_count(Verb::List, "services"),
        1,
        "no relist needed"
    );
}

#[tokio::test]
async fn raw_watch_gets_bookmarks_and_ends_at_timeout() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    let rv = server.resource_version();
    let api: Api<Service> = Api::all(client);
    let params = WatchParams {
        timeout: Some(2),
        ..WatchParams::default()
    };
    let started = tokio::time::Instant::now();
    let mut stream = within("watch", api.watch(&params, &rv.to_string()))
        .await
        .unwrap()
        .boxed();

    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    let mut events = Vec::new();
    while let Some(event) = within("watch events", stream.try_next()).await.unwrap() {
        events.push(event);
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );

    assert!(
        matches!(&events[0], WatchEvent::Added(s) if s.name_any() == "b"),
        "{events:?}"
    );
    let bookmarks: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
            _ => None,
        })
        .collect();
    // One per second with the 1 s default interval, plus one at the timeout.
    assert!(bookmarks.len() >= 2, "{events:?}");
    assert!(
        bookmarks
            .iter()
            .all(|b| *b == server.resource_version().to_string())
    );
    assert!(server.bookmarks_sent() >= 2);
}

#[tokio::test]
async fn watch_from_resource_version_replays_missed_events() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    let rv = server.resource_version();
    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    server.delete::<Service>(None, "a").unwrap();

    let params = WatchParams {
        timeout: Some(1),
        bookmarks: false,
        ..WatchParams::default()
    };
    let api: Api<Service> = Api::all(client);
    let events: Vec<_> = within("replay", api.watch(&params, &rv.to_string()))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let summary: Vec<String> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(s) => format!("ADDED {}", s.name_any()),
            WatchEvent::Deleted(s) => {
                format!("DELETED {} {}", s.name_any(), s.resource_version().unwrap())
            }
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "ADDED b".to_string(),
            format!("DELETED a {}", server.resource_version())
        ]
    );
}

#[tokio::test]
async fn bookmarks_keep_an_idle_watch_resumable_after_compaction() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    let services = reflect(Api::<Service>::all(client), watcher::Config::default()).await;
    eventually("watch open", || server.open_watches("services") == 1).await;

    // Only other types change, so the Service watch sees nothing but bookmarks.
    for i in 0..5 {
        server.apply(&node(&format!("node-{i}"), "z1")).unwrap();
    }
    let latest = server.resource_version();
    let bookmarks = server.bookmarks_sent();
    eventually("two more bookmarks", || {
        server.bookmarks_sent() >= bookmarks + 2
    })
    .await;

    server.compact();
    server.drop_watches();
    eventually("watch resumed", || {
        server.request_count(Verb::Watch, "services") >= 2
    })
    .await;
    eventually("resumed watch open", || {
        server.open_watches("services") == 1
    })
    .await;

    let watches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is(Verb::Watch, "services"))
        .collect();
    let resumed_from = rv_param(&watches[1].uri).unwrap();
    assert!(
        resumed_from >= latest,
        "resumed from {resumed_from}, bookmarks reached {latest}"
    );
    assert!(watches.iter().all(|w| !w.expired));
    assert_eq!(server.request_count(Verb::List, "services"), 1, "no relist");
    assert_eq!(names(&services.store), ["a"]);
}

#[tokio::test]
async fn dropped_watch_reconnects_without_relisting() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    let services = reflect(Api::<Service>::all(client), watcher::Config::default()).await;
    eventually("watch open", || server.open_watches("services") == 1).await;

    server.drop_watches();
    assert_eq!(server.open_watches("services"), 0);
    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    server.delete::<Service>(None, "a").unwrap();

    eventually("reconnected", || server.open_watches("services") == 1).await;
    eventually("converged", || {
        store_state(&services.store) == server_state::<Service>(&server)
    })
    .await;
    assert_eq!(names(&services.store), ["b"]);
    assert!(server.request_count(Verb::Watch, "services") >= 2);
    assert_eq!(
        server.request_count(Verb::List, "services"),
        1,
        "history replay, no relist"
    );
}

#[tokio::test]
async fn compacted_history_forces_a_relist_that_converges() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    server.create(&service("c", "10.0.0.3", &[])).unwrap();
    server
        .create(&endpoint_slice("a-1", "a", &["10.1.0.1"]))
        .unwrap();
    let services = reflect(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .await;
    let slices = reflect(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .await;
    eventually("watches open", || {
        server.open_watches("services") == 1 && server.open_watches("endpointslices") == 1
    })
    .await;

    // While the API server is down, the history the watchers would need is compacted away.
    server.set_unavailable(true);
    assert_eq!(
        server.open_watches("services") + server.open_watches("endpointslices"),
        0
    );
    let api: Api<Service> = Api::all(client.clone());
    let err = within("list during outage", api.list(&ListParams::default()))
        .await
        .unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a transport error, not an answer: {err:?}"
    );

    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    server.delete::<Service>(None, "a").unwrap();
    server
        .apply(&service("c", "10.0.0.33", &[("changed", "yes")]))
        .unwrap();
    server.delete::<EndpointSlice>(None, "a-1").unwrap();
    server
        .create(&endpoint_slice("b-1", "b", &["10.1.0.2"]))
        .unwrap();
    server.compact();
    server.set_unavailable(false);

    let expired = |resource: &str| {
        server
            .requests()
            .iter()
            .any(|r| r.is(Verb::Watch, resource) && r.expired)
    };
    eventually("services watch expired", || expired("services")).await;
    eventually("slices watch expired", || expired("endpointslices")).await;
    eventually("services relisted", || {
        server.request_count(Verb::List, "services") >= 2
    })
    .await;
    eventually("services converge", || {
        store_state(&services.store) == server_state::<Service>(&server)
    })
    .await;
    eventually("slices converge", || {
        store_state(&slices.store) == server_state::<EndpointSlice>(&server)
    })
    .await;
    assert_eq!(names(&services.store), ["b", "c"]);
    assert_eq!(names(&slices.store), ["b-1"]);
    // One list each before the outage, at least one relist each after the 410 (the
    // failed list above never reached a handler).
    assert!(server.request_count(Verb::List, "services") >= 2);
    assert!(server.request_count(Verb::List, "endpointslices") >= 2);
    let c = services
        .store
        .state()
        .into_iter()
        .find(|s| s.name_any() == "c")
        .unwrap();
    assert_eq!(c.labels().get("changed").map(String::as_str), Some("yes"));
}

#[tokio::test]
async fn label_selector_filters_and_transitions() {
    let (server, client) = start().await;
    server.create(&service("plain", "10.0.0.1", &[])).unwrap();
    server
        .create(&service(
            "headless",
            "None",
            &[("service.kubernetes.io/headless", "")],
        ))
        .unwrap();
    server
        .create(&service(
            "other-proxy",
            "10.0.0.3",
            &[("service.kubernetes.io/service-proxy-name", "x")],
        ))
        .unwrap();
    let config = watcher::Config::default()
        .labels("!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless");
    let services = reflect(Api::<Service>::all(client), config).await;
    assert_eq!(names(&services.store), ["plain"]);

    // Gaining an excluded label looks like a deletion; losing it like an addition.
    server
        .apply(&service(
            "plain",
            "10.0.0.1",
            &[("service.kubernetes.io/service-proxy-name", "x")],
        ))
        .unwrap();
    server
        .apply(&service("other-proxy", "10.0.0.3", &[]))
        .unwrap();
    eventually("labels applied", || {
        names(&services.store) == ["other-proxy"]
    })
    .await;
    server
        .create(&service("new", "10.0.0.4", &[("app", "x")]))
        .unwrap();
    eventually("new service", || {
        names(&services.store) == ["new", "other-proxy"]
    })
    .await;
}

#[tokio::test]
async fn field_selector_watches_only_the_own_node() {
    let (server, client) = start().await;
    server.create(&node("node-a", "z1")).unwrap();
    server.create(&node("node-b", "z2")).unwrap();
    let config = watcher::Config::default().fields("metadata.name=node-a");
    let nodes = reflect(Api::<Node>::all(client.clone()), config).await;
    assert_eq!(names(&nodes.store), ["node-a"]);

    server.apply(&node("node-b", "z3")).unwrap();
    server.apply(&node("node-a", "z9")).unwrap();
    eventually("zone updated", || {
        nodes.store.state().iter().any(|n| {
            n.labels()
                .get("topology.kubernetes.io/zone")
                .map(String::as_str)
                == Some("z9")
        })
    })
    .await;
    assert_eq!(names(&nodes.store), ["node-a"]);
    server.delete::<Node>(None, "node-a").unwrap();
    eventually("node-a deleted", || nodes.store.is_empty()).await;
    server.create(&node("node-a", "z1")).unwrap();
    eventually("node-a back", || names(&nodes.store) == ["node-a"]).await;

    let api: Api<Node> = Api::all(client);
    let err = within(
        "bad field",
        api.list(&ListParams::default().fields("spec.podCIDR=x")),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400),
        "{err:?}"
    );
}

#[tokio::test]
async fn small_pages_and_continue_tokens() {
    let (server, client) = start().await;
    for i in 0..7 {
        server
            .create(&service(&format!("svc-{i}"), &format!("10.0.0.{i}"), &[]))
            .unwrap();
    }
    let services = reflect(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().page_size(3),
    )
    .await;
    assert_eq!(services.store.state().len(), 7);
    assert_eq!(
        server.request_count(Verb::List, "services"),
        3,
        "pages of 3, 3 and 1"
    );

    let api: Api<Service> = Api::all(client);
    let first = within("page 1", api.list(&ListParams::default().limit(4)))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 4);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    server.create(&service("svc-z", "10.0.0.99", &[])).unwrap();
    let second = within(
        "page 2",
        api.list(&ListParams::default().limit(4).continue_token(&token)),
    )
    .await
    .unwrap();
    let second_names: Vec<String> = second.items.iter().map(|s| s.name_any()).collect();
    assert_eq!(
        second_names,
        ["svc-4", "svc-5", "svc-6"],
        "the snapshot of page 1"
    );
    assert_eq!(second.metadata.continue_, None);

    server.create(&service("svc-zz", "10.0.0.98", &[])).unwrap();
    server.compact();
    let err = within(
        "expired continue",
        api.list(&ListParams::default().limit(4).continue_token(&token)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 410 && s.reason == "Expired"),
        "{err:?}"
    );
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    let services = reflect(
        Api::<Service>::all(client),
        watcher::Config::default().streaming_lists(),
    )
    .await;
    assert_eq!(names(&services.store), ["a", "b"]);
    assert_eq!(server.request_count(Verb::List, "services"), 0);
    server.delete::<Service>(None, "a").unwrap();
    eventually("a deleted", || names(&services.store) == ["b"]).await;
}

#[tokio::test]
async fn writes_through_the_api() {
    let (server, client) = start().await;
    let services = reflect(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");

    let created = within(
        "create",
        api.create(&PostParams::default(), &service("web", "10.0.0.5", &[])),
    )
    .await
    .unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    let patch = json!({"metadata": {"labels": {"tier": "front"}}});
    let patched = within(
        "patch",
        api.patch("web", &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    .unwrap();
    assert_eq!(
        patched.labels().get("tier").map(String::as_str),
        Some("front")
    );

    // Replacing from a stale copy is a conflict.
    let err = within(
        "stale replace",
        api.replace("web", &PostParams::default(), &created),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );

    eventually("labelled web", || {
        services
            .store
            .state()
            .iter()
            .any(|s| s.labels().get("tier").map(String::as_str) == Some("front"))
    })
    .await;
    within("delete", api.delete("web", &Default::default()))
        .await
        .unwrap();
    eventually("web gone", || services.store.is_empty()).await;
    assert!(server.get::<Service>(None, "web").unwrap().is_none());

    let cidrs: Api<ServiceCIDR> = Api::all(client);
    let cidr = ServiceCIDR {
        metadata: meta(None, "kubernetes", &[]),
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(vec!["10.96.0.0/16".into()]),
        }),
        ..Default::default()
    };
    within("create cidr", cidrs.create(&PostParams::default(), &cidr))
        .await
        .unwrap();
    assert_eq!(server.list::<ServiceCIDR>().unwrap().len(), 1);
}

#[tokio::test]
async fn recorder_events_are_stored() {
    let (server, client) = start().await;
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "proxy-agent-test".into(),
            instance: Some("node-a".into()),
        },
    );
    let svc_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some("default".into()),
        name: Some("web".into()),
        ..Default::default()
    };
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("node-a".into()),
        ..Default::default()
    };
    let event = RecorderEvent {
        type_: EventType::Warning,
        reason: "NoEndpoints".into(),
        note: Some("service has no endpoints".into()),
        action: "Sync".into(),
        secondary: None,
    };
    within("publish", recorder.publish(&event, &svc_ref))
        .await
        .unwrap();
    within("publish again", recorder.publish(&event, &svc_ref))
        .await
        .unwrap();
    let starting = RecorderEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: None,
        action: "Start".into(),
        secondary: None,
    };
    within("publish node", recorder.publish(&starting, &node_ref))
        .await
        .unwrap();

    let events = server.events();
    assert_eq!(events.len(), 2, "{events:#?}");
    let no_endpoints = events
        .iter()
        .find(|e| e["reason"] == "NoEndpoints")
        .unwrap();
    assert_eq!(no_endpoints["apiVersion"], "events.k8s.io/v1");
    assert_eq!(no_endpoints["metadata"]["namespace"], "default");
    assert_eq!(no_endpoints["regarding"]["name"], "web");
    assert_eq!(no_endpoints["reportingController"], "proxy-agent-test");
    assert_eq!(
        no_endpoints["series"]["count"], 2,
        "the repeat was patched into a series"
    );
    let node_event = events.iter().find(|e| e["reason"] == "Starting").unwrap();
    assert_eq!(
        node_event["metadata"]["namespace"], "default",
        "cluster-scoped objects' events go to default"
    );
    assert_eq!(server.request_count(Verb::Create, "events"), 2);
    assert_eq!(server.request_count(Verb::Patch, "events"), 1);
}

#[tokio::test]
async fn short_history_limit_expires_slow_watchers() {
    init_tracing();
    let server = TestApiServer::start_with(ServerConfig {
        history_limit: 3,
        ..ServerConfig::default()
    })
    .await
    .unwrap();
    let client = server.client().unwrap();
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    let rv = server.resource_version();
    for i in 0..5 {
        server
            .apply(&service("a", &format!("10.0.0.{}", 10 + i), &[]))
            .unwrap();
    }
    let api: Api<Service> = Api::all(client);
    let events: Vec<_> = within(
        "watch",
        api.watch(&WatchParams::default().timeout(1), &rv.to_string()),
    )
    .await
    .unwrap()
    .try_collect()
    .await
    .unwrap();
    match events.as_slice() {
        [WatchEvent::Error(status)] => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert_eq!(
                status.message,
                format!(
                    "too old resource version: {rv} ({})",
                    server.resource_version() - 3
                )
            );
        }
        other => panic!("expected a single 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn service_unavailable_outage_is_retried_by_the_client() {
    let (server, client) = start().await;
    server.create(&service("a", "10.0.0.1", &[])).unwrap();
    let services = reflect(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .await;
    eventually("watch open", || server.open_watches("services") == 1).await;

    server.set_outage(Outage::ServiceUnavailable);
    assert_eq!(
        server.open_watches("services"),
        0,
        "the outage cuts open watches"
    );
    let api: Api<Service> = Api::all(client);
    let list = tokio::spawn(async move { api.list(&ListParams::default()).await });
    let refused = |s: &TestApiServer| s.requests().iter().filter(|r| r.status == 503).count();
    assert!(
        server.wait_until(WAIT, |s| refused(s) >= 3).await,
        "requests refused with 503"
    );
    server.create(&service("b", "10.0.0.2", &[])).unwrap();
    server.set_outage(Outage::None);

    // kube-rs retries 503 answers itself, so the list simply succeeds late.
    let list = within("list after outage", list).await.unwrap().unwrap();
    assert_eq!(list.items.len(), 2);
    eventually("reflector caught up", || {
        names(&services.store) == ["a", "b"]
    })
    .await;
    assert_eq!(
        server.request_count(Verb::List, "services") - refused_lists(&server),
        2
    );
}

fn refused_lists(server: &TestApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.is(Verb::List, "services") && r.status == 503)
        .count()
}

/// The agent's own client (`make_client`) paces its requests by `clientConnection.qps` and
/// `.burst`: with a burst of 1 at 2 per second, five lists need two seconds at least. Only
/// the lower bound is asserted; a loaded machine can only make it slower.
#[tokio::test]
async fn agent_client_paces_requests_by_qps_and_burst() {
    use proxy_agent::k8s::client::{ConnectionSettings, make_client};

    init_tracing();
    let server = TestApiServer::start().await.unwrap();
    let path = std::env::temp_dir().join(format!("test-apiserver-qps-{}.yaml", std::process::id()));
    server.write_kubeconfig(&path).unwrap();
    let client = make_client(&ConnectionSettings {
        kubeconfig: Some(path.display().to_string()),
        qps: 2.0,
        burst: 1,
        content_type: "application/json".into(),
        ..ConnectionSettings::default()
    })
    .await
    .unwrap();
    let services: Api<Service> = Api::namespaced(client, "default");
    let start = std::time::Instant::now();
    for _ in 0..5 {
        within("a list", services.list(&ListParams::default()))
            .await
            .unwrap();
    }
    let elapsed = start.elapsed();
    let _ = std::fs::remove_file(&path);
    assert_eq!(server.request_count(Verb::List, "services"), 5);
    assert!(
        elapsed >= Duration::from_millis(1900),
        "five requests at 2 per second with a burst of 1 took only {elapsed:?}"
    );
}

/// While the API server is away (a minute here: connections refused), the agent's four
/// watchers retry with a doubling, jittered delay that stops growing at 5-10 s, as
/// client-go's reflector backs off, rather than every few hundred milliseconds: about a
/// dozen attempts each, where the sub-second retries of before made several hundred. Once
/// it is back, a change reaches them within the bound of one delay.
#[tokio::test]
async fn agent_watchers_back_off_while_the_api_server_is_away() {
    use proxy_agent::k8s::watch::{ClusterEvent, RECONNECT_BOUND, ResourceKind, spawn_watchers};
    use proxy_agent::model::IpFamily;

    init_tracing();
    let server = TestApiServer::start().await.unwrap();
    server.create(&service("web", "10.0.0.10", &[])).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    spawn_watchers(server.client().unwrap(), "node-a", &[IpFamily::V4], tx);
    within("the first lists", async {
        while !matches!(
            rx.recv().await,
            Some(ClusterEvent::Synced(ResourceKind::Service))
        ) {}
    })
    .await;

    let outage = Duration::from_secs(60);
    server.set_outage(Outage::ConnectionsClosed);
    tokio::time::sleep(outage).await;
    let attempts = server.refused_connections();
    // Four watchers; each delay at least doubles from 0.2 s to 5 s, then 5-10 s each.
    assert!(
        (4 * 5..=4 * 17).contains(&attempts),
        "{attempts} connection attempts in {outage:?} by four watchers"
    );

    // Back: a Service made now reaches the watchers within one delay.
    server.set_outage(Outage::None);
    while rx.try_recv().is_ok() {}
    let back = std::time::Instant::now();
    server.create(&service("late", "10.0.0.11", &[])).unwrap();
    tokio::time::timeout(RECONNECT_BOUND + Duration::from_secs(5), async {
        loop {
            if let Some(ClusterEvent::Service(change)) = rx.recv().await
                && format!("{change:?}").contains("late")
            {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the new Service never came, {:?} after the outage",
            back.elapsed()
        )
    });
}

/// An API server older than Kubernetes 1.33 has no ServiceCIDR API. The agent's watchers
/// report it (the event loop then runs without service CIDRs instead of waiting for them)
/// and ask again only after a long pause, not at the sub-second reconnect pace, which would
/// spend the client's qps budget on 404s.
#[tokio::test]
async fn agent_watchers_report_an_unserved_resource_and_ask_again_rarely() {
    use proxy_agent::k8s::watch::{ClusterEvent, ResourceKind, spawn_watchers};
    use proxy_agent::model::IpFamily;
    use tests::apiserver::ServerConfig;

    init_tracing();
    let server = TestApiServer::start_with(ServerConfig {
        unserved: vec!["servicecidrs"],
        ..ServerConfig::default()
    })
    .await
    .unwrap();
    server.create(&service("web", "10.0.0.10", &[])).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    spawn_watchers(
        server.client().unwrap(),
        "node-a",
        &[IpFamily::V4, IpFamily::V6],
        tx,
    );
    let mut services_synced = false;
    let mut cidrs_unserved = false;
    within("the first lists", async {
        while !(services_synced && cidrs_unserved) {
            match rx.recv().await.expect("watchers run") {
                ClusterEvent::Synced(ResourceKind::Service) => services_synced = true,
                ClusterEvent::Unreachable {
                    kind: ResourceKind::ServiceCidr,
                    error,
                } => {
                    assert!(error.contains("404"), "{error}");
                    cidrs_unserved = true;
                }
                _ => {}
            }
        }
    })
    .await;
    // Three seconds: the reconnect backoff (0.2 s, 0.4 s, 0.8 s, ...) would have asked three
    // or four times.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = server.request_count(Verb::List, "servicecidrs");
    assert_eq!(asked, 1, "ServiceCIDRs listed {asked} times in 3 s");
}
