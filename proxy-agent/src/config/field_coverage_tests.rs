// SPDX-License-Identifier: Apache-2.0
//! Every field of the configuration file, through the loader as the agent runs it (decode,
//! default, validate): a value of the wrong type is refused at decoding, naming the field;
//! a value out of range or of a bad format is refused by validation, naming the field — or,
//! where upstream accepts any value, is accepted. Both tables must name every field the
//! file can hold: a field added without cases here fails `tables_cover_every_field`.

use std::collections::BTreeSet;
use std::path::Path;

use serde_yaml::{Mapping, Value};

use super::{ConfigError, apply_defaults, apply_platform_defaults, parse_str, validate};
use crate::config::MAX_MAP_ENTRIES;
use crate::config::defaults::default_config;

/// (field path, a YAML value of the wrong type for it).
const WRONG_TYPE: &[(&str, &str)] = &[
    ("featureGates", "[1]"),
    ("clientConnection.kubeconfig", "[1]"),
    ("clientConnection.acceptContentTypes", "{a: 1}"),
    ("clientConnection.contentType", "[1]"),
    ("clientConnection.qps", "fast"),
    ("clientConnection.burst", "1.5"),
    ("logging.format", "[json]"),
    ("logging.flushFrequency", "[5s]"),
    ("logging.verbosity", "-1"),
    ("logging.vmodule", "7"),
    ("logging.options", "7"),
    ("hostnameOverride", "[node]"),
    ("bindAddress", "{ip: 1}"),
    ("healthzBindAddress", "[1]"),
    ("metricsBindAddress", "[1]"),
    ("bindAddressHardFail", "sometimes"),
    ("enableProfiling", "\"yes\""),
    ("showHiddenMetricsForVersion", "[1]"),
    ("mode", "[ebpf]"),
    ("iptables.masqueradeBit", "fourteen"),
    ("iptables.masqueradeAll", "7"),
    ("iptables.localhostNodePorts", "\"true\""),
    ("iptables.snatNodeInternalIP", "[]"),
    ("iptables.syncPeriod", "[30s]"),
    ("iptables.minSyncPeriod", "true"),
    ("ipvs.syncPeriod", "[30s]"),
    ("ipvs.minSyncPeriod", "{}"),
    ("ipvs.scheduler", "[rr]"),
    ("ipvs.excludeCIDRs", "10.0.0.0/8"),
    ("ipvs.strictARP", "strict"),
    ("ipvs.tcpTimeout", "[1]"),
    ("ipvs.tcpFinTimeout", "[1]"),
    ("ipvs.udpTimeout", "[1]"),
    ("nftables.masqueradeBit", "\"14\""),
    ("nftables.masqueradeAll", "[]"),
    ("nftables.syncPeriod", "[1]"),
    ("nftables.minSyncPeriod", "[1]"),
    ("winkernel.networkName", "[1]"),
    ("winkernel.sourceVip", "[1]"),
    ("winkernel.enableDSR", "dsr"),
    ("winkernel.rootHnsEndpointName", "[1]"),
    ("winkernel.forwardHealthCheckVip", "[1]"),
    ("detectLocalMode", "[1]"),
    ("detectLocal.bridgeInterface", "[1]"),
    ("detectLocal.interfaceNamePrefix", "[1]"),
    ("clusterCIDR", "[10.0.0.0/8]"),
    ("nodePortAddresses", "primary"),
    ("oomScoreAdj", "low"),
    ("conntrack.maxPerCore", "many"),
    ("conntrack.min", "2147483648"),
    ("conntrack.tcpEstablishedTimeout", "[1]"),
    ("conntrack.tcpCloseWaitTimeout", "[1]"),
    ("conntrack.tcpBeLiberal", "liberal"),
    ("conntrack.udpTimeout", "[1]"),
    ("conntrack.udpStreamTimeout", "[1]"),
    ("configSyncPeriod", "[1]"),
    ("portRange", "[1]"),
    ("windowsRunAsService", "[1]"),
    ("udpIdleTimeout", "[1]"),
    ("ebpf.bpffsRoot", "[1]"),
    ("ebpf.cgroupRoot", "[1]"),
    ("ebpf.devices", "eth0"),
    ("ebpf.xdpMode", "[1]"),
    ("ebpf.mapSizes.services", "-1"),
    ("ebpf.mapSizes.backends", "big"),
    ("ebpf.mapSizes.revNat", "4294967296"),
    ("ebpf.mapSizes.sockRevNat", "[1]"),
    ("ebpf.mapSizes.affinity", "1.5"),
    ("ebpf.mapSizes.conntrack", "true"),
    ("ebpf.mapSizes.sourceRanges", "{}"),
    ("ebpf.mapSizeLimits.services", "-1"),
    ("ebpf.mapSizeLimits.backends", "[1]"),
    ("ebpf.mapSizeLimits.revNat", "lots"),
    ("ebpf.mapSizeLimits.sourceRanges", "1.5"),
    ("ebpf.conntrack.tcpTimeout", "[1]"),
    ("ebpf.conntrack.tcpClosingTimeout", "[1]"),
    ("ebpf.conntrack.udpTimeout", "[1]"),
    ("ebpf.mapSizes.maglevTables", "many"),
    ("ebpf.loadBalancerAlgorithm", "[maglev]"),
    ("ebpf.maglevTableSize", "-1"),
    ("ebpf.socketLBHostNamespaceOnly", "only"),
];

