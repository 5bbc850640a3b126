// SPDX-License-Identifier: Apache-2.0
//! Command-line flags with kube-proxy's names, value syntax and defaults
//! (cmd/kube-proxy/app/options.go `AddFlags`), plus ours.
//!
//! Configuration flags are `Option`s with no clap default: "not given" must stay
//! distinguishable from "given the default value", both for the `--config` precedence rule
//! and because the defaults come from `defaults.rs`, the one place they are defined. Their
//! help text states the default instead.
//!
//! Go's flag syntax is kept where it differs from clap's habits: booleans take an optional
//! `=value` (`--masquerade-all`, `--iptables-localhost-nodeports=false`) with Go's spellings
//! of true/false, lists are comma-separated and may be repeated, durations are Go durations.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command};

use super::ConfigError;
use super::defaults::{PROXY_HEALTHZ_PORT, PROXY_STATUS_PORT};
use super::duration::Duration;
use super::net::{append_port_if_needed, go_atoi, parse_ip_sloppy, split_host_port};
use super::types::{KubeProxyConfiguration, LoggingConfiguration, VModuleItem};

/// The agent's flags. The binary flattens this into its own `Parser`.
///
/// As with Go's flag package, repeating a single-valued flag is not an error: the last
/// value wins (this sets `args_override_self` on the command that flattens `Flags`).
#[derive(Clone, Debug, Default, Args)]
// `about = None`: this struct's doc comment documents the type, not the program.
#[command(args_override_self = true, about = None, long_about = None)]
pub struct Flags {
    // ---- Not part of the configuration: honoured even with --config.
    /// Read the KubeProxyConfiguration (YAML or JSON) from FILE. Configuration flags are then
    /// ignored; logging flags and --hostname-override still apply.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Lay the fields of a second KubeProxyConfiguration over --config's: a field it writes
    /// replaces the first file's value, a section (`ebpf:`, `iptables:`) merges field by
    /// field. For reading kubeadm's `kube-proxy` ConfigMap as it is, with this proxy's own
    /// settings kept apart.
    #[arg(long, value_name = "FILE", requires = "config")]
    pub config_overrides: Option<PathBuf>,

    /// Write the resolved configuration to FILE as YAML and exit.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,

    /// Print the version and exit (`--version=raw`: every field of it); `--version=vX.Y.Z`
    /// runs, reporting that version.
    #[arg(long, value_name = "true|false|raw|vX.Y.Z", num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = parse_version_request)]
    pub version: Option<VersionRequest>,

    /// Remove the rules and BPF objects this proxy installs, then exit.
    #[arg(long, action = ArgAction::Set, value_parser = parse_go_bool, default_value = "false",
        num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub cleanup: bool,

    /// Do the steps that need full privileges (sysctls, mounts) and exit; a later run then
    /// only needs CAP_NET_ADMIN and CAP_BPF.
    #[arg(long, action = ArgAction::Set, value_parser = parse_go_bool, default_value = "false",
        num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub init_only: bool,

    /// API server address; overrides the one in the kubeconfig.
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,

    /// Fail instead of falling back to another proxy mode when the selected one cannot run.
    #[arg(long, action = ArgAction::Set, value_parser = parse_go_bool, default_value = "false",
        num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub strict_mode: bool,

    /// Read Services and EndpointSlices from the manifests in DIR instead of an API server.
    #[arg(long = "source", value_name = "DIR")]
    pub source_dir: Option<PathBuf>,

    // ---- API client.
    /// kubeconfig file with the API server location and credentials.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<String>,

    /// Content type of requests to the API server. [default: application/vnd.kubernetes.protobuf]
    #[arg(long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,

    /// Queries per second allowed towards the API server. [default: 5]
    #[arg(long, value_name = "QPS", allow_negative_numbers = true)]
    pub kube_api_qps: Option<f32>,

    /// Burst of queries allowed above --kube-api-qps. [default: 10]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub kube_api_burst: Option<i32>,

    // ---- Identity and servers.
    /// Node name to use instead of the hostname. Honoured even with --config.
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,

    /// The node's primary IP as this proxy should see it (no socket is bound to it).
    /// [default: 0.0.0.0]
    #[arg(long, value_name = "IP", value_parser = parse_ip_flag)]
    pub bind_address: Option<String>,

