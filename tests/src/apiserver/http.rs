// SPDX-License-Identifier: Apache-2.0
//! The HTTP face of the server: URL routing, verbs, and the JSON the apiserver answers with.

use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Query, Request},
    http::{Method, StatusCode, header},
    response::Response,
};
use serde_json::{Value, json};

use super::{
    Outage, Shared,
    error::{Error, Result},
    object,
    requests::{RecordedRequest, Verb},
    resources::{self, ResourceKind},
    selector::{FieldSelector, LabelSelector},
    store::{ListOptions, Selection, WatchStart},
    watch::{self, WatchOptions},
};

const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A request aimed at a resource collection or object.
#[derive(Debug)]
struct ResourceTarget {
    resource: &'static ResourceKind,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

#[derive(Debug)]
enum Target {
    Version,
    CoreVersions,
    GroupList,
    Group(String),
    ResourceList { group: String, version: String },
    Resource(ResourceTarget),
    Unknown,
}

fn resource_target(group: &str, version: &str, rest: &[&str]) -> Target {
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            (Some((*ns).to_string()), [&[*plural][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let Some((plural, tail)) = rest.split_first() else {
        return Target::Unknown;
    };
    let Some(resource) = resources::by_path(group, version, plural) else {
        return Target::Unknown;
    };
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some((*name).to_string()), None),
        [name, sub] => (Some((*name).to_string()), Some((*sub).to_string())),
        _ => return Target::Unknown,
    };
    // A namespaced object is only addressable inside its namespace; a cluster-scoped
    // type has no namespaced paths at all.
    if (namespace.is_some() && !resource.namespaced)
        || (resource.namespaced && namespace.is_none() && name.is_some())
    {
        return Target::Unknown;
    }
    Target::Resource(ResourceTarget {
        resource,
        namespace,
        name,
        subresource,
    })
}

fn parse_target(path: &str) -> Target {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["version"] => Target::Version,
        ["api"] => Target::CoreVersions,
        ["apis"] => Target::GroupList,
        ["apis", group] => Target::Group((*group).to_string()),
        ["api", version] => Target::ResourceList {
            group: String::new(),
            version: (*version).to_string(),
        },
        ["apis", group, version] => Target::ResourceList {
            group: (*group).to_string(),
            version: (*version).to_string(),
        },
        ["api", version, rest @ ..] => resource_target("", version, rest),
        ["apis", group, version, rest @ ..] => resource_target(group, version, rest),
        _ => Target::Unknown,
    }
}

fn is_true(value: Option<&String>) -> bool {
    matches!(value.map(String::as_str), Some("true" | "1"))
}

fn classify(method: &Method, target: &Target, query: &HashMap<String, String>) -> Verb {
    let Target::Resource(t) = target else {
        return Verb::Other;
    };
    match (method.as_str(), t.name.is_some()) {
        ("GET", true) => Verb::Get,
        ("GET", false) if is_true(query.get("watch")) => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => Verb::Other,
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(error: &Error) -> Response {
    let (code, _) = error.code_and_reason();
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &error.to_status(),
    )
}

/// Answers one request and records it in the request log.
pub async fn handle(shared: Arc<Shared>, request: Request) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    let target = parse_target(uri.path());
    let query: HashMap<String, String> = Query::try_from_uri(&uri).map(|q| q.0).unwrap_or_default();
    let verb = classify(&method, &target, &query);
    let mut record = RecordedRequest {
        method: method.to_string(),
        uri: uri.to_string(),
        verb,
        group: String::new(),
        resource: String::new(),
        namespace: None,
        name: None,
        status: 0,
        expired: false,
    };
    if let Target::Resource(t) = &target {
        record.group = t.resource.group.to_string();
        record.resource = t.resource.plural.to_string();
        record.namespace = t.namespace.clone();
        record.name = t.name.clone();
    }

    let (response, expired) = if shared.outage() == Outage::ServiceUnavailable {
        (error_response(&Error::Unavailable), false)
    } else {
        match dispatch(&shared, verb, target, &query, request).await {
            Ok(answer) => answer,
            Err(err) => (error_response(&err), false),
        }
    };
    record.status = response.status().as_u16();
    record.expired = expired;
    tracing::debug!(method = %record.method, uri = %record.uri, status = record.status, "test apiserver request");
    shared.record(record);
    response
}

/// Answers one request; the flag says whether it was a watch answered with `410 Expired`.
async fn dispatch(
    shared: &Arc<Shared>,
    verb: Verb,
    target: Target,
    query: &HashMap<String, String>,
    request: Request,
) -> Result<(Response, bool)> {
    let ok = |value: Value| Ok((json_response(StatusCode::OK, &value), false));
    let not_found = || Error::NoRoute;
    let t = match target {
        Target::Version => return ok(resources::version_document()),
        Target::CoreVersions => return ok(resources::core_versions_document()),
        Target::GroupList => return ok(resources::group_list_document()),
        Target::Group(group) => return ok(resources::group_document(&group).ok_or_else(not_found)?),
        Target::ResourceList { group, version } => {
            return ok(resources::resource_list_document(&group, &version).ok_or_else(not_found)?);
        }
        Target::Unknown => return Err(not_found()),
        Target::Resource(t) => t,
    };
    if t.subresource.as_deref().is_some_and(|s| s != "status")
        || shared.config.unserved.contains(&t.resource.plural)
    {
        return Err(not_found());
    }
    match verb {
        Verb::List => ok(list(shared, &t, query)?),
        Verb::Watch => watch(shared, &t, query),
        Verb::Get => ok(get(shared, &t)?),
        Verb::Create => {
            let body = read_json(request).await?;
            let created = create(shared, &t, body)?;
            Ok((json_response(StatusCode::CREATED, &created), false))
        }
        Verb::Update => {
            let body = read_json(request).await?;
            ok(update(shared, &t, body)?)
        }
        Verb::Patch => {
            let content_type = request
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = read_json(request).await?;
            ok(patch(shared, &t, &content_type, &body)?)
        }
        Verb::Delete => {
            let (namespace, name) = object_address(&t)?;
            let deleted = shared.store().delete(t.resource, &namespace, &name)?;
            ok((*deleted).clone())
        }
        Verb::DeleteCollection => ok(delete_collection(shared, &t, query)?),
        Verb::Other => Err(Error::MethodNotAllowed),
    }
}

async fn read_json(request: Request) -> Result<Value> {
    let bytes = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|e| Error::BadRequest(format!("reading the request body: {e}")))?;
    Ok(serde_json::from_slice(&bytes)?)
}

