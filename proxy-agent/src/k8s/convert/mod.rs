// SPDX-License-Identifier: Apache-2.0
//! Kubernetes objects -> domain model ([`crate::model`]). Nothing outside this module (and
//! the trackers' entry points) needs to know the k8s-openapi types.

mod endpointslice;
mod ip;
pub mod objects;
mod service;

#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use endpointslice::{endpoint_slice_info, endpoint_slice_keys, slice_record};
pub use ip::{parse_cidr_sloppy, parse_ip_sloppy};
pub use objects::{ClusterObject, objects_from_value, parse_objects};
pub use service::{LB_ALGORITHM_ANNOTATION, service_ports, service_ports_quietly, service_record};

use crate::model::NamespacedName;

/// Objects carrying this label belong to another service proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Set by the EndpointSlice controller on slices of headless services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Names the service an EndpointSlice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// When the change that led to this EndpointSlice version happened (RFC 3339).
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
/// The label selector kube-proxy's informers use for Services and EndpointSlices.
pub const PROXIED_OBJECTS_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Whether a Service passes kube-proxy's informer selector
/// ([`PROXIED_OBJECTS_LABEL_SELECTOR`]). Headless and ExternalName services pass it and
/// are skipped later, by [`service_ports`].
pub fn should_proxy_service(svc: &Service) -> bool {
    passes_proxy_selector(&svc.metadata)
}

/// Whether an EndpointSlice passes kube-proxy's informer selector.
pub fn should_proxy_slice(slice: &EndpointSlice) -> bool {
    passes_proxy_selector(&slice.metadata)
}

fn passes_proxy_selector(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_none_or(|labels| {
        !labels.contains_key(LABEL_SERVICE_PROXY_NAME) && !labels.contains_key(LABEL_HEADLESS)
    })
}

/// namespace/name of an object ("" for what is missing).
pub fn object_name(meta: &ObjectMeta) -> NamespacedName {
    NamespacedName::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The longest part of an API-supplied value a log line or refusal reason repeats.
const QUOTED_MAX_CHARS: usize = 64;

/// `text` quoted for a log line or a refusal reason, cut short when long: an object may
/// carry megabytes in a field, and one bad value must not turn into a megabyte log line.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_MAX_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &text[..cut], text.len()),
    }
}