    /// Exit when a server port cannot be bound, instead of logging and carrying on.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub bind_address_hard_fail: Option<bool>,

    /// Address of the health server (/healthz, /livez); empty disables it.
    /// [default: 0.0.0.0:10256]
    #[arg(long, value_name = "IP[:PORT]", value_parser = parse_ip_port_flag)]
    pub healthz_bind_address: Option<String>,

    /// Address of the metrics server. [default: 127.0.0.1:10249]
    #[arg(long, value_name = "IP[:PORT]", value_parser = parse_ip_port_flag)]
    pub metrics_bind_address: Option<String>,

    /// Deprecated: port of the health server, 0 disables it; use --healthz-bind-address.
    /// [default: 10256]
    #[arg(long, hide = true, value_name = "PORT", allow_negative_numbers = true)]
    pub healthz_port: Option<i32>,

    /// Deprecated: port of the metrics server, 0 disables it; use --metrics-bind-address.
    /// [default: 10249]
    #[arg(long, hide = true, value_name = "PORT", allow_negative_numbers = true)]
    pub metrics_port: Option<i32>,

    /// Serve profiling data on the metrics server under /debug/pprof.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub profiling: Option<bool>,

    /// Also expose metrics hidden since this (previous minor) version, e.g. 1.32.
    #[arg(long, value_name = "MAJOR.MINOR")]
    pub show_hidden_metrics_for_version: Option<String>,

    /// Feature gates as comma-separated name=bool pairs; may be repeated.
    #[arg(long, value_name = "NAME=BOOL,...", value_parser = parse_feature_gates)]
    pub feature_gates: Vec<FeatureGates>,

    // ---- Proxy mode.
    /// Dataplane: ebpf, iptables, ipvs or nftables (unset: ebpf, where upstream's is
    /// iptables).
    #[arg(long = "proxy-mode", visible_alias = "mode", value_name = "MODE")]
    pub proxy_mode: Option<String>,

    // ---- iptables.
    /// Bit of the fwmark that marks packets to masquerade (iptables and ipvs modes), 0 to 31.
    /// [default: 14]
    #[arg(long, value_name = "BIT", allow_negative_numbers = true)]
    pub iptables_masquerade_bit: Option<i32>,

    /// Masquerade all traffic sent to Service cluster IPs; some CNI plugins need it.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub masquerade_all: Option<bool>,

    /// Allow NodePorts on 127.0.0.1 (iptables mode, IPv4 only). [default: true]
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub iptables_localhost_nodeports: Option<bool>,

    /// Interval of full resyncs in every mode but ipvs, e.g. 30s or 1m. [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub iptables_sync_period: Option<Duration>,

    /// Shortest gap between two syncs in every mode but ipvs; 0 syncs on every change.
    /// [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub iptables_min_sync_period: Option<Duration>,

    // ---- ipvs.
    /// Interval of full resyncs in ipvs mode. [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub ipvs_sync_period: Option<Duration>,

    /// Shortest gap between two syncs in ipvs mode; 0 syncs on every change. [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub ipvs_min_sync_period: Option<Duration>,

    /// IPVS scheduler (rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh); empty means rr.
    #[arg(long, value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,

    /// Ranges whose IPVS services the ipvs proxier leaves alone when cleaning up.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', action = ArgAction::Append)]
    pub ipvs_exclude_cidrs: Option<Vec<String>>,

    /// Set arp_ignore=1 and arp_announce=2 so the node does not answer ARP for kube-ipvs0
    /// addresses.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub ipvs_strict_arp: Option<bool>,

    /// IPVS idle TCP session timeout; 0 keeps the kernel's value.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub ipvs_tcp_timeout: Option<Duration>,

    /// IPVS timeout of TCP sessions after a FIN; 0 keeps the kernel's value.
    #[arg(long = "ipvs-tcpfin-timeout", value_name = "DURATION", value_parser = parse_duration_flag)]
    pub ipvs_tcpfin_timeout: Option<Duration>,

    /// IPVS UDP timeout; 0 keeps the kernel's value.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub ipvs_udp_timeout: Option<Duration>,

    // ---- Local traffic detection and addresses.
    /// How traffic from local pods is recognised: ClusterCIDR, NodeCIDR, BridgeInterface or
    /// InterfaceNamePrefix (unset: ClusterCIDR).
    #[arg(long, value_name = "MODE")]
    pub detect_local_mode: Option<String>,

