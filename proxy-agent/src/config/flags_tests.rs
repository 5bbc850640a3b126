// SPDX-License-Identifier: Apache-2.0
//! Tests of the flag definitions and their mapping onto the configuration.

use super::*;
use crate::config::defaults::{apply_platform_defaults, apply_v1alpha1_defaults};
use crate::config::types::{API_VERSION, KIND};
use clap::{CommandFactory, FromArgMatches, Parser};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

fn parse(args: &[&str]) -> (Flags, ArgMatches) {
    let matches = Cli::command()
        .try_get_matches_from(std::iter::once("kube-proxy").chain(args.iter().copied()))
        .unwrap_or_else(|error| panic!("{args:?}: {error}"));
    let cli = Cli::from_arg_matches(&matches).unwrap();
    (cli.flags, matches)
}

fn parse_error(args: &[&str]) -> String {
    match Cli::command()
        .try_get_matches_from(std::iter::once("kube-proxy").chain(args.iter().copied()))
    {
        Ok(_) => panic!("{args:?} parsed"),
        Err(error) => error.to_string(),
    }
}

/// The configuration that `args` produce without --config (no validation).
fn config_from(args: &[&str]) -> (KubeProxyConfiguration, Vec<String>) {
    let (flags, _) = parse(args);
    let mut config = KubeProxyConfiguration {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        ..Default::default()
    };
    apply_v1alpha1_defaults(&mut config);
    let warnings = apply_config_flags(&flags, &mut config);
    apply_deprecated_port_flags(&flags, &mut config);
    apply_logging_flags(&flags, &mut config.logging);
    apply_platform_defaults(&mut config);
    apply_hostname_override(&flags, &mut config).unwrap();
    (config, warnings)
}

type Check = fn(&KubeProxyConfiguration);

