// SPDX-License-Identifier: Apache-2.0
//! What the agent asks of a mode without naming it: whether it can run here (and why
//! not), starting it from one settings value, its fallback, removing what it left on
//! the node, and the operator tools (`inspect`, `trace`) on its live state. Each mode describes itself in one [`ModeEntry`] (its folder's `mode.rs`);
//! [`super::MODES`] lists them and the functions beside it look a mode up there.

use std::{path::PathBuf, time::Duration};

use ipnet::IpNet;

use super::sync::{NodeContext, Proxier};
use crate::{
    config::{KubeProxyConfiguration, ProxyMode, XdpMode},
    inspect::{Output, Subject},
    trace::{TraceRequest, Verdict},
};

/// One mode, as the agent sees it.
pub struct ModeEntry {
    pub mode: ProxyMode,
    /// The mode to run instead when this one cannot run on this node (`None`: none; the
    /// agent exits). `--strict-mode` turns any fallback into an exit.
    pub fallback: Option<ProxyMode>,
    /// Why the mode cannot run on this node, if it cannot.
    pub probe: fn(&HostLayout) -> Option<String>,
    /// Starts the dataplane; the error is the reason, for the fallback's log and event.
    pub start: fn(&ModeSettings<'_>) -> Result<Box<dyn Proxier>, String>,
    /// Removes what the mode installed on the node; `None` when there was nothing to look at
    /// (nothing is logged then).
    pub cleanup: fn(&HostLayout, CleanupScope) -> Option<CleanupReport>,
    /// What of this mode's dataplane, as kube-proxy writes it, is on the node while another
    /// mode of ours runs (`running`), one description each: another proxy programming the
    /// node (kube-proxy come back). The running mode removed all of it after its first
    /// sync, so anything found was written since. Empty when there is none, or nothing
    /// could be looked at.
    pub written_beside: fn(running: ProxyMode) -> Vec<String>,
    /// `inspect` and `trace` on what the mode installed.
    pub tools: ModeTools,
}

/// Renders one `inspect` subject of the mode's live state.
pub type InspectFn = fn(&HostLayout, Subject, Output) -> Result<String, String>;
/// Reads the mode's dataplane for `proxy-agent status`.
pub type StatusFn = fn(&HostLayout) -> Result<crate::status::DataplaneStatus, String>;
/// Follows one connection through the mode's live state.
pub type TraceFn = fn(&HostLayout, &TraceRequest) -> Result<Verdict, String>;

/// The operator tools a mode answers, reading its live state on this node. The errors are
/// the readers' own, as text for the command line.
pub struct ModeTools {
    /// Whether the mode's state is on this node: the tools read the first mode in use that
    /// answers, when the command line names none.
    pub in_use: fn(&HostLayout) -> bool,
    /// The `inspect` subjects the mode answers, and how.
    pub inspect_subjects: &'static [Subject],
    pub inspect: Option<InspectFn>,
    /// What the running dataplane would do with one connection.
    pub trace: Option<TraceFn>,
    /// What `proxy-agent status` shows of the mode's dataplane from the kernel.
    pub status: Option<StatusFn>,
}

impl ModeTools {
    /// A mode without operator tools.
    pub const NONE: Self = Self {
        in_use: |_| false,
        inspect_subjects: &[],
        inspect: None,
        trace: None,
        status: None,
    };
}

/// Where the modes keep their state on this node: what probing and cleaning up need,
/// before (or without) a running agent.
#[derive(Clone, Debug)]
pub struct HostLayout {
    /// The ebpf mode's pin directory.
    pub bpffs_root: PathBuf,
    /// Virtual servers the ipvs mode leaves alone (`ipvs.excludeCIDRs`).
    pub ipvs_exclude: Vec<IpNet>,
}

/// Everything a mode starts from.
#[derive(Clone, Copy, Debug)]
pub struct ModeSettings<'a> {
    /// The validated configuration.
    pub config: &'a KubeProxyConfiguration,
    pub layout: &'a HostLayout,
    pub xdp: XdpMode,
    /// The periodic full sync's interval.
    pub sync_period: Duration,
    /// The node's uplink devices.
    pub devices: &'a [String],
    pub node: &'a NodeContext,
}

/// Which cleanup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupScope {
    /// `--cleanup`: everything the mode ever installed.
    Everything,
    /// Another mode (given; never this one) is starting: what this one left that the
    /// running mode does not reuse, so that switching modes leaves no trace of the
    /// previous one.
    LeftBeside(ProxyMode),
}

/// What one mode's cleanup did.
#[derive(Debug, Default)]
pub struct CleanupReport {
    pub removed: usize,
    pub errors: Vec<String>,
}
