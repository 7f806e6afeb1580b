//! What one configuration change costs the control side at scale (issue 31): a switch with
//! 4 096 bridge domains (each with a VNI and a flood list of 64 VTEP peers), 16 384 peers and
//! 200 access ports, then one port added and removed again, `--applies` times; prints the
//! median and worst apply and the process's RSS before and after the repeated applies.
//!
//!   cargo run --release -p knitter-vswitch --example apply_bench -- [--bds N] [--peers N]
//!       [--flood N] [--ports N] [--applies N]
//!
//! A benchmark, run by hand (numbers in docs/perf/scale.md "Scale"); CI runs it once, small, to
//! keep it compiling and working.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::port::ring::RingPort;
use vswitch::testkit::mac;
use vswitch::{Pool, Switch, SwitchOptions};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} wants a number")))
        .unwrap_or(default)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let (bds, peers, flood, ports, applies) = (
        arg("--bds", 4096),
        arg("--peers", 16384),
        arg("--flood", 64),
        arg("--ports", 200),
        arg("--applies", 1000),
    );
    let peer = |n: usize| IpAddr::V4(Ipv4Addr::from(0xc633_0000 + n as u32)); // 198.51.0.0/16
    let mut vtep = VtepConfig::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), "up");
    for n in 0..peers {
        vtep = vtep.peer(peer(n), mac(9));
    }
    let bridges: Vec<BridgeConfig> = (0..bds)
        .map(|b| {
            let list: Vec<IpAddr> =
                (0..flood.min(peers)).map(|i| peer((b * 7 + i) % peers)).collect();
            BridgeConfig::new(&format!("bd{b}")).vni(1000 + b as u32).flood(&list)
        })
        .collect();
    let mut cfg = SwitchConfig {
        bridges,
        ports: (0..ports)
            .map(|p| PortConfig::access(&format!("p{p}"), &format!("bd{}", p % bds)))
            .collect(),
        vtep: Some(vtep),
    };
    cfg.ports.push(PortConfig::underlay("up"));

    let pool = Pool::new(4096, false).expect("buffer pool");
    let sw = Switch::new(pool, SwitchOptions::default());
    let mut peers_kept = Vec::new();
    for name in (0..=ports).map(|p| format!("p{p}")).chain(["up".to_string()]) {
        let (port, peer) = RingPort::new(&name, 1, 64).expect("ring port");
        let port: Arc<RingPort> = if name == "up" { port.with_mac(mac(1)) } else { port };
        sw.register_port(&name, port).expect("register");
        peers_kept.push(peer);
    }
    let t = Instant::now();
    sw.apply(cfg.clone()).expect("the base configuration");
    println!(
        "base apply ({bds} bridge domains x {flood} flood peers, {peers} peers, {ports} ports): {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let mut with = cfg.clone();
    with.ports.push(PortConfig::access(&format!("p{ports}"), "bd1"));
    let (mut add, mut remove) = (Vec::with_capacity(applies), Vec::with_capacity(applies));
    let mut rss = Vec::new();
    for i in 0..applies {
        if i == applies.min(10) {
            rss.push(rss_kib());
        }
        let (a, b) = (with.clone(), cfg.clone());
        let t = Instant::now();
        sw.apply(a).expect("one port added");
        add.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        sw.apply(b).expect("one port removed");
        remove.push(t.elapsed().as_secs_f64() * 1e3);
    }
    rss.push(rss_kib());
    let stat = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let ((am, aw), (rm, rw)) = (stat(&mut add), stat(&mut remove));
    println!("add one port:    median {am:.3} ms, worst {aw:.3} ms ({applies} applies)");
    println!("remove one port: median {rm:.3} ms, worst {rw:.3} ms");
    println!(
        "RSS after 10 pairs of applies {} KiB, after {applies}: {} KiB",
        rss[0],
        rss[rss.len() - 1]
    );
}
