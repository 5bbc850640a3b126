// SPDX-License-Identifier: Apache-2.0
//! End-to-end tests of `resolve`: fixtures under tests/data/config, flag precedence.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches, Parser};

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

fn data_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/config")
        .join(name)
}

fn resolve_args(args: &[&str]) -> Result<Resolved> {
    let matches = Cli::command()
        .try_get_matches_from(std::iter::once("kube-proxy").chain(args.iter().copied()))
        .unwrap_or_else(|error| panic!("{args:?}: {error}"));
    let cli = Cli::from_arg_matches(&matches).unwrap();
    resolve(&cli.flags, &matches)
}

#[test]
fn bad_fixture_reports_exactly_its_errors_one_line_each_sorted_by_path() {
    let path = data_file("bad.yaml");
    let expected = std::fs::read_to_string(data_file("bad.expected")).unwrap();
    let expected: Vec<&str> = expected.lines().collect();

    let config = load_file(&path).unwrap();
    let lines: Vec<String> = validate(&config).iter().map(ToString::to_string).collect();
    assert_eq!(lines, expected);

    let config_flag = format!("--config={}", path.display());
    let error = resolve_args(&[&config_flag]).unwrap_err();
    let printed = error.to_string();
    let printed: Vec<&str> = printed.lines().collect();
    let with_origin: Vec<String> = expected
        .iter()
        .map(|line| format!("{}: {line}", path.display()))
        .collect();
    assert_eq!(printed, with_origin);
}

#[test]
fn flags_alone_resolve_to_a_validated_configuration() {
    let resolved = resolve_args(&[
        "--proxy-mode=ipvs",
        "--ipvs-scheduler=lc",
        "--ipvs-min-sync-period=2s",
        "--cluster-cidr=10.244.0.0/16",
        "--nodeport-addresses=primary",
        "--masquerade-all",
        "--hostname-override=Worker-1",
        "-v=3",
        "--devices=eth0",
    ])
    .unwrap();
    assert!(resolved.ignored_flags.is_empty());
    assert!(resolved.warnings.is_empty(), "{:?}", resolved.warnings);
    let config = &resolved.config;
    assert_eq!(config.mode, "ipvs");
    assert_eq!(config.hostname_override, "worker-1");
    assert_eq!(config.ebpf.devices, vec!["eth0"]);
    assert_eq!(resolved.options.verbosity, 3);
    assert_eq!(resolved.options.log_format, "text");
    let effective = &resolved.effective;
    assert_eq!(effective.mode, ProxyMode::Ipvs);
    assert_eq!(effective.local_mode, LocalMode::ClusterCidr);
    assert_eq!(
        effective.cluster_cidrs,
        vec!["10.244.0.0/16".parse::<IpNet>().unwrap()]
    );
    assert!(effective.node_port_addresses.includes_primary());
    assert_eq!(
        effective.sync_periods,
        SyncPeriods {
            sync: Duration::from_secs(30),
            min_sync: Duration::from_secs(2)
        }
    );
    assert!(effective.masquerade_all);
    assert_eq!(effective.xdp_mode, XdpMode::Off);
}

#[test]
fn default_mode_is_ebpf_with_the_iptables_sync_periods() {
    let resolved = resolve_args(&[]).unwrap();
    assert_eq!(resolved.config.mode, "ebpf");
    assert_eq!(resolved.effective.mode, ProxyMode::Ebpf);
    assert_eq!(
        resolved.effective.sync_periods,
        SyncPeriods {
            sync: Duration::from_secs(30),
            min_sync: Duration::from_secs(1)
        }
    );
    assert_eq!(
        resolved.options,
        RunOptions {
            log_format: "text".into(),
            ..Default::default()
        }
    );
    // Upstream's startup checks: no cluster CIDR for ClusterCIDR detection. (No warning
    // about nodePortAddresses: ebpf mode defaults it to the primary IPs, as nftables does.)
    assert_eq!(resolved.warnings.len(), 1, "{:?}", resolved.warnings);
    assert!(
        resolved.warnings[0].starts_with("detectLocalMode is ClusterCIDR but clusterCIDR is unset")
    );
}

#[test]
fn invalid_flags_are_reported_against_the_command_line() {
    let error = resolve_args(&[
        "--proxy-mode=kernelspace",
        "--oom-score-adj=-1001",
        "--iptables-masquerade-bit=40",
    ])
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "command line: iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]\n\
         command line: mode: Invalid value: \"kernelspace\": must be ebpf, iptables, ipvs, nftables or blank (blank means the best-available proxy [currently ebpf])\n\
         command line: oomScoreAdj: Invalid value: -1001: must be within the range [-1000, 1000]"
    );
}

