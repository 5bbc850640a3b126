// SPDX-License-Identifier: Apache-2.0
//! The registry against upstream's list, mode by mode, and the families' behaviour.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::serve::upstream_metrics::{NOT_EXPORTED, UPSTREAM};

/// A registry of `mode` with a sample in every family (label values made up), as a
/// scrape shows it: name -> (type, label names).
fn exposed(mode: MetricsMode) -> (String, BTreeMap<String, (String, BTreeSet<String>)>) {
    let m = Metrics::new();
    m.register_mode(mode, &[IpFamily::V4, IpFamily::V6]);
    if mode == MetricsMode::Iptables {
        m.register_packet_counter(
            "iptables_ct_state_invalid_dropped_packets_total",
            "Packets dropped because conntrack marked them INVALID",
            Box::new(|| Some(0)),
        );
        m.register_packet_counter(
            "iptables_localhost_nodeports_accepted_packets_total",
            "Packets accepted on NodePorts of the loopback addresses",
            Box::new(|| Some(0)),
        );
    }
    let v4 = [IpFamily::V4.as_api_str()];
    for h in [
        &m.sync_duration,
        &m.network_programming,
        &m.conntrack_reconcile_duration,
        &m.sync_full_duration,
        &m.sync_partial_duration,
    ] {
        h.with_label_values(&v4).observe(0.01);
    }
    Metrics::set_timestamp(&m.last_sync_timestamp, IpFamily::V4, SystemTime::now());
    Metrics::set_timestamp(&m.last_queued_timestamp, IpFamily::V4, SystemTime::now());
    m.no_local_endpoints
        .with_label_values(&["IPv4", "internal"])
        .set(0.0);
    m.iptables_rules_total
        .with_label_values(&["IPv4", "nat"])
        .set(1);
    m.iptables_rules_last
        .with_label_values(&["IPv4", "nat"])
        .set(1);
    m.healthz_total(true);
    m.livez_total(true);
    let page = m.render();
    let mut families = BTreeMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.insert(name.to_string(), (kind.to_string(), BTreeSet::new()));
        } else if !line.starts_with('#') {
            let (series, _) = line.split_once(' ').unwrap();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains_key(*f)))
                .unwrap_or(name);
            let entry = families.get_mut(family).unwrap();
            for pair in labels
                .trim_end_matches('}')
                .split(',')
                .filter(|p| !p.is_empty())
            {
                let key = pair.split_once('=').unwrap().0;
                if key != "le" {
                    entry.1.insert(key.to_string());
                }
            }
        }
    }
    (page, families)
}

#[test]
fn every_mode_exposes_upstreams_families_with_their_types_and_labels() {
    for mode in [
        MetricsMode::Iptables,
        MetricsMode::Ipvs,
        MetricsMode::Nftables,
        MetricsMode::Ebpf,
    ] {
        let (page, families) = exposed(mode);
        for (name, kind, labels, group) in UPSTREAM {
            let found = families.get(*name);
            if !group.in_mode(mode) || NOT_EXPORTED.iter().any(|(n, _)| n == name) {
                assert!(
                    found.is_none(),
                    "{mode:?} exposes {name}, upstream's mode does not"
                );
                continue;
            }
            let (found_kind, found_labels) =
                found.unwrap_or_else(|| panic!("{mode:?} lacks {name}:\n{page}"));
            assert_eq!(found_kind, kind, "{mode:?} {name}");
            let want: BTreeSet<String> = labels.iter().map(ToString::to_string).collect();
            assert_eq!(found_labels, &want, "{mode:?} {name} labels");
        }
        // Every kubeproxy_sync_proxy_rules_* family but ours is upstream's.
        for name in families.keys() {
            if name.starts_with("kubeproxy_") && !name.starts_with("kubeproxy_ebpf_") {
                let ours = [
                    "kubeproxy_sync_proxy_rules_failures_total",
                    "kubeproxy_proxy_mode_fallbacks_total",
                    "kubeproxy_objects_rejected_total",
                    "kubeproxy_foreign_proxy_detected",
                ];
                assert!(
                    ours.contains(&name.as_str()) || UPSTREAM.iter().any(|u| u.0 == name),
                    "{name} looks like upstream's but is not in its list"
                );
            }
        }
        for process in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_network_receive_bytes_total",
            "process_network_transmit_bytes_total",
            "process_virtual_memory_max_bytes",
            "kubernetes_build_info",
            "kubernetes_feature_enabled",
            "registered_metrics_total",
            "rest_client_exec_plugin_ttl_seconds",
        ] {
            assert!(families.contains_key(process), "{mode:?} lacks {process}");
        }
    }
}

