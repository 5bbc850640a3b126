// SPDX-License-Identifier: Apache-2.0
//! The behaviour-scenario runner (shared/scenarios/README.md): replays scenario files
//! with real packets through network namespaces, once per dataplane mode, and
//! reports every flow.
//!
//! Pure parts (parsing, placement, outcome classification, readiness, reports, agent
//! configuration) are unit-tested without privileges; [`topology`], [`agent`] and
//! [`run`] need root.
//!
//! ```text
//! cargo build -p proxy-agent -p tests --bin scenario-runner --bin proxy-agent
//! sudo target/debug/scenario-runner run --mode iptables [--filter a1-] [--dir DIR]...
//! sudo target/debug/scenario-runner run --mode ebpf --no-agent      # no proxy at all
//! sudo target/debug/scenario-runner cleanup-stale                   # after a crash
//! ```
//!
//! Layout of one run (names carry a per-run id `kpt<4 hex>`): a node namespace whose
//! `eth0` holds the node addresses and plugs into a switch (`-lan`, a bridge) shared
//! with an external namespace (`ext0`, the router, the external clients, plain
//! listeners for untranslated destinations) and one namespace per remote node (`-r<n>`,
//! for endpoints whose `nodeName` is only ever another node); one namespace per pod
//! behind a routed veth (`kp<n>` on its node, gateway 169.254.1.1 by proxy ARP); the
//! node routes a remote pod through its node's address, so that traffic leaves through
//! the uplink; a cgroup holding the agent, node clients and the node's pods.

pub mod addr;
pub mod agent;
pub mod ci_files;
pub mod cluster;
pub mod conformance;
pub mod echo;
pub mod error;
pub mod format;
pub mod fuzz;
pub mod http;
pub mod ipvs_check;
/// The namespaces, cgroups and commands the harness builds nodes with (its own crate, shared
/// with the demo).
pub use netns_scaffold as netns;
pub mod objects;
pub mod outcome;
pub mod placement;
pub mod probe;
pub mod readiness;
pub mod real_api;
pub mod report;
pub mod run;
pub mod stale;
pub mod topology;
pub mod trace;
pub mod upstream_outcomes;

pub use self::{
    error::{Error, Result},
    format::{Expectation, Flow, Mode, Proto, Scenario},
    report::{FlowReport, Status, Totals},
    run::{RunOptions, ScenarioEnv, run_scenario},
};
