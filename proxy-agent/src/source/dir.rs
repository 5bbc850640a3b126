// SPDX-License-Identifier: Apache-2.0
//! `--source DIR`: Services, EndpointSlices, ServiceCIDRs and Nodes read from the YAML/JSON
//! manifests (multi-document) in a directory, and read again whenever a file changes, so the
//! agent runs without an API server (demo, debugging, hosts outside Kubernetes).
//!
//! Every read is compared with the previous one; only objects that appeared, changed or
//! disappeared become events, exactly as a watch would report them. A file that does not
//! parse is skipped with a warning and its objects are kept as they were, so a half-written
//! file never removes services.
//!
//! Between reads only a fingerprint of each object's text and its identity are kept
//! (`Kept`), not the object: the consumers keep what they need of it.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::{io::unix::AsyncFd, sync::mpsc};
use tracing::{info, warn};

use crate::{
    k8s::{
        convert::{
            self,
            objects::{
                ClusterObject, parse_json_objects_fingerprinted, parse_objects_fingerprinted,
            },
        },
        tombstone::{Buried, Tombstone},
        watch::{Change, ClusterEvent, ResourceKind},
    },
    model::{IpFamily, ServiceRecord, SliceRecord},
    parallel,
    sys::InotifyFd,
};

/// How often the directory is checked for changes when nothing wakes the source earlier
/// (an inotify watch on the directory, `DirWatch`).
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Wakes the source as soon as a file of the directory is written, moved or removed
/// (inotify), instead of at the next poll: a change reaches the proxier up to a poll
/// interval sooner. The poll stays, for what inotify does not tell (a directory that
/// does not exist yet, or is replaced).
struct DirWatch(AsyncFd<InotifyFd>);

