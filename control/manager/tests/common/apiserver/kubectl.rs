//! What `kubectl` needs of the stand-in beyond the controller's own routes: discovery
//! (`/api`, `/apis`, each group version's resources, `/version`, an empty OpenAPI), and
//! for every served resource create, get, list, watch, replace, merge and strategic merge
//! patch, and delete. A namespace or CRD deleted terminates: what it holds is deleted first
//! (`Objects::settle`). A kubelet and the workload controllers do not run here, so a
//! DaemonSet, Deployment or StatefulSet is reported rolled out on the stand-in's nodes as
//! soon as it is written (its pods are not made). A server-side apply is taken as a merge of
//! the applied object (made when missing), its field manager recorded. What it does not do:
//! field ownership and apply conflicts, JSON patch, `dryRun`, `deletecollection`, the
//! defaulting and validation of schemas.

use super::{Caller, Kind, Objects, RESOURCES, Resource, Shared, Target, collection_in, status};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;

/// Any request the controller's routes do not take.
pub(super) async fn serve(
    State(s): State<Shared>,
    caller: Option<axum::Extension<Caller>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.objects.lock().unwrap().requests.push(format!("{method} {uri}"));
    if method == Method::GET
        && let Some(answer) = discovery(&s, uri.path())
    {
        return answer;
    }
    let not_served =
        || status(404, "NotFound", "the server could not find the requested resource".into());
    let Some(t) = Target::parse(uri.path()) else { return not_served() };
    let Some(r) = served(&s.objects.lock().unwrap())
        .into_iter()
        .find(|r| r.group == t.group && r.version == t.version && r.plural == t.resource)
    else {
        return not_served();
    };
    // A namespaced resource is listed across namespaces too; anything else goes to its scope.
    let listing = method == Method::GET && t.name.is_none();
    if r.namespaced != t.namespace.is_some() && !(listing && r.namespaced) {
        return not_served();
    }
    let query =
        Query::<HashMap<String, String>>::try_from_uri(&uri).map(|q| q.0).unwrap_or_default();
    let admin = caller.is_some_and(|c| c.admin);
    let answer = match (&method, &t.name) {
        (&Method::GET, None) => return collection_in(s, query, &headers, r.kind, t.namespace),
        (&Method::POST, None) => json_body(&headers, &body)
            .and_then(|object| create(&s, r, t.namespace.as_deref(), object, admin)),
        (&Method::GET, Some(name)) => get(&s, r, &key(&t, name), &headers),
        (&Method::PUT, Some(name)) => {
            json_body(&headers, &body).and_then(|object| replace(&s, r, &t, name, object, admin))
        }
        (&Method::PATCH, Some(name)) => patch(&s, r, &t, name, &headers, &body, &query, admin),
        (&Method::DELETE, Some(name)) => delete(&s, r, &key(&t, name), &body),
        _ => Err(refuse(405, "MethodNotAllowed", format!("the stand-in does not {method} {uri}"))),
    };
    if method != Method::GET {
        s.changed.send_modify(|c| *c += 1);
    }
    answer.unwrap_or_else(|refused| *refused)
}

/// An answer, or the refusal (boxed: a `Response` is large).
type Answer = Result<Response, Box<Response>>;

fn refuse(code: u16, reason: &str, message: String) -> Box<Response> {
    Box::new(status(code, reason, message))
}

/// The resources served now: Knitter's own only while their CRDs are stored.
fn served(o: &Objects) -> Vec<&'static Resource> {
    RESOURCES
        .iter()
        .filter(|r| {
            let crd_missing = r.defined_by_crd
                && !o.objects.contains_key(&(Kind::Crds, format!("{}.{}", r.plural, r.group)));
            let multus_missing = r.kind == Kind::Nads && o.no_nad_crd;
            !crd_missing && !multus_missing
        })
        .collect()
}

