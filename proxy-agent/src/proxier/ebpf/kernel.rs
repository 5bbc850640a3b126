// SPDX-License-Identifier: Apache-2.0
//! What the running kernel offers the ebpf mode: the start-up check of each part (socket
//! load balancing, north-south tc programs, their maps, XDP acceleration) and how tc and
//! XDP attach. The parts are probed the way libbpf does (aya's feature probes load a
//! minimal program of the type calling each helper our programs call, and make a map of
//! each type), so a distribution kernel with backports passes where its version number
//! would not; only what cannot be probed without attaching (the getpeername hooks) and
//! the attach methods go by version. docs/kernel-requirements.md lists the versions.

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
    util::KernelVersion,
};
use tracing::debug;

/// The running kernel's version, `None` when it cannot be read.
pub fn version() -> Option<KernelVersion> {
    KernelVersion::current().ok()
}

fn at_least(major: u8, minor: u8) -> bool {
    version().is_some_and(|v| v >= KernelVersion::new(major, minor, 0))
}

/// Whether tc programs attach as TCX links (6.6+), by the same rule aya's
/// `SchedClassifier::attach` follows; otherwise they are netlink filters.
pub fn has_tcx() -> bool {
    at_least(6, 6)
}

/// Whether XDP programs attach as bpf_links (5.9+), which the pins hold; aya attaches
/// through netlink otherwise, and such a program outlives the pins.
pub fn has_xdp_links() -> bool {
    at_least(5, 9)
}

/// A helper one of our programs calls, with the kernel that brought it (for the message).
struct Helper {
    id: BpfHelper,
    name: &'static str,
    since: &'static str,
}

const fn helper(id: BpfHelper, name: &'static str, since: &'static str) -> Helper {
    Helper { id, name, since }
}

/// One part of the mode: its program type and the helpers its programs call.
struct Part {
    what: &'static str,
    program: ProgramType,
    program_name: &'static str,
    helpers: &'static [Helper],
}

const SOCKET_LB: Part = Part {
    what: "socket load balancing (cgroup sock_addr programs)",
    program: ProgramType::CgroupSockAddr,
    program_name: "cgroup sock_addr (4.17)",
    helpers: &[
        helper(
            BpfHelper::BPF_FUNC_get_socket_cookie,
            "bpf_get_socket_cookie",
            "5.7",
        ),
        helper(
            BpfHelper::BPF_FUNC_get_netns_cookie,
            "bpf_get_netns_cookie",
            "5.7",
        ),
        helper(
            BpfHelper::BPF_FUNC_ktime_get_coarse_ns,
            "bpf_ktime_get_coarse_ns",
            "5.11",
        ),
        helper(BpfHelper::BPF_FUNC_set_retval, "bpf_set_retval", "5.18"),
    ],
};

const NORTH_SOUTH: Part = Part {
    what: "north-south traffic (tc programs)",
    program: ProgramType::SchedClassifier,
    program_name: "sched_cls",
    helpers: &[
        helper(BpfHelper::BPF_FUNC_csum_diff, "bpf_csum_diff", "4.6"),
        helper(BpfHelper::BPF_FUNC_fib_lookup, "bpf_fib_lookup", "4.18"),
        helper(
            BpfHelper::BPF_FUNC_redirect_neigh,
            "bpf_redirect_neigh",
            "5.10",
        ),
        helper(
            BpfHelper::BPF_FUNC_ktime_get_coarse_ns,
            "bpf_ktime_get_coarse_ns",
            "5.11",
        ),
    ],
};

const XDP: Part = Part {
    what: "XDP acceleration",
    program: ProgramType::Xdp,
    program_name: "xdp",
    helpers: &[
        helper(BpfHelper::BPF_FUNC_fib_lookup, "bpf_fib_lookup", "4.18"),
        helper(
            BpfHelper::BPF_FUNC_ktime_get_coarse_ns,
            "bpf_ktime_get_coarse_ns",
            "5.11",
        ),
    ],
};

/// The map types the object declares.
const MAPS: &[(MapType, &str, &str)] = &[
    (MapType::Hash, "hash", "3.19"),
    (MapType::Array, "array", "3.19"),
    (MapType::PerCpuArray, "percpu array", "4.6"),
    (MapType::LruHash, "LRU hash", "4.10"),
    (MapType::LpmTrie, "LPM trie", "4.11"),
];

/// Why `part` cannot run here, if a probe says so. A probe that fails for another
/// reason (no privilege to load, a kernel answering oddly) proves nothing: loading the
/// programs is the final word, and its error names the program.
fn part_missing(part: &Part) -> Option<String> {
    match is_program_supported(part.program) {
        Ok(false) => {
            return Some(format!(
                "{}: the kernel has no {} programs",
                part.what, part.program_name
            ));
        }
        Err(e) => {
            debug!(part = part.what, error = %e, "program type probe inconclusive");
            return None;
        }
        Ok(true) => {}
    }
    let missing: Vec<String> = part
        .helpers
        .iter()
        .filter(|h| match is_helper_supported(part.program, h.id) {
            Ok(supported) => !supported,
            Err(e) => {
                debug!(part = part.what, helper = h.name, error = %e, "helper probe inconclusive");
                false
            }
        })
        .map(|h| format!("{} ({}+)", h.name, h.since))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{}: the kernel lacks the BPF helper(s) {} for {} programs",
            part.what,
            missing.join(", "),
            part.program_name
        )
    })
}

/// Why the parts ebpf mode cannot do without (socket load balancing, tc, the maps)
/// cannot run on this kernel, if they cannot: one reason per part, joined.
pub fn required_parts_missing() -> Option<String> {
    let mut reasons: Vec<String> = [&SOCKET_LB, &NORTH_SOUTH]
        .into_iter()
        .filter_map(part_missing)
        .collect();
    // The sock_addr hooks cannot be probed without attaching; getpeername came last.
    if version().is_some_and(|v| v < KernelVersion::new(5, 8, 0)) {
        reasons.push(
            "socket load balancing: the getpeername4/6 cgroup hooks and cgroup bpf_links need kernel 5.8+"
                .into(),
        );
    }
    let maps: Vec<String> = MAPS
        .iter()
        .filter(|(map, _, _)| matches!(is_map_supported(*map), Ok(false)))
        .map(|(_, name, since)| format!("{name} ({since}+)"))
        .collect();
    if !maps.is_empty() {
        reasons.push(format!(
            "the maps: the kernel has no {} maps",
            maps.join(", ")
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Why XDP acceleration cannot run on this kernel, if it cannot (tc then carries the
/// uplinks' traffic alone).
pub fn xdp_missing() -> Option<String> {
    if version().is_some() && !has_xdp_links() {
        return Some(
            "XDP acceleration: it needs XDP bpf_links (kernel 5.9+), which the pins hold".into(),
        );
    }
    part_missing(&XDP)
}

/// How tc programs attach on this kernel, for the start-up log.
pub fn tc_attach_method() -> &'static str {
    if has_tcx() {
        "TCX links, pinned"
    } else {
        "netlink filters on a clsact qdisc (no TCX before kernel 6.6)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kernel (newer than any minimum here) has every part; without the
    /// privilege to load programs the probes are inconclusive and say nothing either.
    #[test]
    fn this_kernel_has_every_part() {
        assert_eq!(required_parts_missing(), None);
        assert_eq!(xdp_missing(), None);
    }
}
