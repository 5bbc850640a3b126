// SPDX-License-Identifier: Apache-2.0
//! Typed cluster objects from YAML (scenario `objects:` lists, the agent's directory source).

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::{model::ObjectKind, parallel};

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
    #[error("JSON value {document} is malformed: {source}")]
    Json {
        document: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("object {index} of JSON value {document} is not a valid {kind}: {source}")]
    DecodeJson {
        document: usize,
        index: usize,
        kind: ObjectKind,
        #[source]
        source: serde_json::Error,
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
/// directory source converts each object for the model this way, and drops it:
/// collecting a `Vec<ClusterObject>` first (every object inline, ~1.5 KiB, with doubling
/// slack) costs ~300 MB of peak memory for a 50,000-service manifest.
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

/// [`parse_objects_fingerprinted`] for JSON: one or more JSON values one after the other,
/// each an object, an array of objects, or a `List` with `items`, as the YAML form takes
/// them. Each object is decoded straight from its text into its type, and its fingerprint
/// is a hash of that text.
///
/// Why a second parser: JSON is what the API server sends, and it is YAML too, but the
/// YAML parser builds a generic tree of every object before decoding it. A 100,000-service
/// manifest took seconds that way, most of a cold start from the directory source.
///
/// A big text (a few thousand objects or more) is decoded on several threads, and `f` runs
/// on them too, right after each object's decoding: what it makes comes back in the text's
/// order, and the error returned is the first one in that order. (Passing the decoded
/// objects back to the calling thread first moved every one, ~1.5 KiB inline, twice more
/// through fresh memory, on one thread while the others waited: a fifth of a 100,000-service
/// manifest's reading.) The objects are made as the decoder makes them, lists with their
/// doubling slack: the directory source converts each one and drops it on the same
/// thread, so trimming them (a copy of each list) would only cost time.
pub fn parse_json_objects_fingerprinted<T: Send>(
    json: &str,
    f: impl Fn(ClusterObject, u64) -> T + Sync,
) -> Result<Vec<T>> {
    // The objects' texts first (a scan, no decoding), then the decoding, in parallel.
    let (mut items, scan_error) = json_items(json);
    let mut objects = Vec::with_capacity(items.len());
    let workers = parallel::workers_for(items.len(), PARALLEL_DECODE_MIN);
    for round in items.chunks_mut(workers * DECODE_CHUNK) {
        for made in parallel::map_each(round, workers, |(document, index, item)| {
            let object = decode_json_object(item, *document, *index)?;
            Ok(f(object, fingerprint_text(item.get())))
        }) {
            objects.push(made?);
        }
    }
    // An error in the text after the last good object comes after that object's own
    // errors, as a reader going through the text in order would meet them.
    match scan_error {
        Some(error) => Err(error),
        None => Ok(objects),
    }
}

/// Manifests with fewer objects are decoded on the calling thread alone.
const PARALLEL_DECODE_MIN: usize = 4_096;
/// Each decoding thread takes this many objects at a time, and what they make is put in
/// order before the next round: what is held besides the results stays a few thousand
/// items, whatever the size of the manifest.
const DECODE_CHUNK: usize = 1_024;

/// One object's text with where it was: (document, index in that document).
pub(in crate::k8s::convert) type JsonItem<'a> = (usize, usize, &'a RawValue);

/// The objects of a JSON text in order, and the error that stopped the scan, if one did
/// (the objects before it are returned).
///
/// A big text is scanned in two halves at once, split where a line starts a top-level
/// value (`{` or `[` right after a newline: one object per line, as tools write them). A
/// newline is never inside a JSON string, so the split is sound exactly when the first
/// half scans as whole values to its end; when it does not (the `{` was inside a value),
/// or when either half meets an error (whose line and column must count from the start
/// of the text), the text is scanned again whole. The scan of a 100,000-service manifest
/// (100 MB) was a serial tenth of a second in its reading.
fn json_items(json: &str) -> (Vec<JsonItem<'_>>, Option<Error>) {
    json_items_split_from(json, PARALLEL_SCAN_MIN)
}

