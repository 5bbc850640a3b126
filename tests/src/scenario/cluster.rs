// SPDX-License-Identifier: Apache-2.0
//! How scenario objects reach the agent. A [`ClusterSource`] holds the cluster state;
//! [`Tracked`] implements it over an [`ObjectStore`]: [`DirStore`] writes one YAML file
//! per object into a directory the agent reads (`--source DIR`); a store backed by the
//! test API server (`put` = apply, `remove` = delete, connection = its kubeconfig) is
//! the other.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::{
    error::{Error, Result},
    format::ObjectRef,
    objects::object_ref,
};

/// How the agent is pointed at the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentConnection {
    /// `clientConnection.kubeconfig` in the agent's configuration.
    Kubeconfig(PathBuf),
    /// `--source DIR` on the agent's command line.
    SourceDir(PathBuf),
}

pub trait ClusterSource {
    /// Makes the cluster hold exactly these objects: creates, updates and deletes.
    fn apply_state(&mut self, objects: &[Value]) -> Result<()>;
    /// Deletes these objects (missing ones are an error: the scenario is wrong).
    fn delete(&mut self, refs: &[ObjectRef]) -> Result<()>;
    fn connection(&self) -> AgentConnection;
}

/// Where objects are kept: a directory, or an API server.
pub trait ObjectStore {
    /// Creates or replaces the object.
    fn put(&mut self, r: &ObjectRef, object: &Value) -> Result<()>;
    fn remove(&mut self, r: &ObjectRef) -> Result<()>;
    fn connection(&self) -> AgentConnection;
}

/// A [`ClusterSource`] over any [`ObjectStore`]: it remembers the state, so a new
/// state touches only objects that changed (deletions first, so an address moving
/// from one object to another never exists twice). Objects go in by kind, in the order
/// a real API server needs them ([`kind_order`]), and are deleted in the reverse order.
#[derive(Debug)]
pub struct Tracked<S> {
    store: S,
    current: BTreeMap<ObjectRef, Value>,
}