fn key(t: &Target, name: &str) -> String {
    match &t.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// How the apiserver names a resource in its messages: `secrets`, `daemonsets.apps`.
fn qualified(r: &Resource) -> String {
    match r.group {
        "" => r.plural.to_string(),
        g => format!("{}.{g}", r.plural),
    }
}

fn not_found(r: &Resource, name: &str) -> Box<Response> {
    refuse(404, "NotFound", format!("{} \"{name}\" not found", qualified(r)))
}

/// The discovery documents and the OpenAPI endpoints, if `path` is one.
fn discovery(s: &Shared, path: &str) -> Option<Response> {
    let served = served(&s.objects.lock().unwrap());
    let mut groups: Vec<&Resource> = Vec::new();
    for r in served.iter().filter(|r| !r.group.is_empty()) {
        if !groups.iter().any(|g| g.group == r.group) {
            groups.push(r);
        }
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let answer = match segments.as_slice() {
        ["version"] => {
            json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-knitter-stand-in",
            "platform": "linux/amd64", "goVersion": "go1.23", "compiler": "gc"})
        }
        // An empty OpenAPI v2 document (protobuf's empty message): kubectl finds no schema,
        // so it validates nothing on the client and computes patches from its own types.
        ["openapi", "v2"] => {
            let content_type = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
            return Some(([("content-type", content_type)], Bytes::new()).into_response());
        }
        ["openapi", "v3"] => json!({"paths": {}}),
        ["api"] => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ["apis"] => json!({"kind": "APIGroupList", "apiVersion": "v1",
            "groups": groups.iter().map(|r| api_group(r)).collect::<Vec<_>>()}),
        ["apis", g] => {
            let mut group = api_group(groups.iter().find(|r| r.group == *g)?);
            group["kind"] = json!("APIGroup");
            group["apiVersion"] = json!("v1");
            group
        }
        ["api", "v1"] => api_resources(&served, "", "v1")?,
        ["apis", g, v] => api_resources(&served, g, v)?,
        _ => return None,
    };
    Some(axum::Json(answer).into_response())
}

/// A group as `/apis` lists it: its one version, preferred.
fn api_group(r: &Resource) -> Value {
    let v = json!({"groupVersion": r.kind.api_version(), "version": r.version});
    json!({"name": r.group, "versions": [v], "preferredVersion": v})
}

