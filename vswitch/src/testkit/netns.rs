//! Network namespaces and veth pairs for tests that touch the kernel's network stack. Every
//! name is unique (process id and a counter), every object is removed on drop, even when the
//! test fails, and addresses are only ever configured inside these namespaces.

use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);
/// The namespaces this process made and has not removed yet.
static LIVE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Removes every namespace this process made that is still there: for a program
/// interrupted by a signal, whose destructors will not run.
pub fn remove_all() {
    let names = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    for name in names {
        let _ = run(&["ip", "netns", "del", &name]);
    }
}

/// Whether this process may create namespaces (root with `ip` available); tests that need
/// them say so and return early otherwise.
pub fn available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success())
}

static EXCLUSIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// For kernel-port tests: the right to run (one such test at a time in this process, as they
/// start PMD threads), or `None` after saying why when namespaces cannot be made here, so the
/// test returns early instead of failing on a developer's machine without root. Under CI
/// (`CI` set) a skip would be a test that cannot fail, so there it panics instead.
pub fn exclusive() -> Option<std::sync::MutexGuard<'static, ()>> {
    let guard = EXCLUSIVE.lock().unwrap_or_else(|e| e.into_inner());
    if !available() {
        let why = "needs root and iproute2 to create network namespaces";
        assert!(
            std::env::var_os("CI").is_none(),
            "{why}: CI must provide both (ci/setup.sh installs iproute2)"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    Some(guard)
}

/// A short unique name (interface names are limited to 15 bytes).
pub fn unique(tag: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("k{}{}{}", tag, std::process::id() % 100_000, n)
}

/// Runs a command; an error carries its stderr.
pub fn run(cmd: &[&str]) -> io::Result<String> {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{} failed: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> io::Result<Netns> {
        let name = unique(tag);
        run(&["ip", "netns", "add", &name])?;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(name.clone());
        let ns = Netns { name };
        ns.run(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A namespace whose kernel keeps quiet: IPv6 off (no MLD reports, router solicitations
    /// or DAD) before any interface arrives, so tests that count or compare frames see only
    /// their own.
    pub fn quiet(tag: &str) -> io::Result<Netns> {
        let ns = Netns::new(tag)?;
        ns.run(&[
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ])?;
        Ok(ns)
    }

    /// Runs a command inside the namespace.
    pub fn run(&self, cmd: &[&str]) -> io::Result<String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(cmd);
        run(&full)
    }

    /// Runs `f` on the calling thread inside the namespace (sockets it opens stay there),
    /// then returns the thread to its original namespace.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> io::Result<R> {
        let here = std::fs::File::open("/proc/thread-self/ns/net")?;
        let there = std::fs::File::open(format!("/var/run/netns/{}", self.name))?;
        // SAFETY: setns on descriptors we just opened; affects only the calling thread.
        if unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let r = f();
        // SAFETY: as above, back to where the thread was.
        if unsafe { libc::setns(here.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|n| *n != self.name);
        let _ = run(&["ip", "netns", "del", &self.name]);
    }
}

/// A veth pair with one end in each namespace, both up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> io::Result<()> {
    let tmp_a = unique("va");
    let tmp_b = unique("vb");
    run(&["ip", "link", "add", &tmp_a, "type", "veth", "peer", "name", &tmp_b])?;
    let setup = || -> io::Result<()> {
        run(&["ip", "link", "set", &tmp_a, "netns", &a.name])?;
        run(&["ip", "link", "set", &tmp_b, "netns", &b.name])?;
        a.run(&["ip", "link", "set", "dev", &tmp_a, "name", a_if])?;
        b.run(&["ip", "link", "set", "dev", &tmp_b, "name", b_if])?;
        a.run(&["ip", "link", "set", "dev", a_if, "up"])?;
        b.run(&["ip", "link", "set", "dev", b_if, "up"])?;
        Ok(())
    };
    setup().inspect_err(|_| {
        let _ = run(&["ip", "link", "del", &tmp_a]);
    })
}

/// A switch running in its own namespace on kernel ports opened there, with one adaptive PMD
/// thread; stopped on drop.
pub struct SwitchNode {
    pub switch: std::sync::Arc<crate::switch::Switch>,
    pub pool: std::sync::Arc<crate::buf::Pool>,
    pmd: Option<crate::pmd::PmdSet>,
    pub ns: Netns,
}

impl SwitchNode {
    /// Opens `ports` inside `ns` with `open(name, pool)`, applies `cfg`, starts the PMD.
    pub fn start(
        ns: Netns,
        ports: &[&str],
        open: impl Fn(
            &str,
            &std::sync::Arc<crate::buf::Pool>,
        ) -> io::Result<std::sync::Arc<dyn crate::port::Port>>,
        cfg: crate::config::SwitchConfig,
    ) -> io::Result<SwitchNode> {
        let pool = crate::buf::Pool::new(8192, false).map_err(io::Error::other)?;
        let switch =
            crate::switch::Switch::new(pool.clone(), crate::switch::SwitchOptions::default());
        for p in ports {
            let port = ns.enter(|| open(p, &pool))??;
            switch.register_port(p, port).map_err(io::Error::other)?;
        }
        switch.apply(cfg).map_err(io::Error::other)?;
        let pmd = crate::pmd::PmdSet::start(
            switch.clone(),
            &crate::pmd::PmdConfig {
                threads: 1,
                cores: vec![],
                idle: crate::pmd::IdlePolicy::default(),
            },
        )?;
        Ok(SwitchNode { switch, pool, pmd: Some(pmd), ns })
    }
}

impl Drop for SwitchNode {
    fn drop(&mut self) {
        if let Some(p) = self.pmd.take() {
            p.stop();
        }
    }
}

/// `ping` from a namespace (3 echoes, bounded).
pub fn ping(ns: &Netns, to: &str) -> io::Result<String> {
    ns.run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", to])
}

/// Sends `kib` KiB over TCP from `client` to a server on `ip`:`port` in `server` (Python's
/// socket module on both ends, bounded to 30 s); returns the bytes the server received.
pub fn tcp_transfer(
    server: &Netns,
    client: &Netns,
    ip: &str,
    port: u16,
    kib: usize,
) -> io::Result<usize> {
    tcp_transfer_via(server, ip, client, ip, port, kib)
}

/// [`tcp_transfer`] to a server on `ip` reached at `via` (a Service's address that a NAT
/// rule on the way translates to `ip`).
pub fn tcp_transfer_via(
    server: &Netns,
    ip: &str,
    client: &Netns,
    via: &str,
    port: u16,
    kib: usize,
) -> io::Result<usize> {
    let srv = format!(
        r#"
import socket
s = socket.socket(socket.AF_INET6 if ":" in "{ip}" else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{ip}", {port}))
s.listen(1)
s.settimeout(20)
c, _ = s.accept()
c.settimeout(20)
n = 0
while True:
    d = c.recv(65536)
    if not d:
        break
    n += len(d)
print(n)
"#
    );
    let cli = format!(
        r#"
import socket, time
for i in range(50):
    try:
        c = socket.create_connection(("{via}", {port}), timeout=5)
        break
    except OSError:
        time.sleep(0.1)
c.sendall(bytes(range(256)) * {n})
c.close()
"#,
        n = kib * 4
    );
    run_pair(server, &srv, client, &cli)
}

/// Sends `count` 1000-byte UDP datagrams from `client` to `ip`:`port` in `server`; returns
/// how many the server's stack accepted (a bad checksum is dropped by the receiver).
pub fn udp_burst(
    server: &Netns,
    client: &Netns,
    ip: &str,
    port: u16,
    count: usize,
) -> io::Result<usize> {
    let srv = format!(
        r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{ip}", {port}))
s.settimeout(5)
n = 0
try:
    while n < {count}:
        s.recvfrom(2048)
        n += 1
except socket.timeout:
    pass
print(n)
"#
    );
    let cli = format!(
        r#"
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
time.sleep(0.5)
for i in range({count}):
    s.sendto(b"x" * 1000, ("{ip}", {port}))
    time.sleep(0.01)
"#
    );
    run_pair(server, &srv, client, &cli)
}

/// Runs a Python server script in the background and a client script, both bounded; returns
/// the number the server printed.
fn run_pair(server: &Netns, srv: &str, client: &Netns, cli: &str) -> io::Result<usize> {
    let (name, srv) = (server.name.clone(), srv.to_owned());
    let handle = std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &name, "timeout", "30", "python3", "-c", &srv])
            .output()
    });
    let sent = client.run(&["timeout", "30", "python3", "-c", cli]);
    let out = handle.join().map_err(|_| io::Error::other("server thread panicked"))??;
    sent?;
    String::from_utf8_lossy(&out.stdout).trim().parse().map_err(|_| {
        io::Error::other(format!("server printed {:?}", String::from_utf8_lossy(&out.stderr)))
    })
}