    /// Bridge whose traffic is local when --detect-local-mode=BridgeInterface.
    #[arg(long, value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,

    /// Interface name prefix whose traffic is local when
    /// --detect-local-mode=InterfaceNamePrefix.
    #[arg(long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,

    /// Pod CIDR of the cluster (a dual-stack pair may be comma-separated); used by
    /// --detect-local-mode=ClusterCIDR.
    #[arg(long, value_name = "CIDR[,CIDR]")]
    pub cluster_cidr: Option<String>,

    /// Where NodePorts are served: CIDRs and the keywords primary, localhost and all. Unset
    /// means every local address.
    #[arg(long = "nodeport-addresses", value_name = "CIDR|KEYWORD,...", value_delimiter = ',',
        action = ArgAction::Append)]
    pub nodeport_addresses: Option<Vec<String>>,

    // ---- Process and conntrack.
    /// oom_score_adj of this process, -1000 to 1000. [default: -999]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,

    /// Conntrack entries to allow per CPU; 0 leaves nf_conntrack_max alone. [default: 32768]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub conntrack_max_per_core: Option<i32>,

    /// Lower bound for nf_conntrack_max regardless of the CPU count. [default: 131072]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub conntrack_min: Option<i32>,

    /// Conntrack timeout of established TCP connections; 0 keeps the kernel's value.
    /// [default: 24h0m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub conntrack_tcp_timeout_established: Option<Duration>,

    /// Conntrack timeout of TCP connections in CLOSE_WAIT. [default: 1h0m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub conntrack_tcp_timeout_close_wait: Option<Duration>,

    /// Set nf_conntrack_tcp_be_liberal=1 so out-of-window TCP packets are not marked INVALID.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub conntrack_tcp_be_liberal: Option<bool>,

    /// Conntrack timeout of unreplied UDP flows; 0 keeps the kernel's value.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub conntrack_udp_timeout: Option<Duration>,

    /// Conntrack timeout of assured UDP flows; 0 keeps the kernel's value.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub conntrack_udp_timeout_stream: Option<Duration>,

    /// How often the informers relist from the API server. [default: 15m0s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub config_sync_period: Option<Duration>,

    // ---- Logging: honoured even with --config.
    /// Log verbosity, klog's levels as kube-proxy uses them (0-3 what kube-proxy logs at
    /// V(2) and below, 4 details, 5 and above traces). [default: 0]
    #[arg(short = 'v', long = "v", value_name = "LEVEL", value_parser = parse_verbosity)]
    pub verbosity: Option<u32>,

    /// Per-file verbosity as comma-separated pattern=N pairs, the pattern a glob on the
    /// source file's name without extension; may be repeated.
    #[arg(long, value_name = "PATTERN=N,...", value_parser = parse_vmodule)]
    pub vmodule: Vec<VModule>,

    /// Log format: text or json. [default: text]
    #[arg(long, value_name = "FORMAT")]
    pub logging_format: Option<String>,

    /// Longest time between two log flushes. [default: 5s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_flag)]
    pub log_flush_frequency: Option<Duration>,

    /// (Alpha) Text format: error messages to stderr, the others to stdout. Needs the
    /// LoggingAlphaOptions feature gate.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub log_text_split_stream: Option<bool>,

    /// (Alpha) Text format with split streams: how much of the info stream may be
    /// buffered (a quantity: 512, 1k, 2Ki, 3M...; accepted, the agent does not buffer).
    /// Needs the LoggingAlphaOptions feature gate.
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity)]
    pub log_text_info_buffer_size: Option<String>,

    /// (Alpha) JSON format: error messages to stderr, the others to stdout. Needs the
    /// LoggingAlphaOptions feature gate.
    #[arg(long, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_name = "BOOL")]
    pub log_json_split_stream: Option<bool>,

    /// (Alpha) JSON format with split streams: as --log-text-info-buffer-size.
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity)]
    pub log_json_info_buffer_size: Option<String>,

    // ---- Ours: the eBPF dataplane.
    /// Directory on the BPF filesystem for pinned maps and links.
    /// [default: /sys/fs/bpf/kube-proxy-ebpf]
    #[arg(long, value_name = "DIR")]
    pub bpffs_root: Option<String>,

    /// cgroup v2 mount for the socket programs; empty detects it.
    #[arg(long, value_name = "DIR")]
    pub cgroup_root: Option<String>,

    /// Interfaces for the tc/XDP programs; empty detects them.
    #[arg(long, value_name = "IFACE,...", value_delimiter = ',', action = ArgAction::Append)]
    pub devices: Option<Vec<String>>,

    /// XDP acceleration: off, generic or native. [default: off]
    #[arg(long, value_name = "MODE")]
    pub xdp_mode: Option<String>,

    /// Socket-level load balancing for the node's own processes only; pods' connections
    /// are translated per packet (for service-mesh sidecars and NodeLocal DNSCache, which
    /// must see the ClusterIP). [default: false]
    #[arg(long = "socket-lb-host-namespace-only", value_parser = parse_go_bool,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_name = "BOOL")]
    pub socket_lb_host_namespace_only: Option<bool>,
}

