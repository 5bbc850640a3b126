// SPDX-License-Identifier: Apache-2.0
//! Our programs attached outside the pins: tc filters on a clsact qdisc (how tc programs
//! attach on kernels without TCX, before 6.6) and XDP programs attached through netlink
//! (kernels without XDP bpf_links, before 5.9). Removing the pins does not detach these:
//! they would go on translating from maps no agent writes any more. So cleanup, a mode
//! switch and every attach find them on every device of the namespace and remove them.
//!
//! A filter or XDP program is ours by its program's name, whatever attached it and with
//! what priority: the kernel's name of the attached program (prog info of the id the
//! kernel reports, 15 characters at most) or, for filters, the name the attacher gave the
//! filter (aya gives the program's full name). Program names do not change across
//! agent versions or map layouts, so an upgrade finds an earlier agent's filters too.
//! Filters this agent attaches (on kernels without TCX) also carry a fixed priority and
//! handle ([`TC_PRIORITY`], [`TC_HANDLE`]), so that a restart replaces the program inside
//! its filter instead of adding one.
//!
//! The clsact qdisc stays: other software (a CNI, Cilium, tc rules of the operator) may
//! hold filters on it, the qdisc does nothing without filters, and telling whether we
//! created it would need state of our own that outlives the agent.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::proxier::netlink::NetlinkError;
use crate::proxier::netlink::tc::{BpfFilter, ClsactHook, TcSocket};

/// The tc programs (uplink ingress and egress, the pod side's) and the XDP program, by the
/// names the object gives them.
pub const TC_PROGRAMS: &[&str] = &[UPLINK_INGRESS, UPLINK_EGRESS, POD_INGRESS, POD_EGRESS];

/// The tc programs' names in the object (the loader attaches them by these names).
pub(super) const UPLINK_INGRESS: &str = "tc_uplink_ingress";
pub(super) const UPLINK_EGRESS: &str = "tc_uplink_egress";
pub(super) const POD_INGRESS: &str = "tc_pod_ingress";
pub(super) const POD_EGRESS: &str = "tc_pod_egress";
pub const XDP_PROGRAMS: &[&str] = &[super::xdp::PROGRAM];

/// The priority (`pref`) of the tc filters this agent attaches through netlink: fixed, so
/// that a restarted agent replaces its program in place. "KP" in ASCII.
pub const TC_PRIORITY: u16 = 0x4b50;
/// Their handle (one filter per hook and device).
pub const TC_HANDLE: u32 = 0x4b50;

/// The kernel keeps program names to BPF_OBJ_NAME_LEN - 1 = 15 bytes.
const KERNEL_NAME_LEN: usize = 15;

/// Whether a program called `kernel_name` by the kernel (or a filter called
/// `filter_name` by its attacher) is one of `ours`.
pub fn is_ours(kernel_name: Option<&str>, filter_name: Option<&str>, ours: &[&str]) -> bool {
    ours.iter().any(|name| {
        let truncated = &name[..name.len().min(KERNEL_NAME_LEN)];
        kernel_name.is_some_and(|k| !k.is_empty() && k == truncated) || filter_name == Some(*name)
    })
}

/// The kernel's name of every loaded program, by id (empty when the kernel does not
/// let us enumerate: the filters' own names then decide).
fn program_names() -> HashMap<u32, String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|info| Some((info.id(), info.name_as_str()?.to_string())))
        .collect()
}

/// What one sweep removed, and what it could not.
#[derive(Debug, Default)]
pub struct Sweep {
    pub removed: usize,
    pub errors: Vec<String>,
}

/// Which filters a sweep looks at and which it keeps.
#[derive(Clone, Copy, Debug)]
pub struct FilterScope<'a> {
    /// Only this device and hook (None: every device, both hooks).
    pub only: Option<(u32, ClsactHook)>,
    /// Keep the filter with this priority and handle (the one just attached).
    pub keep: Option<(u16, u32)>,
    /// The programs whose filters go.
    pub programs: &'a [&'a str],
}

