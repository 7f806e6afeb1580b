//! DPDK's testpmd as the frontend, as VNF pods run it: two `net_virtio_user` ports on two
//! vhost-user ports of one switch, io forwarding after a first burst, so packets circulate
//! testpmd → switch → testpmd for a few seconds. Both sides must agree on every count and
//! nothing may be dropped. Run with mergeable buffers on and off, with `in_order=1` and
//! `packed_vq=1` asked for (the port offers neither: virtio-user negotiates them down), and
//! with two queue pairs. Needs `dpdk-testpmd` (Debian's dpdk-dev; fails under CI without
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
    testpmd_loop("", 1);
}

#[test]
fn testpmd_without_mergeable_buffers() {
    testpmd_loop(",mrg_rxbuf=0", 1);
}

#[test]
fn testpmd_asking_for_in_order_and_packed_rings() {
    testpmd_loop(",in_order=1,packed_vq=1", 1);
}

#[test]
fn testpmd_with_two_queue_pairs() {
    testpmd_loop("", 2);
}

/// testpmd with `virtio_user` options `opts` (after the path) and `queues` queue pairs.
fn testpmd_loop(opts: &str, queues: usize) {
    if Command::new("dpdk-testpmd").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "dpdk-testpmd is missing (ci/setup.sh installs dpdk-dev)");
        eprintln!("skipped: dpdk-testpmd not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("knitter-testpmd-{}-{queues}{}", std::process::id(), opts.len()));
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

    let vdev = |i: usize| format!("--vdev=net_virtio_user{i},path={},queues={queues}{opts}", dir.join(format!("vu{i}.sock")).display());
    let prefix = format!("--file-prefix=knitter{}", std::process::id());
    let mut child = Command::new("timeout")
        .args(["60", "dpdk-testpmd", "-l", "0,1", "--no-pci", "--no-huge", "-m", "512", "--single-file-segments"])
        .arg(&prefix)
        .arg(vdev(0))
        .arg(vdev(1))
        .args(["--", "-i", "--nb-cores=1", "--total-num-mbufs=4096"])
        .arg(format!("--rxq={queues}"))
        .arg(format!("--txq={queues}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dpdk-testpmd");
    let mut stdin = child.stdin.take().unwrap();
    // Connected and both links up before traffic.
    let t = std::time::Instant::now();
    while !ports.iter().all(|p| p.link_up() && p.running_pairs() == queues) {
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
    let ours: Vec<_> = ports.iter().flat_map(|p| p.queue_stats()).collect();
    let (our_rx, our_tx) = (ours.iter().map(|q| q.rx_packets).sum::<u64>(), ours.iter().map(|q| q.tx_packets).sum::<u64>());
    // tx_first sends a burst on every queue: each pair's transmit ring was received from.
    for p in &ports {
        let used = p.queue_stats().iter().filter(|q| q.rx_packets > 0).count();
        assert_eq!(used, queues, "{}: received on {used} queue pairs", p.name());
    }
    assert!(rx > 10_000, "packets circulated: testpmd received {rx}");
    assert_eq!(our_rx, tx, "the switch took every packet testpmd sent");
    // Packets the switch delivered after testpmd stopped counting (those in flight when
    // it stopped) are not in its statistics: at most what its receive rings hold.
    assert!(our_tx >= rx && our_tx - rx <= 2 * 4096, "testpmd received what the switch sent: {our_tx} sent, {rx} counted");
    assert_eq!(accumulated(&out, "RX-dropped:"), Some(0));
    assert_eq!(switch.stats().total_drops(), 0, "{:?}", switch.stats().nonzero_drops());
    let _ = std::fs::remove_dir_all(&dir);
}
