//! The `dpdk` port kind against DPDK's own vdevs (no NIC here): `net_pcap` frames in both
//! directions byte for byte through the switch, `net_null` on several queues with the
//! device's counters, refusals with DPDK's reason, `net_tap` pods, the underlay on
//! `net_af_packet`, a `net_memif` client against testpmd, a `net_ring` loopback. Ports on
//! vdevs that copy with the CPU share the switch's buffers (zero copy), as knitter-vswitchd
//! opens them; `net_null` and the copying edge are tested too. Skipped, saying so, when this build has
//! no DPDK. Every test initialises the EAL of its own process (`--no-huge` without huge
//! pages, a file prefix of its own).

use std::sync::Arc;
use vswitch::config::SwitchConfig;
use vswitch::port::Port;
use vswitch::testkit::vnf::ListeningVnf;
use vswitch::testkit::{Harness, frames, mac, one_bridge, pcap};

/// Port options as knitter-vswitchd's: the switch's buffers shared with the device (2 047
/// mbufs, so that two ports fit the test switches' pools).
fn shared(pool: &Arc<vswitch::Pool>) -> dpdk::PortOptions {
    dpdk::PortOptions { zero_copy: Some(pool.clone()), mbufs: 2047, ..Default::default() }
}

fn eal() -> bool {
    if !dpdk::AVAILABLE {
        eprintln!("skipped: built without DPDK (libdpdk-dev, libclang-dev)");
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs DPDK: the dpdk port must be tested there"
        );
        return false;
    }
    let prefix = format!("knitter-test-{}", std::process::id());
    dpdk::eal::init(&dpdk::eal::default_args(&prefix, &[])).expect("EAL");
    true
}

#[test]
fn pcap_frames_cross_the_switch_byte_for_byte_both_ways() {
    if !eal() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("knitter-dpdk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (rx, tx) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let ip = |n| std::net::Ipv4Addr::new(10, 0, 0, n);
    let inbound: Vec<Vec<u8>> = [60usize, 200, 1514]
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            frames::udp4(mac(0x22), mac(0x11), ip(1), ip(2), 1000 + i as u16, 2000, size)
        })
        .collect();
    pcap::write(&rx, &inbound).unwrap();
    let devargs = format!("net_pcap_bx,rx_pcap={},tx_pcap={}", rx.display(), tx.display());
    let pool = vswitch::Pool::new(16384, false).unwrap();
    let free = pool.free_count();
    let port = dpdk::DpdkPort::open("d", &devargs, &shared(&pool)).expect("net_pcap opens");
    assert!(port.zero_copy(), "net_pcap's mbufs carry the switch's buffers");
    assert_eq!(port.copy_reason(), None);
    port.refresh_link();
    assert!(port.link_up(), "a started net_pcap device reports its link up");
    let mut h = Harness::with_pool(pool.clone(), vswitch::SwitchOptions::default());
    h.ring("r").register("d", port.clone());
    h.apply(one_bridge(&["r", "d"])).unwrap();
    h.step();
    assert_eq!(h.recv("r"), inbound, "frames from the pcap reach the ring port unchanged");
    // Back: to the MAC learnt on the dpdk port.
    let outbound: Vec<Vec<u8>> = [64usize, 1000, 1514]
        .iter()
        .map(|&size| frames::udp4(mac(0x11), mac(0x22), ip(2), ip(1), 2000, 1000, size))
        .collect();
    for f in &outbound {
        h.send("r", f);
    }
    h.step();
    let st = port.queue_stats();
    assert_eq!((st[0].rx_packets, st[0].tx_packets), (3, 3), "{st:?}");
    let dev = port.device_stats().expect("device stats");
    assert_eq!((dev.ipackets, dev.opackets), (3, 3));
    // Closing the device flushes its pcap writer.
    h.apply(SwitchConfig::default()).unwrap();
    h.switch.unregister_port("d").unwrap();
    drop(h);
    assert_eq!(Arc::strong_count(&port), 1);
    drop(port);
    assert_eq!(pcap::read(&tx).unwrap(), outbound, "frames to the dpdk port leave unchanged");
    assert_eq!(pool.free_count(), free, "every buffer the mbufs carried is back in the pool");
    std::fs::remove_dir_all(&dir).ok();
}

