//! Benchmark scenarios over ring ports on one thread: a generator fills the ingress ring with
//! prepared 64-byte frames, [`Bench::poll`] runs one burst through the switch (rx burst,
//! pipeline, tx burst), and the sinks free what came out. Criterion times `poll` alone;
//! `examples/pipeline_insn.rs` counts its instructions under callgrind.

use super::{frames, mac, random_mac};
use crate::batch::Batch;
use crate::buf::{Pool, PoolCache};
use crate::config::{BridgeConfig, PortConfig, StaticMac, SwitchConfig, VtepConfig};
use crate::pipeline::Pipeline;
use crate::policer::PolicerConfig;
use crate::port::ring::{RingPeer, RingPort};
use crate::snapshot::Snapshot;
use crate::switch::{Switch, SwitchOptions};
use crate::wire::MacAddr;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// What a benchmark forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Known unicast between two access ports with learning on, over `macs` MACs in the FDB.
    L2 { macs: u32 },
    /// The same both ways: `macs / 2` flows from one port and `macs / 2` answering them from
    /// the other, bursts taken from each port in turn (`macs` MACs, `macs` flows). `random`:
    /// MACs drawn at random (as a VNF's or a generator's are), not counted up; either way
    /// the flows come in turn, as a generator replays them.
    L2Both { macs: u32, random: bool },
    /// Access → trunk (tag pushed).
    VlanPush,
    /// Trunk → access (tag popped).
    VlanPop,
    /// Access → remote VTEP (IPv4 underlay).
    VxlanEncap,
    /// Remote VTEP → access.
    VxlanDecap,
    /// Remote VTEP → access from `macs` remote hosts with MACs drawn at random, each a flow
    /// to one local host, met in turn: decapsulated flows at scale.
    VxlanDecapRandom { macs: u32 },
    /// Broadcast from one port to 8 others.
    Flood8,
    /// A pod port as the CNI makes it (port security on: its one MAC and IPv4 address)
    /// sending to `hosts` destinations behind another port, whose MACs are the manager's
    /// (`0a:58:` + an IPv4 address in 10.1.0.0/16): fan-out, as a pod talking to many does.
    /// `policed`: the pod's port also has an ingress policer (a rate it never reaches, so
    /// every frame is admitted: what policing costs a frame); `net_policed`: its network has
    /// a policer for all its pods together (the same rates; what the shared bucket costs).
    PodL2 { hosts: u32, policed: bool, net_policed: bool },
    /// A pod port (port security on) → a remote VTEP (IPv4 underlay), 256 flows.
    PodEncap,
    /// The same on a network whose plane is marked (DSCP 40, priority 5, the inner ECN
    /// field copied): what underlay marking costs a frame.
    PodEncapMarked,
    /// A remote VTEP → a pod port (port security on), 256 flows from 256 remote hosts.
    PodDecap,
    /// Trunk to trunk over `bds` bridge domains (VLANs 1..=bds, one bridge domain each),
    /// 4 096 flows spread over all of them (consecutive frames in different ones): what a
    /// node carrying many networks on one trunk does, and what the per-domain counters cost.
    Trunk { bds: u16 },
    /// Many to many: `hosts` hosts with the manager's MACs behind one access port talking to
    /// `hosts` others behind another, 4 096 flows (each source to four destinations, each
    /// destination from four sources), as pods of two nodes' networks meet on a trunk.
    Mesh { hosts: u32 },
    /// A mesh the cache cannot hold (issue 48): `hosts` sources behind one access port each
    /// talking to all of `hosts / 2` destinations behind another, every pair in turn —
    /// `hosts² / 2` distinct keys (500 000 for 1 000), 1.5 × `hosts` MACs.
    FullMesh { hosts: u32 },
    /// The same mesh from pod ports, as the CNI makes them (port security): `pods` pods, each
    /// behind its own port, each talking to all of `hosts` destinations behind another port,
    /// a burst from each pod in turn — `pods × hosts` keys (512,000 for 512 × 1,000).
    PodMesh { pods: u32, hosts: u32 },
}

