// SPDX-License-Identifier: Apache-2.0
//! How scenario objects reach the agent. A [`ClusterSource`] holds the cluster state;
//! [`DirSource`] writes one YAML file per object into a directory the agent reads
//! (`--source DIR`). A source backed by the test API server implements the same trait.

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

/// One file per object, `<Kind>_<namespace>_<name>.yaml` (`_` for cluster-scoped),
/// written atomically (temporary file, then rename) so the agent never reads half.
#[derive(Debug)]
pub struct DirSource {
    dir: PathBuf,
    current: BTreeMap<ObjectRef, Value>,
}

impl DirSource {
    pub fn new(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(DirSource {
            dir: dir.to_path_buf(),
            current: BTreeMap::new(),
        })
    }

    pub fn file_of(&self, r: &ObjectRef) -> PathBuf {
        let ns = r.namespace.as_deref().unwrap_or("_");
        self.dir.join(format!("{}_{}_{}.yaml", r.kind, ns, r.name))
    }

    fn write(&self, r: &ObjectRef, object: &Value) -> Result<()> {
        let path = self.file_of(r);
        let tmp = self.dir.join(format!(".{}.tmp", r.name));
        let text = serde_yaml::to_string(object)?;
        fs::write(&tmp, text).map_err(Error::io(format!("writing {}", tmp.display())))?;
        fs::rename(&tmp, &path).map_err(Error::io(format!("renaming to {}", path.display())))
    }

    fn remove(&self, r: &ObjectRef) -> Result<()> {
        let path = self.file_of(r);
        fs::remove_file(&path).map_err(Error::io(format!("removing {}", path.display())))
    }
}

impl ClusterSource for DirSource {
    fn apply_state(&mut self, objects: &[Value]) -> Result<()> {
        let mut desired = BTreeMap::new();
        for object in objects {
            let r = object_ref(object)?;
            if desired.insert(r.clone(), object.clone()).is_some() {
                return Err(Error::Invalid(format!("{r} appears twice")));
            }
        }
        for r in self.current.keys().filter(|r| !desired.contains_key(*r)) {
            self.remove(r)?;
        }
        for (r, object) in &desired {
            if self.current.get(r) != Some(object) {
                self.write(r, object)?;
            }
        }
        self.current = desired;
        Ok(())
    }

    fn delete(&mut self, refs: &[ObjectRef]) -> Result<()> {
        for r in refs {
            if self.current.remove(r).is_none() {
                return Err(Error::Invalid(format!(
                    "delete of {r}, which does not exist"
                )));
            }
            self.remove(r)?;
        }
        Ok(())
    }

    fn connection(&self) -> AgentConnection {
        AgentConnection::SourceDir(self.dir.clone())
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

    #[test]
    fn dir_source_tracks_state() {
        let dir = std::env::temp_dir().join(format!("dirsource-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut source = DirSource::new(&dir).unwrap();
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
