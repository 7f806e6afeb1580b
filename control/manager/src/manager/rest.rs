//! The manager's REST/JSON API (`/v1/...`, described by `/v1/openapi.json`): thin handlers
//! over [`Manager`], run on blocking threads (the store is blocking), one error table
//! mapping [`ManagerError`] to an HTTP status and a `{"code", "reason"}` body. Who may call
//! what (`Authorization: Bearer <token>`: the admin's, a node's, the bootstrap token's;
//! `/v1/health` open to probes): `auth.rs`.

use super::auth::{Access, Auth, Caller};
use super::limits::Limits;
use super::objects::{ClusterSpec, IpGroupSpec, Node, PortSpec, Quota, TenantSpec};
use super::{Filter, Manager, ManagerError};
use crate::network::NetworkSpec;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Extension, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::sync::Arc;

/// The OpenAPI 3 document of this API (kept beside the code; a test checks every route is
/// in it).
pub const OPENAPI: &str = include_str!("openapi.json");

#[derive(Clone)]
pub struct Api {
    pub manager: Arc<Manager>,
    /// The manager's credentials and read policy.
    pub auth: Arc<Auth>,
    /// The Kubernetes controller's state, when this manager runs one.
    pub cluster: Option<Arc<super::cluster::Status>>,
    /// The controllers of the clusters added besides the own one (none in tests that run
    /// no controllers: clusters are then listed without their controllers' state).
    pub fleet: Option<Arc<super::cluster::fleet::Fleet>>,
    /// The APIs' requests and the sync streams (shared with the gRPC service).
    pub metrics: Arc<super::metrics::Metrics>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    reason: String,
}

impl IntoResponse for ManagerError {
    fn into_response(self) -> Response {
        let (code, status, _) = self.codes();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r =
            (status, axum::Json(ErrorBody { code, reason: self.to_string() })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        r
    }
}

type Reply = Result<Response, ManagerError>;

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    api: &Api,
    f: impl FnOnce(&Manager) -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    let m = api.manager.clone();
    tokio::task::spawn_blocking(move || f(&m))
        .await
        .map_err(|e| ManagerError::Busy(format!("request failed: {e}")))?
}

fn ok<T: Serialize>(v: T) -> Reply {
    Ok(axum::Json(v).into_response())
}

/// 201 when the create made something, 200 when it was there already (idempotent).
fn created<T: Serialize>((v, new): (T, bool)) -> Reply {
    Ok((if new { StatusCode::CREATED } else { StatusCode::OK }, axum::Json(v)).into_response())
}

/// A deleted object, or 404 when there was none.
fn deleted<T: Serialize>(what: &'static str, name: String, v: Option<T>) -> Reply {
    v.map(|v| axum::Json(v).into_response()).ok_or(ManagerError::NotFound { what, name })
}

/// A JSON body, refused with the parser's reason (line and column) when malformed, and
/// with the names of fields it does not know (`"ip"` for `"ips"` would otherwise silently
/// give a dynamic address), as misspelt query filters are.
fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T, ManagerError> {
    let invalid = |e: serde_json::Error| ManagerError::Invalid(format!("request body: {e}"));
    let mut unknown = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(b);
    let v = serde_ignored::deserialize(&mut de, |path| {
        unknown.push(format!("{path:?}", path = path.to_string()))
    })
    .map_err(invalid)?;
    de.end().map_err(invalid)?;
    if !unknown.is_empty() {
        return Err(ManagerError::Invalid(format!(
            "request body: unknown field {}",
            unknown.join(", ")
        )));
    }
    Ok(v)
}

/// A JSON value (a body the handler changed) as `T`, refused with the names of fields `T`
/// does not know, as [`body`] does.
fn strict<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, ManagerError> {
    let mut unknown = Vec::new();
    let t = serde_ignored::deserialize(v, |path| {
        unknown.push(format!("{path:?}", path = path.to_string()))
    })
    .map_err(|e| ManagerError::Invalid(format!("request body: {e}")))?;
    if !unknown.is_empty() {
        return Err(ManagerError::Invalid(format!(
            "request body: unknown field {}",
            unknown.join(", ")
        )));
    }
    Ok(t)
}