impl Scenario {
    pub const ALL: [Scenario; 17] = [
        Scenario::Trunk { bds: 1 },
        Scenario::Trunk { bds: 4094 },
        Scenario::L2 { macs: 1000 },
        Scenario::L2 { macs: 100_000 },
        Scenario::L2Both { macs: 100_000, random: false },
        Scenario::VlanPush,
        Scenario::VlanPop,
        Scenario::VxlanEncap,
        Scenario::VxlanDecap,
        Scenario::Flood8,
        Scenario::PodL2 { hosts: 1000, policed: false, net_policed: false },
        Scenario::PodL2 { hosts: 1000, policed: true, net_policed: false },
        Scenario::PodL2 { hosts: 1000, policed: false, net_policed: true },
        Scenario::PodEncap,
        Scenario::PodEncapMarked,
        Scenario::PodDecap,
        Scenario::Mesh { hosts: 1000 },
    ];

    pub fn name(&self) -> String {
        match self {
            Scenario::L2 { macs } => format!("l2-{}k", macs / 1000),
            Scenario::L2Both { macs, random: false } => format!("l2-{}k-both", macs / 1000),
            Scenario::L2Both { macs, random: true } => format!("l2-{}k-both-random", macs / 1000),
            Scenario::VlanPush => "vlan-push".into(),
            Scenario::VlanPop => "vlan-pop".into(),
            Scenario::VxlanEncap => "vxlan-encap".into(),
            Scenario::VxlanDecap => "vxlan-decap".into(),
            Scenario::VxlanDecapRandom { macs } => format!("vxlan-decap-{}k-random", macs / 1000),
            Scenario::Flood8 => "flood-8".into(),
            Scenario::PodL2 { hosts, policed, net_policed } => {
                format!(
                    "l2-pod-{}k{}{}",
                    hosts / 1000,
                    if *policed { "-policed" } else { "" },
                    if *net_policed { "-net-policed" } else { "" }
                )
            }
            Scenario::PodEncap => "vxlan-encap-pod".into(),
            Scenario::PodEncapMarked => "vxlan-encap-pod-marked".into(),
            Scenario::PodDecap => "vxlan-decap-pod".into(),
            Scenario::Mesh { hosts } => format!("l2-mesh-{}k", hosts / 1000),
            Scenario::FullMesh { hosts } if hosts % 1000 == 0 => {
                format!("l2-fullmesh-{}k", hosts / 1000)
            }
            Scenario::FullMesh { hosts } => format!("l2-fullmesh-{hosts}"),
            Scenario::PodMesh { pods, hosts } => format!("l2-pod-mesh-{pods}x{}k", hosts / 1000),
            Scenario::Trunk { bds } => format!("trunk-{bds}bd"),
        }
    }

    /// Workloads too large for the CI test of every scenario, measured by hand
    /// (`ci/insn-count.sh 320000 l2-1000k`): a million MACs in one bridge domain, meshes of
    /// 31,250 to 500,000 flows (where the exact-match cache outgrows the core: `emc.rs`
    /// `OUTGROWN_FILLS`), 512 pods each to 1,000 destinations, 100,000 random MACs both ways,
    /// 100,000 random MACs behind a remote VTEP.
    pub const SCALE: [Scenario; 9] = [
        Scenario::L2 { macs: 1_000_000 },
        Scenario::FullMesh { hosts: 250 },
        Scenario::FullMesh { hosts: 350 },
        Scenario::FullMesh { hosts: 400 },
        Scenario::FullMesh { hosts: 500 },
        Scenario::FullMesh { hosts: 1000 },
        Scenario::PodMesh { pods: 512, hosts: 1000 },
        Scenario::L2Both { macs: 100_000, random: true },
        Scenario::VxlanDecapRandom { macs: 100_000 },
    ];

    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.iter().chain(&Scenario::SCALE).copied().find(|x| x.name() == s)
    }
}

/// A prepared scenario.
pub struct Bench {
    pub pool: Arc<Pool>,
    pub switch: Arc<Switch>,
    pipe: Pipeline,
    snap: Arc<Snapshot>,
    in_port: u16,
    input: RingPeer,
    sinks: Vec<RingPeer>,
    frames: Vec<Vec<u8>>,
    next: usize,
    /// More inputs, taking bursts in turn after the first: each one's port, its index in
    /// `sinks`, its frames and the next of them.
    others: Vec<(u16, usize, Vec<Vec<u8>>, usize)>,
    /// Whose the next burst is: 0 the first input's, `k` the `k`th of `others`.
    turn: usize,
    cache: PoolCache,
    batch: Batch,
}

const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);

fn ip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0xc000_0200 | (n & 0xff))
}