/// A group version's `APIResourceList`, if it serves anything.
fn api_resources(served: &[&Resource], group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in served.iter().filter(|r| r.group == group && r.version == version) {
        let verbs = ["create", "delete", "get", "list", "patch", "update", "watch"];
        let mut one = json!({"name": r.plural, "singularName": r.singular,
            "namespaced": r.namespaced, "kind": r.object_kind, "verbs": verbs,
            "shortNames": r.short_names});
        use Kind::*;
        if matches!(r.kind, Pods | Services | DaemonSets | Deployments | StatefulSets) {
            one["categories"] = json!(["all"]);
        }
        if r.defined_by_crd {
            one["categories"] = json!(["knitter"]);
        }
        resources.push(one);
        if has_status_subresource(r.kind) {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.object_kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    let group_version =
        if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    (!resources.is_empty()).then(|| {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": resources})
    })
}

/// The object in a body: JSON, or the protobuf kubectl's typed clients send (`protobuf.rs`).
fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, Box<Response>> {
    let content_type =
        headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if content_type == "application/vnd.kubernetes.protobuf" {
        return super::protobuf::decode(body)
            .map_err(|e| refuse(400, "BadRequest", format!("the protobuf body: {e}")));
    }
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| refuse(400, "BadRequest", "the body is not a JSON object".into()))
}

/// The apiserver's NamespaceLifecycle admission: nothing is made in a namespace that is
/// being deleted, or (`must_exist`) that does not exist.
pub(super) fn refuse_in_namespace(
    o: &Objects,
    ns: &str,
    what: &str,
    must_exist: bool,
) -> Option<Response> {
    let Some(namespace) = o.objects.get(&(Kind::Namespaces, ns.to_string())) else {
        return must_exist
            .then(|| status(404, "NotFound", format!("namespaces \"{ns}\" not found")));
    };
    if namespace["metadata"]["deletionTimestamp"].is_null() {
        return None;
    }
    Some(status(
        403,
        "Forbidden",
        format!(
            "{what} is forbidden: unable to create new content in namespace {ns} because it is being terminated"
        ),
    ))
}

/// The admission the stand-in runs on a write (the namespace lifecycle aside): the
/// owner-reference permission check, for the manager's writes.
fn admit(
    s: &Shared,
    admin: bool,
    r: &Resource,
    name: &str,
    object: &Value,
) -> Result<(), Box<Response>> {
    let owners = object["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
    if owners.iter().filter(|o| o["controller"] == true).count() > 1 {
        return Err(refuse(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: metadata.ownerReferences: Invalid value: Only one reference can have Controller set to true",
                qualified(r)
            ),
        ));
    }
    match admin {
        true => Ok(()),
        false => match s.refuse_owner_references(&format!("{} \"{name}\"", qualified(r)), object) {
            Some(refused) => Err(Box::new(refused)),
            None => Ok(()),
        },
    }
}

fn create(s: &Shared, r: &Resource, ns: Option<&str>, mut object: Value, admin: bool) -> Answer {
    let mut o = s.objects.lock().unwrap();
    o.rv += 1;
    let meta = &mut object["metadata"];
    if meta["name"].as_str().is_none_or(str::is_empty)
        && let Some(prefix) = meta["generateName"].as_str()
    {
        meta["name"] = json!(format!("{prefix}{:05x}", o.rv));
    }
    let Some(name) = meta["name"].as_str().filter(|n| !n.is_empty()).map(str::to_string) else {
        return Err(refuse(
            422,
            "Invalid",
            format!("{} is invalid: metadata.name: Required value", r.object_kind),
        ));
    };
    if let Some(ns) = ns {
        if meta["namespace"].as_str().is_some_and(|n| n != ns) {
            return Err(refuse(
                400,
                "BadRequest",
                "the namespace of the object does not match the namespace on the request".into(),
            ));
        }
        meta["namespace"] = json!(ns);
        if let Some(refused) =
            refuse_in_namespace(&o, ns, &format!("{} \"{name}\"", qualified(r)), true)
        {
            return Err(Box::new(refused));
        }
    }
    admit(s, admin, r, &name, &object)?;
    let key = ns.map_or(name.clone(), |ns| format!("{ns}/{name}"));
    if o.objects.contains_key(&(r.kind, key.clone())) {
        return Err(refuse(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(r)),
        ));
    }
    let uid = format!("{}-{}", r.singular, o.rv);
    let meta = &mut object["metadata"];
    meta["uid"] = json!(uid);
    meta["creationTimestamp"] = json!(now());
    meta["generation"] = json!(1);
    object["apiVersion"] = json!(r.kind.api_version());
    object["kind"] = json!(r.object_kind);
    defaults(r.kind, &name, &mut object);
    roll_out(&o, r.kind, &mut object);
    let created = o.write(r.kind, key, object, "ADDED");
    Ok((StatusCode::CREATED, axum::Json(created)).into_response())
}

