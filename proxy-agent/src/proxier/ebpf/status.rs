// SPDX-License-Identifier: Apache-2.0
//! ebpf mode's part of `proxy-agent status`, read from the kernel: which programs are
//! attached where (the pinned links, named `<program>` for the socket programs and
//! `<program>_<device>` for the others; on kernels without TCX the tc filters, which no
//! pin holds), and the programs' own drop and reject counters.

use std::path::Path;

use super::{attached, counters, pins::links_dir};
use crate::{
    proxier::HostLayout,
    status::{AttachedProgram, Counter, DataplaneStatus},
};

/// Every program the object holds, by the names the links are pinned under.
fn known_programs() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = super::loader::SOCK_PROGRAMS.to_vec();
    all.extend_from_slice(attached::TC_PROGRAMS);
    all.extend_from_slice(attached::XDP_PROGRAMS);
    all
}

/// The program and place a pinned link's file name stands for.
fn parse_link_name(name: &str) -> Option<(&'static str, String)> {
    let programs = known_programs();
    if let Some(program) = programs.iter().find(|p| **p == name) {
        return Some((program, "cgroup".into()));
    }
    // The longest name first: `tc_pod_ingress_x` must not be read as another program's.
    let mut by_length = programs;
    by_length.sort_by_key(|p| std::cmp::Reverse(p.len()));
    by_length.into_iter().find_map(|p| {
        let device = name.strip_prefix(p)?.strip_prefix('_')?;
        (!device.is_empty()).then(|| (p, device.to_string()))
    })
}

fn pinned_programs(bpffs_root: &Path) -> Vec<AttachedProgram> {
    let mut out: Vec<AttachedProgram> = std::fs::read_dir(links_dir(bpffs_root))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let (program, attached_to) = parse_link_name(&name)?;
            Some(AttachedProgram {
                program: program.to_string(),
                attached_to,
                how: "link",
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.program, &a.attached_to).cmp(&(&b.program, &b.attached_to)));
    out
}

fn filter_programs() -> Vec<AttachedProgram> {
    let Ok(filters) = attached::our_filters() else {
        return Vec::new();
    };
    filters
        .into_iter()
        .map(|(ifindex, _, program)| AttachedProgram {
            program: program.to_string(),
            attached_to: nix::net::if_::if_indextoname(ifindex)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("ifindex {ifindex}")),
            how: "filter",
        })
        .collect()
}

/// The registry's status reader.
pub fn status_live(layout: &HostLayout) -> Result<DataplaneStatus, String> {
    let mut programs = pinned_programs(&layout.bpffs_root);
    if !super::kernel::has_tcx() {
        programs.extend(filter_programs());
    }
    let counters = counters::datapath_counts(&super::maps_dir(&layout.bpffs_root))
        .unwrap_or_default()
        .into_iter()
        .map(|c| Counter {
            verdict: c.verdict,
            reason: c.reason,
            packets: c.packets,
        })
        .collect();
    Ok(DataplaneStatus {
        mode: "ebpf",
        programs,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_say_the_program_and_where_it_is_attached() {
        assert_eq!(
            parse_link_name("sock_connect4"),
            Some(("sock_connect4", "cgroup".into()))
        );
        assert_eq!(
            parse_link_name("tc_uplink_ingress_eth0"),
            Some(("tc_uplink_ingress", "eth0".into()))
        );
        assert_eq!(
            parse_link_name("tc_pod_egress_veth_a1"),
            Some(("tc_pod_egress", "veth_a1".into()))
        );
        assert_eq!(
            parse_link_name("xdp_uplink_ens3"),
            Some(("xdp_uplink", "ens3".into()))
        );
        assert_eq!(parse_link_name("something_else"), None);
        assert_eq!(parse_link_name("tc_pod_ingress_"), None);
    }
}
