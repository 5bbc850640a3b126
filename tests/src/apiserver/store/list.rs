// SPDX-License-Identifier: Apache-2.0
//! Lists: consistent snapshots rebuilt from history, resourceVersion rules, paging.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::Value;

use super::{ObjectKey, Selection, Store, key_of};
use crate::apiserver::{
    error::{Error, Result},
    object,
    resources::ResourceKind,
    selector::{FieldSelector, LabelSelector},
};

/// How a list request reads the store.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

pub struct ListPage {
    pub resource_version: u64,
    pub items: Vec<Arc<Value>>,
    pub continue_token: Option<String>,
    pub remaining_item_count: Option<usize>,
}

const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result. \
     You can start a new list without the continue parameter.";

impl Store {
    /// The objects of a type as they were at `rv`, rebuilt by undoing newer history.
    fn snapshot(&self, resource: &ResourceKind, rv: u64) -> BTreeMap<ObjectKey, Arc<Value>> {
        let mut state: BTreeMap<ObjectKey, Arc<Value>> = self
            .objects_of(resource)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for entry in self.history.iter().rev().take_while(|e| e.rv > rv) {
            if !std::ptr::eq(entry.resource, resource) {
                continue;
            }
            let namespace = object::namespace(&entry.object).unwrap_or_default();
            let name = object::name(&entry.object).unwrap_or_default();
            let key = key_of(resource, namespace, name);
            match &entry.prev {
                Some(prev) => state.insert(key, prev.clone()),
                None => state.remove(&key),
            };
        }
        state
    }

    pub fn list(&self, selection: &Selection, options: &ListOptions) -> Result<ListPage> {
        let requested_rv =
            match options
                .resource_version
                .as_deref()
                .filter(|s| !s.is_empty())
            {
                Some(text) => Some(text.parse::<u64>().map_err(|_| {
                    Error::BadRequest(format!("invalid resource version: {text:?}"))
                })?),
                None => None,
            };
        let version_match = options
            .resource_version_match
            .as_deref()
            .filter(|s| !s.is_empty());
        let (read_rv, after) =
            if let Some(token) = options.continue_token.as_deref().filter(|s| !s.is_empty()) {
                if requested_rv.is_some() {
                    return Err(Error::BadRequest(
                        "specifying resource version is not allowed when using continue".into(),
                    ));
                }
                let (rv, after) = decode_continue(token)?;
                if rv < self.floor {
                    return Err(Error::Expired(CONTINUE_TOO_OLD.into()));
                }
                (rv, Some(after))
            } else {
                let exact = match (requested_rv, version_match) {
                    (None, Some(_)) => {
                        return Err(Error::BadRequest(
                            "resourceVersionMatch is forbidden unless resourceVersion is provided"
                                .into(),
                        ));
                    }
                    (Some(_), Some("Exact")) => true,
                    (Some(_), Some("NotOlderThan")) => false,
                    (Some(_), Some(other)) => {
                        return Err(Error::BadRequest(format!(
                            "unsupported resourceVersionMatch {other:?}"
                        )));
                    }
                    // Without a match rule, a non-zero version is exact when paging, as upstream.
                    (Some(rv), None) => rv != 0 && options.limit.is_some_and(|l| l > 0),
                    (None, None) => false,
                };
                match requested_rv {
                    Some(rv) if rv > self.rv => {
                        return Err(Error::TooLargeResourceVersion {
                            requested: rv,
                            current: self.rv,
                        });
                    }
                    Some(0) if exact => {
                        return Err(Error::BadRequest(
                            "an exact resourceVersion must be non-zero".into(),
                        ));
                    }
                    Some(rv) if exact && rv < self.floor => return Err(self.expired(rv)),
                    Some(rv) if exact => (rv, None),
                    _ => (self.rv, None),
                }
            };

        let state = self.snapshot(selection.resource, read_rv);
        let mut matching = state
            .iter()
            .filter(|(k, _)| after.as_ref().is_none_or(|a| (&k.2, &k.3) > (&a.0, &a.1)))
            .filter(|(_, o)| selection.matches(o));
        let limit = options.limit.filter(|l| *l > 0);
        let mut items = Vec::new();
        let mut last_key = None;
        for (key, object) in matching.by_ref() {
            if limit.is_some_and(|l| items.len() >= l) {
                // One more exists: this page ends at the previous item.
                let remaining = 1 + matching.count();
                let continue_token = last_key.map(|(ns, name)| encode_continue(read_rv, ns, name));
                let unfiltered = selection.labels == LabelSelector::default()
                    && selection.fields == FieldSelector::default();
                return Ok(ListPage {
                    resource_version: read_rv,
                    items,
                    continue_token,
                    remaining_item_count: unfiltered.then_some(remaining),
                });
            }
            items.push(object.clone());
            last_key = Some((&key.2, &key.3));
        }
        Ok(ListPage {
            resource_version: read_rv,
            items,
            continue_token: None,
            remaining_item_count: None,
        })
    }
}

/// Continue tokens are opaque to clients: hex of `rv \n namespace \n name`.
pub(super) fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    format!("{rv}\n{namespace}\n{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn decode_continue(token: &str) -> Result<(u64, (String, String))> {
    let invalid = || Error::BadRequest(format!("invalid continue token {token:?}"));
    if !token.len().is_multiple_of(2) {
        return Err(invalid());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let mut parts = text.splitn(3, '\n');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(rv), Some(ns), Some(name)) => {
            let rv = rv.parse().map_err(|_| invalid())?;
            Ok((rv, (ns.to_string(), name.to_string())))
        }
        _ => Err(invalid()),
    }
}
