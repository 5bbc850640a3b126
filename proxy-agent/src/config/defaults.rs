// SPDX-License-Identifier: Apache-2.0
//! Defaulting, in upstream's two stages:
//!
//! 1. `apply_v1alpha1_defaults` — what `SetDefaults_KubeProxyConfiguration`
//!    (pkg/proxy/apis/config/v1alpha1/defaults.go) does to a decoded file, and to the empty
//!    object the flags start from. A zero value means "unset" there, so `syncPeriod: 0s` in a
//!    file becomes 30s.
//! 2. `apply_platform_defaults` — what `platformApplyDefaults` (cmd/kube-proxy/app/
//!    server_linux.go) does after flags or the file are in: it fills the proxy mode, the
//!    detect-local mode and nftables' nodePortAddresses. Our one divergence is here: an
//!    empty mode means `ebpf`, not `iptables`, because this agent is an eBPF proxy.
//!
//! Our `ebpf` section and the older struct's `udpIdleTimeout` are defaulted in stage 1.

use super::duration::Duration;
use super::net::{append_port_if_needed, is_ipv4_like, parse_ip_sloppy};
use super::types::{API_VERSION, KIND, KubeProxyConfiguration};

/// pkg/cluster/ports: ProxyHealthzPort.
pub const PROXY_HEALTHZ_PORT: u16 = 10256;
/// pkg/cluster/ports: ProxyStatusPort (metrics).
pub const PROXY_STATUS_PORT: u16 = 10249;
/// pkg/kubelet/qos: KubeProxyOOMScoreAdj.
pub const KUBE_PROXY_OOM_SCORE_ADJ: i32 = -999;
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/kube-proxy-ebpf";
pub const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub const DEFAULT_MASQUERADE_BIT: i32 = 14;

/// Both stages: what `load_file` returns and what the flags start from.
pub fn apply_defaults(config: &mut KubeProxyConfiguration) {
    apply_v1alpha1_defaults(config);
    apply_platform_defaults(config);
}

/// The fully defaulted configuration of an empty file (or of no flags at all).
pub fn default_config() -> KubeProxyConfiguration {
    let mut config = KubeProxyConfiguration {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        ..KubeProxyConfiguration::default()
    };
    apply_defaults(&mut config);
    config
}

/// Stage 1: upstream's `SetDefaults_KubeProxyConfiguration`, plus our sections.
pub fn apply_v1alpha1_defaults(config: &mut KubeProxyConfiguration) {
    if config.bind_address.is_empty() {
        config.bind_address = "0.0.0.0".to_owned();
    }
    // Upstream picks IPv6 wildcards whenever the bind address is not IPv4, including when it
    // does not parse at all; validation then reports the bad bind address.
    let (healthz_host, metrics_host) = match parse_ip_sloppy(&config.bind_address) {
        Some(ip) if is_ipv4_like(ip) => ("0.0.0.0", "127.0.0.1"),
        _ => ("[::]", "[::1]"),
    };
    config.healthz_bind_address = if config.healthz_bind_address.is_empty() {
        format!("{healthz_host}:{PROXY_HEALTHZ_PORT}")
    } else {
        append_port_if_needed(&config.healthz_bind_address, i32::from(PROXY_HEALTHZ_PORT))
    };
    config.metrics_bind_address = if config.metrics_bind_address.is_empty() {
        format!("{metrics_host}:{PROXY_STATUS_PORT}")
    } else {
        append_port_if_needed(&config.metrics_bind_address, i32::from(PROXY_STATUS_PORT))
    };

    config.oom_score_adj.get_or_insert(KUBE_PROXY_OOM_SCORE_ADJ);

    let iptables = &mut config.iptables;
    iptables
        .masquerade_bit
        .get_or_insert(DEFAULT_MASQUERADE_BIT);
    iptables.localhost_node_ports.get_or_insert(true);
    default_if_zero(&mut iptables.sync_period, Duration::from_secs(30));
    default_if_zero(&mut iptables.min_sync_period, Duration::from_secs(1));

    // Upstream defaults only the IPVS sync period; its minSyncPeriod stays 0s.
    default_if_zero(&mut config.ipvs.sync_period, Duration::from_secs(30));

    let nftables = &mut config.nftables;
    nftables
        .masquerade_bit
        .get_or_insert(DEFAULT_MASQUERADE_BIT);
    default_if_zero(&mut nftables.sync_period, Duration::from_secs(30));
    default_if_zero(&mut nftables.min_sync_period, Duration::from_secs(1));

    default_if_zero(&mut config.udp_idle_timeout, Duration::from_millis(250));

    let conntrack = &mut config.conntrack;
    conntrack.max_per_core.get_or_insert(32 * 1024);
    conntrack.min.get_or_insert(128 * 1024);
    conntrack
        .tcp_established_timeout
        .get_or_insert(Duration::from_hours(24));
    // One hour rather than the kernel's 60s: an expired CLOSE_WAIT entry breaks SNAT of the
    // final FIN (kubernetes/kubernetes#32551).
    conntrack
        .tcp_close_wait_timeout
        .get_or_insert(Duration::from_hours(1));

    default_if_zero(&mut config.config_sync_period, Duration::from_mins(15));

    let client = &mut config.client_connection;
    if client.content_type.is_empty() {
        client.content_type = DEFAULT_CONTENT_TYPE.to_owned();
    }
    if client.qps == 0.0 {
        client.qps = 5.0;
    }
    if client.burst == 0 {
        client.burst = 10;
    }

    apply_logging_defaults(config);

    let ebpf = &mut config.ebpf;
    if ebpf.bpffs_root.is_empty() {
        ebpf.bpffs_root = DEFAULT_BPFFS_ROOT.to_owned();
    }
    if ebpf.xdp_mode.is_empty() {
        ebpf.xdp_mode = "off".to_owned();
    }
    if ebpf.load_balancer_algorithm.is_empty() {
        ebpf.load_balancer_algorithm = "random".to_owned();
    }
}

