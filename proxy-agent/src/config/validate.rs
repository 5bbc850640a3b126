// SPDX-License-Identifier: Apache-2.0
//! Validation, after upstream's pkg/proxy/apis/config/validation/validation.go.
//!
//! All errors are collected, each naming its field in the file's own spelling
//! (`iptables.masqueradeBit`, `ipvs.excludeCIDRs[1]`), as upstream's newest validation does
//! for v1alpha1 input. Rules and messages are upstream's, except where noted:
//! - mode: `ebpf` is valid and the blank default; any mode the mode registry
//!   ([`crate::proxier::MODES`]) lacks is refused; `kernelspace` is Windows-only and refused.
//! - ipvs.scheduler is checked against the kernel's schedulers (upstream dropped the check);
//! - featureGates: any name is accepted (upstream refuses names it does not know);
//! - showHiddenMetricsForVersion: only the `<major>.<minor>` form is checked, since the agent
//!   has no Kubernetes version to compare with;
//! - nodePortAddresses keywords: repeated keywords are reported as duplicates;
//! - udpIdleTimeout (older struct) must be > 0, as the older validation required;
//! - the `ebpf` section is ours.

use std::collections::HashSet;
use std::path::Path;

use super::duration::Duration;
use super::field::FieldError;
use super::net::{go_atoi, parse_cidr_sloppy, parse_ip_sloppy, parse_port_range, split_host_port};
use super::typed::{
    LocalMode, NODE_PORT_KEYWORDS_DETAIL, NodePortAddress, ProxyMode, XdpMode, cluster_cidr_errors,
    invalid_mode, unsupported_local_mode, unsupported_xdp_mode,
};
use super::types::{KubeProxyConfiguration, LoggingConfiguration, MapSizes};

/// Upper bound for `ebpf.mapSizes.*`: beyond 16M entries the kernel's memory accounting (and
/// any sane node) objects long before the map is useful.
pub const MAX_MAP_ENTRIES: u32 = 1 << 24;

/// Kernel IPVS schedulers; "" lets the ipvs proxier pick rr.
pub const IPVS_SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
];

const LOG_FORMATS: &[&str] = &["text", "json"];
const NON_NEGATIVE: &str = "must be greater than or equal to 0";
const POSITIVE: &str = "must be greater than 0";

/// Every problem in `config`, sorted by field path (stable, so one field's errors keep
/// upstream's order).
pub fn validate(config: &KubeProxyConfiguration) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_sync_periods(config, &mut errors);
    check_masquerade_bit(
        "iptables.masqueradeBit",
        config.iptables.masquerade_bit,
        &mut errors,
    );
    match config.mode.as_str() {
        "ipvs" => validate_ipvs(config, &mut errors),
        "nftables" => check_masquerade_bit(
            "nftables.masqueradeBit",
            config.nftables.masquerade_bit,
            &mut errors,
        ),
        _ => {}
    }
    validate_conntrack(config, &mut errors);
    if let Some(adj) = config.oom_score_adj
        && !(-1000..=1000).contains(&adj)
    {
        errors.push(FieldError::invalid(
            "oomScoreAdj",
            adj,
            "must be within the range [-1000, 1000]",
        ));
    }
    // The mode must be one this agent runs: the mode registry's.
    if !ProxyMode::parse(&config.mode).is_some_and(crate::proxier::is_registered) {
        errors.push(invalid_mode(&config.mode));
    }
    // Upstream decodes through JSON, which has no NaN or infinity: such a qps never gets
    // past its decoder. Ours reads YAML directly, so it is refused here.
    if !config.client_connection.qps.is_finite() {
        errors.push(FieldError::invalid(
            "clientConnection.qps",
            config.client_connection.qps,
            "must be a finite number",
        ));
    }
    if config.client_connection.burst < 0 {
        errors.push(FieldError::invalid(
            "clientConnection.burst",
            config.client_connection.burst,
            NON_NEGATIVE,
        ));
    }
    check_positive("configSyncPeriod", config.config_sync_period, &mut errors);
    check_positive("udpIdleTimeout", config.udp_idle_timeout, &mut errors);

    if parse_ip_sloppy(&config.bind_address).is_none() {
        errors.push(FieldError::invalid(
            "bindAddress",
            &config.bind_address,
            "not a valid textual representation of an IP address",
        ));
    }
    if !config.healthz_bind_address.is_empty() {
        validate_host_port(
            "healthzBindAddress",
            &config.healthz_bind_address,
            &mut errors,
        );
    }
    validate_host_port(
        "metricsBindAddress",
        &config.metrics_bind_address,
        &mut errors,
    );

    if parse_port_range(&config.port_range).is_err() {
        errors.push(FieldError::invalid(
            "portRange",
            &config.port_range,
            "must be a valid port range (e.g. 300-2000)",
        ));
    }
    validate_node_port_addresses(&config.node_port_addresses, &mut errors);
    validate_show_hidden_metrics_version(&config.show_hidden_metrics_for_version, &mut errors);
    validate_detect_local(config, &mut errors);
    validate_logging(&config.logging, &mut errors);
    validate_logging_options(config, &mut errors);
    validate_ebpf(config, &mut errors);

    errors.sort_by(|a, b| a.field.cmp(&b.field));
    errors
}

