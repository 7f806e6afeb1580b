//! The switches under test, each started for one trial with two vhost-user sockets (A and
//! B) in one L2 domain, its forwarding thread on the layout's switch CPU, and stopped when
//! dropped: **Knitter** (`knitter-vswitchd`, one busy PMD thread, two vhost-user ports in
//! one bridge domain with MAC learning; its PMD cycles and drops read over its API) and the
//! **yardstick** (testpmd's own `net_vhost` `io` forwarding). The switch listens on both
//! sockets; the generator connects. In the kernel-interface scenario the switch serves the
//! switch-side ends of two veths instead (`veth.rs`): Knitter with AF_XDP ports or (as
//! `knitter-afpacket`) AF_PACKET ones, the Linux **bridge**, and the yardstick on DPDK's
//! own AF_XDP ports.

use crate::frames::{self, Endpoint};
use crate::scenario::{self, Scenario};
use crate::sut::{Own, Sockets, SwitchUnderTest};
use crate::testpmd::{self, Layout, Memory, Testpmd};
use crate::veth::{NODE_1, NODE_2, SW_A, SW_B, UNDERLAY_MTU, Underlay, Veths};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Knitter,
    Yardstick,
    Ovs,
    /// knitter-vswitchd from another build (`--baseline PATH`): a change measured against
    /// the build before it in the same window.
    Baseline,
    /// Knitter with AF_PACKET ports (kernel-interface scenario only).
    KnitterAfpacket,
    /// The Linux bridge (kernel-interface scenario only): no process, no counters.
    Bridge,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Knitter => "knitter",
            Kind::Yardstick => "yardstick",
            Kind::Ovs => "ovs",
            Kind::Baseline => "baseline",
            Kind::KnitterAfpacket => "knitter-afpacket",
            Kind::Bridge => "bridge",
        }
    }
}

/// A switch running for one trial.
pub enum Running {
    Knitter {
        child: Child,
        api: PathBuf,
    },
    Yardstick(Testpmd),
    Ovs(crate::ovs::Ovs),
    /// The Linux bridge in the switch namespace: it goes with the namespace.
    Bridge,
    /// Two switches in one scenario (two VTEPs).
    Pair(Box<[Running; 2]>),
}

/// Where the binaries are: next to this one (`cargo build --release -p knitter-vswitchd`, a
/// build of its own: built with the perf lab it would get the test kits' features).
pub fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Where and how a switch runs for a trial.
pub struct Setup<'a> {
    pub work: &'a Path,
    pub memory: Memory,
    pub layout: Layout,
    /// The knitter-vswitchd binary [`Kind::Baseline`] runs.
    pub baseline: Option<&'a Path>,
    /// What the baseline's config file starts with.
    pub baseline_toml: Option<&'a str>,
    pub scenario: Scenario,
    /// Knitter's pod ports with port security, as the CNI makes them.
    pub port_security: bool,
    /// A policer on Knitter's first pod port (A), the body of a TOML inline table
    /// (`pps = 1000000`).
    pub police: Option<&'a str>,
    /// Hosts a side (`--macs`): the MACs each port and the bridge learn, L2.
    pub macs: u32,
    /// OVS's extra settings ([`crate::ovs::tuning`]).
    pub ovs_config: &'a [String],
}

impl Setup<'_> {
    /// What an OVS of this run is started with.
    fn ovs(&self) -> crate::ovs::Start<'_> {
        crate::ovs::Start {
            work: self.work,
            mem: self.memory,
            layout: self.layout,
            settings: self.ovs_config,
        }
    }
}

