// SPDX-License-Identifier: Apache-2.0
//! proxy-agent: a Kubernetes service proxy with kube-proxy's behaviour and an eBPF fast path.
//!
//! Three stages, one direction: cluster objects ([`k8s`], [`source`]) -> a pure model
//! ([`model`]) -> per-mode desired state and apply ([`proxier`]). Only the apply half of a
//! proxier touches the kernel.
// Unsafe code is denied everywhere but in `sys`, the few system calls no safe wrapper covers.
#![deny(unsafe_code)]

pub mod agent;
pub mod cleanup;
pub mod config;
pub mod ebpf_object;
pub mod fuzz;
pub mod inspect;
pub mod k8s;
pub mod model;
pub mod node;
pub mod parallel;
pub mod proxier;
pub mod runner;
pub mod serve;
pub mod sorted;
pub mod source;
pub mod status;
pub mod sys;
pub mod telemetry;
pub mod tools;
pub mod trace;
