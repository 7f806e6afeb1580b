//! dpdk-testpmd as a VNF pod's app in tests: listening on one vhost-user socket
//! (`net_virtio_user`, `server=1`) that a switch connects to (client mode), or on any vdevs
//! (`net_memif` servers for a switch's memif clients), in plain pages so it runs on any
//! machine, driven through its interactive prompt. Killed, and its runtime files removed,
//! on drop.

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub struct ListeningVnf {
    child: Child,
    stdin: ChildStdin,
    prefix: String,
}

impl ListeningVnf {
    /// testpmd listening on `socket`; `None` (the test returns) when it is not installed
    /// outside CI. A command that does not start fails the test (a skip would hide it).
    pub fn start(socket: &Path) -> Option<ListeningVnf> {
        ListeningVnf::start_with(Command::new("dpdk-testpmd"), socket, None)
    }

    /// The same through `cmd`, which runs testpmd with the arguments appended (a wrapper
    /// that enters a mount namespace, say); with `mac`, the port's MAC.
    pub fn start_with(cmd: Command, socket: &Path, mac: Option<&str>) -> Option<ListeningVnf> {
        let mac = mac.map(|m| format!(",mac={m}")).unwrap_or_default();
        let vdev = format!("net_virtio_user0,path={},server=1,queues=1{mac}", socket.display());
        ListeningVnf::start_vdevs(cmd, &[vdev], &["--nb-cores=1", "--total-num-mbufs=2048"])
    }

    /// testpmd through `cmd` with `vdevs` (each a `--vdev` value) and `app`, its arguments
    /// after `--` beside `-i`.
    pub fn start_vdevs(mut cmd: Command, vdevs: &[String], app: &[&str]) -> Option<ListeningVnf> {
        if !super::peer_available(
            super::runs("dpdk-testpmd"),
            "dpdk-testpmd",
            "ci/setup.sh (dpdk-dev)",
        ) {
            return None;
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let prefix = format!("kvnf{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let mut child = cmd
            .args(["-l", "0,1", "--no-pci", "--no-huge", "-m", "512", "--single-file-segments"])
            .arg(format!("--file-prefix={prefix}"))
            .args(vdevs.iter().map(|v| format!("--vdev={v}")))
            .args(["--", "-i"])
            .args(app)
            .stdin(Stdio::piped())
            .stdout(log_to())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting dpdk-testpmd (or its wrapper)");
        let stdin = child.stdin.take().expect("testpmd's stdin");
        Some(ListeningVnf { child, stdin, prefix })
    }

    /// A line at testpmd's prompt (`set fwd icmpecho`, `start`…).
    pub fn say(&mut self, line: &str) {
        let _ = writeln!(self.stdin, "{line}");
    }

    /// testpmd's virtio-user notices a lost backend, and takes a new one, when it checks
    /// the link: make it check.
    pub fn poke(&mut self) {
        self.say("show port info all");
    }
}

/// Where testpmd's output goes: the file `KNITTER_VNF_LOG` names (appended), for a
/// diagnosis (`show port stats all` at its prompt), or nowhere.
fn log_to() -> Stdio {
    std::env::var_os("KNITTER_VNF_LOG")
        .and_then(|path| std::fs::OpenOptions::new().create(true).append(true).open(path).ok())
        .map_or_else(Stdio::null, Stdio::from)
}

impl Drop for ListeningVnf {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.prefix));
    }
}
