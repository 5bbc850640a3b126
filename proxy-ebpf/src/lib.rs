// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! Library target: empty. It exists so that the agent can build-depend on this crate and be
//! rebuilt when it changes; the programs are in the binary target (src/main.rs).
#![no_std]