/// Every configuration flag, one example each, with the field it must set. The last test
/// below checks that this table covers every flag `Flags` declares.
fn mapping_cases() -> Vec<(&'static str, Vec<&'static str>, Check)> {
    vec![
        ("kubeconfig", vec!["--kubeconfig=/etc/kp.conf"], |c| {
            assert_eq!(c.client_connection.kubeconfig, "/etc/kp.conf")
        }),
        (
            "kube-api-content-type",
            vec!["--kube-api-content-type", "application/json"],
            |c| assert_eq!(c.client_connection.content_type, "application/json"),
        ),
        ("kube-api-qps", vec!["--kube-api-qps=20.5"], |c| {
            assert_eq!(c.client_connection.qps, 20.5)
        }),
        ("kube-api-burst", vec!["--kube-api-burst=40"], |c| {
            assert_eq!(c.client_connection.burst, 40)
        }),
        (
            "hostname-override",
            vec!["--hostname-override=  Node-A "],
            |c| assert_eq!(c.hostname_override, "node-a"),
        ),
        ("bind-address", vec!["--bind-address=10.0.0.5"], |c| {
            assert_eq!(c.bind_address, "10.0.0.5")
        }),
        (
            "bind-address-hard-fail",
            vec!["--bind-address-hard-fail"],
            |c| assert!(c.bind_address_hard_fail),
        ),
        (
            "healthz-bind-address",
            vec!["--healthz-bind-address=10.0.0.5"],
            |c| assert_eq!(c.healthz_bind_address, "10.0.0.5:10256"),
        ),
        (
            "metrics-bind-address",
            vec!["--metrics-bind-address=0.0.0.0:9999"],
            |c| assert_eq!(c.metrics_bind_address, "0.0.0.0:9999"),
        ),
        (
            "healthz-port",
            vec!["--healthz-bind-address=10.0.0.5", "--healthz-port=1234"],
            |c| assert_eq!(c.healthz_bind_address, "10.0.0.5:1234"),
        ),
        ("metrics-port", vec!["--metrics-port=0"], |c| {
            assert_eq!(c.metrics_bind_address, "")
        }),
        ("profiling", vec!["--profiling=true"], |c| {
            assert!(c.enable_profiling)
        }),
        (
            "show-hidden-metrics-for-version",
            vec!["--show-hidden-metrics-for-version=1.32"],
            |c| assert_eq!(c.show_hidden_metrics_for_version, "1.32"),
        ),
        (
            "feature-gates",
            vec!["--feature-gates=A=true, B=false", "--feature-gates=C=1"],
            |c| {
                let expected: BTreeMap<String, bool> =
                    [("A".into(), true), ("B".into(), false), ("C".into(), true)]
                        .into_iter()
                        .collect();
                assert_eq!(c.feature_gates, expected)
            },
        ),
        ("proxy-mode", vec!["--proxy-mode=ipvs"], |c| {
            assert_eq!(c.mode, "ipvs")
        }),
        (
            "iptables-masquerade-bit",
            vec!["--iptables-masquerade-bit=7"],
            |c| assert_eq!(c.iptables.masquerade_bit, Some(7)),
        ),
        ("masquerade-all", vec!["--masquerade-all"], |c| {
            assert!(c.iptables.masquerade_all && c.nftables.masquerade_all)
        }),
        (
            "iptables-localhost-nodeports",
            vec!["--iptables-localhost-nodeports=false"],
            |c| assert_eq!(c.iptables.localhost_node_ports, Some(false)),
        ),
        (
            "iptables-sync-period",
            vec!["--iptables-sync-period=1m"],
            |c| assert_eq!(c.iptables.sync_period, Duration::from_mins(1)),
        ),
        (
            "iptables-min-sync-period",
            vec!["--iptables-min-sync-period=0s"],
            |c| assert_eq!(c.iptables.min_sync_period, Duration::ZERO),
        ),
        (
            "ipvs-sync-period",
            vec!["--proxy-mode=ipvs", "--ipvs-sync-period=45s"],
            |c| assert_eq!(c.ipvs.sync_period, Duration::from_secs(45)),
        ),
        (
            "ipvs-min-sync-period",
            vec!["--proxy-mode=ipvs", "--ipvs-min-sync-period=5s"],
            |c| assert_eq!(c.ipvs.min_sync_period, Duration::from_secs(5)),
        ),
        ("ipvs-scheduler", vec!["--ipvs-scheduler=wlc"], |c| {
            assert_eq!(c.ipvs.scheduler, "wlc")
        }),
        (
            "ipvs-exclude-cidrs",
            vec![
                "--ipvs-exclude-cidrs=10.0.0.0/8,192.168.0.0/16",
                "--ipvs-exclude-cidrs=fd00::/8",
            ],
            |c| {
                assert_eq!(
                    c.ipvs.exclude_cidrs,
                    vec!["10.0.0.0/8", "192.168.0.0/16", "fd00::/8"]
                )
            },
        ),
        ("ipvs-strict-arp", vec!["--ipvs-strict-arp"], |c| {
            assert!(c.ipvs.strict_arp)
        }),
        ("ipvs-tcp-timeout", vec!["--ipvs-tcp-timeout=15m"], |c| {
            assert_eq!(c.ipvs.tcp_timeout, Duration::from_mins(15))
        }),
        (
            "ipvs-tcpfin-timeout",
            vec!["--ipvs-tcpfin-timeout=2m"],
            |c| assert_eq!(c.ipvs.tcp_fin_timeout, Duration::from_mins(2)),
        ),
        ("ipvs-udp-timeout", vec!["--ipvs-udp-timeout=300ms"], |c| {
            assert_eq!(c.ipvs.udp_timeout, Duration::from_millis(300))
        }),
        (
            "detect-local-mode",
            vec!["--detect-local-mode=NodeCIDR"],
            |c| assert_eq!(c.detect_local_mode, "NodeCIDR"),
        ),
        (
            "pod-bridge-interface",
            vec!["--pod-bridge-interface=cbr0"],
            |c| assert_eq!(c.detect_local.bridge_interface, "cbr0"),
        ),
        (
            "pod-interface-name-prefix",
            vec!["--pod-interface-name-prefix=veth"],
            |c| assert_eq!(c.detect_local.interface_name_prefix, "veth"),
        ),
        (
            "cluster-cidr",
            vec!["--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"],
            |c| assert_eq!(c.cluster_cidr, "10.244.0.0/16,fd00:10:244::/56"),
        ),
        (
            "nodeport-addresses",
            vec!["--nodeport-addresses=primary,127.0.0.0/8"],
            |c| assert_eq!(c.node_port_addresses, vec!["primary", "127.0.0.0/8"]),
        ),
        ("oom-score-adj", vec!["--oom-score-adj=-500"], |c| {
            assert_eq!(c.oom_score_adj, Some(-500))
        }),
        (
            "conntrack-max-per-core",
            vec!["--conntrack-max-per-core=0"],
            |c| assert_eq!(c.conntrack.max_per_core, Some(0)),
        ),
        ("conntrack-min", vec!["--conntrack-min=65536"], |c| {
            assert_eq!(c.conntrack.min, Some(65536))
        }),
        (
            "conntrack-tcp-timeout-established",
            vec!["--conntrack-tcp-timeout-established=12h"],
            |c| {
                assert_eq!(
                    c.conntrack.tcp_established_timeout,
                    Some(Duration::from_hours(12))
                )
            },
        ),
        (
            "conntrack-tcp-timeout-close-wait",
            vec!["--conntrack-tcp-timeout-close-wait=30m"],
            |c| {
                assert_eq!(
                    c.conntrack.tcp_close_wait_timeout,
                    Some(Duration::from_mins(30))
                )
            },
        ),
        (
            "conntrack-tcp-be-liberal",
            vec!["--conntrack-tcp-be-liberal=T"],
            |c| assert!(c.conntrack.tcp_be_liberal),
        ),
        (
            "conntrack-udp-timeout",
            vec!["--conntrack-udp-timeout=30s"],
            |c| assert_eq!(c.conntrack.udp_timeout, Duration::from_secs(30)),
        ),
        (
            "conntrack-udp-timeout-stream",
            vec!["--conntrack-udp-timeout-stream=5m"],
            |c| assert_eq!(c.conntrack.udp_stream_timeout, Duration::from_mins(5)),
        ),
        ("config-sync-period", vec!["--config-sync-period=1h"], |c| {
            assert_eq!(c.config_sync_period, Duration::from_hours(1))
        }),
        ("v", vec!["-v=4"], |c| assert_eq!(c.logging.verbosity, 4)),
        (
            "vmodule",
            vec!["--vmodule=proxier=5,runner=3,", "--vmodule=ebpf*=6"],
            |c| {
                let items: Vec<(&str, u32)> = c
                    .logging
                    .vmodule
                    .iter()
                    .map(|i| (i.file_pattern.as_str(), i.verbosity))
                    .collect();
                assert_eq!(items, vec![("proxier", 5), ("runner", 3), ("ebpf*", 6)])
            },
        ),
        ("logging-format", vec!["--logging-format=json"], |c| {
            assert_eq!(c.logging.format, "json")
        }),
        (
            "log-flush-frequency",
            vec!["--log-flush-frequency=1s"],
            |c| assert_eq!(c.logging.flush_frequency, Duration::from_secs(1)),
        ),
        (
            "log-text-split-stream",
            vec!["--log-text-split-stream"],
            |c| assert_eq!(c.logging.options["text"]["splitStream"], true),
        ),
        (
            "log-text-info-buffer-size",
            vec!["--log-text-info-buffer-size=2Ki"],
            |c| assert_eq!(c.logging.options["text"]["infoBufferSize"], "2Ki"),
        ),
        (
            "log-json-split-stream",
            vec!["--log-json-split-stream=false"],
            |c| assert_eq!(c.logging.options["json"]["splitStream"], false),
        ),
        (
            "log-json-info-buffer-size",
            vec!["--log-json-info-buffer-size", "1M"],
            |c| assert_eq!(c.logging.options["json"]["infoBufferSize"], "1M"),
        ),
        ("bpffs-root", vec!["--bpffs-root=/sys/fs/bpf/kp"], |c| {
            assert_eq!(c.ebpf.bpffs_root, "/sys/fs/bpf/kp")
        }),
        ("cgroup-root", vec!["--cgroup-root=/run/cgroup2"], |c| {
            assert_eq!(c.ebpf.cgroup_root, "/run/cgroup2")
        }),
        (
            "devices",
            vec!["--devices=eth0,eth1", "--devices", "bond0"],
            |c| assert_eq!(c.ebpf.devices, vec!["eth0", "eth1", "bond0"]),
        ),
        ("xdp-mode", vec!["--xdp-mode=native"], |c| {
            assert_eq!(c.ebpf.xdp_mode, "native")
        }),
        (
            "socket-lb-host-namespace-only",
            vec!["--socket-lb-host-namespace-only"],
            |c| assert!(c.ebpf.socket_lb_host_namespace_only),
        ),
    ]
}

