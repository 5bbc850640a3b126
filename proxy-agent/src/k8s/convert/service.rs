// SPDX-License-Identifier: Apache-2.0
//! v1 Service -> one [`ServicePort`] per port, for one IP family.

use std::collections::HashSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::{object_name, parse_cidr_sloppy, parse_ip_sloppy, quoted, should_proxy_service};
use crate::model::{
    InvalidObject, IpFamily, LoadBalancerAlgorithm, LoadBalancerIngress, LoadBalancerIpMode,
    NamespacedName, ObjectKind, Protocol, ServicePort, ServicePortName, ServiceRecord,
    SessionAffinity,
};

const TYPE_CLUSTER_IP: &str = "ClusterIP";
const TYPE_NODE_PORT: &str = "NodePort";
const TYPE_LOAD_BALANCER: &str = "LoadBalancer";
const TYPE_EXTERNAL_NAME: &str = "ExternalName";
const CLUSTER_IP_NONE: &str = "None";
/// The annotation that chooses a service's load-balancing algorithm (values:
/// [`LoadBalancerAlgorithm::NAMES`]); without it the configuration decides.
pub const LB_ALGORITHM_ANNOTATION: &str = "kube-proxy-ebpf.io/lb-algorithm";
/// The API server's bound for `sessionAffinityConfig.clientIP.timeoutSeconds`.
const MAX_AFFINITY_TIMEOUT_SECONDS: i32 = 86_400;

/// The ports of `svc` as seen by a proxier of `family`.
///
/// Returns an empty list, not an error, for services the proxy does not handle: those
/// outside kube-proxy's label selector, ExternalName services, headless services, and
/// services without a ClusterIP of `family` (a single-stack service of the other family).
/// Entries of the other family in `externalIPs`, `loadBalancerSourceRanges` and the
/// load-balancer ingress are left out; malformed entries there are left out with a
/// warning, as upstream does. Anything else the API server would have refused makes the
/// whole object invalid.
pub fn service_ports(
    svc: &Service,
    family: IpFamily,
) -> Result<Vec<(ServicePortName, ServicePort)>, InvalidObject> {
    convert(svc, family, true)
}

/// What the model takes in of `svc` ([`ServiceRecord`]): its ports for each of `families`
/// (the node's), or only its name when it was `deleted`.
pub fn service_record(svc: &Service, families: &[IpFamily], deleted: bool) -> ServiceRecord {
    let ports = if deleted {
        Vec::new()
    } else {
        families
            .iter()
            .map(|&family| (family, crate::model::service_ports(svc, family)))
            .collect()
    };
    ServiceRecord {
        name: object_name(&svc.metadata),
        ports,
    }
}

/// [`service_ports`] without its warnings about skipped entries: for the previous version
/// of a service, which was converted (and its entries reported) when it was current.
pub fn service_ports_quietly(
    svc: &Service,
    family: IpFamily,
) -> Result<Vec<(ServicePortName, ServicePort)>, InvalidObject> {
    convert(svc, family, false)
}

