// SPDX-License-Identifier: Apache-2.0
//! Upstream's control plane as a test fixture: etcd, kube-apiserver and
//! kube-controller-manager v1.37, built from published Go modules by `k8s/` (never
//! vendored, never committed as binaries), started with a CA of the run and RBAC on,
//! reached through kubeconfigs per identity, faulted (API server restarts, etcd
//! compaction) and stopped without leaving a process or a file behind.
//!
//! Used by the agent's integration tests, the scenario runner's `--api real`, the demo
//! and the benchmarks. The home-made test API server of the `tests` crate stays for the
//! faults a real server cannot be made to show.

pub mod binaries;
pub mod control_plane;
pub mod error;
pub mod kubeconfig;
pub mod objects;
pub mod pki;
pub mod process;
pub mod relay;

pub use self::{
    binaries::Binaries,
    control_plane::{ControlPlane, Options, SHARED_ENV, State},
    pki::Identity,
};
