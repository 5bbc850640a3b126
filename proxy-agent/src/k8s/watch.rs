// SPDX-License-Identifier: Apache-2.0
//! Watching the API: Services, EndpointSlices, ServiceCIDRs and this node's Node, turned into
//! [`ClusterEvent`]s for the agent's event loop.
//!
//! A watcher relists after a dropped watch or a 410 Gone. Replaying such a relist as
//! "delete everything, add everything" would make every service flap; instead each
//! resource's relist is buffered and diffed against what was last reported, so only real
//! differences come out (linkerd's and kube-proxy's informers behave the same way).

use std::{collections::HashMap, fmt::Debug, sync::Arc, time::Duration};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use kube::{
    Api, Resource, ResourceExt as _,
    runtime::{
        WatchStreamExt as _,
        utils::ResetTimerBackoff,
        watcher::{self, ExponentialBackoff, watcher},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::tombstone::{Buried, Tombstone};
use crate::model::{IpFamily, ServiceRecord, SliceRecord};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    Service,
    EndpointSlice,
    Node,
    ServiceCidr,
}

#[derive(Clone, Debug)]
pub enum Change<T> {
    Upsert(Arc<T>),
    Delete(Arc<T>),
}

impl<T> Change<T> {
    /// The same change of what `convert` makes of the object (told whether it is a
    /// deletion).
    pub fn convert<U>(self, convert: impl FnOnce(&T, bool) -> U) -> Change<U> {
        match self {
            Change::Upsert(object) => Change::Upsert(Arc::new(convert(&object, false))),
            Change::Delete(object) => Change::Delete(Arc::new(convert(&object, true))),
        }
    }
}

impl<T: Clone> Change<T> {
    /// The object, whether it was deleted: moved out when nothing else holds it (as
    /// after a source sent it), copied otherwise.
    pub fn into_owned(self) -> (T, bool) {
        let (object, deleted) = match self {
            Change::Upsert(object) => (object, false),
            Change::Delete(object) => (object, true),
        };
        (Arc::unwrap_or_clone(object), deleted)
    }
}

/// Services and EndpointSlices come already converted for the model (see
/// [`crate::model::ServiceRecord`]); Nodes and ServiceCIDRs as the API sends them.
#[derive(Clone, Debug)]
pub enum ClusterEvent {
    Service(Change<ServiceRecord>),
    EndpointSlice(Change<SliceRecord>),
    Node(Change<Node>),
    ServiceCidr(Change<ServiceCIDR>),
    /// A resource's (re)list completed: from now on its state is complete.
    Synced(ResourceKind),
    /// Changes that arrived together as one (the objects of one read of the directory
    /// source): the agent takes them all in before it syncs, so that no sync programs
    /// half of a manifest renamed into place.
    Batch(Vec<ClusterEvent>),
    /// The API could not be reached; the watchers keep retrying with backoff.
    Unreachable {
        kind: ResourceKind,
        error: String,
    },
}

impl ClusterEvent {
    /// Whether it carries a Node change (whose labels may change every service's
    /// endpoint choice).
    pub fn touches_node(&self) -> bool {
        match self {
            ClusterEvent::Node(_) => true,
            ClusterEvent::Batch(events) => events.iter().any(ClusterEvent::touches_node),
            _ => false,
        }
    }
}

/// Tracks what has been reported for one resource and turns relists into diffs.
#[derive(Debug)]
pub struct RelistDiff<K> {
    /// ns/name -> (resourceVersion, identity) last reported: objects are compared by
    /// resourceVersion, and a deletion needs only the identity (see [`super::tombstone`]).
    known: HashMap<String, (Option<String>, Tombstone)>,
    /// Objects seen since the current relist started.
    relist: Option<HashMap<String, Arc<K>>>,
}

impl<K> Default for RelistDiff<K> {
    fn default() -> Self {
        Self {
            known: HashMap::new(),
            relist: None,
        }
    }
}

/// What one watcher event means for the consumer.
#[derive(Debug)]
pub enum Diffed<K> {
    Upsert(Arc<K>),
    Delete(Arc<K>),
    Synced,
}

fn object_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    }
}