impl DirWatch {
    /// None when the directory cannot be watched (yet): the poll alone serves then.
    fn new(dir: &Path) -> Option<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        // Written and closed, renamed in or out, removed: a file being written is read
        // once it is closed, not at each write.
        let events = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        inotify.add_watch(dir, events).ok()?;
        crate::sys::async_inotify(inotify).ok().map(Self)
    }

    /// Returns once something happened in the directory, with its events consumed: false
    /// when the watched directory itself went (removed or moved away: the source watches
    /// the path again), true otherwise. Never returns when the descriptor fails (the poll
    /// still runs).
    async fn changed(&self) -> bool {
        loop {
            let Ok(mut ready) = self.0.readable().await else {
                return std::future::pending().await;
            };
            match ready.try_io(|fd| fd.get_ref().read_events()) {
                Ok(Ok(events)) => {
                    let gone = AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF
                        | AddWatchFlags::IN_IGNORED;
                    return !events.iter().any(|e| e.mask.intersects(gone));
                }
                Ok(Err(_)) => return std::future::pending().await,
                // Nothing to read after all: wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

/// Identity of an object across reads: kind, namespace, name.
type ObjectId<'a> = (ResourceKind, &'a str, &'a str);

/// One object as read, for the events of this read only: nothing keeps it afterwards.
/// Services and EndpointSlices are converted for the model as they are decoded (on the
/// decoding threads; see [`crate::model::ServiceRecord`]).
#[derive(Clone, Debug)]
enum Fresh {
    Service(Arc<ServiceRecord>),
    EndpointSlice(Arc<SliceRecord>),
    Node(Arc<Node>),
    ServiceCidr(Arc<ServiceCIDR>),
}

impl Fresh {
    /// The upsert event, sharing the object's `Arc` (no copy).
    fn upsert(&self) -> ClusterEvent {
        match self {
            Fresh::Service(s) => ClusterEvent::Service(Change::Upsert(s.clone())),
            Fresh::EndpointSlice(s) => ClusterEvent::EndpointSlice(Change::Upsert(s.clone())),
            Fresh::Node(n) => ClusterEvent::Node(Change::Upsert(n.clone())),
            Fresh::ServiceCidr(c) => ClusterEvent::ServiceCidr(Change::Upsert(c.clone())),
        }
    }
}

/// What is kept of an object between reads: a fingerprint of its text, to tell whether
/// the next read changed it, and its identity, to report its deletion. (Keeping the
/// objects themselves made the directory source hold a copy of every Service and
/// EndpointSlice, about half the agent's memory at 50,000 services.)
#[derive(Clone, Debug, PartialEq)]
struct Kept {
    kind: ResourceKind,
    fingerprint: u64,
    tombstone: Tombstone,
}

impl Kept {
    fn id(&self) -> ObjectId<'_> {
        (self.kind, self.tombstone.namespace(), self.tombstone.name())
    }
}

/// One object of one read: what is kept, and the object itself while this read's events
/// are made (`None` for a file that did not parse and kept its previous objects).
/// Between reads only the [`Kept`] part stays (a sixth less memory per object than
/// keeping an empty `fresh` beside it).
#[derive(Clone, Debug)]
struct ReadObject {
    kept: Kept,
    fresh: Option<Fresh>,
}

impl ReadObject {
    /// `object` as read, converted for `families` (the node's) when the model takes it in
    /// converted. The API object goes here.
    fn new(object: ClusterObject, fingerprint: u64, families: &[IpFamily]) -> Self {
        let (kind, tombstone, fresh) = match object {
            ClusterObject::Service(s) => (
                ResourceKind::Service,
                s.tombstone(),
                Fresh::Service(Arc::new(convert::service_record(&s, families, false))),
            ),
            ClusterObject::EndpointSlice(s) => (
                ResourceKind::EndpointSlice,
                s.tombstone(),
                Fresh::EndpointSlice(Arc::new(convert::slice_record(&s, false))),
            ),
            ClusterObject::Node(n) => (ResourceKind::Node, n.tombstone(), Fresh::Node(Arc::new(n))),
            ClusterObject::ServiceCidr(c) => (
                ResourceKind::ServiceCidr,
                c.tombstone(),
                Fresh::ServiceCidr(Arc::new(c)),
            ),
        };
        ReadObject {
            kept: Kept {
                kind,
                fingerprint,
                tombstone,
            },
            fresh: Some(fresh),
        }
    }
}

/// What [`index`] files objects by: their kept part.
trait AsKept {
    fn as_kept(&self) -> &Kept;
}

impl AsKept for Kept {
    fn as_kept(&self) -> &Kept {
        self
    }
}

impl AsKept for ReadObject {
    fn as_kept(&self) -> &Kept {
        &self.kept
    }
}

/// Reads every manifest of `dir` (sorted by file name), converting Services for
/// `families`. Files that fail to parse keep the objects they had in `previous_by_file`
/// (as kept, without their content).
fn read_dir(
    dir: &Path,
    previous_by_file: &HashMap<PathBuf, Vec<Kept>>,
    families: &[IpFamily],
) -> std::io::Result<HashMap<PathBuf, Vec<ReadObject>>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        })
        .collect();
    files.sort();
    let keep_previous = |file: &PathBuf, out: &mut HashMap<PathBuf, Vec<ReadObject>>| {
        if let Some(prev) = previous_by_file.get(file) {
            out.insert(
                file.clone(),
                prev.iter()
                    .map(|kept| ReadObject {
                        kept: kept.clone(),
                        fresh: None,
                    })
                    .collect(),
            );
        }
    };
    let mut out = HashMap::new();
    for file in files {
        let text = match read_text(&file) {
            Ok(t) => t,
            Err(e) => {
                warn!(file = %file.display(), error = %e, "cannot read manifest; keeping its objects");
                keep_previous(&file, &mut out);
                continue;
            }
        };
        match parse_manifest(&file, &text, families) {
            Ok(mut objects) => {
                objects.shrink_to_fit();
                out.insert(file, objects);
            }
            Err(e) => {
                warn!(file = %file.display(), error = %e, "invalid manifest; keeping its objects");
                keep_previous(&file, &mut out);
            }
        }
    }
    Ok(out)
}