/// logsapi's `SetRecommendedLoggingConfiguration`: text format, 5s flush, and a zero
/// info-buffer size for each output format.
fn apply_logging_defaults(config: &mut KubeProxyConfiguration) {
    let logging = &mut config.logging;
    if logging.format.is_empty() {
        logging.format = "text".to_owned();
    }
    default_if_zero(&mut logging.flush_frequency, Duration::from_secs(5));
    for format in ["json", "text"] {
        let entry = logging
            .options
            .entry(format)
            .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
        if let serde_json::Value::Object(options) = entry {
            options
                .entry("infoBufferSize")
                .or_insert_with(|| serde_json::Value::String("0".to_owned()));
        }
    }
}

/// Stage 2: upstream's Linux `platformApplyDefaults`, with `ebpf` as the default mode.
/// ebpf mode takes nftables mode's default for `nodePortAddresses` (KEP-3866: NodePorts on
/// the node's primary IPs only, never on every local address): where upstream's iptables
/// and nftables modes differ, ebpf follows nftables.
pub fn apply_platform_defaults(config: &mut KubeProxyConfiguration) {
    if config.mode.is_empty() {
        config.mode = "ebpf".to_owned();
    }
    if (config.mode == "nftables" || config.mode == "ebpf") && config.node_port_addresses.is_empty()
    {
        config.node_port_addresses = vec!["primary".to_owned()];
    }
    if config.detect_local_mode.is_empty() {
        config.detect_local_mode = "ClusterCIDR".to_owned();
    }
}

