// SPDX-License-Identifier: Apache-2.0
//! The agent's watch events fed into a `ClusterState`, as its event loop does, with the
//! rendered model, the deletions seen and the refusals reported published for a test to
//! wait on (tests of the watchers against the test API server).

use std::{collections::BTreeMap, fmt::Debug, time::Duration};

use proxy_agent::{
    k8s::watch::ClusterEvent,
    model::{ClusterState, IpFamily, ObjectKind},
};
use tokio::sync::{mpsc, watch};

/// A model rendered as comparable text, one entry per service port.
pub type Model = BTreeMap<String, String>;

/// (kind, "ns/name", reason) of every refusal reported, in order.
pub type Reports = Vec<(ObjectKind, String, String)>;

pub struct ModelFeed {
    pub model: watch::Receiver<Model>,
    /// Delete events seen.
    pub deletes: watch::Receiver<usize>,
    pub reports: watch::Receiver<Reports>,
}

/// Consumes `rx` on a task (node `node-a`, both families), publishing `render` of the state
/// after every event.
pub fn feed(mut rx: mpsc::Receiver<ClusterEvent>, render: fn(&ClusterState) -> Model) -> ModelFeed {
    let (model_tx, model) = watch::channel(Model::new());
    let (deletes_tx, deletes) = watch::channel(0usize);
    let (reports_tx, reports) = watch::channel(Reports::new());
    tokio::spawn(async move {
        let mut state = ClusterState::new(&[IpFamily::V4, IpFamily::V6], "node-a");
        let (mut deleted, mut all_reports) = (0, Reports::new());
        while let Some(event) = rx.recv().await {
            match event {
                ClusterEvent::Service(change) => {
                    let (record, gone) = change.into_owned();
                    deleted += usize::from(gone);
                    state.service_record(record, gone);
                }
                ClusterEvent::EndpointSlice(change) => {
                    let (record, gone) = change.into_owned();
                    deleted += usize::from(gone);
                    state.slice_record(record);
                }
                _ => {}
            }
            for rejected in state.take_rejected() {
                all_reports.push((
                    rejected.kind,
                    rejected.object_name().to_string(),
                    rejected.reason,
                ));
            }
            state.apply_pending();
            let _ = model_tx.send(render(&state));
            let _ = deletes_tx.send(deleted);
            let _ = reports_tx.send(all_reports.clone());
        }
    });
    ModelFeed {
        model,
        deletes,
        reports,
    }
}

/// Waits up to `limit` until `have` (as `view` shows it) equals `want`; panics with both
/// otherwise.
async fn wait_equal<T, V: PartialEq + Debug>(
    rx: &mut watch::Receiver<T>,
    view: impl Fn(&T) -> V,
    want: &V,
    limit: Duration,
    what: &str,
) {
    let result = tokio::time::timeout(limit, async {
        loop {
            if view(&rx.borrow_and_update()) == *want {
                return;
            }
            if rx.changed().await.is_err() {
                panic!("the consumer stopped");
            }
        }
    })
    .await;
    if result.is_err() {
        panic!("{what}\nwant: {want:#?}\nhave: {:#?}", view(&rx.borrow()));
    }
}

impl ModelFeed {
    /// Waits until the model is `want`.
    pub async fn converged(&mut self, want: &Model, limit: Duration, what: &str) {
        let what = format!("{what}: the model did not converge");
        wait_equal(&mut self.model, Model::clone, want, limit, &what).await;
    }

    /// Waits until the refusals reported, sorted, are `want` (bad objects change no model
    /// entry, so a converged model does not mean they were all seen).
    pub async fn reported(&mut self, want: &Reports, limit: Duration, what: &str) {
        let what = format!("{what}: reports");
        wait_equal(&mut self.reports, sorted, want, limit, &what).await;
    }

    /// The refusals reported so far, sorted.
    pub fn sorted_reports(&self) -> Reports {
        sorted(&self.reports.borrow())
    }
}

fn sorted(reports: &Reports) -> Reports {
    let mut out = reports.clone();
    out.sort();
    out
}