/// A manifest's text. A big file is read in two halves at once: a 100 MB manifest's read,
/// a copy out of the page cache into fresh memory, took 60 ms on one core while the
/// other waited. A file that changes size meanwhile is read again whole (the next read
/// of the directory sees the change anyway).
fn read_text(file: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt as _;
    let opened = std::fs::File::open(file)?;
    let len = usize::try_from(opened.metadata()?.len()).unwrap_or(usize::MAX);
    if parallel::workers_for(len, PARALLEL_READ_MIN) < 2 {
        return std::fs::read_to_string(file);
    }
    // Zeroed by the allocator's fresh pages, faulted in by the two readers.
    let mut bytes = vec![0u8; len];
    let (head, tail) = bytes.split_at_mut(len / 2);
    let at = head.len() as u64;
    let (head_read, tail_read) = parallel::both(
        true,
        || opened.read_exact_at(head, 0),
        || opened.read_exact_at(tail, at),
    );
    let mut past_end = [0u8; 1];
    let whole = head_read.is_ok()
        && tail_read.is_ok()
        && matches!(opened.read_at(&mut past_end, len as u64), Ok(0));
    if !whole {
        return std::fs::read_to_string(file);
    }
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
}

/// Manifests smaller than this are read on the calling thread alone.
const PARALLEL_READ_MIN: usize = 8 << 20;

/// The objects of one manifest. A `.json` file is read as JSON (what the API server
/// sends; several times faster than the YAML parser), and as YAML when that fails, as
/// every file was before: JSON is YAML, and a file named `.json` may hold YAML.
fn parse_manifest(
    file: &Path,
    text: &str,
    families: &[IpFamily],
) -> Result<Vec<ReadObject>, crate::k8s::convert::objects::Error> {
    let read = |object, fingerprint| ReadObject::new(object, fingerprint, families);
    if file.extension().is_some_and(|e| e == "json")
        && let Ok(objects) = parse_json_objects_fingerprinted(text, read)
    {
        return Ok(objects);
    }
    parse_objects_fingerprinted(text, read)
}

/// The events that turn `before` (the previous read) into `after` (this read): the
/// deletions, then the upserts, each by kind (Services first), in the order they were
/// read within a kind.
fn diff(before: &Index<'_, Kept>, after: &Index<'_, ReadObject>) -> Vec<ClusterEvent> {
    let mut deletions = Vec::new();
    for (id, gone) in before.in_read_order() {
        if !after.by_id.contains_key(&id) {
            deletions.push((id.0, deletion(id.0, &gone.tombstone)));
        }
    }
    let mut upserts = Vec::new();
    for (id, read) in after.in_read_order() {
        if before
            .by_id
            .get(&id)
            .is_none_or(|b| b.fingerprint != read.kept.fingerprint)
            && let Some(fresh) = &read.fresh
        {
            upserts.push((id.0, fresh.upsert()));
        }
    }
    // Stable: the read order stays within a kind.
    deletions.sort_by_key(|(kind, _)| *kind);
    upserts.sort_by_key(|(kind, _)| *kind);
    deletions
        .into_iter()
        .chain(upserts)
        .map(|(_, event)| event)
        .collect()
}

/// The deletion event of an object known only by its tombstone.
fn deletion(kind: ResourceKind, tombstone: &Tombstone) -> ClusterEvent {
    fn gone<T: Buried>(tombstone: &Tombstone) -> Change<T> {
        Change::Delete(Arc::new(T::from_tombstone(tombstone)))
    }
    match kind {
        ResourceKind::Service => ClusterEvent::Service(
            gone::<Service>(tombstone)
                .convert(|service, deleted| convert::service_record(service, &[], deleted)),
        ),
        ResourceKind::EndpointSlice => ClusterEvent::EndpointSlice(
            gone::<EndpointSlice>(tombstone).convert(convert::slice_record),
        ),
        ResourceKind::Node => ClusterEvent::Node(gone(tombstone)),
        ResourceKind::ServiceCidr => ClusterEvent::ServiceCidr(gone(tombstone)),
    }
}