impl<S: ObjectStore> Tracked<S> {
    pub fn new(store: S) -> Self {
        Tracked {
            store,
            current: BTreeMap::new(),
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: ObjectStore> ClusterSource for Tracked<S> {
    fn apply_state(&mut self, objects: &[Value]) -> Result<()> {
        let mut desired: Vec<(ObjectRef, &Value)> = Vec::new();
        for object in objects {
            let r = object_ref(object)?;
            if desired.iter().any(|(seen, _)| *seen == r) {
                return Err(Error::Invalid(format!("{r} appears twice")));
            }
            desired.push((r, object));
        }
        let mut gone: Vec<ObjectRef> = self
            .current
            .keys()
            .filter(|r| !desired.iter().any(|(d, _)| d == *r))
            .cloned()
            .collect();
        gone.sort_by_key(|r| std::cmp::Reverse(kind_order(&r.kind)));
        desired.sort_by_key(|(r, _)| kind_order(&r.kind));
        for r in gone {
            self.store.remove(&r)?;
            self.current.remove(&r);
        }
        for (r, object) in desired {
            if self.current.get(&r) != Some(object) {
                self.store.put(&r, object)?;
                self.current.insert(r, object.clone());
            }
        }
        Ok(())
    }

    fn delete(&mut self, refs: &[ObjectRef]) -> Result<()> {
        let mut refs: Vec<&ObjectRef> = refs.iter().collect();
        refs.sort_by_key(|r| std::cmp::Reverse(kind_order(&r.kind)));
        for r in refs {
            if !self.current.contains_key(r) {
                return Err(Error::Invalid(format!(
                    "delete of {r}, which does not exist"
                )));
            }
            self.store.remove(r)?;
            self.current.remove(r);
        }
        Ok(())
    }

    fn connection(&self) -> AgentConnection {
        self.store.connection()
    }
}

/// Where a kind goes in a change: a ServiceCIDR before the Services whose ClusterIPs it
/// holds (the API server refuses a ClusterIP outside every ServiceCIDR), a Node before the
/// Pods on it (the EndpointSlice controller skips pods of an unknown node), Services before
/// their EndpointSlices and Pods. Deletions go the other way (stable within a kind: the
/// file's order).
pub fn kind_order(kind: &str) -> u8 {
    match kind {
        "ServiceCIDR" => 0,
        "Node" => 1,
        "Service" => 2,
        "EndpointSlice" => 3,
        "Pod" => 4,
        _ => 5,
    }
}

/// One file per object, `<Kind>_<namespace>_<name>.yaml` (`_` for cluster-scoped),
/// written atomically (temporary file, then rename) so the agent never reads half.
#[derive(Debug)]
pub struct DirStore {
    dir: PathBuf,
}

impl DirStore {
    pub fn new(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(DirStore {
            dir: dir.to_path_buf(),
        })
    }

    pub fn file_of(&self, r: &ObjectRef) -> PathBuf {
        let ns = r.namespace.as_deref().unwrap_or("_");
        self.dir.join(format!("{}_{}_{}.yaml", r.kind, ns, r.name))
    }
}

impl ObjectStore for DirStore {
    fn put(&mut self, r: &ObjectRef, object: &Value) -> Result<()> {
        let path = self.file_of(r);
        let tmp = self.dir.join(format!(".{}.tmp", r.name));
        let text = serde_yaml::to_string(object)?;
        fs::write(&tmp, text).map_err(Error::io(format!("writing {}", tmp.display())))?;
        fs::rename(&tmp, &path).map_err(Error::io(format!("renaming to {}", path.display())))
    }

    fn remove(&mut self, r: &ObjectRef) -> Result<()> {
        let path = self.file_of(r);
        fs::remove_file(&path).map_err(Error::io(format!("removing {}", path.display())))
    }

    fn connection(&self) -> AgentConnection {
        AgentConnection::SourceDir(self.dir.clone())
    }
}

/// The directory-backed cluster the runner uses until the API-server store lands.
pub type DirSource = Tracked<DirStore>;

/// Objects served by the test API server. The server's socket is bound inside the node's
/// network namespace, so the agent there reaches it on its own 127.0.0.1.
pub struct ApiServerStore {
    server: crate::apiserver::TestApiServer,
    kubeconfig: PathBuf,
}

impl std::fmt::Debug for ApiServerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerStore")
            .field("url", &self.server.url())
            .finish()
    }
}

fn api_error(context: &str, err: impl std::fmt::Display) -> Error {
    Error::Setup(format!("{context}: {err}"))
}

impl ApiServerStore {
    /// Starts a server inside `node_ns` (needs a tokio runtime).
    pub fn start(node_ns: &str, run_dir: &Path) -> Result<Self> {
        let listener = super::netns::bind_tcp_listener_in(node_ns, ([127, 0, 0, 1], 0).into())?;
        let server = crate::apiserver::TestApiServer::start_on(
            listener,
            crate::apiserver::ServerConfig::default(),
        )
        .map_err(|e| api_error("starting the test API server", e))?;
        let kubeconfig = run_dir.join("kubeconfig");
        server
            .write_kubeconfig(&kubeconfig)
            .map_err(|e| api_error("writing the kubeconfig", e))?;
        Ok(Self { server, kubeconfig })
    }

    /// Starts one server for the agents of several namespaces: it listens on the
    /// 127.0.0.1 of each, and the kubeconfig of namespace `i` is the `i`-th returned
    /// (the first is also the store's own connection).
    pub fn start_in_all(namespaces: &[String], run_dir: &Path) -> Result<(Self, Vec<PathBuf>)> {
        let (first, rest) = namespaces
            .split_first()
            .ok_or_else(|| Error::Setup("an API server for no namespace".into()))?;
        let mut store = Self::start(first, run_dir)?;
        let mut kubeconfigs = vec![store.kubeconfig.clone()];
        for (index, ns) in rest.iter().enumerate() {
            let listener = super::netns::bind_tcp_listener_in(ns, ([127, 0, 0, 1], 0).into())?;
            let yaml = store
                .server
                .also_serve_on(listener)
                .map_err(|e| api_error(&format!("serving in {ns}"), e))?;
            let path = run_dir.join(format!("kubeconfig-{}", index + 1));
            fs::write(&path, yaml).map_err(Error::io(format!("writing {}", path.display())))?;
            kubeconfigs.push(path);
        }
        Ok((store, kubeconfigs))
    }

