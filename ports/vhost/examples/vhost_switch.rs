//! A switch with vhost-user ports, for trying frontends against (DPDK's testpmd with
//! `net_virtio_user`, QEMU): `n` ports `vu0..` served at `<dir>/vu<i>.sock`, all access ports
//! of one bridge domain, one busy PMD thread; prints the ports' counters every second.
//!
//!     cargo run --release -p knitter-vhost --example vhost_switch -- /tmp/knitter 2 10
//!     dpdk-testpmd --no-pci --no-huge -m 512 --single-file-segments \
//!         --vdev=net_virtio_user0,path=/tmp/knitter/vu0.sock \
//!         --vdev=net_virtio_user1,path=/tmp/knitter/vu1.sock -- -i

use anyhow::Context;
use knitter_vhost::backend::serve;
use knitter_vhost::port::VhostPort;
use std::sync::Arc;
use std::time::Duration;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::port::Port;
use vswitch::{IdlePolicy, PmdConfig, PmdSet, Pool, Switch, SwitchOptions};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/tmp/knitter".into()));
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pool = Pool::new(16384, true)?;
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    let mut servers = Vec::new();
    let mut ports = Vec::new();
    for i in 0..n {
        let name = format!("vu{i}");
        let port = Arc::new(VhostPort::new(&name, pool.clone()));
        let path = dir.join(format!("{name}.sock"));
        servers.push(
            serve(&path, port.clone()).with_context(|| format!("serving {}", path.display()))?,
        );
        switch.register_port(&name, port.clone())?;
        ports.push((name, port));
        println!("listening on {}", path.display());
    }
    switch.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: ports.iter().map(|(n, _)| PortConfig::access(n, "red")).collect(),
        vtep: None,
    })?;
    let pmd = PmdSet::start(
        switch.clone(),
        &PmdConfig { threads: 1, cores: vec![], idle: IdlePolicy::Busy },
    )?;
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        let line: Vec<String> = ports
            .iter()
            .map(|(n, p)| {
                let q = p.queue_stats();
                let sum = |f: fn(&vswitch::port::QueueStats) -> u64| q.iter().map(f).sum::<u64>();
                format!(
                    "{n}: link={} pairs={} rx={} tx={} tx_full={}",
                    p.link_up(),
                    p.running_pairs(),
                    sum(|q| q.rx_packets),
                    sum(|q| q.tx_packets),
                    sum(|q| q.tx_full)
                )
            })
            .collect();
        println!("{}", line.join("  "));
    }
    pmd.stop();
    drop(servers);
    let st = switch.stats();
    println!("drops: {:?}", st.nonzero_drops());
    if let Some(c) = st.cycles_per_packet() {
        println!("PMD busy cycles per packet: {c:.0}");
    }
    Ok(())
}