/// One read's objects by id, and the order they were read in (files by name, each
/// file's objects in its order). Hashed, not sorted: a cold read of 200,000 objects
/// filed them in a B-tree of string ids, a serial tenth of a second after the parallel
/// decoding.
struct Index<'a, T> {
    by_id: foldhash::HashMap<ObjectId<'a>, &'a T>,
    /// Each id once, where it was first read (a later duplicate replaces the object, not
    /// its place).
    order: Vec<ObjectId<'a>>,
}

impl<T> Default for Index<'_, T> {
    fn default() -> Self {
        Self {
            by_id: foldhash::HashMap::default(),
            order: Vec::new(),
        }
    }
}

impl<'a, T> Index<'a, T> {
    fn in_read_order(&self) -> impl Iterator<Item = (ObjectId<'a>, &'a T)> + '_ {
        self.order
            .iter()
            .filter_map(|id| Some((*id, *self.by_id.get(id)?)))
    }
}

/// Flattens per-file objects; later files win on duplicates (with a warning). Nodes other
/// than `node_name` are not this agent's business.
fn index<'a, T: AsKept>(
    by_file: &'a HashMap<PathBuf, Vec<T>>,
    node_name: &str,
    warn_twice: bool,
) -> Index<'a, T> {
    let mut files: Vec<&PathBuf> = by_file.keys().collect();
    files.sort();
    let objects = by_file.values().map(Vec::len).sum();
    let mut out = Index {
        by_id: foldhash::HashMap::with_capacity_and_hasher(objects, Default::default()),
        order: Vec::with_capacity(objects),
    };
    for file in files {
        for obj in &by_file[file] {
            let id = obj.as_kept().id();
            if id.0 == ResourceKind::Node && id.2 != node_name {
                continue;
            }
            if out.by_id.insert(id, obj).is_none() {
                out.order.push(id);
            } else if warn_twice {
                warn!(object = ?id, file = %file.display(), "object defined twice; the later file wins");
            }
        }
    }
    out
}

/// The per-file lists without their content, once this read's events are made: what
/// the next read is compared with.
fn forget_content(by_file: HashMap<PathBuf, Vec<ReadObject>>) -> HashMap<PathBuf, Vec<Kept>> {
    by_file
        .into_iter()
        .map(|(file, objects)| {
            let mut kept: Vec<Kept> = objects.into_iter().map(|o| o.kept).collect();
            // Collected in place, into the read's own (larger) allocation: the room the
            // content took is given back.
            kept.shrink_to_fit();
            (file, kept)
        })
        .collect()
}

