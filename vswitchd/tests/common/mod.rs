//! The daemon as the tests start it (the binary with flags, its API on a unix socket), and
//! the requests they make most: shared by the daemon's test binaries.
#![allow(dead_code)] // each test binary uses its own part

use knitter_api::node as pb;
use pb::node_client::NodeClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::Channel;

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon with `args` and waits until its API answers.
    pub async fn start(dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_in(dir, None, args).await
    }

    /// [`Daemon::start`] inside network namespace `netns` (the node's own, for what the
    /// daemon makes there: host ports, their NAT rules).
    pub async fn start_in(dir: &Path, netns: Option<&str>, args: &[&str]) -> Daemon {
        let socket = dir.join("api.sock");
        let log =
            dir.join(format!("daemon-{}.log", Instant::now().elapsed().as_nanos() ^ rand_tag()));
        let metrics = if args.contains(&"--metrics-listen") { None } else { Some("--no-metrics") };
        let buffers = if args.contains(&"--buffers") || args.contains(&"--pods") {
            None
        } else {
            Some(["--buffers", "4096"])
        };
        let bin = env!("CARGO_BIN_EXE_knitter-vswitchd");
        let mut cmd = match netns {
            // `ip netns exec` execs the daemon in place: the child's pid is the daemon's.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .args(["--socket", socket.to_str().unwrap(), "--no-hugepages"])
            .args(buffers.into_iter().flatten())
            .args(metrics)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon { child, socket, log };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if d.client().show(pb::ShowRequest {}).await.is_ok() {
                return d;
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!(
                    "daemon exited ({status}): {}",
                    std::fs::read_to_string(&d.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "daemon not ready: {}",
                std::fs::read_to_string(&d.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn client(&self) -> NodeClient<Channel> {
        knitter_api::node_client(&self.socket)
    }

    /// Sends `signal` and waits (bounded) for the process to end.
    pub async fn stop_with(mut self, signal: i32) -> std::process::ExitStatus {
        // SAFETY: signals our own child process.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "daemon did not stop on signal {signal}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn rand_tag() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

pub fn bridge(name: &str) -> pb::Bridge {
    pb::Bridge { name: name.into(), ..Default::default() }
}

pub fn vhost_port(dir: &Path, name: &str, bridge: &str) -> pb::Port {
    pb::Port {
        name: name.into(),
        device: Some(pb::Device {
            kind: Some(pb::device::Kind::VhostUser(pb::VhostUser {
                socket: dir.join(format!("{name}.sock")).display().to_string(),
                client: false,
                ..Default::default()
            })),
        }),
        mode: Some(pb::port::Mode::Access(pb::Access { bridge: bridge.into() })),
        ..Default::default()
    }
}

pub async fn add_bridge(c: &mut NodeClient<Channel>, b: pb::Bridge) -> Result<u64, tonic::Status> {
    c.add_bridge(pb::AddBridgeRequest { bridge: Some(b), replace: false })
        .await
        .map(|r| r.into_inner().generation)
}

pub async fn add_port(c: &mut NodeClient<Channel>, p: pb::Port) -> Result<u64, tonic::Status> {
    c.add_port(pb::AddPortRequest { port: Some(p) }).await.map(|r| r.into_inner().generation)
}

pub fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, says: &str) {
    let e = r.expect_err("the request should be refused");
    assert_eq!(e.code(), code, "{}", e.message());
    assert!(e.message().contains(says), "{:?} does not say {says:?}", e.message());
}