/// Linux's own VXLAN endpoint in `node`: a `vxlan` device for `vni` from `local` to
/// `remote` (port 4789) over `dev`, bridged with `pod_dev` (the node's end of a pod veth).
pub fn linux_vtep(
    node: &Netns,
    dev: &str,
    local: &str,
    remote: &str,
    vni: u32,
    pod_dev: &str,
) -> io::Result<()> {
    let vni = vni.to_string();
    node.run(&[
        "ip", "link", "add", "vxlan0", "type", "vxlan", "id", &vni, "local", local, "remote",
        remote, "dstport", "4789", "dev", dev,
    ])?;
    node.run(&["ip", "link", "add", "br0", "type", "bridge"])?;
    for d in ["vxlan0", pod_dev] {
        node.run(&["ip", "link", "set", "dev", d, "master", "br0"])?;
    }
    node.run(&["ip", "link", "set", "dev", "vxlan0", "up"])?;
    node.run(&["ip", "link", "set", "dev", "br0", "up"]).map(drop)
}

/// Two nodes for VXLAN against Linux's own device: the switch's namespace `sw` with pod
/// A's veth end `pa0` and the underlay `ul0`; node B holding `remote/plen` on `ul1` (the
/// other end of `ul0`) and pod B behind a Linux `vxlan` device (VNI 5001, toward `vtep`)
/// bridged with pod B's veth. Pods are 192.0.2.1 (A) and 192.0.2.2 (B).
pub struct LinuxVxlanPeer {
    pub sw: Netns,
    pub pod_a: Netns,
    pub node_b: Netns,
    pub pod_b: Netns,
}

