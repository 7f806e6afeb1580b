//! The data-plane demo: two nodes, each a Knitter switch with its own PMD threads (adaptive
//! idle policy), joined by a VXLAN underlay and by an 802.1Q trunk. Pods are in-memory ring
//! ports this program drives. It proves connectivity across both planes, isolation between
//! them, ARP suppression and zero loss under load, then prints each node's counters.
//!
//!     cargo run --release -p knitter-vswitch --example demo

use anyhow::{Context, Result, bail};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vswitch::config::{BridgeConfig, Neighbor, PortConfig, SwitchConfig, VtepConfig};
use vswitch::port::ring::{RingPeer, RingPort};
use vswitch::testkit::{frames, mac};
use vswitch::wire::MacAddr;
use vswitch::{Batch, IdlePolicy, PmdConfig, PmdSet, Pool, PoolCache, Switch, SwitchOptions};

struct Node {
    name: &'static str,
    switch: Arc<Switch>,
    pods: Vec<(String, RingPeer)>,
    pmd: Option<PmdSet>,
}

fn underlay(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 51, 100, n))
}

fn pod_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

/// Pod `i` of a node: MAC and IP derived from (node, i).
fn pod_addr(node: u8, i: u8) -> (MacAddr, Ipv4Addr) {
    (mac(node as u32 * 16 + i as u32), pod_ip(node * 16 + i))
}

fn build_node(
    pool: &Arc<Pool>,
    name: &'static str,
    n: u8,
    up: Arc<RingPort>,
    trunk: Arc<RingPort>,
) -> Result<Node> {
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    switch.register_port("underlay", up.with_mac(mac(0xa0 + n as u32)))?;
    switch.register_port("trunk", trunk)?;
    let other = 3 - n;
    let mut red = BridgeConfig::new("red").vni(5001).flood(&[underlay(other)]);
    red.arp_suppression = true;
    let (b1_mac, b1_ip) = pod_addr(2, 1);
    red.neighbors.push(Neighbor { ip: b1_ip.into(), mac: b1_mac });
    let mut cfg = SwitchConfig {
        bridges: vec![red, BridgeConfig::new("blue").vlan(200)],
        ports: vec![PortConfig::underlay("underlay"), PortConfig::trunk("trunk", &[200], None)],
        vtep: Some(
            VtepConfig::new(underlay(n), "underlay")
                .peer(underlay(other), mac(0xa0 + other as u32)),
        ),
    };
    let mut pods = Vec::new();
    for (i, bridge) in [(1u8, "red"), (2u8, "blue")] {
        let pname = format!("pod{i}");
        let (port, peer) = RingPort::new(&pname, 1, 1024)?;
        switch.register_port(&pname, port)?;
        let (m, ip) = pod_addr(n, i);
        cfg.ports.push(PortConfig::pod(&pname, bridge, m, &[ip.into()]));
        pods.push((pname, peer));
    }
    switch.apply(cfg).context("node configuration")?;
    let pmd = PmdSet::start(
        switch.clone(),
        &PmdConfig { threads: 1, cores: vec![], idle: IdlePolicy::default() },
    )?;
    Ok(Node { name, switch, pods, pmd: Some(pmd) })
}

/// How long a step waits for frames it expects (it goes on as soon as they are there): long
/// enough for a host that stalls a thread for seconds, as CI hosts do after a build.
const WAIT: Duration = Duration::from_secs(10);

struct Lab {
    cache: PoolCache,
    nodes: Vec<Node>,
}

impl Lab {
    fn send(&mut self, node: usize, pod: usize, frame: &[u8]) -> Result<()> {
        let b = self.cache.alloc_frame(frame).context("buffer pool exhausted")?;
        if let Err(b) = self.nodes[node].pods[pod].1.send_one(0, b) {
            self.cache.free(b);
            bail!("ring full");
        }
        Ok(())
    }