#[test]
fn histograms_carry_upstreams_buckets() {
    let (page, _) = exposed(MetricsMode::Iptables);
    // ExponentialBuckets(0.001, 2, 15): 0.001 .. 16.384.
    for family in [
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
    ] {
        let bounds: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with(&format!("{family}_bucket{{ip_family=\"IPv4\"")))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(bounds.len(), 16, "{family}: 15 buckets and +Inf");
        assert_eq!(bounds[0], "0.001");
        assert_eq!(bounds[14], "16.384");
    }
    let b = network_programming_buckets();
    assert_eq!(&b[..4], &[0.0, 0.25, 0.5, 1.0]);
    assert_eq!(b.iter().filter(|v| **v >= 60.0 && **v < 120.0).count(), 12);
    assert_eq!(b.last().copied(), Some(300.0));
    assert_eq!(b.len(), 1 + 2 + 59 + 12 + 7);
}

#[test]
fn family_counters_start_at_zero_for_the_nodes_families_only() {
    let m = Metrics::new();
    m.register_mode(MetricsMode::Iptables, &[IpFamily::V4]);
    let page = m.render();
    assert!(page.contains(
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 0"
    ));
    assert!(!page.contains("ip_family=\"IPv6\""), "{page}");
}

#[test]
fn sync_timestamps_show_never_until_the_first_sync() {
    let m = Metrics::new();
    m.start_families(&[IpFamily::V4, IpFamily::V6]);
    let page = m.render();
    for gauge in [
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
    ] {
        for family in ["IPv4", "IPv6"] {
            let line = format!("{gauge}{{ip_family=\"{family}\"}} 0");
            assert!(page.contains(&line), "no {line}:\n{page}");
        }
    }
}

#[test]
fn a_packet_counter_is_read_at_each_scrape_and_absent_when_unreadable() {
    let m = Metrics::new();
    let value = std::sync::Arc::new(std::sync::Mutex::new(Some(42)));
    let read = value.clone();
    m.register_packet_counter(
        "iptables_ct_state_invalid_dropped_packets_total",
        "help",
        Box::new(move || *read.lock().unwrap()),
    );
    assert!(
        m.render()
            .contains("kubeproxy_iptables_ct_state_invalid_dropped_packets_total 42")
    );
    *value.lock().unwrap() = Some(50);
    assert!(
        m.render()
            .contains("kubeproxy_iptables_ct_state_invalid_dropped_packets_total 50")
    );
    *value.lock().unwrap() = None;
    assert!(
        !m.render()
            .contains("kubeproxy_iptables_ct_state_invalid_dropped_packets_total")
    );
}

#[test]
fn labelled_packet_counters_are_read_at_each_scrape_zeros_included() {
    let m = Metrics::new();
    let value = std::sync::Arc::new(std::sync::Mutex::new(Some(vec![
        ("no_endpoints".to_string(), 3),
        ("unserved_port".to_string(), 0),
    ])));
    let read = value.clone();
    m.register_labelled_packet_counter(
        "ebpf_datapath_rejects_total",
        "help",
        "reason",
        Box::new(move || read.lock().unwrap().clone()),
    );
    let page = m.render();
    assert!(page.contains("# TYPE kubeproxy_ebpf_datapath_rejects_total counter"));
    assert!(page.contains("kubeproxy_ebpf_datapath_rejects_total{reason=\"no_endpoints\"} 3"));
    assert!(page.contains("kubeproxy_ebpf_datapath_rejects_total{reason=\"unserved_port\"} 0"));
    *value.lock().unwrap() = Some(vec![("no_endpoints".to_string(), 5)]);
    assert!(
        m.render()
            .contains("kubeproxy_ebpf_datapath_rejects_total{reason=\"no_endpoints\"} 5")
    );
    *value.lock().unwrap() = None;
    assert!(!m.render().contains("kubeproxy_ebpf_datapath_rejects_total"));
}

