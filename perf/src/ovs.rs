//! Open vSwitch with DPDK as a switch under test (Debian's `openvswitch-switch-dpdk`):
//! its own ovsdb-server and ovs-vswitchd-dpdk, started in a directory of their own and a
//! network namespace of their own (the netdev datapath's bridge port is a tap), a
//! `datapath_type=netdev` bridge with the NORMAL action (MAC learning) and two
//! `dpdkvhostuser` ports (in VXLAN scenarios: `br-int` with the pod port and a `vxlan` port,
//! `br-phy` with the underlay port and the VTEP address) (OVS listens, as Knitter and the yardstick do), its PMD thread on
//! the switch CPU and DPDK's main lcore on the generator's. On veths (the kernel scenario)
//! it runs in the switch's namespace with two `afxdp` ports (its AF_XDP netdev, XDP mode
//! `best-effort`: native on veth). Its PMD cycles come from `dpif-netdev/pmd-stats-show`.
//! Stopped (and its own namespace removed) on drop.

use crate::scenario::{self, Scenario};
use crate::sut::{Own, Sockets, SwitchUnderTest};
use crate::testpmd::{Layout, Memory};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VSWITCHD: &str = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk";
const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// Is Open vSwitch with DPDK installed?
pub fn available() -> bool {
    Path::new(VSWITCHD).exists() && Path::new(SCHEMA).exists()
}

/// OVS's own namespace in vhost-user scenarios.
pub fn netns_name() -> String {
    format!("kp-ovs-{}", std::process::id())
}

/// A port of [`Ovs::start_bridge`]'s bridge ([`Ovs::add_port`]).
pub enum OvsPort {
    /// A DPDK ethdev (`type=dpdk`) on `devargs`.
    Dpdk { name: String, devargs: String },
    /// A vhost-user client (`type=dpdkvhostuserclient`) of the VNF listening on `socket`.
    VhostUserClient { name: String, socket: std::path::PathBuf },
}

pub struct Ovs {
    dir: PathBuf,
    netns: String,
    /// The namespace is OVS's own (removed on drop), not the scenario's.
    own_netns: bool,
    db: Option<Child>,
    vswitchd: Option<Child>,
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let o = cmd.output().map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    anyhow::ensure!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr).trim().replace('\n', " | ")
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Settings a diagnosis or a fair comparison adds to OVS's `Open_vSwitch` row
/// (`KNITTER_PERF_OVS_CONFIG="smc-enable=true emc-insert-inv-prob=10"`: each becomes
/// `other_config:KEY=VALUE`), read once by a run: its config keeps them (the `mrr` and `ndr`
/// reports name them) and every OVS it starts is given them ([`Start::settings`]).
pub fn tuning() -> Vec<String> {
    std::env::var("KNITTER_PERF_OVS_CONFIG")
        .unwrap_or_default()
        .split_whitespace()
        .map(|kv| format!("other_config:{kv}"))
        .collect()
}

/// What every OVS a run starts is given: where its files go, its memory, its CPUs and the
/// run's extra settings ([`tuning`]).
#[derive(Clone, Copy)]
pub struct Start<'a> {
    pub work: &'a Path,
    pub mem: Memory,
    pub layout: Layout,
    /// `other_config:KEY=VALUE` settings for its `Open_vSwitch` row.
    pub settings: &'a [String],
}

impl Ovs {
    /// OVS with two vhost-user ports (or the VXLAN bridges) in a namespace of its own; with
    /// `macs` hosts a side, a MAC table that holds them all.
    pub fn start(at: Start, scenario: Scenario, macs: u32) -> anyhow::Result<(Ovs, Sockets)> {
        let netns = netns_name();
        let _ = run(Command::new("ip").args(["netns", "del", &netns]));
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        let ovs = Ovs::launch(at, netns, true)?;
        let s = if scenario.is_vxlan() {
            ovs.vxlan_bridges()?
        } else {
            ovs.l2_bridge(scenario.is_vlan())?
        };
        if macs > 1 {
            // OVS's NORMAL bridge learns 8,192 MACs by default (`mac-table-size`).
            let size = format!("other_config:mac-table-size={}", 2 * macs + 64);
            ovs.vsctl(&["set", "bridge", "br0", &size])?;
        }
        ovs.wait_path(&s.a)?;
        ovs.wait_path(&s.b)?;
        Ok((ovs, s))
    }