/// One `--feature-gates` occurrence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates(pub BTreeMap<String, bool>);

/// One `--vmodule` occurrence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VModule(pub Vec<VModuleItem>);

/// What a flag is for, which decides whether it survives `--config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlagClass {
    /// Not a configuration field (--config, --cleanup, --master, --strict-mode...).
    Runtime,
    /// Logging; overrides the file (upstream's copyLogsFromFlags).
    Logging,
    /// Overrides the file (upstream's processHostnameOverrideFlag).
    HostnameOverride,
    /// A configuration field; ignored when --config is given.
    Config,
}

pub(crate) fn flag_class(long: &str) -> FlagClass {
    match long {
        "config" | "config-overrides" | "write-config-to" | "cleanup" | "init-only" | "master"
        | "strict-mode" | "source" | "version" => FlagClass::Runtime,
        "v"
        | "vmodule"
        | "logging-format"
        | "log-flush-frequency"
        | "log-text-split-stream"
        | "log-text-info-buffer-size"
        | "log-json-split-stream"
        | "log-json-info-buffer-size" => FlagClass::Logging,
        "hostname-override" => FlagClass::HostnameOverride,
        _ => FlagClass::Config,
    }
}

/// Every flag with its value as kube-proxy dumps them at start (`FLAG: --name="value"`,
/// sorted by name as pflag visits them, `--help` included): the value given, else the
/// default (clap's, or the `[default: X]` of its help), else what pflag prints for a flag
/// of that kind left at its zero value (`false`, `0s`, `[]`, `0`), else empty.
pub fn flag_dump(matches: &ArgMatches) -> Vec<(String, String)> {
    let command = Flags::augment_args(Command::new("flags"));
    let mut out = vec![("help".to_owned(), "false".to_owned())];
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let id = arg.get_id().as_str();
        let given =
            matches.try_get_raw(id).ok().flatten().filter(|_| {
                matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            });
        let value = match given {
            Some(values) => values
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(","),
            None if !arg.get_default_values().is_empty() => arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(","),
            None => arg
                .get_help()
                .map(ToString::to_string)
                .and_then(|help| {
                    let start = help.find("[default: ")? + "[default: ".len();
                    let end = help[start..].find(']')? + start;
                    Some(help[start..end].to_string())
                })
                .unwrap_or_else(|| zero_value(arg).to_owned()),
        };
        out.push((long.to_string(), value));
    }
    out.sort();
    out
}

/// What pflag prints for a flag of `arg`'s kind (told by its value name) at its zero
/// value.
fn zero_value(arg: &clap::Arg) -> &'static str {
    let names = arg.get_value_names().unwrap_or_default();
    let Some(name) = names.first().map(|n| n.as_str()) else {
        return "";
    };
    match name {
        "BOOL" => "false",
        "DURATION" => "0s",
        "QUANTITY" => "0",
        _ if name.starts_with("true|false") => "false",
        // A map (feature gates, vmodule) prints empty, a list `[]`.
        _ if name.contains('=') => "",
        _ if name.ends_with(",...") => "[]",
        _ => "",
    }
}

