//! The manager's server limits against clients that hold on: one client address opening
//! connections by the hundred and sending half a request (or nothing) on each gets its share
//! (`--max-client-connections`), the rest closed at once, its share closed after the header
//! or idle timeout, and meanwhile others are answered at once on both APIs; a body over the
//! limit gets 413, a body trickled in gets 503 at the request timeout (here shorter than the
//! idle timeout, as by default).

mod common;

use common::{ManagerProc, TOKEN};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A connection from `from` (another loopback address: another client).
async fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(format!("{from}:0").parse().unwrap())?;
    s.connect(to).await
}

/// Whether the server closed `c` within `within` (reading what it sent meanwhile).
async fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

async fn curl(args: &[&str]) -> (bool, String) {
    let o = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .await
        .expect("curl (ci/setup.sh installs it)");
    (
        o.status.success(),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_connections_starves_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let limits = [
        "--max-client-connections",
        "8",
        "--header-timeout",
        "2",
        "--idle-timeout",
        "2",
        "--request-timeout",
        "1",
    ];
    let m = ManagerProc::start(&dir.path().join("m"), &limits);
    let (rest, grpc): (SocketAddr, SocketAddr) = (m.rest.parse().unwrap(), m.grpc.parse().unwrap());

    // 100 connections to each API from 127.0.0.2: half a request line on REST, nothing on gRPC.
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut r = connect_from("127.0.0.2", rest).await.unwrap();
        let _ = r.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n").await;
        held.push(("rest", r));
        held.push(("grpc", connect_from("127.0.0.2", grpc).await.unwrap()));
    }
    let mut open = [0, 0];
    for (api, c) in &mut held {
        if !closed_within(c, Duration::from_millis(300)).await {
            open[usize::from(*api == "grpc")] += 1;
        }
    }
    assert!(
        open[0] <= 8 && open[1] <= 8,
        "kept open beyond the client's share (REST, gRPC): {open:?}"
    );

    // Others are served at once, on both APIs.
    let started = Instant::now();
    let (ok, out) = curl(&[&format!("http://{rest}/v1/health")]).await;
    assert!(ok && out.contains("serving"), "{out}");
    let o = tokio::process::Command::new(common::knitterctl())
        .args(["--manager", &m.grpc, "manager", "health"])
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(started.elapsed() < Duration::from_secs(2), "answered in {:?}", started.elapsed());

    // The client's share is closed by the header and idle timeouts (2 s each here).
    for (api, c) in &mut held {
        assert!(
            closed_within(c, Duration::from_secs(5)).await,
            "a {api} connection was still open after its timeout"
        );
    }

    // Bodies: over the limit, and trickled in.
    let auth = format!("Authorization: Bearer {TOKEN}");
    let big = format!("{{\"name\":\"{}\"}}", "x".repeat(2 << 20));
    let path = dir.path().join("big.json");
    std::fs::write(&path, big).unwrap();
    let (_, out) = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &format!("@{}", path.display()),
        &format!("http://{rest}/v1/tenants"),
    ])
    .await;
    assert!(out.starts_with("413"), "a 2 MiB body: {out}");
    let mut slow = TcpStream::connect(rest).await.unwrap();
    let head = format!(
        "POST /v1/tenants HTTP/1.1\r\nHost: x\r\n{auth}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\":"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(6), async {
        let mut buf = [0u8; 1024];
        loop {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    reply.extend_from_slice(&buf[..n]);
                    if reply.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer to a trickled body");
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
}
