// SPDX-License-Identifier: Apache-2.0
//! One test per validation rule: each starts from the defaulted configuration (which is valid),
//! breaks one thing, and expects exactly one error line.

use super::*;
use crate::config::defaults::default_config;
use crate::config::types::VModuleItem;

fn errors_of(mutate: impl FnOnce(&mut KubeProxyConfiguration)) -> Vec<String> {
    let mut config = default_config();
    mutate(&mut config);
    validate(&config).iter().map(ToString::to_string).collect()
}

fn expect_one(mutate: impl FnOnce(&mut KubeProxyConfiguration), expected: &str) {
    assert_eq!(errors_of(mutate), vec![expected.to_owned()]);
}

#[test]
fn defaulted_configuration_is_valid() {
    assert_eq!(errors_of(|_| {}), Vec::<String>::new());
    for mode in ["ebpf", "iptables", "ipvs", ""] {
        assert_eq!(
            errors_of(|c| c.mode = mode.into()),
            Vec::<String>::new(),
            "{mode}"
        );
    }
}

#[test]
fn oom_score_adj_range() {
    expect_one(
        |c| c.oom_score_adj = Some(2000),
        "oomScoreAdj: Invalid value: 2000: must be within the range [-1000, 1000]",
    );
    expect_one(
        |c| c.oom_score_adj = Some(-1001),
        "oomScoreAdj: Invalid value: -1001: must be within the range [-1000, 1000]",
    );
    assert!(errors_of(|c| c.oom_score_adj = Some(1000)).is_empty());
}

#[test]
fn iptables_masquerade_bit_range() {
    expect_one(
        |c| c.iptables.masquerade_bit = Some(32),
        "iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]",
    );
    expect_one(
        |c| c.iptables.masquerade_bit = Some(-1),
        "iptables.masqueradeBit: Invalid value: -1: must be within the range [0, 31]",
    );
}

#[test]
fn nftables_masquerade_bit_range_in_nftables_mode() {
    let errors = errors_of(|c| {
        c.mode = "nftables".into();
        c.nftables.masquerade_bit = Some(32);
    });
    assert!(
        errors.contains(
            &"nftables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]"
                .to_owned()
        ),
        "{errors:?}"
    );
    // Other modes do not read the nftables section.
    assert!(errors_of(|c| c.nftables.masquerade_bit = Some(32)).is_empty());
}

#[test]
fn sync_period_must_be_positive() {
    expect_one(
        |c| {
            c.iptables.sync_period = Duration::ZERO;
            c.iptables.min_sync_period = Duration::ZERO;
        },
        r#"iptables.syncPeriod: Invalid value: "0s": must be greater than 0"#,
    );
}

#[test]
fn min_sync_period_must_not_be_negative() {
    expect_one(
        |c| c.iptables.min_sync_period = Duration::from_secs(-1),
        r#"iptables.minSyncPeriod: Invalid value: "-1s": must be greater than or equal to 0"#,
    );
}

#[test]
fn sync_period_must_not_be_below_min_sync_period() {
    expect_one(
        |c| c.iptables.min_sync_period = Duration::from_secs(40),
        r#"iptables.syncPeriod: Invalid value: "40s": must be greater than or equal to iptables.minSyncPeriod"#,
    );
}

#[test]
fn ipvs_mode_checks_the_ipvs_sync_periods_only() {
    expect_one(
        |c| {
            c.mode = "ipvs".into();
            c.ipvs.min_sync_period = Duration::from_mins(1);
            c.iptables.sync_period = Duration::ZERO;
        },
        r#"ipvs.syncPeriod: Invalid value: "1m0s": must be greater than or equal to ipvs.minSyncPeriod"#,
    );
}