/// The time now as the API writes it (RFC 3339, seconds).
pub(super) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// What the apiserver fills in that kubectl or the stand-in's own rollout reads.
fn defaults(kind: Kind, name: &str, object: &mut Value) {
    match kind {
        Kind::Namespaces => {
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            object["spec"]["finalizers"] = json!(["kubernetes"]);
            object["status"] = json!({"phase": "Active"});
        }
        Kind::Secrets if object["type"].is_null() => object["type"] = json!("Opaque"),
        Kind::DaemonSets if object["spec"]["updateStrategy"].is_null() => {
            object["spec"]["updateStrategy"] = json!({"type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}});
        }
        Kind::StatefulSets if object["spec"]["updateStrategy"].is_null() => {
            object["spec"]["updateStrategy"] =
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}});
        }
        Kind::Crds => {
            let versions = object["spec"]["versions"].as_array().cloned().unwrap_or_default();
            let stored: Vec<Value> = versions
                .iter()
                .filter(|v| v["storage"] == true)
                .map(|v| v["name"].clone())
                .collect();
            object["status"] = json!({"acceptedNames": object["spec"]["names"].clone(),
                "storedVersions": stored,
                "conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                               {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}]});
        }
        _ => {}
    }
}

/// A workload's status as a rollout to completion leaves it: every node runs a DaemonSet's
/// pod, every replica of a Deployment or StatefulSet is ready (no kubelet runs here).
fn roll_out(o: &Objects, kind: Kind, object: &mut Value) {
    let generation = object["metadata"]["generation"].clone();
    let n = match kind {
        Kind::DaemonSets => o.objects.keys().filter(|(k, _)| *k == Kind::Nodes).count() as i64,
        Kind::Deployments | Kind::StatefulSets => object["spec"]["replicas"].as_i64().unwrap_or(1),
        _ => return,
    };
    object["status"] = match kind {
        Kind::DaemonSets => json!({"observedGeneration": generation, "desiredNumberScheduled": n,
            "currentNumberScheduled": n, "updatedNumberScheduled": n, "numberReady": n,
            "numberAvailable": n, "numberMisscheduled": 0}),
        Kind::StatefulSets => json!({"observedGeneration": generation, "replicas": n,
            "readyReplicas": n, "currentReplicas": n, "updatedReplicas": n, "availableReplicas": n,
            "currentRevision": "r1", "updateRevision": "r1"}),
        _ => json!({"observedGeneration": generation, "replicas": n, "readyReplicas": n,
            "updatedReplicas": n, "availableReplicas": n,
            "conditions": [{"type": "Available", "status": "True"}, {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}),
    };
}

fn get(s: &Shared, r: &Resource, key: &str, headers: &HeaderMap) -> Answer {
    let o = s.objects.lock().unwrap();
    let name = key.rsplit('/').next().unwrap_or(key);
    let object = o.objects.get(&(r.kind, key.to_string())).ok_or_else(|| not_found(r, name))?;
    let metadata = json!({"resourceVersion": o.rv.to_string()});
    if let Some(table) = table(&o, headers, r.kind, std::slice::from_ref(object), metadata) {
        return Ok(axum::Json(table).into_response());
    }
    Ok(axum::Json(object.clone()).into_response())
}

/// `objects` as the `meta.k8s.io/v1` Table `kubectl get` asks for (`Accept: ...;as=Table`),
/// when `kind`'s stored CRD names printer columns: the name, then each column's JSONPath
/// evaluated as the apiserver does (dates as ages). None otherwise (kubectl then prints
/// names and ages itself). `metadata` is the list's (its `continue`).
pub(super) fn table(
    o: &Objects,
    headers: &HeaderMap,
    kind: Kind,
    objects: &[Value],
    metadata: Value,
) -> Option<Value> {
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let r = kind.resource();
    if !accept.contains("as=Table") || !r.defined_by_crd {
        return None;
    }
    let crd = o.objects.get(&(Kind::Crds, format!("{}.{}", r.plural, r.group)))?;
    let version = crd["spec"]["versions"].as_array()?.iter().find(|v| v["name"] == r.version)?;
    let columns = version["additionalPrinterColumns"].as_array()?;
    let mut definitions = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}),
    ];
    definitions.extend(columns.iter().map(|c| {
        json!({"name": c["name"], "type": c["type"], "format": "", "description": "", "priority": c["priority"].as_i64().unwrap_or(0)})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(columns.iter().map(|c| {
                let value = json_path(object, c["jsonPath"].as_str().unwrap_or_default());
                match (c["type"].as_str(), value) {
                    (Some("date"), Value::String(t)) => json!(age(&t)),
                    (_, v) => v,
                }
            }));
            let metadata = object["metadata"].clone();
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}})
        })
        .collect();
    Some(json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
        "columnDefinitions": definitions, "rows": rows}))
}