/// Long names of the flags given on the command line (or through the environment), in
/// declaration order. Defaults do not count.
pub(crate) fn explicitly_set(matches: &ArgMatches) -> Vec<String> {
    let command = Flags::augment_args(Command::new("flags"));
    let present: Vec<&str> = matches.ids().map(|id| id.as_str()).collect();
    command
        .get_arguments()
        .filter(|arg| present.contains(&arg.get_id().as_str()))
        .filter(|arg| {
            matches!(
                matches.value_source(arg.get_id().as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .collect()
}

/// Warnings for deprecated flags that were used, in pflag's wording.
pub(crate) fn deprecation_warnings(set_flags: &[String]) -> Vec<String> {
    let mut warnings = Vec::new();
    for (flag, replacement) in [
        ("healthz-port", "healthz-bind-address"),
        ("metrics-port", "metrics-bind-address"),
    ] {
        if set_flags.iter().any(|f| f == flag) {
            warnings.push(format!(
                "Flag --{flag} has been deprecated, it will be removed in a future release; use --{replacement} instead"
            ));
        }
    }
    warnings
}

/// Applies the configuration flags to a stage-1-defaulted configuration, as upstream does
/// when no --config is given. Returns warnings for flags that have no effect.
pub(crate) fn apply_config_flags(
    flags: &Flags,
    config: &mut KubeProxyConfiguration,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(mode) = &flags.proxy_mode {
        config.mode = mode.clone();
    }
    apply_sync_period_flags(flags, config, &mut warnings);

    let client = &mut config.client_connection;
    set(&mut client.kubeconfig, &flags.kubeconfig);
    set(&mut client.content_type, &flags.kube_api_content_type);
    set(&mut client.qps, &flags.kube_api_qps);
    set(&mut client.burst, &flags.kube_api_burst);

    set(&mut config.bind_address, &flags.bind_address);
    set(
        &mut config.bind_address_hard_fail,
        &flags.bind_address_hard_fail,
    );
    set(
        &mut config.healthz_bind_address,
        &flags.healthz_bind_address,
    );
    set(
        &mut config.metrics_bind_address,
        &flags.metrics_bind_address,
    );
    set(&mut config.enable_profiling, &flags.profiling);
    set(
        &mut config.show_hidden_metrics_for_version,
        &flags.show_hidden_metrics_for_version,
    );
    for gates in &flags.feature_gates {
        config
            .feature_gates
            .extend(gates.0.iter().map(|(name, on)| (name.clone(), *on)));
    }

    // One flag for the mark bit, read from the section of the running mode (as
    // masqueradeAll below).
    if let Some(bit) = flags.iptables_masquerade_bit {
        config.iptables.masquerade_bit = Some(bit);
        config.nftables.masquerade_bit = Some(bit);
    }
    // Upstream keeps one masqueradeAll and reads it from the section of the running mode.
    if let Some(all) = flags.masquerade_all {
        config.iptables.masquerade_all = all;
        config.nftables.masquerade_all = all;
    }
    if let Some(localhost) = flags.iptables_localhost_nodeports {
        config.iptables.localhost_node_ports = Some(localhost);
    }

    let ipvs = &mut config.ipvs;
    set(&mut ipvs.scheduler, &flags.ipvs_scheduler);
    if let Some(cidrs) = &flags.ipvs_exclude_cidrs {
        ipvs.exclude_cidrs = string_list(cidrs);
    }
    set(&mut ipvs.strict_arp, &flags.ipvs_strict_arp);
    set(&mut ipvs.tcp_timeout, &flags.ipvs_tcp_timeout);
    set(&mut ipvs.tcp_fin_timeout, &flags.ipvs_tcpfin_timeout);
    set(&mut ipvs.udp_timeout, &flags.ipvs_udp_timeout);

    set(&mut config.detect_local_mode, &flags.detect_local_mode);
    set(
        &mut config.detect_local.bridge_interface,
        &flags.pod_bridge_interface,
    );
    set(
        &mut config.detect_local.interface_name_prefix,
        &flags.pod_interface_name_prefix,
    );
    set(&mut config.cluster_cidr, &flags.cluster_cidr);
    if let Some(addresses) = &flags.nodeport_addresses {
        config.node_port_addresses = string_list(addresses);
    }

    if let Some(adj) = flags.oom_score_adj {
        config.oom_score_adj = Some(adj);
    }
    let conntrack = &mut config.conntrack;
    if let Some(max) = flags.conntrack_max_per_core {
        conntrack.max_per_core = Some(max);
    }
    if let Some(min) = flags.conntrack_min {
        conntrack.min = Some(min);
    }
    if let Some(timeout) = flags.conntrack_tcp_timeout_established {
        conntrack.tcp_established_timeout = Some(timeout);
    }
    if let Some(timeout) = flags.conntrack_tcp_timeout_close_wait {
        conntrack.tcp_close_wait_timeout = Some(timeout);
    }
    set(
        &mut conntrack.tcp_be_liberal,
        &flags.conntrack_tcp_be_liberal,
    );
    set(&mut conntrack.udp_timeout, &flags.conntrack_udp_timeout);
    set(
        &mut conntrack.udp_stream_timeout,
        &flags.conntrack_udp_timeout_stream,
    );
    set(&mut config.config_sync_period, &flags.config_sync_period);

    let ebpf = &mut config.ebpf;
    set(&mut ebpf.bpffs_root, &flags.bpffs_root);
    set(&mut ebpf.cgroup_root, &flags.cgroup_root);
    if let Some(devices) = &flags.devices {
        ebpf.devices = string_list(devices);
    }
    set(&mut ebpf.xdp_mode, &flags.xdp_mode);
    set(
        &mut ebpf.socket_lb_host_namespace_only,
        &flags.socket_lb_host_namespace_only,
    );
    warnings
}

/// Upstream holds a single sync-period pair internally, seeded from the iptables defaults
/// (30s / 1s) and fed by `--iptables-*` in every mode but ipvs and by `--ipvs-*` in ipvs
/// mode; the other pair of flags is silently dropped. Here the pair lives in the section of
/// the selected mode, so that section is seeded the same way before the flags apply, and a
/// dropped flag earns a warning.
fn apply_sync_period_flags(
    flags: &Flags,
    config: &mut KubeProxyConfiguration,
    warnings: &mut Vec<String>,
) {
    let (seed_sync, seed_min) = (config.iptables.sync_period, config.iptables.min_sync_period);
    let is_ipvs = config.mode == "ipvs";
    let (sync, min_sync) = match config.mode.as_str() {
        "ipvs" => (
            &mut config.ipvs.sync_period,
            &mut config.ipvs.min_sync_period,
        ),
        "nftables" => (
            &mut config.nftables.sync_period,
            &mut config.nftables.min_sync_period,
        ),
        _ => (
            &mut config.iptables.sync_period,
            &mut config.iptables.min_sync_period,
        ),
    };
    (*sync, *min_sync) = (seed_sync, seed_min);
    let (used, dropped) = if is_ipvs {
        (
            [&flags.ipvs_sync_period, &flags.ipvs_min_sync_period],
            [
                ("iptables-sync-period", flags.iptables_sync_period.is_some()),
                (
                    "iptables-min-sync-period",
                    flags.iptables_min_sync_period.is_some(),
                ),
            ],
        )
    } else {
        (
            [&flags.iptables_sync_period, &flags.iptables_min_sync_period],
            [
                ("ipvs-sync-period", flags.ipvs_sync_period.is_some()),
                ("ipvs-min-sync-period", flags.ipvs_min_sync_period.is_some()),
            ],
        )
    };
    set(sync, used[0]);
    set(min_sync, used[1]);
    let mode = if config.mode.is_empty() {
        "ebpf"
    } else {
        config.mode.as_str()
    };
    for (flag, given) in dropped {
        if given {
            warnings.push(format!("flag --{flag} has no effect in {mode} mode"));
        }
    }
}

/// Logging flags override the matching fields; `--vmodule` entries go before the file's
/// (upstream's copyLogsFromFlags).
pub(crate) fn apply_logging_flags(flags: &Flags, logging: &mut LoggingConfiguration) {
    set(&mut logging.verbosity, &flags.verbosity);
    set(&mut logging.format, &flags.logging_format);
    set(&mut logging.flush_frequency, &flags.log_flush_frequency);
    // component-base's logging options: `options.text` / `options.json`.
    let stream_options = [
        (
            "text",
            flags.log_text_split_stream,
            &flags.log_text_info_buffer_size,
        ),
        (
            "json",
            flags.log_json_split_stream,
            &flags.log_json_info_buffer_size,
        ),
    ];
    for (format, split, buffer) in stream_options {
        let mut set_option = |key: &str, value: serde_json::Value| {
            let section = logging
                .options
                .entry(format)
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if !section.is_object() {
                *section = serde_json::Value::Object(Default::default());
            }
            if let Some(section) = section.as_object_mut() {
                section.insert(key.to_string(), value);
            }
        };
        if let Some(split) = split {
            set_option("splitStream", serde_json::Value::Bool(split));
        }
        if let Some(size) = buffer {
            set_option("infoBufferSize", serde_json::Value::String(size.clone()));
        }
    }
    if !flags.vmodule.is_empty() {
        let mut items: Vec<VModuleItem> = flags
            .vmodule
            .iter()
            .flat_map(|v| v.0.iter().cloned())
            .collect();
        items.append(&mut logging.vmodule);
        logging.vmodule = items;
    }
}

/// A resource quantity as Kubernetes writes one (`512`, `1k`, `2Ki`, `3M`, `1.5Gi`,
/// `1e3`): what upstream's `--log-*-info-buffer-size` take.
fn parse_quantity(text: &str) -> Result<String, String> {
    const SUFFIXES: &[&str] = &[
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E", "",
    ];
    let trimmed = text.trim();
    let number_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(number_end);
    let number_ok = number.parse::<f64>().is_ok_and(f64::is_finite);
    let suffix_ok = SUFFIXES.contains(&suffix)
        || suffix
            .strip_prefix(['e', 'E'])
            .is_some_and(|exponent| exponent.parse::<i32>().is_ok());
    if number_ok && suffix_ok {
        Ok(trimmed.to_string())
    } else {
        Err(format!(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {text:?})"
        ))
    }
}

/// `--hostname-override` wins over the file; upstream trims and lowercases it and refuses a
/// value that is only whitespace.
pub(crate) fn apply_hostname_override(
    flags: &Flags,
    config: &mut KubeProxyConfiguration,
) -> Result<(), ConfigError> {
    let Some(name) = flags
        .hostname_override
        .as_deref()
        .filter(|name| !name.is_empty())
    else {
        return Ok(());
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(ConfigError::Flag(
            "empty hostname-override is invalid".to_owned(),
        ));
    }
    config.hostname_override = name.to_lowercase();
    Ok(())
}

/// The deprecated `--healthz-port` / `--metrics-port` (default 10256 / 10249): port 0
/// disables the server, otherwise the port is added to a bind address that has none.
pub(crate) fn apply_deprecated_port_flags(flags: &Flags, config: &mut KubeProxyConfiguration) {
    let healthz_port = flags.healthz_port.unwrap_or(i32::from(PROXY_HEALTHZ_PORT));
    let metrics_port = flags.metrics_port.unwrap_or(i32::from(PROXY_STATUS_PORT));
    config.healthz_bind_address =
        address_from_port_flag(&config.healthz_bind_address, healthz_port);
    config.metrics_bind_address =
        address_from_port_flag(&config.metrics_bind_address, metrics_port);
}

fn address_from_port_flag(address: &str, port: i32) -> String {
    if port == 0 {
        String::new()
    } else {
        append_port_if_needed(address, port)
    }
}

fn set<T: Clone>(field: &mut T, flag: &Option<T>) {
    if let Some(value) = flag {
        *field = value.clone();
    }
}

/// pflag's string slices read `--flag=` as an empty list rather than one empty entry.
fn string_list(values: &[String]) -> Vec<String> {
    if values.len() == 1 && values[0].is_empty() {
        Vec::new()
    } else {
        values.to_vec()
    }
}

/// `strconv.ParseBool`.
/// `--version`'s value, as component-base's verflag reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionRequest {
    /// `--version` or `--version=true`: print the version and exit.
    Print,
    /// `--version=raw`: print the version's every field and exit.
    Raw,
    /// `--version=false`: run.
    No,
    /// `--version=vX.Y.Z`: run, reporting this version (upstream's dynamic version, which
    /// must keep the binary's major, minor and patch).
    Report(String),
}

/// Parses `--version=VALUE` (see [`VersionRequest`]).
pub fn parse_version_request(value: &str) -> Result<VersionRequest, String> {
    if value == "raw" {
        return Ok(VersionRequest::Raw);
    }
    if let Some(rest) = value.strip_prefix('v') {
        let core = rest.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        if parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.parse::<u64>().is_ok())
        {
            return Ok(VersionRequest::Report(value.to_string()));
        }
        return Err(format!("could not parse {value:?} as a version"));
    }
    parse_go_bool(value).map(|print| {
        if print {
            VersionRequest::Print
        } else {
            VersionRequest::No
        }
    })
}

/// kube-proxy's flag names are normalised as pflag's WordSepNormalizeFunc does:
/// `--hostname_override` is `--hostname-override`. Only the name of a `--name[=value]`
/// argument changes, and nothing after a bare `--`.
pub fn normalize_word_separators<I>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    let mut out = Vec::new();
    let mut flags_done = false;
    for arg in args {
        if flags_done {
            out.push(arg);
            continue;
        }
        match arg.to_str() {
            Some("--") => {
                flags_done = true;
                out.push(arg);
            }
            Some(text) if text.starts_with("--") && text.contains('_') => {
                let (name, value) = match text.find('=') {
                    Some(at) => text.split_at(at),
                    None => (text, ""),
                };
                out.push(format!("{}{value}", name.replace('_', "-")).into());
            }
            _ => out.push(arg),
        }
    }
    out
}

fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "strconv.ParseBool: parsing {value:?}: invalid syntax"
        )),
    }
}

fn parse_duration_flag(value: &str) -> Result<Duration, String> {
    value
        .parse()
        .map_err(|error: super::duration::DurationParseError| error.to_string())
}

/// upstream's IPVar: empty or an IP.
fn parse_ip_flag(value: &str) -> Result<String, String> {
    if value.is_empty() || parse_ip_sloppy(value).is_some() {
        return Ok(value.to_owned());
    }
    Err(format!("{value:?} is not a valid IP address"))
}

/// upstream's IPPortVar: empty, an IP, or IP:port.
fn parse_ip_port_flag(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        return Ok(String::new());
    }
    if parse_ip_sloppy(value).is_some() {
        return Ok(value.to_owned());
    }
    let (host, port) = split_host_port(value)
        .ok_or_else(|| format!("{value:?} is not in a valid format (ip or ip:port)"))?;
    if parse_ip_sloppy(host).is_none() {
        return Err(format!("{host:?} is not a valid IP address"));
    }
    if !matches!(go_atoi(port), Some(0..=65535)) {
        return Err(format!("{port:?} is not a valid number"));
    }
    Ok(value.to_owned())
}

/// cliflag's MapStringBool: `name=bool` pairs separated by commas.
fn parse_feature_gates(value: &str) -> Result<FeatureGates, String> {
    let mut gates = BTreeMap::new();
    for pair in value.split(',') {
        let (name, on) = pair
            .split_once('=')
            .ok_or("malformed pair, expect string=bool")?;
        let (name, on) = (name.trim(), on.trim());
        let on = parse_go_bool(on)
            .map_err(|error| format!("invalid value of {name}: {on}, err: {error}"))?;
        gates.insert(name.to_owned(), on);
    }
    Ok(FeatureGates(gates))
}