impl Running {
    /// Starts `kind` as `setup` says.
    pub fn start(kind: Kind, setup: &Setup) -> anyhow::Result<(Running, Sockets)> {
        let (work, mem, layout) = (setup.work, setup.memory, setup.layout);
        let s = Sockets { a: work.join("a.sock"), b: work.join("b.sock") };
        for p in [&s.a, &s.b] {
            let _ = std::fs::remove_file(p);
        }
        let (running, s) = match kind {
            Kind::Ovs => {
                let (ovs, s) = crate::ovs::Ovs::start(setup.ovs(), setup.scenario, setup.macs)?;
                (Running::Ovs(ovs), s)
            }
            Kind::Yardstick => {
                (Running::Yardstick(testpmd::yardstick(work, &s.a, &s.b, mem, layout)?), s)
            }
            Kind::Knitter | Kind::Baseline => {
                let running = Running::knitter(
                    kind,
                    setup,
                    &knitter_config(&work.join("knitter.sock"), &s, setup),
                )?;
                wait_for(&[&s.a, &s.b], kind, &running.log(work))?;
                // The daemon falls back to plain pages quietly; a run that reserved
                // hugepages must not measure it there.
                anyhow::ensure!(
                    mem != Memory::Hugepages || running.on_hugepages() != Some(false),
                    "knitter-vswitchd's buffers are not on hugepages although the run reserved them (its log {})",
                    testpmd::log_tail(&running.log(work))
                );
                (running, s)
            }
            Kind::KnitterAfpacket | Kind::Bridge => {
                anyhow::bail!("{} serves kernel interfaces: --scenario veth", kind.name())
            }
        };
        wait_for(&[&s.a, &s.b], kind, &running.log(work))?;
        Ok((running, s))
    }

    /// Where the switch's log is (for the error when it does not come up).
    fn log(&self, work: &Path) -> PathBuf {
        match self {
            Running::Ovs(_) => work.join("ovs/vswitchd.log"),
            Running::Yardstick(_) => work.join("yardstick.out"),
            Running::Pair(_) => work.join("knitter1.log"),
            Running::Knitter { .. } | Running::Bridge => work.join("knitter.log"),
        }
    }

    /// Starts `kind` on the switch ends of `veths` (the kernel-interface scenario).
    pub fn start_veth(kind: Kind, setup: &Setup, veths: &Veths) -> anyhow::Result<Running> {
        let (work, mem, layout) = (setup.work, setup.memory, setup.layout);
        let ns = &veths.switch.name;
        match kind {
            Kind::Bridge => {
                veths.bridge()?;
                Ok(Running::Bridge)
            }
            Kind::Yardstick => Ok(Running::Yardstick(testpmd::yardstick_af_xdp(
                work, ns, SW_A, SW_B, mem, layout,
            )?)),
            Kind::Ovs => {
                Ok(Running::Ovs(crate::ovs::Ovs::start_afxdp(setup.ovs(), ns, SW_A, SW_B)?))
            }
            Kind::Knitter | Kind::Baseline | Kind::KnitterAfpacket => {
                let device = if kind == Kind::KnitterAfpacket { "af_packet" } else { "af_xdp" };
                let port = |name: &str, ifname: &str, pod| {
                    access_port(
                        name,
                        &format!(r#"kind = "{device}", ifname = "{ifname}", netns = "{ns}""#),
                        setup.pod(pod),
                    )
                };
                let api = work.join("knitter.sock");
                let conf = daemon_config(&api, mem, layout)
                    + L2_BRIDGE
                    + &port("a", SW_A, frames::A)
                    + &port("b", SW_B, frames::B);
                let running = Running::knitter(kind, setup, &conf)?;
                // The ports open once the daemon runs: wait until both serve.
                let deadline = Instant::now() + Duration::from_secs(30);
                while running.own().is_none() {
                    anyhow::ensure!(
                        Instant::now() < deadline,
                        "knitter-vswitchd never answered on its API (its log {})",
                        testpmd::log_tail(&work.join("knitter.log"))
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(running)
            }
        }
    }

    /// Two Knitter switches as VTEPs on `underlay`'s nodes, each with one vhost-user pod
    /// port (`a` on the first, `b` on the second); the second switch's PMD on the layout's
    /// `second_switch_cpu` (else sharing the switch CPU).
    pub fn start_two_vteps(
        kind: Kind,
        setup: &Setup,
        underlay: &Underlay,
    ) -> anyhow::Result<(Running, Sockets)> {
        anyhow::ensure!(
            matches!(kind, Kind::Knitter | Kind::Baseline),
            "--scenario vxlan-2vteps runs Knitter switches only, not {}",
            kind.name()
        );
        let (work, mem, layout) = (setup.work, setup.memory, setup.layout);
        let s = Sockets { a: work.join("a.sock"), b: work.join("b.sock") };
        let (local, peer) = (scenario::LOCAL, scenario::PEER);
        let shared = layout.second_switch_cpu.is_none_or(|c| c == layout.switch_cpu);
        let node = |i: usize,
                    sock: &Path,
                    ifname: &str,
                    me: Endpoint,
                    other: Endpoint|
         -> anyhow::Result<Running> {
            let _ = std::fs::remove_file(sock);
            let tag = format!("knitter{}", i + 1);
            let cpu = if i == 0 {
                layout.switch_cpu
            } else {
                layout.second_switch_cpu.unwrap_or(layout.switch_cpu)
            };
            let layout = Layout { switch_cpu: cpu, ..layout };
            let ns = &underlay.nodes[i].name;
            // Two busy loops on one CPU would each hold it for a scheduler slice (ms) while the
            // other's rings overflow: sharing a CPU, they sleep as soon as they find nothing.
            let idle = if shared {
                r#"{ policy = "adaptive", spin_us = 0, max_sleep_us = 1000 }"#
            } else {
                r#"{ policy = "busy" }"#
            };
            let mut conf = daemon_config_idle(&work.join(format!("{tag}.sock")), mem, layout, idle);
            conf += &access_port(
                "a",
                &format!(r#"kind = "vhost_user", socket = "{}""#, sock.display()),
                setup.pod(if i == 0 { frames::A } else { frames::B }),
            );
            // No next hop given: each switch answers ARP for its own VTEP address and asks for the other's.
            conf += &vxlan_node(
                &format!(r#"kind = "af_xdp", ifname = "{ifname}", netns = "{ns}""#),
                me,
                other,
                false,
                Some(UNDERLAY_MTU),
            );
            Running::knitter_as(&tag, kind, setup, &conf)
        };
        let first = node(0, &s.a, NODE_1, local, peer)?;
        let second = node(1, &s.b, NODE_2, peer, local)?;
        let running = Running::Pair(Box::new([first, second]));
        wait_for(&[&s.a, &s.b], kind, &running.log(work))?;
        Ok((running, s))
    }

    /// knitter-vswitchd (or the baseline build) with `config`.
    fn knitter(kind: Kind, setup: &Setup, config: &str) -> anyhow::Result<Running> {
        Running::knitter_as("knitter", kind, setup, config)
    }

    /// The same, its API socket, config and log named after `tag` in the work directory.
    fn knitter_as(tag: &str, kind: Kind, setup: &Setup, config: &str) -> anyhow::Result<Running> {
        let work = setup.work;
        let api = work.join(format!("{tag}.sock"));
        let _ = std::fs::remove_file(&api);
        let conf = work.join(format!("{tag}.toml"));
        match (kind, setup.baseline_toml) {
            (Kind::Baseline, Some(t)) => std::fs::write(&conf, with_settings(config, t)?)?,
            _ => std::fs::write(&conf, config)?,
        }
        let bin = match (kind, setup.baseline) {
            (Kind::Baseline, Some(b)) => b.to_path_buf(),
            (Kind::Baseline, None) => anyhow::bail!(
                "the baseline switch needs --baseline PATH (a knitter-vswitchd binary)"
            ),
            _ => sibling("knitter-vswitchd"),
        };
        let child = testpmd::die_with_parent(&mut Command::new(&bin))
            .arg("--config")
            .arg(&conf)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join(format!("{tag}.log")))?)
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "starting {}: {e} (cargo build --release -p knitter-vswitchd)",
                    bin.display()
                )
            })?;
        Ok(Running::Knitter { child, api })
    }

