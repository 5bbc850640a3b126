// SPDX-License-Identifier: Apache-2.0

use serde_json::json;

use super::{
    list::{decode_continue, encode_continue},
    *,
};
use crate::apiserver::resources::{ENDPOINT_SLICES, NODES, SERVICES};

fn svc(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default", "labels": labels},
           "spec": {"clusterIP": "10.0.0.1"}})
}

fn rv_of(object: &Value) -> u64 {
    object::meta_str(object, "resourceVersion")
        .unwrap()
        .parse()
        .unwrap()
}

fn names(items: &[Arc<Value>]) -> Vec<String> {
    items
        .iter()
        .map(|o| object::name(o).unwrap().to_string())
        .collect()
}

fn selection(resource: &'static ResourceKind, labels: &str) -> Selection {
    Selection {
        labels: LabelSelector::parse(labels).unwrap(),
        ..Selection::all(resource)
    }
}

#[test]
fn resource_version_is_global_and_monotonic() {
    let mut store = Store::new(100);
    let a = store.create(&SERVICES, svc("a", json!({}))).unwrap();
    let n = store
        .create(
            &NODES,
            json!({"metadata": {"name": "n1", "namespace": "ignored"}}),
        )
        .unwrap();
    let b = store.create(&SERVICES, svc("b", json!({}))).unwrap();
    assert!(rv_of(&a) < rv_of(&n) && rv_of(&n) < rv_of(&b));
    assert_eq!(store.current_rv(), rv_of(&b));
    assert_eq!(
        object::namespace(&n),
        None,
        "cluster-scoped objects carry no namespace"
    );
    assert_eq!(n["kind"], "Node");
    assert!(object::meta_str(&a, "uid").is_some());
    assert_ne!(object::meta_str(&a, "uid"), object::meta_str(&b, "uid"));
}

#[test]
fn create_conflicts_and_missing_objects_are_errors() {
    let mut store = Store::new(100);
    store.create(&SERVICES, svc("a", json!({}))).unwrap();
    assert!(matches!(
        store.create(&SERVICES, svc("a", json!({}))),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        store.replace(&SERVICES, svc("zzz", json!({})), true),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.delete(&SERVICES, "default", "zzz"),
        Err(Error::NotFound { .. })
    ));
    let mut stale = svc("a", json!({"x": "y"}));
    stale["metadata"]["resourceVersion"] = json!("1");
    assert!(matches!(
        store.replace(&SERVICES, stale, true),
        Err(Error::Conflict { .. })
    ));
}

#[test]
fn identical_update_commits_nothing() {
    let mut store = Store::new(100);
    let a = store.create(&SERVICES, svc("a", json!({}))).unwrap();
    let rv = store.current_rv();
    let same = store.replace(&SERVICES, (*a).clone(), true).unwrap();
    assert_eq!(store.current_rv(), rv);
    assert_eq!(rv_of(&same), rv_of(&a));
    let changed = store
        .replace(&SERVICES, svc("a", json!({"k": "v"})), false)
        .unwrap();
    assert_eq!(rv_of(&changed), rv + 1);
    assert_eq!(changed["metadata"]["uid"], a["metadata"]["uid"]);
}

#[test]
fn watch_replays_history_after_resource_version_then_goes_live() {
    let mut store = Store::new(100);
    store.create(&SERVICES, svc("a", json!({}))).unwrap();
    let after = store.current_rv();
    store.create(&SERVICES, svc("b", json!({}))).unwrap();
    store
        .create(
            &ENDPOINT_SLICES,
            json!({"metadata": {"name": "e", "namespace": "default"}}),
        )
        .unwrap();
    store.delete(&SERVICES, "default", "a").unwrap();

    let mut feed = store
        .watch(Selection::all(&SERVICES), WatchStart::After(after))
        .unwrap();
    let replay: Vec<_> = feed
        .initial
        .iter()
        .map(|e| (e.event, object::name(&e.object).unwrap().to_string()))
        .collect();
    assert_eq!(
        replay,
        vec![
            (EventType::Added, "b".into()),
            (EventType::Deleted, "a".into())
        ]
    );
    assert_eq!(
        rv_of(&feed.initial[1].object),
        store.current_rv(),
        "deletions carry their own RV"
    );

    store.create(&SERVICES, svc("c", json!({}))).unwrap();
    let live = feed.live.try_recv().unwrap();
    assert_eq!(
        (live.event, object::name(&live.object)),
        (EventType::Added, Some("c"))
    );
    assert!(feed.live.try_recv().is_err());
}

#[test]
fn label_transitions_become_added_and_deleted() {
    let mut store = Store::new(100);
    store.create(&SERVICES, svc("a", json!({}))).unwrap();
    let mut feed = store
        .watch(
            selection(&SERVICES, "!service.kubernetes.io/headless"),
            WatchStart::CurrentState,
        )
        .unwrap();
    assert_eq!(feed.initial.len(), 1);

    store
        .replace(
            &SERVICES,
            svc("a", json!({"service.kubernetes.io/headless": ""})),
            false,
        )
        .unwrap();
    let gone = feed.live.try_recv().unwrap();
    assert_eq!(gone.event, EventType::Deleted);
    assert_eq!(rv_of(&gone.object), store.current_rv());
    assert!(
        gone.object["metadata"]["labels"]
            .get("service.kubernetes.io/headless")
            .is_none()
    );

    store
        .replace(&SERVICES, svc("a", json!({"other": "x"})), false)
        .unwrap();
    assert_eq!(feed.live.try_recv().unwrap().event, EventType::Added);
    store
        .replace(&SERVICES, svc("a", json!({"other": "y"})), false)
        .unwrap();
    assert_eq!(feed.live.try_recv().unwrap().event, EventType::Modified);
}

