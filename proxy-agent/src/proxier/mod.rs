// SPDX-License-Identifier: Apache-2.0
//! Dataplanes. Each mode has a folder and one registration line in [`MODES`]; what they
//! share lives once in `sync` (the inputs and report of a sync, the [`Proxier`] trait) and
//! in `registry` (how the agent probes, starts and cleans up a mode without naming it).
//!
//! Adding a mode: a folder with the proxier and a `mode.rs` holding its
//! [`ModeEntry`] (probe, start, cleanup, fallback), then one line in [`MODES`].

pub mod conntrack;
pub mod ebpf;
pub mod iptables;
pub mod ipvs;
pub mod netfilter;
pub mod netlink;
pub mod nftables;
mod registry;
mod sync;

pub use self::ebpf::SocketSweepUnsupported;
pub use self::{
    registry::{CleanupReport, CleanupScope, HostLayout, ModeEntry, ModeSettings, ModeTools},
    sync::{
        ConntrackReconcile, FamilyReport, FullMap, LOCALHOST_NODEPORTS_GATE, MapGrowth, MapUsage,
        NodeContext, Proxier, RestoreFailure, SocketSweep, SyncError, SyncRequest, SyncStats,
        TableRules, loopback_nodeport_families, resolve_nodeport_addresses,
    },
};
/// The inputs of a sync, which the model owns.
pub use crate::model::{FamilyState, StaleConntrack};
use crate::{
    config::{KubeProxyConfiguration, ProxyMode},
    inspect::Subject,
};

/// Every mode this agent runs, one line each. The order is the order `--cleanup` and a
/// starting mode remove what the others left: ebpf, nftables (its own tables, nothing
/// shared), then ipvs (its sets can only go once no rule refers to them, and it removes
/// its own rules), then iptables; and the order the operator tools look for a mode in use
/// (iptables, which always answers, last).
pub static MODES: &[&ModeEntry] = &[
    &ebpf::mode::MODE,
    &nftables::mode::MODE,
    &ipvs::mode::MODE,
    &iptables::mode::MODE,
];

impl HostLayout {
    pub fn from_config(config: &KubeProxyConfiguration) -> Self {
        Self {
            bpffs_root: ebpf::pins::bpffs_root(&config.ebpf.bpffs_root),
            ipvs_exclude: ipvs::ipvs_config(config).exclude_cidrs,
        }
    }

    /// The defaults' layout, when there is no usable configuration (the operator tools
    /// still run).
    pub fn from_defaults() -> Self {
        Self::from_config(&KubeProxyConfiguration::default())
    }
}

/// The mode whose live state an operator tool reads: the one named, else the first
/// (in [`MODES`]' order) that offers the tool and whose state is on this node, else the
/// last that offers it. `offers` says whether a mode answers.
pub fn tool_mode(
    named: Option<ProxyMode>,
    layout: &HostLayout,
    offers: impl Fn(&ModeTools) -> bool,
) -> Result<&'static ModeEntry, String> {
    let offering = || MODES.iter().copied().filter(|e| offers(&e.tools));
    match named {
        Some(mode) => offering()
            .find(|e| e.mode == mode)
            .ok_or_else(|| format!("{} mode does not answer this", mode.as_str())),
        None => offering()
            .find(|e| (e.tools.in_use)(layout))
            .or_else(|| offering().last())
            .ok_or_else(|| "no mode answers this".to_string()),
    }
}

/// Whether a mode's tools answer `inspect subject`.
pub fn inspects(tools: &ModeTools, subject: Subject) -> bool {
    tools.inspect.is_some() && tools.inspect_subjects.contains(&subject)
}

/// The registration of `mode`, if this agent runs it.
pub fn entry(mode: ProxyMode) -> Option<&'static ModeEntry> {
    MODES.iter().copied().find(|e| e.mode == mode)
}

/// Whether this agent runs `mode` (configuration validation refuses the others).
pub fn is_registered(mode: ProxyMode) -> bool {
    entry(mode).is_some()
}

/// Why `mode` cannot run on this node, if it cannot.
pub fn unavailable(mode: ProxyMode, layout: &HostLayout) -> Option<String> {
    match entry(mode) {
        Some(e) => (e.probe)(layout),
        None => Some(format!(
            "{} mode is not implemented by this proxy",
            mode.as_str()
        )),
    }
}

/// Starts `mode`.
pub fn start(mode: ProxyMode, settings: &ModeSettings<'_>) -> Result<Box<dyn Proxier>, String> {
    match entry(mode) {
        Some(e) => (e.start)(settings),
        None => Err(format!(
            "{} mode is not available in this build yet",
            mode.as_str()
        )),
    }
}

/// The mode to run when `mode` cannot.
pub fn fallback_of(mode: ProxyMode) -> Option<ProxyMode> {
    entry(mode).and_then(|e| e.fallback)
}
