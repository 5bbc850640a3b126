// SPDX-License-Identifier: Apache-2.0
//! What the upstream-restating tests share: a cluster model fed the way the agent's event
//! loop feeds it, one scenario-like step at a time.

use std::sync::Arc;

use proxy_agent::{
    k8s::convert::{ClusterObject, parse_objects},
    model::{ClusterState, FamilyState, IpFamily},
};

/// The agent's `ClusterState` holding exactly the objects of the last [`Cluster::set`].
pub struct Cluster {
    state: ClusterState,
    objects: Vec<ClusterObject>,
}

impl Cluster {
    /// An IPv4 cluster seen from `node`.
    pub fn new(node: &str) -> Self {
        Self {
            state: ClusterState::new(&[IpFamily::V4], node),
            objects: Vec::new(),
        }
    }

    /// Makes the cluster hold exactly these objects (YAML, as the API serves them): the
    /// ones missing are deleted, the others created or updated, as a scenario step does.
    /// The pending changes are applied.
    pub fn set(&mut self, yaml: &str) {
        let next = if yaml.trim().is_empty() {
            Vec::new()
        } else {
            parse_objects(yaml).expect("test objects decode")
        };
        for old in std::mem::take(&mut self.objects) {
            let kept = next
                .iter()
                .any(|o| o.kind() == old.kind() && o.name() == old.name());
            if !kept {
                self.apply(&old, true);
            }
        }
        for object in &next {
            self.apply(object, false);
        }
        self.objects = next;
        self.state.apply_pending();
    }

    fn apply(&mut self, object: &ClusterObject, deleted: bool) {
        match object {
            ClusterObject::Service(s) => {
                self.state.service(&Arc::new(s.clone()), deleted);
            }
            ClusterObject::EndpointSlice(s) => {
                self.state.endpoint_slice(s, deleted);
            }
            ClusterObject::Node(n) if !deleted => {
                self.state.node(&Arc::new(n.clone()));
            }
            _ => {}
        }
    }

    pub fn families(&self) -> &[FamilyState] {
        self.state.families()
    }
}