/// Upstream validates the one sync-period pair of the selected mode (ipvs, nftables, or
/// iptables for every other mode) and reports a period below the minimum on `syncPeriod`,
/// with the minimum as the value.
fn validate_sync_periods(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    let section = KubeProxyConfiguration::sync_section(&config.mode);
    let (sync, min_sync) = match section {
        "ipvs" => (config.ipvs.sync_period, config.ipvs.min_sync_period),
        "nftables" => (config.nftables.sync_period, config.nftables.min_sync_period),
        _ => (config.iptables.sync_period, config.iptables.min_sync_period),
    };
    check_positive(&format!("{section}.syncPeriod"), sync, errors);
    check_non_negative(&format!("{section}.minSyncPeriod"), min_sync, errors);
    if min_sync > sync {
        errors.push(FieldError::invalid(
            format!("{section}.syncPeriod"),
            min_sync,
            format!("must be greater than or equal to {section}.minSyncPeriod"),
        ));
    }
}

fn check_masquerade_bit(field: &str, bit: Option<i32>, errors: &mut Vec<FieldError>) {
    if let Some(bit) = bit
        && !(0..=31).contains(&bit)
    {
        errors.push(FieldError::invalid(
            field,
            bit,
            "must be within the range [0, 31]",
        ));
    }
}

fn check_positive(field: &str, value: Duration, errors: &mut Vec<FieldError>) {
    if value.as_nanos() <= 0 {
        errors.push(FieldError::invalid(field, value, POSITIVE));
    }
}

fn check_non_negative(field: &str, value: Duration, errors: &mut Vec<FieldError>) {
    if value.is_negative() {
        errors.push(FieldError::invalid(field, value, NON_NEGATIVE));
    }
}

fn validate_ipvs(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    let ipvs = &config.ipvs;
    check_non_negative("ipvs.tcpTimeout", ipvs.tcp_timeout, errors);
    check_non_negative("ipvs.tcpFinTimeout", ipvs.tcp_fin_timeout, errors);
    check_non_negative("ipvs.udpTimeout", ipvs.udp_timeout, errors);
    if !ipvs.scheduler.is_empty() && !IPVS_SCHEDULERS.contains(&ipvs.scheduler.as_str()) {
        errors.push(FieldError::invalid(
            "ipvs.scheduler",
            &ipvs.scheduler,
            format!(
                "must be in [{}], blank means the default algorithm method (currently rr)",
                IPVS_SCHEDULERS.join(" ")
            ),
        ));
    }
    for (index, cidr) in ipvs.exclude_cidrs.iter().enumerate() {
        if parse_cidr_sloppy(cidr).is_none() {
            errors.push(FieldError::invalid(
                format!("ipvs.excludeCIDRs[{index}]"),
                cidr,
                "must be a valid CIDR",
            ));
        }
    }
}