/// List filters from the query string (`?network=red&node=n1`), refused when malformed.
fn filter(RawQuery(q): RawQuery) -> Result<Filter, ManagerError> {
    serde_urlencoded::from_str(q.as_deref().unwrap_or(""))
        .map_err(|e| ManagerError::Invalid(format!("query: {e}")))
}

pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a route needs of its caller (`auth.rs`): probes' health is open; `/metrics` the
/// metrics token's (or the admin's); ports and node
/// records are the nodes' too (each handler checks which); joining is the bootstrap
/// token's; every other change is the admin's, every other read the admin's (and loopback's
/// with `--loopback-reads`).
fn access(method: &Method, path: &str) -> Access {
    let read = matches!(*method, Method::GET | Method::HEAD);
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match (read, parts.as_slice()) {
        (true, ["", "v1", "health" | "live"]) => Access::Open,
        (true, ["", "metrics"]) => Access::Metrics,
        (_, ["", "v1", "ports", ..]) => Access::Node,
        (true, ["", "v1", "nodes", ..]) => Access::Node,
        (false, ["", "v1", "nodes", _]) if *method == Method::PUT => Access::Node,
        (false, ["", "v1", "nodes", _, "token"]) => Access::Join,
        (true, _) => Access::Read,
        (false, _) => Access::Admin,
    }
}