impl<K: Resource + Clone + Buried> RelistDiff<K> {
    pub fn handle(&mut self, event: watcher::Event<K>) -> Vec<Diffed<K>> {
        match event {
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(obj) => {
                let obj = Arc::new(obj);
                match &mut self.relist {
                    Some(buffer) => {
                        buffer.insert(object_key(obj.as_ref()), obj);
                        Vec::new()
                    }
                    // Not inside a relist (should not happen): treat as an update.
                    None => self.apply(obj).into_iter().collect(),
                }
            }
            watcher::Event::InitDone => {
                let buffer = self.relist.take().unwrap_or_default();
                let mut out = Vec::new();
                let gone: Vec<String> = self
                    .known
                    .keys()
                    .filter(|k| !buffer.contains_key(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    if let Some((_, tombstone)) = self.known.remove(&key) {
                        out.push(Diffed::Delete(Arc::new(K::from_tombstone(&tombstone))));
                    }
                }
                for obj in buffer.into_values() {
                    out.extend(self.apply(obj));
                }
                out.push(Diffed::Synced);
                out
            }
            watcher::Event::Apply(obj) => self.apply(Arc::new(obj)).into_iter().collect(),
            watcher::Event::Delete(obj) => {
                let key = object_key(&obj);
                match self.known.remove(&key) {
                    Some(_) => vec![Diffed::Delete(Arc::new(obj))],
                    None => Vec::new(),
                }
            }
        }
    }

    /// Reports `obj` unless the same resourceVersion was reported already.
    fn apply(&mut self, obj: Arc<K>) -> Option<Diffed<K>> {
        let key = object_key(obj.as_ref());
        let rv = obj.meta().resource_version.clone();
        if let Some((known_rv, _)) = self.known.get(&key)
            && rv.is_some()
            && *known_rv == rv
        {
            return None;
        }
        self.known.insert(key, (rv, obj.tombstone()));
        Some(Diffed::Upsert(obj))
    }
}

/// The annotation `kubectl apply` keeps the whole applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no part of the agent reads before an object goes through the event loop
/// (nothing keeps whole objects past their event, but a relist holds a whole list at
/// once): the managedFields (often the largest part of an object) and kubectl's copy of
/// the applied object. Objects are compared by resourceVersion only, so nothing is
/// decided on what is dropped. (kube-rs suggests the same before caching objects.)
fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Spawns one watcher task per resource; events go to `tx`. The tasks end when `tx` closes.
/// Services and EndpointSlices are converted on their watcher's task, Services for each of
/// `families` (the node's).
pub fn spawn_watchers(
    client: kube::Client,
    node_name: &str,
    families: &[IpFamily],
    tx: mpsc::Sender<ClusterEvent>,
) {
    // Services (and their slices) that another proxy claims, and headless ones, are not
    // ours: upstream's informers filter them out by label.
    let proxyable =
        watcher::Config::default().labels(super::convert::PROXIED_OBJECTS_LABEL_SELECTOR);
    spawn_one(
        Api::<Service>::all(client.clone()),
        proxyable.clone(),
        ResourceKind::Service,
        tx.clone(),
        {
            let families = families.to_vec();
            move |change| {
                ClusterEvent::Service(change.convert(|service, deleted| {
                    crate::k8s::convert::service_record(service, &families, deleted)
                }))
            }
        },
    );
    spawn_one(
        Api::<EndpointSlice>::all(client.clone()),
        proxyable,
        ResourceKind::EndpointSlice,
        tx.clone(),
        |change| ClusterEvent::EndpointSlice(change.convert(crate::k8s::convert::slice_record)),
    );
    spawn_one(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
        ResourceKind::Node,
        tx.clone(),
        ClusterEvent::Node,
    );
    spawn_one(
        Api::<ServiceCIDR>::all(client),
        watcher::Config::default(),
        ResourceKind::ServiceCidr,
        tx,
        ClusterEvent::ServiceCidr,
    );
}

/// The first delay before a failed list/watch is retried; each failure doubles it.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(200);
/// The delay stops doubling here; the jitter adds up to as much again.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);
/// The longest a watcher waits between two attempts (the largest delay with its jitter):
/// once the API server is back, every watcher has tried again within this.
pub const RECONNECT_BOUND: Duration = Duration::from_secs(10);

/// How soon a failed list/watch is retried: from 0.2 s, doubling to 5 s, each delay with a
/// random jitter of up to itself (so 5-10 s once it stopped growing), starting again from
/// the shortest once a stream has worked for two minutes.
///
/// An API server that restarts in a second or two is back in the agent's watches within a
/// few seconds, and a long outage costs each watcher (four per node) an attempt every 5-10 s
/// rather than several a second: a control plane recovering from an outage is not met by
/// every node of a big cluster at once (client-go's reflector backs off from 0.8 s to 30 s;
/// the lower ceiling here bounds how long a node's dataplane stays behind after the API
/// server is back, [`RECONNECT_BOUND`]). The jitter keeps nodes from retrying in step.
fn reconnect_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(RECONNECT_MIN_DELAY)
        .with_max_delay(RECONNECT_MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), Duration::from_secs(120))
}

