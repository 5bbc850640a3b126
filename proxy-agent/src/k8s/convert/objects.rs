// SPDX-License-Identifier: Apache-2.0
//! Typed cluster objects from YAML (scenario `objects:` lists, the agent's directory source).

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde::Deserialize;

use crate::model::ObjectKind;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("YAML document {document} is malformed: {source}")]
    Yaml {
        document: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("object {index} of document {document} has no apiVersion or kind")]
    MissingTypeMeta { document: usize, index: usize },
    #[error(
        "object {index} of document {document} is a {api_version} {kind}, which is not supported"
    )]
    UnsupportedKind {
        document: usize,
        index: usize,
        api_version: String,
        kind: String,
    },
    #[error("object {index} of document {document} is not a valid {kind}: {source}")]
    Decode {
        document: usize,
        index: usize,
        kind: ObjectKind,
        #[source]
        source: serde_yaml::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The object kinds the proxy consumes.
#[derive(Clone, Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "objects are parsed once from files; plain variants keep matching simple"
)]
pub enum ClusterObject {
    Service(Service),
    EndpointSlice(EndpointSlice),
    Node(Node),
    ServiceCidr(ServiceCIDR),
}

impl ClusterObject {
    pub fn kind(&self) -> ObjectKind {
        match self {
            ClusterObject::Service(_) => ObjectKind::Service,
            ClusterObject::EndpointSlice(_) => ObjectKind::EndpointSlice,
            ClusterObject::Node(_) => ObjectKind::Node,
            ClusterObject::ServiceCidr(_) => ObjectKind::ServiceCidr,
        }
    }

    /// namespace ("" for cluster-scoped objects) and name.
    pub fn name(&self) -> crate::model::NamespacedName {
        let meta = match self {
            ClusterObject::Service(o) => &o.metadata,
            ClusterObject::EndpointSlice(o) => &o.metadata,
            ClusterObject::Node(o) => &o.metadata,
            ClusterObject::ServiceCidr(o) => &o.metadata,
        };
        super::object_name(meta)
    }
}

/// Parses YAML holding Kubernetes objects: one or more `---`-separated documents, each an
/// object, a sequence of objects (a scenario's `objects:` list), or a `kind: List` with
/// `items`. Empty documents are skipped. Objects are dispatched on `apiVersion` and `kind`;
/// any other kind is an error, so a typo does not silently drop an object.
pub fn parse_objects(yaml: &str) -> Result<Vec<ClusterObject>> {
    parse_objects_map(yaml, |object| object)
}

/// [`parse_objects`], each object passed through `f` as soon as it is decoded. The
/// directory source moves each object into its `Arc` this way: collecting a
/// `Vec<ClusterObject>` first (every object inline, ~1.5 KiB, with doubling slack) costs
/// ~300 MB of peak memory for a 50,000-service manifest.
pub fn parse_objects_map<T>(yaml: &str, mut f: impl FnMut(ClusterObject) -> T) -> Result<Vec<T>> {
    parse_objects_fingerprinted(yaml, |object, _| f(object))
}

/// [`parse_objects_map`], each object passed with a fingerprint of its text as parsed (a
/// hash of its YAML value): equal fingerprints mean an unchanged object, so a reader can
/// keep the fingerprint instead of the object to tell what changed at the next read.
pub fn parse_objects_fingerprinted<T>(
    yaml: &str,
    mut f: impl FnMut(ClusterObject, u64) -> T,
) -> Result<Vec<T>> {
    let mut objects = Vec::new();
    for (document, deserializer) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value = serde_yaml::Value::deserialize(deserializer)
            .map_err(|source| Error::Yaml { document, source })?;
        collect_objects(value, document, &mut |object, fingerprint| {
            objects.push(f(object, fingerprint))
        })?;
    }
    Ok(objects)
}

/// Equal objects give equal fingerprints within one run of the agent (the seed is fixed
/// per process), which is all a re-read compares. foldhash, not SipHash: hashing every
/// byte of 100,000 objects at each read showed as the source's largest cost.
fn fingerprint(value: &serde_yaml::Value) -> u64 {
    use std::hash::BuildHasher as _;
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default)
        .hash_one(value)
}

/// Like [`parse_objects`], for YAML already parsed (a sequence, a `List`, or one object).
pub fn objects_from_value(value: serde_yaml::Value) -> Result<Vec<ClusterObject>> {
    let mut objects = Vec::new();
    collect_objects(value, 0, &mut |object, _| objects.push(object))?;
    Ok(objects)
}

fn collect_objects(
    value: serde_yaml::Value,
    document: usize,
    push: &mut dyn FnMut(ClusterObject, u64),
) -> Result<()> {
    let items = match value {
        serde_yaml::Value::Null => return Ok(()),
        serde_yaml::Value::Sequence(items) => items,
        serde_yaml::Value::Mapping(ref map)
            if map.get("kind").and_then(|kind| kind.as_str()) == Some("List") =>
        {
            match map.get("items") {
                Some(serde_yaml::Value::Sequence(items)) => items.clone(),
                _ => Vec::new(),
            }
        }
        other => vec![other],
    };
    for (index, item) in items.into_iter().enumerate() {
        let fingerprint = fingerprint(&item);
        push(decode_object(item, document, index)?, fingerprint);
    }
    Ok(())
}

fn decode_object(value: serde_yaml::Value, document: usize, index: usize) -> Result<ClusterObject> {
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    let (Some(api_version), Some(kind)) = (field("apiVersion"), field("kind")) else {
        return Err(Error::MissingTypeMeta { document, index });
    };
    let decode_error = |kind: ObjectKind| {
        move |source| Error::Decode {
            document,
            index,
            kind,
            source,
        }
    };
    let object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => ClusterObject::Service(
            serde_yaml::from_value(value).map_err(decode_error(ObjectKind::Service))?,
        ),
        ("discovery.k8s.io/v1", "EndpointSlice") => ClusterObject::EndpointSlice(
            serde_yaml::from_value(value).map_err(decode_error(ObjectKind::EndpointSlice))?,
        ),
        ("v1", "Node") => ClusterObject::Node(
            serde_yaml::from_value(value).map_err(decode_error(ObjectKind::Node))?,
        ),
        ("networking.k8s.io/v1", "ServiceCIDR") => ClusterObject::ServiceCidr(
            serde_yaml::from_value(value).map_err(decode_error(ObjectKind::ServiceCidr))?,
        ),
        _ => {
            return Err(Error::UnsupportedKind {
                document,
                index,
                api_version,
                kind,
            });
        }
    };
    Ok(object)
}
