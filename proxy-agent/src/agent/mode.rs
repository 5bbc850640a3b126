// SPDX-License-Identifier: Apache-2.0
//! Which dataplane runs: the requested mode when this node can run it, otherwise the
//! fallback (ipvs -> iptables, as the seed documents; ebpf -> iptables), logged loudly;
//! `--strict-mode` turns fallback into an exit with the reason.

use tracing::error;

use super::{AgentError, Result, node_facts::NodeFacts};
use crate::config::{ProxyMode, Resolved};

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

/// Why ebpf mode cannot run here, if it cannot.
pub fn ebpf_unavailable(resolved: &Resolved) -> Option<String> {
    if let Some(reason) = crate::ebpf_object::unavailable_reason() {
        return Some(reason.to_string());
    }
    let root = super::bpffs_root(resolved);
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let bpffs_mounted = mounts.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (_, point, fs) = (f.next(), f.next(), f.next());
        fs == Some("bpf") && point.is_some_and(|p| root.starts_with(p))
    });
    if !bpffs_mounted {
        return Some(format!(
            "no BPF filesystem mounted above {}",
            root.display()
        ));
    }
    if crate::proxier::ebpf::loader::detect_cgroup2_root().is_err() {
        return Some("no cgroup v2 hierarchy is mounted".into());
    }
    None
}

/// Why iptables mode cannot run here, if it cannot.
pub fn iptables_unavailable() -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join("iptables-restore").exists()))
        .unwrap_or(false);
    (!found).then(|| "iptables-restore is not installed".to_string())
}

/// Why ipvs mode cannot run here, if it cannot: the kernel must answer the IPVS generic
/// netlink family (asking for it loads the ip_vs module when the kernel has one) and
/// ipset must be able to talk to the kernel.
pub fn ipvs_unavailable() -> Option<String> {
    use crate::proxier::ipvs::{genl::IpvsSocket, ipset::IpsetCommand, ipset::IpsetError};
    if let Err(err) = IpvsSocket::open() {
        return Some(match err.errno() {
            Some(nix::errno::Errno::ENOENT) => "the kernel has no IPVS support (the IPVS generic netlink family is unknown and no ip_vs module could be loaded)".to_string(),
            _ => format!("the kernel's IPVS interface cannot be used: {err}"),
        });
    }
    match IpsetCommand::probe() {
        Ok(_) => None,
        Err(IpsetError::Spawn(_)) => Some("ipset is not installed".to_string()),
        Err(err) => Some(format!("ipset is not usable: {err}")),
    }
}

fn unavailable(mode: ProxyMode, resolved: &Resolved) -> Option<String> {
    match mode {
        ProxyMode::Ebpf => ebpf_unavailable(resolved),
        ProxyMode::Iptables => iptables_unavailable(),
        ProxyMode::Ipvs => ipvs_unavailable().or_else(iptables_unavailable),
        ProxyMode::Nftables => Some("nftables mode is not implemented by this proxy".into()),
    }
}

/// Picks the mode to run.
pub fn choose_mode(
    requested: ProxyMode,
    resolved: &Resolved,
    _facts: &NodeFacts,
) -> Result<ModeChoice> {
    let Some(reason) = unavailable(requested, resolved) else {
        return Ok(ModeChoice {
            requested,
            mode: requested,
            reason: None,
        });
    };
    fallback(requested, reason, resolved.options.strict_mode)
}

/// The fallback for `requested` (which failed for `reason`), or the strict-mode error.
pub fn fallback(requested: ProxyMode, reason: String, strict: bool) -> Result<ModeChoice> {
    if strict {
        return Err(AgentError::ModeUnavailable {
            requested: requested.as_str(),
            reason,
        });
    }
    if let Some(why) = iptables_unavailable() {
        return Err(AgentError::ModeUnavailable {
            requested: requested.as_str(),
            reason: format!("{reason}; and the iptables fallback cannot run either: {why}"),
        });
    }
    error!(
        requested = requested.as_str(),
        fallback = "iptables",
        %reason,
        "PROXY MODE FALLBACK: the requested mode cannot run on this node, running iptables mode instead (use --strict-mode to exit instead)"
    );
    Ok(ModeChoice {
        requested,
        mode: ProxyMode::Iptables,
        reason: Some(reason),
    })
}
