// SPDX-License-Identifier: Apache-2.0
//! Where cluster objects come from: the API server (see [`crate::k8s::watch`]) or, with
//! `--source DIR`, manifests in a directory ([`dir`]). Both produce the same
//! [`crate::k8s::watch::ClusterEvent`]s.

pub mod dir;
