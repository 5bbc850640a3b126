// SPDX-License-Identifier: Apache-2.0
//! Which dataplane runs: the requested mode when this node can run it, otherwise its
//! fallback (ipvs -> iptables, as the seed documents; ebpf -> iptables), logged loudly;
//! `--strict-mode` turns fallback into an exit with the reason. What can run and what
//! falls back to what is the mode registry's ([`crate::proxier::MODES`]).

use tracing::error;

use super::error::{AgentError, Result};
use crate::{
    config::{ProxyMode, Resolved},
    proxier::{self, HostLayout},
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeChoice {
    pub requested: ProxyMode,
    pub mode: ProxyMode,
    /// Why the requested mode could not run, when it could not.
    pub reason: Option<String>,
}

impl ModeChoice {
    pub fn fell_back(&self) -> bool {
        self.requested != self.mode
    }
}

/// Picks the mode to run.
pub fn choose_mode(requested: ProxyMode, resolved: &Resolved) -> Result<ModeChoice> {
    let layout = HostLayout::from_config(&resolved.config);
    let Some(reason) = proxier::unavailable(requested, &layout) else {
        return Ok(ModeChoice {
            requested,
            mode: requested,
            reason: None,
        });
    };
    fallback(requested, reason, resolved.options.strict_mode, &layout)
}

/// The fallback for `requested` (which failed for `reason`), or the strict-mode error.
pub fn fallback(
    requested: ProxyMode,
    reason: String,
    strict: bool,
    layout: &HostLayout,
) -> Result<ModeChoice> {
    let unavailable = |reason| AgentError::ModeUnavailable {
        requested: requested.as_str(),
        reason,
    };
    if strict {
        return Err(unavailable(reason));
    }
    let Some(target) = proxier::fallback_of(requested) else {
        return Err(unavailable(reason));
    };
    if let Some(why) = proxier::unavailable(target, layout) {
        return Err(unavailable(format!(
            "{reason}; and the {} fallback cannot run either: {why}",
            target.as_str()
        )));
    }
    error!(
        requested = requested.as_str(),
        fallback = target.as_str(),
        %reason,
        "PROXY MODE FALLBACK: the requested mode cannot run on this node, running {} mode instead (use --strict-mode to exit instead)",
        target.as_str()
    );
    Ok(ModeChoice {
        requested,
        mode: target,
        reason: Some(reason),
    })
}