async fn auth(
    State(api): State<Api>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    mut req: Request,
    next: Next,
) -> Response {
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    let access = access(req.method(), req.uri().path());
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(knitter_api::process::bearer_token)
        .map(str::to_string);
    let (m, a) = (api.manager.clone(), api.auth.clone());
    let caller = match tokio::task::spawn_blocking(move || a.identify(&m, given.as_deref())).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return e.into_response(),
        Err(e) => return ManagerError::Busy(format!("request failed: {e}")).into_response(),
    };
    if let Err(e) = api.auth.check(&caller, access, peer.ip().is_loopback(), read) {
        return e.into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Liveness: the process answers, whatever its store does (an etcd outage must not make
/// the kubelet restart every manager in a loop; readiness, `/v1/health`, says it).
async fn live() -> Reply {
    ok(serde_json::json!({ "status": "alive" }))
}

/// Readiness: the manager serves and reaches its store.
async fn health(State(api): State<Api>) -> Reply {
    let rev = blocking(&api, |m| Ok(m.store().revision()?)).await?;
    ok(serde_json::json!({ "status": "serving", "revision": rev }))
}

/// The Kubernetes controller's state; 404 when this manager runs none.
async fn kubernetes(State(api): State<Api>) -> Reply {
    let status = api.cluster.as_ref().ok_or_else(|| ManagerError::NotFound {
        what: "Kubernetes controller",
        name: "(knitter-manager runs without --kubernetes)".into(),
    })?;
    ok(status.report())
}

/// Prometheus metrics: the APIs' requests, the sync streams, the networks' address use
/// ([`super::metrics`]) and the Kubernetes controller's (none without one).
async fn metrics(State(api): State<Api>) -> Response {
    let (m, manager) = (api.metrics.clone(), api.manager.clone());
    let mut text =
        tokio::task::spawn_blocking(move || m.render(&manager)).await.unwrap_or_default();
    text.push_str(&api.cluster.as_ref().map(|s| s.report().metrics()).unwrap_or_default());
    text.push_str(&api.fleet.as_ref().map(|f| f.metrics()).unwrap_or_default());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn list_tenants(State(api): State<Api>) -> Reply {
    ok(blocking(&api, |m| m.tenants()).await?)
}

async fn create_tenant(State(api): State<Api>, b: Bytes) -> Reply {
    let t: TenantSpec = body(&b)?;
    created(blocking(&api, move |m| m.create_tenant_with(t)).await?)
}

async fn set_namespaces(State(api): State<Api>, Path(name): Path<String>, b: Bytes) -> Reply {
    let n: Vec<String> = body(&b)?;
    ok(blocking(&api, move |m| m.set_tenant_namespaces(&name, n)).await?)
}

async fn get_tenant(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    ok(blocking(&api, move |m| m.tenant(&name)).await?)
}

async fn delete_tenant(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    let n = name.clone();
    deleted("tenant", name, blocking(&api, move |m| m.delete_tenant(&n)).await?)
}

async fn set_quota(State(api): State<Api>, Path(name): Path<String>, b: Bytes) -> Reply {
    let q: Quota = body(&b)?;
    ok(blocking(&api, move |m| m.set_quota(&name, q)).await?)
}

async fn list_networks(State(api): State<Api>, q: RawQuery) -> Reply {
    let f = filter(q)?;
    ok(blocking(&api, move |m| m.list_networks(&f)).await?)
}

async fn create_network(State(api): State<Api>, b: Bytes) -> Reply {
    let spec: NetworkSpec = body(&b)?;
    created(blocking(&api, move |m| m.create_network(spec)).await?)
}

async fn get_network(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    ok(blocking(&api, move |m| m.get_network(&name)).await?)
}

async fn delete_network(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    let n = name.clone();
    deleted("network", name, blocking(&api, move |m| m.delete_network(&n)).await?)
}

async fn list_all_groups(State(api): State<Api>, q: RawQuery) -> Reply {
    let f = filter(q)?;
    ok(blocking(&api, move |m| m.list_groups(&f.network)).await?)
}

async fn list_groups(State(api): State<Api>, Path(network): Path<String>) -> Reply {
    ok(blocking(&api, move |m| m.list_groups(&network)).await?)
}

/// The body's `network` may be left out: the path names it.
async fn create_group(State(api): State<Api>, Path(network): Path<String>, b: Bytes) -> Reply {
    let mut v: serde_json::Value = body(&b)?;
    if let Some(o) = v.as_object_mut() {
        let given = o.entry("network").or_insert_with(|| network.clone().into());
        if given.as_str() != Some(network.as_str()) {
            return Err(ManagerError::Invalid(format!(
                "the body names network {given}, the path {network:?}"
            )));
        }
    }
    let spec: IpGroupSpec = strict(v)?;
    created(blocking(&api, move |m| m.create_group(spec)).await?)
}

async fn get_group(State(api): State<Api>, Path((network, name)): Path<(String, String)>) -> Reply {
    ok(blocking(&api, move |m| m.get_group(&network, &name)).await?)
}

async fn delete_group(
    State(api): State<Api>,
    Path((network, name)): Path<(String, String)>,
) -> Reply {
    let id = format!("{network}/{name}");
    deleted("IP group", id, blocking(&api, move |m| m.delete_group(&network, &name)).await?)
}

async fn list_ports(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    q: RawQuery,
) -> Reply {
    let f = filter(q)?;
    ok(blocking(&api, move |m| m.list_ports_as(&caller, &f)).await?)
}

async fn create_port(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    b: Bytes,
) -> Reply {
    let spec: PortSpec = body(&b)?;
    created(blocking(&api, move |m| m.create_port_as(&caller, spec)).await?)
}

async fn get_port(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((c, i)): Path<(String, String)>,
) -> Reply {
    ok(blocking(&api, move |m| m.get_port_as(&caller, &c, &i)).await?)
}

async fn delete_port(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((c, i)): Path<(String, String)>,
) -> Reply {
    let id = format!("{c}/{i}");
    deleted("port", id, blocking(&api, move |m| m.delete_port_as(&caller, &c, &i)).await?)
}

async fn list_nodes(State(api): State<Api>) -> Reply {
    ok(blocking(&api, |m| m.list_nodes()).await?)
}

async fn register_node(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    b: Bytes,
) -> Reply {
    let mut v: serde_json::Value = body(&b)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("name".into(), name.into());
    }
    let node: Node = strict(v)?;
    ok(blocking(&api, move |m| m.register_node_as(&caller, node)).await?)
}

/// A node token: `{"node", "token"}` (the admin's: a new one; the bootstrap token's: for a
/// name that has none).
async fn node_token(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Reply {
    let n = name.clone();
    let token = blocking(&api, move |m| m.issue_node_token(&n, &caller)).await?;
    ok(serde_json::json!({ "node": name, "token": token }))
}

async fn get_node(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    ok(blocking(&api, move |m| m.get_node(&name)).await?)
}

async fn delete_node(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    let n = name.clone();
    deleted("node", name, blocking(&api, move |m| m.delete_node(&n)).await?)
}

/// Clusters as listed, with their controllers' state.
fn annotated(
    api: &Api,
    mut clusters: Vec<super::objects::Cluster>,
) -> Vec<super::objects::Cluster> {
    if let Some(f) = &api.fleet {
        clusters.iter_mut().for_each(|c| f.annotate(c));
    }
    clusters
}

async fn list_clusters(State(api): State<Api>) -> Reply {
    let clusters = blocking(&api, |m| m.list_clusters()).await?;
    ok(annotated(&api, clusters))
}

async fn get_cluster(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    let c = blocking(&api, move |m| m.get_cluster(&name)).await?;
    ok(annotated(&api, vec![c]).pop())
}

async fn create_cluster(State(api): State<Api>, b: Bytes) -> Reply {
    let spec: ClusterSpec = body(&b)?;
    let (c, new) = blocking(&api, move |m| m.create_cluster(spec)).await?;
    if let Some(f) = &api.fleet {
        f.changed();
    }
    created((c, new))
}

/// `?release=true` releases what the cluster's nodes hold (refused without it while they
/// hold ports).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteCluster {
    #[serde(default)]
    release: bool,
}

async fn delete_cluster(State(api): State<Api>, Path(name): Path<String>, q: RawQuery) -> Reply {
    let d: DeleteCluster = serde_urlencoded::from_str(q.0.as_deref().unwrap_or(""))
        .map_err(|e| ManagerError::Invalid(format!("query: {e}")))?;
    let n = name.clone();
    let gone = blocking(&api, move |m| m.delete_cluster(&n, d.release)).await?;
    if let Some(f) = &api.fleet {
        f.changed();
    }
    deleted("cluster", name, gone)
}

/// A new bootstrap token for the cluster's nodes: `{"cluster", "token"}`.
async fn cluster_token(State(api): State<Api>, Path(name): Path<String>) -> Reply {
    let n = name.clone();
    let token = blocking(&api, move |m| m.issue_cluster_token(&n)).await?;
    ok(serde_json::json!({ "cluster": name, "token": token }))
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ManagerError {
    ManagerError::NotFound { what: "route", name: format!("{method} {}", uri.path()) }
}

/// Every route of the API, `(method, path)` as in the OpenAPI document.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/health"),
    ("get", "/v1/live"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/kubernetes"),
    ("get", "/metrics"),
    ("get", "/v1/tenants"),
    ("post", "/v1/tenants"),
    ("get", "/v1/tenants/{name}"),
    ("delete", "/v1/tenants/{name}"),
    ("put", "/v1/tenants/{name}/quota"),
    ("put", "/v1/tenants/{name}/namespaces"),
    ("get", "/v1/networks"),
    ("post", "/v1/networks"),
    ("get", "/v1/networks/{name}"),
    ("delete", "/v1/networks/{name}"),
    ("get", "/v1/ipgroups"),
    ("get", "/v1/networks/{network}/ipgroups"),
    ("post", "/v1/networks/{network}/ipgroups"),
    ("get", "/v1/networks/{network}/ipgroups/{name}"),
    ("delete", "/v1/networks/{network}/ipgroups/{name}"),
    ("get", "/v1/ports"),
    ("post", "/v1/ports"),
    ("get", "/v1/ports/{container}/{interface}"),
    ("delete", "/v1/ports/{container}/{interface}"),
    ("get", "/v1/clusters"),
    ("post", "/v1/clusters"),
    ("get", "/v1/clusters/{name}"),
    ("delete", "/v1/clusters/{name}"),
    ("post", "/v1/clusters/{name}/token"),
    ("get", "/v1/nodes"),
    ("get", "/v1/nodes/{name}"),
    ("put", "/v1/nodes/{name}"),
    ("delete", "/v1/nodes/{name}"),
    ("post", "/v1/nodes/{name}/token"),
];

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/live", get(live))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/kubernetes", get(kubernetes))
        .route("/metrics", get(metrics))
        .route("/v1/tenants", get(list_tenants).post(create_tenant))
        .route("/v1/tenants/{name}", get(get_tenant).delete(delete_tenant))
        .route("/v1/tenants/{name}/quota", axum::routing::put(set_quota))
        .route("/v1/tenants/{name}/namespaces", axum::routing::put(set_namespaces))
        .route("/v1/networks", get(list_networks).post(create_network))
        .route("/v1/networks/{name}", get(get_network).delete(delete_network))
        .route("/v1/ipgroups", get(list_all_groups))
        .route("/v1/networks/{network}/ipgroups", get(list_groups).post(create_group))
        .route("/v1/networks/{network}/ipgroups/{name}", get(get_group).delete(delete_group))
        .route("/v1/ports", get(list_ports).post(create_port))
        .route("/v1/ports/{container}/{interface}", get(get_port).delete(delete_port))
        .route("/v1/clusters", get(list_clusters).post(create_cluster))
        .route("/v1/clusters/{name}", get(get_cluster).delete(delete_cluster))
        .route("/v1/clusters/{name}/token", axum::routing::post(cluster_token))
        .route("/v1/nodes", get(list_nodes))
        .route("/v1/nodes/{name}", get(get_node).put(register_node).delete(delete_node))
        .route("/v1/nodes/{name}/token", axum::routing::post(node_token))
        .fallback(no_route)
        .layer(middleware::from_fn_with_state(api.clone(), auth))
        .layer(middleware::from_fn_with_state(api.metrics.clone(), super::metrics::count_rest))
        .with_state(api)
}

/// Serves the API on the connections `listener` hands out until `stop` resolves, then lets
/// requests in flight finish (5 s at most). HTTP/1.1 with the [`Limits`]: headers within
/// `header`, a whole request within `request`, bodies of `body` bytes at most.
pub async fn serve<L>(
    mut listener: L,
    api: Api,
    limits: Limits,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let app = router(api)
        .layer(DefaultBodyLimit::max(limits.body))
        .layer(middleware::from_fn_with_state(limits.request, deadline));
    let (closing, _) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (io, peer) = tokio::select! {
            c = listener.accept() => c,
            () = &mut stop => break,
        };
        while connections.try_join_next().is_some() {}
        let app = app.clone();
        let mut closing = closing.subscribe();
        connections.spawn(async move {
            let service = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    tower::ServiceExt::oneshot(app.clone(), req)
                },
            );
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(limits.header);
            let mut conn = std::pin::pin!(http.serve_connection(TokioIo::new(io), service));
            let done = tokio::select! {
                r = conn.as_mut() => Some(r),
                _ = closing.changed() => None,
            };
            let r = match done {
                Some(r) => r,
                None => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "REST connection");
            }
        });
    }
    let _ = closing.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// Answers 503 to a request not answered within the limit (its body trickled in, or the
/// store is stuck).
async fn deadline(State(limit): State<std::time::Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ManagerError::Busy(format!(
            "the request was not answered within {} s (--request-timeout)",
            limit.as_secs()
        ))
        .into_response(),
    }
}