fn validate_conntrack(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    let conntrack = &config.conntrack;
    for (field, value) in [
        ("conntrack.maxPerCore", conntrack.max_per_core),
        ("conntrack.min", conntrack.min),
    ] {
        if let Some(value) = value
            && value < 0
        {
            errors.push(FieldError::invalid(field, value, NON_NEGATIVE));
        }
    }
    let durations = [
        (
            "conntrack.tcpEstablishedTimeout",
            conntrack.tcp_established_timeout.unwrap_or_default(),
        ),
        (
            "conntrack.tcpCloseWaitTimeout",
            conntrack.tcp_close_wait_timeout.unwrap_or_default(),
        ),
        ("conntrack.udpTimeout", conntrack.udp_timeout),
        ("conntrack.udpStreamTimeout", conntrack.udp_stream_timeout),
    ];
    for (field, value) in durations {
        check_non_negative(field, value, errors);
    }
}

/// Upstream's `validateHostPort`: "IP:port" with a parseable IP and a port in 1..=65535.
fn validate_host_port(field: &str, input: &str, errors: &mut Vec<FieldError>) {
    let Some((host, port)) = split_host_port(input) else {
        errors.push(FieldError::invalid(field, input, "must be IP:port"));
        return;
    };
    if parse_ip_sloppy(host).is_none() {
        errors.push(FieldError::invalid(field, host, "must be a valid IP"));
    }
    if !matches!(go_atoi(port), Some(1..=65535)) {
        errors.push(FieldError::invalid(field, port, "must be a valid port"));
    }
}

fn validate_node_port_addresses(entries: &[String], errors: &mut Vec<FieldError>) {
    let mut keywords_seen = HashSet::new();
    for (index, entry) in entries.iter().enumerate() {
        let field = format!("nodePortAddresses[{index}]");
        match NodePortAddress::parse(entry) {
            None => errors.push(FieldError::invalid(field, entry, NODE_PORT_KEYWORDS_DETAIL)),
            Some(NodePortAddress::Cidr(_)) => {}
            Some(_) => {
                if !keywords_seen.insert(entry.as_str()) {
                    errors.push(FieldError::duplicate(field, entry));
                }
            }
        }
    }
}

fn validate_show_hidden_metrics_version(version: &str, errors: &mut Vec<FieldError>) {
    if version.is_empty() {
        return;
    }
    let well_formed = version.split_once('.').is_some_and(|(major, minor)| {
        [major, minor]
            .iter()
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
    });
    if !well_formed {
        errors.push(FieldError::invalid(
            "showHiddenMetricsForVersion",
            version,
            "must be of the form <major>.<minor> (e.g. '1.16')",
        ));
    }
}

fn validate_detect_local(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    let Some(mode) = LocalMode::parse(&config.detect_local_mode) else {
        errors.push(unsupported_local_mode(&config.detect_local_mode));
        return;
    };
    let must_not_be_empty =
        |field: &str, value: &str| FieldError::invalid(field, value, "must not be empty");
    match mode {
        LocalMode::ClusterCidr => errors.extend(cluster_cidr_errors(&config.cluster_cidr)),
        LocalMode::BridgeInterface if config.detect_local.bridge_interface.is_empty() => {
            errors.push(must_not_be_empty("detectLocal.bridgeInterface", ""));
        }
        LocalMode::InterfaceNamePrefix if config.detect_local.interface_name_prefix.is_empty() => {
            errors.push(must_not_be_empty("detectLocal.interfaceNamePrefix", ""));
        }
        _ => {}
    }
}

