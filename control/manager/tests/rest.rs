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
        let m = Arc::new(m);
        // Clusters listed with their controllers' state: the own one's (a controller's
        // status that never ran), added ones' waiting (the fleet does not run here).
        let lease = knitter_manager::manager::cluster::lease::LeaseOptions::timed(
            "knitter",
            "knitter-manager",
            "m1",
            std::time::Duration::from_secs(15),
        );
        let template = knitter_manager::manager::cluster::Options {
            cluster: "local".into(),
            cluster_id: String::new(),
            lease,
            release_nodes: true,
            network_status: false,
            network_resources: false,
            kubeconfigs: "/etc/knitter/clusters".into(),
        };
        let fleet = knitter_manager::manager::cluster::fleet::Fleet::new(
            m.clone(),
            template,
            Some(Arc::default()),
        );
        Client {
            app: rest::router(Api {
                manager: m,
                auth: Arc::new(auth),
                cluster: None,
                fleet: Some(fleet),
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

/// The OpenAPI document describes what the API takes and gives, field by field: every
/// request below (each optional field used somewhere) and every answer is checked against
/// the document's schema for its route and status, and every property the document names
/// must have been seen. A field the code grows without the document, or the document
/// without the code, fails here.
#[tokio::test]
async fn the_openapi_document_describes_every_body() {
    let c = Client::new();
    let mut check = Conformance::new();
    let policer = json!({"pps": 1000, "bps": 8_000_000, "burst_packets": 64, "burst_bytes": 65536});
    let calls: Vec<(u16, &str, &str, &str, Option<Value>)> = vec![
        (
            201,
            "POST",
            "/v1/tenants",
            "/v1/tenants",
            Some(json!({"name": "t1", "quota": {"networks": 3}, "namespaces": ["ns1"]})),
        ),
        (
            200,
            "PUT",
            "/v1/tenants/{name}/quota",
            "/v1/tenants/t1/quota",
            Some(json!({"networks": 4})),
        ),
        (
            200,
            "PUT",
            "/v1/tenants/{name}/namespaces",
            "/v1/tenants/t1/namespaces",
            Some(json!(["ns1", "ns2", "east/ns1"])),
        ),
        (200, "GET", "/v1/tenants", "/v1/tenants", None),
        (200, "GET", "/v1/tenants/{name}", "/v1/tenants/t1", None),
        (
            201,
            "POST",
            "/v1/clusters",
            "/v1/clusters",
            Some(json!({"name": "east", "kubeconfig": "/etc/knitter/clusters/east"})),
        ),
        (
            200,
            "PUT",
            "/v1/nodes/{name}",
            "/v1/nodes/n1",
            Some(
                json!({"vtep": "192.0.2.1", "underlay_mtu": 9000, "capabilities": ["vhost-user"], "cluster": "east"}),
            ),
        ),
        (200, "GET", "/v1/clusters", "/v1/clusters", None),
        (
            201,
            "POST",
            "/v1/networks",
            "/v1/networks",
            Some(json!({
            "name": "red", "tenant": "t1", "kind": "vxlan", "plane": "media", "segment": 7, "mtu": 1400,
            "ipv4": {"cidr": "10.1.0.0/24", "gateway": "10.1.0.1", "pools": [{"start": "10.1.0.10", "end": "10.1.0.100"}]},
            "ipv6": {"cidr": "fd00:1::/64", "gateway": "fd00:1::1"},
            "shared": false, "node_gateway": true, "masquerade": true,
            "pod_policer": policer, "clusters": ["local", "east"]})),
        ),
        (
            201,
            "POST",
            "/v1/networks",
            "/v1/networks",
            Some(
                json!({"name": "blue", "tenant": "t1", "kind": "vlan", "ipv4": {"cidr": "10.2.0.0/24"}, "sriov_pool": "pool-a", "pod_chooses_vf": true}),
            ),
        ),
        (200, "GET", "/v1/networks", "/v1/networks", None),
        (200, "GET", "/v1/networks/{name}", "/v1/networks/red", None),
        (
            201,
            "POST",
            "/v1/networks/{network}/ipgroups",
            "/v1/networks/red/ipgroups",
            Some(json!({"name": "g", "members": ["10.1.0.50"], "grace_secs": 60})),
        ),
        (
            201,
            "POST",
            "/v1/networks/{network}/ipgroups",
            "/v1/networks/red/ipgroups",
            Some(json!({"name": "h", "network": "red", "size": 2})),
        ),
        (200, "GET", "/v1/ipgroups", "/v1/ipgroups", None),
        (200, "GET", "/v1/networks/{network}/ipgroups", "/v1/networks/red/ipgroups", None),
        (200, "GET", "/v1/networks/{network}/ipgroups/{name}", "/v1/networks/red/ipgroups/g", None),
        (
            201,
            "POST",
            "/v1/ports",
            "/v1/ports",
            Some(json!({
            "network": "red", "container": "c1", "interface": "eth0", "pod": "ns1/a", "node": "n1",
            "ip_group": "g", "requested_mac": "02:00:00:00:00:01", "pod_uid": "uid-1",
            "device_info": "{\"type\":\"vhost-user\"}"})),
        ),
        (
            201,
            "POST",
            "/v1/ports",
            "/v1/ports",
            Some(
                json!({"network": "blue", "container": "c2", "interface": "net1", "ips": ["10.2.0.9"]}),
            ),
        ),
        (200, "GET", "/v1/ports", "/v1/ports?network=red", None),
        (200, "GET", "/v1/ports/{container}/{interface}", "/v1/ports/c1/eth0", None),
        (200, "GET", "/v1/nodes", "/v1/nodes", None),
        (200, "GET", "/v1/nodes/{name}", "/v1/nodes/n1", None),
        (200, "GET", "/v1/clusters/{name}", "/v1/clusters/east", None),
        (200, "POST", "/v1/clusters/{name}/token", "/v1/clusters/east/token", None),
        (200, "POST", "/v1/nodes/{name}/token", "/v1/nodes/n1/token", None),
        (200, "GET", "/v1/health", "/v1/health", None),
        (200, "GET", "/v1/live", "/v1/live", None),
        (404, "GET", "/v1/kubernetes", "/v1/kubernetes", None),
        (404, "GET", "/v1/tenants/{name}", "/v1/tenants/nobody", None),
        (200, "DELETE", "/v1/ports/{container}/{interface}", "/v1/ports/c1/eth0", None),
        (200, "DELETE", "/v1/ports/{container}/{interface}", "/v1/ports/c2/net1", None),
        (
            200,
            "DELETE",
            "/v1/networks/{network}/ipgroups/{name}",
            "/v1/networks/red/ipgroups/g",
            None,
        ),
        (200, "DELETE", "/v1/networks/{name}", "/v1/networks/blue", None),
        (200, "DELETE", "/v1/nodes/{name}", "/v1/nodes/n1", None),
        (
            200,
            "DELETE",
            "/v1/networks/{network}/ipgroups/{name}",
            "/v1/networks/red/ipgroups/h",
            None,
        ),
        (200, "DELETE", "/v1/networks/{name}", "/v1/networks/red", None),
        (200, "DELETE", "/v1/tenants/{name}", "/v1/tenants/t1", None),
        (200, "DELETE", "/v1/clusters/{name}", "/v1/clusters/east?release=true", None),
    ];
    for (expected, method, route, path, body) in calls {
        let op = format!("{method} {path}");
        let spec = &check.doc["paths"][route][method.to_lowercase()].clone();
        assert!(spec.is_object(), "{method} {route} is not in the document");
        if let Some(b) = &body {
            let schema = spec["requestBody"]["content"]["application/json"]["schema"].clone();
            assert!(schema.is_object(), "{op}: its request body is not documented");
            check.answer = false;
            check.check(&schema, b, &format!("{op} request"), "");
        }
        let (status, answer) = c.send(method, path, body.unwrap_or(Value::Null)).await;
        assert_eq!(status.as_u16(), expected, "{op}: {answer}");
        let responses = &spec["responses"];
        let by_status = &responses[status.as_u16().to_string()];
        let response = if by_status.is_object() { by_status } else { &responses["default"] };
        let schema = response["content"]["application/json"]["schema"].clone();
        assert!(schema.is_object(), "{op}: status {status} is not documented: {answer}");
        check.answer = true;
        check.check(&schema, &answer, &format!("{op} answer ({status})"), "");
    }
    assert!(
        check.errors.is_empty(),
        "the document and the API differ:\n{}",
        check.errors.join("\n")
    );
    let unseen = check.unseen();
    assert!(unseen.is_empty(), "properties the document names that no body carried: {unseen:?}");
    assert!(check.seen.len() > 60, "the bodies were checked field by field: {:?}", check.seen);
}

/// A small checker of JSON bodies against the OpenAPI document's schemas (the subset the
/// document uses: `$ref`, `allOf`, `type`, `properties`, `required`, `items`, `enum`).
/// Unlike JSON Schema's default, a property the schema does not name is an error: the point
/// is that the document names every field.
struct Conformance {
    doc: Value,
    /// Whether the bodies checked now are answers (else requests).
    answer: bool,
    /// `(answer, property)` for every documented property a body carried.
    seen: std::collections::BTreeSet<(bool, String)>,
    errors: Vec<String>,
}

impl Conformance {
    fn new() -> Conformance {
        Conformance {
            doc: serde_json::from_str(OPENAPI).unwrap(),
            answer: true,
            seen: Default::default(),
            errors: Vec::new(),
        }
    }

    /// Follows a `$ref`: the schema and the component's name (what `seen` is kept under).
    fn resolve(&self, schema: &Value, owner: &str) -> (Value, String) {
        match schema["$ref"].as_str() {
            Some(r) => {
                let name = r.trim_start_matches("#/components/schemas/");
                (self.doc["components"]["schemas"][name].clone(), name.to_string())
            }
            None => (schema.clone(), owner.to_string()),
        }
    }

    /// `(property, its schema, the name it is seen under)` and the required names of an
    /// object schema, `allOf`'s parts merged.
    fn members(&self, schema: &Value, owner: &str) -> (Vec<(String, Value, String)>, Vec<String>) {
        let (schema, owner) = self.resolve(schema, owner);
        let (mut props, mut required) = (Vec::new(), Vec::new());
        for part in schema["allOf"].as_array().into_iter().flatten() {
            let (p, r) = self.members(part, &owner);
            props.extend(p);
            required.extend(r);
        }
        for (k, v) in schema["properties"].as_object().into_iter().flatten() {
            props.push((k.clone(), v.clone(), format!("{owner}.{k}")));
        }
        for r in schema["required"].as_array().into_iter().flatten() {
            required.push(r.as_str().unwrap_or_default().to_string());
        }
        (props, required)
    }

    fn check(&mut self, schema: &Value, v: &Value, at: &str, owner: &str) {
        let (resolved, owner) = self.resolve(schema, owner);
        if v.is_null() && resolved["nullable"] == true {
            return;
        }
        if let Some(allowed) = resolved["enum"].as_array()
            && !allowed.contains(v)
        {
            self.errors.push(format!("{at}: {v} is not one of {allowed:?}"));
        }
        let ty = resolved["type"].as_str().unwrap_or(if resolved["allOf"].is_array() {
            "object"
        } else {
            ""
        });
        let fits = match ty {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            _ => true,
        };
        if !fits {
            self.errors.push(format!("{at}: {v} is not {ty}"));
            return;
        }
        if let Some(items) = v.as_array() {
            for (i, item) in items.iter().enumerate() {
                self.check(&resolved["items"], item, &format!("{at}[{i}]"), &format!("{owner}[]"));
            }
        }
        let Some(object) = v.as_object() else { return };
        let (props, required) = self.members(&resolved, &owner);
        if props.is_empty() && resolved["allOf"].is_null() {
            return; // a free-form object (health, the controller's state)
        }
        for r in &required {
            if !object.contains_key(r) {
                self.errors.push(format!("{at}: required {r:?} missing"));
            }
        }
        for (k, value) in object {
            match props.iter().find(|(name, ..)| name == k) {
                Some((_, schema, seen_as)) => {
                    if !self.answer && schema["readOnly"] == true {
                        self.errors
                            .push(format!("{at}: {k:?} is read-only, yet a request carries it"));
                    }
                    if self.answer && schema["writeOnly"] == true {
                        self.errors
                            .push(format!("{at}: {k:?} is write-only, yet an answer carries it"));
                    }
                    self.seen.insert((self.answer, seen_as.clone()));
                    let (schema, seen_as) = (schema.clone(), seen_as.clone());
                    self.check(&schema, value, &format!("{at}.{k}"), &seen_as);
                }
                None => self.errors.push(format!("{at}: {k:?} is not in the document")),
            }
        }
    }

    /// What no body carried: every property of a schema answers use (but a write-only one)
    /// not seen in an answer, and of a schema requests use (but a read-only one) not seen in
    /// a request; nested ones by path.
    fn unseen(&self) -> Vec<String> {
        fn refs(v: &Value, out: &mut std::collections::BTreeSet<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                        out.insert(r.trim_start_matches("#/components/schemas/").to_string());
                    }
                    m.values().for_each(|x| refs(x, out));
                }
                Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
                _ => {}
            }
        }
        fn props(s: &Value, owner: &str, out: &mut Vec<(String, bool, bool)>) {
            for (k, v) in s["properties"].as_object().into_iter().flatten() {
                let name = format!("{owner}.{k}");
                props(v, &name, out);
                props(&v["items"], &format!("{name}[]"), out);
                out.push((name, v["readOnly"] == true, v["writeOnly"] == true));
            }
            for part in s["allOf"].as_array().into_iter().flatten() {
                props(part, owner, out);
            }
        }
        let schemas = &self.doc["components"]["schemas"];
        let (mut requests, mut answers) = (Default::default(), Default::default());
        for item in self.doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                refs(&op["requestBody"], &mut requests);
                refs(&op["responses"], &mut answers);
            }
        }
        let mut missing = Vec::new();
        for (used, answer) in [(requests, false), (answers, true)] {
            let mut all = used;
            loop {
                let before = all.len();
                for name in all.clone() {
                    refs(&schemas[&name], &mut all);
                }
                if all.len() == before {
                    break;
                }
            }
            for name in all {
                let mut all_props = Vec::new();
                props(&schemas[&name], &name, &mut all_props);
                for (p, read_only, write_only) in all_props {
                    let applies = if answer { !write_only } else { !read_only };
                    if applies && !self.seen.contains(&(answer, p.clone())) {
                        missing.push(format!("{} {p}", if answer { "answer" } else { "request" }));
                    }
                }
            }
        }
        missing
    }
}