/// Jumbo frames (9 000 bytes, in chained mbufs and chained switch buffers) both ways.
#[test]
fn jumbo_frames_cross_in_chains() {
    if !eal() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("knitter-dpdk-j{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (rx, tx) = (dir.join("in.pcap"), dir.join("out.pcap"));
    let ip = |n| std::net::Ipv4Addr::new(10, 0, 0, n);
    let inbound = vec![frames::udp4(mac(0x22), mac(0x11), ip(1), ip(2), 1, 2, 9000)];
    pcap::write(&rx, &inbound).unwrap();
    let pool = vswitch::Pool::new(16384, false).unwrap();
    let port = dpdk::DpdkPort::open(
        "d",
        &format!("net_pcap_jx,rx_pcap={},tx_pcap={}", rx.display(), tx.display()),
        &shared(&pool),
    )
    .unwrap();
    assert!(port.max_frame() >= 9018, "{}", port.max_frame());
    let mut h = Harness::with_pool(pool.clone(), vswitch::SwitchOptions::default());
    h.ring("r").register("d", port.clone());
    let mut cfg = one_bridge(&["r", "d"]);
    for p in &mut cfg.ports {
        p.mtu = 9000;
    }
    h.apply(cfg).unwrap();
    h.step();
    assert_eq!(h.recv("r"), inbound);
    let outbound = vec![frames::udp4(mac(0x11), mac(0x22), ip(2), ip(1), 2, 1, 9000)];
    h.send_chain("r", &outbound[0], &[1500, 3000]);
    h.step();
    assert_eq!(h.stats().total_drops(), 0);
    h.apply(SwitchConfig::default()).unwrap();
    h.switch.unregister_port("d").unwrap();
    drop(h);
    drop(port);
    assert_eq!(pcap::read(&tx).unwrap(), outbound);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn several_queues_are_configured_and_counted() {
    if !eal() {
        return;
    }
    let opts = dpdk::PortOptions { queues: 2, ..Default::default() };
    let port = dpdk::DpdkPort::open("n", "net_null_mq,size=64", &opts).expect("net_null opens");
    assert_eq!((port.rx_queues(), port.tx_queues()), (2, 2));
    let pool = vswitch::Pool::new(1024, false).unwrap();
    let free = pool.free_count();
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    for q in 0..2 {
        assert_eq!(port.rx_burst(q, &mut cache, &mut batch), 32, "net_null fills every burst");
        assert!(batch.as_slice().iter().all(|b| pool.pkt_len(b) == 64));
        assert_eq!(port.tx_burst(q, &mut cache, &mut batch), 32, "and takes every frame");
        assert!(batch.is_empty());
    }
    let st = port.queue_stats();
    assert_eq!(
        st.iter().map(|s| (s.rx_packets, s.tx_packets)).collect::<Vec<_>>(),
        vec![(32, 32), (32, 32)]
    );
    drop(cache);
    assert_eq!(pool.free_count(), free, "every buffer back");
}

#[test]
fn bad_devices_are_refused_with_dpdks_reason() {
    if !eal() {
        return;
    }
    let e = dpdk::DpdkPort::open("x", "net_nonesuch0", &dpdk::PortOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("net_nonesuch0"), "{e}");
    let e = dpdk::DpdkPort::open("x", "", &dpdk::PortOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("devargs"), "{e}");
    // The name is free again after a failed or closed open.
    let p = dpdk::DpdkPort::open("n", "net_null_again", &dpdk::PortOptions::default()).unwrap();
    drop(p);
    dpdk::DpdkPort::open("n", "net_null_again", &dpdk::PortOptions::default())
        .expect("probed again after close");
}

/// Two pods (network namespaces) on DPDK TAP devices, each made inside its pod's namespace,
/// ping each other through the switch on a PMD thread.
#[test]
fn pods_on_tap_devices_ping_through_the_switch() {
    use vswitch::testkit::netns::{self, Netns};
    if !eal() {
        return;
    }
    let Some(_g) = netns::exclusive() else { return };
    let (pa, pb) = (Netns::new("dta").unwrap(), Netns::new("dtb").unwrap());
    let tag = std::process::id() % 100_000;
    let pool = vswitch::Pool::new(8192, false).unwrap();
    let open = |ns: &Netns, vdev: &str, iface: &str, addr: &str| {
        let port = ns
            .enter(|| dpdk::DpdkPort::open(vdev, &format!("{vdev},iface={iface}"), &shared(&pool)))
            .unwrap()
            .expect("net_tap opens");
        ns.run(&["ip", "addr", "add", addr, "dev", iface]).unwrap();
        ns.run(&["ip", "link", "set", iface, "up"]).unwrap();
        port.refresh_link();
        port
    };
    let a = open(&pa, &format!("net_tap_a{tag}"), &format!("dta{tag}"), "10.9.0.1/24");
    let b = open(&pb, &format!("net_tap_b{tag}"), &format!("dtb{tag}"), "10.9.0.2/24");
    assert!(a.zero_copy() && b.zero_copy());
    let switch = vswitch::Switch::new(pool, vswitch::SwitchOptions::default());
    switch.register_port("a", a.clone()).unwrap();
    switch.register_port("b", b.clone()).unwrap();
    switch.apply(one_bridge(&["a", "b"])).unwrap();
    let pmd = vswitch::PmdSet::start(
        switch.clone(),
        &vswitch::PmdConfig { threads: 1, cores: vec![], idle: vswitch::IdlePolicy::default() },
    )
    .unwrap();
    let r = netns::ping(&pa, "10.9.0.2");
    pmd.stop();
    r.expect("the pods reach each other through the dpdk ports");
    // The link as the control plane reads it (knitter-vswitchd's link watcher refreshes
    // every port): the pod's end down, then up.
    let iface = format!("dta{tag}");
    // The kernel turns the tap's carrier on a moment after `ip link set up` (its link watch
    // runs apart): look again for up to 2 s, as the daemon's link watcher would.
    let seen = |up: bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            a.refresh_link();
            if a.link_up() == up || std::time::Instant::now() > deadline {
                return a.link_up() == up;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    pa.run(&["ip", "link", "set", &iface, "down"]).unwrap();
    assert!(seen(false), "link down seen");
    pa.run(&["ip", "link", "set", &iface, "up"]).unwrap();
    assert!(seen(true), "link up seen");
    let (sa, sb) = (a.device_stats().unwrap(), b.device_stats().unwrap());
    assert!(sa.ipackets >= 3 && sb.opackets >= 3, "{sa:?} {sb:?}");
    switch.apply(SwitchConfig::default()).unwrap();
}

/// The underlay on a dpdk port: the VTEP's underlay and a pod's port are DPDK `net_af_packet`
/// devices on the switch namespace's veths; across the underlay, Linux's own `vxlan` device
/// bridged with a second pod. The pods ping each other; Linux resolves the VTEP by ARP, which
/// the switch answers through its dpdk underlay.
#[test]
fn the_underlay_on_a_dpdk_port_interoperates_with_linux_vxlan() {
    use std::net::IpAddr;
    use vswitch::config::{BridgeConfig, PortConfig, VtepConfig};
    use vswitch::counters::Event;
    use vswitch::testkit::netns::{self, SwitchNode};
    if !eal() {
        return;
    }
    let Some(_g) = netns::exclusive() else { return };
    let (local, remote) = ("198.51.100.1", "198.51.100.2");
    let netns::LinuxVxlanPeer { sw, pod_a, node_b, pod_b } =
        netns::linux_vxlan_peer(remote, "24", local).unwrap();
    let peer: IpAddr = remote.parse().unwrap();
    let peer_mac = netns::mac_of(&node_b, "ul1").unwrap();
    let open = |name: &str, pool: &Arc<vswitch::Pool>| -> std::io::Result<Arc<dyn Port>> {
        let devargs = format!("net_af_packet_{name},iface={name}");
        dpdk::DpdkPort::open(name, &devargs, &shared(pool))
            .inspect(|p| {
                // It wants room for its 2 048-byte frames: opened again with mbufs of its own.
                assert!(!p.zero_copy(), "net_af_packet refuses the switch's 2 KiB buffers");
                let why = p.copy_reason().unwrap_or_default();
                assert!(why.contains("failed with the switch's 2 KiB buffers"), "{why:?}");
            })
            .map(|p| p as Arc<dyn Port>)
            .map_err(std::io::Error::other)
    };
    let node = SwitchNode::start(
        sw,
        &["pa0", "ul0"],
        open,
        SwitchConfig {
            bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[peer])],
            ports: vec![PortConfig::access("pa0", "red"), PortConfig::underlay("ul0")],
            vtep: Some(VtepConfig::new(local.parse().unwrap(), "ul0").peer(peer, peer_mac)),
        },
    )
    .unwrap();
    netns::ping(&pod_a, "192.0.2.2")
        .expect("pod A reaches pod B through the dpdk underlay and Linux VXLAN");
    netns::ping(&pod_b, "192.0.2.1").expect("pod B reaches pod A");
    let s = node.switch.stats();
    assert!(
        s.event(Event::Encapsulated) >= 6 && s.event(Event::Decapsulated) >= 6,
        "{:?}",
        s.events
    );
}

/// A `net_memif` client port against DPDK's testpmd as the memif server, forwarding in
/// `macswap` mode (each frame back with its MACs swapped): a frame from the ring port is
/// flooded to the memif port and comes back to the ring port, byte for byte but for its
/// MACs; then the learnt MAC takes unicast frames (60, 1 514, 200 bytes) the same way.
#[test]
fn memif_frames_go_to_testpmd_and_come_back() {
    use std::time::{Duration, Instant};
    if !eal() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("memif.sock");
    let server = format!("net_memif0,role=server,socket={},socket-abstract=no", sock.display());
    let Some(mut tp) = ListeningVnf::start_vdevs(
        std::process::Command::new("dpdk-testpmd"),
        &[server],
        &["--forward-mode=macswap", "--total-num-mbufs=2048"],
    ) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "testpmd made no memif socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    tp.say("start");
    // The server's interface joins its socket when testpmd starts its port, a moment after
    // the socket appears (a client that connects before is refused and not retried).
    std::thread::sleep(Duration::from_secs(2));
    let devargs = format!("net_memif_tx,role=client,socket={},socket-abstract=no", sock.display());
    let mut h = Harness::new();
    let port =
        dpdk::DpdkPort::open("m", &devargs, &shared(&h.pool)).expect("the memif client opens");
    assert!(port.zero_copy(), "the memif client's mbufs carry the switch's buffers");
    while !port.link_up() {
        assert!(Instant::now() < deadline, "the memif link never came up");
        port.refresh_link();
        std::thread::sleep(Duration::from_millis(50));
    }
    h.ring("r").register("m", port.clone());
    h.apply(one_bridge(&["r", "m"])).unwrap();
    let ip = |n| std::net::Ipv4Addr::new(10, 0, 0, n);
    let swapped = |f: &[u8]| [&f[6..12], &f[0..6], &f[12..]].concat();
    // A frame sent before the server polls its new rings is lost (memif has no retry): each
    // frame is sent again every 300 ms until it is back; what comes back is only ever the
    // frames sent, MACs swapped.
    let mut sent = Vec::new();
    for (i, size) in [60usize, 1514, 200].into_iter().enumerate() {
        let f = frames::udp4(mac(0x11), mac(0x22), ip(1), ip(2), 1000 + i as u16, 2000, size);
        sent.push(swapped(&f));
        let mut last = Instant::now() - Duration::from_secs(1);
        let mut back = false;
        while !back {
            assert!(
                Instant::now() < deadline + Duration::from_secs(10),
                "frame {i} never came back from testpmd"
            );
            if last.elapsed() > Duration::from_millis(300) {
                h.send("r", &f);
                last = Instant::now();
            }
            h.step();
            for got in h.recv("r") {
                assert!(
                    sent.contains(&got),
                    "frame {i} ({size} bytes): something else came back: {got:02x?}"
                );
                back |= got == swapped(&f);
            }
        }
    }
    let st = port.queue_stats();
    assert!(st[0].tx_packets >= 3 && st[0].rx_packets >= 3, "{st:?}");
    h.apply(SwitchConfig::default()).unwrap();
    h.switch.unregister_port("m").unwrap();
}

/// Zero copy both ways over a `net_ring` loopback (its tx queue feeds its own rx queue, so
/// the port receives the very mbufs it sent): frames from the ring port leave the dpdk port
/// (a trunk: each gets a VLAN tag in front, its data moving within its buffer) and come back
/// in, tag removed, to the ring port byte for byte — small, full-size and chained jumbo
/// frames in one burst. Every buffer the port's mbufs carried is back in the switch's pool
/// once the port is gone.
#[test]
fn zero_copy_frames_loop_through_a_ring_vdev_and_every_buffer_comes_back() {
    use vswitch::config::{BridgeConfig, PortConfig};
    if !eal() {
        return;
    }
    let pool = vswitch::Pool::new(8192, false).unwrap();
    let free = pool.free_count();
    let port = dpdk::DpdkPort::open("d", "net_ring_zc", &shared(&pool)).expect("net_ring opens");
    assert!(port.zero_copy());
    assert_eq!(pool.free_count(), free - 2047, "one buffer for each mbuf");
    let mut h = Harness::with_pool(pool.clone(), vswitch::SwitchOptions::default());
    h.ring("r").register("d", port.clone());
    let mut trunk = PortConfig::trunk("d", &[100], None);
    trunk.mtu = 9000;
    let mut access = PortConfig::access("r", "red");
    access.mtu = 9000;
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vlan(100)],
        ports: vec![access, trunk],
        vtep: None,
    })
    .unwrap();
    let ip = |n| std::net::Ipv4Addr::new(10, 0, 0, n);
    for round in 0..3u16 {
        let sent: Vec<Vec<u8>> = [60usize, 1514, 200, 4000, 64]
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                frames::udp4(mac(0x11), mac(0x22), ip(1), ip(2), round * 10 + i as u16, 9, size)
            })
            .collect();
        for f in &sent {
            h.send("r", f);
        }
        let mut back = Vec::new();
        for _ in 0..20 {
            h.step();
            back.extend(h.recv("r"));
            if back.len() >= sent.len() {
                break;
            }
        }
        assert_eq!(back, sent, "round {round}: each frame back once, as it was sent");
    }
    let st = port.queue_stats();
    assert_eq!((st[0].tx_packets, st[0].rx_packets, st[0].rx_dropped), (15, 15, 0), "{st:?}");
    assert_eq!(h.stats().total_drops(), 0);
    h.apply(SwitchConfig::default()).unwrap();
    h.switch.unregister_port("d").unwrap();
    drop(h);
    assert_eq!(Arc::strong_count(&port), 1);
    drop(port);
    assert_eq!(pool.free_count(), free, "every buffer the mbufs carried is back in the pool");
}

