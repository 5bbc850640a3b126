// SPDX-License-Identifier: Apache-2.0
//! The ebpf dataplane: socket-level load balancing (cgroup sock_addr programs) for traffic
//! from this node and tc programs for traffic from outside, over Cilium-style maps.

pub mod apply;
pub mod desired;
pub mod entries;
pub mod ids;
pub mod loader;
pub mod maps;

#[cfg(test)]
mod apply_tests;
