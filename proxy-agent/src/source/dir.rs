// SPDX-License-Identifier: Apache-2.0
//! `--source DIR`: Services, EndpointSlices, ServiceCIDRs and Nodes read from the YAML/JSON
//! manifests (multi-document) in a directory, and read again whenever a file changes, so the
//! agent runs without an API server (demo, debugging, hosts outside Kubernetes).
//!
//! Every read is compared with the previous one; only objects that appeared, changed or
//! disappeared become events, exactly as a watch would report them. A file that does not
//! parse is skipped with a warning and its objects are kept as they were, so a half-written
//! file never removes services.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::{
        core::v1::{Node, Service},
        discovery::v1::EndpointSlice,
        networking::v1::ServiceCIDR,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::k8s::{
    convert::objects::{ClusterObject, parse_objects_map},
    watch::{Change, ClusterEvent, ResourceKind},
};

/// How often the directory is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Identity of an object across reads: kind, namespace, name.
type ObjectId = (ResourceKind, String, String);

/// One parsed object, behind the `Arc` that every holder shares: the per-file lists, the
/// index of the last read, the events sent and the event loop's own state all point at one
/// copy. (Earlier each of them held its own clone: with 50,000 services that was four
/// copies of every Service and two of every EndpointSlice, most of the agent's memory.)
#[derive(Clone, Debug)]
enum Shared {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Node(Arc<Node>),
    ServiceCidr(Arc<ServiceCIDR>),
}

impl From<ClusterObject> for Shared {
    fn from(o: ClusterObject) -> Self {
        match o {
            ClusterObject::Service(s) => Shared::Service(Arc::new(s)),
            ClusterObject::EndpointSlice(s) => Shared::EndpointSlice(Arc::new(s)),
            ClusterObject::Node(n) => Shared::Node(Arc::new(n)),
            ClusterObject::ServiceCidr(c) => Shared::ServiceCidr(Arc::new(c)),
        }
    }
}

impl Shared {
    fn kind(&self) -> ResourceKind {
        match self {
            Shared::Service(_) => ResourceKind::Service,
            Shared::EndpointSlice(_) => ResourceKind::EndpointSlice,
            Shared::Node(_) => ResourceKind::Node,
            Shared::ServiceCidr(_) => ResourceKind::ServiceCidr,
        }
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Shared::Service(s) => &s.metadata,
            Shared::EndpointSlice(s) => &s.metadata,
            Shared::Node(n) => &n.metadata,
            Shared::ServiceCidr(c) => &c.metadata,
        }
    }

    fn id(&self) -> ObjectId {
        let m = self.meta();
        (
            self.kind(),
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    }

    /// Same content (the same `Arc` when the file was not re-read).
    fn same_as(&self, other: &Shared) -> bool {
        fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
            Arc::ptr_eq(a, b) || **a == **b
        }
        match (self, other) {
            (Shared::Service(a), Shared::Service(b)) => same(a, b),
            (Shared::EndpointSlice(a), Shared::EndpointSlice(b)) => same(a, b),
            (Shared::Node(a), Shared::Node(b)) => same(a, b),
            (Shared::ServiceCidr(a), Shared::ServiceCidr(b)) => same(a, b),
            _ => false,
        }
    }
}

/// Reads every manifest of `dir` (sorted by file name). Files that fail to parse keep the
/// objects they had in `previous_by_file`.
fn read_dir(
    dir: &Path,
    previous_by_file: &HashMap<PathBuf, Vec<Shared>>,
) -> std::io::Result<HashMap<PathBuf, Vec<Shared>>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        })
        .collect();
    files.sort();
    let mut out = HashMap::new();
    for file in files {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                warn!(file = %file.display(), error = %e, "cannot read manifest; keeping its objects");
                if let Some(prev) = previous_by_file.get(&file) {
                    out.insert(file, prev.clone());
                }
                continue;
            }
        };
        // Each object goes into its Arc as soon as it is decoded: a Vec<ClusterObject>
        // (objects inline, ~1.5 KiB each, with doubling slack) is never built.
        match parse_objects_map(&text, Shared::from) {
            Ok(mut objects) => {
                objects.shrink_to_fit();
                out.insert(file, objects);
            }
            Err(e) => {
                warn!(file = %file.display(), error = %e, "invalid manifest; keeping its objects");
                if let Some(prev) = previous_by_file.get(&file) {
                    out.insert(file, prev.clone());
                }
            }
        }
    }
    Ok(out)
}

/// The events that turn `before` into `after`.
fn diff(
    before: &BTreeMap<ObjectId, Shared>,
    after: &BTreeMap<ObjectId, Shared>,
) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    for (id, obj) in before {
        if !after.contains_key(id) {
            events.push(event(obj, true));
        }
    }
    for (id, obj) in after {
        if before.get(id).is_none_or(|b| !b.same_as(obj)) {
            events.push(event(obj, false));
        }
    }
    events
}

