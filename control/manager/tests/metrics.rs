//! The manager's `/metrics` as Prometheus scrapes it from the real process, with the metrics
//! token: requests of both APIs by operation and outcome, a network's address use, the
//! nodes' sync streams open; the metrics token reads nothing else.

mod common;

use common::{ManagerProc, TOKEN};
use knitter_api::manager as pb;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const SCRAPER: &str = "prometheus-reads-metrics";

/// One HTTP/1.1 request with the admin token: (status, body).
fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_as(addr, TOKEN, method, path, body)
}

fn http_as(addr: &str, token: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let body = body.unwrap_or("");
    write!(c, "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn request<T>(msg: T) -> tonic::Request<T> {
    request_as(TOKEN, msg)
}

fn request_as<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    knitter_api::process::bearer(&mut r, token).unwrap();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_addresses_and_sync_streams() {
    let dir = tempfile::tempdir().unwrap();
    let m = tokio::task::spawn_blocking({
        let d = dir.path().join("m");
        move || {
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("metrics-token"), SCRAPER).unwrap();
            ManagerProc::start(
                &d,
                &["--metrics-token-file", &d.join("metrics-token").display().to_string()],
            )
        }
    })
    .await
    .unwrap();
    let rest = m.rest.clone();
    let call = |method: &'static str, path: &'static str, body: Option<&'static str>| {
        let rest = rest.clone();
        tokio::task::spawn_blocking(move || http(&rest, method, path, body))
    };
    let red = r#"{"name": "red", "tenant": "admin", "kind": "vxlan", "ipv4": {"cidr": "10.1.0.0/24", "gateway": "10.1.0.1"}}"#;
    assert_eq!(call("POST", "/v1/networks", Some(red)).await.unwrap().0, 201);
    assert_eq!(call("GET", "/v1/networks/nope", None).await.unwrap().0, 404);
    let port = r#"{"network": "red", "container": "c1", "interface": "eth1", "pod": "ns/a", "node": "n1"}"#;
    assert_eq!(call("POST", "/v1/ports", Some(port)).await.unwrap().0, 201);

    let mut grpc =
        pb::manager_client::ManagerClient::connect(format!("http://{}", m.grpc)).await.unwrap();
    grpc.list_networks(request(pb::ListRequest::default())).await.unwrap();
    let missing = grpc.get_network(request(pb::Name { name: "nope".into() })).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let node = pb::Node { name: "n1".into(), vtep: "192.0.2.1".into(), ..Default::default() };
    let mut stream = grpc
        .sync(request(pb::SyncRequest { node: Some(node), revision: 0 }))
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().expect("a first desired state");

    let as_scraper = |method: &'static str, path: &'static str| {
        let rest = rest.clone();
        tokio::task::spawn_blocking(move || http_as(&rest, SCRAPER, method, path, None))
    };
    let scrape = || async {
        let (status, text) = as_scraper("GET", "/metrics").await.unwrap();
        assert_eq!(status, 200, "{text}");
        text
    };
    assert_eq!(
        as_scraper("GET", "/v1/networks").await.unwrap().0,
        403,
        "the metrics token reads /metrics only"
    );
    assert_eq!(as_scraper("DELETE", "/v1/networks/red").await.unwrap().0, 403);
    let refused =
        grpc.list_networks(request_as(SCRAPER, pb::ListRequest::default())).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::PermissionDenied,
        "the metrics token reads nothing over gRPC: {refused}"
    );
    // A method nobody defined is one series, whatever it is called.
    for m in ["BREW", "FOO123", "X"] {
        let rest = rest.clone();
        tokio::task::spawn_blocking(move || http(&rest, m, "/v1/tenants", None)).await.unwrap();
    }
    let text = scrape().await;
    for line in [
        r#"knitter_manager_api_requests_total{api="rest",operation="POST /v1/networks",code="201"} 1"#,
        r#"knitter_manager_api_requests_total{api="rest",operation="GET /v1/networks/{name}",code="404"} 1"#,
        r#"knitter_manager_api_requests_total{api="rest",operation="POST /v1/ports",code="201"} 1"#,
        r#"knitter_manager_api_requests_total{api="grpc",operation="ListNetworks",code="0"} 1"#,
        r#"knitter_manager_api_requests_total{api="grpc",operation="GetNetwork",code="5"} 1"#,
        r#"knitter_manager_api_requests_total{api="grpc",operation="Sync",code="0"} 1"#,
        r#"knitter_manager_api_requests_total{api="grpc",operation="ListNetworks",code="7"} 1"#,
        r#"knitter_manager_api_requests_total{api="rest",operation="OTHER /v1/tenants",code="405"} 3"#,
        r#"knitter_manager_network_addresses_used{network="red",family="ipv4"} 1"#,
        "knitter_manager_sync_streams 1",
        concat!(
            "knitter_build_info{component=\"knitter-manager\",version=\"",
            env!("CARGO_PKG_VERSION"),
            "\"} 1"
        ),
        "knitter_manager_address_use_errors 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l
                .starts_with(r#"knitter_manager_network_addresses{network="red",family="ipv4"} "#)),
        "{text}"
    );

    // The stream closed by the node: the gauge goes back (address use is read at most every
    // 15 s, so only the stream is looked at again).
    drop(stream);
    drop(grpc);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scrape().await.lines().any(|l| l == "knitter_manager_sync_streams 0") {
        assert!(Instant::now() < deadline, "the sync stream is still counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