/// A port that asks for more of the switch's buffers than the pool has free, or for so many
/// that less than a quarter of the pool would stay free for other ports, copies at the edge
/// instead, and works; the pool keeps every buffer.
#[test]
fn zero_copy_that_does_not_fit_the_pool_falls_back_to_copies() {
    if !eal() {
        return;
    }
    // 2 047 mbufs: more than the first pool has; every free buffer of the second, which
    // would leave none of the quarter other ports keep.
    for (i, size) in [1024u32, 2048].into_iter().enumerate() {
        let pool = vswitch::Pool::new(size, false).unwrap();
        let free = pool.free_count();
        let port = dpdk::DpdkPort::open("d", &format!("net_ring_full{i}"), &shared(&pool))
            .expect("net_ring opens");
        assert!(!port.zero_copy(), "2 047 mbufs do not fit a pool of {size} buffers");
        assert!(port.copy_reason().is_some_and(|why| !why.is_empty()));
        assert_eq!(pool.free_count(), free);
        let mut cache = vswitch::PoolCache::new(pool.clone());
        let mut batch = vswitch::Batch::new();
        let (a, b) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let f = frames::udp4(mac(1), mac(2), a, b, 1, 2, 100);
        assert!(batch.push(cache.alloc_frame(&f).unwrap()).is_ok());
        assert_eq!(port.tx_burst(0, &mut cache, &mut batch), 1);
        assert_eq!(port.rx_burst(0, &mut cache, &mut batch), 1, "the loopback returns it");
        assert_eq!(pool.head(&batch.as_slice()[0]), &f[..]);
        cache.free(batch.take(0));
        batch.handed_on(1);
        drop(cache);
        drop(port);
        assert_eq!(pool.free_count(), free);
    }
}