fn selection(t: &ResourceTarget, query: &HashMap<String, String>) -> Result<Selection> {
    Ok(Selection {
        resource: t.resource,
        namespace: t.namespace.clone(),
        labels: LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?,
        fields: FieldSelector::parse(
            query.get("fieldSelector").map_or("", String::as_str),
            t.resource,
        )?,
    })
}

fn list(shared: &Shared, t: &ResourceTarget, query: &HashMap<String, String>) -> Result<Value> {
    let selection = selection(t, query)?;
    let limit = match query.get("limit").filter(|s| !s.is_empty()) {
        Some(text) => Some(
            text.parse::<usize>()
                .map_err(|_| Error::BadRequest(format!("invalid limit {text:?}")))?,
        ),
        None => None,
    };
    let options = ListOptions {
        limit,
        continue_token: query.get("continue").cloned(),
        resource_version: query.get("resourceVersion").cloned(),
        resource_version_match: query.get("resourceVersionMatch").cloned(),
    };
    let page = shared.store().list(&selection, &options)?;
    let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(token) = page.continue_token {
        metadata["continue"] = Value::String(token);
    }
    if let Some(remaining) = page.remaining_item_count {
        metadata["remainingItemCount"] = Value::from(remaining);
    }
    let items: Vec<&Value> = page.items.iter().map(|o| &**o).collect();
    Ok(json!({
        "kind": t.resource.list_kind,
        "apiVersion": t.resource.api_version(),
        "metadata": metadata,
        "items": items
    }))
}

