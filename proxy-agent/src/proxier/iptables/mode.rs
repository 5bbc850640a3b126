// SPDX-License-Identifier: Apache-2.0
//! The iptables mode's registration: whether it can run here, how it starts, what it
//! leaves. It is the fallback of the other modes, so it has none itself.

use super::{IptablesConfig, IptablesProxier, trace};
use crate::{
    config::ProxyMode,
    inspect::Subject,
    node::ProcSysctl,
    proxier::{
        CleanupReport, CleanupScope, HostLayout, ModeEntry, ModeSettings, ModeTools, Proxier,
        netfilter,
    },
};

pub static MODE: ModeEntry = ModeEntry {
    mode: ProxyMode::Iptables,
    fallback: None,
    probe: |_| unavailable(),
    start,
    cleanup,
    written_beside,
    // iptables-save is always there to read, and iptables is tried last: it answers
    // whatever wrote the rules when no other mode's state is found.
    tools: ModeTools {
        in_use: |_| true,
        inspect_subjects: &[Subject::Rules],
        inspect: Some(netfilter::inspect::inspect_live),
        trace: Some(trace::trace_live),
        status: None,
    },
};

/// Why iptables mode cannot run here, if it cannot (the ipvs mode needs it too).
pub fn unavailable() -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join("iptables-restore").exists()))
        .unwrap_or(false);
    (!found).then(|| "iptables-restore is not installed".to_string())
}

fn start(settings: &ModeSettings<'_>) -> Result<Box<dyn Proxier>, String> {
    let config = IptablesConfig {
        sync_period: settings.sync_period,
    };
    let proxier = IptablesProxier::new(config, settings.node, &mut ProcSysctl::default())
        .map_err(|e| e.to_string())?;
    Ok(Box::new(proxier))
}

/// kube-proxy's iptables mode on the node: its KUBE-SERVICES chain in the nat table of
/// either family (the kubelet's own KUBE-* chains are not kube-proxy's). Beside our ipvs
/// mode, which writes KUBE-SERVICES itself, nothing is looked at.
fn written_beside(running: ProxyMode) -> Vec<String> {
    use crate::proxier::netfilter::exec::{CommandBackend, IptablesBackend as _};
    if running == ProxyMode::Ipvs {
        return Vec::new();
    }
    let Ok(mut backend) = CommandBackend::detect() else {
        return Vec::new();
    };
    use crate::model::IpFamily;
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|family| {
            matches!(
                backend.list_chain(*family, netfilter::Table::Nat, "KUBE-SERVICES"),
                Ok(Some(_))
            )
        })
        .map(|family| format!("iptables chain KUBE-SERVICES ({family})"))
        .collect()
}

/// Removes the chains and jump rules (both families). Beside the ipvs mode, only the
/// chains ipvs does not share go (its first sync rewrites the shared ones).
fn cleanup(_: &HostLayout, scope: CleanupScope) -> Option<CleanupReport> {
    let result = match scope {
        CleanupScope::LeftBeside(ProxyMode::Ipvs) => super::cleanup_iptables_only_chains(),
        CleanupScope::Everything | CleanupScope::LeftBeside(_) => super::cleanup_leftovers(),
    };
    let mut report = CleanupReport::default();
    match result {
        Ok(r) => report.removed += r.chains_deleted + r.rules_deleted,
        Err(e) => report.errors.push(format!("iptables: {e}")),
    }
    Some(report)
}