pub fn linux_vxlan_peer(remote: &str, plen: &str, vtep: &str) -> io::Result<LinuxVxlanPeer> {
    let sw = Netns::new("sw")?;
    let (pod_a, node_b, pod_b) = (Netns::new("pa")?, Netns::new("nb")?, Netns::new("pb")?);
    veth(&pod_a, "eth0", &sw, "pa0")?;
    veth(&node_b, "ul1", &sw, "ul0")?;
    veth(&pod_b, "eth0", &node_b, "vb0")?;
    pod_a.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"])?;
    pod_b.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"])?;
    node_b.run(&["ip", "addr", "add", &format!("{remote}/{plen}"), "dev", "ul1", "nodad"])?;
    linux_vtep(&node_b, "ul1", remote, vtep, 5001, "vb0")?;
    Ok(LinuxVxlanPeer { sw, pod_a, node_b, pod_b })
}

/// The MAC of `dev` in `ns`.
pub fn mac_of(ns: &Netns, dev: &str) -> io::Result<crate::wire::MacAddr> {
    ns.run(&["cat", &format!("/sys/class/net/{dev}/address")])?
        .trim()
        .parse()
        .map_err(|_| io::Error::other(format!("no MAC for {dev}")))
}

/// Two pods (192.0.2.1 and .2 on `eth0`) on access ports `swa` and `swb` of one bridge
/// domain of a switch whose ports `open` makes.
pub fn two_pods(
    open: impl Fn(
        &str,
        &std::sync::Arc<crate::buf::Pool>,
    ) -> io::Result<std::sync::Arc<dyn crate::port::Port>>,
) -> io::Result<(SwitchNode, Netns, Netns)> {
    use crate::config::{BridgeConfig, PortConfig, SwitchConfig};
    let sw = Netns::new("sw")?;
    let (pa, pb) = (Netns::new("pa")?, Netns::new("pb")?);
    veth(&pa, "eth0", &sw, "swa")?;
    veth(&pb, "eth0", &sw, "swb")?;
    pa.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"])?;
    pb.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"])?;
    let node = SwitchNode::start(
        sw,
        &["swa", "swb"],
        open,
        SwitchConfig {
            bridges: vec![BridgeConfig::new("red")],
            ports: vec![PortConfig::access("swa", "red"), PortConfig::access("swb", "red")],
            vtep: None,
        },
    )?;
    Ok((node, pa, pb))
}