#[test]
fn every_configuration_flag_sets_its_field() {
    for (name, args, check) in mapping_cases() {
        let (config, _) = config_from(&args);
        check(&config);
        let (_, matches) = parse(&args);
        assert!(
            explicitly_set(&matches).iter().any(|f| f == name),
            "{name} not seen as set"
        );
    }
}

#[test]
fn mapping_table_covers_every_flag() {
    let runtime = [
        "config",
        "config-overrides",
        "write-config-to",
        "cleanup",
        "init-only",
        "master",
        "strict-mode",
        "source",
        "version",
    ];
    let covered: Vec<&str> = mapping_cases().iter().map(|(name, _, _)| *name).collect();
    for arg in Flags::augment_args(Command::new("t")).get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        assert!(
            covered.contains(&long) || runtime.contains(&long),
            "--{long} has no mapping test"
        );
        assert_eq!(
            runtime.contains(&long),
            flag_class(long) == FlagClass::Runtime,
            "--{long}"
        );
    }
}

#[test]
fn no_flags_give_the_defaulted_configuration() {
    let (config, warnings) = config_from(&[]);
    assert_eq!(config, crate::config::defaults::default_config());
    assert!(warnings.is_empty());
    let (_, matches) = parse(&[]);
    assert!(explicitly_set(&matches).is_empty());
}