/// How often a resource the API server does not serve (404) is asked for again.
const NOT_SERVED_RETRY: Duration = Duration::from_secs(60);
/// How often a resource the agent may not list or watch (403) is asked for again: soon
/// enough to pick up fixed RBAC, rarely enough not to spend the client's qps on refusals.
const FORBIDDEN_RETRY: Duration = Duration::from_secs(10);

/// The API server's status code for a failed list or watch, if it answered one.
fn status_code(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// Whether the list or watch failed because the API server has no such resource.
fn is_not_served(error: &watcher::Error) -> bool {
    status_code(error) == Some(404)
}

/// The resource a watcher lists and watches, as RBAC names it (`resource.group`).
fn rbac_resource(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Service => "services",
        ResourceKind::EndpointSlice => "endpointslices.discovery.k8s.io",
        ResourceKind::Node => "nodes",
        ResourceKind::ServiceCidr => "servicecidrs.networking.k8s.io",
    }
}

/// The log line for a refused list or watch: what the agent needs, and where it is granted.
fn forbidden_message(kind: ResourceKind) -> String {
    format!(
        "the API server forbids this agent to list and watch {}: its ServiceAccount needs the \
         verbs list and watch on it (deploy/rbac.yaml grants them); nothing of this kind \
         reaches the dataplane until it may",
        rbac_resource(kind)
    )
}

