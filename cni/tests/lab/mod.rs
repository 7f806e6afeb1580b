//! The test lab: a "node" network namespace running knitter-manager and knitter-vswitchd
//! (the workspace's builds), pods as namespaces, and knitter-cni run as runtimes run it.
//! Shared by tests/cni.rs and benches/attach.rs.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vswitch::testkit::netns::Netns;

pub fn bin(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_knitter-cni")).with_file_name(name);
    assert!(p.exists(), "{} is not built (cargo build --workspace)", p.display());
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A process killed on drop.
pub struct Proc(Child);

impl From<Child> for Proc {
    fn from(c: Child) -> Proc {
        Proc(c)
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node namespace running a manager and a switch.
pub struct Lab {
    pub dir: tempfile::TempDir,
    pub node: Netns,
    pub grpc: String,
    pub manager: Option<Proc>,
    pub switch: Option<Proc>,
    /// The manager's TLS options (empty: plain), and its clients' (knitterctl and
    /// knitter-vswitchd spell them alike).
    manager_tls: Vec<String>,
    client_tls: Vec<String>,
}

impl Lab {
    pub fn start() -> Lab {
        Lab::start_with(false, None)
    }

    /// A lab whose switch reads the config file `setup` returns (TOML); `setup` runs before
    /// the switch starts, with the node namespace and the lab's directory (to make what the
    /// config names).
    pub fn start_configured(setup: impl FnOnce(&Netns, &Path) -> String) -> Lab {
        Lab::start_with(false, Some(Box::new(setup)))
    }

    /// A lab whose manager serves TLS and requires client certificates: the switch and
    /// knitterctl reach it with `--manager-ca` and a client certificate.
    pub fn start_tls() -> Lab {
        Lab::start_with(true, None)
    }

    #[allow(clippy::type_complexity)]
    fn start_with(tls: bool, config: Option<Box<dyn FnOnce(&Netns, &Path) -> String + '_>>) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let node = Netns::new("cn").unwrap();
        node.run(&["ip", "link", "set", "lo", "up"]).unwrap();
        let grpc = format!("127.0.0.1:{}", free_port());
        let (mut manager_tls, mut client_tls) = (vec![], vec![]);
        if tls {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/test-certs.sh");
            let o = Command::new("bash").arg(script).arg(dir.path()).output().unwrap();
            assert!(o.status.success(), "ci/test-certs.sh: {}", String::from_utf8_lossy(&o.stderr));
            let f = |n: &str| dir.path().join(n).display().to_string();
            manager_tls = vec![
                "--tls-cert".into(),
                f("server.pem"),
                "--tls-key".into(),
                f("server.key"),
                "--tls-client-ca".into(),
                f("ca.pem"),
            ];
            client_tls = vec![
                "--manager-ca".into(),
                f("ca.pem"),
                "--manager-server-name".into(),
                "localhost".into(),
                "--manager-cert".into(),
                f("client.pem"),
                "--manager-key".into(),
                f("client.key"),
            ];
        }
        let mut lab = Lab { dir, node, grpc, manager: None, switch: None, manager_tls, client_tls };
        lab.start_manager();
        let socket = lab.socket();
        let mut config_args = Vec::new();
        if let Some(setup) = config {
            let text = setup(&lab.node, lab.dir.path());
            let path = lab.dir.path().join("node.toml");
            std::fs::write(&path, text).unwrap();
            config_args = vec!["--config".to_string(), path.display().to_string()];
        }
        let child = Command::new("ip")
            .args(["netns", "exec", &lab.node.name])
            .arg(bin("knitter-vswitchd"))
            .args(&config_args)
            .arg("--socket")
            .arg(&socket)
            .args([
                "--no-state",
                "--no-metrics",
                "--no-hugepages",
                "--buffers",
                "4096",
                "--idle",
                "adaptive",
            ])
            // As nodes are deployed: no admin token, a join with the bootstrap token.
            .args(["--manager", &lab.grpc, "--node-name", "n1", "--manager-bootstrap-token-file"])
            .arg(lab.dir.path().join("m/bootstrap"))
            .arg("--manager-credential-file")
            .arg(lab.dir.path().join("node-token"))
            .args(&lab.client_tls)
            .env("RUST_LOG", std::env::var("KNITTER_LAB_LOG").unwrap_or_else(|_| "warn".into()))
            .stderr(std::env::var_os("KNITTER_LAB_LOG").map_or(Stdio::null(), |_| Stdio::inherit()))
            .spawn()
            .unwrap();
        lab.switch = Some(Proc(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "knitter-vswitchd did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        lab
    }

    pub fn start_manager(&mut self) {
        let data = self.dir.path().join("m");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("token"), "cni-test-token").unwrap();
        std::fs::write(data.join("bootstrap"), "cni-test-bootstrap").unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.node.name])
            .arg(bin("knitter-manager"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", &format!("127.0.0.1:{}", free_port()), "--grpc-listen", &self.grpc])
            .arg("--bootstrap-token-file")
            .arg(data.join("bootstrap"))
            .args(&self.manager_tls)
            .stderr(std::fs::File::create(data.join("stderr.log")).unwrap())
            .spawn()
            .unwrap();
        self.manager = Some(Proc(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let o = self.mctl(&["tenant", "list"]);
            if o.status.success() {
                break;
            }
            if Instant::now() >= deadline {
                // What a failed start leaves, to tell a slow start from one that ended.
                let exited = self.manager.as_mut().and_then(|m| m.0.try_wait().ok().flatten());
                let log = std::fs::read_to_string(data.join("stderr.log")).unwrap_or_default();
                panic!(
                    "knitter-manager did not come up in 20 s (process: {exited:?}; knitterctl: {}); its log:\n{log}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("vswitchd.sock")
    }

    /// `knitterctl manager ...` inside the node namespace.
    pub fn mctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.node.name])
            .arg(bin("knitterctl"))
            .args(["--manager", &self.grpc, "--token-file"])
            .arg(self.dir.path().join("m/token"))
            .args(&self.client_tls)
            .arg("manager")
            .args(args)
            .output()
            .unwrap()
    }

    pub fn ctl(&self, args: &[&str]) -> String {
        let o = Command::new(bin("knitterctl"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn conf(&self, version: &str, network: &str) -> Value {
        json!({ "cniVersion": version, "name": "knitter", "type": "knitter-cni", "network": network, "socket": self.socket() })
    }

    /// Runs knitter-cni; (success, what it printed).
    pub fn cni(
        &self,
        cmd: &str,
        container: &str,
        netns: &str,
        ifname: &str,
        conf: &Value,
    ) -> (bool, Value) {
        cni_raw(cmd, container, netns, ifname, &conf.to_string())
    }
}

pub fn cni_raw(
    cmd: &str,
    container: &str,
    netns: &str,
    ifname: &str,
    stdin: &str,
) -> (bool, Value) {
    cni_args(
        cmd,
        container,
        netns,
        ifname,
        stdin,
        &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME={container}"),
    )
}

/// [`cni_raw`] with `CNI_ARGS` given.
pub fn cni_args(
    cmd: &str,
    container: &str,
    netns: &str,
    ifname: &str,
    stdin: &str,
    args: &str,
) -> (bool, Value) {
    let mut c = Command::new(bin("knitter-cni"))
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", "/opt/cni/bin")
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    (o.status.success(), serde_json::from_str(out.trim()).unwrap_or(Value::Null))
}

/// A pod: its own namespace, and its path for CNI_NETNS.
pub fn pod(tag: &str) -> (Netns, String) {
    let ns = Netns::new(tag).unwrap();
    ns.run(&["ip", "link", "set", "lo", "up"]).unwrap();
    let path = format!("/run/netns/{}", ns.name);
    (ns, path)
}

pub fn addr(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string()
}