#[test]
fn compaction_expires_old_watches_and_continue_tokens() {
    let mut store = Store::new(100);
    for name in ["a", "b", "c"] {
        store.create(&SERVICES, svc(name, json!({}))).unwrap();
    }
    let old = store.current_rv() - 1;
    let page = store
        .list(
            &Selection::all(&SERVICES),
            &ListOptions {
                limit: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    let token = page.continue_token.clone().unwrap();
    // A snapshot at the newest version survives compaction; one older does not.
    store.compact();
    assert!(
        store
            .list(
                &Selection::all(&SERVICES),
                &ListOptions {
                    limit: Some(2),
                    continue_token: Some(token.clone()),
                    ..Default::default()
                }
            )
            .is_ok()
    );
    store.create(&SERVICES, svc("d", json!({}))).unwrap();
    store.compact();
    match store.watch(Selection::all(&SERVICES), WatchStart::After(old)) {
        Err(Error::Expired(msg)) => assert_eq!(
            msg,
            format!("too old resource version: {old} ({})", store.floor())
        ),
        other => panic!("expected Expired, got {:?}", other.map(|f| f.start_rv)),
    }
    assert!(
        store
            .watch(
                Selection::all(&SERVICES),
                WatchStart::After(store.current_rv())
            )
            .is_ok()
    );
    assert!(matches!(
        store.list(
            &Selection::all(&SERVICES),
            &ListOptions {
                limit: Some(2),
                continue_token: Some(token),
                ..Default::default()
            }
        ),
        Err(Error::Expired(_))
    ));
}

#[test]
fn bounded_history_raises_the_floor() {
    let mut store = Store::new(2);
    for name in ["a", "b", "c", "d"] {
        store.create(&SERVICES, svc(name, json!({}))).unwrap();
    }
    let current = store.current_rv();
    assert_eq!(store.floor(), current - 2);
    assert!(
        store
            .watch(Selection::all(&SERVICES), WatchStart::After(current - 2))
            .is_ok()
    );
    assert!(
        store
            .watch(Selection::all(&SERVICES), WatchStart::After(current - 3))
            .is_err()
    );
}

#[test]
fn paging_reads_one_consistent_snapshot() {
    let mut store = Store::new(100);
    for name in ["a", "b", "c", "d", "e"] {
        store.create(&SERVICES, svc(name, json!({}))).unwrap();
    }
    let all = Selection::all(&SERVICES);
    let first = store
        .list(
            &all,
            &ListOptions {
                limit: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(names(&first.items), ["a", "b"]);
    assert_eq!(first.remaining_item_count, Some(3));
    let snapshot_rv = first.resource_version;

    // Changes between pages must not show up in later pages.
    store.delete(&SERVICES, "default", "c").unwrap();
    store.create(&SERVICES, svc("f", json!({}))).unwrap();
    store
        .replace(&SERVICES, svc("d", json!({"changed": "yes"})), false)
        .unwrap();

    let mut seen = names(&first.items);
    let mut token = first.continue_token;
    while let Some(t) = token {
        let page = store
            .list(
                &all,
                &ListOptions {
                    limit: Some(2),
                    continue_token: Some(t),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(page.resource_version, snapshot_rv);
        assert!(page.items.iter().all(|o| rv_of(o) <= snapshot_rv));
        seen.extend(names(&page.items));
        token = page.continue_token;
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);

    let now = store.list(&all, &ListOptions::default()).unwrap();
    assert_eq!(names(&now.items), ["a", "b", "d", "e", "f"]);
    assert_eq!(now.resource_version, store.current_rv());
}

#[test]
fn list_resource_version_rules() {
    let mut store = Store::new(100);
    store.create(&SERVICES, svc("a", json!({}))).unwrap();
    let at_a = store.current_rv();
    store.create(&SERVICES, svc("b", json!({}))).unwrap();
    let all = Selection::all(&SERVICES);
    let exact = store
        .list(
            &all,
            &ListOptions {
                resource_version: Some(at_a.to_string()),
                resource_version_match: Some("Exact".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(names(&exact.items), ["a"]);
    assert_eq!(exact.resource_version, at_a);
    let not_older = store
        .list(
            &all,
            &ListOptions {
                resource_version: Some(at_a.to_string()),
                resource_version_match: Some("NotOlderThan".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(names(&not_older.items), ["a", "b"]);
    let too_large = store.list(
        &all,
        &ListOptions {
            resource_version: Some((store.current_rv() + 10).to_string()),
            ..Default::default()
        },
    );
    assert!(matches!(
        too_large,
        Err(Error::TooLargeResourceVersion { .. })
    ));
    let match_without_rv = store.list(
        &all,
        &ListOptions {
            resource_version_match: Some("Exact".into()),
            ..Default::default()
        },
    );
    assert!(matches!(match_without_rv, Err(Error::BadRequest(_))));
}

#[test]
fn continue_tokens_round_trip() {
    let token = encode_continue(42, "ns", "name-1");
    assert_eq!(
        decode_continue(&token).unwrap(),
        (42, ("ns".into(), "name-1".into()))
    );
    assert!(decode_continue("zz").is_err());
    assert!(decode_continue("abc").is_err());
}
