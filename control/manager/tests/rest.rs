//! The REST API as curl users meet it, through the real router: bearer tokens (reads open
//! on loopback only), 201 vs 200 for idempotent creates, errors as `{code, reason}` with
//! their statuses, filters, malformed bodies and queries, and every route in the OpenAPI
//! document.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use knitter_manager::manager::rest::{self, Api, OPENAPI, ROUTES};
use knitter_manager::manager::{Config, Manager};
use knitter_manager::store::embedded::Embedded;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use tower::ServiceExt;

const TOKEN: &str = "t0ken";
const BOOTSTRAP: &str = "b00tstrap";

struct Client {
    app: axum::Router,
    _dir: tempfile::TempDir,
}

impl Client {
    fn new() -> Client {
        Self::with_loopback_reads(true)
    }

    fn with_loopback_reads(loopback_reads: bool) -> Client {
        let dir = tempfile::tempdir().unwrap();
        let m = Manager::new(
            Arc::new(Embedded::open(&dir.path().join("s.redb")).unwrap()),
            Config::default(),
        )
        .unwrap();
        let auth = knitter_manager::manager::auth::Auth::new(
            TOKEN,
            Some(BOOTSTRAP.into()),
            loopback_reads,
        );
        Client {
            app: rest::router(Api {
                manager: Arc::new(m),
                auth: Arc::new(auth),
                cluster: None,
                metrics: Default::default(),
            }),
            _dir: dir,
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
        from: &str,
    ) -> (StatusCode, Value) {
        let mut r = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        let mut req = r.body(body.map_or(Body::empty(), |b| Body::from(b.to_string()))).unwrap();
        req.extensions_mut().insert(ConnectInfo(from.parse::<SocketAddr>().unwrap()));
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn send(&self, method: &str, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(method, path, Some(body), Some(TOKEN), "127.0.0.1:5000").await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call("GET", path, None, None, "127.0.0.1:5000").await
    }
}

#[tokio::test]
async fn curl_users_get_codes_reasons_and_idempotent_creates() {
    let c = Client::new();
    let red = json!({"name": "red", "tenant": "admin", "kind": "vxlan", "ipv4": {"cidr": "10.1.0.0/24", "gateway": "10.1.0.1"}});

    // Tokens.
    let (s, e) = c.call("POST", "/v1/networks", Some(red.clone()), None, "127.0.0.1:5000").await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthenticated")));
    let (s, _) =
        c.call("POST", "/v1/networks", Some(red.clone()), Some("wrong"), "127.0.0.1:5000").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(
        c.call("GET", "/v1/networks", None, None, "192.0.2.7:5000").await.0,
        StatusCode::UNAUTHORIZED,
        "remote reads need the token"
    );
    assert_eq!(
        c.call("GET", "/v1/networks", None, Some(TOKEN), "192.0.2.7:5000").await.0,
        StatusCode::OK
    );
    assert_eq!(
        c.call("GET", "/v1/health", None, None, "192.0.2.7:5000").await.0,
        StatusCode::OK,
        "probes (a kubelet's) carry no token"
    );
    assert_eq!(
        c.call("GET", "/v1/live", None, None, "192.0.2.7:5000").await.0,
        StatusCode::OK,
        "liveness probes neither"
    );
    assert_eq!(
        c.call("DELETE", "/v1/health", None, None, "192.0.2.7:5000").await.0,
        StatusCode::UNAUTHORIZED,
        "only reads of it"
    );

    // Idempotent creates: 201, then 200 with the same object.
    let (s, first) = c.send("POST", "/v1/networks", red.clone()).await;
    assert_eq!(
        (s, first["segment"].as_u64(), first["mtu"].as_u64()),
        (StatusCode::CREATED, Some(5000), Some(1450))
    );
    let (s, again) = c.send("POST", "/v1/networks", red.clone()).await;
    assert_eq!((s, &again), (StatusCode::OK, &first));

    // Errors carry a code and a reason.
    let (s, e) = c.send("POST", "/v1/networks", json!({"name": "blue", "tenant": "admin", "kind": "vxlan", "ipv4": {"cidr": "10.1.0.0/16"}})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::CONFLICT, Some("conflict")));
    assert_eq!(
        e["reason"],
        "network \"blue\": subnet 10.1.0.0/16 overlaps 10.1.0.0/24 of network \"red\""
    );
    let (s, e) = c.send("POST", "/v1/networks", json!({"name": "x", "kind": "geneve"})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_argument")));
    assert!(
        e["reason"].as_str().unwrap().starts_with("request body: unknown variant `geneve`"),
        "{e}"
    );
    let (s, e) = c
        .send(
            "POST",
            "/v1/ports",
            json!({"network": "red", "container": "c1", "interface": "eth0", "ips": ["10.2.0.1"]}),
        )
        .await;
    assert_eq!(
        (s, e["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("address 10.2.0.1 is outside subnet 10.1.0.0/24"))
    );
    let (s, e) = c.get("/v1/networks/nope").await;
    assert_eq!(
        (s, e["reason"].as_str()),
        (StatusCode::NOT_FOUND, Some("network \"nope\" not found"))
    );
    let (s, e) = c.get("/v1/ports?netwrok=red").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "a misspelt filter is refused, not ignored: {e}");
    let (s, e) = c.get("/v2/whatever").await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));

    // Ports, groups, nodes, tenants; filters; deletes.
    let (s, p) = c.send("POST", "/v1/ports", json!({"network": "red", "container": "c1", "interface": "eth0", "pod": "ns/a", "node": "n1"})).await;
    assert_eq!(
        (s, p["addresses"][0]["address"].as_str(), p["mac"].as_str()),
        (StatusCode::CREATED, Some("10.1.0.2"), Some("0a:58:0a:01:00:02"))
    );
    let (s, g) = c
        .send(
            "POST",
            "/v1/networks/red/ipgroups",
            json!({"name": "g", "members": ["10.1.0.50", "10.1.0.51"]}),
        )
        .await;
    assert_eq!((s, g["grace_secs"].as_u64()), (StatusCode::CREATED, Some(300)));
    let (s, _) = c
        .send(
            "POST",
            "/v1/networks/red/ipgroups",
            json!({"name": "h", "network": "blue", "size": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "body and path disagree on the network");
    assert_eq!(c.get("/v1/ipgroups?network=red").await.1.as_array().map(Vec::len), Some(1));
    assert_eq!(c.get("/v1/ports?node=n1").await.1.as_array().map(Vec::len), Some(1));
    assert_eq!(c.get("/v1/ports?node=n2").await.1.as_array().map(Vec::len), Some(0));
    let (s, n) =
        c.send("PUT", "/v1/nodes/n1", json!({"vtep": "192.0.2.1", "underlay_mtu": 9000})).await;
    assert_eq!(
        (s, n["name"].as_str(), n["state"].as_str()),
        (StatusCode::OK, Some("n1"), Some("unknown"))
    );
    let (s, e) = c.send("DELETE", "/v1/networks/red", json!(null)).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::CONFLICT, Some("in_use")));
    let (s, t) =
        c.send("POST", "/v1/tenants", json!({"name": "acme", "quota": {"networks": 1}})).await;
    assert_eq!((s, t["quota"]["networks"].as_u64()), (StatusCode::CREATED, Some(1)));
    c.send(
        "POST",
        "/v1/networks",
        json!({"name": "a1", "tenant": "acme", "kind": "vlan", "ipv4": {"cidr": "10.9.0.0/24"}}),
    )
    .await;
    let (s, e) = c.send("POST", "/v1/networks", json!({"name": "a2", "tenant": "acme", "kind": "vlan", "ipv4": {"cidr": "10.8.0.0/24"}})).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::FORBIDDEN, Some("quota_exceeded")));
    assert_eq!(c.send("DELETE", "/v1/ports/c1/eth0", json!(null)).await.0, StatusCode::OK);
    assert_eq!(c.send("DELETE", "/v1/ports/c1/eth0", json!(null)).await.0, StatusCode::NOT_FOUND);
    let (s, h) = c.get("/v1/health").await;
    assert_eq!((s, h["status"].as_str()), (StatusCode::OK, Some("serving")));
    let (s, e) = c.get("/v1/kubernetes").await;
    assert_eq!(
        (s, e["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "no controller without --kubernetes"
    );
}

#[test]
fn every_route_is_in_the_openapi_document() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    for (method, path) in ROUTES {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} is not documented");
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().keys().filter(|k| *k != "parameters").count())
        .sum();
    assert_eq!(documented, ROUTES.len(), "the document has routes the server lacks");
}