/// The manager's MAC for host `n` of 10.1.0.0/16: `0a:58:` and the address.
fn manager_mac(n: u32) -> MacAddr {
    let a = 0x0a01_0000u32 | (n & 0xffff);
    let b = a.to_be_bytes();
    MacAddr([0x0a, 0x58, b[0], b[1], b[2], b[3]])
}

/// The pod of the pod scenarios: its MAC and address.
const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 255, 1);

fn pod_port(name: &str, bridge: &str) -> PortConfig {
    PortConfig::pod(name, bridge, manager_mac(0xff01), &[IpAddr::V4(POD_IP)])
}

/// Bridge "red" (VLAN 100) with `ports`, learning up to a million MACs on each.
fn many_macs(mut ports: Vec<PortConfig>) -> SwitchConfig {
    let mut bridge = BridgeConfig::new("red").vlan(100);
    bridge.mac_limit = 1 << 20;
    for p in &mut ports {
        p.mac_limit = 1 << 20;
    }
    SwitchConfig { bridges: vec![bridge], ports, vtep: None }
}

impl Bench {
    pub fn new(s: Scenario) -> Bench {
        Bench::with_options(s, SwitchOptions::default())
    }

    /// A scenario on a switch with these options (e.g. without the exact-match cache, to
    /// measure the slow path).
    pub fn with_options(s: Scenario, mut opts: SwitchOptions) -> Bench {
        // The MAC table sized for the workload, as an operator sizes `[tables] fdb_entries`.
        if let Scenario::L2 { macs }
        | Scenario::L2Both { macs, .. }
        | Scenario::VxlanDecapRandom { macs } = s
        {
            opts.fdb_entries = opts.fdb_entries.max((2 * macs).next_power_of_two());
        }
        let pool = Pool::new(65536, true).expect("buffer pool");
        let switch = Switch::new(pool.clone(), opts);
        let mut peers = std::collections::BTreeMap::new();
        let mut ring = |name: &str, m: Option<MacAddr>| {
            let (p, peer) = RingPort::new(name, 1, 4096).expect("ring");
            let p = match m {
                Some(m) => p.with_mac(m),
                None => p,
            };
            switch.register_port(name, p).expect("register");
            peers.insert(name.to_owned(), peer);
        };
        let red = || BridgeConfig::new("red").vlan(100);
        // Inputs after the first: their names and frames.
        let mut other_inputs: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
        let (cfg, input, frames_): (SwitchConfig, &str, Vec<Vec<u8>>) = match s {
            Scenario::L2Both { macs, random } => {
                ring("a", None);
                ring("b", None);
                let n = (macs / 2).max(1);
                let mac = |i: u32| if random { random_mac(i) } else { mac(i) };
                let f = (0..n)
                    .map(|i| {
                        frames::udp4(mac(n + i + 1), mac(i + 1), ip(i), ip(i + 1), 1000, 2000, 60)
                    })
                    .collect();
                let back = (0..n)
                    .map(|i| {
                        frames::udp4(mac(i + 1), mac(n + i + 1), ip(i + 1), ip(i), 2000, 1000, 60)
                    })
                    .collect();
                other_inputs.push(("b".into(), back));
                (
                    many_macs(vec![PortConfig::access("a", "red"), PortConfig::access("b", "red")]),
                    "a",
                    f,
                )
            }
            Scenario::L2 { macs } => {
                ring("a", None);
                ring("b", None);
                let n = (macs / 2).max(1);
                let f = (0..n)
                    .map(|i| {
                        frames::udp4(mac(n + i + 1), mac(i + 1), ip(i), ip(i + 1), 1000, 2000, 60)
                    })
                    .collect();
                (
                    many_macs(vec![PortConfig::access("a", "red"), PortConfig::access("b", "red")]),
                    "a",
                    f,
                )
            }
            Scenario::VlanPush | Scenario::VlanPop => {
                ring("a", None);
                ring("t", None);
                let cfg = SwitchConfig {
                    bridges: vec![red()],
                    ports: vec![
                        PortConfig::access("a", "red"),
                        PortConfig::trunk("t", &[100], None),
                    ],
                    vtep: None,
                };
                let push = s == Scenario::VlanPush;
                let f = (0..256u32)
                    .map(|i| {
                        let f = frames::udp4(
                            mac(if push { 2000 } else { 1000 }),
                            mac(i + 1),
                            ip(i),
                            ip(1),
                            1000 + i as u16,
                            2000,
                            60,
                        );
                        if push { f } else { frames::add_tag(&f[..60], 0x8100, 100) }
                    })
                    .collect();
                (cfg, if push { "a" } else { "t" }, f)
            }
            Scenario::PodL2 { hosts, policed, net_policed } => {
                ring("a", None);
                ring("b", None);
                let f = (0..hosts)
                    .map(|i| {
                        let dst = Ipv4Addr::from(0x0a01_0000 | i);
                        frames::udp4(
                            manager_mac(i),
                            manager_mac(0xff01),
                            POD_IP,
                            dst,
                            1000,
                            2000,
                            60,
                        )
                    })
                    .collect();
                let never = PolicerConfig {
                    pps: 1_000_000_000,
                    bps: 1_000_000_000_000,
                    ..Default::default()
                };
                let mut pod = pod_port("a", "red");
                if policed {
                    pod = pod.policed(never);
                }
                let mut cfg = many_macs(vec![pod, PortConfig::access("b", "red")]);
                if net_policed {
                    cfg.bridges[0].policer = Some(never);
                }
                (cfg, "a", f)
            }
            Scenario::Trunk { bds } => {
                ring("t1", None);
                ring("t2", None);
                let vlans: Vec<u16> = (1..=bds).collect();
                let bridges =
                    vlans.iter().map(|v| BridgeConfig::new(&format!("bd{v}")).vlan(*v)).collect();
                let ports = vec![
                    PortConfig::trunk("t1", &vlans, None),
                    PortConfig::trunk("t2", &vlans, None),
                ];
                // Flow k in VLAN k % bds + 1, from host k behind t1 to host 10 000 + k % bds behind t2.
                let f = (0..4096u32)
                    .map(|k| {
                        let vlan = (k % bds as u32) as u16 + 1;
                        let inner = frames::udp4(
                            mac(10_000 + k % bds as u32),
                            mac(k + 1),
                            ip(k),
                            ip(1),
                            1000,
                            2000,
                            60,
                        );
                        frames::add_tag(&inner[..60], 0x8100, vlan)
                    })
                    .collect();
                (SwitchConfig { bridges, ports, vtep: None }, "t1", f)
            }
            Scenario::PodMesh { pods, hosts } => {
                ring("b", None);
                let mut ports = vec![PortConfig::access("b", "red")];
                let mut first = Vec::new();
                for p in 0..pods {
                    let name = format!("pod{p:04}");
                    ring(&name, None);
                    let me = 0x8000 + p;
                    let addr = Ipv4Addr::from(0x0a01_0000 | me);
                    ports.push(PortConfig::pod(&name, "red", manager_mac(me), &[IpAddr::V4(addr)]));
                    // Every destination in turn, each pod starting elsewhere.
                    let f: Vec<Vec<u8>> = (0..hosts)
                        .map(|j| {
                            let d = (j + p * 7) % hosts;
                            let dst = Ipv4Addr::from(0x0a01_0000 | d);
                            frames::udp4(manager_mac(d), manager_mac(me), addr, dst, 1000, 2000, 60)
                        })
                        .collect();
                    if p == 0 {
                        first = f;
                    } else {
                        other_inputs.push((name, f));
                    }
                }
                (many_macs(ports), "pod0000", first)
            }
            Scenario::Mesh { hosts } => {
                ring("a", None);
                ring("b", None);
                // Sources manager_mac(0..hosts) behind a, destinations manager_mac(hosts..2 hosts)
                // behind b; flow k from source k % hosts to destination (k × 7 + k / hosts) % hosts.
                let f = (0..4096u32)
                    .map(|k| {
                        let (src, dst) = (k % hosts, hosts + (k * 7 + k / hosts) % hosts);
                        frames::udp4(
                            manager_mac(dst),
                            manager_mac(src),
                            Ipv4Addr::from(0x0a01_0000 | src),
                            Ipv4Addr::from(0x0a01_0000 | dst),
                            1000,
                            2000,
                            60,
                        )
                    })
                    .collect();
                (
                    many_macs(vec![PortConfig::access("a", "red"), PortConfig::access("b", "red")]),
                    "a",
                    f,
                )
            }
            Scenario::FullMesh { hosts } => {
                ring("a", None);
                ring("b", None);
                // Frame k: source k % hosts, destination hosts + (k / hosts + source) % (hosts / 2):
                // consecutive frames from different sources, each source meeting every destination.
                let half = (hosts / 2).max(1);
                let f = (0..hosts * half)
                    .map(|k| {
                        let src = k % hosts;
                        let dst = hosts + (k / hosts + src) % half;
                        frames::udp4(
                            manager_mac(dst),
                            manager_mac(src),
                            Ipv4Addr::from(0x0a01_0000 | src),
                            Ipv4Addr::from(0x0a01_0000 | dst),
                            1000,
                            2000,
                            60,
                        )
                    })
                    .collect();
                (
                    many_macs(vec![PortConfig::access("a", "red"), PortConfig::access("b", "red")]),
                    "a",
                    f,
                )
            }
            Scenario::PodDecap => {
                ring("a", None);
                ring("up", Some(mac(0xa0)));
                let peer = IpAddr::V4(PEER);
                let mut b = red().vni(5001).flood(&[peer]);
                b.static_macs.push(StaticMac {
                    mac: manager_mac(0xff01),
                    port: Some("a".into()),
                    remote: None,
                });
                let cfg = SwitchConfig {
                    bridges: vec![b],
                    ports: vec![pod_port("a", "red"), PortConfig::underlay("up")],
                    vtep: Some(VtepConfig::new(IpAddr::V4(LOCAL), "up").peer(peer, mac(0xb0))),
                };
                let f = (0..256u32)
                    .map(|i| {
                        let inner = frames::udp4(
                            manager_mac(0xff01),
                            manager_mac(i),
                            Ipv4Addr::from(0x0a01_0000 | i),
                            POD_IP,
                            1000 + i as u16,
                            2000,
                            60,
                        );
                        let o = frames::Outer {
                            dst_mac: mac(0xa0),
                            src_mac: mac(0xb0),
                            src: peer,
                            dst: IpAddr::V4(LOCAL),
                            sport: 49152 + i as u16,
                            dport: 4789,
                            vlan: None,
                        };
                        frames::vxlan(&o, 5001, &inner, false)
                    })
                    .collect();
                (cfg, "up", f)
            }
            Scenario::PodEncap | Scenario::PodEncapMarked => {
                ring("a", None);
                ring("up", Some(mac(0xa0)));
                let peer = IpAddr::V4(PEER);
                let mut b = red().vni(5001).flood(&[peer]);
                if s == Scenario::PodEncapMarked {
                    (b.dscp, b.pcp) = (Some(40), Some(5));
                }
                b.static_macs.push(StaticMac { mac: mac(2000), port: None, remote: Some(peer) });
                let cfg = SwitchConfig {
                    bridges: vec![b],
                    ports: vec![pod_port("a", "red"), PortConfig::underlay("up")],
                    vtep: Some(VtepConfig::new(IpAddr::V4(LOCAL), "up").peer(peer, mac(0xb0))),
                };
                let f = (0..256u32)
                    .map(|i| {
                        frames::udp4(
                            mac(2000),
                            manager_mac(0xff01),
                            POD_IP,
                            ip(1),
                            1000 + i as u16,
                            2000,
                            60,
                        )
                    })
                    .collect();
                (cfg, "a", f)
            }
            Scenario::VxlanEncap | Scenario::VxlanDecap | Scenario::VxlanDecapRandom { .. } => {
                ring("a", None);
                ring("up", Some(mac(0xa0)));
                let peer = IpAddr::V4(PEER);
                let mut b = red().vni(5001).flood(&[peer]);
                b.static_macs.push(StaticMac { mac: mac(2000), port: None, remote: Some(peer) });
                b.static_macs.push(StaticMac {
                    mac: mac(1000),
                    port: Some("a".into()),
                    remote: None,
                });
                b.mac_learning = true;
                if let Scenario::VxlanDecapRandom { .. } = s {
                    b.mac_limit = 1 << 20;
                }
                let cfg = SwitchConfig {
                    bridges: vec![b],
                    ports: vec![PortConfig::access("a", "red"), PortConfig::underlay("up")],
                    vtep: Some(VtepConfig::new(IpAddr::V4(LOCAL), "up").peer(peer, mac(0xb0))),
                };
                let from_peer = |i: u32, inner: &[u8]| {
                    let o = frames::Outer {
                        dst_mac: mac(0xa0),
                        src_mac: mac(0xb0),
                        src: peer,
                        dst: IpAddr::V4(LOCAL),
                        sport: 49152 + (i % 16384) as u16,
                        dport: 4789,
                        vlan: None,
                    };
                    frames::vxlan(&o, 5001, inner, false)
                };
                let f = match s {
                    Scenario::VxlanEncap => (0..256u32)
                        .map(|i| {
                            frames::udp4(
                                mac(2000),
                                mac(i + 1),
                                ip(i),
                                ip(1),
                                1000 + i as u16,
                                2000,
                                60,
                            )
                        })
                        .collect(),
                    Scenario::VxlanDecapRandom { macs } => (0..macs)
                        .map(|i| {
                            let inner =
                                frames::udp4(mac(1000), random_mac(i), ip(i), ip(1), 1, 2, 60);
                            from_peer(i, &inner)
                        })
                        .collect(),
                    _ => (0..256u32)
                        .map(|i| {
                            let inner = frames::udp4(
                                mac(1000),
                                mac(3000 + i),
                                ip(i),
                                ip(1),
                                1000 + i as u16,
                                2000,
                                60,
                            );
                            from_peer(i, &inner)
                        })
                        .collect(),
                };
                (cfg, if s == Scenario::VxlanEncap { "a" } else { "up" }, f)
            }
            Scenario::Flood8 => {
                let mut ports = Vec::new();
                for i in 0..9 {
                    let n = format!("p{i}");
                    ring(&n, None);
                    ports.push(PortConfig::access(&n, "red"));
                }
                let f = (0..256u32)
                    .map(|i| {
                        frames::udp4(MacAddr::BROADCAST, mac(i + 1), ip(i), ip(255), 68, 67, 60)
                    })
                    .collect();
                (SwitchConfig { bridges: vec![red()], ports, vtep: None }, "p0", f)
            }
        };
        switch.apply(cfg).expect("benchmark configuration");
        let snap = switch.snapshot();
        let in_port = snap.port_id(input).expect("input port");
        let input_peer = peers.remove(input).expect("input peer");
        let others = other_inputs
            .into_iter()
            .map(|(name, frames)| {
                let idx = peers.keys().position(|k| *k == name).expect("an input's ring");
                (snap.port_id(&name).expect("an input's port"), idx, frames, 0)
            })
            .collect();
        let mut b = Bench {
            pipe: switch.pipeline(0),
            cache: PoolCache::new(pool.clone()),
            pool,
            switch,
            snap,
            in_port,
            input: input_peer,
            sinks: peers.into_values().collect(),
            frames: frames_,
            next: 0,
            others,
            turn: 0,
            batch: Batch::new(),
        };
        b.pipe.set_now(1);
        b.learn(s);
        b
    }

