// SPDX-License-Identifier: Apache-2.0
//! Every #[test]-based integration test that needs root (network namespaces, BPF programs,
//! iptables, the real agent): one test target, so that `.config/nextest.toml` runs them one
//! at a time by selecting `binary(privileged)` instead of a hand-kept list of binaries. Each
//! module was a test binary of its own; a test is named by its module path
//! (`northsouth::...`, `bpf_test_run::...`). Without root, each test skips with the reason.
//!
//! The libtest-mimic harnesses (scenarios, vm_guest) and the two long runs with their own
//! time limits (soak, ipvs_fallback: the qemu guest) stay targets of their own.

mod agent_restart;
mod api_outage;
mod bpf_test_run;
mod clients;
mod drift_repair;
mod ebpf_cleanup;
mod ebpf_connected_udp;
mod ebpf_counters;
mod ebpf_mesh;
mod ebpf_socket_lb;
mod ebpf_xdp_attach;
mod full_maps;
mod handover;
mod inspect_trace;
mod iptables_backend;
mod iptables_proxier;
mod layout_upgrade;
mod least_privilege;
mod map_growth;
mod map_reads;
mod metrics_endpoint;
mod mode_switch_cleanup;
mod multinode;
mod nftables_fallback;
mod node_events;
mod northsouth;
mod operator_settings;
mod real_apiserver;
mod scenario_runner;
mod watch_model;
