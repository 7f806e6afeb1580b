//! veth ↔ veth throughput through the switch's AF_XDP and AF_PACKET ports, side by side with a
//! Linux bridge on the same topology, alternated in one run (this VM's CPU supply swings).
//! Needs root and `iperf3`; creates and removes its own network namespaces.
//!
//!     cargo run --release -p knitter-kernel-ports --example kernel_ports_bench -- [rounds] [seconds]
//!
//! Reports iperf3 TCP and UDP (64-byte payload) results and, for the switch, its PMD's busy
//! cycles per packet. Pod veths get the offloads the CNI will set (no tx checksum, TSO, GSO).

use anyhow::{Context, Result};
use kernel_ports::afpacket::AfPacketPort;
use kernel_ports::afxdp::AfXdpPort;
use std::sync::Arc;
use std::time::Duration;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::port::Port;
use vswitch::testkit::netns::{self, Netns};
use vswitch::{IdlePolicy, PmdConfig, PmdSet, Pool, Switch, SwitchOptions};

struct Topology {
    mid: Netns,
    a: Netns,
    b: Netns,
}

fn topology() -> Result<Topology> {
    let (mid, a, b) = (Netns::new("mid")?, Netns::new("pa")?, Netns::new("pb")?);
    netns::veth(&a, "eth0", &mid, "ma")?;
    netns::veth(&b, "eth0", &mid, "mb")?;
    a.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"])?;
    b.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"])?;
    for ns in [&a, &b] {
        ns.run(&["ethtool", "-K", "eth0", "tx", "off", "tso", "off", "gso", "off"])?;
    }
    Ok(Topology { mid, a, b })
}

/// iperf3 from pod A to pod B; returns the receiver-side rate in Mbit/s.
fn iperf(t: &Topology, udp: bool, secs: u32) -> Result<f64> {
    let server = std::process::Command::new("ip")
        .args(["netns", "exec", &t.b.name, "iperf3", "-s", "-1", "-B", "192.0.2.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(300));
    let secs_s = secs.to_string();
    let mut args = vec!["timeout", "60", "iperf3", "-c", "192.0.2.2", "-t", &secs_s, "-J"];
    if udp {
        args.extend(["-u", "-b", "0", "-l", "64"]);
    }
    let out = t.a.run(&args);
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    let key = "\"bits_per_second\":";
    // The last "bits_per_second" in the JSON is the receiver's total for TCP, the sum for UDP.
    let bps = out
        .rmatch_indices(key)
        .next()
        .and_then(|(i, _)| out[i + key.len()..].split([',', '}']).next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .context("iperf3 output without a rate")?;
    Ok(bps / 1e6)
}

fn with_switch<R>(
    t: &Topology,
    xdp: bool,
    f: impl FnOnce() -> Result<R>,
) -> Result<(R, Option<f64>)> {
    let pool = Pool::new(16384, true)?;
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    for p in ["ma", "mb"] {
        let port: Arc<dyn Port> = if xdp {
            Arc::new(t.mid.enter(|| AfXdpPort::open(p, p, pool.clone()))??)
        } else {
            Arc::new(t.mid.enter(|| AfPacketPort::open(p, p))??)
        };
        switch.register_port(p, port)?;
    }
    switch.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![PortConfig::access("ma", "red"), PortConfig::access("mb", "red")],
        vtep: None,
    })?;
    let pmd = PmdSet::start(
        switch.clone(),
        &PmdConfig { threads: 1, cores: vec![1], idle: IdlePolicy::Busy },
    )?;
    let r = f();
    pmd.stop();
    Ok((r?, switch.stats().cycles_per_packet()))
}

fn with_bridge<R>(t: &Topology, f: impl FnOnce() -> Result<R>) -> Result<R> {
    t.mid.run(&["ip", "link", "add", "br0", "type", "bridge"])?;
    t.mid.run(&["ip", "link", "set", "dev", "ma", "master", "br0"])?;
    t.mid.run(&["ip", "link", "set", "dev", "mb", "master", "br0"])?;
    t.mid.run(&["ip", "link", "set", "br0", "up"])?;
    let r = f();
    t.mid.run(&["ip", "link", "del", "br0"])?;
    r
}

fn main() -> Result<()> {
    anyhow::ensure!(netns::available(), "needs root and iproute2");
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let secs: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let t = topology()?;
    println!("round  kind        TCP Mb/s  UDP-64 Mb/s  PMD busy cycles/pkt");
    for r in 0..rounds {
        for (kind, xdp) in [("AF_XDP", true), ("AF_PACKET", false)] {
            let ((tcp, udp), cpp) =
                with_switch(&t, xdp, || Ok((iperf(&t, false, secs)?, iperf(&t, true, secs)?)))?;
            println!(
                "{r:>5}  {kind:<10}  {tcp:>8.0}  {udp:>11.1}  {:>19.0}",
                cpp.unwrap_or(f64::NAN)
            );
        }
        let (tcp, udp) = with_bridge(&t, || Ok((iperf(&t, false, secs)?, iperf(&t, true, secs)?)))?;
        println!("{r:>5}  {:<10}  {tcp:>8.0}  {udp:>11.1}", "bridge");
    }
    Ok(())
}
