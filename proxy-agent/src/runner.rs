// SPDX-License-Identifier: Apache-2.0
//! Upstream BoundedFrequencyRunner semantics on tokio (to be written).