fn spawn_one<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: ResourceKind,
    tx: mpsc::Sender<ClusterEvent>,
    wrap: impl Fn(Change<K>) -> ClusterEvent + Send + 'static,
) where
    K: Resource + Clone + Buried + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut diff = RelistDiff::<K>::default();
        let mut stream = watcher(api, config).backoff(reconnect_backoff()).boxed();
        loop {
            let next = stream.try_next().await;
            let events = match next {
                Ok(Some(event)) => diff.handle(event.modify(slim)),
                Ok(None) => break,
                Err(error) => {
                    let not_served = is_not_served(&error);
                    let forbidden = status_code(&error) == Some(403);
                    if not_served {
                        warn!(
                            ?kind,
                            %error,
                            retry_in = ?NOT_SERVED_RETRY,
                            "the API server does not serve this resource"
                        );
                    } else if forbidden {
                        error!(?kind, %error, retry_in = ?FORBIDDEN_RETRY, "{}", forbidden_message(kind));
                    } else {
                        warn!(?kind, %error, "watch failed; retrying with backoff");
                    }
                    let msg = ClusterEvent::Unreachable {
                        kind,
                        error: error.to_string(),
                    };
                    if tx.send(msg).await.is_err() {
                        break;
                    }
                    if not_served {
                        // The backoff's sub-second retries are for an API server that is
                        // away; one that answers 404 (ServiceCIDRs before Kubernetes 1.33)
                        // answers the same until it is upgraded, and each retry would spend
                        // the client's qps budget.
                        tokio::time::sleep(NOT_SERVED_RETRY).await;
                    } else if forbidden {
                        tokio::time::sleep(FORBIDDEN_RETRY).await;
                    }
                    continue;
                }
            };
            for event in events {
                let msg = match event {
                    Diffed::Upsert(obj) => {
                        debug!(?kind, name = %obj.name_any(), "upsert");
                        wrap(Change::Upsert(obj))
                    }
                    Diffed::Delete(obj) => {
                        debug!(?kind, name = %obj.name_any(), "delete");
                        wrap(Change::Delete(obj))
                    }
                    Diffed::Synced => {
                        info!(?kind, "list complete");
                        ClusterEvent::Synced(kind)
                    }
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn svc(name: &str, rv: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn summary(out: &[Diffed<Service>]) -> Vec<String> {
        out.iter()
            .map(|d| match d {
                Diffed::Upsert(s) => format!(
                    "+{}@{}",
                    s.name_any(),
                    s.resource_version().unwrap_or_default()
                ),
                Diffed::Delete(s) => format!("-{}", s.name_any()),
                Diffed::Synced => "synced".into(),
            })
            .collect()
    }

    #[test]
    fn reconnects_back_off_to_a_bound_and_spare_a_recovering_server() {
        let mut backoff = reconnect_backoff();
        let delays: Vec<Duration> = (0..40).map(|_| backoff.next().unwrap()).collect();
        assert!(
            delays[0] >= RECONNECT_MIN_DELAY && delays[0] < RECONNECT_MIN_DELAY * 2,
            "{delays:?}"
        );
        assert!(delays.iter().all(|d| *d <= RECONNECT_BOUND), "{delays:?}");
        assert!(
            delays[20..].iter().all(|d| *d >= RECONNECT_MAX_DELAY),
            "a long outage is met every 5-10 s: {delays:?}"
        );
        // Attempts of one watcher in a minute away: a handful, not hundreds.
        let mut elapsed = Duration::ZERO;
        let attempts = delays
            .iter()
            .take_while(|d| {
                elapsed += **d;
                elapsed <= Duration::from_secs(60)
            })
            .count();
        assert!(
            (6..=17).contains(&attempts),
            "{attempts} attempts in 60 s: {delays:?}"
        );
    }

    #[test]
    fn a_refusal_names_the_resource_and_the_verbs() {
        let message = forbidden_message(ResourceKind::EndpointSlice);
        assert!(
            message.contains("endpointslices.discovery.k8s.io"),
            "{message}"
        );
        assert!(message.contains("list and watch"), "{message}");
        let refused =
            watcher::Error::InitialListFailed(kube::Error::Api(Box::new(kube::core::Status {
                code: 403,
                ..Default::default()
            })));
        assert_eq!(status_code(&refused), Some(403));
        assert!(!is_not_served(&refused));
    }

    #[test]
    fn only_a_404_means_not_served() {
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..Default::default()
            })
        };
        let api = |code| kube::Error::Api(status(code));
        assert!(is_not_served(&watcher::Error::InitialListFailed(api(404))));
        assert!(is_not_served(&watcher::Error::WatchStartFailed(api(404))));
        assert!(!is_not_served(&watcher::Error::InitialListFailed(api(503))));
        assert!(!is_not_served(&watcher::Error::InitialListFailed(api(403))));
        assert!(!is_not_served(&watcher::Error::WatchError(status(404))));
        assert!(!is_not_served(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn kept_objects_lose_managed_fields_and_the_applied_copy_only() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut s = svc("a", "1");
        s.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        s.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_string(), "{}".to_string()),
                ("keep".to_string(), "me".to_string()),
            ]
            .into(),
        );
        slim(&mut s);
        assert_eq!(s.metadata.managed_fields, None);
        assert_eq!(
            s.metadata.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
        let mut bare = svc("b", "1");
        bare.metadata.annotations = Some([(LAST_APPLIED.to_string(), "{}".to_string())].into());
        slim(&mut bare);
        assert_eq!(bare.metadata.annotations, None);
    }

    #[test]
    fn first_list_reports_everything_then_synced() {
        let mut d = RelistDiff::default();
        assert!(d.handle(watcher::Event::Init).is_empty());
        assert!(
            d.handle(watcher::Event::InitApply(svc("a", "1")))
                .is_empty()
        );
        let out = d.handle(watcher::Event::InitDone);
        assert_eq!(summary(&out), vec!["+a@1", "synced"]);
    }

    #[test]
    fn a_relist_reports_only_differences() {
        let mut d = RelistDiff::default();
        d.handle(watcher::Event::Init);
        d.handle(watcher::Event::InitApply(svc("same", "1")));
        d.handle(watcher::Event::InitApply(svc("changed", "2")));
        d.handle(watcher::Event::InitApply(svc("removed", "3")));
        d.handle(watcher::Event::InitDone);
        // After a dropped watch / 410 Gone the watcher lists again.
        d.handle(watcher::Event::Init);
        d.handle(watcher::Event::InitApply(svc("same", "1")));
        d.handle(watcher::Event::InitApply(svc("changed", "7")));
        d.handle(watcher::Event::InitApply(svc("new", "8")));
        let mut out = summary(&d.handle(watcher::Event::InitDone));
        out.sort();
        assert_eq!(out, vec!["+changed@7", "+new@8", "-removed", "synced"]);
    }

    #[test]
    fn live_events_pass_through_and_duplicates_are_dropped() {
        let mut d = RelistDiff::default();
        d.handle(watcher::Event::Init);
        d.handle(watcher::Event::InitDone);
        assert_eq!(
            summary(&d.handle(watcher::Event::Apply(svc("a", "1")))),
            vec!["+a@1"]
        );
        assert!(d.handle(watcher::Event::Apply(svc("a", "1"))).is_empty());
        assert_eq!(
            summary(&d.handle(watcher::Event::Apply(svc("a", "2")))),
            vec!["+a@2"]
        );
        assert_eq!(
            summary(&d.handle(watcher::Event::Delete(svc("a", "3")))),
            vec!["-a"]
        );
        // Deleting what was never reported reports nothing.
        assert!(d.handle(watcher::Event::Delete(svc("b", "4"))).is_empty());
    }
}