#[test]
fn runtime_flags_parse() {
    let (flags, matches) = parse(&[
        "--config=/etc/kp.yaml",
        "--write-config-to",
        "/tmp/out.yaml",
        "--cleanup",
        "--init-only=false",
        "--master=https://10.0.0.1:6443",
        "--strict-mode",
        "--source=/srv/manifests",
    ]);
    assert_eq!(flags.config, Some(PathBuf::from("/etc/kp.yaml")));
    assert_eq!(flags.write_config_to, Some(PathBuf::from("/tmp/out.yaml")));
    assert!(flags.cleanup);
    assert!(!flags.init_only);
    assert_eq!(flags.master.as_deref(), Some("https://10.0.0.1:6443"));
    assert!(flags.strict_mode);
    assert_eq!(flags.source_dir, Some(PathBuf::from("/srv/manifests")));
    assert_eq!(
        explicitly_set(&matches),
        vec![
            "config",
            "write-config-to",
            "cleanup",
            "init-only",
            "master",
            "strict-mode",
            "source"
        ]
    );
}

#[test]
fn mode_is_an_alias_of_proxy_mode() {
    assert_eq!(config_from(&["--mode=iptables"]).0.mode, "iptables");
    assert_eq!(config_from(&["--mode", "ebpf"]).0.mode, "ebpf");
    let (_, matches) = parse(&["--mode=ipvs"]);
    assert_eq!(explicitly_set(&matches), vec!["proxy-mode"]);
}

#[test]
fn repeated_flags_keep_the_last_value_like_pflag() {
    assert_eq!(
        config_from(&["--proxy-mode=ipvs", "--mode=iptables"])
            .0
            .mode,
        "iptables"
    );
    assert_eq!(
        config_from(&["--oom-score-adj=1", "--oom-score-adj=2"])
            .0
            .oom_score_adj,
        Some(2)
    );
    assert!(!parse(&["--cleanup", "--cleanup=false"]).0.cleanup);
}

