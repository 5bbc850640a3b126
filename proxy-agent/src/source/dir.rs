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

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::k8s::{
    convert::objects::{ClusterObject, parse_objects},
    watch::{Change, ClusterEvent, ResourceKind},
};

/// How often the directory is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Identity of an object across reads: kind, namespace, name.
type ObjectId = (ResourceKind, String, String);

fn kind_of(o: &ClusterObject) -> ResourceKind {
    match o {
        ClusterObject::Service(_) => ResourceKind::Service,
        ClusterObject::EndpointSlice(_) => ResourceKind::EndpointSlice,
        ClusterObject::Node(_) => ResourceKind::Node,
        ClusterObject::ServiceCidr(_) => ResourceKind::ServiceCidr,
    }
}

fn meta(o: &ClusterObject) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    match o {
        ClusterObject::Service(s) => &s.metadata,
        ClusterObject::EndpointSlice(s) => &s.metadata,
        ClusterObject::Node(n) => &n.metadata,
        ClusterObject::ServiceCidr(c) => &c.metadata,
    }
}

fn id_of(o: &ClusterObject) -> ObjectId {
    let m = meta(o);
    (
        kind_of(o),
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Reads every manifest of `dir` (sorted by file name). Files that fail to parse keep the
/// objects they had in `previous_by_file`.
fn read_dir(
    dir: &Path,
    previous_by_file: &HashMap<PathBuf, Vec<ClusterObject>>,
) -> std::io::Result<HashMap<PathBuf, Vec<ClusterObject>>> {
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
        match parse_objects(&text) {
            Ok(objects) => {
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
    before: &BTreeMap<ObjectId, Arc<ClusterObject>>,
    after: &BTreeMap<ObjectId, Arc<ClusterObject>>,
) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    for (id, obj) in before {
        if !after.contains_key(id) {
            events.push(event(obj, true));
        }
    }
    for (id, obj) in after {
        if before.get(id).is_none_or(|b| **b != **obj) {
            events.push(event(obj, false));
        }
    }
    events
}

fn event(obj: &ClusterObject, deleted: bool) -> ClusterEvent {
    fn change<T: Clone>(v: &T, deleted: bool) -> Change<T> {
        if deleted {
            Change::Delete(Arc::new(v.clone()))
        } else {
            Change::Upsert(Arc::new(v.clone()))
        }
    }
    match obj {
        ClusterObject::Service(s) => ClusterEvent::Service(change(s, deleted)),
        ClusterObject::EndpointSlice(s) => ClusterEvent::EndpointSlice(change(s, deleted)),
        ClusterObject::Node(n) => ClusterEvent::Node(change(n, deleted)),
        ClusterObject::ServiceCidr(c) => ClusterEvent::ServiceCidr(change(c, deleted)),
    }
}

/// Flattens per-file objects; later files win on duplicates (with a warning). Nodes other
/// than `node_name` are not this agent's business.
fn index(
    by_file: &HashMap<PathBuf, Vec<ClusterObject>>,
    node_name: &str,
) -> BTreeMap<ObjectId, Arc<ClusterObject>> {
    let mut files: Vec<&PathBuf> = by_file.keys().collect();
    files.sort();
    let mut out = BTreeMap::new();
    for file in files {
        for obj in &by_file[file] {
            let id = id_of(obj);
            if id.0 == ResourceKind::Node && id.2 != node_name {
                continue;
            }
            if out.insert(id.clone(), Arc::new(obj.clone())).is_some() {
                warn!(object = ?id, file = %file.display(), "object defined twice; the later file wins");
            }
        }
    }
    out
}

/// Watches `dir` until `tx` closes.
pub fn spawn(dir: PathBuf, node_name: String, tx: mpsc::Sender<ClusterEvent>) {
    tokio::spawn(async move {
        let mut by_file: HashMap<PathBuf, Vec<ClusterObject>> = HashMap::new();
        let mut current: BTreeMap<ObjectId, Arc<ClusterObject>> = BTreeMap::new();
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