#[test]
fn conntrack_reconciler_metrics_carry_the_family() {
    let m = Metrics::new();
    m.register_mode(MetricsMode::Ebpf, &[IpFamily::V4]);
    m.conntrack_reconcile_duration
        .with_label_values(&["IPv4"])
        .observe(0.002);
    m.conntrack_reconcile_deleted_total
        .with_label_values(&["IPv4"])
        .inc_by(3);
    let page = m.render();
    assert!(
        page.contains("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 3")
    );
    assert!(page.contains(
        "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"} 1"
    ));
}

#[test]
fn connected_udp_sweeps_are_counted_by_result() {
    use crate::proxier::{SocketSweep, SocketSweepUnsupported as Unsupported};
    let m = Metrics::new();
    m.connected_udp_sweep(&SocketSweep::default());
    m.connected_udp_sweep(&SocketSweep {
        swept: true,
        terminated: 2,
        ..Default::default()
    });
    m.connected_udp_sweep(&SocketSweep {
        swept: true,
        unsupported: Some(Unsupported::SockDestroy),
        ..Default::default()
    });
    let page = m.render();
    assert!(page.contains("# TYPE kubeproxy_ebpf_udp_sockets_terminated_total counter"));
    assert!(page.contains("kubeproxy_ebpf_udp_sockets_terminated_total 2"));
    assert!(page.contains("kubeproxy_ebpf_udp_socket_sweeps_total{result=\"complete\"} 1"));
    assert!(
        page.contains("kubeproxy_ebpf_udp_socket_sweeps_total{result=\"kernel_unsupported\"} 1")
    );
}

#[test]
fn full_maps_are_visible() {
    let m = Metrics::new();
    m.services_not_programmed.set(3);
    m.map_entries.with_label_values(&["SVC4_V2"]).set(8.0);
    m.map_capacity.with_label_values(&["SVC4_V2"]).set(8.0);
    let page = m.render();
    assert!(page.contains("# TYPE kubeproxy_ebpf_services_not_programmed gauge"));
    assert!(page.contains("kubeproxy_ebpf_services_not_programmed 3"));
    assert!(page.contains("kubeproxy_ebpf_map_entries{map=\"SVC4_V2\"} 8"));
    assert!(page.contains("kubeproxy_ebpf_map_capacity{map=\"SVC4_V2\"} 8"));
}

#[test]
fn map_growth_is_counted_by_map() {
    let m = Metrics::new();
    m.map_growths_total.with_label_values(&["SVC4_V2"]).inc();
    let page = m.render();
    assert!(page.contains("# TYPE kubeproxy_ebpf_map_growths_total counter"));
    assert!(page.contains("kubeproxy_ebpf_map_growths_total{map=\"SVC4_V2\"} 1"));
}

/// client_golang's process CPU counter has fractions of a second; component-base's build
/// information carries its nine labels and the value 1.
#[test]
fn process_cpu_is_fractional_and_build_info_has_component_bases_labels() {
    // Burn a little CPU so the counter is not a whole number by chance.
    let mut x = 0u64;
    for i in 0..3_000_000u64 {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    assert_ne!(x, 1);
    let (page, _) = exposed(MetricsMode::Iptables);
    let cpu_line = page
        .lines()
        .find(|l| l.starts_with("process_cpu_seconds_total "))
        .unwrap_or_else(|| panic!("no process_cpu_seconds_total in {page}"));
    let cpu: f64 = cpu_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(cpu > 0.0 && cpu.fract() != 0.0, "{cpu_line}");
    let build = page
        .lines()
        .find(|l| l.starts_with("kubernetes_build_info{"))
        .unwrap_or_else(|| panic!("no kubernetes_build_info in {page}"));
    for label in [
        "major=",
        "minor=",
        "git_version=",
        "git_commit=",
        "git_tree_state=",
        "build_date=",
        "go_version=",
        "compiler=\"rustc\"",
        "platform=",
    ] {
        assert!(build.contains(label), "{build} lacks {label}");
    }
    assert!(build.ends_with(" 1"), "{build}");
}

#[test]
fn net_dev_sums_every_interfaces_bytes() {
    let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0:  200000     100    0    0    0     0          0         0    30000      90    0    0    0     0       0          0
";
    assert_eq!(parse_net_dev(text), (201000.0, 31000.0));
}
