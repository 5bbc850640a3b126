// SPDX-License-Identifier: Apache-2.0
pub mod convert;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