    pub fn server(&self) -> &crate::apiserver::TestApiServer {
        &self.server
    }
}

impl ObjectStore for ApiServerStore {
    fn put(&mut self, r: &ObjectRef, object: &Value) -> Result<()> {
        self.server
            .apply_value(object.clone())
            .map(drop)
            .map_err(|e| api_error(&format!("storing {r}"), e))
    }

    fn remove(&mut self, r: &ObjectRef) -> Result<()> {
        let api_version = super::objects::api_version_of(&r.kind)
            .ok_or_else(|| Error::Invalid(format!("unknown kind in {r}")))?;
        self.server
            .delete_value(api_version, &r.kind, r.namespace.as_deref(), &r.name)
            .map(drop)
            .map_err(|e| api_error(&format!("deleting {r}"), e))
    }

    fn connection(&self) -> AgentConnection {
        AgentConnection::Kubeconfig(self.kubeconfig.clone())
    }
}

pub type ApiServerSource = Tracked<ApiServerStore>;

impl DirSource {
    pub fn in_dir(dir: &Path) -> Result<Self> {
        Ok(Tracked::new(DirStore::new(dir)?))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl ObjectStore for Recorder {
        fn put(&mut self, r: &ObjectRef, _: &Value) -> Result<()> {
            self.0.push(format!("put {r}"));
            Ok(())
        }
        fn remove(&mut self, r: &ObjectRef) -> Result<()> {
            self.0.push(format!("remove {r}"));
            Ok(())
        }
        fn connection(&self) -> AgentConnection {
            AgentConnection::Kubeconfig("/k".into())
        }
    }

    #[test]
    fn only_changes_reach_the_store_deletions_first() {
        let obj = |kind: &str, name: &str, v: i64| json!({"kind": kind, "metadata": {"name": name, "namespace": "ns"}, "spec": {"v": v}});
        let mut source = Tracked::new(Recorder::default());
        source
            .apply_state(&[obj("Service", "a", 1), obj("Service", "b", 1)])
            .unwrap();
        source
            .apply_state(&[
                obj("Service", "b", 1),
                obj("Service", "c", 1),
                obj("Service", "a", 2),
            ])
            .unwrap();
        source.delete(&["Service/ns/c".parse().unwrap()]).unwrap();
        assert_eq!(
            source.store().0,
            [
                "put Service/ns/a",
                "put Service/ns/b",
                "put Service/ns/c",
                "put Service/ns/a",
                "remove Service/ns/c"
            ]
        );
        source.apply_state(&[obj("Service", "z", 1)]).unwrap();
        assert_eq!(
            source.store().0[5..],
            [
                "remove Service/ns/a",
                "remove Service/ns/b",
                "put Service/ns/z"
            ]
        );
    }

    #[test]
    fn dir_source_tracks_state() {
        let dir = std::env::temp_dir().join(format!("dirsource-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut source = DirSource::in_dir(&dir).unwrap();
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns"}});
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": "s-1", "namespace": "ns"}, "endpoints": []});
        let cidr = json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "k"}});
        source
            .apply_state(&[svc.clone(), slice.clone(), cidr])
            .unwrap();
        assert_eq!(
            files(&dir),
            [
                "EndpointSlice_ns_s-1.yaml",
                "ServiceCIDR___k.yaml",
                "Service_ns_s.yaml"
            ]
        );
        let read: Value =
            serde_yaml::from_str(&fs::read_to_string(dir.join("Service_ns_s.yaml")).unwrap())
                .unwrap();
        assert_eq!(read, svc);

        source
            .delete(&["EndpointSlice/ns/s-1".parse().unwrap()])
            .unwrap();
        assert_eq!(files(&dir), ["ServiceCIDR___k.yaml", "Service_ns_s.yaml"]);
        assert!(
            source
                .delete(&["EndpointSlice/ns/s-1".parse().unwrap()])
                .is_err()
        );

        source.apply_state(&[slice]).unwrap();
        assert_eq!(files(&dir), ["EndpointSlice_ns_s-1.yaml"]);
        assert!(source.apply_state(&[svc.clone(), svc]).is_err());
        assert_eq!(source.connection(), AgentConnection::SourceDir(dir.clone()));
        fs::remove_dir_all(&dir).unwrap();
    }
}