    /// OVS in namespace `netns` bridging kernel interfaces `a` and `b` with its AF_XDP
    /// netdev (`type=afxdp`, one queue each).
    pub fn start_afxdp(at: Start, netns: &str, a: &str, b: &str) -> anyhow::Result<Ovs> {
        let ovs = Ovs::launch(at, netns.to_string(), false)?;
        ovs.vsctl(&["add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev"])?;
        for p in [a, b] {
            ovs.vsctl(&[
                "add-port",
                "br0",
                p,
                "--",
                "set",
                "Interface",
                p,
                "type=afxdp",
                "options:n_rxq=1",
            ])?;
        }
        ovs.wait_ports(&[a, b], "afxdp")?;
        Ok(ovs)
    }

    /// OVS in a namespace of its own with one empty bridge (`br0`, NORMAL).
    pub fn start_bridge(at: Start) -> anyhow::Result<Ovs> {
        let netns = netns_name();
        let _ = run(Command::new("ip").args(["netns", "del", &netns]));
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        let ovs = Ovs::launch(at, netns, true)?;
        ovs.vsctl(&["add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev"])?;
        Ok(ovs)
    }

    /// Adds `port` to `br0` and waits until the datapath has it: a DPDK ethdev (`rxq`
    /// receive queues) or a vhost-user client (the VNF's queue count sets its queues).
    pub fn add_port(&self, port: &OvsPort, rxq: u32) -> anyhow::Result<()> {
        let (name, options) = match port {
            OvsPort::Dpdk { name, devargs } => (
                name,
                vec![
                    "type=dpdk".to_string(),
                    format!("options:dpdk-devargs={devargs}"),
                    format!("options:n_rxq={rxq}"),
                ],
            ),
            OvsPort::VhostUserClient { name, socket } => (
                name,
                vec![
                    "type=dpdkvhostuserclient".to_string(),
                    format!("options:vhost-server-path={}", socket.display()),
                ],
            ),
        };
        let mut args = vec!["add-port", "br0", name, "--", "set", "Interface", name];
        args.extend(options.iter().map(String::as_str));
        self.vsctl(&args)?;
        self.wait_ports(&[name], "dpdk")
    }