/// Removes our tc filters (per `scope`) in the caller's network namespace.
pub fn remove_filters(
    socket: &mut TcSocket,
    scope: FilterScope<'_>,
) -> Result<Sweep, NetlinkError> {
    // Read once, and only when a hook holds a BPF filter (most pod devices hold none).
    let mut names: Option<HashMap<u32, String>> = None;
    let targets: Vec<(u32, ClsactHook)> = match scope.only {
        Some(target) => vec![target],
        None => socket
            .links()?
            .iter()
            .flat_map(|link| ClsactHook::BOTH.map(|hook| (link.ifindex, hook)))
            .collect(),
    };
    let mut sweep = Sweep::default();
    for (ifindex, hook) in targets {
        let filters = match socket.bpf_filters(ifindex, hook) {
            Ok(filters) => filters,
            Err(e) => {
                sweep
                    .errors
                    .push(format!("listing tc filters of link {ifindex}: {e}"));
                continue;
            }
        };
        for filter in filters {
            let names = names.get_or_insert_with(program_names);
            if !filter_is_ours(&filter, names, scope.programs)
                || scope.keep == Some((filter.priority, filter.handle))
            {
                continue;
            }
            match socket.delete_filter(&filter) {
                Ok(()) => {
                    debug!(?filter, "tc filter removed");
                    sweep.removed += 1;
                }
                Err(e) => sweep.errors.push(format!(
                    "removing tc filter pref {} handle {:#x} ({}) of link {ifindex}: {e}",
                    filter.priority,
                    filter.handle,
                    hook.as_str()
                )),
            }
        }
    }
    Ok(sweep)
}

/// Our tc filters on every device of the caller's namespace, as (ifindex, hook, program):
/// how the tc programs are attached on kernels without TCX, where no link is pinned.
pub fn our_filters() -> Result<Vec<(u32, ClsactHook, &'static str)>, NetlinkError> {
    let mut socket = TcSocket::open()?;
    let mut names: Option<HashMap<u32, String>> = None;
    let mut out = Vec::new();
    for link in socket.links()? {
        for hook in ClsactHook::BOTH {
            let Ok(filters) = socket.bpf_filters(link.ifindex, hook) else {
                continue;
            };
            for filter in filters {
                let names = names.get_or_insert_with(program_names);
                if let Some(program) = TC_PROGRAMS
                    .iter()
                    .find(|p| filter_is_ours(&filter, names, std::slice::from_ref(*p)))
                {
                    out.push((link.ifindex, hook, *program));
                }
            }
        }
    }
    Ok(out)
}

fn filter_is_ours(filter: &BpfFilter, names: &HashMap<u32, String>, ours: &[&str]) -> bool {
    let kernel_name = filter
        .prog_id
        .and_then(|id| names.get(&id))
        .map(String::as_str);
    is_ours(kernel_name, filter.name.as_deref(), ours)
}

/// Detaches our XDP programs attached through netlink on every device of the caller's
/// namespace. One held by a bpf_link (the kernel refuses, EBUSY) is left to its link:
/// a pinned one goes with the pins, one held by a running agent with that agent.
pub fn remove_xdp(socket: &mut TcSocket) -> Result<Sweep, NetlinkError> {
    let mut names: Option<HashMap<u32, String>> = None;
    let mut sweep = Sweep::default();
    for link in socket.links()? {
        for (prog_id, mode) in &link.programs {
            let names = names.get_or_insert_with(program_names);
            let kernel_name = names.get(prog_id).map(String::as_str);
            if !is_ours(kernel_name, None, XDP_PROGRAMS) {
                continue;
            }
            match socket.detach_xdp(link.ifindex, *mode) {
                Ok(()) => {
                    debug!(device = %link.name, prog_id, "XDP program detached");
                    sweep.removed += 1;
                }
                Err(e)
                    if e.errno() == Some(nix::errno::Errno::EBUSY)
                        && released_by_its_link(socket, link.ifindex, *prog_id) =>
                {
                    debug!(device = %link.name, prog_id, "XDP program went with its link");
                    sweep.removed += 1;
                }
                Err(e) => sweep.errors.push(format!(
                    "detaching XDP program {prog_id} from {}: {e}{}",
                    link.name,
                    if e.errno() == Some(nix::errno::Errno::EBUSY) {
                        " (held by a bpf_link: is another agent running in this namespace?)"
                    } else {
                        ""
                    }
                )),
            }
        }
    }
    Ok(sweep)
}

/// How long an XDP program held by a bpf_link may take to go once its last holder is
/// gone. The kernel frees a link whose pin was just removed (or whose killed agent's fd
/// just closed) from a work queue, after the unlink returns: until then netlink refuses
/// the detach with EBUSY. A link still held by a running agent stays past this.
const LINK_RELEASE_WAIT: Duration = Duration::from_millis(1000);
const LINK_RELEASE_POLL: Duration = Duration::from_millis(20);