fn convert(
    svc: &Service,
    family: IpFamily,
    warn: bool,
) -> Result<Vec<(ServicePortName, ServicePort)>, InvalidObject> {
    let name = object_name(&svc.metadata);
    // Where to report skipped entries; `None` reports nothing.
    let log_as = warn.then_some(&name);
    let invalid = |reason: String| {
        InvalidObject::new(ObjectKind::Service, name.namespace(), name.name(), reason)
    };
    if name.name().is_empty() {
        return Err(invalid("metadata.name is missing".into()));
    }
    if !should_proxy_service(svc) {
        return Ok(Vec::new());
    }
    let Some(spec) = svc.spec.as_ref() else {
        return Err(invalid("spec is missing".into()));
    };

    // The API server defaults an absent type to ClusterIP.
    let service_type = spec.type_.as_deref().unwrap_or(TYPE_CLUSTER_IP);
    match service_type {
        TYPE_EXTERNAL_NAME => return Ok(Vec::new()),
        TYPE_CLUSTER_IP | TYPE_NODE_PORT | TYPE_LOAD_BALANCER => {}
        other => {
            return Err(invalid(format!(
                "unknown spec.type {q_other}",
                q_other = quoted(other)
            )));
        }
    }

    let Some(cluster_ip) = cluster_ip_for_family(spec, family).map_err(invalid)? else {
        return Ok(Vec::new());
    };

    let external_policy_local = {
        let accepts_external = service_type == TYPE_LOAD_BALANCER
            || service_type == TYPE_NODE_PORT
            || spec
                .external_ips
                .as_ref()
                .is_some_and(|ips| !ips.is_empty());
        let local = traffic_policy_is_local(
            spec.external_traffic_policy.as_deref(),
            "externalTrafficPolicy",
        )
        .map_err(invalid)?;
        accepts_external && local
    };
    let internal_policy_local = traffic_policy_is_local(
        spec.internal_traffic_policy.as_deref(),
        "internalTrafficPolicy",
    )
    .map_err(invalid)?;

    let load_balancer_algorithm = load_balancer_algorithm(svc, log_as);

    let health_check_node_port = if service_type == TYPE_LOAD_BALANCER && external_policy_local {
        match spec.health_check_node_port.unwrap_or(0) {
            0 => {
                if let Some(name) = log_as {
                    tracing::error!(service = %name, "service needs a health check node port but has none");
                }
                None
            }
            port => {
                Some(port_number(port).ok_or_else(|| {
                    invalid(format!("healthCheckNodePort {port} is out of range"))
                })?)
            }
        }
    } else {
        None
    };

    let session_affinity = session_affinity(spec).map_err(invalid)?;
    let external_ips = external_ips(spec, family, log_as);
    let load_balancer_source_ranges = source_ranges(spec, family, log_as);
    let load_balancer_ingress = load_balancer_ingress(svc, family, log_as).map_err(invalid)?;

    // The API server refuses a repeated port name, a repeated (port, protocol) and a
    // repeated (nodePort, protocol). Upstream kube-proxy relies on that and would program
    // two rules for one frontend, the first silently winning; here one frontend can only
    // have one service port, so such an object is refused whole.
    let mut names_seen = HashSet::new();
    let mut frontends_seen = HashSet::new();
    let mut node_ports_seen = HashSet::new();
    let mut ports = Vec::new();
    for spec_port in spec.ports.as_deref().unwrap_or_default() {
        let port_name = spec_port.name.clone().unwrap_or_default();
        if !names_seen.insert(port_name.clone()) {
            return Err(invalid(format!(
                "duplicate port name {q_port_name}",
                q_port_name = quoted(&port_name)
            )));
        }
        let protocol = match spec_port.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(text) => Protocol::from_api(text).ok_or_else(|| {
                invalid(format!(
                    "port {q_port_name}: unknown protocol {q_text}",
                    q_port_name = quoted(&port_name),
                    q_text = quoted(text)
                ))
            })?,
        };
        let port = port_number(spec_port.port).ok_or_else(|| {
            invalid(format!(
                "port {q_port_name}: port {} is out of range",
                spec_port.port,
                q_port_name = quoted(&port_name)
            ))
        })?;
        let node_port = match spec_port.node_port.unwrap_or(0) {
            0 => None,
            value => Some(port_number(value).ok_or_else(|| {
                invalid(format!(
                    "port {q_port_name}: nodePort {value} is out of range",
                    q_port_name = quoted(&port_name)
                ))
            })?),
        };
        if !frontends_seen.insert((port, protocol)) {
            return Err(invalid(format!(
                "port {q_port_name}: duplicate port {port}/{protocol}",
                q_port_name = quoted(&port_name)
            )));
        }
        if let Some(node_port) = node_port
            && !node_ports_seen.insert((node_port, protocol))
        {
            return Err(invalid(format!(
                "port {q_port_name}: duplicate nodePort {node_port}/{protocol}",
                q_port_name = quoted(&port_name)
            )));
        }
        ports.push((
            ServicePortName::new(name.clone(), port_name, protocol),
            ServicePort {
                cluster_ip,
                port,
                protocol,
                node_port,
                external_ips: external_ips.clone(),
                load_balancer_ingress: load_balancer_ingress.clone(),
                load_balancer_source_ranges: load_balancer_source_ranges.clone(),
                external_policy_local,
                internal_policy_local,
                health_check_node_port,
                session_affinity,
                load_balancer_algorithm,
            },
        ));
    }
    Ok(ports)
}

/// The algorithm the service's annotation asks for. An unknown value is not worth refusing
/// the service for: it is reported (when `log_as` names the service) and the configuration
/// decides, as for an absent annotation.
fn load_balancer_algorithm(
    svc: &Service,
    log_as: Option<&NamespacedName>,
) -> Option<LoadBalancerAlgorithm> {
    let value = svc
        .metadata
        .annotations
        .as_ref()?
        .get(LB_ALGORITHM_ANNOTATION)?;
    let algorithm = LoadBalancerAlgorithm::parse(value.trim());
    if algorithm.is_none()
        && let Some(name) = log_as
    {
        tracing::warn!(
            service = %name,
            annotation = LB_ALGORITHM_ANNOTATION,
            value = %quoted(value),
            supported = ?LoadBalancerAlgorithm::NAMES,
            "ignoring an unknown load-balancing algorithm; the configured one applies"
        );
    }
    algorithm
}