    /// Waits until the datapath has each of `ports` as a `kind` port (OVS adds them
    /// asynchronously).
    fn wait_ports(&self, ports: &[&str], kind: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let show = self.appctl(&["dpif/show"]).unwrap_or_default();
            if ports.iter().all(|p| {
                show.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{p} ")) && l.contains(kind))
            }) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "Open vSwitch never added its {kind} ports: {show} (ovs-vswitchd's log {})",
                crate::testpmd::log_tail(&self.dir.join("vswitchd.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// ovsdb-server and ovs-vswitchd-dpdk in `netns`, DPDK initialised, no bridges yet.
    fn launch(at: Start, netns: String, own_netns: bool) -> anyhow::Result<Ovs> {
        let Start { work, mem, layout, settings } = at;
        anyhow::ensure!(
            available(),
            "Open vSwitch with DPDK is not installed (apt-get install openvswitch-switch-dpdk)"
        );
        let dir = work.join("ovs");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut ovs = Ovs { dir: dir.clone(), netns, own_netns, db: None, vswitchd: None };
        let db = dir.join("conf.db");
        run(Command::new("ovsdb-tool").arg("create").arg(&db).arg(SCHEMA))?;
        ovs.db = Some(
            ovs.in_netns("ovsdb-server")
                .arg(&db)
                .arg(format!("--remote=punix:{}", dir.join("db.sock").display()))
                .arg(format!("--unixctl={}", dir.join("ovsdb.ctl").display()))
                .arg(format!("--log-file={}", dir.join("ovsdb.log").display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        ovs.wait_path(&dir.join("db.sock"))?;
        mem.await_room();
        let extra = match mem {
            Memory::Hugepages => {
                "--no-pci --in-memory --single-file-segments -m 1024 --file-prefix=kp-ovs"
            }
            Memory::Plain => {
                "--no-pci --no-huge -m 1024 --single-file-segments --file-prefix=kp-ovs"
            }
        };
        // More EAL arguments for a diagnosis (`--log-level=pmd.net.memif:debug`).
        let extra = match std::env::var("KNITTER_OVS_DPDK_EXTRA") {
            Ok(more) => format!("{extra} {more}"),
            Err(_) => extra.to_string(),
        };
        ovs.vsctl(&["--no-wait", "init"])?;
        ovs.vsctl(&[
            "--no-wait",
            "set",
            "Open_vSwitch",
            ".",
            "other_config:dpdk-init=true",
            &format!("other_config:dpdk-lcore-mask={:#x}", 1u64 << layout.generator_cpu),
            &format!("other_config:pmd-cpu-mask={:#x}", 1u64 << layout.switch_cpu),
            &format!("other_config:dpdk-extra={extra}"),
        ])?;
        if !settings.is_empty() {
            let mut args = vec!["--no-wait", "set", "Open_vSwitch", "."];
            args.extend(settings.iter().map(String::as_str));
            ovs.vsctl(&args)?;
        }
        ovs.vswitchd = Some(
            ovs.in_netns(VSWITCHD)
                .arg(format!("unix:{}", dir.join("db.sock").display()))
                .arg(format!("--unixctl={}", dir.join("vswitchd.ctl").display()))
                .arg(format!("--log-file={}", dir.join("vswitchd.log").display()))
                .env("OVS_RUNDIR", &dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        ovs.wait_path(&dir.join("vswitchd.ctl"))?;
        Ok(ovs)
    }

    /// One bridge, NORMAL, the two pod ports; with `vlan`, `a` an access port of the
    /// scenario's VLAN and `b` a trunk carrying it.
    fn l2_bridge(&self, vlan: bool) -> anyhow::Result<Sockets> {
        self.vsctl(&["add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev"])?;
        for p in ["a", "b"] {
            self.vhost_port("br0", p)?;
        }
        if vlan {
            self.vsctl(&["set", "port", "a", &format!("tag={}", scenario::VLAN)])?;
            self.vsctl(&["set", "port", "b", &format!("trunks={}", scenario::VLAN)])?;
        }
        Ok(Sockets { a: self.dir.join("a"), b: self.dir.join("b") })
    }

    /// OVS's userspace VXLAN as its documentation sets it up: `br-int` with the pod port and
    /// a `vxlan` port (key = the VNI, the peer as remote), `br-phy` with the underlay port
    /// and the VTEP address on its internal port; the route to the peer and the peer's MAC
    /// (`tnl/arp/set`, as the generator answers no ARP) given to OVS's tunnel tables.
    fn vxlan_bridges(&self) -> anyhow::Result<Sockets> {
        let (local, peer) = (scenario::LOCAL, scenario::PEER);
        let hwaddr = format!("other-config:hwaddr={}", local.mac_text());
        self.vsctl(&[
            "add-br",
            "br-phy",
            "--",
            "set",
            "bridge",
            "br-phy",
            "datapath_type=netdev",
            &hwaddr,
        ])?;
        self.vhost_port("br-phy", "ul")?;
        self.vsctl(&["add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev"])?;
        self.vhost_port("br-int", "a")?;
        let remote = format!("options:remote_ip={}", peer.ip_addr());
        let key = format!("options:key={}", scenario::VNI);
        self.vsctl(&[
            "add-port",
            "br-int",
            "vx",
            "--",
            "set",
            "Interface",
            "vx",
            "type=vxlan",
            &remote,
            &key,
        ])?;
        run(self.in_netns("ip").args([
            "addr",
            "add",
            &format!("{}/24", local.ip_addr()),
            "dev",
            "br-phy",
        ]))?;
        run(self.in_netns("ip").args(["link", "set", "br-phy", "up"]))?;
        // The kernel route of br-phy's subnet reaches OVS over netlink; adding it again is
        // refused then, which is fine.
        let _ = self.appctl(&["ovs/route/add", &format!("{}/24", peer.ip_addr()), "br-phy"]);
        self.appctl(&["tnl/arp/set", "br-phy", &peer.ip_addr().to_string(), &peer.mac_text()])?;
        Ok(Sockets { a: self.dir.join("a"), b: self.dir.join("ul") })
    }

    /// Whether OVS sees interface `name`'s link up.
    pub fn link_up(&self, name: &str) -> bool {
        self.vsctl(&["get", "Interface", name, "link_state"]).is_ok_and(|s| s.trim() == "up")
    }

    fn vhost_port(&self, bridge: &str, name: &str) -> anyhow::Result<String> {
        self.vsctl(&[
            "add-port",
            bridge,
            name,
            "--",
            "set",
            "Interface",
            name,
            "type=dpdkvhostuser",
        ])
    }

    fn appctl(&self, args: &[&str]) -> anyhow::Result<String> {
        run(Command::new("ovs-appctl")
            .arg(format!("--target={}", self.dir.join("vswitchd.ctl").display()))
            .args(args))
        .with_context(|| self.step("ovs-appctl", args))
    }

    /// An Open vSwitch step that failed, named with how ovs-vswitchd's log ends.
    fn step(&self, program: &str, args: &[&str]) -> String {
        format!(
            "Open vSwitch: `{program} {}` failed (ovs-vswitchd's log {})",
            args.join(" "),
            crate::testpmd::log_tail(&self.dir.join("vswitchd.log"))
        )
    }

    fn in_netns(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        crate::testpmd::die_with_parent(&mut c).args(["netns", "exec", &self.netns, program]);
        c
    }

    fn vsctl(&self, args: &[&str]) -> anyhow::Result<String> {
        run(Command::new("ovs-vsctl")
            .arg(format!("--db=unix:{}", self.dir.join("db.sock").display()))
            .arg("--timeout=30")
            .args(args))
        .with_context(|| self.step("ovs-vsctl", args))
    }

    fn wait_path(&self, p: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !p.exists() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "Open vSwitch never made {} (ovs-vswitchd's log {})",
                p.display(),
                crate::testpmd::log_tail(&self.dir.join("vswitchd.log"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl SwitchUnderTest for Ovs {
    /// Its PMD threads' counters since start (`dpif-netdev/pmd-stats-show`).
    fn own(&self) -> Option<Own> {
        let out = self.appctl(&["dpif-netdev/pmd-stats-show"]).ok()?;
        Some(parse_pmd_stats(&out))
    }
}

/// Sums the PMD threads' `packets received`, `idle cycles` and `processing cycles`.
fn parse_pmd_stats(out: &str) -> Own {
    let mut own = Own::default();
    for line in out.lines().map(str::trim) {
        let num = |l: &str| {
            l.split(':')
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if line.starts_with("packets received:") {
            own.packets += num(line);
        } else if line.starts_with("idle cycles:") {
            own.idle_cycles += num(line);
        } else if line.starts_with("processing cycles:") {
            own.busy_cycles += num(line);
        }
    }
    own
}

impl Drop for Ovs {
    fn drop(&mut self) {
        let _ = self.appctl(&["exit", "--cleanup"]);
        for mut child in [self.vswitchd.take(), self.db.take()].into_iter().flatten() {
            crate::testpmd::stop_child(&mut child, Some(libc::SIGTERM));
        }
        crate::testpmd::remove_runtime_dir("kp-ovs");
        if self.own_netns {
            let _ = run(Command::new("ip").args(["netns", "del", &self.netns]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmd_stats_are_summed() {
        let out = "pmd thread numa_id 0 core_id 1:\n  packets received: 1000\n  packet recirculations: 0\n  idle cycles: 500 (33.33%)\n  processing cycles: 1000 (66.67%)\n  avg cycles per packet: 1.50 (1500/1000)\n\
                   main thread:\n  packets received: 3\n  idle cycles: 0\n";
        assert_eq!(
            parse_pmd_stats(out),
            Own { busy_cycles: 1000, idle_cycles: 500, packets: 1003, drops: 0, flooded: None }
        );
    }
}
