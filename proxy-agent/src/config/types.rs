// SPDX-License-Identifier: Apache-2.0
//! `KubeProxyConfiguration` (kubeproxy.config.k8s.io/v1alpha1) as a file holds it.
//!
//! The field set is the union of current upstream v1alpha1 and the older struct the project
//! was seeded with (udpIdleTimeout, winkernel), plus our own `ebpf` section. Fields keep their
//! wire types: mode names and CIDRs stay strings so that a bad value is a validation error
//! with a field path (as upstream reports it) rather than a decode error. Typed views live in
//! `typed.rs`.
//!
//! Every struct refuses unknown fields (upstream decodes strictly first; see `load.rs` for
//! where we differ). `null` is accepted wherever Go's decoder accepts it and means "unset".

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use super::duration::{Duration, deserialize_string_or_nanos};

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

/// Go's JSON decoder leaves a field at its zero value when the input says `null`
/// (`hostnameOverride:` with nothing after it, `nodePortAddresses: null`).
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeProxyConfiguration {
    #[serde(deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(deserialize_with = "nullable")]
    pub kind: String,

    /// Feature names to on/off. Any name is accepted (see `validate.rs`).
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "nullable"
    )]
    pub feature_gates: BTreeMap<String, bool>,

    #[serde(deserialize_with = "nullable")]
    pub client_connection: ClientConnectionConfiguration,
    #[serde(deserialize_with = "nullable")]
    pub logging: LoggingConfiguration,

    /// Node name to use instead of the hostname.
    #[serde(deserialize_with = "nullable")]
    pub hostname_override: String,
    /// The node's primary IP as kube-proxy sees it (no socket is bound to it).
    #[serde(deserialize_with = "nullable")]
    pub bind_address: String,
    #[serde(deserialize_with = "nullable")]
    pub healthz_bind_address: String,
    #[serde(deserialize_with = "nullable")]
    pub metrics_bind_address: String,
    #[serde(deserialize_with = "nullable")]
    pub bind_address_hard_fail: bool,
    #[serde(deserialize_with = "nullable")]
    pub enable_profiling: bool,
    #[serde(deserialize_with = "nullable")]
    pub show_hidden_metrics_for_version: String,

    /// "", "ebpf", "iptables", "ipvs" (and "nftables", parsed but refused by validation).
    #[serde(deserialize_with = "nullable")]
    pub mode: String,
    #[serde(deserialize_with = "nullable")]
    pub iptables: IptablesConfiguration,
    #[serde(deserialize_with = "nullable")]
    pub ipvs: IpvsConfiguration,
    #[serde(deserialize_with = "nullable")]
    pub nftables: NftablesConfiguration,
    /// Windows-only; accepted for compatibility and otherwise ignored.
    #[serde(deserialize_with = "nullable")]
    pub winkernel: WinkernelConfiguration,

    #[serde(deserialize_with = "nullable")]
    pub detect_local_mode: String,
    #[serde(deserialize_with = "nullable")]
    pub detect_local: DetectLocalConfiguration,
    /// One CIDR or a comma-separated dual-stack pair.
    #[serde(rename = "clusterCIDR", deserialize_with = "nullable")]
    pub cluster_cidr: String,

    /// CIDRs and the keywords `primary`, `localhost`, `all`.
    #[serde(deserialize_with = "nullable")]
    pub node_port_addresses: Vec<String>,

    pub oom_score_adj: Option<i32>,
    #[serde(deserialize_with = "nullable")]
    pub conntrack: ConntrackConfiguration,
    pub config_sync_period: Duration,

    /// Unused since the userspace proxy was removed; still validated as upstream does.
    #[serde(deserialize_with = "nullable")]
    pub port_range: String,
    #[serde(skip_serializing_if = "is_false", deserialize_with = "nullable")]
    pub windows_run_as_service: bool,
    /// From the older struct (userspace proxy only); accepted, defaulted, validated.
    pub udp_idle_timeout: Duration,

    /// Ours: the eBPF dataplane.
    #[serde(deserialize_with = "nullable")]
    pub ebpf: EbpfConfiguration,
}

/// componentbaseconfig's ClientConnectionConfiguration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClientConnectionConfiguration {
    #[serde(deserialize_with = "nullable")]
    pub kubeconfig: String,
    #[serde(deserialize_with = "nullable")]
    pub accept_content_types: String,
    #[serde(deserialize_with = "nullable")]
    pub content_type: String,
    #[serde(deserialize_with = "nullable")]
    pub qps: f32,
    #[serde(deserialize_with = "nullable")]
    pub burst: i32,
}