/// The ClusterIP of `family`, `None` when the service has none (headless, or not of that
/// family). Mirrors upstream's `GetClusterIPByFamily`, and checks what the API server would.
fn cluster_ip_for_family(spec: &ServiceSpec, family: IpFamily) -> Result<Option<IpAddr>, String> {
    let cluster_ips: &[String] = spec.cluster_ips.as_deref().unwrap_or_default();
    let primary = spec
        .cluster_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())
        .or(cluster_ips.first().map(String::as_str));
    let Some(primary) = primary else {
        return Ok(None);
    };
    if primary == CLUSTER_IP_NONE {
        return Ok(None);
    }
    let parse = |text: &str, field: &str| {
        parse_ip_sloppy(text).ok_or_else(|| {
            format!(
                "{field} {q_text} is not an IP address",
                q_text = quoted(text)
            )
        })
    };
    let primary_ip = parse(primary, "clusterIP")?;

    // clusterIPs[0] must be clusterIP; a service written with only `clusterIP` (as before
    // dual-stack) has that one address.
    let ips = if cluster_ips.is_empty() {
        vec![primary_ip]
    } else {
        let ips = cluster_ips
            .iter()
            .map(|text| parse(text, "clusterIPs entry"))
            .collect::<Result<Vec<_>, _>>()?;
        if ips[0] != primary_ip {
            return Err(format!(
                "clusterIP {} is not clusterIPs[0] {}",
                quoted(primary),
                quoted(&cluster_ips[0])
            ));
        }
        ips
    };

    let families: &[String] = spec.ip_families.as_deref().unwrap_or_default();
    if families.is_empty() {
        // Objects from before dual-stack: the address decides its family.
        return Ok(ips.into_iter().find(|ip| family.contains(ip)));
    }
    let families = families
        .iter()
        .map(|text| {
            IpFamily::from_api(text)
                .ok_or_else(|| format!("unknown ipFamilies entry {q_text}", q_text = quoted(text)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (index, (ip, ip_family)) in ips.iter().zip(&families).enumerate() {
        if !ip_family.contains(ip) {
            return Err(format!(
                "clusterIPs[{index}] {ip} is not of family {ip_family}"
            ));
        }
    }
    Ok(families
        .iter()
        .position(|f| *f == family)
        .and_then(|index| ips.get(index).copied()))
}

fn traffic_policy_is_local(value: Option<&str>, field: &str) -> Result<bool, String> {
    match value {
        None | Some("Cluster") => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(format!(
            "unknown {field} {q_other}",
            q_other = quoted(other)
        )),
    }
}

fn session_affinity(spec: &ServiceSpec) -> Result<Option<SessionAffinity>, String> {
    match spec.session_affinity.as_deref() {
        None | Some("None") => Ok(None),
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|config| config.client_ip.as_ref())
                .and_then(|client_ip| client_ip.timeout_seconds);
            let timeout_seconds = match timeout {
                None => SessionAffinity::DEFAULT_TIMEOUT_SECONDS,
                Some(seconds @ 1..=MAX_AFFINITY_TIMEOUT_SECONDS) => seconds.unsigned_abs(),
                Some(seconds) => {
                    return Err(format!(
                        "session affinity timeout {seconds}s is out of range"
                    ));
                }
            };
            Ok(Some(SessionAffinity { timeout_seconds }))
        }
        Some(other) => Err(format!(
            "unknown sessionAffinity {q_other}",
            q_other = quoted(other)
        )),
    }
}

fn external_ips(
    spec: &ServiceSpec,
    family: IpFamily,
    log_as: Option<&NamespacedName>,
) -> Vec<IpAddr> {
    spec.external_ips
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|text| {
            let ip = parse_ip_sloppy(text);
            if let (None, Some(name)) = (ip, log_as)
                && !text.trim().is_empty()
            {
                tracing::warn!(service = %name, ip = %quoted(text), "skipping invalid external IP");
            }
            ip
        })
        .filter(|ip| family.contains(ip))
        .collect()
}

fn source_ranges(
    spec: &ServiceSpec,
    family: IpFamily,
    log_as: Option<&NamespacedName>,
) -> Vec<ipnet::IpNet> {
    // API validation has long let whitespace around the ranges through.
    spec.load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|text| text.trim())
        .filter_map(|text| {
            let net = parse_cidr_sloppy(text);
            if let (None, Some(name)) = (net, log_as)
                && !text.is_empty()
            {
                tracing::warn!(service = %name, cidr = %quoted(text), "skipping invalid load balancer source range");
            }
            net
        })
        .filter(|net| IpFamily::of_net(net) == family)
        .collect()
}

fn load_balancer_ingress(
    svc: &Service,
    family: IpFamily,
    log_as: Option<&NamespacedName>,
) -> Result<Vec<LoadBalancerIngress>, String> {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    let mut result = Vec::new();
    for entry in ingress {
        let Some(text) = entry.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        let ip_mode = match entry.ip_mode.as_deref() {
            None | Some("VIP") => LoadBalancerIpMode::Vip,
            Some("Proxy") => LoadBalancerIpMode::Proxy,
            Some(other) => {
                return Err(format!(
                    "load balancer ingress {}: unknown ipMode {}",
                    quoted(text),
                    quoted(other)
                ));
            }
        };
        let Some(ip) = parse_ip_sloppy(text) else {
            if let Some(name) = log_as {
                tracing::warn!(service = %name, ip = %quoted(text), "skipping invalid load balancer ingress IP");
            }
            continue;
        };
        if family.contains(&ip) {
            result.push(LoadBalancerIngress { ip, ip_mode });
        }
    }
    Ok(result)
}

fn port_number(value: i32) -> Option<u16> {
    u16::try_from(value).ok().filter(|port| *port != 0)
}
