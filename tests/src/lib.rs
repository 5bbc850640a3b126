// SPDX-License-Identifier: Apache-2.0
//! Test support: the list/watch test API server, fixtures, privileged-test helpers.
// Unsafe only where a measurement needs a syscall std and nix do not offer (each such
// module allows it and says why).
#![deny(unsafe_code)]

pub mod apiserver;
pub mod model_feed;
pub mod multinode;
pub mod node_harness;
pub mod privileged;
pub mod python_backend;
pub mod scenario;
