// SPDX-License-Identifier: Apache-2.0
//! Label and field selectors as the apiserver parses them from `labelSelector` and
//! `fieldSelector` query parameters.

use serde_json::Value;

use super::{
    error::{Error, Result},
    resources::ResourceKind,
};

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Exists(String),
    DoesNotExist(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl LabelRequirement {
    fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        match self {
            Self::Exists(key) => get(key).is_some(),
            Self::DoesNotExist(key) => get(key).is_none(),
            Self::Equals(key, value) => get(key) == Some(value.as_str()),
            // As upstream: a missing label satisfies `!=` and `notin`.
            Self::NotEquals(key, value) => get(key) != Some(value.as_str()),
            Self::In(key, values) => get(key).is_some_and(|v| values.iter().any(|x| x == v)),
            Self::NotIn(key, values) => !get(key).is_some_and(|v| values.iter().any(|x| x == v)),
        }
    }
}

/// A parsed `labelSelector`: every requirement must hold. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

/// Splits on commas that are not inside a parenthesised value set.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self> {
        let invalid = |why: &str| {
            Error::BadRequest(format!("unable to parse requirement: {why} in {text:?}"))
        };
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in split_top_level(text) {
            let term = term.trim();
            let requirement = if let Some(key) = term.strip_prefix('!') {
                let key = key.trim();
                if !valid_key(key) {
                    return Err(invalid("invalid label key"));
                }
                LabelRequirement::DoesNotExist(key.to_string())
            } else if let Some(open) = term.find('(') {
                let close = term.rfind(')').ok_or_else(|| invalid("missing ')'"))?;
                if close < open || !term[close + 1..].trim().is_empty() {
                    return Err(invalid("unbalanced parentheses"));
                }
                let head: Vec<&str> = term[..open].split_whitespace().collect();
                let values: Vec<String> = term[open + 1..close]
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .collect();
                if values.iter().any(|v| !valid_value(v)) {
                    return Err(invalid("invalid label value"));
                }
                match head.as_slice() {
                    [key, "in"] if valid_key(key) => {
                        LabelRequirement::In((*key).to_string(), values)
                    }
                    [key, "notin"] if valid_key(key) => {
                        LabelRequirement::NotIn((*key).to_string(), values)
                    }
                    _ => return Err(invalid("expected 'key in (...)' or 'key notin (...)'")),
                }
            } else if let Some((key, value)) = term.split_once("!=") {
                LabelRequirement::NotEquals(key.trim().to_string(), value.trim().to_string())
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                LabelRequirement::Equals(key.trim().to_string(), value.trim().to_string())
            } else if valid_key(term) {
                LabelRequirement::Exists(term.to_string())
            } else {
                return Err(invalid("unsupported operator"));
            };
            if let LabelRequirement::Equals(key, value) | LabelRequirement::NotEquals(key, value) =
                &requirement
                && (!valid_key(key) || !valid_value(value))
            {
                return Err(invalid("invalid label key or value"));
            }
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    path: String,
    value: String,
    negated: bool,
}

/// A parsed `fieldSelector`, limited to the field labels the real apiserver accepts
/// for the resource type (an unsupported label is a 400, as upstream).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn parse(text: &str, resource: &ResourceKind) -> Result<Self> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in text.split(',') {
            let term = term.trim();
            let (path, value, negated) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, true)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, v, false)
            } else {
                return Err(Error::BadRequest(format!(
                    "invalid field selector: {term:?}"
                )));
            };
            let path = path.trim();
            if !resource.supports_field_label(path) {
                return Err(Error::BadRequest(format!(
                    "field label not supported: {path}"
                )));
            }
            requirements.push(FieldRequirement {
                path: path.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let pointer = format!("/{}", r.path.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (actual == r.value) != r.negated
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::resources::{NODES, SERVICES};

    fn svc(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn kube_proxy_selector_excludes_labelled_services() {
        let sel = LabelSelector::parse(
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
        )
        .unwrap();
        assert!(sel.matches(&svc(json!({"app": "x"}))));
        assert!(sel.matches(&json!({"metadata": {"name": "no-labels"}})));
        assert!(!sel.matches(&svc(json!({"service.kubernetes.io/headless": ""}))));
        assert!(!sel.matches(&svc(
            json!({"service.kubernetes.io/service-proxy-name": "other"})
        )));
    }

    #[test]
    fn equality_and_existence_operators() {
        let sel = LabelSelector::parse("app=web, tier==front ,env!=prod,zone").unwrap();
        assert!(sel.matches(&svc(json!({"app": "web", "tier": "front", "zone": "a"}))));
        assert!(sel.matches(&svc(
            json!({"app": "web", "tier": "front", "zone": "a", "env": "dev"})
        )));
        assert!(!sel.matches(&svc(
            json!({"app": "web", "tier": "front", "zone": "a", "env": "prod"})
        )));
        assert!(!sel.matches(&svc(json!({"app": "web", "tier": "front"}))));
        assert!(!sel.matches(&svc(json!({"app": "db", "tier": "front", "zone": "a"}))));
    }

    #[test]
    fn set_operators() {
        let sel = LabelSelector::parse("env in (dev, test),tier notin (db)").unwrap();
        assert!(sel.matches(&svc(json!({"env": "dev"}))));
        assert!(sel.matches(&svc(json!({"env": "test", "tier": "web"}))));
        assert!(!sel.matches(&svc(json!({"env": "prod"}))));
        assert!(!sel.matches(&svc(json!({"env": "dev", "tier": "db"}))));
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        for bad in ["a b", "key in dev", "!", "=x", "a=b c", "k in (a"] {
            assert!(
                LabelSelector::parse(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
        assert_eq!(
            LabelSelector::parse("  ").unwrap(),
            LabelSelector::default()
        );
    }

    #[test]
    fn field_selector_on_node_name() {
        let sel = FieldSelector::parse("metadata.name=node-a", &NODES).unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "node-a"}})));
        assert!(!sel.matches(&json!({"metadata": {"name": "node-b"}})));
        let sel = FieldSelector::parse("metadata.name!=node-a", &NODES).unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "node-b"}})));
    }

    #[test]
    fn field_selector_reads_typed_fields_and_rejects_unknown_labels() {
        let sel =
            FieldSelector::parse("spec.type==NodePort,metadata.namespace=ns", &SERVICES).unwrap();
        assert!(
            sel.matches(&json!({"metadata": {"namespace": "ns"}, "spec": {"type": "NodePort"}}))
        );
        assert!(
            !sel.matches(&json!({"metadata": {"namespace": "ns"}, "spec": {"type": "ClusterIP"}}))
        );
        assert!(FieldSelector::parse("spec.selector=x", &SERVICES).is_err());
        assert!(FieldSelector::parse("spec.clusterIP", &SERVICES).is_err());
    }
}