/// Whether `prog_id` leaves `ifindex`'s XDP hook within [`LINK_RELEASE_WAIT`].
fn released_by_its_link(socket: &mut TcSocket, ifindex: u32, prog_id: u32) -> bool {
    let deadline = Instant::now() + LINK_RELEASE_WAIT;
    loop {
        let still_attached = match socket.links() {
            Ok(links) => links
                .iter()
                .any(|l| l.ifindex == ifindex && l.programs.iter().any(|(id, _)| *id == prog_id)),
            Err(_) => return false,
        };
        if !still_attached {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(LINK_RELEASE_POLL);
    }
}

/// Everything of ours outside the pins, on every device: for `--cleanup` and a mode
/// switch (after the pins are gone, so that XDP links held only by pins are gone too).
pub fn remove_all() -> Sweep {
    let mut total = Sweep::default();
    let mut socket = match TcSocket::open() {
        Ok(socket) => socket,
        Err(e) => {
            total.errors.push(format!("tc filters and XDP: {e}"));
            return total;
        }
    };
    let everything = FilterScope {
        only: None,
        keep: None,
        programs: TC_PROGRAMS,
    };
    for sweep in [
        remove_filters(&mut socket, everything),
        remove_xdp(&mut socket),
    ] {
        match sweep {
            Ok(sweep) => {
                total.removed += sweep.removed;
                total.errors.extend(sweep.errors);
            }
            Err(e) => total.errors.push(format!("tc filters and XDP: {e}")),
        }
    }
    if total.removed > 0 {
        info!(
            removed = total.removed,
            "tc filters and netlink XDP programs removed"
        );
    }
    total
}

/// Who holds our priority and handle on a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Free,
    /// A filter of one of our programs (an earlier agent's): its program is replaced.
    Ours,
    /// Someone else's filter.
    Taken,
}

/// Who holds [`TC_PRIORITY`] / [`TC_HANDLE`] on `device`'s `hook` (free when it cannot
/// be told: attaching there then fails loudly rather than replacing anything).
pub fn our_slot(device: &str, hook: ClsactHook) -> Slot {
    let Ok(ifindex) = nix::net::if_::if_nametoindex(device) else {
        return Slot::Free;
    };
    let filters = match TcSocket::open().and_then(|mut socket| socket.bpf_filters(ifindex, hook)) {
        Ok(filters) => filters,
        Err(e) => {
            warn!(%device, error = %e, "listing tc filters");
            return Slot::Free;
        }
    };
    let Some(filter) = filters
        .iter()
        .find(|f| (f.priority, f.handle) == (TC_PRIORITY, TC_HANDLE))
    else {
        return Slot::Free;
    };
    if filter_is_ours(filter, &program_names(), TC_PROGRAMS) {
        Slot::Ours
    } else {
        Slot::Taken
    }
}

/// After attaching `program` on `device`'s `hook`: removes the other filters of that
/// program there (an earlier agent's, attached with another priority, or through
/// netlink before this kernel had TCX). `keep`: the filter just attached, if netlink.
pub fn remove_stale_filters(
    device: &str,
    hook: ClsactHook,
    program: &'static str,
    keep: Option<(u16, u32)>,
) {
    let ifindex = match nix::net::if_::if_nametoindex(device) {
        Ok(index) => index,
        Err(e) => {
            warn!(%device, error = %e, "looking for stale tc filters");
            return;
        }
    };
    let scope = FilterScope {
        only: Some((ifindex, hook)),
        keep,
        programs: std::slice::from_ref(&program),
    };
    match TcSocket::open().and_then(|mut socket| remove_filters(&mut socket, scope)) {
        Ok(sweep) => {
            if sweep.removed > 0 {
                info!(%device, hook = hook.as_str(), program, removed = sweep.removed, "stale tc filters of an earlier agent removed");
            }
            for e in sweep.errors {
                warn!(%device, error = %e, "removing a stale tc filter");
            }
        }
        Err(e) => warn!(%device, error = %e, "looking for stale tc filters"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ours_by_the_kernels_truncated_name_or_the_filters_name() {
        assert!(is_ours(Some("tc_uplink_ingre"), None, TC_PROGRAMS));
        assert!(is_ours(Some("tc_pod_ingress"), None, TC_PROGRAMS));
        assert!(is_ours(None, Some("tc_uplink_egress"), TC_PROGRAMS));
        assert!(is_ours(Some("xdp_uplink"), None, XDP_PROGRAMS));
        // Someone else's, or an empty name (a kernel without program names).
        assert!(!is_ours(
            Some("cil_from_netdev"),
            Some("bpf_netdev.o:[from-netdev]"),
            TC_PROGRAMS
        ));
        assert!(!is_ours(Some(""), None, TC_PROGRAMS));
        assert!(!is_ours(None, Some("tc_uplink_ingre"), TC_PROGRAMS));
        assert!(!is_ours(Some("xdp_uplink"), None, TC_PROGRAMS));
    }
}
