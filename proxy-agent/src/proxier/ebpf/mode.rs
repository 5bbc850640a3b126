// SPDX-License-Identifier: Apache-2.0
//! The ebpf mode's registration: whether it can run here, how it starts, what it leaves.

use std::path::Path;

use tracing::{info, warn};

use super::{
    EbpfProxier, attached, inspect, kernel, loader, loader::LoadOptions, node_settings, pins, trace,
};
use crate::{
    config::{EbpfConfiguration, ProxyMode, XdpMode},
    proxier::{
        CleanupReport, CleanupScope, HostLayout, ModeEntry, ModeSettings, ModeTools, NodeContext,
        Proxier, conntrack::Replace,
    },
};

pub static MODE: ModeEntry = ModeEntry {
    mode: ProxyMode::Ebpf,
    fallback: Some(ProxyMode::Iptables),
    probe: unavailable,
    start,
    cleanup,
    // kube-proxy has no ebpf dataplane: nobody else writes ours.
    written_beside: |_| Vec::new(),
    tools: ModeTools {
        in_use: |layout| inspect::is_pinned(&layout.bpffs_root),
        inspect_subjects: inspect::SUBJECTS,
        inspect: Some(inspect::inspect_live),
        trace: Some(trace::trace_live),
        status: Some(super::status::status_live),
    },
};

/// Why ebpf mode cannot run here, if it cannot.
fn unavailable(layout: &HostLayout) -> Option<String> {
    if let Some(reason) = crate::ebpf_object::unavailable_reason() {
        return Some(reason.to_string());
    }
    let root = &layout.bpffs_root;
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
    if loader::detect_cgroup2_root().is_err() {
        return Some("no cgroup v2 hierarchy is mounted".into());
    }
    kernel::required_parts_missing()
}

fn start(settings: &ModeSettings<'_>) -> Result<Box<dyn Proxier>, String> {
    let config = settings.config;
    let explicit = !config.ebpf.cgroup_root.is_empty();
    let cgroup: std::path::PathBuf = if explicit {
        config.ebpf.cgroup_root.clone().into()
    } else {
        loader::detect_cgroup2_root().map_err(|e| e.to_string())?
    };
    let facts = loader::CgroupRootFacts::of(&cgroup)
        .map_err(|e| format!("ebpf.cgroupRoot {}: {e}", cgroup.display()))?;
    if let Some(warning) = loader::judge_cgroup_root(&cgroup, facts, explicit)? {
        warn!("{warning}");
    }
    let mut xdp = settings.xdp;
    if xdp != XdpMode::Off
        && let Some(reason) = kernel::xdp_missing()
    {
        warn!(%reason, "XDP acceleration unavailable on this kernel; tc handles all traffic");
        xdp = XdpMode::Off;
    }
    info!(
        tc = kernel::tc_attach_method(),
        kernel = ?kernel::version(),
        "ebpf mode: kernel checked"
    );
    let opts = LoadOptions {
        bpffs_root: settings.layout.bpffs_root.clone(),
        cgroup,
        map_sizes: config.ebpf.map_sizes,
        devices: settings.devices.to_vec(),
        xdp,
        maglev_table_size: config.ebpf.maglev_table_size,
        pod_egress: config.ebpf.socket_lb_host_namespace_only,
    };
    // Validation refused an unknown algorithm before any mode started.
    let algorithm = config
        .load_balancer_algorithm()
        .map_err(|e| e.to_string())?;
    let cookie = crate::sys::current_netns_cookie().map_err(|e| format!("netns cookie: {e}"))?;
    let ephemeral =
        crate::node::Sysctl::read(&crate::node::ProcSysctl::default(), EPHEMERAL_PORTS_SYSCTL)
            .ok()
            .and_then(|text| node_settings::parse_port_range(&text));
    let snat = node_settings::snat_ports(ephemeral);
    if snat.shared_with_kernel {
        warn!(
            ephemeral = ?ephemeral,
            snat_ports = ?(snat.min, snat.max),
            "the kernel's ephemeral ports (net.ipv4.ip_local_port_range) leave no range of \
             1024 ports apart for north-south SNAT: a node process connecting to a backend \
             from a port a masqueraded flow holds loses its replies to that flow; narrow \
             ip_local_port_range to leave one"
        );
    } else {
        info!(ephemeral = ?ephemeral, snat_ports = ?(snat.min, snat.max), "north-south SNAT ports, apart from the kernel's");
    }
    let proxier = EbpfProxier::start_with_limits(
        &opts,
        &config.ebpf.map_size_limits,
        lb_config(cookie, settings.node, &config.ebpf, snat),
        algorithm,
    )
    .map_err(|e| e.to_string())?;
    Ok(Box::new(proxier))
}

/// Where the kernel's range of ports for sockets that bind none is.
const EPHEMERAL_PORTS_SYSCTL: &str = "net/ipv4/ip_local_port_range";

