//! A Kubernetes API server stand-in for the controller's tests and for `kubectl` (no
//! kube-apiserver runs on these machines), over plain HTTP, answering the real `kube` client
//! and kubectl as an API server does; `examples/apiserver.rs` serves it as a program.
//!
//! The controller's routes (this file): one `resourceVersion` counter across objects; lists
//! of pods, nodes, namespaces, `networks.knitter.io`, `ipgroups.knitter.io`,
//! `clusters.knitter.io` and
//! `network-attachment-definitions.k8s.cni.cncf.io`, paged as the apiserver pages (`limit`,
//! `continue`), with 429 and `Retry-After` when told to ([`ApiServer::throttle_lists`]);
//! `labelSelector` and `fieldSelector` (the fields the apiserver selects by, per kind) of
//! `key=value` terms, ANDed, on lists and watches; `?watch=true` streams newline-delimited
//! watch events after the given version (`ADDED`, `MODIFIED`, `DELETED`; a `BOOKMARK` after
//! a quiet second when `allowWatchBookmarks`), and a watch from a version older than the
//! history it keeps gets the `ERROR` event with the `Expired` Status and code 410;
//! `timeoutSeconds` ends a watch. `GET` and JSON merge `PATCH` (RFC 7386) of one pod; the
//! custom resources' `status` subresource by merge patch (only `status` is taken;
//! `metadata.generation` moves only when a write changes `spec`); the custom resources
//! themselves by merge patch with a `metadata.resourceVersion` precondition (409),
//! finalizers honoured (a delete with finalizers sets `deletionTimestamp` and moves the
//! generation; removing the last one deletes); `GET`/`POST`/`PUT` of
//! `coordination.k8s.io/v1` Leases (404, 409 `AlreadyExists`, 409 `Conflict`);
//! `events.k8s.io/v1` Events by `POST` and merge `PATCH` (shown as core `v1` Events too).
//! These routes answer whether or not the CRDs are stored (the controller's tests store
//! none); kubectl's discovery shows Knitter's kinds only once they are.
//!
//! Everything else (`apiserver/kubectl.rs`), NADs included: discovery, every resource in
//! [`RESOURCES`] created (409 `AlreadyExists`; 404 in a namespace that does not exist, 403
//! in one being terminated, as the lifecycle admission answers; the owner-reference
//! permission check), read, listed, watched, replaced (409 `Conflict` on a stale
//! `resourceVersion`), merge- and strategic-merge-patched, applied (server-side, as a
//! merge) and deleted; kubectl's protobuf bodies read (`apiserver/protobuf.rs`); namespaces
//! and CRDs that terminate; workloads reported rolled out.
//!
//! Every request on [`ApiServer::url`] is authorized against the shipped RBAC ([`Rbac`]:
//! the manager's ClusterRole and Lease Role from `deploy/kubernetes`): one the manifests do
//! not grant is answered 403 as the apiserver's RBAC authorizer would, and fails the test
//! when the server is dropped, so the manifests cannot drift from what the controller does.
//! [`ApiServer::admin_url`] is the cluster admin's. What it does not model: authentication,
//! set-based label selectors, `sendInitialEvents`, admission beyond
//! the namespace lifecycle and owner references, CRD schema validation (the tests check what
//! the controller writes against the CRDs' schemas separately), most server-side defaulting,
//! field ownership in server-side apply, tables of built-in kinds (`kubectl get` shows their names and ages only; Knitter's kinds get their printer columns), the garbage collector
//! (owner references are kept, never acted on) and a kubelet (no pod runs). A [`Door`] is a
//! way in that can be stalled: its connections stop passing bytes, as a hung apiserver
//! connection or a partition does.

#[path = "apiserver/kubectl.rs"]
mod kubectl;
#[path = "apiserver/protobuf.rs"]
mod protobuf;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, PodSpec};
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Pods,
    Nodes,
    Namespaces,
    Networks,
    IpGroups,
    /// `clusters.knitter.io`.
    KnitterClusters,
    Nads,
    // What an install writes (kubectl against the stand-in: `kubectl.rs`).
    Secrets,
    ConfigMaps,
    ServiceAccounts,
    Services,
    Pvcs,
    DaemonSets,
    Deployments,
    StatefulSets,
    Pdbs,
    ClusterRoles,
    ClusterRoleBindings,
    Roles,
    RoleBindings,
    Crds,
    PodMonitors,
    ServiceMonitors,
    /// `v1` Events: the `events.k8s.io/v1` Events the controller writes, as the core API
    /// shows them (`kubectl get events`, `kubectl describe`).
    Events,
}