/// What validation makes of a well-typed value out of range or of a bad format.
enum Bad {
    /// Refused; the error names this field (or an entry of it).
    Refused(&'static str),
    /// Accepted: upstream puts no constraint on the field.
    Accepted,
}

/// Other settings a case needs, as (field path, YAML value).
type Context = &'static [(&'static str, &'static str)];

/// (field path, a bad-but-well-typed YAML value, other settings it needs, outcome).
const OUT_OF_RANGE: &[(&str, &str, Context, Bad)] = &[
    // Gate names are not interpreted by this agent (a documented difference).
    ("featureGates", "{NoSuchGate: true}", &[], Bad::Accepted),
    ("clientConnection.kubeconfig", "\"\"", &[], Bad::Accepted),
    (
        "clientConnection.acceptContentTypes",
        "\"x/☃\"",
        &[],
        Bad::Accepted,
    ),
    (
        "clientConnection.contentType",
        "\"x/☃\"",
        &[],
        Bad::Accepted,
    ),
    ("clientConnection.qps", "-5", &[], Bad::Accepted),
    (
        "clientConnection.burst",
        "-1",
        &[],
        Bad::Refused("clientConnection.burst"),
    ),
    ("logging.format", "xml", &[], Bad::Refused("logging.format")),
    ("logging.flushFrequency", "1ns", &[], Bad::Accepted),
    (
        "logging.verbosity",
        "2147483648",
        &[],
        Bad::Refused("logging.verbosity"),
    ),
    (
        "logging.vmodule",
        "[{filePattern: \"a=b\", verbosity: 1}]",
        &[],
        Bad::Refused("logging.vmodule"),
    ),
    (
        "logging.options",
        "{json: {infoBufferSize: \"0\"}}",
        &[],
        Bad::Accepted,
    ),
    ("hostnameOverride", "\"Not A Hostname\"", &[], Bad::Accepted),
    ("bindAddress", "\"1.2.3\"", &[], Bad::Refused("bindAddress")),
    (
        "healthzBindAddress",
        "\"0.0.0.0:99999\"",
        &[],
        Bad::Refused("healthzBindAddress"),
    ),
    (
        "metricsBindAddress",
        "\"localhost:10249\"",
        &[],
        Bad::Refused("metricsBindAddress"),
    ),
    ("bindAddressHardFail", "true", &[], Bad::Accepted),
    ("enableProfiling", "true", &[], Bad::Accepted),
    (
        "showHiddenMetricsForVersion",
        "\"v1\"",
        &[],
        Bad::Refused("showHiddenMetricsForVersion"),
    ),
    ("mode", "userspace", &[], Bad::Refused("mode")),
    (
        "iptables.masqueradeBit",
        "32",
        &[],
        Bad::Refused("iptables.masqueradeBit"),
    ),
    ("iptables.masqueradeAll", "true", &[], Bad::Accepted),
    ("iptables.localhostNodePorts", "false", &[], Bad::Accepted),
    ("iptables.snatNodeInternalIP", "true", &[], Bad::Accepted),
    (
        "iptables.syncPeriod",
        "-1s",
        &[],
        Bad::Refused("iptables.syncPeriod"),
    ),
    (
        "iptables.minSyncPeriod",
        "-1s",
        &[],
        Bad::Refused("iptables.minSyncPeriod"),
    ),
    (
        "ipvs.syncPeriod",
        "-1s",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.syncPeriod"),
    ),
    (
        "ipvs.minSyncPeriod",
        "-1s",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.minSyncPeriod"),
    ),
    (
        "ipvs.scheduler",
        "fastest",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.scheduler"),
    ),
    (
        "ipvs.excludeCIDRs",
        "[10.0.0.0/33]",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.excludeCIDRs"),
    ),
    ("ipvs.strictARP", "true", &[("mode", "ipvs")], Bad::Accepted),
    (
        "ipvs.tcpTimeout",
        "-1s",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.tcpTimeout"),
    ),
    (
        "ipvs.tcpFinTimeout",
        "-1s",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.tcpFinTimeout"),
    ),
    (
        "ipvs.udpTimeout",
        "-1s",
        &[("mode", "ipvs")],
        Bad::Refused("ipvs.udpTimeout"),
    ),
    (
        "nftables.masqueradeBit",
        "-1",
        &[("mode", "nftables")],
        Bad::Refused("nftables.masqueradeBit"),
    ),
    ("nftables.masqueradeAll", "true", &[], Bad::Accepted),
    (
        "nftables.syncPeriod",
        "-1s",
        &[("mode", "nftables")],
        Bad::Refused("nftables.syncPeriod"),
    ),
    (
        "nftables.minSyncPeriod",
        "-1s",
        &[("mode", "nftables")],
        Bad::Refused("nftables.minSyncPeriod"),
    ),
    // Windows-only settings are ignored here (with a warning).
    ("winkernel.networkName", "\"☃\"", &[], Bad::Accepted),
    ("winkernel.sourceVip", "\"not an ip\"", &[], Bad::Accepted),
    ("winkernel.enableDSR", "true", &[], Bad::Accepted),
    ("winkernel.rootHnsEndpointName", "\"☃\"", &[], Bad::Accepted),
    (
        "winkernel.forwardHealthCheckVip",
        "true",
        &[],
        Bad::Accepted,
    ),
    (
        "detectLocalMode",
        "Magic",
        &[],
        Bad::Refused("detectLocalMode"),
    ),
    (
        "detectLocal.bridgeInterface",
        "\"\"",
        &[("detectLocalMode", "BridgeInterface")],
        Bad::Refused("detectLocal.bridgeInterface"),
    ),
    (
        "detectLocal.interfaceNamePrefix",
        "\"\"",
        &[("detectLocalMode", "InterfaceNamePrefix")],
        Bad::Refused("detectLocal.interfaceNamePrefix"),
    ),
    (
        "clusterCIDR",
        "10.0.0.0/33",
        &[("detectLocalMode", "ClusterCIDR")],
        Bad::Refused("clusterCIDR"),
    ),
    (
        "nodePortAddresses",
        "[\"10.0.0.1\"]",
        &[],
        Bad::Refused("nodePortAddresses"),
    ),
    ("oomScoreAdj", "1001", &[], Bad::Refused("oomScoreAdj")),
    (
        "conntrack.maxPerCore",
        "-1",
        &[],
        Bad::Refused("conntrack.maxPerCore"),
    ),
    ("conntrack.min", "-1", &[], Bad::Refused("conntrack.min")),
    (
        "conntrack.tcpEstablishedTimeout",
        "-1s",
        &[],
        Bad::Refused("conntrack.tcpEstablishedTimeout"),
    ),
    (
        "conntrack.tcpCloseWaitTimeout",
        "-1s",
        &[],
        Bad::Refused("conntrack.tcpCloseWaitTimeout"),
    ),
    ("conntrack.tcpBeLiberal", "true", &[], Bad::Accepted),
    (
        "conntrack.udpTimeout",
        "-1s",
        &[],
        Bad::Refused("conntrack.udpTimeout"),
    ),
    (
        "conntrack.udpStreamTimeout",
        "-1s",
        &[],
        Bad::Refused("conntrack.udpStreamTimeout"),
    ),
    (
        "configSyncPeriod",
        "-1s",
        &[],
        Bad::Refused("configSyncPeriod"),
    ),
    ("portRange", "\"2000-300\"", &[], Bad::Refused("portRange")),
    ("windowsRunAsService", "true", &[], Bad::Accepted),
    ("udpIdleTimeout", "-1s", &[], Bad::Refused("udpIdleTimeout")),
    (
        "ebpf.bpffsRoot",
        "relative/path",
        &[],
        Bad::Refused("ebpf.bpffsRoot"),
    ),
    (
        "ebpf.cgroupRoot",
        "relative/path",
        &[],
        Bad::Refused("ebpf.cgroupRoot"),
    ),
    (
        "ebpf.devices",
        "[\"a-name-longer-than-15\"]",
        &[],
        Bad::Refused("ebpf.devices"),
    ),
    ("ebpf.xdpMode", "turbo", &[], Bad::Refused("ebpf.xdpMode")),
    (
        "ebpf.mapSizes.services",
        "0",
        &[],
        Bad::Refused("ebpf.mapSizes.services"),
    ),
    (
        "ebpf.mapSizes.backends",
        "TOO_BIG",
        &[],
        Bad::Refused("ebpf.mapSizes.backends"),
    ),
    (
        "ebpf.mapSizes.revNat",
        "0",
        &[],
        Bad::Refused("ebpf.mapSizes.revNat"),
    ),
    (
        "ebpf.mapSizes.sockRevNat",
        "TOO_BIG",
        &[],
        Bad::Refused("ebpf.mapSizes.sockRevNat"),
    ),
    (
        "ebpf.mapSizes.affinity",
        "0",
        &[],
        Bad::Refused("ebpf.mapSizes.affinity"),
    ),
    (
        "ebpf.mapSizes.conntrack",
        "TOO_BIG",
        &[],
        Bad::Refused("ebpf.mapSizes.conntrack"),
    ),
    (
        "ebpf.mapSizes.sourceRanges",
        "0",
        &[],
        Bad::Refused("ebpf.mapSizes.sourceRanges"),
    ),
    (
        "ebpf.mapSizeLimits.services",
        "TOO_BIG",
        &[],
        Bad::Refused("ebpf.mapSizeLimits.services"),
    ),
    (
        "ebpf.mapSizeLimits.backends",
        "0",
        &[],
        Bad::Refused("ebpf.mapSizeLimits.backends"),
    ),
    (
        // Below the starting size (the default, 65,536).
        "ebpf.mapSizeLimits.revNat",
        "1024",
        &[],
        Bad::Refused("ebpf.mapSizeLimits.revNat"),
    ),
    (
        "ebpf.mapSizeLimits.sourceRanges",
        "16",
        &[("ebpf.mapSizes.sourceRanges", "64")],
        Bad::Refused("ebpf.mapSizeLimits.sourceRanges"),
    ),
    (
        "ebpf.conntrack.tcpTimeout",
        "-1s",
        &[],
        Bad::Refused("ebpf.conntrack.tcpTimeout"),
    ),
    (
        "ebpf.conntrack.tcpClosingTimeout",
        "-1s",
        &[],
        Bad::Refused("ebpf.conntrack.tcpClosingTimeout"),
    ),
    (
        "ebpf.conntrack.udpTimeout",
        "-1s",
        &[],
        Bad::Refused("ebpf.conntrack.udpTimeout"),
    ),
    (
        "ebpf.mapSizes.maglevTables",
        "0",
        &[],
        Bad::Refused("ebpf.mapSizes.maglevTables"),
    ),
    (
        "ebpf.loadBalancerAlgorithm",
        "least-conn",
        &[],
        Bad::Refused("ebpf.loadBalancerAlgorithm"),
    ),
    (
        "ebpf.maglevTableSize",
        "16384",
        &[],
        Bad::Refused("ebpf.maglevTableSize"),
    ),
    ("ebpf.socketLBHostNamespaceOnly", "true", &[], Bad::Accepted),
];

/// A minimal valid file with `settings` (dotted paths) added.
fn document(settings: &[(&str, &str)]) -> String {
    let mut root = Mapping::new();
    root.insert(
        "apiVersion".into(),
        "kubeproxy.config.k8s.io/v1alpha1".into(),
    );
    root.insert("kind".into(), "KubeProxyConfiguration".into());
    for (path, value) in settings {
        let value = value.replace("TOO_BIG", &(u64::from(MAX_MAP_ENTRIES) + 1).to_string());
        let value: Value = serde_yaml::from_str(&value).unwrap();
        let mut node = &mut root;
        let mut parts: Vec<&str> = path.split('.').collect();
        let leaf = parts.pop().unwrap();
        for part in parts {
            node = node
                .entry(part.into())
                .or_insert_with(|| Value::Mapping(Mapping::new()))
                .as_mapping_mut()
                .unwrap();
        }
        node.insert(leaf.into(), value);
    }
    serde_yaml::to_string(&root).unwrap()
}

/// Every field path the file can hold: the leaves of the default configuration written
/// out, plus the fields written only when set.
fn every_field() -> BTreeSet<String> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut BTreeSet<String>) {
        match value {
            // A free-form map is one field.
            serde_json::Value::Object(map) if prefix != "logging.options" => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, child, out);
                }
            }
            _ => {
                out.insert(prefix.to_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(
        "",
        &serde_json::to_value(default_config()).unwrap(),
        &mut out,
    );
    for only_when_set in [
        "featureGates",
        "logging.format",
        "logging.vmodule",
        "logging.options",
        "windowsRunAsService",
    ] {
        out.insert(only_when_set.to_owned());
    }
    out.remove("apiVersion");
    out.remove("kind");
    out
}

#[test]
fn tables_cover_every_field() {
    let fields = every_field();
    let wrong_type: BTreeSet<String> = WRONG_TYPE.iter().map(|(f, _)| (*f).to_owned()).collect();
    let out_of_range: BTreeSet<String> =
        OUT_OF_RANGE.iter().map(|(f, ..)| (*f).to_owned()).collect();
    assert_eq!(wrong_type, fields, "wrong-type cases vs fields");
    assert_eq!(out_of_range, fields, "out-of-range cases vs fields");
}

#[test]
fn a_value_of_the_wrong_type_is_refused_naming_its_field() {
    for (field, value) in WRONG_TYPE {
        let text = document(&[(field, value)]);
        match parse_str(&text, Path::new("c.yaml")) {
            Err(ConfigError::Decode {
                field: reported,
                message,
                ..
            }) => {
                assert!(
                    reported == *field || reported.starts_with(&format!("{field}.")),
                    "{field}: reported {reported:?} ({message})"
                );
                assert!(!message.is_empty());
            }
            other => panic!("{field} = {value}: {other:?}"),
        }
    }
}

#[test]
fn a_value_out_of_range_or_of_a_bad_format_gets_upstreams_outcome() {
    for (field, value, context, outcome) in OUT_OF_RANGE {
        let mut settings = context.to_vec();
        settings.push((field, value));
        let text = document(&settings);
        let mut config = parse_str(&text, Path::new("c.yaml"))
            .unwrap_or_else(|e| panic!("{field} = {value} must decode: {e}"));
        apply_defaults(&mut config);
        apply_platform_defaults(&mut config);
        let errors: Vec<String> = validate(&config).iter().map(|e| e.field.clone()).collect();
        match outcome {
            Bad::Accepted => assert!(errors.is_empty(), "{field} = {value}: {errors:?}"),
            Bad::Refused(expected) => assert!(
                errors.iter().any(|reported| reported == expected
                    || reported.starts_with(&format!("{expected}["))
                    || reported.starts_with(&format!("{expected}."))),
                "{field} = {value}: {errors:?}"
            ),
        }
    }
}

#[test]
fn the_wrong_document_type_is_refused_before_its_fields() {
    for (field, value) in [
        ("apiVersion", "kubelet.config.k8s.io/v1beta1"),
        ("kind", "KubeletConfiguration"),
    ] {
        let mut text = document(&[]);
        text = text.replace(
            if field == "kind" {
                "KubeProxyConfiguration"
            } else {
                "kubeproxy.config.k8s.io/v1alpha1"
            },
            value,
        );
        match parse_str(&text, Path::new("c.yaml")) {
            Err(ConfigError::Invalid { errors, .. }) => {
                assert_eq!(errors.len(), 1, "{errors:?}");
                assert_eq!(errors[0].field, field);
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    match parse_str(
        "apiVersion: [1]\nkind: KubeProxyConfiguration\n",
        Path::new("c.yaml"),
    ) {
        Err(ConfigError::Decode { .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_qps_that_is_not_a_number_is_refused() {
    for value in [".nan", ".inf", "-.inf"] {
        let text = document(&[("clientConnection.qps", value)]);
        let mut config = parse_str(&text, Path::new("c.yaml")).unwrap();
        apply_defaults(&mut config);
        let errors: Vec<String> = validate(&config).iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 1, "{value}: {errors:?}");
        assert!(
            errors[0].starts_with("clientConnection.qps: Invalid value: "),
            "{}",
            errors[0]
        );
    }
}