/// logsapi's options (`logging.options.text` / `.json`): split streams and an info buffer
/// are alpha, forbidden unless the LoggingAlphaOptions feature gate is on (logsapi decides
/// it from the component's gates, which kube-proxy takes from `featureGates`).
fn validate_logging_options(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    const GATE: &str = "LoggingAlphaOptions";
    let alpha_on = config.feature_gates.get(GATE).copied().unwrap_or(false);
    for format in ["text", "json"] {
        let Some(section) = config.logging.options.get(format) else {
            continue;
        };
        let split = section
            .get("splitStream")
            .and_then(serde_json::Value::as_bool);
        if split == Some(true) && !alpha_on {
            errors.push(FieldError::forbidden(
                format!("logging.options.{format}.splitStream"),
                format!("Feature gate {GATE} is disabled"),
            ));
        }
        let buffered = match section.get("infoBufferSize") {
            Some(serde_json::Value::String(size)) => !is_zero_quantity(size),
            Some(serde_json::Value::Number(size)) => size.as_f64() != Some(0.0),
            _ => false,
        };
        if buffered && !alpha_on {
            errors.push(FieldError::forbidden(
                format!("logging.options.{format}.infoBufferSize"),
                format!("Feature gate {GATE} is disabled"),
            ));
        }
    }
}

/// Whether a quantity (`0`, `0Ki`, `0.0`) is zero.
fn is_zero_quantity(text: &str) -> bool {
    let number: String = text
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '+' || *c == '-')
        .collect();
    number.parse::<f64>().is_ok_and(|n| n == 0.0)
}

/// logsapi's `Validate`, for the parts that do not depend on klog's own flags.
fn validate_logging(logging: &LoggingConfiguration, errors: &mut Vec<FieldError>) {
    if !LOG_FORMATS.contains(&logging.format.as_str()) {
        errors.push(FieldError::invalid(
            "logging.format",
            &logging.format,
            "Unsupported log format",
        ));
    }
    let max = i32::MAX.unsigned_abs();
    if logging.verbosity > max {
        errors.push(FieldError::invalid(
            "logging.verbosity",
            logging.verbosity,
            format!("Must be <= {max}"),
        ));
    }
    if !logging.vmodule.is_empty() && !logging.format.is_empty() && logging.format != "text" {
        errors.push(FieldError::forbidden(
            "logging.vmodule",
            "Only supported for text log format",
        ));
    }
    for (index, item) in logging.vmodule.iter().enumerate() {
        let field = format!("logging.vmodule[{index}]");
        if item.file_pattern.is_empty() {
            errors.push(FieldError::required(
                &field,
                "File pattern must not be empty",
            ));
        }
        if item.file_pattern.contains(['=', ',']) {
            errors.push(FieldError::invalid(
                &field,
                &item.file_pattern,
                "File pattern must not contain equal sign or comma",
            ));
        }
        if item.verbosity > max {
            errors.push(FieldError::invalid(
                &field,
                item.verbosity,
                format!("Must be <= {max}"),
            ));
        }
    }
}

/// Linux's `dev_valid_name`: 1 to 15 bytes, not "." or "..", no '/', ':' or whitespace.
fn is_valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