/// A resource the stand-in serves: where it lives and what its objects are called.
pub struct Resource {
    pub kind: Kind,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub object_kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Served only while its CustomResourceDefinition is stored (Knitter's own CRDs; the
    /// NADs' and the monitors' are taken as installed by Multus and the Prometheus Operator).
    pub defined_by_crd: bool,
}

const fn resource(
    kind: Kind,
    group: &'static str,
    version: &'static str,
    (plural, singular, object_kind): (&'static str, &'static str, &'static str),
    namespaced: bool,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        kind,
        group,
        version,
        plural,
        singular,
        object_kind,
        namespaced,
        short_names,
        defined_by_crd: false,
    }
}

/// Every resource the stand-in serves.
pub const RESOURCES: &[Resource] = &[
    resource(Kind::Pods, "", "v1", ("pods", "pod", "Pod"), true, &["po"]),
    resource(Kind::Nodes, "", "v1", ("nodes", "node", "Node"), false, &["no"]),
    resource(Kind::Namespaces, "", "v1", ("namespaces", "namespace", "Namespace"), false, &["ns"]),
    resource(Kind::Secrets, "", "v1", ("secrets", "secret", "Secret"), true, &[]),
    resource(Kind::Events, "", "v1", ("events", "event", "Event"), true, &["ev"]),
    resource(Kind::ConfigMaps, "", "v1", ("configmaps", "configmap", "ConfigMap"), true, &["cm"]),
    resource(
        Kind::ServiceAccounts,
        "",
        "v1",
        ("serviceaccounts", "serviceaccount", "ServiceAccount"),
        true,
        &["sa"],
    ),
    resource(Kind::Services, "", "v1", ("services", "service", "Service"), true, &["svc"]),
    resource(
        Kind::Pvcs,
        "",
        "v1",
        ("persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim"),
        true,
        &["pvc"],
    ),
    resource(
        Kind::DaemonSets,
        "apps",
        "v1",
        ("daemonsets", "daemonset", "DaemonSet"),
        true,
        &["ds"],
    ),
    resource(
        Kind::Deployments,
        "apps",
        "v1",
        ("deployments", "deployment", "Deployment"),
        true,
        &["deploy"],
    ),
    resource(
        Kind::StatefulSets,
        "apps",
        "v1",
        ("statefulsets", "statefulset", "StatefulSet"),
        true,
        &["sts"],
    ),
    resource(
        Kind::Pdbs,
        "policy",
        "v1",
        ("poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget"),
        true,
        &["pdb"],
    ),
    resource(
        Kind::ClusterRoles,
        "rbac.authorization.k8s.io",
        "v1",
        ("clusterroles", "clusterrole", "ClusterRole"),
        false,
        &[],
    ),
    resource(
        Kind::ClusterRoleBindings,
        "rbac.authorization.k8s.io",
        "v1",
        ("clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding"),
        false,
        &[],
    ),
    resource(Kind::Roles, "rbac.authorization.k8s.io", "v1", ("roles", "role", "Role"), true, &[]),
    resource(
        Kind::RoleBindings,
        "rbac.authorization.k8s.io",
        "v1",
        ("rolebindings", "rolebinding", "RoleBinding"),
        true,
        &[],
    ),
    resource(
        Kind::Crds,
        "apiextensions.k8s.io",
        "v1",
        ("customresourcedefinitions", "customresourcedefinition", "CustomResourceDefinition"),
        false,
        &["crd", "crds"],
    ),
    Resource {
        defined_by_crd: true,
        ..resource(
            Kind::Networks,
            "knitter.io",
            "v1alpha1",
            ("networks", "network", "Network"),
            false,
            &["knet"],
        )
    },
    Resource {
        defined_by_crd: true,
        ..resource(
            Kind::IpGroups,
            "knitter.io",
            "v1alpha1",
            ("ipgroups", "ipgroup", "IPGroup"),
            false,
            &["ipg"],
        )
    },
    Resource {
        defined_by_crd: true,
        ..resource(
            Kind::KnitterClusters,
            "knitter.io",
            "v1alpha1",
            ("clusters", "cluster", "Cluster"),
            false,
            &["kcluster"],
        )
    },
    resource(
        Kind::Nads,
        "k8s.cni.cncf.io",
        "v1",
        (
            "network-attachment-definitions",
            "network-attachment-definition",
            "NetworkAttachmentDefinition",
        ),
        true,
        &["net-attach-def"],
    ),
    resource(
        Kind::PodMonitors,
        "monitoring.coreos.com",
        "v1",
        ("podmonitors", "podmonitor", "PodMonitor"),
        true,
        &["pmon"],
    ),
    resource(
        Kind::ServiceMonitors,
        "monitoring.coreos.com",
        "v1",
        ("servicemonitors", "servicemonitor", "ServiceMonitor"),
        true,
        &["smon"],
    ),
];

impl Kind {
    pub fn resource(self) -> &'static Resource {
        RESOURCES.iter().find(|r| r.kind == self).expect("every kind is in RESOURCES")
    }

    /// The collection's path (cluster-wide), its list kind and its objects' kind.
    fn names(self) -> (String, String, &'static str) {
        let r = self.resource();
        let path = match r.group {
            "" => format!("/api/v1/{}", r.plural),
            g => format!("/apis/{g}/{}/{}", r.version, r.plural),
        };
        (path, format!("{}List", r.object_kind), r.object_kind)
    }

    fn api_version(self) -> String {
        let r = self.resource();
        match r.group {
            "" => r.version.to_string(),
            g => format!("{g}/{}", r.version),
        }
    }
}

/// Which objects a list or watch wants: a `labelSelector` and a `fieldSelector` of
/// `key=value` terms (ANDed; fields by their dotted path, those the apiserver selects by for
/// the kind: [`Selector::field_indexed`]), and the namespace of the path.
struct Selector {
    kind: Kind,
    labels: Option<String>,
    fields: Option<String>,
    namespace: Option<String>,
}

impl Selector {
    fn terms(selector: &Option<String>) -> impl Iterator<Item = (&str, &str)> {
        let terms = selector.as_deref().unwrap_or_default().split(',').filter(|t| !t.is_empty());
        terms.map(|t| t.split_once('=').map_or((t, ""), |(k, v)| (k.trim(), v.trim())))
    }

    /// The answer refusing a selector the stand-in cannot evaluate, as the apiserver refuses
    /// a field it does not index.
    fn refuse(&self) -> Option<Response> {
        let labels = self.labels.as_deref().unwrap_or_default();
        if labels.contains('!') || labels.contains(" in ") || labels.contains("==") {
            return Some(status(
                400,
                "BadRequest",
                format!("the stand-in reads equality label selectors only, not {labels:?}"),
            ));
        }
        let fields = self.fields.as_deref().unwrap_or_default();
        if fields.contains('!') {
            return Some(status(
                400,
                "BadRequest",
                format!("the stand-in reads equality field selectors only, not {fields:?}"),
            ));
        }
        let unknown = Self::terms(&self.fields).find(|(k, _)| !self.field_indexed(k))?;
        Some(status(400, "BadRequest", format!("field label not supported: {}", unknown.0)))
    }

    /// The fields the apiserver selects by for this kind: every kind's name and namespace,
    /// and a few of Pods', Nodes', Namespaces', Secrets' and Events'.
    fn field_indexed(&self, field: &str) -> bool {
        let by_kind: &[&str] = match self.kind {
            Kind::Pods => &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Kind::Nodes => &["spec.unschedulable"],
            Kind::Namespaces => &["status.phase"],
            Kind::Secrets => &["type"],
            Kind::Events => &[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            _ => &[],
        };
        matches!(field, "metadata.name" | "metadata.namespace") || by_kind.contains(&field)
    }

    fn selects(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        // A field the object lacks reads as empty, as the apiserver's field sets give it.
        let field = |k: &str| {
            // An Event's `source` is its component, as the apiserver's field set gives it.
            let k = if k == "source" { "source.component" } else { k };
            Some(k.split('.').fold(object, |v, part| &v[part]).as_str().unwrap_or(""))
        };
        self.namespace.as_ref().is_none_or(|ns| meta["namespace"].as_str() == Some(ns))
            && Self::terms(&self.labels).all(|(k, v)| meta["labels"][k].as_str() == Some(v))
            && Self::terms(&self.fields).all(|(k, v)| field(k) == Some(v))
    }
}

struct Event {
    rv: u64,
    kind: Kind,
    typ: &'static str,
    object: Value,
}

#[derive(Default)]
struct Objects {
    rv: u64,
    objects: BTreeMap<(Kind, String), Value>,
    leases: BTreeMap<String, Value>,
    /// `events.k8s.io/v1` Events by `namespace/name`.
    events: BTreeMap<String, Value>,
    log: Vec<Event>,
    /// Watches from a version below this get 410 (their history is gone).
    oldest: u64,
    /// Bumped to end every open watch.
    cut: u64,
    /// Requests seen, as "METHOD path?query".
    requests: Vec<String>,
    /// Namespaces and CRDs deleted through the API: what they hold is deleted, then they go
    /// (the namespace controller's and the apiextensions finalizer's work).
    reaping: std::collections::BTreeSet<(Kind, String)>,
    settling: bool,
    /// Whether Leases and Events too may be made only in namespaces that exist (the NamespaceLifecycle
    /// admission in full: [`ApiServer::require_namespaces`]).
    namespaces_required: bool,
    /// No NetworkAttachmentDefinition CRD (a cluster without Multus): NADs answer 404.
    no_nad_crd: bool,
}

impl Objects {
    /// Stores (or, `DELETED`, removes) an object at the next version and logs the event;
    /// the object as stored.
    fn write(&mut self, kind: Kind, key: String, mut object: Value, typ: &'static str) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if typ == "ADDED" && object["metadata"]["creationTimestamp"].is_null() {
            object["metadata"]["creationTimestamp"] = json!(kubectl::now());
        }
        if typ == "DELETED" {
            self.objects.remove(&(kind, key));
        } else {
            self.objects.insert((kind, key), object.clone());
        }
        self.log.push(Event { rv: self.rv, kind, typ, object: object.clone() });
        // Not from inside `settle`, which deletes what it reaps through here.
        if typ == "DELETED" && !self.settling {
            self.settle();
        }
        object
    }

