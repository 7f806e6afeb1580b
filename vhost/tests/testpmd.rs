//! DPDK's testpmd as the frontend, as VNF pods run it: two `net_virtio_user` ports on two
//! vhost-user ports of one switch, io forwarding after a first burst, so packets circulate
//! testpmd → switch → testpmd for a few seconds. Both sides must agree on every count and
//! nothing may be dropped. Needs `dpdk-testpmd` (Debian's dpdk-dev; fails under CI without
//! it, skips elsewhere); runs in the `serial` nextest group.

use knitter_vhost::backend::serve;
use knitter_vhost::port::VhostPort;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::port::Port;
use vswitch::{PmdConfig, PmdSet, Pool, Switch, SwitchOptions};

/// The numbers after `label` in testpmd's "Accumulated forward statistics" block.
fn accumulated(out: &str, label: &str) -> Option<u64> {
    let block = out.split("Accumulated forward statistics").nth(1)?;
    let at = block.find(label)? + label.len();
    block[at..].split_whitespace().next()?.parse().ok()
}

#[test]
fn testpmd_forwards_through_the_switch() {
    if Command::new("dpdk-testpmd").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "dpdk-testpmd is missing (ci/setup.sh installs dpdk-dev)");
        eprintln!("skipped: dpdk-testpmd not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("knitter-testpmd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Pool::new(16384, false).unwrap();
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    let mut servers = Vec::new();
    let mut ports = Vec::new();
    for name in ["vu0", "vu1"] {
        let port = Arc::new(VhostPort::new(name, pool.clone()));
        servers.push(serve(&dir.join(format!("{name}.sock")), port.clone()).unwrap());
        switch.register_port(name, port.clone()).unwrap();
        ports.push(port);
    }
    switch
        .apply(SwitchConfig {
            bridges: vec![BridgeConfig::new("red")],
            ports: vec![PortConfig::access("vu0", "red"), PortConfig::access("vu1", "red")],
            vtep: None,
        })
        .unwrap();
    let pmd = PmdSet::start(switch.clone(), &PmdConfig { threads: 1, ..PmdConfig::default() }).unwrap();

    let vdev = |i: usize| format!("--vdev=net_virtio_user{i},path={}", dir.join(format!("vu{i}.sock")).display());
    let prefix = format!("--file-prefix=knitter{}", std::process::id());
    let mut child = Command::new("timeout")
        .args(["60", "dpdk-testpmd", "-l", "0,1", "--no-pci", "--no-huge", "-m", "512", "--single-file-segments"])
        .arg(&prefix)
        .arg(vdev(0))
        .arg(vdev(1))
        .args(["--", "-i", "--nb-cores=1", "--total-num-mbufs=4096"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dpdk-testpmd");
    let mut stdin = child.stdin.take().unwrap();
    // Connected and both links up before traffic.
    let t = std::time::Instant::now();
    while !ports.iter().all(|p| p.link_up()) {
        assert!(t.elapsed() < Duration::from_secs(20), "testpmd did not set up its rings");
        std::thread::sleep(Duration::from_millis(50));
    }
    writeln!(stdin, "set fwd io\nstart tx_first").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    writeln!(stdin, "stop").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    pmd.stop();
    drop(servers);

    let (rx, tx) = (accumulated(&out, "RX-packets:"), accumulated(&out, "TX-packets:"));
    let (rx, tx) = (rx.expect("testpmd's statistics"), tx.expect("testpmd's statistics"));
    let ours: Vec<_> = ports.iter().map(|p| p.queue_stats()[0]).collect();
    let (our_rx, our_tx) = (ours[0].rx_packets + ours[1].rx_packets, ours[0].tx_packets + ours[1].tx_packets);
    assert!(rx > 10_000, "packets circulated: testpmd received {rx}");
    assert_eq!(our_rx, tx, "the switch took every packet testpmd sent");
    // Packets the switch delivered after testpmd stopped counting (those in flight when
    // it stopped) are not in its statistics: at most what its receive rings hold.
    assert!(our_tx >= rx && our_tx - rx <= 2 * 4096, "testpmd received what the switch sent: {our_tx} sent, {rx} counted");
    assert_eq!(accumulated(&out, "RX-dropped:"), Some(0));
    assert_eq!(switch.stats().total_drops(), 0, "{:?}", switch.stats().nonzero_drops());
    let _ = std::fs::remove_dir_all(&dir);
}