/// [`json_items`], splitting texts of `min` bytes or more.
pub(in crate::k8s::convert) fn json_items_split_from(
    json: &str,
    min: usize,
) -> (Vec<JsonItem<'_>>, Option<Error>) {
    if parallel::workers_for(json.len(), min) > 1
        && let Some(split) = top_level_split(json)
    {
        let (head, tail) = json.split_at(split);
        let ((mut items, head_error, documents), (tail_items, tail_error, _)) =
            parallel::both(true, || scan_documents(head), || scan_documents(tail));
        if head_error.is_none() && tail_error.is_none() {
            items.extend(
                tail_items
                    .into_iter()
                    .map(|(document, index, item)| (document + documents, index, item)),
            );
            return (items, None);
        }
    }
    let (items, error, _) = scan_documents(json);
    (items, error)
}

/// Texts shorter than this are scanned on the calling thread alone (a few thousand
/// objects).
const PARALLEL_SCAN_MIN: usize = 4 << 20;
/// How far past the middle of a text [`top_level_split`] looks for a line that starts a
/// value (a text whose lines are indented has none: it is scanned whole).
const SPLIT_SEARCH: usize = 64 << 10;

/// Where a line starting with `{` or `[` begins, at or after the middle of `json` and
/// within [`SPLIT_SEARCH`] bytes of it.
pub(in crate::k8s::convert) fn top_level_split(json: &str) -> Option<usize> {
    let bytes = json.as_bytes();
    let middle = bytes.len() / 2;
    let window = &bytes[middle..bytes.len().min(middle + SPLIT_SEARCH)];
    window
        .windows(2)
        .position(|pair| pair[0] == b'\n' && matches!(pair[1], b'{' | b'['))
        // Just past the newline: an ASCII byte, so a char boundary.
        .map(|at| middle + at + 1)
}

/// The objects of the JSON values in `json`, numbered by value from 0, the error that
/// stopped the scan if one did, and how many values were read.
fn scan_documents(json: &str) -> (Vec<JsonItem<'_>>, Option<Error>, usize) {
    let mut out = Vec::new();
    let values = serde_json::Deserializer::from_str(json).into_iter::<&RawValue>();
    let mut documents = 0;
    for (document, value) in values.enumerate() {
        match document_items(value, document) {
            Ok(items) => out.extend(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(index, item)| (document, index, item)),
            ),
            Err(error) => return (out, Some(error), document),
        }
        documents = document + 1;
    }
    (out, None, documents)
}

/// The objects of one JSON value: itself, an array's elements, a `List`'s items, or none
/// for `null`.
fn document_items(value: serde_json::Result<&RawValue>, document: usize) -> Result<Vec<&RawValue>> {
    let value = value.map_err(|source| Error::Json { document, source })?;
    Ok(match value.get().as_bytes().first() {
        Some(b'[') => {
            serde_json::from_str(value.get()).map_err(|source| Error::Json { document, source })?
        }
        // Only a text that holds "List" (or spells a string with escapes) can be one: the
        // others are taken whole without a parse of their type here (each object's text
        // is parsed again when it is decoded; a cold start reads 200,000 of them).
        Some(b'{') if !value.get().contains("\"List\"") && !value.get().contains("\\u") => {
            vec![value]
        }
        Some(b'{') => {
            let meta: JsonTypeMeta<'_> = serde_json::from_str(value.get())
                .map_err(|source| Error::Json { document, source })?;
            if meta.kind.as_deref() == Some("List") {
                let list: JsonList<'_> = serde_json::from_str(value.get())
                    .map_err(|source| Error::Json { document, source })?;
                list.items
            } else {
                vec![value]
            }
        }
        Some(b'n') => Vec::new(),
        _ => vec![value],
    })
}

/// An object's `apiVersion` and `kind`, read from its text without the rest.
#[derive(Deserialize)]
struct JsonTypeMeta<'a> {
    #[serde(rename = "apiVersion", borrow, default)]
    api_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct JsonList<'a> {
    #[serde(borrow, default)]
    items: Vec<&'a RawValue>,
}