/// klog's verbosity: an unsigned number below 2^31.
fn parse_verbosity(value: &str) -> Result<u32, String> {
    value
        .parse::<u32>()
        .ok()
        .filter(|level| *level <= i32::MAX.unsigned_abs())
        .ok_or_else(|| {
            format!(
                "invalid verbosity {value:?}: must be an integer from 0 to {}",
                i32::MAX
            )
        })
}

/// logsapi's VModuleConfiguration: `pattern=N` items separated by commas; empty items are
/// skipped.
fn parse_vmodule(value: &str) -> Result<VModule, String> {
    let mut items = Vec::new();
    for item in value.split(',').filter(|item| !item.is_empty()) {
        let parts: Vec<&str> = item.split('=').collect();
        let [pattern, level] = parts.as_slice() else {
            return Err(format!("{item:?} does not have the pattern=N format"));
        };
        if pattern.is_empty() || level.is_empty() {
            return Err(format!("{item:?} does not have the pattern=N format"));
        }
        let verbosity = parse_verbosity(level)
            .map_err(|error| format!("parsing verbosity in {item:?}: {error}"))?;
        items.push(VModuleItem {
            file_pattern: (*pattern).to_owned(),
            verbosity,
        });
    }
    Ok(VModule(items))
}

#[cfg(test)]
#[path = "flags_tests.rs"]
mod tests;
