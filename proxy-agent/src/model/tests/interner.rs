// SPDX-License-Identifier: Apache-2.0
//! The name interner: one shared copy per name, and a bounded set under churn.

use std::sync::Arc;

use crate::k8s::convert::endpoint_slice_info;
use crate::k8s::fixtures::{mk_endpoint, mk_endpointslice};
use crate::model::interner::{MIN_PRUNE_AT, NameInterner};

#[test]
fn a_name_is_held_once() {
    let mut names = NameInterner::new();
    let first = names.intern("node-a");
    let again = names.intern("node-a");
    let other = names.intern("node-b");
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(&*other, "node-b");
    assert_eq!(names.len(), 2);
}

#[test]
fn pruning_drops_only_the_names_nobody_holds() {
    let mut names = NameInterner::new();
    let kept = names.intern("kept");
    for index in 1..MIN_PRUNE_AT {
        names.intern(&format!("gone-{index}"));
    }
    assert_eq!(names.len(), MIN_PRUNE_AT);
    // The set reached its pruning size: the next new name prunes it first.
    names.intern("trigger");
    assert_eq!(names.len(), 2);
    assert!(Arc::ptr_eq(&kept, &names.intern("kept")));
}

/// Made-up or churning names (hostile slices, pods rescheduled over renamed nodes) must
/// not grow the set without bound: it stays within twice the names in use.
#[test]
fn churn_keeps_the_set_within_twice_the_names_in_use() {
    let mut names = NameInterner::new();
    let in_use: Vec<Arc<str>> = (0..3_000)
        .map(|index| names.intern(&format!("node-{index}")))
        .collect();
    let mut largest = 0;
    for index in 0..100_000 {
        names.intern(&format!("churn-{index}"));
        largest = largest.max(names.len());
    }
    assert!(
        largest <= 2 * in_use.len(),
        "{largest} names held for {} in use",
        in_use.len()
    );

    let mut names = NameInterner::new();
    for index in 0..100_000 {
        names.intern(&format!("churn-{index}"));
        assert!(names.len() <= MIN_PRUNE_AT);
    }
}

#[test]
fn endpoints_of_a_node_share_its_name_and_zone() {
    let slice = mk_endpointslice("ns1", "svc1-abc", "svc1", "IPv4")
        .port("http", 80, "TCP")
        .endpoint(mk_endpoint("10.0.0.1").node("node-a").zone("zone-a"))
        .endpoint(
            mk_endpoint("10.0.0.2")
                .node("node-a")
                .zone("zone-a")
                .zone_hints(&["zone-a"]),
        )
        .build();
    let info = endpoint_slice_info(&slice).unwrap().unwrap();
    let [first, second] = &info.endpoints[..] else {
        panic!("two endpoints expected: {:?}", info.endpoints);
    };
    let shared = |a: &Option<Arc<str>>, b: &Option<Arc<str>>| match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    };
    assert!(shared(&first.node_name, &second.node_name));
    assert!(shared(&first.zone, &second.zone));
    // Hint names are interned too: the same bytes as the zone's.
    let hinted = second.zone_hints().and_then(|hints| hints.iter().next());
    assert_eq!(
        hinted.map(str::as_ptr),
        first.zone.as_deref().map(str::as_ptr)
    );
}