/// The dataplane's runtime configuration: the node's namespace, its masquerade addresses
/// and SNAT ports, how long idle north-south flows are remembered, whether pods' sockets
/// are load-balanced.
fn lb_config(
    host_netns_cookie: u64,
    node: &NodeContext,
    ebpf: &EbpfConfiguration,
    snat: node_settings::SnatPorts,
) -> proxy_common::LbConfig {
    let conntrack = &ebpf.conntrack;
    // Validation keeps these within u32 seconds; saturate rather than wrap regardless.
    let secs = |d: crate::config::Duration| u32::try_from(d.to_std().as_secs()).unwrap_or(u32::MAX);
    let mut cfg = proxy_common::LbConfig {
        host_netns_cookie,
        ct_tcp_lifetime: secs(conntrack.tcp_timeout),
        ct_closing_lifetime: secs(conntrack.tcp_closing_timeout),
        ct_udp_lifetime: secs(conntrack.udp_timeout),
        snat_port_min: snat.min,
        snat_port_max: snat.max,
        flags: if ebpf.socket_lb_host_namespace_only {
            proxy_common::LB_CFG_SOCKET_LB_HOST_NETNS_ONLY
        } else {
            0
        },
        ..Default::default()
    };
    for ip in node.primary_ips.iter() {
        match ip {
            std::net::IpAddr::V4(a) => cfg.masq4 = u32::from_ne_bytes(a.octets()),
            std::net::IpAddr::V6(a) => cfg.masq6 = a.octets(),
        }
    }
    cfg
}

/// How long a netfilter mode taking over waits, once the programs start no more flows,
/// before it copies their conntrack: longer than any program run that read the
/// configuration before the change.
const HANDOVER_SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// Removes the programs (their pinned links) and maps under the pin directory, then our
/// programs attached outside it on every device of the namespace (tc filters on kernels
/// without TCX, XDP attached through netlink: see [`attached`]), which the pins do not
/// hold. When another mode starts, reports only when there was something to look at.
fn cleanup(layout: &HostLayout, scope: CleanupScope) -> Option<CleanupReport> {
    let root: &Path = &layout.bpffs_root;
    let pinned = root.exists();
    let mut report = CleanupReport::default();
    // A netfilter mode taking over gets the live flows (see [`handover`]): the programs
    // start no more, then the flows are copied before the programs go, and again after,
    // for the connections of programs that do not know to stop.
    let mut handed_over = (pinned
        && matches!(
            scope,
            CleanupScope::LeftBeside(ProxyMode::Iptables | ProxyMode::Nftables)
        ))
    .then(|| super::handover::HeldConntrack::open(&loader::maps_dir(root)));
    if let Some(held) = handed_over.as_mut() {
        match super::handover::leave_new_flows_to_netfilter(&loader::maps_dir(root)) {
            // A program that read the configuration just before may still be adding its
            // flow: a program run takes microseconds.
            Ok(true) => std::thread::sleep(HANDOVER_SETTLE),
            Ok(false) => {}
            Err(e) => report
                .errors
                .push(format!("leaving new flows to netfilter: {e}")),
        }
        let (_, errors) = held.seed_netfilter(super::monotonic_coarse_secs(), Replace::Existing);
        report.errors.extend(errors);
    }
    if pinned || scope == CleanupScope::Everything {
        match pins::unpin_all(root) {
            Ok(n) => report.removed += n,
            Err(e) => report
                .errors
                .push(format!("ebpf pins under {}: {e}", root.display())),
        }
    }
    // After the pins: an XDP link they held is gone by now, not refused as busy.
    let sweep = attached::remove_all();
    report.removed += sweep.removed;
    report.errors.extend(sweep.errors);
    if let Some(mut held) = handed_over {
        let (_, errors) = held.seed_netfilter(super::monotonic_coarse_secs(), Replace::Nothing);
        report.errors.extend(errors);
    }
    let (tables, errors) = super::handover::remove_tables(&mut super::handover::NftCommand);
    report.removed += tables;
    report.errors.extend(errors);
    let looked = pinned || scope == CleanupScope::Everything;
    (looked || report.removed > 0 || !report.errors.is_empty()).then_some(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::EbpfConntrack, node::NodeAddresses};

    #[test]
    fn lb_config_carries_the_masquerade_addresses_and_the_conntrack_lifetimes() {
        let node = NodeContext {
            primary_ips: NodeAddresses {
                v4: Some("192.168.0.2".parse().unwrap()),
                v6: Some("fd00::2".parse().unwrap()),
            },
            ..Default::default()
        };
        let conntrack = EbpfConntrack {
            tcp_timeout: crate::config::Duration::from_hours(2),
            tcp_closing_timeout: crate::config::Duration::from_secs(7),
            udp_timeout: crate::config::Duration::from_secs(45),
        };
        let snat = node_settings::snat_ports(Some((32_768, 60_999)));
        let ebpf = EbpfConfiguration {
            conntrack,
            ..Default::default()
        };
        let cfg = lb_config(42, &node, &ebpf, snat);
        assert_eq!(cfg.host_netns_cookie, 42);
        assert_eq!(cfg.masq4, u32::from_ne_bytes([192, 168, 0, 2]));
        assert_eq!(
            cfg.masq6,
            "fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(
            (
                cfg.ct_tcp_lifetime,
                cfg.ct_closing_lifetime,
                cfg.ct_udp_lifetime
            ),
            (7200, 7, 45)
        );
        assert_eq!((cfg.snat_port_min, cfg.snat_port_max), (61_000, 65_535));
        assert_eq!(cfg.flags, 0, "pods' sockets are load-balanced by default");
    }

    #[test]
    fn socket_lb_host_namespace_only_sets_its_configuration_bit() {
        let ebpf = EbpfConfiguration {
            socket_lb_host_namespace_only: true,
            ..Default::default()
        };
        let snat = node_settings::snat_ports(None);
        let cfg = lb_config(1, &NodeContext::default(), &ebpf, snat);
        assert_eq!(cfg.flags, proxy_common::LB_CFG_SOCKET_LB_HOST_NETNS_ONLY);
    }
}