fn validate_ebpf(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    let ebpf = &config.ebpf;
    for (field, path) in [
        ("ebpf.bpffsRoot", &ebpf.bpffs_root),
        ("ebpf.cgroupRoot", &ebpf.cgroup_root),
    ] {
        if !path.is_empty() && !Path::new(path).is_absolute() {
            errors.push(FieldError::invalid(field, path, "must be an absolute path"));
        }
    }
    let mut seen = HashSet::new();
    for (index, device) in ebpf.devices.iter().enumerate() {
        let field = format!("ebpf.devices[{index}]");
        if !is_valid_interface_name(device) {
            errors.push(FieldError::invalid(
                field,
                device,
                "must be a valid interface name (1-15 characters, no '/', ':' or whitespace)",
            ));
        } else if !seen.insert(device.as_str()) {
            errors.push(FieldError::duplicate(field, device));
        }
    }
    if XdpMode::parse(&ebpf.xdp_mode).is_none() {
        errors.push(unsupported_xdp_mode(&ebpf.xdp_mode));
    }
    for (field, value) in [
        ("ebpf.conntrack.tcpTimeout", ebpf.conntrack.tcp_timeout),
        (
            "ebpf.conntrack.tcpClosingTimeout",
            ebpf.conntrack.tcp_closing_timeout,
        ),
        ("ebpf.conntrack.udpTimeout", ebpf.conntrack.udp_timeout),
    ] {
        let secs = value.to_std().as_secs();
        if value.to_std() < std::time::Duration::from_secs(1) || secs > u64::from(u32::MAX) {
            errors.push(FieldError::invalid(
                field,
                value.to_string(),
                "must be at least 1s (whole seconds count)",
            ));
        }
    }
    validate_maglev(config, errors);
    let MapSizes {
        services,
        backends,
        rev_nat,
        sock_rev_nat,
        affinity,
        conntrack,
        source_ranges,
        maglev_tables: _,
    } = ebpf.map_sizes;
    let sizes = [
        ("ebpf.mapSizes.services", services),
        ("ebpf.mapSizes.backends", backends),
        ("ebpf.mapSizes.revNat", rev_nat),
        ("ebpf.mapSizes.sockRevNat", sock_rev_nat),
        ("ebpf.mapSizes.affinity", affinity),
        ("ebpf.mapSizes.conntrack", conntrack),
        ("ebpf.mapSizes.sourceRanges", source_ranges),
    ];
    for (field, size) in sizes {
        if !(1..=MAX_MAP_ENTRIES).contains(&size) {
            errors.push(FieldError::invalid(
                field,
                size,
                format!("must be within the range [1, {MAX_MAP_ENTRIES}]"),
            ));
        }
    }
    // A ceiling below the starting size would make the map shrink, which growth never does.
    let limits = ebpf.map_size_limits;
    for (field, limit, start) in [
        ("ebpf.mapSizeLimits.services", limits.services, services),
        ("ebpf.mapSizeLimits.backends", limits.backends, backends),
        ("ebpf.mapSizeLimits.revNat", limits.rev_nat, rev_nat),
        (
            "ebpf.mapSizeLimits.sourceRanges",
            limits.source_ranges,
            source_ranges,
        ),
    ] {
        let Some(limit) = limit else { continue };
        if !(1..=MAX_MAP_ENTRIES).contains(&limit) {
            errors.push(FieldError::invalid(
                field,
                limit,
                format!("must be within the range [1, {MAX_MAP_ENTRIES}]"),
            ));
        } else if limit < start {
            errors.push(FieldError::invalid(
                field,
                limit,
                format!(
                    "must be at least the starting size in ebpf.mapSizes ({start}): maps grow, \
                     they never shrink below it"
                ),
            ));
        }
    }
}

/// The Maglev settings: a known algorithm; a prime table size in range (the paper's
/// permutations cover the table only when its size is prime); a table count the u16 index
/// of a frontend's slot 0 can address; and a map (tables x size) within `MAX_MAP_ENTRIES`.
fn validate_maglev(config: &KubeProxyConfiguration, errors: &mut Vec<FieldError>) {
    use proxy_common::maglev::{MAX_TABLE_SIZE, MIN_TABLE_SIZE};
    let ebpf = &config.ebpf;
    if let Err(e) = config.load_balancer_algorithm() {
        errors.push(e);
    }
    let size = ebpf.maglev_table_size;
    if !(MIN_TABLE_SIZE..=MAX_TABLE_SIZE).contains(&size) || !is_prime(size) {
        errors.push(FieldError::invalid(
            "ebpf.maglevTableSize",
            size,
            format!("must be a prime within the range [{MIN_TABLE_SIZE}, {MAX_TABLE_SIZE}]"),
        ));
    }
    let tables = ebpf.map_sizes.maglev_tables;
    let max_tables = u32::from(u16::MAX);
    if !(1..=max_tables).contains(&tables) {
        errors.push(FieldError::invalid(
            "ebpf.mapSizes.maglevTables",
            tables,
            format!("must be within the range [1, {max_tables}]"),
        ));
    } else if u64::from(tables) * u64::from(size) > u64::from(MAX_MAP_ENTRIES) {
        errors.push(FieldError::invalid(
            "ebpf.mapSizes.maglevTables",
            tables,
            format!(
                "times ebpf.maglevTableSize ({size}) must be at most {MAX_MAP_ENTRIES} entries"
            ),
        ));
    }
}

fn is_prime(n: u32) -> bool {
    n >= 2
        && (2..)
            .take_while(|d: &u32| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