#[test]
fn config_file_replaces_configuration_flags_and_lists_them() {
    let config_flag = format!("--config={}", data_file("override.yaml").display());
    let resolved = resolve_args(&[
        &config_flag,
        "--proxy-mode=ipvs",
        "--mode=ipvs",
        "--cluster-cidr=10.0.0.0/8",
        "--kubeconfig=/flag/kubeconfig",
        "--bpffs-root=/flag",
        "--masquerade-all=false",
        // These still apply with --config:
        "--hostname-override=Flag-Host",
        "-v=6",
        "--vmodule=fromflag=5",
        "--log-flush-frequency=2s",
        "--cleanup",
        "--master=https://api:6443",
        "--strict-mode",
        "--source=/srv/manifests",
    ])
    .unwrap();
    assert_eq!(
        resolved.ignored_flags,
        vec![
            "--kubeconfig",
            "--proxy-mode",
            "--masquerade-all",
            "--cluster-cidr",
            "--bpffs-root"
        ]
    );
    let config = &resolved.config;
    assert_eq!(config.mode, "iptables");
    assert_eq!(config.cluster_cidr, "10.244.0.0/16");
    assert_eq!(config.client_connection.kubeconfig, "");
    assert_eq!(config.ebpf.bpffs_root, DEFAULT_BPFFS_ROOT);
    assert_eq!(config.hostname_override, "flag-host");
    assert_eq!(config.logging.verbosity, 6);
    assert_eq!(config.logging.flush_frequency, Duration::from_secs(2));
    let patterns: Vec<&str> = config
        .logging
        .vmodule
        .iter()
        .map(|i| i.file_pattern.as_str())
        .collect();
    assert_eq!(patterns, vec!["fromflag", "fromfile"]);
    assert_eq!(
        resolved.options,
        RunOptions {
            config_file: Some(data_file("override.yaml")),
            config_overrides_file: None,
            write_config_to: None,
            cleanup: true,
            init_only: false,
            master: Some("https://api:6443".into()),
            strict_mode: true,
            source_dir: Some("/srv/manifests".into()),
            verbosity: 6,
            log_format: "text".into(),
        }
    );
}

#[test]
fn config_file_keeps_its_hostname_without_the_flag() {
    let config_flag = format!("--config={}", data_file("override.yaml").display());
    let resolved = resolve_args(&[&config_flag]).unwrap();
    assert_eq!(resolved.config.hostname_override, "from-file");
    assert_eq!(resolved.config.logging.verbosity, 1);
    assert!(resolved.ignored_flags.is_empty());
}

