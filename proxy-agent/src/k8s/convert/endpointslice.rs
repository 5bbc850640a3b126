// SPDX-License-Identifier: Apache-2.0
//! discovery.k8s.io/v1 EndpointSlice -> [`SliceInfo`].

use std::time::{Duration, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;

use super::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, LABEL_SERVICE_NAME, object_name, parse_ip_sloppy, quoted,
    should_proxy_slice,
};
use crate::model::interner::{self, NameInterner};
use crate::model::{
    EndpointHints, HintNames, InvalidObject, IpFamily, NamespacedName, ObjectKind, Protocol,
    SliceEndpoint, SliceInfo, SlicePort, SliceRecord,
};

const ADDRESS_TYPE_FQDN: &str = "FQDN";

/// What the model takes in of `slice` ([`SliceRecord`]). A deleted slice (`removed`) and
/// one outside kube-proxy's label selector have no content; an FQDN slice has no family.
pub fn slice_record(slice: &EndpointSlice, removed: bool) -> SliceRecord {
    let family = IpFamily::from_api(&slice.address_type);
    let info = if removed || family.is_none() || !should_proxy_slice(slice) {
        Ok(None)
    } else {
        endpoint_slice_info(slice)
    };
    SliceRecord {
        object: object_name(&slice.metadata),
        family,
        owner: endpoint_slice_keys(slice),
        info,
    }
}

/// The service a slice belongs to (from its `kubernetes.io/service-name` label) and the
/// slice's own name: the keys of the EndpointSlice cache. `None` when the label is missing
/// or empty, or the slice has no namespace or name.
pub fn endpoint_slice_keys(slice: &EndpointSlice) -> Option<(NamespacedName, String)> {
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get(LABEL_SERVICE_NAME)
        .filter(|name| !name.is_empty())?;
    let namespace = slice
        .metadata
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())?;
    let name = slice
        .metadata
        .name
        .as_deref()
        .filter(|name| !name.is_empty())?;
    Some((
        NamespacedName::new(namespace, service.as_str()),
        name.to_owned(),
    ))
}

