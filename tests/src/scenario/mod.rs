// SPDX-License-Identifier: Apache-2.0
//! The behaviour-scenario runner (shared/scenarios/README.md): replays scenario files
//! with real packets through network namespaces, once per dataplane mode, and
//! reports every flow.
//!
//! Pure parts (parsing, placement, outcome classification, reports, agent
//! configuration) are unit-tested without privileges; [`topology`], [`agent`] and
//! [`run`] need root.

pub mod addr;
pub mod agent;
pub mod cluster;
pub mod echo;
pub mod error;
pub mod format;
pub mod http;
pub mod netns;
pub mod objects;
pub mod outcome;
pub mod placement;
pub mod probe;
pub mod readiness;
pub mod report;
pub mod run;
pub mod stale;
pub mod topology;

pub use self::{
    error::{Error, Result},
    format::{Expectation, Flow, Mode, Proto, Scenario},
    report::{FlowReport, Status, Totals},
    run::{RunOptions, run_scenario},
};