/// Watches `dir` until `tx` closes, converting Services for `families` (the node's).
pub fn spawn(
    dir: PathBuf,
    node_name: String,
    families: Vec<IpFamily>,
    tx: mpsc::Sender<ClusterEvent>,
) {
    tokio::spawn(async move {
        // The previous read, without content: what the next one is compared with.
        let mut by_file: HashMap<PathBuf, Vec<Kept>> = HashMap::new();
        let mut stamp: Option<Vec<(PathBuf, SystemTime, u64)>> = None;
        let mut synced = false;
        let mut watch = DirWatch::new(&dir);
        loop {
            let now_stamp = dir_stamp(&dir);
            if stamp.as_ref() != Some(&now_stamp) || !synced {
                stamp = Some(now_stamp);
                match read_dir(&dir, &by_file, &families) {
                    Ok(read) => {
                        let events = diff(
                            &index(&by_file, &node_name, false),
                            &index(&read, &node_name, true),
                        );
                        if !events.is_empty() {
                            info!(dir = %dir.display(), changes = events.len(), "manifests changed");
                        }
                        by_file = forget_content(read);
                        // One message: the loop takes the whole read in before a sync.
                        if !events.is_empty() && tx.send(ClusterEvent::Batch(events)).await.is_err()
                        {
                            return;
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
            if watch.is_none() {
                watch = DirWatch::new(&dir);
            }
            let still_watched = match &watch {
                Some(watch) => {
                    tokio::select! {
                        () = tokio::time::sleep(POLL_INTERVAL) => true,
                        watched = watch.changed() => watched,
                    }
                }
                None => {
                    tokio::time::sleep(POLL_INTERVAL).await;
                    true
                }
            };
            if !still_watched {
                // The directory was removed or replaced: watch whatever has its path next.
                watch = None;
            }
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

    const FAMILIES: &[IpFamily] = &[IpFamily::V4, IpFamily::V6];
    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    const NODE_A: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n";
    const NODE_B: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n";

    fn summary(events: &[ClusterEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                ClusterEvent::Service(Change::Upsert(s)) => format!("+svc {}", s.name.name()),
                ClusterEvent::Service(Change::Delete(s)) => format!("-svc {}", s.name.name()),
                ClusterEvent::Node(Change::Upsert(n)) => {
                    format!("+node {}", n.metadata.name.clone().unwrap_or_default())
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// The watch wakes on a file written and closed, renamed in, and removed, and not
    /// otherwise (it has no poll of its own).
    #[tokio::test]
    async fn the_watch_wakes_on_what_changes_the_directory() {
        use std::time::Duration;
        let dir = std::env::temp_dir().join(format!("kpe-dirwatch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            DirWatch::new(&dir.join("missing")).is_none(),
            "nothing to watch yet"
        );
        let watch = DirWatch::new(&dir).expect("inotify on a temporary directory");
        let quiet = Duration::from_millis(100);
        // A generous bound: only a watch that never wakes fails it.
        let wakes = Duration::from_secs(10);
        assert!(tokio::time::timeout(quiet, watch.changed()).await.is_err());

        std::fs::write(dir.join("a.yaml"), SVC).unwrap();
        let woke = tokio::time::timeout(wakes, watch.changed()).await;
        assert_eq!(woke.ok(), Some(true), "written");
        // Written beside the directory and renamed in, as the benchmarks and ConfigMap
        // volumes do.
        let staged = dir.with_extension("staged");
        std::fs::write(&staged, NODE_A).unwrap();
        std::fs::rename(&staged, dir.join("b.yaml")).unwrap();
        let woke = tokio::time::timeout(wakes, watch.changed()).await;
        assert_eq!(woke.ok(), Some(true), "renamed in");
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        let woke = tokio::time::timeout(wakes, watch.changed()).await;
        assert_eq!(woke.ok(), Some(true), "removed");
        // Every event was consumed: quiet again.
        assert!(tokio::time::timeout(quiet, watch.changed()).await.is_err());
        // The directory moved away: the watch says so, for the source to watch the path
        // again.
        let moved = dir.with_extension("moved");
        let _ = std::fs::remove_dir_all(&moved);
        std::fs::rename(&dir, &moved).unwrap();
        let still = tokio::time::timeout(wakes, watch.changed()).await;
        assert_eq!(still.ok(), Some(false), "the watched directory went");
        std::fs::remove_dir_all(&moved).unwrap();
    }

    /// What one read found comes as one message, so the agent never syncs half of it.
    #[tokio::test]
    async fn each_read_comes_as_one_batch() {
        use std::time::Duration;
        let dir = std::env::temp_dir().join(format!("kpe-dirbatch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), SVC).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        spawn(dir.clone(), "node-a".into(), FAMILIES.to_vec(), tx);
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("a message")
                .expect("the source runs")
        };
        let ClusterEvent::Batch(first) = next().await else {
            panic!("the first read is a batch")
        };
        assert_eq!(summary(&first), ["+svc a"]);
        for _ in 0..4 {
            assert!(matches!(next().await, ClusterEvent::Synced(_)));
        }
        std::fs::write(dir.join("nodes.yaml"), format!("{NODE_A}---\n{NODE_B}")).unwrap();
        let ClusterEvent::Batch(nodes) = next().await else {
            panic!("a later read is a batch too")
        };
        assert_eq!(
            summary(&nodes),
            ["+node node-a"],
            "only this node's Node is kept"
        );
        assert!(ClusterEvent::Batch(nodes).touches_node());
        assert!(!ClusterEvent::Batch(first).touches_node());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_diff_and_bad_files_keep_their_objects() {
        let dir = std::env::temp_dir().join(format!("kpe-dirsource-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), SVC).unwrap();
        std::fs::write(dir.join("nodes.yaml"), format!("{NODE_A}---\n{NODE_B}")).unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();

        fn index<T: AsKept>(by_file: &HashMap<PathBuf, Vec<T>>) -> Index<'_, T> {
            super::index(by_file, "node-a", true)
        }
        let first = read_dir(&dir, &HashMap::new(), FAMILIES).unwrap();
        assert_eq!(
            summary(&diff(&Index::default(), &index(&first))),
            vec!["+svc a", "+node node-a"]
        );
        let first = forget_content(first);
        let idx = index(&first);

        // A broken edit keeps the previous objects: no event.
        std::fs::write(dir.join("svc.yaml"), "kind: [").unwrap();
        let second = read_dir(&dir, &first, FAMILIES).unwrap();
        assert!(diff(&idx, &index(&second)).is_empty());
        let second = forget_content(second);

        // The same text read again: no event; a changed object: its upsert.
        std::fs::write(dir.join("svc.yaml"), SVC).unwrap();
        let again = read_dir(&dir, &second, FAMILIES).unwrap();
        assert!(diff(&idx, &index(&again)).is_empty());
        let again = forget_content(again);
        std::fs::write(dir.join("svc.yaml"), SVC.replace("port: 80", "port: 81")).unwrap();
        let edited = read_dir(&dir, &again, FAMILIES).unwrap();
        assert_eq!(summary(&diff(&idx, &index(&edited))), vec!["+svc a"]);

        // Removing the file deletes its objects: the deletion carries the identity.
        std::fs::remove_file(dir.join("svc.yaml")).unwrap();
        let third = read_dir(&dir, &second, FAMILIES).unwrap();
        let events = diff(&idx, &index(&third));
        assert_eq!(summary(&events), vec!["-svc a"]);
        let ClusterEvent::Service(Change::Delete(gone)) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(gone.name.namespace(), "ns");
        assert!(gone.ports.is_empty(), "a deletion carries only the name");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_big_manifest_read_in_halves_is_its_text() {
        let dir = std::env::temp_dir().join(format!("kpe-dirread-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Past the size read in halves, odd, with a character of several bytes across
        // the middle.
        let mut text = "é".repeat(PARALLEL_READ_MIN / 2 + 1);
        text.push('x');
        let file = dir.join("big.json");
        std::fs::write(&file, &text).unwrap();
        assert!(read_text(&file).unwrap() == text);
        // Not UTF-8: refused as the whole read refuses it.
        let mut bytes = text.into_bytes();
        bytes[PARALLEL_READ_MIN / 2] = 0xff;
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(
            read_text(&file).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        std::fs::write(dir.join("small.json"), "{}").unwrap();
        assert_eq!(read_text(&dir.join("small.json")).unwrap(), "{}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Events come deletions first, then upserts, each by kind (Services first) and in
    /// read order within a kind; a later file's duplicate is the one read, at the place
    /// the id was first read.
    #[test]
    fn events_come_by_kind_in_read_order_and_later_duplicates_win() {
        let svc = |name: &str, port: u16| {
            SVC.replace("name: a", &format!("name: {name}"))
                .replace("port: 80", &format!("port: {port}"))
        };
        let read = |files: &[(&str, String)]| -> HashMap<PathBuf, Vec<ReadObject>> {
            files
                .iter()
                .map(|(file, text)| {
                    let path = PathBuf::from(file);
                    let objects = parse_manifest(&path, text, FAMILIES).unwrap();
                    (path, objects)
                })
                .collect()
        };
        let first = read(&[
            (
                "a.yaml",
                format!("{}---\n{NODE_A}---\n{}", svc("b", 80), svc("a", 80)),
            ),
            ("b.yaml", format!("{}---\n{}", svc("c", 80), svc("b", 81))),
        ]);
        let events = diff(&Index::default(), &index(&first, "node-a", false));
        assert_eq!(
            summary(&events),
            ["+svc b", "+svc a", "+svc c", "+node node-a"]
        );
        let ClusterEvent::Service(Change::Upsert(b)) = &events[0] else {
            panic!("{events:?}")
        };
        let mut b = (**b).clone();
        let ports: Vec<u16> = b
            .take_ports(IpFamily::V4)
            .unwrap()
            .values()
            .map(|p| p.port)
            .collect();
        assert_eq!(ports, [81], "the later file's b");

        // a.yaml goes (its b is b.yaml's, unchanged), c changes: the deletions by kind,
        // then the upsert.
        let first = forget_content(first);
        let second = read(&[("b.yaml", format!("{}---\n{}", svc("c", 82), svc("b", 81)))]);
        let events = diff(
            &index(&first, "node-a", false),
            &index(&second, "node-a", false),
        );
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(summary(&events[..1]), ["-svc a"]);
        assert!(matches!(&events[1], ClusterEvent::Node(Change::Delete(_))));
        assert_eq!(summary(&events[2..]), ["+svc c"]);
    }

    #[test]
    fn a_json_file_is_read_as_json_and_one_holding_yaml_still_reads() {
        let dir = std::env::temp_dir().join(format!("kpe-dirsource-json-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let json = r#"[{"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}]"#;
        std::fs::write(dir.join("svc.json"), json).unwrap();
        std::fs::write(dir.join("node.json"), NODE_A).unwrap();
        fn index<T: AsKept>(by_file: &HashMap<PathBuf, Vec<T>>) -> Index<'_, T> {
            super::index(by_file, "node-a", true)
        }

        let first = read_dir(&dir, &HashMap::new(), FAMILIES).unwrap();
        assert_eq!(
            summary(&diff(&Index::default(), &index(&first))),
            vec!["+svc a", "+node node-a"]
        );
        let first = forget_content(first);
        // The same service from a YAML file instead: the same object, spelled otherwise,
        // so one upsert.
        std::fs::remove_file(dir.join("svc.json")).unwrap();
        std::fs::write(dir.join("svc.yaml"), SVC).unwrap();
        let second = read_dir(&dir, &first, FAMILIES).unwrap();
        let events = diff(&index(&first), &index(&second));
        assert_eq!(summary(&events), vec!["+svc a"]);
        let ClusterEvent::Service(Change::Upsert(svc)) = &events[0] else {
            panic!("{events:?}");
        };
        // Converted for the node's families as it was read.
        let families: Vec<IpFamily> = svc.ports.iter().map(|(family, _)| *family).collect();
        assert_eq!(families, FAMILIES);
        let mut svc = (**svc).clone();
        let ports = svc.take_ports(IpFamily::V4).expect("a valid service");
        let cluster_ips: Vec<String> = ports.values().map(|p| p.cluster_ip.to_string()).collect();
        assert_eq!(cluster_ips, ["10.96.0.1"]);
        assert_eq!(svc.take_ports(IpFamily::V6), Ok(Default::default()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