    /// Stores an `events.k8s.io/v1` Event and its core `v1` view as one object: one version,
    /// one creation time. The Event as stored.
    fn write_event(&mut self, key: String, event: Value, typ: &'static str) -> Value {
        let core = self.write(Kind::Events, key.clone(), core_event(&event), typ);
        let mut event = event;
        for field in ["resourceVersion", "creationTimestamp"] {
            event["metadata"][field] = core["metadata"][field].clone();
        }
        self.events.insert(key, event.clone());
        event
    }

    /// Deletes an object as the apiserver does: one with finalizers gets a
    /// `deletionTimestamp` (and, having a generation, a new one: its desired state changed)
    /// and stays until they are removed; one without goes. The object as it is now, if any.
    fn delete_gracefully(&mut self, kind: Kind, key: &str) -> Option<Value> {
        let mut v = self.objects.get(&(kind, key.to_string())).cloned()?;
        if v["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty()) {
            return Some(self.write(kind, key.into(), v, "DELETED"));
        }
        if !v["metadata"]["deletionTimestamp"].is_null() {
            return Some(v);
        }
        v["metadata"]["deletionTimestamp"] = json!("2026-11-26T12:00:00Z");
        if let Some(g) = v["metadata"]["generation"].as_u64() {
            v["metadata"]["generation"] = json!(g + 1);
        }
        Some(self.write(kind, key.into(), v, "MODIFIED"))
    }

    /// Deletes through the API: a namespace or a CRD is marked Terminating and reaped
    /// ([`Objects::settle`]); anything else goes as [`Objects::delete_gracefully`] says.
    fn delete_through_api(&mut self, kind: Kind, key: &str) -> Option<Value> {
        if !matches!(kind, Kind::Namespaces | Kind::Crds) {
            return self.delete_gracefully(kind, key);
        }
        let mut v = self.objects.get(&(kind, key.to_string())).cloned()?;
        if v["metadata"]["deletionTimestamp"].is_null() {
            v["metadata"]["deletionTimestamp"] = json!("2026-11-26T12:00:00Z");
            if kind == Kind::Namespaces {
                v["status"]["phase"] = json!("Terminating");
            }
            v = self.write(kind, key.into(), v, "MODIFIED");
        }
        self.reaping.insert((kind, key.to_string()));
        self.settle();
        Some(self.objects.get(&(kind, key.to_string())).cloned().unwrap_or(v))
    }

    /// What a reaped namespace or CRD still holds.
    fn contents(&self, kind: Kind, key: &str) -> Vec<(Kind, String)> {
        let served = match kind {
            Kind::Crds => RESOURCES
                .iter()
                .find(|r| format!("{}.{}", r.plural, r.group) == key)
                .map(|r| r.kind),
            _ => None,
        };
        let prefix = format!("{key}/");
        self.objects
            .keys()
            .filter(|(k, name)| match kind {
                Kind::Namespaces => k.resource().namespaced && name.starts_with(&prefix),
                _ => Some(*k) == served,
            })
            .cloned()
            .collect()
    }

    /// Runs the namespace controller and the CRD finalizer over what is being reaped: the
    /// contents are deleted (those with finalizers wait for them), and a namespace or CRD
    /// left empty goes.
    fn settle(&mut self) {
        let was = std::mem::replace(&mut self.settling, true);
        for (kind, key) in self.reaping.clone() {
            let contents = self.contents(kind, &key);
            for (k, name) in &contents {
                self.delete_gracefully(*k, name);
            }
            if self.contents(kind, &key).is_empty() {
                if kind == Kind::Namespaces {
                    let prefix = format!("{key}/");
                    self.leases.retain(|k, _| !k.starts_with(&prefix));
                    self.events.retain(|k, _| !k.starts_with(&prefix));
                }
                self.reaping.remove(&(kind, key.clone()));
                if let Some(v) = self.objects.get(&(kind, key.clone())).cloned() {
                    self.write(kind, key, v, "DELETED");
                }
            }
        }
        self.settling = was;
    }
}

#[derive(Clone)]
struct Shared {
    objects: Arc<Mutex<Objects>>,
    changed: watch::Sender<u64>,
    /// What the manager's service account may do: the shipped RBAC.
    rules: Arc<Vec<Rule>>,
    /// Requests the RBAC refused (403): each fails the test when the server is dropped.
    denied: Arc<Mutex<Vec<String>>>,
    /// Lists still to answer with 429 Too Many Requests, and how many were.
    throttle: Arc<std::sync::atomic::AtomicU32>,
    throttled: Arc<std::sync::atomic::AtomicU32>,
    /// Writes refused with 500 (a failing admission webhook), by what their path contains;
    /// and how many were.
    refused: Arc<Mutex<Vec<String>>>,
    refusals: Arc<Mutex<HashMap<String, u32>>>,
}