#[test]
fn deprecated_port_flags_are_ignored_with_config_or_write_config_to() {
    let config_flag = format!("--config={}", data_file("override.yaml").display());
    let resolved = resolve_args(&[&config_flag, "--healthz-port=0"]).unwrap();
    assert_eq!(resolved.config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(resolved.ignored_flags, vec!["--healthz-port"]);
    assert!(resolved.warnings[0].starts_with("Flag --healthz-port has been deprecated"));

    let resolved = resolve_args(&["--write-config-to=/tmp/x.yaml", "--healthz-port=0"]).unwrap();
    assert_eq!(resolved.config.healthz_bind_address, "0.0.0.0:10256");
    let resolved = resolve_args(&["--healthz-port=0"]).unwrap();
    assert_eq!(resolved.config.healthz_bind_address, "");
}

/// kubeadm's `config.conf` as `kubeadm init phase addon kube-proxy --print-manifest` (1.37)
/// writes it, with this proxy's own settings laid over it.
#[test]
fn config_overrides_lay_their_fields_over_kubeadms_file() {
    let kubeadm = data_file("kubeadm-1.37.conf");
    let overrides = data_file("kubeadm-overrides.yaml");
    let alone = resolve_args(&[&format!("--config={}", kubeadm.display())]).unwrap();
    let resolved = resolve_args(&[
        &format!("--config={}", kubeadm.display()),
        &format!("--config-overrides={}", overrides.display()),
        "--hostname-override=node-a",
    ])
    .unwrap();
    assert!(resolved.warnings.is_empty(), "{:?}", resolved.warnings);
    let config = &resolved.config;
    // Written by the overrides: a field, a list, a field of a section, our own section.
    assert_eq!(config.mode, "ebpf");
    assert_eq!(config.node_port_addresses, vec!["10.0.0.0/8".to_owned()]);
    assert_eq!(config.iptables.sync_period, Duration::from_secs(10));
    assert_eq!(config.ebpf.bpffs_root, "/sys/fs/bpf/overridden");
    // Not written by them: kubeadm's, or the default where kubeadm is silent, exactly as
    // without the overrides.
    assert_eq!(config.cluster_cidr, "10.244.0.0/16");
    assert_eq!(config.cluster_cidr, alone.config.cluster_cidr);
    assert_eq!(config.client_connection, alone.config.client_connection);
    assert_eq!(
        config.iptables.masquerade_bit,
        alone.config.iptables.masquerade_bit
    );
    assert_eq!(
        config.iptables.min_sync_period,
        alone.config.iptables.min_sync_period
    );
    assert_eq!(config.detect_local_mode, "ClusterCIDR");
    assert_eq!(config.ebpf.cgroup_root, alone.config.ebpf.cgroup_root);
    assert_eq!(config.hostname_override, "node-a");
    assert_eq!(
        resolved.options.config_overrides_file.as_deref(),
        Some(overrides.as_path())
    );
}

#[test]
fn config_overrides_errors_name_their_file_and_field() {
    let dir = std::env::temp_dir().join(format!("kp-config-overrides-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("base.yaml");
    std::fs::write(
        &base,
        format!("apiVersion: {API_VERSION}\nkind: {KIND}\nnodePortAddresses: [10.0.0.0/8]\n"),
    )
    .unwrap();
    let path = dir.join("overrides.yaml");
    let resolve_with = |text: &str| {
        std::fs::write(
            &path,
            format!("apiVersion: {API_VERSION}\nkind: {KIND}\n{text}"),
        )
        .unwrap();
        resolve_args(&[
            &format!("--config={}", base.display()),
            &format!("--config-overrides={}", path.display()),
        ])
    };
    let resolved = resolve_with("ebpf:\n  bpffsRot: /x\n").unwrap();
    assert!(
        resolved.warnings.iter().any(|w| w.starts_with(&format!(
            "{}: unknown field ebpf.bpffsRot ignored",
            path.display()
        ))),
        "{:?}",
        resolved.warnings
    );
    let error = resolve_with("conntrack:\n  maxPerCore: many\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!("{}: conntrack.maxPerCore: ", path.display())),
        "{error}"
    );
    // Emptying a list the first file sets: the overrides' empty list wins.
    let emptied = resolve_with("mode: iptables\nnodePortAddresses: []\n").unwrap();
    assert!(emptied.config.node_port_addresses.is_empty());
    // Without --config there is nothing to lay them over.
    let matches = Cli::command().try_get_matches_from([
        "kube-proxy",
        &format!("--config-overrides={}", path.display()),
    ]);
    assert!(matches.is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_file_errors_name_the_file_and_the_field() {
    let dir = std::env::temp_dir().join(format!("kp-config-resolve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("typo.yaml");
    // A field this version does not know: a warning naming the file and the field.
    std::fs::write(
        &path,
        format!("apiVersion: {API_VERSION}\nkind: {KIND}\nconntrack:\n  maxPerCpu: 1\n"),
    )
    .unwrap();
    let resolved = resolve_args(&[&format!("--config={}", path.display())]).unwrap();
    assert!(
        resolved.warnings.iter().any(|w| w.starts_with(&format!(
            "{}: unknown field conntrack.maxPerCpu ignored",
            path.display()
        ))),
        "{:?}",
        resolved.warnings
    );
    // A known field with a bad value: an error naming them.
    std::fs::write(
        &path,
        format!("apiVersion: {API_VERSION}\nkind: {KIND}\nconntrack:\n  maxPerCore: many\n"),
    )
    .unwrap();
    let error = resolve_args(&[&format!("--config={}", path.display())])
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!("{}: conntrack.maxPerCore: ", path.display())),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn windows_settings_earn_one_warning() {
    let dir = std::env::temp_dir().join(format!("kp-config-winkernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("win.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: {API_VERSION}\nkind: {KIND}\nclusterCIDR: 10.0.0.0/8\nnodePortAddresses: [all]\n\
             windowsRunAsService: true\nwinkernel:\n  networkName: l2bridge\n  enableDSR: true\n"
        ),
    )
    .unwrap();
    let resolved = resolve_args(&[&format!("--config={}", path.display())]).unwrap();
    assert_eq!(
        resolved.warnings,
        vec!["winkernel and windowsRunAsService are Windows-only settings and are ignored"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn written_configuration_resolves_to_the_same_configuration() {
    let resolved = resolve_args(&[
        "--proxy-mode=iptables",
        "--cluster-cidr=10.0.0.0/8",
        "--conntrack-min=1",
    ])
    .unwrap();
    let dir = std::env::temp_dir().join(format!("kp-config-write-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.yaml");
    write_config(&path, &resolved.config).unwrap();
    let reread = resolve_args(&[&format!("--config={}", path.display())]).unwrap();
    assert_eq!(reread.config, resolved.config);
    std::fs::remove_dir_all(&dir).unwrap();
}