/// What the docs say, the API does: the same container and interface asking for another
/// pod, node, fixed address or IP group is a conflict (a retry of the same request gets the
/// same port); a network may name any valid VNI (the configured range is for networks that
/// name none); a body field the API does not know is refused by name, in every body.
#[tokio::test]
async fn docs_and_behaviour_agree() {
    let c = Client::new();
    let red = json!({"name": "red", "tenant": "admin", "kind": "vxlan", "segment": 1, "ipv4": {"cidr": "10.1.0.0/24"}});
    let (s, n) = c.send("POST", "/v1/networks", red).await;
    assert_eq!(
        (s, n["segment"].as_u64()),
        (StatusCode::CREATED, Some(1)),
        "a VNI outside the automatic range: {n}"
    );
    let (s, e) = c.send("POST", "/v1/networks", json!({"name": "b", "tenant": "admin", "kind": "vxlan", "segment": 0, "ipv4": {"cidr": "10.2.0.0/24"}})).await;
    assert_eq!(
        (s, e["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("network \"b\": VNI 0 is not a valid VNI (1-16777215)"))
    );
    c.send("POST", "/v1/networks/red/ipgroups", json!({"name": "g", "members": ["10.1.0.50"]}))
        .await;

    let port = json!({"network": "red", "container": "c1", "interface": "eth0", "pod": "ns/a", "node": "n1"});
    assert_eq!(c.send("POST", "/v1/ports", port.clone()).await.0, StatusCode::CREATED);
    assert_eq!(c.send("POST", "/v1/ports", port.clone()).await.0, StatusCode::OK, "a retry");
    for (field, value, says) in [
        ("pod", json!("ns/b"), "another pod"),
        ("node", json!("n2"), "another node"),
        ("ips", json!(["10.1.0.9"]), "another fixed address"),
        ("ip_group", json!("g"), "another IP group"),
    ] {
        let mut other = port.clone();
        other[field] = value;
        let (s, e) = c.send("POST", "/v1/ports", other).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (StatusCode::CONFLICT, Some("conflict")),
            "{field}: {e}"
        );
        assert_eq!(
            e["reason"],
            format!("container c1 interface eth0 is already a port with {says}")
        );
    }

    let (s, e) = c
        .send(
            "POST",
            "/v1/ports",
            json!({"network": "red", "container": "c2", "interface": "eth0", "ip": ["10.1.0.9"]}),
        )
        .await;
    assert_eq!(
        (s, e["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("request body: unknown field \"ip\"")),
        "not a dynamic address"
    );
    assert_eq!(c.get("/v1/ports/c2/eth0").await.0, StatusCode::NOT_FOUND, "nothing made");
    // Every body: IP groups and node records too (their handlers fill fields in first).
    let (s, e) = c
        .send("POST", "/v1/networks/red/ipgroups", json!({"name": "h", "size": 2, "grace": 60}))
        .await;
    assert_eq!(
        (s, e["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("request body: unknown field \"grace\"")),
        "{e}"
    );
    let (s, e) = c.send("PUT", "/v1/nodes/n9", json!({"vtep": "192.0.2.9", "mtu": 9000})).await;
    assert_eq!(
        (s, e["reason"].as_str()),
        (StatusCode::BAD_REQUEST, Some("request body: unknown field \"mtu\"")),
        "{e}"
    );
    assert_eq!(c.get("/v1/nodes/n9").await.0, StatusCode::NOT_FOUND, "nothing registered");
}