impl Shared {
    /// Whether the shipped RBAC lets the manager do `verb` on `resource` of `group`.
    fn allows(&self, verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> bool {
        self.rules.iter().any(|r| {
            r.namespace.as_deref().is_none_or(|ns| namespace == Some(ns))
                && r.groups.iter().any(|g| g == group)
                && r.resources.iter().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    }

    /// The apiserver's OwnerReferencesPermissionEnforcement admission: an object naming an
    /// owner with `blockOwnerDeletion` may be written only by who may update that owner's
    /// `finalizers` subresource. A refusal (the answer, `Some`) is recorded as the RBAC's are.
    fn refuse_owner_references(&self, what: &str, object: &Value) -> Option<Response> {
        for r in object["metadata"]["ownerReferences"].as_array().into_iter().flatten() {
            if r["blockOwnerDeletion"] != true {
                continue;
            }
            let api_version = r["apiVersion"].as_str().unwrap_or_default();
            let group = api_version.split_once('/').map_or("", |(g, _)| g);
            let kind = r["kind"].as_str().unwrap_or_default().to_lowercase();
            let resource = format!("{kind}s/finalizers");
            if !self.allows("update", group, &resource, None) {
                self.denied.lock().unwrap().push(format!("update {resource} in group {group:?}"));
                return Some(status(
                    403,
                    "Forbidden",
                    format!(
                        "{what} is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: , <nil>"
                    ),
                ));
            }
        }
        None
    }
}

/// The shipped RBAC the stand-in enforces for every request: `deploy/kubernetes/base/rbac.yaml`
/// (the manager's ClusterRole, and its Lease Role in the `knitter` namespace), and with
/// `Standalone` the standalone overlay's pod patch (`--network-status`); `WithoutFinalizers`
/// is `Base` less its `networks/finalizers` rule (what the owner-reference check needs);
/// `Member` is a member cluster's (`overlays/member`: its ClusterRole instead of the base's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rbac {
    Base,
    Member,
    Standalone,
    WithoutFinalizers,
}

/// One RBAC rule, as a ClusterRole (every namespace) or a Role (its namespace) grants it.
#[derive(Debug, Clone)]
struct Rule {
    namespace: Option<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

/// The manager's namespace, where kustomize puts the Lease Role.
const MANAGER_NAMESPACE: &str = "knitter";

fn rules(rbac: Rbac) -> Vec<Rule> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes");
    let mut files = vec![format!("{root}/base/rbac.yaml")];
    if rbac == Rbac::Standalone {
        files.push(format!("{root}/overlays/standalone/rbac-network-status.yaml"));
    }
    if rbac == Rbac::Member {
        files.push(format!("{root}/overlays/member/manager-rbac.yaml"));
    }
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let docs: Vec<Value> =
            knitter_api::yaml::from_multiple(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
        // The member overlay's ClusterRole replaces the base's.
        let replaced = rbac == Rbac::Member && f.ends_with("base/rbac.yaml");
        for v in docs {
            let namespace = match v["kind"].as_str() {
                Some("ClusterRole") if replaced => continue,
                Some("ClusterRole") => None,
                Some("Role") => Some(
                    v["metadata"]["namespace"].as_str().unwrap_or(MANAGER_NAMESPACE).to_string(),
                ),
                _ => continue,
            };
            let strings = |x: &Value| {
                x.as_array()
                    .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
                    .unwrap_or_default()
            };
            for r in v["rules"].as_array().into_iter().flatten() {
                if rbac == Rbac::WithoutFinalizers
                    && strings(&r["resources"]) == vec!["networks/finalizers".to_string()]
                {
                    continue;
                }
                out.push(Rule {
                    namespace: namespace.clone(),
                    groups: strings(&r["apiGroups"]),
                    resources: strings(&r["resources"]),
                    verbs: strings(&r["verbs"]),
                });
            }
        }
    }
    out
}

/// What a resource path names: `/api/v1/...` or `/apis/GROUP/VERSION/...`, then
/// `namespaces/NS/` for a namespaced resource, the resource, a name and a subresource.
struct Target {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    fn parse(path: &str) -> Option<Target> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", "v1", rest @ ..] => ("", "v1", rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            // `namespaces/NS` alone is the namespace itself, not a collection in it.
            ["namespaces", ns, resource, rest @ ..] => {
                (Some(ns.to_string()), [&[*resource][..], rest].concat())
            }
            _ => (None, rest.to_vec()),
        };
        let string = |s: Option<&&str>| s.map(|s| s.to_string());
        Some(Target {
            group: group.into(),
            version: version.into(),
            namespace,
            resource: rest.first()?.to_string(),
            name: string(rest.get(1)),
            sub: string(rest.get(2)),
        })
    }
}

/// Whether a request is a watch (`?watch=true`).
fn is_watch(uri: &axum::http::Uri) -> bool {
    uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// A request's RBAC attributes: (verb, API group, resource with its subresource, namespace),
/// as the apiserver derives them from the method and the path.
fn attributes(
    method: &axum::http::Method,
    uri: &axum::http::Uri,
) -> Option<(String, String, String, Option<String>)> {
    let t = Target::parse(uri.path())?;
    let verb = match (method.as_str(), &t.name) {
        ("GET", None) if is_watch(uri) => "watch",
        ("GET", None) => "list",
        ("GET", Some(_)) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", None) => "deletecollection",
        ("DELETE", Some(_)) => "delete",
        _ => return None,
    };
    let resource = match t.sub {
        Some(sub) => format!("{}/{sub}", t.resource),
        None => t.resource,
    };
    Some((verb.into(), t.group, resource, t.namespace))
}

/// Who made a request: the cluster admin, or the manager's service account.
#[derive(Clone, Copy, Debug, Default)]
struct Caller {
    admin: bool,
}

/// Refuses (403, as the apiserver's RBAC authorizer words it) what the shipped RBAC does not
/// grant the manager's service account, and records it. The cluster admin's way in
/// ([`ApiServer::admin_url`]) is not checked: kubectl sends no credentials over plain HTTP,
/// so who asks is told by the address asked.
async fn authorize(
    axum::extract::State((s, admin)): axum::extract::State<(Shared, bool)>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    req.extensions_mut().insert(Caller { admin });
    let path = req.uri().path().to_string();
    let refused = s.refused.lock().unwrap().iter().find(|p| path.contains(p.as_str())).cloned();
    if let Some(p) = refused.filter(|_| req.method() != axum::http::Method::GET) {
        *s.refusals.lock().unwrap().entry(p).or_default() += 1;
        let message = "Internal error occurred: failed calling webhook \"validate.example.com\": the server is unavailable";
        return status(500, "InternalError", message.into());
    }
    let Some((verb, group, resource, namespace)) = attributes(req.method(), req.uri()) else {
        return next.run(req).await;
    };
    if admin {
        return next.run(req).await;
    }
    if s.allows(&verb, &group, &resource, namespace.as_deref()) {
        return next.run(req).await;
    }
    let what = format!(
        "{verb} {resource} in group {group:?}{}",
        namespace.as_ref().map(|ns| format!(" in namespace {ns}")).unwrap_or_default()
    );
    s.denied.lock().unwrap().push(what.clone());
    status(
        403,
        "Forbidden",
        format!("User \"system:serviceaccount:knitter:knitter-manager\" cannot {what}"),
    )
}

pub struct ApiServer {
    pub url: String,
    /// The cluster admin's way in: anything goes (kubectl, in the install test).
    pub admin_url: String,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
        let denied = std::mem::take(&mut *self.shared.denied.lock().unwrap());
        if !std::thread::panicking() {
            assert!(
                denied.is_empty(),
                "the controller did what the shipped RBAC does not allow (deploy/kubernetes): {denied:?}"
            );
        }
    }
}

/// A relay into the server whose connections can be stalled (bytes held, both ways, new
/// connections too) and let go again.
pub struct Door {
    pub url: String,
    stalled: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Door {
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(kube::Config::new(self.url.parse().expect("url"))).expect("client")
    }

    pub fn stall(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies one direction of a relayed connection, holding what it read while the door is
/// stalled.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut open: watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if open.wait_for(|stalled| !*stalled).await.is_err()
            || to.write_all(&buf[..n]).await.is_err()
        {
            break;
        }
    }
    let _ = to.shutdown().await;
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body))
        .into_response()
}