/// The JSONPath printer columns use: `.a.b.c`, and `[?(@.key=="value")]` picking a list's
/// element. A path that finds nothing gives null (an empty cell).
fn json_path(object: &Value, path: &str) -> Value {
    // Steps split at dots outside brackets (a filter holds dots of its own).
    let (mut steps, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in path.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            '.' if depth == 0 => {
                steps.push(&path[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    steps.push(&path[start..]);
    let mut at = object.clone();
    for step in steps.into_iter().filter(|s| !s.is_empty()) {
        let (field, filter) = match step.split_once("[?(@") {
            Some((field, filter)) => (field, Some(filter)),
            None => (step, None),
        };
        at = at[field].clone();
        if let Some(filter) = filter {
            // `.type=="Ready")]`: the key, then the quoted value.
            let Some((key, value)) = filter.trim_start_matches('.').split_once("==") else {
                return Value::Null;
            };
            let value = value.trim_end_matches(")]").trim_matches('"');
            at = at
                .as_array()
                .and_then(|a| a.iter().find(|e| e[key] == value))
                .cloned()
                .unwrap_or_default();
        }
    }
    at
}

/// How long ago an RFC 3339 time was, as kubectl shows ages (`45s`, `12m`, `3h`, `2d`).
fn age(time: &str) -> String {
    let Ok(then) = time.parse::<k8s_openapi::jiff::Timestamp>() else { return "<unknown>".into() };
    let secs = k8s_openapi::jiff::Timestamp::now().duration_since(then).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Whether writes to the object itself leave its `status` alone (a status subresource).
fn has_status_subresource(kind: Kind) -> bool {
    kind.resource().defined_by_crd
        || matches!(kind, Kind::DaemonSets | Kind::Deployments | Kind::StatefulSets | Kind::Crds)
}

/// Stores `new` over `have` as an update does: identity kept, a subresource's part only,
/// the generation moved when the spec changed, the rollout redone, and an object being
/// deleted whose last finalizer went deleted.
fn update(
    o: &mut Objects,
    r: &Resource,
    key: String,
    have: Value,
    mut new: Value,
    sub: Option<&str>,
) -> Value {
    if sub == Some("status") {
        let status = new["status"].take();
        new = have.clone();
        new["status"] = status;
    } else if has_status_subresource(r.kind) {
        new["status"] = have["status"].clone();
    }
    for field in ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"] {
        match &have["metadata"][field] {
            Value::Null => {}
            v => new["metadata"][field] = v.clone(),
        }
    }
    new["apiVersion"] = json!(r.kind.api_version());
    new["kind"] = json!(r.object_kind);
    let generation = have["metadata"]["generation"].as_i64().unwrap_or(1);
    new["metadata"]["generation"] = json!(generation + i64::from(new["spec"] != have["spec"]));
    roll_out(o, r.kind, &mut new);
    let done = !new["metadata"]["deletionTimestamp"].is_null()
        && new["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty());
    o.write(r.kind, key, new, if done { "DELETED" } else { "MODIFIED" })
}

fn replace(s: &Shared, r: &Resource, t: &Target, name: &str, new: Value, admin: bool) -> Answer {
    admit(s, admin, r, name, &new)?;
    let mut o = s.objects.lock().unwrap();
    let key = key(t, name);
    let have = o.objects.get(&(r.kind, key.clone())).cloned().ok_or_else(|| not_found(r, name))?;
    precondition(r, name, &new["metadata"]["resourceVersion"], &have)?;
    Ok(axum::Json(update(&mut o, r, key, have, new, t.sub.as_deref())).into_response())
}

/// 409 when a write names a `resourceVersion` (`version`, not null) that is not the object's.
fn precondition(
    r: &Resource,
    name: &str,
    version: &Value,
    have: &Value,
) -> Result<(), Box<Response>> {
    if version.is_null() || *version == have["metadata"]["resourceVersion"] {
        return Ok(());
    }
    Err(refuse(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            qualified(r)
        ),
    ))
}

/// A merge patch, a strategic merge patch (built-in kinds only, as the apiserver), or a
/// server-side apply, which the stand-in takes as a merge of the applied object (creating it
/// when missing) recording the field manager in `managedFields` — without field ownership:
/// what a manager stops applying stays, and no conflicts are found.
#[allow(clippy::too_many_arguments)]
fn patch(
    s: &Shared,
    r: &Resource,
    t: &Target,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    query: &HashMap<String, String>,
    admin: bool,
) -> Answer {
    let content_type =
        headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let custom = r.group == "knitter.io"
        || matches!(r.kind, Kind::Nads | Kind::PodMonitors | Kind::ServiceMonitors);
    let patch = json_body(&HeaderMap::new(), body)?;
    let patch_version = patch["metadata"]["resourceVersion"].clone();
    let key = key(t, name);
    let mut o = s.objects.lock().unwrap();
    let have = o.objects.get(&(r.kind, key.clone())).cloned();
    let new = match (content_type, have.clone()) {
        ("application/apply-patch+yaml", have) => {
            let Some(manager) = query.get("fieldManager") else {
                return Err(refuse(
                    400,
                    "BadRequest",
                    "PATCH with an apply patch requires fieldManager".into(),
                ));
            };
            let mut applied = patch;
            applied["metadata"]["managedFields"] = json!([{"manager": manager, "operation": "Apply",
                "apiVersion": r.kind.api_version(), "time": now(), "fieldsType": "FieldsV1"}]);
            let Some(mut new) = have else {
                if !applied["metadata"]["resourceVersion"].is_null() {
                    return Err(not_found(r, name));
                }
                applied["metadata"]["name"] = json!(name);
                drop(o);
                return create(s, r, t.namespace.as_deref(), applied, admin);
            };
            // Lists keyed as the built-in types' (owner references by UID, containers by
            // name): as server-side apply merges them.
            strategic_merge(&mut new, &applied);
            new
        }
        (_, None) => return Err(not_found(r, name)),
        ("application/merge-patch+json", Some(mut new)) => {
            super::merge(&mut new, &patch);
            new
        }
        ("application/strategic-merge-patch+json", Some(mut new)) if !custom => {
            strategic_merge(&mut new, &patch);
            new
        }
        _ => {
            return Err(refuse(
                415,
                "UnsupportedMediaType",
                format!(
                    "the stand-in takes merge patches, server-side applies and strategic merge patches of built-in kinds, not {content_type:?}"
                ),
            ));
        }
    };
    admit(s, admin, r, name, &new)?;
    let have = have.unwrap_or_default();
    precondition(r, name, &patch_version, &have)?;
    Ok(axum::Json(update(&mut o, r, key, have, new, t.sub.as_deref())).into_response())
}

/// A delete, with the `DeleteOptions` body's preconditions (UID, `resourceVersion`: 409
/// when the object is not the one named).
fn delete(s: &Shared, r: &Resource, key: &str, body: &[u8]) -> Answer {
    let mut o = s.objects.lock().unwrap();
    let name = key.rsplit('/').next().unwrap_or(key);
    let have = o.objects.get(&(r.kind, key.to_string())).ok_or_else(|| not_found(r, name))?;
    let options: Value = serde_json::from_slice(body).unwrap_or_default();
    let wanted = &options["preconditions"];
    if !wanted["uid"].is_null() && wanted["uid"] != have["metadata"]["uid"] {
        return Err(refuse(
            409,
            "Conflict",
            format!(
                "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                wanted["uid"], have["metadata"]["uid"]
            ),
        ));
    }
    precondition(r, name, &wanted["resourceVersion"], &have.clone())?;
    let object = o.delete_through_api(r.kind, key).ok_or_else(|| not_found(r, name))?;
    Ok(axum::Json(object).into_response())
}

/// The key list elements of `field` merge by, as the built-in types' `patchMergeKey` says.
fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "ports" if items.iter().any(|i| i.get("containerPort").is_some()) => Some("containerPort"),
        "ports" => Some("port"),
        _ => None,
    }
}

/// Drops patch directives (`$patch`, `$retainKeys`, ...) from a value taken as a whole, and
/// the list elements they say to delete.
fn without_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), without_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                .map(without_directives)
                .collect(),
        ),
        v => v.clone(),
    }
}

