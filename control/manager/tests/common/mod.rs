//! What several test files share: a real etcd started on loopback ports (killed with
//! SIGKILL on drop), free ports, and knitter-manager processes.
#![allow(dead_code)]

pub mod controllers;
pub mod etcd_requests;
pub mod scenarios;

use knitter_manager::store::Store;
use knitter_manager::store::etcd::{Etcd, EtcdAccess};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One etcd member on loopback; killed (SIGKILL) on drop.
pub struct EtcdServer {
    child: Child,
    pub client_url: String,
    /// With TLS: how clients reach it (the test CA, a client certificate).
    pub access: EtcdAccess,
}

impl EtcdServer {
    pub fn start(data: &Path, client: u16, peer: u16) -> Option<EtcdServer> {
        EtcdServer::start_with(data, client, peer, None)
    }

    /// A member serving clients over TLS only, with `certs`' (`certificates`) server
    /// certificate for localhost, requiring client certificates the test CA signed.
    pub fn start_tls(data: &Path, certs: &Path) -> Option<EtcdServer> {
        EtcdServer::start_with(data, free_port(), free_port(), Some(certs))
    }

    fn start_with(data: &Path, client: u16, peer: u16, tls: Option<&Path>) -> Option<EtcdServer> {
        if Command::new("etcd").arg("--version").output().is_err() {
            assert!(
                std::env::var_os("CI").is_none(),
                "etcd is missing (ci/setup.sh installs etcd-server)"
            );
            eprintln!("skipped: etcd not installed");
            return None;
        }
        // The ports were free when picked, but another process may take one before etcd
        // binds it (tests run side by side): etcd then exits at once, and is started again on
        // new ports. Its log goes beside the data directory, shown if it never comes up.
        let log = data.with_extension("log");
        let (mut client, mut peer) = (client, peer);
        for _ in 0..3 {
            let (c, p) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
            let (listen, url, mut tls_args, access) = match tls {
                None => (c.clone(), c, vec![], EtcdAccess::default()),
                Some(d) => {
                    let f = |n: &str| d.join(n).display().to_string();
                    let args = vec![
                        "--cert-file".to_string(),
                        f("server.pem"),
                        "--key-file".into(),
                        f("server.key"),
                        "--trusted-ca-file".into(),
                        f("ca.pem"),
                        "--client-cert-auth".into(),
                    ];
                    let read = |n: &str| std::fs::read(d.join(n)).unwrap();
                    let access = EtcdAccess {
                        ca: Some(read("ca.pem")),
                        identity: Some((read("client.pem"), read("client.key"))),
                        user: None,
                    };
                    (
                        format!("https://127.0.0.1:{client}"),
                        format!("https://localhost:{client}"),
                        args,
                        access,
                    )
                }
            };
            let child = Command::new("etcd")
                .args(["--name", "knitter-test", "--data-dir"])
                .arg(data)
                .args(["--listen-client-urls", &listen, "--advertise-client-urls", &url])
                .args(std::mem::take(&mut tls_args))
                .args(["--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
                .args(["--initial-cluster", &format!("knitter-test={p}"), "--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).map_or(Stdio::null(), Stdio::from))
                .spawn()
                .expect("start etcd");
            let mut s = EtcdServer { child, client_url: url, access };
            let deadline = Instant::now() + Duration::from_secs(40);
            loop {
                if Etcd::connect_with(std::slice::from_ref(&s.client_url), "/probe", &s.access)
                    .and_then(|e| e.revision())
                    .is_ok()
                {
                    return Some(s);
                }
                if let Ok(Some(status)) = s.child.try_wait() {
                    eprintln!(
                        "etcd exited ({status}) on ports {client}/{peer}: {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd did not come up: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            (client, peer) = (free_port(), free_port());
        }
        panic!("etcd exited three times: {}", std::fs::read_to_string(&log).unwrap_or_default())
    }

    /// A store client under `prefix`.
    pub fn store_at(&self, prefix: &str) -> Etcd {
        Etcd::connect(std::slice::from_ref(&self.client_url), prefix).unwrap()
    }

    pub fn store(&self) -> Etcd {
        Etcd::connect(std::slice::from_ref(&self.client_url), "/knitter-test").unwrap()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A knitter-manager process (the workspace's build), killed with SIGKILL on drop.
pub struct ManagerProc {
    child: Child,
    pub rest: String,
    pub grpc: String,
}

impl ManagerProc {
    /// Starts a manager with `args` (store options) and the token in `dir/token`.
    pub fn start(dir: &Path, args: &[&str]) -> ManagerProc {
        Self::start_on(
            dir,
            args,
            &format!("127.0.0.1:{}", free_port()),
            &format!("127.0.0.1:{}", free_port()),
        )
    }

    /// A manager running its own cluster's controller as the tests do: the cluster at
    /// `kubeconfig`, identity `m1`, a 3 s Lease `knitter/leader`, loopback reads without a
    /// token (as Prometheus on the manager's host scrapes), and `extra` flags.
    pub fn start_kubernetes(dir: &Path, kubeconfig: &str, extra: &[&str]) -> ManagerProc {
        let mut args = vec![
            "--kubernetes",
            "--kubeconfig",
            kubeconfig,
            "--identity",
            "m1",
            "--lease-secs",
            "3",
            "--lease",
            "knitter/leader",
            "--loopback-reads",
        ];
        args.extend(extra);
        Self::start(dir, &args)
    }

    /// The same, on given REST and gRPC addresses (a restart where clients expect it).
    pub fn start_on(dir: &Path, args: &[&str], rest: &str, grpc: &str) -> ManagerProc {
        let bin = env!("CARGO_BIN_EXE_knitter-manager");
        let (rest, grpc) = (rest.to_string(), grpc.to_string());
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("token"), TOKEN).unwrap();
        let child = Command::new(bin)
            .arg("--data-dir")
            .arg(dir)
            .args(["--listen", &rest, "--grpc-listen", &grpc])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start knitter-manager");
        let m = ManagerProc { child, rest, grpc };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&m.grpc).is_err() {
            assert!(Instant::now() < deadline, "knitter-manager did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// SIGTERM, and waits (up to `within`) for the process to end; whether it did.
    pub fn terminate(&mut self, within: Duration) -> bool {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGKILL, now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub const TOKEN: &str = "replica-test-token";

/// A CA, a server certificate for `localhost` and a client certificate, made with openssl
/// (`ci/test-certs.sh`), and a second CA that signed neither.
/// knitterctl, built beside knitter-manager by a workspace build (its own crate,
/// control/knitterctl; `cargo test --workspace` builds it for its own tests).
pub fn knitterctl() -> std::path::PathBuf {
    let ctl = Path::new(env!("CARGO_BIN_EXE_knitter-manager")).with_file_name("knitterctl");
    assert!(ctl.exists(), "{} is not built (cargo build -p knitterctl)", ctl.display());
    ctl
}

pub fn certificates(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ci/test-certs.sh");
    let o = Command::new("bash").arg(script).arg(dir).output().expect("bash");
    assert!(
        o.status.success(),
        "ci/test-certs.sh (needs openssl: ci/setup.sh installs it): {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
