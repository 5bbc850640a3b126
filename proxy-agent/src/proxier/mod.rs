// SPDX-License-Identifier: Apache-2.0
//! Dataplanes. Each mode has a folder; what they share lives here once.

pub mod ebpf;