impl ApiServer {
    /// A stand-in enforcing the shipped RBAC with the standalone overlay's pod patch (what a
    /// manager with `--network-status` runs under).
    pub async fn start() -> ApiServer {
        Self::start_with(Rbac::Standalone).await
    }

    /// A stand-in enforcing `rbac`.
    pub async fn start_with(rbac: Rbac) -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, admin, rbac)
    }

    /// A stand-in enforcing `rbac` on `listener`, and nothing on `admin` (the cluster
    /// admin's way in).
    pub fn serve(
        listener: tokio::net::TcpListener,
        admin: tokio::net::TcpListener,
        rbac: Rbac,
    ) -> ApiServer {
        let addr: SocketAddr = listener.local_addr().expect("address");
        let admin_addr: SocketAddr = admin.local_addr().expect("address");
        let shared = Shared {
            objects: Arc::default(),
            changed: watch::channel(0).0,
            rules: Arc::new(rules(rbac)),
            denied: Arc::default(),
            throttle: Arc::default(),
            throttled: Arc::default(),
            refused: Arc::default(),
            refusals: Arc::default(),
        };
        let app = Router::new()
            .route(
                "/api/v1/pods",
                get(|s, q, h| collection(s, q, h, Kind::Pods)).fallback(kubectl::serve),
            )
            .route(
                "/api/v1/nodes",
                get(|s, q, h| collection(s, q, h, Kind::Nodes)).fallback(kubectl::serve),
            )
            .route(
                "/api/v1/namespaces",
                get(|s, q, h| collection(s, q, h, Kind::Namespaces)).fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/networks",
                get(|s, q, h| collection(s, q, h, Kind::Networks)).fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/ipgroups",
                get(|s, q, h| collection(s, q, h, Kind::IpGroups)).fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/clusters",
                get(|s, q, h| collection(s, q, h, Kind::KnitterClusters)).fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/clusters/{name}",
                axum::routing::patch(|s, p, h, b| {
                    patch_resource(s, p, h, b, Kind::KnitterClusters)
                })
                .fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/clusters/{name}/status",
                axum::routing::patch(|s, p, h, b| patch_status(s, p, h, b, Kind::KnitterClusters))
                    .fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/networks/{name}",
                axum::routing::patch(|s, p, h, b| patch_resource(s, p, h, b, Kind::Networks))
                    .fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/ipgroups/{name}",
                axum::routing::patch(|s, p, h, b| patch_resource(s, p, h, b, Kind::IpGroups))
                    .fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/networks/{name}/status",
                axum::routing::patch(|s, p, h, b| patch_status(s, p, h, b, Kind::Networks))
                    .fallback(kubectl::serve),
            )
            .route(
                "/apis/knitter.io/v1alpha1/ipgroups/{name}/status",
                axum::routing::patch(|s, p, h, b| patch_status(s, p, h, b, Kind::IpGroups))
                    .fallback(kubectl::serve),
            )
            .route(
                "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
                get(|s, q, h| collection(s, q, h, Kind::Nads)).fallback(kubectl::serve),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                get(get_pod).patch(patch_pod).fallback(kubectl::serve),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                axum::routing::post(create_event).fallback(kubectl::serve),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}",
                axum::routing::patch(patch_event).fallback(kubectl::serve),
            )
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                axum::routing::post(create_lease).fallback(kubectl::serve),
            )
            .route(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
                get(get_lease).put(replace_lease).fallback(kubectl::serve),
            )
            .fallback(kubectl::serve)
            .with_state(shared.clone());
        let checked = |admin: bool| {
            let state = (shared.clone(), admin);
            app.clone().layer(axum::middleware::from_fn_with_state(state, authorize))
        };
        let (app, admin_app) = (checked(false), checked(true));
        let task = tokio::spawn(async move {
            let _ = tokio::join!(axum::serve(listener, app), axum::serve(admin, admin_app));
        });
        let (url, admin_url) = (format!("http://{addr}"), format!("http://{admin_addr}"));
        ApiServer { url, admin_url, shared, task }
    }

    /// A way in of its own (a TCP relay), for one client that the test may cut off.
    pub async fn door(&self) -> Door {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let upstream = self.url.trim_start_matches("http://").to_string();
        let (stalled, open) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (upstream, open) = (upstream.clone(), open.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let ((cr, cw), (sr, sw)) = (conn.into_split(), server.into_split());
                    tokio::join!(relay(cr, sw, open.clone()), relay(sr, cw, open));
                });
            }
        });
        Door { url, stalled, task }
    }

    /// A kubeconfig for this server: the cluster admin's with `admin`, else the manager's
    /// service account's (the shipped RBAC applies).
    pub fn kubeconfig(&self, admin: bool) -> String {
        let url = if admin { &self.admin_url } else { &self.url };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster: {{server: \"{url}\"}}\n\
             users:\n- name: user\n  user: {{}}\ncontexts:\n- name: stand-in\n  context: {{cluster: stand-in, user: user}}\n\
             current-context: stand-in\n"
        )
    }

    /// A client of this server, as the controller makes one from a kubeconfig.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().expect("url"));
        kube::Client::try_from(config).expect("client")
    }

    fn change(&self, f: impl FnOnce(&mut Objects)) {
        let cut = {
            let mut o = self.shared.objects.lock().unwrap();
            f(&mut o);
            o.rv
        };
        self.shared.changed.send_replace(cut);
    }

    fn put(&self, kind: Kind, key: String, object: Value, typ: &'static str) {
        self.change(|o| {
            o.write(kind, key, object, typ);
        });
    }

    pub fn add_pod(&self, namespace: &str, name: &str, uid: &str, node: &str) {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("app:1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        let v = serde_json::to_value(&pod).expect("a pod serialises");
        self.put(Kind::Pods, format!("{namespace}/{name}"), v, "ADDED");
    }

    /// Deletes a pod as the apiserver does with a grace period: first marked
    /// (`deletionTimestamp`, `deletionGracePeriodSeconds`; a MODIFIED event) while its
    /// containers stop; [`ApiServer::delete_pod`] ends it.
    pub fn terminate_pod(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        let Some(mut v) = self.object(Kind::Pods, &key) else { return };
        v["metadata"]["deletionTimestamp"] = json!("2026-11-29T12:00:00Z");
        v["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        self.put(Kind::Pods, key, v, "MODIFIED");
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        let Some(v) =
            self.shared.objects.lock().unwrap().objects.get(&(Kind::Pods, key.clone())).cloned()
        else {
            return;
        };
        self.put(Kind::Pods, key, v, "DELETED");
    }

    pub fn add_node(&self, name: &str) {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("node-{name}")),
                ..Default::default()
            },
            ..Default::default()
        };
        self.put(
            Kind::Nodes,
            name.into(),
            serde_json::to_value(&node).expect("a node serialises"),
            "ADDED",
        );
    }

    pub fn delete_node(&self, name: &str) {
        let Some(v) = self
            .shared
            .objects
            .lock()
            .unwrap()
            .objects
            .get(&(Kind::Nodes, name.to_string()))
            .cloned()
        else {
            return;
        };
        self.put(Kind::Nodes, name.into(), v, "DELETED");
    }

    pub fn add_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<String, String> =
            labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("ns-{name}")),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        let typ = if self.object(Kind::Namespaces, name).is_some() { "MODIFIED" } else { "ADDED" };
        self.put(
            Kind::Namespaces,
            name.into(),
            serde_json::to_value(&ns).expect("a namespace serialises"),
            typ,
        );
    }

    /// Starts deleting a namespace, as `kubectl delete namespace` does while its contents go:
    /// `deletionTimestamp` and the `Terminating` phase.
    pub fn terminate_namespace(&self, name: &str) {
        let Some(mut ns) = self.object(Kind::Namespaces, name) else { return };
        ns["metadata"]["deletionTimestamp"] = json!("2026-11-29T12:00:00Z");
        ns["status"] = json!({"phase": "Terminating"});
        self.put(Kind::Namespaces, name.into(), ns, "MODIFIED");
    }

    /// Creates or updates a cluster-scoped custom resource (`spec` given; as `kubectl apply`
    /// would: its status kept, `metadata.generation` moved when the spec changes).
    pub fn apply_resource(&self, kind: Kind, name: &str, uid: &str, spec: Value) {
        self.change(|o| {
            let have = o.objects.get(&(kind, name.to_string())).cloned();
            let object = match have {
                Some(mut h) => {
                    if h["spec"] != spec {
                        h["metadata"]["generation"] = json!(h["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
                        h["spec"] = spec;
                    }
                    h
                }
                None => json!({"apiVersion": kind.api_version(), "kind": kind.names().2,
                    "metadata": {"name": name, "uid": uid, "generation": 1, "creationTimestamp": "2026-11-26T00:00:00Z"}, "spec": spec}),
            };
            let typ = if o.objects.contains_key(&(kind, name.to_string())) { "MODIFIED" } else { "ADDED" };
            o.write(kind, name.to_string(), object, typ);
        });
    }

    /// Deletes an object as `kubectl delete` does: one with finalizers gets a
    /// `deletionTimestamp` and stays until they are removed; one without goes.
    pub fn delete_gracefully(&self, kind: Kind, key: &str) {
        self.change(|o| {
            o.delete_gracefully(kind, key);
        });
    }

    /// Deletes an object at once, finalizers or not (`namespace/name` or a cluster-scoped
    /// name): what an operator's forced removal of the finalizers comes to.
    pub fn delete(&self, kind: Kind, key: &str) {
        let Some(v) = self.object(kind, key) else { return };
        self.put(kind, key.into(), v, "DELETED");
    }

    /// An object (`namespace/name` or a cluster-scoped name), if it exists.
    pub fn object(&self, kind: Kind, key: &str) -> Option<Value> {
        self.shared.objects.lock().unwrap().objects.get(&(kind, key.to_string())).cloned()
    }

    /// Every object of `kind`, by key.
    pub fn objects(&self, kind: Kind) -> BTreeMap<String, Value> {
        self.shared
            .objects
            .lock()
            .unwrap()
            .objects
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, key), v)| (key.clone(), v.clone()))
            .collect()
    }

    /// Deletes pods with no event anyone can see, then forgets the history and ends every
    /// open watch: the watchers come back with their last version and get 410 Gone (as
    /// after an etcd compaction), and only a new list tells them the pods went.
    pub fn delete_pods_unseen(&self, keys: &[(String, String)]) {
        self.change(|o| {
            for (ns, name) in keys {
                o.objects.remove(&(Kind::Pods, format!("{ns}/{name}")));
            }
            o.rv += 1;
            o.oldest = o.rv;
            o.log.clear();
            o.cut += 1;
        });
    }

    /// The Events recorded (as created, then merge-patched: a series' count).
    pub fn events(&self) -> Vec<Value> {
        self.shared.objects.lock().unwrap().events.values().cloned().collect()
    }

    /// The Lease's holder, if any.
    pub fn lease_holder(&self, namespace: &str, name: &str) -> Option<String> {
        let o = self.shared.objects.lock().unwrap();
        o.leases.get(&format!("{namespace}/{name}"))?["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_string)
    }

    /// A pod's annotation, if it has it.
    pub fn pod_annotation(&self, namespace: &str, name: &str, key: &str) -> Option<String> {
        let o = self.shared.objects.lock().unwrap();
        o.objects.get(&(Kind::Pods, format!("{namespace}/{name}")))?["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_string)
    }

    /// Leases and Events too may be made only in namespaces that exist (other objects always), as
    /// in a whole cluster; the controller's tests leave it off and do not make namespaces
    /// for their Leases.
    pub fn require_namespaces(&self) {
        self.change(|o| o.namespaces_required = true);
    }

    /// Makes the cluster one without Multus: no NetworkAttachmentDefinition CRD, so NADs
    /// answer 404 (and kubectl's discovery does not show them).
    pub fn without_nad_crd(&self) {
        self.change(|o| o.no_nad_crd = true);
    }

    /// The Leases and Events stored, by `namespace/name`.
    pub fn leases_and_events(&self) -> Vec<String> {
        let o = self.shared.objects.lock().unwrap();
        o.leases
            .keys()
            .map(|k| format!("Lease {k}"))
            .chain(o.events.keys().map(|k| format!("Event {k}")))
            .collect()
    }

    /// Every write (not a read) whose path contains `path` is answered 500 from now on, as
    /// when an admission webhook for it fails.
    pub fn refuse_writes(&self, path: &str) {
        self.shared.refused.lock().unwrap().push(path.to_string());
    }

    /// Takes back [`ApiServer::refuse_writes`] for `path`.
    pub fn allow_writes(&self, path: &str) {
        self.shared.refused.lock().unwrap().retain(|p| p != path);
    }

    /// How many writes [`ApiServer::refuse_writes`] for `path` refused.
    pub fn refusals(&self, path: &str) -> u32 {
        self.shared.refusals.lock().unwrap().get(path).copied().unwrap_or_default()
    }

    /// Changes an object as another client would (a MODIFIED event).
    pub fn edit(&self, kind: Kind, key: &str, f: impl FnOnce(&mut Value)) {
        let Some(mut v) = self.object(kind, key) else { return };
        f(&mut v);
        self.put(kind, key.into(), v, "MODIFIED");
    }

    /// The requests the RBAC refused so far, forgotten (a test that provokes one takes it).
    pub fn take_denied(&self) -> Vec<String> {
        std::mem::take(&mut *self.shared.denied.lock().unwrap())
    }

    /// The next `n` lists (not watches) are answered as an apiserver under load answers:
    /// 429 Too Many Requests with `Retry-After: 1`.
    pub fn throttle_lists(&self, n: u32) {
        self.shared.throttle.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many lists were answered 429.
    pub fn throttled(&self) -> u32 {
        self.shared.throttled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many requests matched `pred` so far.
    pub fn requests(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.shared.objects.lock().unwrap().requests.iter().filter(|r| pred(r)).count()
    }
}

async fn collection(
    State(s): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
    kind: Kind,
) -> Response {
    collection_in(s, q, &headers, kind, None)
}

/// Lists or watches `kind` (in `namespace`, or everywhere); a list as a Table when asked for
/// one (`kubectl get`) and the kind's CRD names columns.
fn collection_in(
    s: Shared,
    q: HashMap<String, String>,
    headers: &axum::http::HeaderMap,
    kind: Kind,
    namespace: Option<String>,
) -> Response {
    let mut query: Vec<String> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
    query.sort();
    let (path, list_kind, _) = kind.names();
    s.objects.lock().unwrap().requests.push(format!("GET {path}?{}", query.join("&")));
    if kind == Kind::Nads && s.objects.lock().unwrap().no_nad_crd {
        return status(404, "NotFound", "the server could not find the requested resource".into());
    }
    let selector = Selector {
        kind,
        labels: q.get("labelSelector").cloned(),
        fields: q.get("fieldSelector").cloned(),
        namespace,
    };
    if let Some(refused) = selector.refuse() {
        return refused;
    }
    if q.get("watch").map(String::as_str) != Some("true") {
        use std::sync::atomic::Ordering::SeqCst;
        if s.throttle.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            s.throttled.fetch_add(1, SeqCst);
            let mut r = status(429, "TooManyRequests", "the server is busy: try again".into());
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
            return r;
        }
        // Paging as the apiserver pages (`limit`, then `continue` with the token given): in
        // key order, the token the last key given. Unlike the apiserver's, later pages are
        // read from the objects as they are then, not from the first page's snapshot.
        let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
        let after = q.get("continue").cloned().unwrap_or_default();
        let o = s.objects.lock().unwrap();
        let mut keys_and_items = o
            .objects
            .iter()
            .filter(|((k, key), v)| {
                *k == kind && key.as_str() > after.as_str() && selector.selects(v)
            })
            .map(|((_, key), v)| (key.clone(), v.clone()));
        let items: Vec<(String, Value)> =
            keys_and_items.by_ref().take(limit.unwrap_or(usize::MAX)).collect();
        let more = keys_and_items.next().is_some();
        let mut metadata = json!({"resourceVersion": o.rv.to_string()});
        if let (true, Some((last, _))) = (more, items.last()) {
            metadata["continue"] = json!(last);
        }
        let items: Vec<Value> = items.into_iter().map(|(_, v)| v).collect();
        if let Some(table) = kubectl::table(&o, headers, kind, &items, metadata.clone()) {
            return axum::Json(table).into_response();
        }
        return axum::Json(json!({"apiVersion": kind.api_version(), "kind": list_kind, "metadata": metadata, "items": items})).into_response();
    }
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout =
        Duration::from_secs(q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(290));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(64);
    tokio::spawn(stream_watch(s, kind, selector, from, bookmarks, timeout, tx));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder().header("content-type", "application/json").body(body).unwrap_or_default()
}

/// Sends `kind`'s events after version `from` as they come, until the watch is cut or times
/// out or the client goes.
async fn stream_watch(
    s: Shared,
    kind: Kind,
    selector: Selector,
    mut from: u64,
    bookmarks: bool,
    timeout: Duration,
    tx: tokio::sync::mpsc::Sender<Result<String, std::convert::Infallible>>,
) {
    let mut changed = s.changed.subscribe();
    let (cut, kind_name) = (s.objects.lock().unwrap().cut, kind.names().2);
    let end = tokio::time::Instant::now() + timeout;
    loop {
        let (lines, rv, expired, was_cut) = {
            let o = s.objects.lock().unwrap();
            if from < o.oldest {
                let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {from} ({})", o.oldest - 1), "reason": "Expired", "code": 410}});
                (vec![gone.to_string()], o.rv, true, false)
            } else {
                let lines: Vec<String> = o
                    .log
                    .iter()
                    .filter(|e| e.kind == kind && e.rv > from && selector.selects(&e.object))
                    .map(|e| json!({"type": e.typ, "object": e.object}).to_string())
                    .collect();
                (lines, o.rv, false, o.cut != cut)
            }
        };
        let quiet = lines.is_empty();
        for l in lines {
            if tx.send(Ok(l + "\n")).await.is_err() {
                return;
            }
        }
        if expired || was_cut {
            return;
        }
        from = rv;
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if bookmarks && quiet {
                    let b = json!({"type": "BOOKMARK", "object": {"kind": kind_name, "apiVersion": kind.api_version(), "metadata": {"resourceVersion": rv.to_string()}}});
                    if tx.send(Ok(b.to_string() + "\n")).await.is_err() {
                        return;
                    }
                }
            }
            _ = tokio::time::sleep_until(end) => return,
        }
    }
}