    /// Teaches the switch where destinations live, as a warm-up would.
    fn learn(&mut self, s: Scenario) {
        let back: Vec<Vec<u8>> = match s {
            Scenario::L2 { macs } => {
                let n = (macs / 2).max(1);
                (0..n)
                    .map(|i| frames::udp4(mac(1), mac(n + i + 1), ip(i), ip(1), 1, 2, 60))
                    .collect()
            }
            Scenario::PodMesh { hosts, .. } => (0..hosts)
                .map(|i| {
                    frames::udp4(
                        manager_mac(0x8000),
                        manager_mac(i),
                        Ipv4Addr::from(0x0a01_0000 | i),
                        Ipv4Addr::from(0x0a01_0000 | 0x8000),
                        1,
                        2,
                        60,
                    )
                })
                .collect(),
            Scenario::PodL2 { hosts, .. } => (0..hosts)
                .map(|i| {
                    frames::udp4(
                        manager_mac(0xff01),
                        manager_mac(i),
                        Ipv4Addr::from(0x0a01_0000 | i),
                        POD_IP,
                        1,
                        2,
                        60,
                    )
                })
                .collect(),
            Scenario::Trunk { bds } => (0..bds as u32)
                .map(|i| {
                    frames::add_tag(
                        &frames::udp4(mac(1), mac(10_000 + i), ip(9), ip(1), 1, 2, 60)[..60],
                        0x8100,
                        i as u16 + 1,
                    )
                })
                .collect(),
            Scenario::FullMesh { hosts } => (hosts..hosts + (hosts / 2).max(1))
                .map(|d| {
                    frames::udp4(
                        manager_mac(0),
                        manager_mac(d),
                        Ipv4Addr::from(0x0a01_0000 | d),
                        Ipv4Addr::from(0x0a01_0000),
                        1,
                        2,
                        60,
                    )
                })
                .collect(),
            Scenario::Mesh { hosts } => (hosts..2 * hosts)
                .map(|d| {
                    frames::udp4(
                        manager_mac(0),
                        manager_mac(d),
                        Ipv4Addr::from(0x0a01_0000 | d),
                        Ipv4Addr::from(0x0a01_0000),
                        1,
                        2,
                        60,
                    )
                })
                .collect(),
            Scenario::VlanPush => vec![frames::add_tag(
                &frames::udp4(mac(1), mac(2000), ip(9), ip(1), 1, 2, 60),
                0x8100,
                100,
            )],
            Scenario::VlanPop => vec![frames::udp4(mac(1), mac(1000), ip(9), ip(1), 1, 2, 60)],
            _ => vec![],
        };
        let snap = self.snap.clone();
        for chunk in back.chunks(32) {
            // Learning frames enter on port b, or else the first that is not the input.
            let port = snap
                .port_id("b")
                .filter(|b| *b != self.in_port)
                .or_else(|| {
                    snap.ports.iter().flatten().find(|p| p.id != self.in_port).map(|p| p.id)
                })
                .unwrap_or(0);
            for f in chunk {
                if let Some(b) = self.cache.alloc_frame(f) {
                    let _ = self.batch.push(b);
                }
            }
            let mut batch = std::mem::take(&mut self.batch);
            self.pipe.process(&snap, port, &mut batch);
            self.batch = batch;
            self.drain();
        }
        // One pass over the input frames learns their sources. With several inputs, two
        // passes over each: the first one's frames flood until the second has answered
        // (floods are not cached), so only the second pass leaves the steady state measured.
        let inputs = self.others.len() + 1;
        // A scenario of many flows from one input learns in the first pass and fills the
        // caches in a second, so the measured frames are the steady state too.
        let many = matches!(s, Scenario::VxlanDecapRandom { .. });
        let passes = if inputs > 1 || many { 2 } else { 1 };
        for _ in 0..self.frames.len().div_ceil(32) * inputs * passes {
            self.inject();
            // Not `self.poll()`: the instruction counter measures that function only.
            let port = self.next_port();
            self.pipe.poll(&snap, port, 0, &mut self.batch);
            self.turn = (self.turn + 1) % inputs;
            self.drain();
        }
    }

