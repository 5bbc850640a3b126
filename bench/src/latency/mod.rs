// SPDX-License-Identifier: Apache-2.0
//! The programming-latency benchmark, the analogue of kube-proxy's
//! `network_programming_duration`: the time from a change reaching the API server to the
//! first connection through the new frontend that the backend answers.
//!
//! The agent runs in the node namespace and cgroup (`BenchNet`), connected to the test
//! API server (served from this process, bound inside the node namespace) that holds
//! `services` filler services of 4 endpoints before the agent starts. Once it has synced
//! them, changes are written into the API server's store at a fixed rate, each a new
//! Service (fresh ClusterIP, port 80) and its EndpointSlice whose endpoint is the real
//! backend (`loadgen serve` in the server namespace); t0 is when the store accepted the
//! Service (the watch events are queued to the agent's watches in the same step). The
//! prober ([`prober`], in the client pod) connects to every new frontend each millisecond
//! until the backend echoes its byte (t1). A change not programmed within the bound counts
//! as failed. A never-created control frontend is probed throughout: any answer there
//! would be a false success.
//!
//! A connect the agent has not translated must fail fast, or a probe started just before
//! the programming would hide it behind a SYN that nothing answers: the ClusterIP range
//! is routed `unreachable` where the untranslated packet would first be routed (the
//! client namespace in ebpf mode, whose socket programs translate before routing; the
//! node namespace in iptables mode, whose DNAT happens there, with ICMP rate limits off).
//!
//! `LATENCY_KEEP_AGENT_LOG=FILE` copies the agent's log there before the cleanup.

mod node;
pub mod objects;
mod options;
pub mod prober;
pub mod results;
mod run;

pub use self::{
    options::{LatencyMode, LatencyOptions},
    results::LatencyResults,
    run::run_latency,
};