#[test]
fn verbosity_spellings() {
    for args in [
        &["-v", "3"][..],
        &["-v3"],
        &["-v=3"],
        &["--v=3"],
        &["--v", "3"],
    ] {
        assert_eq!(parse(args).0.verbosity, Some(3), "{args:?}");
    }
    assert!(parse_error(&["-v=-1"]).contains("invalid verbosity"));
}

#[test]
fn booleans_take_go_spellings_after_an_equals_sign() {
    assert_eq!(parse(&["--masquerade-all"]).0.masquerade_all, Some(true));
    assert_eq!(
        parse(&["--masquerade-all=False"]).0.masquerade_all,
        Some(false)
    );
    assert_eq!(parse(&["--masquerade-all=0"]).0.masquerade_all, Some(false));
    assert_eq!(parse(&["--masquerade-all=t"]).0.masquerade_all, Some(true));
    assert!(parse_error(&["--masquerade-all=yes"]).contains("invalid syntax"));
    // Without '=', the next word is not the flag's value.
    assert!(parse_error(&["--masquerade-all", "false"]).contains("unexpected argument"));
}

#[test]
fn ipvs_mode_seeds_its_sync_periods_like_upstream() {
    let (config, warnings) = config_from(&["--proxy-mode=ipvs"]);
    assert_eq!(config.ipvs.sync_period, Duration::from_secs(30));
    assert_eq!(config.ipvs.min_sync_period, Duration::from_secs(1));
    assert!(warnings.is_empty());
}

#[test]
fn sync_period_flags_of_the_other_mode_are_dropped_with_a_warning() {
    let (config, warnings) = config_from(&["--proxy-mode=ipvs", "--iptables-sync-period=5s"]);
    assert_eq!(config.ipvs.sync_period, Duration::from_secs(30));
    assert_eq!(config.iptables.sync_period, Duration::from_secs(30));
    assert_eq!(
        warnings,
        vec!["flag --iptables-sync-period has no effect in ipvs mode"]
    );

    let (config, warnings) = config_from(&["--ipvs-min-sync-period=5s"]);
    assert_eq!(config.ipvs.min_sync_period, Duration::ZERO);
    assert_eq!(
        warnings,
        vec!["flag --ipvs-min-sync-period has no effect in ebpf mode"]
    );
}

#[test]
fn iptables_sync_flags_feed_the_nftables_section_in_nftables_mode() {
    let (config, _) = config_from(&["--proxy-mode=nftables", "--iptables-sync-period=10s"]);
    assert_eq!(config.nftables.sync_period, Duration::from_secs(10));
    assert_eq!(config.nftables.min_sync_period, Duration::from_secs(1));
    assert_eq!(config.node_port_addresses, vec!["primary"]);
}

