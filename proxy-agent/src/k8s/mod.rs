// SPDX-License-Identifier: Apache-2.0
//! The Kubernetes side: the API client and watchers, conversion to the model.

pub mod client;
pub mod client_metrics;
pub mod convert;
pub mod events;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
mod rate_limit;
pub mod tombstone;
pub mod watch;