fn watch(
    shared: &Arc<Shared>,
    t: &ResourceTarget,
    query: &HashMap<String, String>,
) -> Result<(Response, bool)> {
    let selection = selection(t, query)?;
    let bookmarks = is_true(query.get("allowWatchBookmarks"));
    let send_initial_events = query
        .get("sendInitialEvents")
        .map(|v| v == "true" || v == "1");
    let rv = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let start = match send_initial_events {
        Some(true) => {
            if !bookmarks
                || query.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan")
            {
                return Err(Error::Invalid(
                    "sendInitialEvents requires allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan".into(),
                ));
            }
            WatchStart::CurrentState
        }
        // Upstream: an unset or zero version without sendInitialEvents starts with the
        // current state as synthetic ADDED events; an explicit `false` skips them.
        _ if rv.is_empty() || rv == "0" => {
            if send_initial_events == Some(false) {
                WatchStart::After(shared.current_rv())
            } else {
                WatchStart::CurrentState
            }
        }
        _ => WatchStart::After(
            rv.parse()
                .map_err(|_| Error::BadRequest(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let timeout = match query.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(text) => Duration::from_secs(
            text.parse()
                .map_err(|_| Error::BadRequest(format!("invalid timeoutSeconds {text:?}")))?,
        ),
        None => shared.config.default_watch_timeout,
    };
    let options = WatchOptions {
        bookmarks,
        send_initial_events: send_initial_events == Some(true),
        timeout,
        bookmark_interval: shared.config.bookmark_interval,
    };
    let feed = shared.store().watch(selection, start);
    let (body, expired) = match feed {
        Ok(feed) => (
            Body::from_stream(watch::event_stream(
                shared.clone(),
                t.resource,
                feed,
                options,
            )),
            false,
        ),
        Err(err @ Error::Expired(_)) => (
            Body::from_stream(watch::error_stream(err.to_status())),
            true,
        ),
        Err(err) => return Err(err),
    };
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok((response, expired))
}

fn object_address(t: &ResourceTarget) -> Result<(String, String)> {
    let name = t.name.clone().ok_or(Error::MethodNotAllowed)?;
    Ok((t.namespace.clone().unwrap_or_default(), name))
}

fn get(shared: &Shared, t: &ResourceTarget) -> Result<Value> {
    let (namespace, name) = object_address(t)?;
    let object = shared
        .store()
        .get(t.resource, &namespace, &name)
        .ok_or(Error::NotFound {
            resource: t.resource.qualified_name(),
            name,
        })?;
    Ok((*object).clone())
}

/// Checks the body against the URL's namespace and name, filling them in when absent.
fn align_with_url(t: &ResourceTarget, body: &mut Value) -> Result<()> {
    let meta = object::metadata_mut(body)
        .ok_or_else(|| Error::BadRequest("the object is not a JSON object".into()))?;
    if let Some(ns) = &t.namespace {
        match meta
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            Some(given) if given != ns => {
                return Err(Error::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
            _ => {
                meta.insert("namespace".into(), Value::String(ns.clone()));
            }
        }
    }
    if let Some(name) = &t.name {
        match meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            Some(given) if given != name => {
                return Err(Error::BadRequest(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )));
            }
            _ => {
                meta.insert("name".into(), Value::String(name.clone()));
            }
        }
    }
    Ok(())
}

fn create(shared: &Shared, t: &ResourceTarget, mut body: Value) -> Result<Value> {
    if t.resource.namespaced && t.namespace.is_none() {
        return Err(Error::MethodNotAllowed);
    }
    align_with_url(t, &mut body)?;
    Ok((*shared.store().create(t.resource, body)?).clone())
}

/// For the status subresource only `.status` of the body counts.
fn with_status_of(existing: &Value, body: &Value) -> Value {
    let mut merged = existing.clone();
    if let Some(obj) = merged.as_object_mut() {
        match body.get("status") {
            Some(status) => obj.insert("status".into(), status.clone()),
            None => obj.remove("status"),
        };
    }
    if let (Some(meta), Some(rv)) = (
        object::metadata_mut(&mut merged),
        body.pointer("/metadata/resourceVersion"),
    ) {
        meta.insert("resourceVersion".into(), rv.clone());
    }
    merged
}

fn update(shared: &Shared, t: &ResourceTarget, mut body: Value) -> Result<Value> {
    align_with_url(t, &mut body)?;
    let mut store = shared.store();
    if t.subresource.is_some() {
        let (namespace, name) = object_address(t)?;
        let existing = store
            .get(t.resource, &namespace, &name)
            .ok_or(Error::NotFound {
                resource: t.resource.qualified_name(),
                name,
            })?;
        body = with_status_of(&existing, &body);
    }
    Ok((*store.replace(t.resource, body, true)?).clone())
}

/// Merge and strategic-merge patches are both applied as JSON merge patches (lists
/// are replaced rather than merged by key); server-side apply is a merge patch that
/// creates the object when missing, without field ownership.
fn patch(shared: &Shared, t: &ResourceTarget, content_type: &str, body: &Value) -> Result<Value> {
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    let apply = match media_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => false,
        "application/apply-patch+yaml" => true,
        _ => {
            return Err(Error::UnsupportedMediaType(
                "application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml",
            ));
        }
    };
    let (namespace, name) = object_address(t)?;
    let mut store = shared.store();
    let Some(existing) = store.get(t.resource, &namespace, &name) else {
        if apply && t.subresource.is_none() {
            let mut body = body.clone();
            align_with_url(t, &mut body)?;
            return Ok((*store.create(t.resource, body)?).clone());
        }
        return Err(Error::NotFound {
            resource: t.resource.qualified_name(),
            name,
        });
    };
    let mut patched = (*existing).clone();
    object::merge_patch(&mut patched, body);
    if t.subresource.is_some() {
        patched = with_status_of(&existing, &patched);
    }
    align_with_url(t, &mut patched)?;
    Ok((*store.replace(t.resource, patched, !apply)?).clone())
}

fn delete_collection(
    shared: &Shared,
    t: &ResourceTarget,
    query: &HashMap<String, String>,
) -> Result<Value> {
    let selection = selection(t, query)?;
    let mut store = shared.store();
    let page = store.list(&selection, &ListOptions::default())?;
    let mut deleted = Vec::new();
    for object in page.items {
        let namespace = object::namespace(&object).unwrap_or_default().to_string();
        let name = object::name(&object).unwrap_or_default().to_string();
        deleted.push((*store.delete(t.resource, &namespace, &name)?).clone());
    }
    Ok(json!({
        "kind": t.resource.list_kind,
        "apiVersion": t.resource.api_version(),
        "metadata": {"resourceVersion": store.current_rv().to_string()},
        "items": deleted
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(path: &str) -> ResourceTarget {
        match parse_target(path) {
            Target::Resource(t) => t,
            other => panic!("{path} parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_core_and_group_paths() {
        let t = resource("/api/v1/namespaces/default/services/web");
        assert_eq!(t.resource.plural, "services");
        assert_eq!(
            (t.namespace.as_deref(), t.name.as_deref()),
            (Some("default"), Some("web"))
        );

        let t = resource("/api/v1/services");
        assert_eq!((t.namespace, t.name), (None, None));

        let t = resource("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices");
        assert_eq!(t.resource.kind, "EndpointSlice");

        let t = resource("/api/v1/nodes/node-a/status");
        assert_eq!(t.subresource.as_deref(), Some("status"));

        let t = resource("/apis/networking.k8s.io/v1/servicecidrs/kubernetes");
        assert_eq!(t.resource.kind, "ServiceCIDR");
    }

    #[test]
    fn rejects_paths_that_do_not_fit_the_scope() {
        for path in [
            "/api/v1/namespaces/default/nodes",
            "/api/v1/services/web",
            "/api/v1/pods",
            "/apis/discovery.k8s.io/v2/endpointslices",
            "/api/v1/namespaces/default/services/a/b/c",
        ] {
            assert!(matches!(parse_target(path), Target::Unknown), "{path}");
        }
        assert!(matches!(parse_target("/version"), Target::Version));
        assert!(matches!(parse_target("/apis"), Target::GroupList));
    }

    #[test]
    fn classifies_verbs() {
        let target = parse_target("/api/v1/services");
        let watch: HashMap<String, String> = [("watch".to_string(), "1".to_string())].into();
        assert_eq!(classify(&Method::GET, &target, &watch), Verb::Watch);
        assert_eq!(classify(&Method::GET, &target, &HashMap::new()), Verb::List);
        assert_eq!(
            classify(&Method::POST, &target, &HashMap::new()),
            Verb::Create
        );
        let object = parse_target("/api/v1/namespaces/a/services/b");
        assert_eq!(
            classify(&Method::PATCH, &object, &HashMap::new()),
            Verb::Patch
        );
        assert_eq!(
            classify(&Method::DELETE, &object, &HashMap::new()),
            Verb::Delete
        );
    }
}