    /// The port whose burst is next.
    fn next_port(&self) -> u16 {
        match self.turn {
            0 => self.in_port,
            k => self.others[k - 1].0,
        }
    }

    /// Puts one burst of prepared frames on the ingress ring (of the input whose turn it is).
    pub fn inject(&mut self) {
        for _ in 0..32 {
            let (f, peer) = match self.turn {
                0 => {
                    let f = &self.frames[self.next];
                    self.next = (self.next + 1) % self.frames.len();
                    (f, &mut self.input)
                }
                k => {
                    let (_, idx, frames, next) = &mut self.others[k - 1];
                    let f = &frames[*next];
                    *next = (*next + 1) % frames.len();
                    (f, &mut self.sinks[*idx])
                }
            };
            if let Some(b) = self.cache.alloc_frame(f)
                && let Err(b) = peer.send_one(0, b)
            {
                self.cache.free(b);
            }
        }
    }

    /// The port the scenario's frames come in on (the first input).
    pub fn in_port(&self) -> u16 {
        self.in_port
    }

    /// One burst through the switch: rx burst, pipeline, tx bursts (from each input in turn).
    #[inline(never)]
    pub fn poll(&mut self) -> usize {
        let port = self.next_port();
        self.turn = (self.turn + 1) % (self.others.len() + 1);
        self.pipe.poll(&self.snap, port, 0, &mut self.batch)
    }

    /// Frees everything that came out of the switch; returns how many frames.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        let mut b = Batch::new();
        for s in &mut self.sinks {
            while s.recv(0, &mut b) > 0 {
                for x in b.drain() {
                    n += 1;
                    self.cache.free(x);
                }
            }
        }
        // The learning frames' floods may have gone back to the input port; with two inputs
        // it is where the second one's frames go.
        let count = !self.others.is_empty();
        while self.input.recv(0, &mut b) > 0 {
            for x in b.drain() {
                n += count as usize;
                self.cache.free(x);
            }
        }
        n
    }

    pub fn stats(&self) -> crate::counters::Totals {
        self.switch.stats()
    }
}
