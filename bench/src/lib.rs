// SPDX-License-Identifier: Apache-2.0
//! Benchmarks of the dataplane, run in network namespaces like the scenario runner.
//!
//! `clusterip`: connections per second (connect, 1-byte request, 1-byte reply, close) and
//! connect() latency through a ClusterIP translated by the socket programs, against the same
//! client connecting straight to the backend, with 1 and many services in the maps. The
//! load generator ([`load`]) runs as the `loadgen` binary inside the namespaces; the
//! orchestration ([`clusterip`]) needs root and a release build of the agent with its eBPF
//! object (`cargo xtask bench clusterip` builds both).
//!
//! `nodeport`: UDP packets per second and TCP connection rate from an external client
//! through a NodePort (tc, XDP generic, XDP native on the uplink) against the same client
//! reaching the backend directly, for a local and a remote backend; built on the scenario
//! runner's topology ([`udp`] is its UDP load).
//!
//! `sync`: how long a proxier takes to program N services (a cold full sync) and to apply
//! a one-service change, against the raw tool that puts the same rules in the kernel
//! (iptables mode: `iptables-restore` of the same text), in fresh network namespaces.
//!
//! `dataplane`: connection rate, connect() latency, request/response latency and
//! throughput through each way of implementing N services (our agent's ebpf and iptables
//! modes, upstream-shaped iptables and nftables rules) against a direct connection.
//!
//! `shaped`: rules shaped like upstream kube-proxy's (iptables and nftables modes) for the
//! baselines that load them with the raw tools.
//!
//! `bpf`: the cost per call of each of the agent's programs (BPF run-time statistics)
//! with 1 and many services, and the cost per element of single against batched service
//! map updates.
//!
//! `memory`: the agent's resident memory and its BPF maps' memory with N services of 4
//! endpoints (ebpf mode; iptables mode with the legacy iptables).
//!
//! [`suites`]: the report's suites one after the other, their rows published for the
//! report (`cargo xtask bench` launches it, then regenerates the report).
//!
//! `latency`: how long after a change reaches the API server a connection through the new
//! frontend first succeeds (the analogue of `network_programming_duration`).
//!
//! Pure parts (statistics, manifests, results, CSV, the bpftool parser, names) are
//! unit-tested without privileges; [`net`], [`agent`] and [`clusterip`] need root.
//!
//! The namespaces, the agent's configuration and readiness, and the test API server come
//! from the scenario harness of the `tests` crate, always named `::tests` here: a module's
//! own `mod tests` would shadow a plain `tests::`.

pub mod agent;
pub mod bpf;
pub mod client;
pub mod clusterip;
pub mod cpustat;
pub mod dataplane;
pub mod error;
pub mod latency;
pub mod load;
pub mod manifests;
pub mod maps;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod nodeport;
#[cfg(test)]
pub mod quick;
pub mod report;
pub mod results;
pub mod rows;
pub mod shaped;
pub mod signals;
pub mod stats;
pub mod suites;
pub mod sync;
pub mod udp;

pub use self::{
    clusterip::{BenchOptions, run_clusterip},
    error::{Error, Result},
    results::BenchResults,
};