#[test]
fn bind_address_does_not_move_the_default_server_addresses() {
    // Upstream defaults the configuration before parsing flags, so an IPv6 bind address
    // given as a flag leaves the IPv4 wildcard defaults in place.
    let (config, _) = config_from(&["--bind-address=::1"]);
    assert_eq!(config.bind_address, "::1");
    assert_eq!(config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(config.metrics_bind_address, "127.0.0.1:10249");
}

#[test]
fn deprecated_port_flags_combine_with_bare_addresses() {
    let (config, _) = config_from(&["--metrics-bind-address=::", "--metrics-port=9000"]);
    assert_eq!(config.metrics_bind_address, "[::]:9000");
    let (config, _) = config_from(&["--healthz-port=0"]);
    assert_eq!(config.healthz_bind_address, "");
    // An address with a port keeps it.
    let (config, _) = config_from(&["--healthz-bind-address=1.2.3.4:5", "--healthz-port=6"]);
    assert_eq!(config.healthz_bind_address, "1.2.3.4:5");
    let (_, matches) = parse(&["--healthz-port=0", "--metrics-port=1"]);
    assert_eq!(
        deprecation_warnings(&explicitly_set(&matches)),
        vec![
            "Flag --healthz-port has been deprecated, it will be removed in a future release; use --healthz-bind-address instead",
            "Flag --metrics-port has been deprecated, it will be removed in a future release; use --metrics-bind-address instead",
        ]
    );
}

#[test]
fn empty_list_flags_mean_empty_lists() {
    let (config, _) = config_from(&["--proxy-mode=iptables", "--nodeport-addresses="]);
    assert!(config.node_port_addresses.is_empty());
    // ebpf (the default mode) then defaults it as nftables does: the primary IPs.
    let (config, _) = config_from(&["--nodeport-addresses="]);
    assert_eq!(config.node_port_addresses, vec!["primary"]);
}

#[test]
fn flag_values_are_checked_when_parsed() {
    assert!(
        parse_error(&["--bind-address=10.0.0.1:80"])
            .contains(r#""10.0.0.1:80" is not a valid IP address"#)
    );
    assert!(
        parse_error(&["--healthz-bind-address=host:80"])
            .contains(r#""host" is not a valid IP address"#)
    );
    assert!(
        parse_error(&["--metrics-bind-address=1.2.3.4:http"])
            .contains(r#""http" is not a valid number"#)
    );
    assert!(
        parse_error(&["--iptables-sync-period=30"])
            .contains(r#"time: missing unit in duration "30""#)
    );
    assert!(parse_error(&["--feature-gates=A"]).contains("malformed pair, expect string=bool"));
    assert!(parse_error(&["--feature-gates=A=maybe"]).contains("invalid value of A: maybe"));
    assert!(
        parse_error(&["--vmodule=proxier"])
            .contains(r#""proxier" does not have the pattern=N format"#)
    );
    assert!(parse_error(&["--oom-score-adj=lots"]).contains("invalid digit"));
}

#[test]
fn whitespace_hostname_override_is_refused() {
    let (flags, _) = parse(&["--hostname-override=   "]);
    let mut config = crate::config::defaults::default_config();
    let err = apply_hostname_override(&flags, &mut config).unwrap_err();
    assert_eq!(err.to_string(), "empty hostname-override is invalid");
}

#[test]
fn logging_flags_override_the_file_and_put_vmodule_first() {
    let (flags, _) = parse(&["-v=5", "--vmodule=a=1"]);
    let mut logging = LoggingConfiguration {
        verbosity: 1,
        format: "json".into(),
        vmodule: vec![VModuleItem {
            file_pattern: "b".into(),
            verbosity: 2,
        }],
        ..Default::default()
    };
    apply_logging_flags(&flags, &mut logging);
    assert_eq!(logging.verbosity, 5);
    assert_eq!(logging.format, "json");
    let patterns: Vec<&str> = logging
        .vmodule
        .iter()
        .map(|i| i.file_pattern.as_str())
        .collect();
    assert_eq!(patterns, vec!["a", "b"]);
}

#[test]
fn quantities_are_read_as_kubernetes_writes_them() {
    // Upstream's help says "1K", but its quantity parser (and kube-proxy) refuses it.
    for good in ["0", "512", "1k", "2Ki", "3M", "1.5Gi", "1e3", "+5", "100m"] {
        assert_eq!(parse_quantity(good).as_deref(), Ok(good), "{good}");
    }
    for bad in ["", "Ki", "1Q", "one", "1 K", "1K"] {
        assert!(parse_quantity(bad).is_err(), "{bad}");
    }
    assert!(parse_error(&["--log-text-info-buffer-size=lots"]).contains("quantities"));
}

#[test]
fn underscores_in_flag_names_are_dashes_as_for_pflag() {
    let os = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(Into::into).collect() };
    assert_eq!(
        normalize_word_separators(os(&[
            "kube-proxy",
            "--hostname_override=node_a",
            "--cluster_cidr",
            "10.0.0.0/8",
            "-v=2",
            "--",
            "--not_a_flag",
        ])),
        os(&[
            "kube-proxy",
            "--hostname-override=node_a",
            "--cluster-cidr",
            "10.0.0.0/8",
            "-v=2",
            "--",
            "--not_a_flag",
        ])
    );
}

#[test]
fn version_values_are_verflags() {
    assert_eq!(parse_version_request("true"), Ok(VersionRequest::Print));
    assert_eq!(parse_version_request("raw"), Ok(VersionRequest::Raw));
    assert_eq!(parse_version_request("false"), Ok(VersionRequest::No));
    assert_eq!(
        parse_version_request("v1.37.2-rc.1"),
        Ok(VersionRequest::Report("v1.37.2-rc.1".into()))
    );
    for bad in ["v1.2", "yes", "vX.Y.Z"] {
        assert!(parse_version_request(bad).is_err(), "{bad}");
    }
}

/// A value upstream's flag parser takes for a flag of `kind` (the type its --help names).
fn sample_value(name: &str, kind: &str) -> &'static str {
    match (name, kind) {
        ("v", _) => "2",
        ("detect-local-mode", _) => "ClusterCIDR",
        ("proxy-mode", _) => "iptables",
        ("bind-address", _) => "0.0.0.0",
        ("cluster-cidr", _) => "10.0.0.0/8",
        ("nodeport-addresses", _) => "primary",
        ("ipvs-exclude-cidrs", _) => "10.9.0.0/16",
        ("kube-api-content-type", _) => "application/json",
        ("logging-format", _) => "text",
        ("show-hidden-metrics-for-version", _) => "1.36",
        ("ipvs-scheduler", _) => "rr",
        ("version", _) => "false",
        ("oom-score-adj", _) => "-999",
        ("iptables-masquerade-bit", _) => "14",
        (_, "bool") => "true",
        (_, "duration") => "5s",
        (_, "int32") => "10",
        (_, "float32") => "5",
        (_, "ipport") => "127.0.0.1:10249",
        (_, "mapStringBool") => "LoggingAlphaOptions=true",
        (_, "pattern=N,...") => "proxier=3",
        (_, "quantity") => "2Ki",
        (_, "string") => "x",
        (other, kind) => panic!("no sample value for --{other} ({kind})"),
    }
}

/// Every flag upstream 1.37's --help lists is accepted, with a value of its type, in
/// dashes and in underscores (pflag's normalisation), so a kube-proxy DaemonSet's command
/// line starts this agent.
#[test]
fn every_flag_of_upstream_kube_proxy_is_accepted() {
    let list = include_str!("../../tests/data/upstream-kube-proxy-flags.txt");
    let mut seen = 0;
    for line in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let mut words = line.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            panic!("bad line {line:?}");
        };
        let value = sample_value(name, kind);
        for spelling in [name.to_string(), name.replace('-', "_")] {
            let arg = format!("--{spelling}={value}");
            let args = normalize_word_separators(["kube-proxy".into(), arg.clone().into()]);
            let parsed = Cli::command().try_get_matches_from(args);
            assert!(
                parsed.is_ok(),
                "{arg}: {}",
                parsed.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }
        seen += 1;
    }
    assert!(seen > 50, "only {seen} flags listed");
}

#[test]
fn the_flag_dump_shows_given_values_and_defaults_of_every_flag() {
    let (_, matches) = parse(&["--cluster-cidr=10.0.0.0/8", "--v=2"]);
    let dump = flag_dump(&matches);
    let value = |name: &str| {
        dump.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no --{name} in {dump:?}"))
    };
    assert_eq!(value("cluster-cidr"), "10.0.0.0/8");
    assert_eq!(value("v"), "2");
    assert_eq!(value("config-sync-period"), "15m0s");
    assert_eq!(value("cleanup"), "false");
    assert_eq!(value("hostname-override"), "");
    // Unset, as pflag prints its zero values; the platform defaults come later.
    assert_eq!(value("masquerade-all"), "false");
    assert_eq!(value("conntrack-udp-timeout"), "0s");
    assert_eq!(value("nodeport-addresses"), "[]");
    assert_eq!(value("proxy-mode"), "");
    assert_eq!(value("help"), "false");
    let names: Vec<&str> = dump.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.is_sorted(), "{names:?}");
    assert!(dump.len() > 50);
}