/// The event for `obj`, sharing its `Arc` (no copy).
fn event(obj: &Shared, deleted: bool) -> ClusterEvent {
    fn change<T>(v: &Arc<T>, deleted: bool) -> Change<T> {
        if deleted {
            Change::Delete(v.clone())
        } else {
            Change::Upsert(v.clone())
        }
    }
    match obj {
        Shared::Service(s) => ClusterEvent::Service(change(s, deleted)),
        Shared::EndpointSlice(s) => ClusterEvent::EndpointSlice(change(s, deleted)),
        Shared::Node(n) => ClusterEvent::Node(change(n, deleted)),
        Shared::ServiceCidr(c) => ClusterEvent::ServiceCidr(change(c, deleted)),
    }
}

/// Flattens per-file objects; later files win on duplicates (with a warning). Nodes other
/// than `node_name` are not this agent's business.
fn index(by_file: &HashMap<PathBuf, Vec<Shared>>, node_name: &str) -> BTreeMap<ObjectId, Shared> {
    let mut files: Vec<&PathBuf> = by_file.keys().collect();
    files.sort();
    let mut out = BTreeMap::new();
    for file in files {
        for obj in &by_file[file] {
            let id = obj.id();
            if id.0 == ResourceKind::Node && id.2 != node_name {
                continue;
            }
            if out.insert(id.clone(), obj.clone()).is_some() {
                warn!(object = ?id, file = %file.display(), "object defined twice; the later file wins");
            }
        }
    }
    out
}

/// Watches `dir` until `tx` closes.
pub fn spawn(dir: PathBuf, node_name: String, tx: mpsc::Sender<ClusterEvent>) {
    tokio::spawn(async move {
        let mut by_file: HashMap<PathBuf, Vec<Shared>> = HashMap::new();
        let mut current: BTreeMap<ObjectId, Shared> = BTreeMap::new();
        let mut stamp: Option<Vec<(PathBuf, SystemTime, u64)>> = None;
        let mut synced = false;
        loop {
            let now_stamp = dir_stamp(&dir);
            if stamp.as_ref() != Some(&now_stamp) || !synced {
                stamp = Some(now_stamp);
                match read_dir(&dir, &by_file) {
                    Ok(read) => {
                        by_file = read;
                        let next = index(&by_file, &node_name);
                        let events = diff(&current, &next);
                        if !events.is_empty() {
                            info!(dir = %dir.display(), changes = events.len(), "manifests changed");
                        }
                        current = next;
                        for e in events {
                            if tx.send(e).await.is_err() {
                                return;
                            }
                        }
                        if !synced {
                            synced = true;
                            for kind in [
                                ResourceKind::Service,
                                ResourceKind::EndpointSlice,
                                ResourceKind::Node,
                                ResourceKind::ServiceCidr,
                            ] {
                                if tx.send(ClusterEvent::Synced(kind)).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        warn!(dir = %dir.display(), error = %e, "cannot read the source directory");
                    }
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    });
}

/// Names, modification times and sizes of the directory's files: a change in any means a
/// re-read.
fn dir_stamp(dir: &Path) -> Vec<(PathBuf, SystemTime, u64)> {
    let mut out: Vec<(PathBuf, SystemTime, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let m = e.metadata().ok()?;
            Some((e.path(), m.modified().ok()?, m.len()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    const NODE_A: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n";
    const NODE_B: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n";

    fn summary(events: &[ClusterEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                ClusterEvent::Service(Change::Upsert(s)) => {
                    format!("+svc {}", s.metadata.name.clone().unwrap_or_default())
                }
                ClusterEvent::Service(Change::Delete(s)) => {
                    format!("-svc {}", s.metadata.name.clone().unwrap_or_default())
                }
                ClusterEvent::Node(Change::Upsert(n)) => {
                    format!("+node {}", n.metadata.name.clone().unwrap_or_default())
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn reads_diff_and_bad_files_keep_their_objects() {
        let dir = std::env::temp_dir().join(format!("kpe-dirsource-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), SVC).unwrap();
        std::fs::write(dir.join("nodes.yaml"), format!("{NODE_A}---\n{NODE_B}")).unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();

        let first = read_dir(&dir, &HashMap::new()).unwrap();
        let idx = index(&first, "node-a");
        assert_eq!(
            summary(&diff(&BTreeMap::new(), &idx)),
            vec!["+svc a", "+node node-a"]
        );

        // A broken edit keeps the previous objects: no event.
        std::fs::write(dir.join("svc.yaml"), "kind: [").unwrap();
        let second = read_dir(&dir, &first).unwrap();
        assert!(diff(&idx, &index(&second, "node-a")).is_empty());

        // Removing the file deletes its objects.
        std::fs::remove_file(dir.join("svc.yaml")).unwrap();
        let third = read_dir(&dir, &second).unwrap();
        assert_eq!(
            summary(&diff(&idx, &index(&third, "node-a"))),
            vec!["-svc a"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