/// logsapi's LoggingConfiguration. `options` stays a free-form object: its contents depend on
/// the log format and upstream gates them behind feature gates we do not model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoggingConfiguration {
    #[serde(
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub format: String,
    /// Upstream accepts a duration string or an integer count of nanoseconds.
    #[serde(deserialize_with = "deserialize_string_or_nanos")]
    pub flush_frequency: Duration,
    #[serde(deserialize_with = "nullable")]
    pub verbosity: u32,
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "nullable")]
    pub vmodule: Vec<VModuleItem>,
    #[serde(
        skip_serializing_if = "serde_json::Map::is_empty",
        deserialize_with = "nullable"
    )]
    pub options: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VModuleItem {
    pub file_pattern: String,
    pub verbosity: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IptablesConfiguration {
    pub masquerade_bit: Option<i32>,
    #[serde(deserialize_with = "nullable")]
    pub masquerade_all: bool,
    pub localhost_node_ports: Option<bool>,
    #[serde(rename = "snatNodeInternalIP")]
    pub snat_node_internal_ip: Option<bool>,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IpvsConfiguration {
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    #[serde(deserialize_with = "nullable")]
    pub scheduler: String,
    #[serde(rename = "excludeCIDRs", deserialize_with = "nullable")]
    pub exclude_cidrs: Vec<String>,
    #[serde(rename = "strictARP", deserialize_with = "nullable")]
    pub strict_arp: bool,
    pub tcp_timeout: Duration,
    pub tcp_fin_timeout: Duration,
    pub udp_timeout: Duration,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NftablesConfiguration {
    pub masquerade_bit: Option<i32>,
    #[serde(deserialize_with = "nullable")]
    pub masquerade_all: bool,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WinkernelConfiguration {
    #[serde(deserialize_with = "nullable")]
    pub network_name: String,
    #[serde(deserialize_with = "nullable")]
    pub source_vip: String,
    #[serde(rename = "enableDSR", deserialize_with = "nullable")]
    pub enable_dsr: bool,
    #[serde(deserialize_with = "nullable")]
    pub root_hns_endpoint_name: String,
    #[serde(deserialize_with = "nullable")]
    pub forward_health_check_vip: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DetectLocalConfiguration {
    #[serde(deserialize_with = "nullable")]
    pub bridge_interface: String,
    #[serde(deserialize_with = "nullable")]
    pub interface_name_prefix: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackConfiguration {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<Duration>,
    pub tcp_close_wait_timeout: Option<Duration>,
    #[serde(deserialize_with = "nullable")]
    pub tcp_be_liberal: bool,
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
}

/// Ours. Empty strings are defaulted (see `defaults.rs`); map sizes and the Maglev table
/// size default when absent, and an explicit 0 is a validation error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EbpfConfiguration {
    /// Directory under the BPF filesystem where maps and links are pinned.
    #[serde(deserialize_with = "nullable")]
    pub bpffs_root: String,
    /// cgroup v2 mount whose root the socket programs attach to; empty = detect.
    #[serde(deserialize_with = "nullable")]
    pub cgroup_root: String,
    /// Interfaces for the tc (and XDP) programs; empty = detect.
    #[serde(deserialize_with = "nullable")]
    pub devices: Vec<String>,
    /// "off", "generic" or "native".
    #[serde(deserialize_with = "nullable")]
    pub xdp_mode: String,
    /// Starting capacities of the maps: those that services fill grow by themselves, up
    /// to `map_size_limits` (see `proxier::ebpf::growth`).
    #[serde(deserialize_with = "nullable")]
    pub map_sizes: MapSizes,
    /// Ceilings of the maps that grow; unset: as far as the map layout allows.
    #[serde(deserialize_with = "nullable")]
    pub map_size_limits: MapSizeLimits,
    /// Lifetimes of the BPF connection tracking of north-south flows.
    #[serde(deserialize_with = "nullable")]
    pub conntrack: EbpfConntrack,
    /// How a new flow from outside the node picks its backend: "random" (the default) or
    /// "maglev" (consistent hashing of the 5-tuple, the same backend on every node). A
    /// service's `kube-proxy-ebpf.io/lb-algorithm` annotation overrides it.
    #[serde(deserialize_with = "nullable")]
    pub load_balancer_algorithm: String,
    /// Entries of each Maglev table: a prime in [251, 131071]. More entries spread flows
    /// more evenly over many backends and cost memory (4 bytes each, per table).
    pub maglev_table_size: u32,
    /// Socket-level load balancing for the node's own processes only: pods' connections
    /// keep the service address they asked for and are translated per packet on their way
    /// out of the pod. For service meshes whose sidecars redirect a pod's outbound traffic
    /// (Istio, Linkerd) and for NodeLocal DNSCache: they must see the ClusterIP.
    #[serde(rename = "socketLBHostNamespaceOnly", deserialize_with = "nullable")]
    pub socket_lb_host_namespace_only: bool,
}

impl Default for EbpfConfiguration {
    fn default() -> Self {
        Self {
            bpffs_root: String::new(),
            cgroup_root: String::new(),
            devices: Vec::new(),
            xdp_mode: String::new(),
            map_sizes: MapSizes::default(),
            map_size_limits: MapSizeLimits::default(),
            conntrack: EbpfConntrack::default(),
            load_balancer_algorithm: String::new(),
            maglev_table_size: proxy_common::maglev::DEFAULT_TABLE_SIZE,
            socket_lb_host_namespace_only: false,
        }
    }
}

/// How long a translated north-south flow is remembered after its last packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EbpfConntrack {
    /// An established TCP flow.
    pub tcp_timeout: Duration,
    /// A TCP flow after FIN or RST.
    pub tcp_closing_timeout: Duration,
    /// UDP and SCTP flows.
    pub udp_timeout: Duration,
}

impl Default for EbpfConntrack {
    fn default() -> Self {
        let secs =
            |s: u64| Duration::from_std(std::time::Duration::from_secs(s)).unwrap_or_default();
        Self {
            tcp_timeout: secs(6 * 3600),
            tcp_closing_timeout: secs(10),
            udp_timeout: secs(60),
        }
    }
}

/// max_entries of the BPF maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub rev_nat: u32,
    pub sock_rev_nat: u32,
    pub affinity: u32,
    pub conntrack: u32,
    pub source_ranges: u32,
    /// Maglev tables (of `maglevTableSize` entries each): one per distinct backend set of
    /// the frontends that use Maglev, plus one per set that changes during a sync.
    pub maglev_tables: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        use proxy_common::maps;
        // The constants are small literals; the conversions cannot truncate.
        let size = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        MapSizes {
            services: size(maps::DEFAULT_SVC_ENTRIES),
            backends: size(maps::DEFAULT_BACKEND_ENTRIES),
            rev_nat: size(maps::DEFAULT_REV_NAT_ENTRIES),
            sock_rev_nat: size(maps::DEFAULT_SOCK_REV_NAT_ENTRIES),
            affinity: size(maps::DEFAULT_AFFINITY_ENTRIES),
            conntrack: size(maps::DEFAULT_CT_ENTRIES),
            source_ranges: size(maps::DEFAULT_SRC_RANGE_ENTRIES),
            maglev_tables: size(maps::DEFAULT_MAGLEV_TABLES),
        }
    }
}

/// The most entries each map that services fill may grow to (`ebpf.mapSizeLimits`): unset,
/// as many as the map layout allows (`MAX_MAP_ENTRIES`; 65,536 for the rev_nat maps,
/// whose keys are 16-bit ids). A map at its ceiling refuses what does not fit, as a map
/// of fixed size does; setting a ceiling equal to the starting size keeps a map from
/// growing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MapSizeLimits {
    pub services: Option<u32>,
    pub backends: Option<u32>,
    pub rev_nat: Option<u32>,
    pub source_ranges: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_size_defaults_match_the_dataplane_constants() {
        assert_eq!(
            MapSizes::default(),
            MapSizes {
                services: 65536,
                backends: 65536,
                rev_nat: 65536,
                sock_rev_nat: 131072,
                affinity: 65536,
                conntrack: 131072,
                source_ranges: 16384,
                maglev_tables: 64,
            }
        );
    }

    #[test]
    fn null_means_unset() {
        let yaml = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                    hostnameOverride:\nclusterCIDR: null\nnodePortAddresses: null\nfeatureGates:\n\
                    oomScoreAdj: null\nipvs:\n  excludeCIDRs: null\nconntrack:\n  tcpEstablishedTimeout: null\n";
        let config: KubeProxyConfiguration = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(config.hostname_override, "");
        assert_eq!(config.cluster_cidr, "");
        assert!(config.node_port_addresses.is_empty());
        assert!(config.feature_gates.is_empty());
        assert_eq!(config.oom_score_adj, None);
        assert!(config.ipvs.exclude_cidrs.is_empty());
        assert_eq!(config.conntrack.tcp_established_timeout, None);
    }

    #[test]
    fn flush_frequency_accepts_nanoseconds_or_a_duration() {
        let from_number: LoggingConfiguration =
            serde_yaml::from_str("flushFrequency: 5000000000").unwrap();
        assert_eq!(from_number.flush_frequency, Duration::from_secs(5));
        let from_string: LoggingConfiguration = serde_yaml::from_str("flushFrequency: 2s").unwrap();
        assert_eq!(from_string.flush_frequency, Duration::from_secs(2));
    }

    #[test]
    fn partial_map_sizes_keep_the_other_defaults() {
        let ebpf: EbpfConfiguration =
            serde_yaml::from_str("mapSizes:\n  services: 1024\n").unwrap();
        assert_eq!(ebpf.map_sizes.services, 1024);
        assert_eq!(ebpf.map_sizes.backends, 65536);
        assert_eq!(ebpf.map_size_limits, MapSizeLimits::default());
        let ebpf: EbpfConfiguration =
            serde_yaml::from_str("mapSizeLimits:\n  revNat: 4096\n").unwrap();
        assert_eq!(ebpf.map_size_limits.rev_nat, Some(4096));
        assert_eq!(ebpf.map_size_limits.services, None);
    }
}