/// A strategic merge patch (what `kubectl apply` sends for built-in kinds): a merge patch,
/// except that lists of objects with a merge key merge element by element (an element with
/// `$patch: delete` goes), `finalizers` merge as a set, and the directives `$patch: replace`
/// and `delete`, `$retainKeys` and `$deleteFromPrimitiveList/…` are followed;
/// `$setElementOrder/…` is not (new elements go last).
fn strategic_merge(target: &mut Value, patch: &Value) {
    let (Value::Object(t), Value::Object(p)) = (&mut *target, patch) else {
        *target = without_directives(patch);
        return;
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => return *target = without_directives(patch),
        Some("delete") => return *target = Value::Null,
        _ => {}
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(have)), Value::Array(gone)) = (t.get_mut(field), v) {
                have.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(have)), Value::Array(items)) => merge_list(k, have, items),
            (Some(have @ Value::Object(_)), Value::Object(_)) => {
                strategic_merge(have, v);
                if have.is_null() {
                    t.remove(k);
                }
            }
            _ => {
                t.insert(k.clone(), without_directives(v));
            }
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        t.retain(|k, _| keep.iter().any(|x| x == k));
    }
}

fn merge_list(field: &str, have: &mut Vec<Value>, items: &[Value]) {
    let directive = |i: &Value, d: &str| i.get("$patch").and_then(Value::as_str) == Some(d);
    if items.iter().any(|i| directive(i, "replace")) {
        let kept = items.iter().filter(|i| !directive(i, "replace"));
        *have = kept.map(without_directives).collect();
        return;
    }
    if field == "finalizers" {
        for i in items {
            if !have.contains(i) {
                have.push(i.clone());
            }
        }
        return;
    }
    let Some(key) = merge_key(field, items) else {
        *have = items.iter().map(without_directives).collect();
        return;
    };
    for item in items {
        let at = have.iter().position(|h| h.get(key).is_some() && h.get(key) == item.get(key));
        match (at, item.get("$patch").and_then(Value::as_str)) {
            (Some(i), Some("delete")) => {
                have.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => strategic_merge(&mut have[i], item),
            (None, _) => have.push(without_directives(item)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn printer_column_paths_read_as_the_apiserver_reads_them() {
        let o = json!({"spec": {"kind": "vxlan"}, "status": {"conditions": [
            {"type": "Other", "status": "False"}, {"type": "Ready", "status": "True", "reason": "Created"}]}});
        assert_eq!(super::json_path(&o, ".spec.kind"), "vxlan");
        assert_eq!(
            super::json_path(&o, r#".status.conditions[?(@.type=="Ready")].status"#),
            "True"
        );
        assert_eq!(
            super::json_path(&o, r#".status.conditions[?(@.type=="Ready")].reason"#),
            "Created"
        );
        assert!(super::json_path(&o, ".status.segment").is_null());
    }
}