/// What the proxy uses of an EndpointSlice.
///
/// `Ok(None)` for slices the proxy ignores: FQDN slices, and slices without the
/// `kubernetes.io/service-name` label (logged). Endpoint conditions follow the API's
/// defaults as upstream reads them: absent `ready` is true, absent `serving` is true,
/// absent `terminating` is false. Ports without a name or a number, and endpoints without
/// addresses, are skipped with a warning, as upstream does. Addresses are parsed leniently
/// (leading zeros are decimal) and must match the slice's address type.
pub fn endpoint_slice_info(slice: &EndpointSlice) -> Result<Option<SliceInfo>, InvalidObject> {
    let object = object_name(&slice.metadata);
    let invalid = |reason: String| {
        InvalidObject::new(
            ObjectKind::EndpointSlice,
            object.namespace(),
            object.name(),
            reason,
        )
    };
    if object.namespace().is_empty() || object.name().is_empty() {
        return Err(invalid(
            "metadata.namespace or metadata.name is missing".into(),
        ));
    }
    let address_family = match slice.address_type.as_str() {
        ADDRESS_TYPE_FQDN => return Ok(None),
        text => IpFamily::from_api(text).ok_or_else(|| {
            invalid(format!(
                "unknown addressType {q_text}",
                q_text = quoted(text)
            ))
        })?,
    };
    let Some((service, slice_name)) = endpoint_slice_keys(slice) else {
        tracing::warn!(
            endpoint_slice = %object,
            label = LABEL_SERVICE_NAME,
            "ignoring EndpointSlice without a service name label"
        );
        return Ok(None);
    };

    let slice_ports = slice.ports.as_deref().unwrap_or_default();
    // Exactly sized: the model keeps the list for as long as the slice exists, and pushing
    // onto an empty Vec reserves four ports (96 bytes too many for the usual one).
    let mut ports = Vec::with_capacity(slice_ports.len());
    for port in slice_ports {
        let Some(name) = port.name.as_deref() else {
            tracing::warn!(endpoint_slice = %object, "ignoring EndpointSlice port without a name");
            continue;
        };
        let number = match port.port {
            None | Some(0) => {
                tracing::warn!(endpoint_slice = %object, port = %name, "ignoring EndpointSlice port without a number");
                continue;
            }
            Some(value) => u16::try_from(value).map_err(|_| {
                invalid(format!(
                    "port {q_name}: {value} is out of range",
                    q_name = quoted(name)
                ))
            })?,
        };
        let protocol = match port.protocol.as_deref() {
            None => Protocol::Tcp,
            Some(text) => Protocol::from_api(text).ok_or_else(|| {
                invalid(format!(
                    "port {q_name}: unknown protocol {q_text}",
                    q_name = quoted(name),
                    q_text = quoted(text)
                ))
            })?,
        };
        ports.push(SlicePort {
            name: interner::shared_key_part(name),
            port: number,
            protocol,
        });
    }

    let slice_endpoints = slice.endpoints.as_deref().unwrap_or_default();
    let mut endpoints = Vec::with_capacity(slice_endpoints.len());
    // One lock for all the names of the slice.
    let mut names = interner::lock_shared();
    for endpoint in slice_endpoints {
        let Some(address) = endpoint.addresses.first() else {
            tracing::warn!(endpoint_slice = %object, "ignoring endpoint without addresses");
            continue;
        };
        let ip = parse_ip_sloppy(address).ok_or_else(|| {
            invalid(format!(
                "endpoint address {q_address} is not an IP address",
                q_address = quoted(address)
            ))
        })?;
        if !address_family.contains(&ip) {
            return Err(invalid(format!(
                "endpoint address {address} is not of addressType {address_family}"
            )));
        }
        let conditions = endpoint.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        let hints = endpoint.hints.as_ref();
        let zone_hints = hint_names(
            &mut names,
            hints
                .and_then(|h| h.for_zones.as_deref())
                .map(|zones| zones.iter().map(|zone| zone.name.as_str())),
        );
        let node_hints = hint_names(
            &mut names,
            hints
                .and_then(|h| h.for_nodes.as_deref())
                .map(|nodes| nodes.iter().map(|node| node.name.as_str())),
        );
        endpoints.push(SliceEndpoint {
            ip,
            ready,
            serving,
            terminating,
            node_name: endpoint.node_name.as_deref().map(|name| names.intern(name)),
            zone: endpoint.zone.as_deref().map(|zone| names.intern(zone)),
            hints: EndpointHints::new(zone_hints, node_hints),
        });
    }
    drop(names);

    let last_change_trigger_time = slice
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME))
        .and_then(|text| {
            let time = parse_timestamp(text);
            if time.is_none() {
                tracing::warn!(
                    endpoint_slice = %object,
                    value = %quoted(text),
                    "ignoring unparsable {ANNOTATION_LAST_CHANGE_TRIGGER_TIME} annotation"
                );
            }
            time
        });

    Ok(Some(SliceInfo {
        service,
        slice_name,
        address_family,
        ports,
        endpoints,
        last_change_trigger_time,
    }))
}

/// The interned names of a hint list; an empty list is no hint at all.
fn hint_names<'a>(
    names: &mut NameInterner,
    hinted: Option<impl Iterator<Item = &'a str>>,
) -> Option<HintNames> {
    let hinted: HintNames = hinted?.map(|name| names.intern(name)).collect();
    (!hinted.is_empty()).then_some(hinted)
}

fn parse_timestamp(text: &str) -> Option<SystemTime> {
    let timestamp: Timestamp = text.parse().ok()?;
    let seconds = timestamp.as_second();
    let nanos = u32::try_from(timestamp.subsec_nanosecond()).ok()?;
    let magnitude = Duration::new(seconds.unsigned_abs(), 0);
    let whole = if seconds >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(magnitude)?
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(magnitude)?
    };
    whole.checked_add(Duration::from_nanos(u64::from(nanos)))
}