fn decode_json_object(item: &RawValue, document: usize, index: usize) -> Result<ClusterObject> {
    let text = item.get();
    // Not an object, or one without both fields: what the YAML form reports.
    let missing = || Error::MissingTypeMeta { document, index };
    let meta: JsonTypeMeta<'_> = serde_json::from_str(text).map_err(|_| missing())?;
    let (Some(api_version), Some(kind)) = (meta.api_version, meta.kind) else {
        return Err(missing());
    };
    decode_named(JsonText(text), document, index, &api_version, &kind)
}

/// The fingerprint of an object's JSON text (see [`fingerprint`]): another spelling of
/// the same object reads as a change, which costs one needless event and nothing else.
fn fingerprint_text(text: &str) -> u64 {
    use std::hash::BuildHasher as _;
    fingerprint_seed().hash_one(text)
}

fn fingerprint_seed() -> &'static foldhash::fast::RandomState {
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default)
}

/// Equal objects give equal fingerprints within one run of the agent (the seed is fixed
/// per process), which is all a re-read compares. foldhash, not SipHash: hashing every
/// byte of 100,000 objects at each read showed as the source's largest cost.
fn fingerprint(value: &serde_yaml::Value) -> u64 {
    use std::hash::BuildHasher as _;
    fingerprint_seed().hash_one(value)
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
    decode_named(YamlTree(value), document, index, &api_version, &kind)
}

/// The kind an object's `apiVersion` and `kind` name, when it is one the proxy consumes:
/// any other is an error, so that a typo does not silently drop an object.
fn consumed_kind(
    document: usize,
    index: usize,
    api_version: &str,
    kind: &str,
) -> Result<ObjectKind> {
    match (api_version, kind) {
        ("v1", "Service") => Ok(ObjectKind::Service),
        ("discovery.k8s.io/v1", "EndpointSlice") => Ok(ObjectKind::EndpointSlice),
        ("v1", "Node") => Ok(ObjectKind::Node),
        ("networking.k8s.io/v1", "ServiceCIDR") => Ok(ObjectKind::ServiceCidr),
        _ => Err(Error::UnsupportedKind {
            document,
            index,
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        }),
    }
}

/// One object in the form a parser left it, decodable into any of the object types.
trait ObjectDecoder {
    type Error;
    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, Self::Error>;
    /// The error that says object `index` of `document`, of `kind`, did not decode.
    fn failed(document: usize, index: usize, kind: ObjectKind, source: Self::Error) -> Error;
}

/// A YAML object, parsed into a tree.
struct YamlTree(serde_yaml::Value);

impl ObjectDecoder for YamlTree {
    type Error = serde_yaml::Error;
    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, Self::Error> {
        serde_yaml::from_value(self.0)
    }
    fn failed(document: usize, index: usize, kind: ObjectKind, source: Self::Error) -> Error {
        Error::Decode {
            document,
            index,
            kind,
            source,
        }
    }
}

/// A JSON object's text.
struct JsonText<'a>(&'a str);

impl ObjectDecoder for JsonText<'_> {
    type Error = serde_json::Error;
    fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, Self::Error> {
        serde_json::from_str(self.0)
    }
    fn failed(document: usize, index: usize, kind: ObjectKind, source: Self::Error) -> Error {
        Error::DecodeJson {
            document,
            index,
            kind,
            source,
        }
    }
}

/// Decodes object `index` of `document`, whose `apiVersion` and `kind` were read from it,
/// as the type they name (an error for a kind the proxy does not consume).
fn decode_named<D: ObjectDecoder>(
    object: D,
    document: usize,
    index: usize,
    api_version: &str,
    kind: &str,
) -> Result<ClusterObject> {
    let kind = consumed_kind(document, index, api_version, kind)?;
    decode_as(kind, object).map_err(|source| D::failed(document, index, kind, source))
}

/// Decodes `object` as the type of `kind`.
fn decode_as<D: ObjectDecoder>(kind: ObjectKind, object: D) -> Result<ClusterObject, D::Error> {
    Ok(match kind {
        ObjectKind::Service => ClusterObject::Service(object.decode()?),
        ObjectKind::EndpointSlice => ClusterObject::EndpointSlice(object.decode()?),
        ObjectKind::Node => ClusterObject::Node(object.decode()?),
        ObjectKind::ServiceCidr => ClusterObject::ServiceCidr(object.decode()?),
    })
}