#[test]
fn ipvs_timeouts_must_not_be_negative() {
    for (field, set) in [
        (
            "tcpTimeout",
            (|c: &mut KubeProxyConfiguration| c.ipvs.tcp_timeout = Duration::from_secs(-1))
                as fn(&mut _),
        ),
        ("tcpFinTimeout", |c| {
            c.ipvs.tcp_fin_timeout = Duration::from_secs(-1)
        }),
        ("udpTimeout", |c| {
            c.ipvs.udp_timeout = Duration::from_secs(-1)
        }),
    ] {
        expect_one(
            |c| {
                c.mode = "ipvs".into();
                set(c);
            },
            &format!(r#"ipvs.{field}: Invalid value: "-1s": must be greater than or equal to 0"#),
        );
    }
}

#[test]
fn ipvs_scheduler_must_be_known() {
    expect_one(
        |c| {
            c.mode = "ipvs".into();
            c.ipvs.scheduler = "fastest".into();
        },
        r#"ipvs.scheduler: Invalid value: "fastest": must be in [rr wrr lc wlc lblc lblcr sh dh sed nq mh], blank means the default algorithm method (currently rr)"#,
    );
    for scheduler in IPVS_SCHEDULERS.iter().chain(&[""]) {
        assert!(
            errors_of(|c| {
                c.mode = "ipvs".into();
                c.ipvs.scheduler = (*scheduler).into();
            })
            .is_empty()
        );
    }
}

#[test]
fn ipvs_exclude_cidrs_must_be_cidrs() {
    expect_one(
        |c| {
            c.mode = "ipvs".into();
            c.ipvs.exclude_cidrs = vec!["192.168.0.0/16".into(), "10.20.30.40".into()];
        },
        r#"ipvs.excludeCIDRs[1]: Invalid value: "10.20.30.40": must be a valid CIDR"#,
    );
}

#[test]
fn conntrack_counts_must_not_be_negative() {
    expect_one(
        |c| c.conntrack.max_per_core = Some(-1),
        "conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
    );
    expect_one(
        |c| c.conntrack.min = Some(-1),
        "conntrack.min: Invalid value: -1: must be greater than or equal to 0",
    );
}

#[test]
fn conntrack_timeouts_must_not_be_negative() {
    let minus = Duration::from_secs(-1);
    expect_one(
        |c| c.conntrack.tcp_established_timeout = Some(minus),
        r#"conntrack.tcpEstablishedTimeout: Invalid value: "-1s": must be greater than or equal to 0"#,
    );
    expect_one(
        |c| c.conntrack.tcp_close_wait_timeout = Some(minus),
        r#"conntrack.tcpCloseWaitTimeout: Invalid value: "-1s": must be greater than or equal to 0"#,
    );
    expect_one(
        |c| c.conntrack.udp_timeout = minus,
        r#"conntrack.udpTimeout: Invalid value: "-1s": must be greater than or equal to 0"#,
    );
    expect_one(
        |c| c.conntrack.udp_stream_timeout = minus,
        r#"conntrack.udpStreamTimeout: Invalid value: "-1s": must be greater than or equal to 0"#,
    );
}

#[test]
fn mode_must_be_known() {
    expect_one(
        |c| c.mode = "userspace".into(),
        r#"mode: Invalid value: "userspace": must be ebpf, iptables, ipvs, nftables or blank (blank means the best-available proxy [currently ebpf])"#,
    );
}

#[test]
fn kernelspace_mode_is_refused_on_linux() {
    expect_one(
        |c| c.mode = "kernelspace".into(),
        r#"mode: Invalid value: "kernelspace": must be ebpf, iptables, ipvs, nftables or blank (blank means the best-available proxy [currently ebpf])"#,
    );
}

#[test]
fn every_upstream_mode_is_accepted() {
    for mode in ["", "ebpf", "iptables", "ipvs", "nftables"] {
        assert!(
            errors_of(|c| c.mode = mode.into()).is_empty(),
            "mode {mode:?} refused"
        );
    }
}

#[test]
fn burst_must_not_be_negative() {
    expect_one(
        |c| c.client_connection.burst = -1,
        "clientConnection.burst: Invalid value: -1: must be greater than or equal to 0",
    );
}

#[test]
fn config_sync_period_must_be_positive() {
    expect_one(
        |c| c.config_sync_period = Duration::ZERO,
        r#"configSyncPeriod: Invalid value: "0s": must be greater than 0"#,
    );
}

#[test]
fn udp_idle_timeout_must_be_positive() {
    expect_one(
        |c| c.udp_idle_timeout = Duration::from_millis(-250),
        r#"udpIdleTimeout: Invalid value: "-250ms": must be greater than 0"#,
    );
}

#[test]
fn bind_address_must_be_an_ip() {
    expect_one(
        |c| c.bind_address = "10.10.12.11:2000".into(),
        r#"bindAddress: Invalid value: "10.10.12.11:2000": not a valid textual representation of an IP address"#,
    );
}

#[test]
fn healthz_bind_address_must_be_ip_port() {
    expect_one(
        |c| c.healthz_bind_address = "0.0.0.0".into(),
        r#"healthzBindAddress: Invalid value: "0.0.0.0": must be IP:port"#,
    );
    // Empty disables the health server.
    assert!(errors_of(|c| c.healthz_bind_address = String::new()).is_empty());
}

#[test]
fn metrics_bind_address_host_must_be_an_ip() {
    expect_one(
        |c| c.metrics_bind_address = "localhost:10249".into(),
        r#"metricsBindAddress: Invalid value: "localhost": must be a valid IP"#,
    );
}

#[test]
fn metrics_bind_address_port_must_be_valid() {
    expect_one(
        |c| c.metrics_bind_address = "127.0.0.1:0".into(),
        r#"metricsBindAddress: Invalid value: "0": must be a valid port"#,
    );
    expect_one(
        |c| c.metrics_bind_address = "[::1]:65536".into(),
        r#"metricsBindAddress: Invalid value: "65536": must be a valid port"#,
    );
    expect_one(
        |c| c.metrics_bind_address = String::new(),
        r#"metricsBindAddress: Invalid value: "": must be IP:port"#,
    );
}

#[test]
fn port_range_must_parse() {
    expect_one(
        |c| c.port_range = "2000-300".into(),
        r#"portRange: Invalid value: "2000-300": must be a valid port range (e.g. 300-2000)"#,
    );
    assert!(errors_of(|c| c.port_range = "300-2000".into()).is_empty());
}

#[test]
fn node_port_addresses_must_be_cidrs_or_keywords() {
    expect_one(
        |c| c.node_port_addresses = vec!["192.168.0.0/16".into(), "1.2.3.4".into()],
        r#"nodePortAddresses[1]: Invalid value: "1.2.3.4": must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"#,
    );
    let valid = ["primary", "localhost", "all", "10.0.0.0/8", "::1/128"]
        .map(String::from)
        .to_vec();
    assert!(errors_of(|c| c.node_port_addresses = valid).is_empty());
}

#[test]
fn node_port_address_keywords_must_not_repeat() {
    expect_one(
        |c| c.node_port_addresses = vec!["localhost".into(), "primary".into(), "localhost".into()],
        r#"nodePortAddresses[2]: Duplicate value: "localhost""#,
    );
}

#[test]
fn show_hidden_metrics_version_form() {
    expect_one(
        |c| c.show_hidden_metrics_for_version = "1.16.2".into(),
        r#"showHiddenMetricsForVersion: Invalid value: "1.16.2": must be of the form <major>.<minor> (e.g. '1.16')"#,
    );
    assert!(errors_of(|c| c.show_hidden_metrics_for_version = "1.33".into()).is_empty());
}

#[test]
fn detect_local_mode_must_be_known() {
    expect_one(
        |c| c.detect_local_mode = "PodCIDR".into(),
        r#"detectLocalMode: Unsupported value: "PodCIDR": supported values: "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", """#,
    );
}

#[test]
fn bridge_interface_mode_needs_a_bridge() {
    expect_one(
        |c| c.detect_local_mode = "BridgeInterface".into(),
        r#"detectLocal.bridgeInterface: Invalid value: "": must not be empty"#,
    );
    assert!(
        errors_of(|c| {
            c.detect_local_mode = "BridgeInterface".into();
            c.detect_local.bridge_interface = "cbr0".into();
        })
        .is_empty()
    );
}

#[test]
fn interface_name_prefix_mode_needs_a_prefix() {
    expect_one(
        |c| c.detect_local_mode = "InterfaceNamePrefix".into(),
        r#"detectLocal.interfaceNamePrefix: Invalid value: "": must not be empty"#,
    );
}

#[test]
fn cluster_cidr_entries_must_be_cidrs() {
    expect_one(
        |c| c.cluster_cidr = "192.168.0.0/16,invalid".into(),
        r#"clusterCIDR: Invalid value: "invalid": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"#,
    );
}

#[test]
fn cluster_cidr_pair_must_be_dual_stack() {
    expect_one(
        |c| c.cluster_cidr = "192.168.0.0/16,10.0.0.0/8".into(),
        r#"clusterCIDR: Invalid value: "192.168.0.0/16,10.0.0.0/8": must be either a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)"#,
    );
    assert!(errors_of(|c| c.cluster_cidr = "10.244.0.0/16,fd00:10:244::/56".into()).is_empty());
}

#[test]
fn cluster_cidr_has_at_most_two_entries() {
    expect_one(
        |c| c.cluster_cidr = "10.0.0.0/8,fd00::/8,10.1.0.0/16".into(),
        r#"clusterCIDR: Invalid value: "10.0.0.0/8,fd00::/8,10.1.0.0/16": must be either a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)"#,
    );
}

#[test]
fn cluster_cidr_is_only_checked_in_cluster_cidr_mode() {
    assert!(
        errors_of(|c| {
            c.detect_local_mode = "NodeCIDR".into();
            c.cluster_cidr = "garbage".into();
        })
        .is_empty()
    );
}

#[test]
fn logging_format_must_be_known() {
    expect_one(
        |c| c.logging.format = "xml".into(),
        r#"logging.format: Invalid value: "xml": Unsupported log format"#,
    );
    expect_one(
        |c| c.logging.format = String::new(),
        r#"logging.format: Invalid value: "": Unsupported log format"#,
    );
}

#[test]
fn logging_vmodule_only_with_text_format() {
    expect_one(
        |c| {
            c.logging.format = "json".into();
            c.logging.vmodule = vec![VModuleItem {
                file_pattern: "proxier".into(),
                verbosity: 4,
            }];
        },
        "logging.vmodule: Forbidden: Only supported for text log format",
    );
}

#[test]
fn logging_vmodule_pattern_must_be_set() {
    expect_one(
        |c| {
            c.logging.vmodule = vec![VModuleItem {
                file_pattern: String::new(),
                verbosity: 4,
            }]
        },
        "logging.vmodule[0]: Required value: File pattern must not be empty",
    );
}

#[test]
fn logging_vmodule_pattern_has_no_separators() {
    expect_one(
        |c| {
            c.logging.vmodule = vec![VModuleItem {
                file_pattern: "a=b".into(),
                verbosity: 4,
            }]
        },
        r#"logging.vmodule[0]: Invalid value: "a=b": File pattern must not contain equal sign or comma"#,
    );
}

#[test]
fn logging_verbosity_fits_klog() {
    expect_one(
        |c| c.logging.verbosity = 1 << 31,
        "logging.verbosity: Invalid value: 2147483648: Must be <= 2147483647",
    );
}

#[test]
fn ebpf_bpffs_root_must_be_absolute() {
    expect_one(
        |c| c.ebpf.bpffs_root = "sys/fs/bpf".into(),
        r#"ebpf.bpffsRoot: Invalid value: "sys/fs/bpf": must be an absolute path"#,
    );
}

#[test]
fn ebpf_cgroup_root_must_be_absolute_when_set() {
    expect_one(
        |c| c.ebpf.cgroup_root = "cgroup".into(),
        r#"ebpf.cgroupRoot: Invalid value: "cgroup": must be an absolute path"#,
    );
    assert!(errors_of(|c| c.ebpf.cgroup_root = "/sys/fs/cgroup".into()).is_empty());
}

#[test]
fn ebpf_devices_must_be_interface_names() {
    expect_one(
        |c| c.ebpf.devices = vec!["eth0".into(), "a-very-long-interface".into()],
        r#"ebpf.devices[1]: Invalid value: "a-very-long-interface": must be a valid interface name (1-15 characters, no '/', ':' or whitespace)"#,
    );
}

#[test]
fn ebpf_devices_must_not_repeat() {
    expect_one(
        |c| c.ebpf.devices = vec!["eth0".into(), "eth0".into()],
        r#"ebpf.devices[1]: Duplicate value: "eth0""#,
    );
}

#[test]
fn ebpf_xdp_mode_must_be_known() {
    expect_one(
        |c| c.ebpf.xdp_mode = "offload".into(),
        r#"ebpf.xdpMode: Unsupported value: "offload": supported values: "off", "generic", "native""#,
    );
}

#[test]
fn ebpf_map_sizes_must_be_positive_and_bounded() {
    expect_one(
        |c| c.ebpf.map_sizes.services = 0,
        "ebpf.mapSizes.services: Invalid value: 0: must be within the range [1, 16777216]",
    );
    expect_one(
        |c| c.ebpf.map_sizes.conntrack = MAX_MAP_ENTRIES + 1,
        "ebpf.mapSizes.conntrack: Invalid value: 16777217: must be within the range [1, 16777216]",
    );
    for (name, set) in [
        (
            "backends",
            (|c: &mut KubeProxyConfiguration| c.ebpf.map_sizes.backends = 0) as fn(&mut _),
        ),
        ("revNat", |c| c.ebpf.map_sizes.rev_nat = 0),
        ("sockRevNat", |c| c.ebpf.map_sizes.sock_rev_nat = 0),
        ("affinity", |c| c.ebpf.map_sizes.affinity = 0),
        ("sourceRanges", |c| c.ebpf.map_sizes.source_ranges = 0),
    ] {
        expect_one(
            set,
            &format!(
                "ebpf.mapSizes.{name}: Invalid value: 0: must be within the range [1, 16777216]"
            ),
        );
    }
}

#[test]
fn ebpf_map_size_limits_are_optional_bounded_and_at_least_the_starting_size() {
    assert!(errors_of(|c| c.ebpf.map_size_limits.services = Some(65536)).is_empty());
    assert!(
        errors_of(|c| {
            c.ebpf.map_sizes.backends = 256;
            c.ebpf.map_size_limits.backends = Some(4096);
        })
        .is_empty()
    );
    expect_one(
        |c| c.ebpf.map_size_limits.rev_nat = Some(1024),
        "ebpf.mapSizeLimits.revNat: Invalid value: 1024: must be at least the starting size in \
         ebpf.mapSizes (65536): maps grow, they never shrink below it",
    );
    expect_one(
        |c| c.ebpf.map_size_limits.source_ranges = Some(MAX_MAP_ENTRIES + 1),
        "ebpf.mapSizeLimits.sourceRanges: Invalid value: 16777217: must be within the range \
         [1, 16777216]",
    );
}

#[test]
fn ebpf_load_balancer_algorithm_must_be_known() {
    assert!(errors_of(|c| c.ebpf.load_balancer_algorithm = "maglev".into()).is_empty());
    assert!(errors_of(|c| c.ebpf.load_balancer_algorithm = String::new()).is_empty());
    expect_one(
        |c| c.ebpf.load_balancer_algorithm = "round-robin".into(),
        r#"ebpf.loadBalancerAlgorithm: Unsupported value: "round-robin": supported values: "random", "maglev""#,
    );
}

#[test]
fn ebpf_maglev_table_size_must_be_a_prime_in_range() {
    for ok in [251, 16_381, 65_521, 131_071] {
        assert!(
            errors_of(|c| c.ebpf.maglev_table_size = ok).is_empty(),
            "{ok}"
        );
    }
    for (bad, shown) in [
        (16_384, "16384"),
        (0, "0"),
        (241, "241"),
        (131_101, "131101"),
    ] {
        expect_one(
            |c| c.ebpf.maglev_table_size = bad,
            &format!(
                "ebpf.maglevTableSize: Invalid value: {shown}: must be a prime within the range [251, 131071]"
            ),
        );
    }
}

#[test]
fn ebpf_maglev_tables_must_fit_the_index_and_the_map_bound() {
    expect_one(
        |c| c.ebpf.map_sizes.maglev_tables = 0,
        "ebpf.mapSizes.maglevTables: Invalid value: 0: must be within the range [1, 65535]",
    );
    // 1025 tables of 16381 entries are more than 16M entries.
    expect_one(
        |c| c.ebpf.map_sizes.maglev_tables = 1025,
        "ebpf.mapSizes.maglevTables: Invalid value: 1025: times ebpf.maglevTableSize (16381) must be at most 16777216 entries",
    );
    assert!(errors_of(|c| c.ebpf.map_sizes.maglev_tables = 1024).is_empty());
}

#[test]
fn errors_are_collected_and_sorted_by_field() {
    let errors = errors_of(|c| {
        c.oom_score_adj = Some(2000);
        c.bind_address = "nope".into();
        c.conntrack.min = Some(-1);
    });
    assert_eq!(
        errors,
        vec![
            r#"bindAddress: Invalid value: "nope": not a valid textual representation of an IP address"#,
            "conntrack.min: Invalid value: -1: must be greater than or equal to 0",
            "oomScoreAdj: Invalid value: 2000: must be within the range [-1000, 1000]",
        ]
    );
}
