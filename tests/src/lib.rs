// SPDX-License-Identifier: Apache-2.0
//! Test support: the list/watch test API server and fixtures.
#![forbid(unsafe_code)]

pub mod scenario;
