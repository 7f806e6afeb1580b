//! The manager over TLS, as an operator sets it up: `knitter-manager --tls-cert --tls-key
//! --tls-client-ca` (certificates made with openssl), knitterctl with `--manager-ca` and a
//! client certificate over gRPC, curl over REST; clients without the client certificate or
//! without TLS are refused.

mod common;

use common::{ManagerProc, TOKEN, certificates};
use std::process::{Command, Output};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn both_apis_serve_tls_and_require_the_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let f = |n: &str| dir.path().join(n).display().to_string();
    let m = ManagerProc::start(
        &dir.path().join("m"),
        &[
            "--tls-cert",
            &f("server.pem"),
            "--tls-key",
            &f("server.key"),
            "--tls-client-ca",
            &f("ca.pem"),
        ],
    );
    let token = f("m/token");
    let ctl = |tls: &[&str]| {
        Command::new(common::knitterctl())
            .args(["--manager", &m.grpc, "--token-file", &token])
            .args(tls)
            .args(["manager", "tenant", "list"])
            .output()
            .unwrap()
    };
    let with_cert = [
        "--manager-ca",
        &f("ca.pem"),
        "--manager-server-name",
        "localhost",
        "--manager-cert",
        &f("client.pem"),
        "--manager-key",
        &f("client.key"),
    ];
    let o = ctl(&with_cert);
    assert!(o.status.success() && text(&o).contains("admin"), "{}", text(&o));
    let o = ctl(&with_cert[..4]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "no client certificate (the manager hangs up): {}",
        text(&o)
    );
    let o = ctl(&[]);
    assert_eq!(o.status.code(), Some(4), "plain HTTP/2 to a TLS manager: {}", text(&o));
    let o = ctl(&[
        "--manager-ca",
        &f("other-ca.pem"),
        "--manager-server-name",
        "localhost",
        "--manager-cert",
        &f("client.pem"),
        "--manager-key",
        &f("client.key"),
    ]);
    assert_eq!(o.status.code(), Some(4), "a manager the client's CA did not sign: {}", text(&o));

    // REST: curl as users call it (the certificate names localhost).
    let port = m.rest.rsplit_once(':').unwrap().1.to_string();
    let curl = |cert: bool| {
        let mut c = Command::new("curl");
        c.args([
            "-sS",
            "--fail-with-body",
            "--max-time",
            "10",
            "--cacert",
            &f("ca.pem"),
            "--resolve",
            &format!("localhost:{port}:127.0.0.1"),
        ]);
        if cert {
            c.args(["--cert", &f("client.pem"), "--key", &f("client.key")]);
        }
        c.args([
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            &format!("https://localhost:{port}/v1/tenants"),
        ]);
        c.output().expect("curl (ci/setup.sh installs it)")
    };
    let o = curl(true);
    assert!(o.status.success() && text(&o).contains("\"admin\""), "{}", text(&o));
    assert!(!curl(false).status.success(), "REST without the client certificate");
}

#[test]
fn tls_files_that_do_not_work_are_refused_at_start_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let f = |n: &str| dir.path().join(n).display().to_string();
    let start = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_knitter-manager"))
            .args([
                "--data-dir",
                &f("m"),
                "--listen",
                "127.0.0.1:0",
                "--grpc-listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let o = start(&["--tls-cert", &f("server.pem"), "--tls-key", &f("missing.key")]);
    assert!(!o.status.success() && text(&o).contains("missing.key"), "{}", text(&o));
    let o = start(&["--tls-cert", &f("server.pem"), "--tls-key", &f("ca.pem")]);
    assert!(!o.status.success() && text(&o).contains("TLS: the key"), "{}", text(&o));
    let o = start(&["--tls-cert", &f("server.pem")]);
    assert!(!o.status.success() && text(&o).contains("--tls-key"), "{}", text(&o));
}