    /// Collects what every pod received within `wait`, as (node, pod, frame).
    fn collect(&mut self, want: usize, wait: Duration) -> Vec<(usize, usize, Vec<u8>)> {
        let end = Instant::now() + wait;
        let mut got = Vec::new();
        let mut b = Batch::new();
        loop {
            for (ni, node) in self.nodes.iter_mut().enumerate() {
                for (pi, (_, peer)) in node.pods.iter_mut().enumerate() {
                    while peer.recv(0, &mut b) > 0 {
                        for x in b.drain() {
                            let mut f = Vec::new();
                            self.cache.pool().read_frame(&x, &mut f);
                            self.cache.free(x);
                            got.push((ni, pi, f));
                        }
                    }
                }
            }
            if got.len() >= want || Instant::now() > end {
                return got;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn step(n: usize, what: &str, r: Result<String>) -> Result<()> {
    match r {
        Ok(detail) => {
            println!("  [{n}] {what:<58} ok   {detail}");
            Ok(())
        }
        Err(e) => {
            println!("  [{n}] {what:<58} FAILED: {e:#}");
            Err(e)
        }
    }
}

fn udp(from: (MacAddr, Ipv4Addr), to: (MacAddr, Ipv4Addr), size: usize) -> Vec<u8> {
    frames::udp4(to.0, from.0, from.1, to.1, 40000, 7, size)
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let pool = Pool::new(32768, true)?;
    println!(
        "Knitter data-plane demo: two nodes, real PMD threads (adaptive idle), in-memory pods"
    );
    println!("  buffer pool: {} x 2 KiB, {}", pool.capacity(), pool.backing());
    let (up_a, up_b) = RingPort::patch("underlay", "underlay", 4096)?;
    let (tr_a, tr_b) = RingPort::patch("trunk", "trunk", 4096)?;
    let nodes = vec![
        build_node(&pool, "node-a", 1, up_a, tr_a)?,
        build_node(&pool, "node-b", 2, up_b, tr_b)?,
    ];
    for n in &nodes {
        let s = n.switch.snapshot();
        println!(
            "  {}: VTEP {}, bridges red (VNI 5001, pod1) and blue (VLAN 200 on the trunk, pod2)",
            n.name,
            s.vtep.as_ref().map(|v| v.local.to_string()).unwrap_or_default()
        );
    }
    // Both PMD threads running their configuration before the first frame: a thread the
    // machine is slow to schedule (a CI host busy after a build) must not eat a step's wait.
    for n in &nodes {
        let adopted = n
            .pmd
            .as_ref()
            .is_some_and(|p| p.wait_adopted(n.switch.generation(), Duration::from_secs(30)));
        if !adopted {
            bail!("{}: the PMD thread did not take its configuration within 30 s", n.name);
        }
    }
    let mut lab = Lab { cache: PoolCache::new(pool.clone()), nodes };
    let (a1, a2, b1, b2) = (pod_addr(1, 1), pod_addr(1, 2), pod_addr(2, 1), pod_addr(2, 2));
    println!();
    let mut failed = false;

    failed |= step(
        1,
        "red: node-a/pod1 -> node-b/pod1 over VXLAN, and back",
        (|| {
            lab.send(0, 0, &udp(a1, b1, 100))?;
            let got = lab.collect(1, WAIT);
            if got.len() != 1 || (got[0].0, got[0].1) != (1, 0) {
                bail!(
                    "expected one frame at node-b/pod1, got {:?}",
                    got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>()
                );
            }
            lab.send(1, 0, &udp(b1, a1, 100))?;
            let back = lab.collect(1, WAIT);
            if back.len() != 1 || (back[0].0, back[0].1) != (0, 0) {
                bail!("reply did not come back");
            }
            Ok("request flooded, reply unicast to the learned VTEP".into())
        })(),
    )
    .is_err();

    failed |= step(
        2,
        "blue: node-a/pod2 -> node-b/pod2 over the VLAN 200 trunk",
        (|| {
            lab.send(0, 1, &udp(a2, b2, 100))?;
            lab.send(1, 1, &udp(b2, a2, 100))?;
            let got = lab.collect(2, WAIT);
            let places: Vec<_> = got.iter().map(|g| (g.0, g.1)).collect();
            if places.len() != 2 || !places.contains(&(1, 1)) || !places.contains(&(0, 1)) {
                bail!("got {places:?}");
            }
            Ok("tagged on the trunk, untagged at the pods".into())
        })(),
    )
    .is_err();

    failed |= step(
        3,
        "isolation: 100 red broadcasts reach no blue pod",
        (|| {
            for _ in 0..100 {
                lab.send(0, 0, &udp(a1, (MacAddr::BROADCAST, Ipv4Addr::BROADCAST), 64))?;
            }
            let got = lab.collect(100, WAIT);
            let blue = got.iter().filter(|g| g.1 == 1).count();
            let red = got.iter().filter(|g| (g.0, g.1) == (1, 0)).count();
            if blue > 0 || red != 100 {
                bail!("{red} red deliveries, {blue} blue");
            }
            Ok("100 at node-b/pod1, 0 in blue".into())
        })(),
    )
    .is_err();

    failed |= step(
        4,
        "ARP for node-b/pod1 answered on node-a (suppression)",
        (|| {
            lab.send(0, 0, &frames::arp_request(a1.0, a1.1, b1.1))?;
            let got = lab.collect(1, WAIT);
            let want = frames::arp_reply(a1.0, b1.0, b1.1, a1.1);
            if got.len() != 1 || got[0].2 != want || (got[0].0, got[0].1) != (0, 0) {
                bail!("no local ARP reply");
            }
            Ok("reply from the switch, nothing crossed the underlay".into())
        })(),
    )
    .is_err();

    failed |= step(
        5,
        "spoofing: node-a/pod1 sends from another IP",
        (|| {
            lab.send(0, 0, &udp((a1.0, pod_ip(99)), b1, 64))?;
            let got = lab.collect(1, Duration::from_millis(300));
            if !got.is_empty() {
                bail!("a spoofed frame got through");
            }
            let d = lab.nodes[0].switch.stats().drop(vswitch::DropReason::SecurityIp);
            Ok(format!("dropped by port security (security_ip = {d})"))
        })(),
    )
    .is_err();

    let total = 100_000;
    failed |= step(
        6,
        &format!("load: {total} frames node-a/pod1 -> node-b/pod1"),
        (|| {
            let t0 = Instant::now();
            let f = udp(a1, b1, 64);
            let (mut sent, mut got) = (0usize, 0usize);
            let end = Instant::now() + Duration::from_secs(30);
            while got < total && Instant::now() < end {
                while sent < total && sent - got < 1024 && lab.send(0, 0, &f).is_ok() {
                    sent += 1;
                }
                got += lab.collect(0, Duration::ZERO).len();
            }
            let secs = t0.elapsed().as_secs_f64();
            if got != total {
                bail!("{got} of {total} arrived");
            }
            Ok(format!(
                "0 lost, {:.2} Mpps through two switches and the tunnel",
                total as f64 / secs / 1e6
            ))
        })(),
    )
    .is_err();

    for n in &mut lab.nodes {
        if let Some(p) = n.pmd.take() {
            p.stop();
        }
    }
    println!();
    for n in &lab.nodes {
        let s = n.switch.stats();
        let snap = n.switch.snapshot();
        println!("{}: {} MACs learned, {} PMD sleeps", n.name, n.switch.fdb().len(), s.sleeps);
        println!(
            "  {:<10} {:>10} {:>10} {:>10} {:>10} {:>8}",
            "port", "rx pkts", "rx bytes", "tx pkts", "tx bytes", "drops"
        );
        for p in snap.ports.iter().flatten() {
            let c = &s.ports[p.id as usize];
            println!(
                "  {:<10} {:>10} {:>10} {:>10} {:>10} {:>8}",
                p.name, c.rx_packets, c.rx_bytes, c.tx_packets, c.tx_bytes, c.drops
            );
        }
        let events: Vec<String> = vswitch::Event::ALL
            .iter()
            .filter(|e| s.event(**e) > 0)
            .map(|e| format!("{}={}", e.name(), s.event(*e)))
            .collect();
        println!("  events: {}", events.join(" "));
        let drops: Vec<String> =
            s.nonzero_drops().iter().map(|(n, c)| format!("{n}={c}")).collect();
        println!("  drops:  {}", if drops.is_empty() { "none".into() } else { drops.join(" ") });
        if let Some(cpp) = s.cycles_per_packet() {
            println!(
                "  PMD: {cpp:.0} busy cycles per packet received (includes the demo's pacing)"
            );
        }
    }
    for n in &mut lab.nodes {
        for (_, p) in &mut n.pods {
            p.drain(&mut lab.cache);
        }
    }
    println!();
    if failed {
        println!("demo FAILED");
        std::process::exit(1);
    }
    println!("demo passed: both planes connected, isolated, and lossless");
    Ok(())
}