async fn get_pod(State(s): State<Shared>, Path((ns, name)): Path<(String, String)>) -> Response {
    match s.objects.lock().unwrap().objects.get(&(Kind::Pods, format!("{ns}/{name}"))) {
        Some(p) => axum::Json(p.clone()).into_response(),
        None => status(404, "NotFound", format!("pods \"{name}\" not found")),
    }
}

/// A JSON merge patch (RFC 7386: objects merge, `null` removes, anything else replaces).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else { return *target = patch.clone() };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The body of a merge patch, or the answer refusing it.
fn merge_patch_body(headers: &axum::http::HeaderMap, body: &[u8]) -> Result<Value, Box<Response>> {
    let kind =
        headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    if kind != "application/merge-patch+json" {
        return Err(Box::new(status(
            415,
            "UnsupportedMediaType",
            format!("the stand-in takes merge patches only, not {kind:?}"),
        )));
    }
    serde_json::from_slice::<Value>(body)
        .map_err(|_| Box::new(status(400, "BadRequest", "the patch is not JSON".into())))
}

async fn patch_pod(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let patch = match merge_patch_body(&headers, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let updated = {
        let mut o = s.objects.lock().unwrap();
        o.requests.push(format!("PATCH pod {ns}/{name}"));
        let key = (Kind::Pods, format!("{ns}/{name}"));
        let Some(mut pod) = o.objects.get(&key).cloned() else {
            return status(404, "NotFound", format!("pods \"{name}\" not found"));
        };
        merge(&mut pod, &patch);
        o.write(Kind::Pods, key.1, pod, "MODIFIED")
    };
    s.changed.send_modify(|c| *c += 1);
    axum::Json(updated).into_response()
}

/// A merge patch of a custom resource (its status subresource excepted: `status` is not
/// taken here), refused with 409 when it names a `metadata.resourceVersion` that is not the
/// object's; an object being deleted whose last finalizer the patch removes goes.
async fn patch_resource(
    State(s): State<Shared>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
    kind: Kind,
) -> Response {
    let mut patch = match merge_patch_body(&headers, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let updated = {
        let mut o = s.objects.lock().unwrap();
        o.requests.push(format!("PATCH {} {name}", kind.names().2));
        let Some(mut object) = o.objects.get(&(kind, name.clone())).cloned() else {
            return status(404, "NotFound", format!("{} \"{name}\" not found", kind.names().2));
        };
        let precondition = patch["metadata"]
            .as_object_mut()
            .and_then(|m| m.remove("resourceVersion"))
            .filter(|v| !v.is_null());
        if precondition.is_some_and(|v| v != object["metadata"]["resourceVersion"]) {
            return status(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    kind.names().2
                ),
            );
        }
        if let Some(p) = patch.as_object_mut() {
            p.remove("status");
        }
        let spec = object["spec"].clone();
        merge(&mut object, &patch);
        if object["spec"] != spec {
            object["metadata"]["generation"] =
                json!(object["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
        }
        let done = !object["metadata"]["deletionTimestamp"].is_null()
            && object["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty());
        o.write(kind, name, object, if done { "DELETED" } else { "MODIFIED" })
    };
    s.changed.send_modify(|c| *c += 1);
    axum::Json(updated).into_response()
}

/// A merge patch of a custom resource's status subresource: only `status` is taken.
async fn patch_status(
    State(s): State<Shared>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
    kind: Kind,
) -> Response {
    let patch = match merge_patch_body(&headers, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let updated = {
        let mut o = s.objects.lock().unwrap();
        o.requests.push(format!("PATCH {} {name}/status", kind.names().2));
        let Some(mut object) = o.objects.get(&(kind, name.clone())).cloned() else {
            return status(404, "NotFound", format!("{} \"{name}\" not found", kind.names().2));
        };
        if let Some(st) = patch.get("status") {
            merge(
                object.as_object_mut().expect("an object").entry("status").or_insert(json!({})),
                st,
            );
        }
        o.write(kind, name, object, "MODIFIED")
    };
    s.changed.send_modify(|c| *c += 1);
    axum::Json(updated).into_response()
}

async fn get_lease(State(s): State<Shared>, Path((ns, name)): Path<(String, String)>) -> Response {
    let mut o = s.objects.lock().unwrap();
    o.requests.push(format!("GET lease {ns}/{name}"));
    match o.leases.get(&format!("{ns}/{name}")) {
        Some(l) => axum::Json(l.clone()).into_response(),
        None => status(404, "NotFound", format!("leases.coordination.k8s.io \"{name}\" not found")),
    }
}

async fn create_lease(
    State(s): State<Shared>,
    Path(ns): Path<String>,
    axum::Json(mut lease): axum::Json<Value>,
) -> Response {
    let mut o = s.objects.lock().unwrap();
    let name = lease["metadata"]["name"].as_str().unwrap_or_default().to_string();
    o.requests.push(format!("POST lease {ns}/{name}"));
    let what = format!("leases.coordination.k8s.io \"{name}\"");
    let must_exist = o.namespaces_required;
    if let Some(refused) = kubectl::refuse_in_namespace(&o, &ns, &what, must_exist) {
        return refused;
    }
    let key = format!("{ns}/{name}");
    if o.leases.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    o.rv += 1;
    lease["metadata"]["resourceVersion"] = json!(o.rv.to_string());
    lease["metadata"]["uid"] = json!(format!("lease-{name}"));
    lease["apiVersion"] = json!("coordination.k8s.io/v1");
    lease["kind"] = json!("Lease");
    o.leases.insert(key, lease.clone());
    (StatusCode::CREATED, axum::Json(lease)).into_response()
}

async fn replace_lease(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    axum::Json(mut lease): axum::Json<Value>,
) -> Response {
    let mut o = s.objects.lock().unwrap();
    o.requests.push(format!("PUT lease {ns}/{name}"));
    let key = format!("{ns}/{name}");
    let Some(have) = o.leases.get(&key) else {
        return status(404, "NotFound", format!("leases.coordination.k8s.io \"{name}\" not found"));
    };
    if lease["metadata"]["resourceVersion"] != have["metadata"]["resourceVersion"] {
        return status(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    o.rv += 1;
    lease["metadata"]["resourceVersion"] = json!(o.rv.to_string());
    o.leases.insert(key, lease.clone());
    axum::Json(lease).into_response()
}

async fn create_event(
    State(s): State<Shared>,
    Path(ns): Path<String>,
    axum::Json(mut event): axum::Json<Value>,
) -> Response {
    let mut o = s.objects.lock().unwrap();
    let name = event["metadata"]["name"].as_str().unwrap_or_default().to_string();
    o.requests.push(format!("POST event {ns}/{name}"));
    let what = format!("events.events.k8s.io \"{name}\"");
    let must_exist = o.namespaces_required;
    if let Some(refused) = kubectl::refuse_in_namespace(&o, &ns, &what, must_exist) {
        return refused;
    }
    if name.is_empty() || event["metadata"]["namespace"].as_str().is_some_and(|n| n != ns) {
        return status(
            422,
            "Invalid",
            format!("Event {name:?} is invalid: metadata.name and namespace"),
        );
    }
    let key = format!("{ns}/{name}");
    if o.events.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            format!("events.events.k8s.io \"{name}\" already exists"),
        );
    }
    event["metadata"]["namespace"] = json!(ns);
    let event = o.write_event(key, event, "ADDED");
    drop(o);
    s.changed.send_modify(|c| *c += 1);
    (StatusCode::CREATED, axum::Json(event)).into_response()
}

/// An `events.k8s.io/v1` Event as the core `v1` API shows it (the apiserver serves one
/// object under both).
fn core_event(e: &Value) -> Value {
    let count = e["series"]["count"].as_i64().or(e["deprecatedCount"].as_i64()).unwrap_or(1);
    let first = e["deprecatedFirstTimestamp"].as_str().or(e["eventTime"].as_str());
    let last = e["series"]["lastObservedTime"]
        .as_str()
        .or(e["deprecatedLastTimestamp"].as_str())
        .or(e["eventTime"].as_str());
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": e["metadata"],
        "involvedObject": e["regarding"], "related": e["related"],
        "reason": e["reason"], "message": e["note"], "type": e["type"], "action": e["action"],
        "source": {"component": e["reportingController"]},
        "reportingComponent": e["reportingController"], "reportingInstance": e["reportingInstance"],
        "count": count, "firstTimestamp": first, "lastTimestamp": last, "eventTime": e["eventTime"],
    })
}

async fn patch_event(
    State(s): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let patch = match merge_patch_body(&headers, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let mut o = s.objects.lock().unwrap();
    o.requests.push(format!("PATCH event {ns}/{name}"));
    let Some(have) = o.events.get(&format!("{ns}/{name}")).cloned() else {
        return status(404, "NotFound", format!("events.events.k8s.io \"{name}\" not found"));
    };
    let mut event = have;
    merge(&mut event, &patch);
    let event = o.write_event(format!("{ns}/{name}"), event, "MODIFIED");
    drop(o);
    s.changed.send_modify(|c| *c += 1);
    axum::Json(event).into_response()
}
