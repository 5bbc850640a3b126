// SPDX-License-Identifier: Apache-2.0
//! Helpers over objects kept as JSON: metadata access, merge patches, timestamps.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde_json::{Map, Value};

pub fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

pub fn name(object: &Value) -> Option<&str> {
    meta_str(object, "name")
}

pub fn namespace(object: &Value) -> Option<&str> {
    meta_str(object, "namespace")
}

/// The object's `metadata` map, created when missing. `None` only when the object
/// itself (or its metadata) is not a JSON object.
pub fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let obj = object.as_object_mut()?;
    obj.entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
}

pub fn set_resource_version(object: &mut Value, rv: u64) {
    if let Some(meta) = metadata_mut(object) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// The current time as the apiserver writes `creationTimestamp` (RFC 3339, seconds).
pub fn now_timestamp() -> Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null)
}

/// JSON merge patch (RFC 7386): objects merge key by key, `null` removes a key,
/// anything else (lists included) replaces the target wholesale.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Whether two versions of an object differ in anything a client could observe,
/// ignoring the server-maintained resourceVersion and managedFields.
pub fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(meta) = metadata_mut(&mut v) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
        }
        v
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(
            &mut target,
            &json!({"a": "z", "c": {"f": null, "h": 1}, "l": [3]}),
        );
        assert_eq!(target, json!({"a": "z", "c": {"d": "e", "h": 1}, "l": [3]}));
    }

    #[test]
    fn same_content_ignores_resource_version_only() {
        let a = json!({"metadata": {"name": "x", "resourceVersion": "1"}, "spec": {"p": 1}});
        let b = json!({"metadata": {"name": "x", "resourceVersion": "7"}, "spec": {"p": 1}});
        let c = json!({"metadata": {"name": "x", "resourceVersion": "1"}, "spec": {"p": 2}});
        assert!(same_content(&a, &b));
        assert!(!same_content(&a, &c));
    }

    #[test]
    fn timestamp_is_rfc3339() {
        let ts = now_timestamp();
        let text = ts.as_str().unwrap();
        assert!(text.ends_with('Z') && text.contains('T'), "{text}");
    }
}