fn default_if_zero(value: &mut Duration, default: Duration) {
    if value.is_zero() {
        *value = default;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::types::MapSizes;

    /// The defaulted empty configuration, field by field, against upstream. Sources:
    /// [D] pkg/proxy/apis/config/v1alpha1/defaults.go SetDefaults_KubeProxyConfiguration,
    /// [P] cmd/kube-proxy/app/server_linux.go platformApplyDefaults,
    /// [L] component-base/logs/api/v1 SetRecommendedLoggingConfiguration,
    /// [O] the older v1alpha1 defaults (udpIdleTimeout), [E] ours.
    #[test]
    fn empty_configuration_gets_upstream_defaults() {
        let c = default_config();
        assert_eq!(c.api_version, "kubeproxy.config.k8s.io/v1alpha1");
        assert_eq!(c.kind, "KubeProxyConfiguration");
        assert!(c.feature_gates.is_empty()); // [D] empty map
        assert_eq!(c.bind_address, "0.0.0.0"); // [D]
        assert_eq!(c.healthz_bind_address, "0.0.0.0:10256"); // [D] ports.ProxyHealthzPort
        assert_eq!(c.metrics_bind_address, "127.0.0.1:10249"); // [D] ports.ProxyStatusPort
        assert!(!c.bind_address_hard_fail);
        assert!(!c.enable_profiling);
        assert_eq!(c.show_hidden_metrics_for_version, "");
        assert_eq!(c.hostname_override, "");
        assert_eq!(c.oom_score_adj, Some(-999)); // [D] qos.KubeProxyOOMScoreAdj
        // clientConnection [D]
        assert_eq!(c.client_connection.kubeconfig, "");
        assert_eq!(c.client_connection.accept_content_types, "");
        assert_eq!(
            c.client_connection.content_type,
            "application/vnd.kubernetes.protobuf"
        );
        assert_eq!(c.client_connection.qps, 5.0);
        assert_eq!(c.client_connection.burst, 10);
        // iptables [D]
        assert_eq!(c.iptables.masquerade_bit, Some(14));
        assert!(!c.iptables.masquerade_all);
        assert_eq!(c.iptables.localhost_node_ports, Some(true));
        assert_eq!(c.iptables.snat_node_internal_ip, None);
        assert_eq!(c.iptables.sync_period, Duration::from_secs(30));
        assert_eq!(c.iptables.min_sync_period, Duration::from_secs(1));
        // ipvs [D]: only syncPeriod is defaulted; the scheduler stays "" (the ipvs proxier
        // applies rr).
        assert_eq!(c.ipvs.sync_period, Duration::from_secs(30));
        assert_eq!(c.ipvs.min_sync_period, Duration::ZERO);
        assert_eq!(c.ipvs.scheduler, "");
        assert!(c.ipvs.exclude_cidrs.is_empty());
        assert!(!c.ipvs.strict_arp);
        assert_eq!(c.ipvs.tcp_timeout, Duration::ZERO);
        assert_eq!(c.ipvs.tcp_fin_timeout, Duration::ZERO);
        assert_eq!(c.ipvs.udp_timeout, Duration::ZERO);
        // nftables [D]
        assert_eq!(c.nftables.masquerade_bit, Some(14));
        assert!(!c.nftables.masquerade_all);
        assert_eq!(c.nftables.sync_period, Duration::from_secs(30));
        assert_eq!(c.nftables.min_sync_period, Duration::from_secs(1));
        // conntrack [D]
        assert_eq!(c.conntrack.max_per_core, Some(32768));
        assert_eq!(c.conntrack.min, Some(131072));
        assert_eq!(
            c.conntrack.tcp_established_timeout,
            Some(Duration::from_hours(24))
        );
        assert_eq!(
            c.conntrack.tcp_close_wait_timeout,
            Some(Duration::from_hours(1))
        );
        assert!(!c.conntrack.tcp_be_liberal);
        assert_eq!(c.conntrack.udp_timeout, Duration::ZERO);
        assert_eq!(c.conntrack.udp_stream_timeout, Duration::ZERO);
        assert_eq!(c.config_sync_period, Duration::from_mins(15)); // [D]
        assert_eq!(c.udp_idle_timeout, Duration::from_millis(250)); // [O]
        assert_eq!(c.port_range, "");
        assert_eq!(c.node_port_addresses, vec!["primary".to_owned()]); // [P] nftables; [E] ebpf follows it
        assert_eq!(c.cluster_cidr, "");
        assert_eq!(c.detect_local_mode, "ClusterCIDR"); // [P]
        assert_eq!(c.detect_local.bridge_interface, "");
        assert_eq!(c.detect_local.interface_name_prefix, "");
        assert_eq!(c.mode, "ebpf"); // [P] upstream: iptables; ours: ebpf
        assert!(!c.windows_run_as_service);
        assert_eq!(c.winkernel, Default::default());
        // logging [L]
        assert_eq!(c.logging.format, "text");
        assert_eq!(c.logging.flush_frequency, Duration::from_secs(5));
        assert_eq!(c.logging.verbosity, 0);
        assert!(c.logging.vmodule.is_empty());
        assert_eq!(
            serde_json::Value::Object(c.logging.options.clone()),
            serde_json::json!({"json": {"infoBufferSize": "0"}, "text": {"infoBufferSize": "0"}})
        );
        // ebpf [E]
        assert_eq!(c.ebpf.bpffs_root, "/sys/fs/bpf/kube-proxy-ebpf");
        assert_eq!(c.ebpf.cgroup_root, "");
        assert!(c.ebpf.devices.is_empty());
        assert_eq!(c.ebpf.xdp_mode, "off");
        assert_eq!(c.ebpf.map_sizes, MapSizes::default());
        assert_eq!(c.ebpf.load_balancer_algorithm, "random");
        assert_eq!(c.ebpf.maglev_table_size, 16381);
    }

    #[test]
    fn ipv6_bind_address_selects_ipv6_wildcards() {
        let mut c = KubeProxyConfiguration {
            bind_address: "::".to_owned(),
            ..Default::default()
        };
        apply_defaults(&mut c);
        assert_eq!(c.healthz_bind_address, "[::]:10256");
        assert_eq!(c.metrics_bind_address, "[::1]:10249");

        let mut c = KubeProxyConfiguration {
            bind_address: "fd00::1".to_owned(),
            ..Default::default()
        };
        apply_defaults(&mut c);
        assert_eq!(c.healthz_bind_address, "[::]:10256");
    }

    #[test]
    fn bare_bind_ips_get_the_default_ports() {
        let mut c = KubeProxyConfiguration {
            healthz_bind_address: "10.0.0.1".to_owned(),
            metrics_bind_address: "::1".to_owned(),
            ..Default::default()
        };
        apply_defaults(&mut c);
        assert_eq!(c.healthz_bind_address, "10.0.0.1:10256");
        assert_eq!(c.metrics_bind_address, "[::1]:10249");
    }

    #[test]
    fn zero_durations_and_missing_pointers_are_defaulted_but_set_values_kept() {
        let mut c = KubeProxyConfiguration::default();
        c.iptables.sync_period = Duration::from_secs(5);
        c.iptables.masquerade_bit = Some(0);
        c.iptables.localhost_node_ports = Some(false);
        c.conntrack.max_per_core = Some(0);
        c.conntrack.tcp_established_timeout = Some(Duration::ZERO);
        c.oom_score_adj = Some(0);
        apply_defaults(&mut c);
        assert_eq!(c.iptables.sync_period, Duration::from_secs(5));
        assert_eq!(c.iptables.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.iptables.masquerade_bit, Some(0));
        assert_eq!(c.iptables.localhost_node_ports, Some(false));
        assert_eq!(c.conntrack.max_per_core, Some(0));
        assert_eq!(c.conntrack.tcp_established_timeout, Some(Duration::ZERO));
        assert_eq!(c.oom_score_adj, Some(0));
    }

    #[test]
    fn ebpf_mode_defaults_node_port_addresses_to_primary_and_iptables_keeps_all() {
        let mut c = KubeProxyConfiguration {
            mode: "ebpf".to_owned(),
            ..Default::default()
        };
        apply_defaults(&mut c);
        assert_eq!(c.node_port_addresses, vec!["primary".to_owned()]);
        for mode in ["iptables", "ipvs"] {
            let mut c = KubeProxyConfiguration {
                mode: mode.to_owned(),
                ..Default::default()
            };
            apply_defaults(&mut c);
            assert!(c.node_port_addresses.is_empty(), "{mode}");
        }
    }

    #[test]
    fn nftables_mode_defaults_node_port_addresses_to_primary() {
        let mut c = KubeProxyConfiguration {
            mode: "nftables".to_owned(),
            ..Default::default()
        };
        apply_defaults(&mut c);
        assert_eq!(c.node_port_addresses, vec!["primary".to_owned()]);

        let mut c = KubeProxyConfiguration {
            mode: "nftables".to_owned(),
            node_port_addresses: vec!["10.0.0.0/8".to_owned()],
            ..Default::default()
        };
        apply_defaults(&mut c);
        assert_eq!(c.node_port_addresses, vec!["10.0.0.0/8".to_owned()]);
    }

    #[test]
    fn defaulting_is_idempotent() {
        let once = default_config();
        let mut twice = once.clone();
        apply_defaults(&mut twice);
        assert_eq!(once, twice);
    }
}