/// Each node has its own identity: the bootstrap token gets a node its token once (and does
/// nothing else); with it the node registers itself, makes, reads and deletes ports on
/// itself (its pods', checked against tenancy), reads nodes — and is refused everything
/// else: another node's name and ports, tenants, networks, IP groups. The admin issues a
/// node a new token, which revokes the old. Loopback reads without a token are opt-in.
#[tokio::test]
async fn a_nodes_credential_reaches_only_its_own_objects() {
    let c = Client::with_loopback_reads(false);
    let as_ = |t: &str| t.to_string();
    let call = |method: &'static str, path: String, body: Option<Value>, token: String| {
        let c = &c;
        async move { c.call(method, &path, body, Some(&token), "192.0.2.9:5000").await }
    };
    let admin = as_(TOKEN);
    assert_eq!(call("POST", "/v1/networks".into(), Some(json!({"name": "red", "tenant": "admin", "kind": "vxlan", "ipv4": {"cidr": "10.1.0.0/24"}})), admin.clone()).await.0, StatusCode::CREATED);
    // Joining: once with the bootstrap token, again only through the admin.
    let (s, j) = call("POST", "/v1/nodes/n1/token".into(), None, as_(BOOTSTRAP)).await;
    assert_eq!(s, StatusCode::OK, "{j}");
    let t1 = j["token"].as_str().unwrap().to_string();
    let (s, e) = call("POST", "/v1/nodes/n1/token".into(), None, as_(BOOTSTRAP)).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::CONFLICT, Some("conflict")), "{e}");
    assert!(e["reason"].as_str().unwrap().contains("joined already"));
    let n2 = call("POST", "/v1/nodes/n2/token".into(), None, as_(BOOTSTRAP)).await.1["token"]
        .as_str()
        .unwrap()
        .to_string();
    for (m, p, b) in [
        ("POST", "/v1/tenants", json!({"name": "x"})),
        ("GET", "/v1/nodes", json!(null)),
        ("POST", "/v1/networks", json!({"name": "x"})),
    ] {
        let (s, e) = call(m, p.into(), Some(b), as_(BOOTSTRAP)).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("permission_denied")),
            "the bootstrap token: {m} {p}"
        );
    }
    // What a node may do.
    assert_eq!(
        call("PUT", "/v1/nodes/n1".into(), Some(json!({"vtep": "192.0.2.1"})), t1.clone()).await.0,
        StatusCode::OK
    );
    let (s, p) = call(
        "POST",
        "/v1/ports".into(),
        Some(json!({"network": "red", "container": "c1", "interface": "eth0", "pod": "ns/p1"})),
        t1.clone(),
    )
    .await;
    assert_eq!((s, p["node"].as_str()), (StatusCode::CREATED, Some("n1")), "{p}");
    assert_eq!(call("POST", "/v1/ports".into(), Some(json!({"network": "red", "container": "c2", "interface": "eth0", "pod": "ns/p2", "node": "n2"})), n2.clone()).await.0, StatusCode::CREATED);
    assert_eq!(call("GET", "/v1/nodes".into(), None, t1.clone()).await.0, StatusCode::OK);
    assert_eq!(call("GET", "/v1/ports/c1/eth0".into(), None, t1.clone()).await.0, StatusCode::OK);
    let (_, mine) = call("GET", "/v1/ports".into(), None, t1.clone()).await;
    assert_eq!(mine.as_array().map(Vec::len), Some(1), "its own ports only: {mine}");
    // What it may not.
    let refused = [
        ("PUT", "/v1/nodes/n2", Some(json!({"vtep": "192.0.2.2"}))),
        (
            "POST",
            "/v1/ports",
            Some(
                json!({"network": "red", "container": "c3", "interface": "eth0", "pod": "ns/p3", "node": "n2"}),
            ),
        ),
        ("GET", "/v1/ports/c2/eth0", None),
        ("DELETE", "/v1/ports/c2/eth0", None),
        ("DELETE", "/v1/nodes/n2", None),
        ("POST", "/v1/tenants", Some(json!({"name": "evil"}))),
        ("PUT", "/v1/tenants/admin/quota", Some(json!({"networks": 1000}))),
        (
            "POST",
            "/v1/networks",
            Some(
                json!({"name": "evil", "tenant": "admin", "kind": "vxlan", "ipv4": {"cidr": "10.9.0.0/24"}}),
            ),
        ),
        ("DELETE", "/v1/networks/red", None),
        ("GET", "/v1/tenants", None),
        ("POST", "/v1/nodes/n2/token", None),
    ];
    for (m, p, b) in refused {
        let (s, e) = call(m, p.into(), b, t1.clone()).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("permission_denied")),
            "node n1: {m} {p}: {e}"
        );
    }
    assert!(
        call("GET", "/v1/ports/c2/eth0".into(), None, admin.clone()).await.0 == StatusCode::OK,
        "n2's port is still there"
    );
    assert_eq!(
        call("DELETE", "/v1/ports/c1/eth0".into(), None, t1.clone()).await.0,
        StatusCode::OK
    );
    // A new token from the admin revokes the old.
    let (s, j) = call("POST", "/v1/nodes/n1/token".into(), None, admin.clone()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        call("GET", "/v1/nodes".into(), None, t1.clone()).await.0,
        StatusCode::UNAUTHORIZED,
        "the old token is revoked"
    );
    assert_eq!(
        call("GET", "/v1/nodes".into(), None, j["token"].as_str().unwrap().to_string()).await.0,
        StatusCode::OK
    );
    // Loopback reads need a token unless --loopback-reads.
    assert_eq!(
        c.call("GET", "/v1/networks", None, None, "127.0.0.1:5000").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(c.call("GET", "/v1/health", None, None, "127.0.0.1:5000").await.0, StatusCode::OK);
}