    /// Whether Knitter's buffer pool is on hugepages (none: not Knitter, or no answer).
    fn on_hugepages(&self) -> Option<bool> {
        let Running::Knitter { api, .. } = self else { return None };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let view = rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    knitter_api::node_client(api).show(knitter_api::node::ShowRequest::default()),
                )
                .await
            })
            .ok()?
            .ok()?
            .into_inner();
        Some(view.hugepages)
    }
}

impl SwitchUnderTest for Running {
    /// Knitter's read over its API; OVS's from `pmd-stats-show`; a pair's summed.
    fn own(&self) -> Option<Own> {
        let api = match self {
            Running::Knitter { api, .. } => api,
            Running::Ovs(ovs) => return ovs.own(),
            Running::Yardstick(_) | Running::Bridge => return None,
            // Both switches: cycles per packet per switch, busy share of both threads.
            Running::Pair(p) => {
                let [a, b] = [p[0].own()?, p[1].own()?];
                return Some(Own {
                    busy_cycles: a.busy_cycles + b.busy_cycles,
                    idle_cycles: a.idle_cycles + b.idle_cycles,
                    packets: a.packets + b.packets,
                    drops: a.drops + b.drops,
                    flooded: a.flooded.zip(b.flooded).map(|(a, b)| a + b),
                });
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let reply = rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    knitter_api::node_client(api).stats(knitter_api::node::StatsRequest::default()),
                )
                .await
            })
            .ok()?
            .ok()?
            .into_inner();
        Some(Own {
            busy_cycles: reply.pmds.iter().map(|p| p.busy_cycles).sum(),
            packets: reply.pmds.iter().map(|p| p.packets).sum(),
            drops: reply.drops.iter().map(|d| d.value).sum(),
            flooded: Some(reply.bridges.iter().map(|b| b.flooded).sum()),
            idle_cycles: reply.pmds.iter().map(|p| p.idle_cycles).sum(),
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Knitter { child, .. } = self {
            testpmd::stop_child(child, Some(libc::SIGTERM));
        }
    }
}

/// Waits (30 s at most) until the switch made its sockets; when it does not, the error
/// ends with how its `log` ends.
fn wait_for(sockets: &[&Path], kind: Kind, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sockets.iter().all(|p| p.exists()) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} never made its sockets (its log {})",
            kind.name(),
            testpmd::log_tail(log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A VTEP `me` with its underlay port on `device` (the inside of its TOML table), bridge
/// `l2` in VNI 100 flooding to VTEP `other`; `other`'s MAC given as the next hop when
/// `static_next_hop` (else the switch resolves it with ARP); the underlay port's `mtu`.
fn vxlan_node(
    device: &str,
    me: Endpoint,
    other: Endpoint,
    static_next_hop: bool,
    mtu: Option<u16>,
) -> String {
    let next_hop = if static_next_hop {
        format!(r#", next_hop_mac = "{}""#, other.mac_text())
    } else {
        String::new()
    };
    let mtu = mtu.map(|m| format!("mtu = {m}\n")).unwrap_or_default();
    format!(
        r#"[[bridges]]
name = "l2"
vni = {vni}
flood = ["{other_ip}"]
[[ports]]
name = "ul"
device = {{ {device} }}
mode = {{ kind = "underlay" }}
{mtu}[vtep]
local_ip = "{ip}"
mac = "{mac}"
underlay_port = "ul"
peers = [{{ ip = "{other_ip}"{next_hop} }}]
"#,
        vni = scenario::VNI,
        other_ip = other.ip_addr(),
        ip = me.ip_addr(),
        mac = me.mac_text(),
    )
}

/// knitter-vswitchd for one trial: no state, no metrics, one busy PMD on the switch CPU.
fn daemon_config(api: &Path, mem: Memory, layout: Layout) -> String {
    daemon_config_idle(api, mem, layout, r#"{ policy = "busy" }"#)
}

/// `config` with `settings` (TOML: dotted keys or tables) merged in, the settings winning
/// key by key (`pmd.idle.policy = "adaptive"` changes the generated `[pmd]` table's idle
/// policy and keeps the rest of it).
fn with_settings(config: &str, settings: &str) -> anyhow::Result<String> {
    fn merge(into: &mut toml::Table, from: toml::Table) {
        for (k, v) in from {
            match (into.get_mut(&k), v) {
                (Some(toml::Value::Table(t)), toml::Value::Table(v)) => merge(t, v),
                (_, v) => {
                    into.insert(k, v);
                }
            }
        }
    }
    let mut merged: toml::Table = toml::from_str(config)?;
    let settings: toml::Table = toml::from_str(settings)
        .map_err(|e| anyhow::anyhow!("--baseline-toml is not TOML: {e}"))?;
    merge(&mut merged, settings);
    Ok(toml::to_string(&merged)?)
}

/// The same with PMD idle policy `idle` (a TOML inline table).
fn daemon_config_idle(api: &Path, mem: Memory, layout: Layout, idle: &str) -> String {
    format!(
        r#"state_file = ""
[api]
socket = "{api}"
[pmd]
threads = 1
cores = [{cpu}]
idle = {idle}
[pool]
buffers = 16384
hugepages = {huge}
[metrics]
listen = ""
"#,
        api = api.display(),
        cpu = layout.switch_cpu,
        huge = mem == Memory::Hugepages,
    )
}

const L2_BRIDGE: &str = "[[bridges]]\nname = \"l2\"\n";

/// Port `name` on `device` (the inside of its TOML table), an access port of bridge `l2`;
/// with `pod`, a pod port as the CNI makes it: port security allowing only the pod's MAC
/// and IP address.
fn access_port(name: &str, device: &str, pod: Option<Endpoint>) -> String {
    let security = pod
        .map(|p| {
            format!("security = {{ macs = [\"{}\"], ips = [\"{}\"] }}\n", p.mac_text(), p.ip_addr())
        })
        .unwrap_or_default();
    format!(
        "[[ports]]\nname = \"{name}\"\ndevice = {{ {device} }}\nmode = {{ kind = \"access\", bridge = \"l2\" }}\n{security}"
    )
}

impl Setup<'_> {
    /// The pod behind a pod port, when pod ports have port security.
    fn pod(&self, e: Endpoint) -> Option<Endpoint> {
        self.port_security.then_some(e)
    }
}

/// The daemon with pod port A on socket `s.a` and, for the scenario, what `s.b` is:
/// another pod port, a trunk, or the VTEP's underlay.
fn knitter_config(api: &Path, s: &Sockets, setup: &Setup) -> String {
    let (mem, layout, scenario) = (setup.memory, setup.layout, setup.scenario);
    let mut c = daemon_config(api, mem, layout)
        + &access_port(
            "a",
            &format!(r#"kind = "vhost_user", socket = "{}""#, s.a.display()),
            setup.pod(frames::A),
        )
        + &mac_limit(setup.macs, 1);
    if let Some(p) = setup.police {
        c += &format!("policer = {{ {p} }}\n");
    }
    let b = s.b.display();
    if scenario.is_vxlan() {
        // The generator plays the remote VTEP and answers no ARP: its MAC is given.
        c += &vxlan_node(
            &format!(r#"kind = "vhost_user", socket = "{b}""#),
            scenario::LOCAL,
            scenario::PEER,
            true,
            None,
        );
    } else if scenario.is_vlan() {
        c += &format!(
            r#"[[bridges]]
name = "l2"
vlan = {vlan}
[[ports]]
name = "b"
device = {{ kind = "vhost_user", socket = "{b}" }}
mode = {{ kind = "trunk", allowed = [{vlan}] }}
"#,
            vlan = scenario::VLAN
        );
    } else {
        c += L2_BRIDGE;
        c += &mac_limit(setup.macs, 2);
        c += &access_port(
            "b",
            &format!(r#"kind = "vhost_user", socket = "{b}""#),
            setup.pod(frames::B),
        );
        c += &mac_limit(setup.macs, 1);
    }
    c
}

/// With many hosts a side (`--macs`), a `mac_limit` line that lets a port (`per` 1) or the
/// bridge (`per` 2: both sides' hosts) learn them all, for the table it follows — as an
/// operator sets them for a VNF with many hosts behind it (by default a port learns 8,192
/// MACs, a bridge domain 65,536). Nothing otherwise.
fn mac_limit(macs: u32, per: u32) -> String {
    if macs <= 1 {
        return String::new();
    }
    format!("mac_limit = {}\n", per * macs + 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_per_packet_of_a_window() {
        let a = Own { busy_cycles: 1000, idle_cycles: 0, packets: 10, drops: 0, flooded: None };
        let b = Own { busy_cycles: 3000, idle_cycles: 2000, packets: 20, drops: 0, flooded: None };
        assert_eq!(Own::busy_fraction(a, b), Some(0.5));
        assert_eq!(Own::cycles_per_packet(a, b), Some(200.0));
        assert_eq!(Own::cycles_per_packet(b, b), None);
        assert_eq!(Own::cycles_per_packet(b, a), None);
    }

    #[test]
    fn baseline_settings_change_the_generated_tables_key_by_key() {
        let config = daemon_config_idle(
            Path::new("/run/x.sock"),
            Memory::Hugepages,
            Layout { generator_cpu: 0, switch_cpu: 1, second_switch_cpu: None },
            r#"{ policy = "busy" }"#,
        ) + L2_BRIDGE;
        let merged =
            with_settings(&config, "pmd.idle.policy = \"adaptive\"\nvhost.single_copy = false")
                .unwrap();
        let t: toml::Table = toml::from_str(&merged).unwrap();
        assert_eq!(t["pmd"]["idle"]["policy"].as_str(), Some("adaptive"));
        assert_eq!(t["pmd"]["threads"].as_integer(), Some(1), "the rest of [pmd] kept");
        assert_eq!(t["vhost"]["single_copy"].as_bool(), Some(false));
        assert_eq!(t["bridges"][0]["name"].as_str(), Some("l2"));
        assert!(with_settings(&config, "pmd.idle = ").is_err());
    }
}
