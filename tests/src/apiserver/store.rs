// SPDX-License-Identifier: Apache-2.0
//! The object store: one global, etcd-like resourceVersion across every resource,
//! a bounded event history for watch resumption and consistent paging, and the
//! fan-out of events to open watches.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{
    error::{Error, Result},
    object::{self, same_content, set_resource_version},
    resources::ResourceKind,
    selector::{FieldSelector, LabelSelector},
};

mod list;

pub use self::list::ListOptions;

/// `(group, plural, namespace, name)`; the namespace is empty for cluster-scoped objects.
/// Ordered like etcd keys, so listing a type walks a contiguous range.
type ObjectKey = (&'static str, &'static str, String, String);

fn key_of(resource: &ResourceKind, namespace: &str, name: &str) -> ObjectKey {
    (
        resource.group,
        resource.plural,
        namespace.to_string(),
        name.to_string(),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change. `prev` is the object before the change (absent for a
/// creation), which lets a past state be rebuilt by undoing newer entries.
struct HistoryEntry {
    rv: u64,
    resource: &'static ResourceKind,
    event: EventType,
    object: Arc<Value>,
    prev: Option<Arc<Value>>,
}

/// An event as one watch sees it, after its selectors were applied.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub event: EventType,
    pub object: Arc<Value>,
}

impl WatchEvent {
    pub fn to_json(&self) -> Value {
        json!({"type": self.event.as_str(), "object": &*self.object})
    }
}

/// What a list or watch request selects.
#[derive(Debug, Clone)]
pub struct Selection {
    pub resource: &'static ResourceKind,
    /// `None` for all namespaces (or a cluster-scoped type).
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selection {
    #[cfg(test)]
    pub fn all(resource: &'static ResourceKind) -> Self {
        Self {
            resource,
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
        }
    }

    fn matches(&self, object: &Value) -> bool {
        let namespace_ok = match &self.namespace {
            Some(ns) => object::namespace(object) == Some(ns.as_str()),
            None => true,
        };
        namespace_ok && self.labels.matches(object) && self.fields.matches(object)
    }

    /// How an entry looks through this selection. An object that stops matching is
    /// seen as deleted and one that starts matching as added, as the apiserver's
    /// watch cache does; the deletion carries the previous content at the new RV.
    fn view(&self, entry: &HistoryEntry) -> Option<WatchEvent> {
        if !std::ptr::eq(entry.resource, self.resource) {
            return None;
        }
        let was = entry.prev.as_ref().is_some_and(|p| self.matches(p));
        let is = entry.event != EventType::Deleted && self.matches(&entry.object);
        let event = match (entry.event, was, is) {
            (EventType::Deleted, true, _) => EventType::Deleted,
            (_, false, true) => EventType::Added,
            (_, true, true) => EventType::Modified,
            (_, true, false) => {
                let mut last = entry.prev.as_deref().cloned().unwrap_or(Value::Null);
                set_resource_version(&mut last, entry.rv);
                return Some(WatchEvent {
                    event: EventType::Deleted,
                    object: Arc::new(last),
                });
            }
            _ => return None,
        };
        Some(WatchEvent {
            event,
            object: entry.object.clone(),
        })
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current state, then live events
    /// (`resourceVersion` unset or `0`, or `sendInitialEvents=true`).
    CurrentState,
    /// Every event newer than this resourceVersion, then live events.
    After(u64),
}

struct WatcherSink {
    selection: Selection,
    tx: mpsc::UnboundedSender<WatchEvent>,
}

/// An open watch's feed. Events arrive in resourceVersion order; the channel closes
/// when the server drops the watch.
pub struct WatchFeed {
    pub initial: Vec<WatchEvent>,
    /// The store's resourceVersion when the watch started.
    pub start_rv: u64,
    pub live: mpsc::UnboundedReceiver<WatchEvent>,
}

pub struct Store {
    rv: u64,
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    history: VecDeque<HistoryEntry>,
    history_limit: usize,
    /// The oldest resourceVersion a watch can resume from or a list can read at:
    /// every change after it is still in `history`.
    floor: u64,
    watchers: Vec<WatcherSink>,
    next_uid: u64,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            floor: 1,
            watchers: Vec::new(),
            next_uid: 0,
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    #[cfg(test)]
    pub fn floor(&self) -> u64 {
        self.floor
    }

    fn objects_of(
        &self,
        resource: &ResourceKind,
    ) -> impl Iterator<Item = (&ObjectKey, &Arc<Value>)> {
        let start = key_of(resource, "", "");
        let (group, plural) = (resource.group, resource.plural);
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.0 == group && k.1 == plural)
    }

    pub fn get(&self, resource: &ResourceKind, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(&key_of(resource, namespace, name))
            .cloned()
    }

    /// Every stored object of a type, in key order.
    pub fn objects(&self, resource: &ResourceKind) -> Vec<Arc<Value>> {
        self.objects_of(resource).map(|(_, v)| v.clone()).collect()
    }

    fn not_found(resource: &ResourceKind, name: &str) -> Error {
        Error::NotFound {
            resource: resource.qualified_name(),
            name: name.to_string(),
        }
    }

    /// Fills in type fields and checks the namespace rules; returns `(namespace, name)`.
    fn normalize(
        &mut self,
        resource: &'static ResourceKind,
        object: &mut Value,
    ) -> Result<(String, String)> {
        let Some(obj) = object.as_object_mut() else {
            return Err(Error::BadRequest("the object is not a JSON object".into()));
        };
        for (field, expected) in [
            ("apiVersion", resource.api_version()),
            ("kind", resource.kind.to_string()),
        ] {
            match obj.get(field).and_then(Value::as_str) {
                Some(given) if !given.is_empty() && given != expected => {
                    return Err(Error::BadRequest(format!(
                        "{field} {given:?} does not match the expected {expected:?}"
                    )));
                }
                _ => {
                    obj.insert(field.into(), Value::String(expected));
                }
            }
        }
        if object::name(object).is_none()
            && let Some(prefix) = object::meta_str(object, "generateName").map(str::to_string)
        {
            self.next_uid += 1;
            let generated = format!("{prefix}{:05x}", self.next_uid);
            if let Some(meta) = object::metadata_mut(object) {
                meta.insert("name".into(), Value::String(generated));
            }
        }
        let name = object::name(object)
            .ok_or_else(|| {
                Error::Invalid(
                    "metadata.name: Required value: name or generateName is required".into(),
                )
            })?
            .to_string();
        let namespace = if resource.namespaced {
            object::namespace(object)
                .ok_or_else(|| {
                    Error::BadRequest("an empty namespace may not be set during creation".into())
                })?
                .to_string()
        } else {
            if let Some(meta) = object::metadata_mut(object) {
                meta.remove("namespace");
            }
            String::new()
        };
        Ok((namespace, name))
    }

    fn commit(
        &mut self,
        resource: &'static ResourceKind,
        event: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let entry = HistoryEntry {
            rv: self.rv,
            resource,
            event,
            object,
            prev,
        };
        self.watchers.retain(|w| match w.selection.view(&entry) {
            Some(ev) => w.tx.send(ev).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(entry);
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.floor = dropped.rv;
            }
        }
    }

    pub fn create(
        &mut self,
        resource: &'static ResourceKind,
        mut object: Value,
    ) -> Result<Arc<Value>> {
        let (namespace, name) = self.normalize(resource, &mut object)?;
        let key = key_of(resource, &namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(Error::AlreadyExists {
                resource: resource.qualified_name(),
                name,
            });
        }
        self.rv += 1;
        self.next_uid += 1;
        let uid = format!("00000000-0000-4000-8000-{:012x}", self.next_uid);
        if let Some(meta) = object::metadata_mut(&mut object) {
            meta.insert("uid".into(), Value::String(uid));
            meta.insert("creationTimestamp".into(), object::now_timestamp());
            meta.insert("generation".into(), Value::from(1));
            meta.insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        }
        let object = Arc::new(object);
        self.objects.insert(key, object.clone());
        self.commit(resource, EventType::Added, object.clone(), None);
        Ok(object)
    }

    /// Replaces an existing object. With `check_rv`, a non-empty
    /// `metadata.resourceVersion` in `object` must equal the stored one (optimistic
    /// concurrency). A write that changes nothing commits nothing, as upstream.
    pub fn replace(
        &mut self,
        resource: &'static ResourceKind,
        mut object: Value,
        check_rv: bool,
    ) -> Result<Arc<Value>> {
        let (namespace, name) = self.normalize(resource, &mut object)?;
        let key = key_of(resource, &namespace, &name);
        let Some(existing) = self.objects.get(&key).cloned() else {
            return Err(Self::not_found(resource, &name));
        };
        let given_rv = object::meta_str(&object, "resourceVersion");
        if check_rv
            && given_rv.is_some()
            && given_rv != object::meta_str(&existing, "resourceVersion")
        {
            return Err(Error::Conflict {
                resource: resource.qualified_name(),
                name,
            });
        }
        let mut generation = existing
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        if existing.get("spec") != object.get("spec") {
            generation += 1;
        }
        if let Some(meta) = object::metadata_mut(&mut object) {
            for field in ["uid", "creationTimestamp"] {
                match existing.pointer(&format!("/metadata/{field}")) {
                    Some(v) => meta.insert(field.into(), v.clone()),
                    None => meta.remove(field),
                };
            }
            meta.insert("generation".into(), Value::from(generation));
        }
        if same_content(&existing, &object) {
            return Ok(existing);
        }
        self.rv += 1;
        set_resource_version(&mut object, self.rv);
        let object = Arc::new(object);
        self.objects.insert(key, object.clone());
        self.commit(
            resource,
            EventType::Modified,
            object.clone(),
            Some(existing),
        );
        Ok(object)
    }

    /// Creates the object, or replaces it whatever resourceVersion it carries.
    pub fn upsert(
        &mut self,
        resource: &'static ResourceKind,
        mut object: Value,
    ) -> Result<Arc<Value>> {
        let (namespace, name) = self.normalize(resource, &mut object)?;
        if self
            .objects
            .contains_key(&key_of(resource, &namespace, &name))
        {
            self.replace(resource, object, false)
        } else {
            self.create(resource, object)
        }
    }

    /// Removes the object; returns its last state stamped with the deletion's resourceVersion.
    pub fn delete(
        &mut self,
        resource: &'static ResourceKind,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<Value>> {
        let key = key_of(resource, namespace, name);
        let Some(existing) = self.objects.remove(&key) else {
            return Err(Self::not_found(resource, name));
        };
        self.rv += 1;
        let mut last = (*existing).clone();
        set_resource_version(&mut last, self.rv);
        let last = Arc::new(last);
        self.commit(resource, EventType::Deleted, last.clone(), Some(existing));
        Ok(last)
    }

    /// Forgets all history: a watch or continued list from before now gets `410 Expired`.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    /// Closes every open watch feed.
    pub fn drop_watches(&mut self) {
        self.watchers.clear();
    }

    pub fn open_watches(&self, resource: Option<&ResourceKind>) -> usize {
        self.watchers
            .iter()
            .filter(|w| !w.tx.is_closed())
            .filter(|w| resource.is_none_or(|r| std::ptr::eq(w.selection.resource, r)))
            .count()
    }

    fn expired(&self, rv: u64) -> Error {
        Error::Expired(format!("too old resource version: {rv} ({})", self.floor))
    }

    pub fn watch(&mut self, selection: Selection, start: WatchStart) -> Result<WatchFeed> {
        let initial = match start {
            WatchStart::CurrentState => self
                .objects_of(selection.resource)
                .filter(|(_, o)| selection.matches(o))
                .map(|(_, o)| WatchEvent {
                    event: EventType::Added,
                    object: o.clone(),
                })
                .collect(),
            WatchStart::After(rv) => {
                if rv < self.floor {
                    return Err(self.expired(rv));
                }
                self.history
                    .iter()
                    .filter(|e| e.rv > rv)
                    .filter_map(|e| selection.view(e))
                    .collect()
            }
        };
        let (tx, live) = mpsc::unbounded_channel();
        self.watchers.push(WatcherSink { selection, tx });
        Ok(WatchFeed {
            initial,
            start_rv: self.rv,
            live,
        })
    }
}

#[cfg(test)]
mod tests;
