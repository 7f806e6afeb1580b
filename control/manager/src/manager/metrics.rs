//! The manager's own Prometheus metrics (beside the Kubernetes controller's): requests
//! answered, by API (`rest`, `grpc`), operation and outcome, counted where each API answers;
//! the nodes' sync streams open on this manager; and each network's address use, read from
//! the store when scraped (at most once per [`ADDRESS_USE_EVERY`]: it lists every address).
//!
//! Labels are bounded whatever clients send: a REST operation is a method the API knows
//! (`OTHER` for any other) and its route's template (a request no route matches is
//! `unmatched`), a gRPC operation one of the service's methods (`unknown` otherwise).
//!
//! What is not counted: a REST request the server's deadline cut off (503), and a gRPC call
//! the server's own layers ended before the service answered (its timeout, a client that
//! went away). A gRPC refusal is counted by the `grpc-status` it is sent with in the
//! response's headers, which covers every refusal a handler returns; a status that comes
//! only in the trailers (an error inside the sync stream, a reply over the size limit) is
//! counted as `0`.

use super::Manager;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use knitter_api::metrics::escape;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a reading of the networks' address use is shown before it is read again.
pub const ADDRESS_USE_EVERY: Duration = Duration::from_secs(15);

/// The gRPC service's methods (the operations counted by name).
const GRPC_METHODS: &[&str] = &[
    "CreateTenant",
    "GetTenant",
    "ListTenants",
    "DeleteTenant",
    "SetQuota",
    "JoinNode",
    "Health",
    "SetNamespaces",
    "CreateNetwork",
    "GetNetwork",
    "ListNetworks",
    "DeleteNetwork",
    "CreateIpGroup",
    "GetIpGroup",
    "ListIpGroups",
    "DeleteIpGroup",
    "CreatePort",
    "GetPort",
    "ListPorts",
    "DeletePort",
    "RegisterNode",
    "GetNode",
    "ListNodes",
    "DeleteNode",
    "Sync",
    "GetKubernetesStatus",
    "CreateCluster",
    "GetCluster",
    "ListClusters",
    "DeleteCluster",
    "IssueClusterToken",
];

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, String, String), u64>>,
    sync_streams: AtomicI64,
    address_use: Mutex<Option<(Instant, String)>>,
}

/// Held while a node's sync stream is open.
pub struct StreamOpen(Arc<Metrics>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.sync_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn count(&self, api: &'static str, operation: &str, code: &str) {
        let mut r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *r.entry((api, operation.to_string(), code.to_string())).or_default() += 1;
    }

    /// Counts a sync stream open until the returned guard drops.
    pub fn stream_opened(self: &Arc<Self>) -> StreamOpen {
        self.sync_streams.fetch_add(1, Ordering::Relaxed);
        StreamOpen(self.clone())
    }

    /// The text exposition of these metrics (`manager` reads the address use; call on a
    /// blocking thread).
    pub fn render(&self, manager: &Manager) -> String {
        let mut out = String::new();
        knitter_api::metrics::build_info(&mut out, "knitter-manager", env!("CARGO_PKG_VERSION"));
        out.push_str("# HELP knitter_manager_api_requests_total Requests answered, by API, operation and outcome (HTTP status or gRPC code).\n");
        out.push_str("# TYPE knitter_manager_api_requests_total counter\n");
        for ((api, op, code), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "knitter_manager_api_requests_total{{api=\"{api}\",operation=\"{}\",code=\"{}\"}} {n}",
                escape(op),
                escape(code)
            );
        }
        out.push_str("# HELP knitter_manager_sync_streams Nodes' sync streams open on this manager.\n# TYPE knitter_manager_sync_streams gauge\n");
        let _ = writeln!(
            out,
            "knitter_manager_sync_streams {}",
            self.sync_streams.load(Ordering::Relaxed)
        );
        out.push_str(&self.address_use(manager));
        out
    }

    fn address_use(&self, manager: &Manager) -> String {
        let mut cached = self.address_use.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, text)) = cached.as_ref()
            && at.elapsed() < ADDRESS_USE_EVERY
        {
            return text.clone();
        }
        let rows = manager
            .address_use()
            .inspect_err(|e| tracing::warn!(error = %e, "address use not read"));
        let mut out = String::new();
        for (name, help, used) in [
            (
                "knitter_manager_network_addresses",
                "Addresses a network's pools hold, by family.",
                false,
            ),
            (
                "knitter_manager_network_addresses_used",
                "Addresses of a network held by ports and IP groups, by family.",
                true,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for r in rows.iter().flatten() {
                let value = if used { r.used as u128 } else { r.size };
                let _ = writeln!(
                    out,
                    "{name}{{network=\"{}\",family=\"{}\"}} {value}",
                    escape(&r.network),
                    r.family
                );
            }
        }
        out.push_str("# HELP knitter_manager_address_use_errors Whether the last reading of the address use failed (the store).\n");
        let _ = writeln!(
            out,
            "# TYPE knitter_manager_address_use_errors gauge\nknitter_manager_address_use_errors {}",
            u8::from(rows.is_err())
        );
        *cached = Some((Instant::now(), out.clone()));
        out
    }
}

/// REST middleware: counts each answer by its route's template and status.
pub async fn count_rest(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let method = match req.method().as_str() {
        m @ ("GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "PATCH" | "OPTIONS") => m,
        _ => "OTHER",
    };
    let op = match req.extensions().get::<MatchedPath>() {
        Some(p) => format!("{method} {}", p.as_str()),
        None => "unmatched".to_string(),
    };
    let r = next.run(req).await;
    m.count("rest", &op, r.status().as_str());
    r
}

/// A gRPC service counted by method and code (the `grpc-status` a refusal is sent with; a
/// response without one is `0`: an answer, or a stream opened).
#[derive(Clone)]
pub struct CountedGrpc<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> CountedGrpc<S> {
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        CountedGrpc { inner, metrics }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for CountedGrpc<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, RB> tower::Service<axum::http::Request<B>> for CountedGrpc<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let method = req.uri().path().rsplit('/').next().unwrap_or_default();
        let op = GRPC_METHODS.iter().find(|m| **m == method).copied().unwrap_or("unknown");
        let metrics = self.metrics.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let r = answer.await;
            if let Ok(resp) = &r {
                let code =
                    resp.headers().get("grpc-status").and_then(|v| v.to_str().ok()).unwrap_or("0");
                metrics.count("grpc", op, code);
            }
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_of_the_service_is_counted_by_name() {
        let proto = include_str!("../../../api/proto/knitter/manager/v1/manager.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect();
        assert_eq!(rpcs.len(), GRPC_METHODS.len(), "{rpcs:?}");
        for r in rpcs {
            assert!(GRPC_METHODS.contains(&r), "{r} is missing from GRPC_METHODS");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.count("rest", "GET /v1/networks/{name}", "200");
        m.count("rest", "a\"b", "404");
        let text: String = m
            .requests
            .lock()
            .unwrap()
            .keys()
            .map(|(_, o, _)| escape(o))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(text, "GET /v1/networks/{name} a\\\"b");
    }
}
