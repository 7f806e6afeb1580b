//! Bridge-domain behaviour over ring ports: learning, forwarding, flooding with split
//! horizon, reflection, ageing, limits, static MACs, port security and ARP/ND suppression.

use std::net::Ipv4Addr;
use vswitch::config::{
    AddressPair, BridgeConfig, GatewayConfig, Neighbor, PortConfig, StaticMac, SwitchConfig,
};
use vswitch::fdb::Dest;
use vswitch::testkit::{Harness, frames, mac};
use vswitch::{DropReason, Event};

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

/// Three access ports p0..p2 in bridge "red".
fn three_ports() -> Harness {
    let mut h = Harness::new();
    for p in ["p0", "p1", "p2"] {
        h.ring(p);
    }
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: ["p0", "p1", "p2"].iter().map(|p| PortConfig::access(p, "red")).collect(),
        vtep: None,
    })
    .unwrap();
    h
}

#[test]
fn unknown_unicast_floods_then_learned_unicast_goes_to_one_port() {
    let mut h = three_ports();
    let a_to_b = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 64);
    h.send("p0", &a_to_b);
    h.step();
    let out = h.recv_all();
    assert!(out["p0"].is_empty(), "never back out of the ingress port");
    assert_eq!(out["p1"], vec![a_to_b.clone()]);
    assert_eq!(out["p2"], vec![a_to_b.clone()]);

    let b_to_a = frames::udp4(mac(1), mac(2), ip(2), ip(1), 2000, 1000, 64);
    h.send("p1", &b_to_a);
    h.step();
    let out = h.recv_all();
    assert_eq!(out["p0"], vec![b_to_a], "mac(1) was learned on p0");
    assert!(out["p2"].is_empty());

    h.send("p0", &a_to_b);
    h.step();
    let out = h.recv_all();
    assert_eq!(out["p1"], vec![a_to_b]);
    assert!(out["p2"].is_empty());
    let s = h.stats();
    assert_eq!(s.event(Event::Learned), 2);
    assert_eq!(s.event(Event::KnownUnicast), 2);
    assert_eq!(s.ports[0].rx_packets, 2);
}

#[test]
fn reflection_group_source_and_runts_are_dropped_and_counted() {
    let mut h = three_ports();
    h.send("p0", &frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 2, 64));
    h.step();
    h.recv_all();
    // mac(1) is on p0: a frame to it arriving on p0 is reflected.
    h.send("p0", &frames::udp4(mac(1), mac(5), ip(5), ip(1), 1, 2, 64));
    h.send("p0", &frames::udp4(mac(1), vswitch::wire::MacAddr::BROADCAST, ip(5), ip(1), 1, 2, 64));
    h.send("p0", &[0u8; 10]);
    h.step();
    assert!(h.recv_all().values().all(Vec::is_empty));
    let s = h.stats();
    assert_eq!(s.drop(DropReason::Reflect), 1);
    assert_eq!(s.drop(DropReason::SrcMacGroup), 1);
    assert_eq!(s.drop(DropReason::Runt), 1);
}

#[test]
fn odd_l3_content_is_still_switched() {
    let mut h = three_ports();
    // IPv4 EtherType with a garbage header: the bridge does not care.
    let f = frames::eth(mac(2), mac(1), 0x0800, &[0xff; 30]);
    h.send("p0", &f);
    h.step();
    assert_eq!(h.recv("p1"), vec![f]);
}

#[test]
fn mac_move_and_ageing() {
    let mut h = three_ports();
    h.set_now(100);
    h.send("p0", &frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 2, 64));
    h.step();
    h.send("p1", &frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 2, 64));
    h.step();
    h.recv_all();
    assert_eq!(h.stats().event(Event::MacMoved), 1);
    assert_eq!(h.switch.fdb().dump()[0].dest, Dest::Port(1));
    // Refreshes are written at most once a second.
    h.set_now(350);
    h.send("p1", &frames::udp4(mac(9), mac(1), ip(1), ip(9), 1, 2, 64));
    h.step();
    assert_eq!(h.switch.age(600), 0, "seen at 350, age 300: still fresh at 600");
    assert_eq!(h.switch.age(650), 1);
    assert!(h.switch.fdb().is_empty());
}

#[test]
fn fdb_limits_per_bridge_and_port_are_counted() {
    let mut h = Harness::new();
    h.ring("p0").ring("p1");
    let mut red = BridgeConfig::new("red");
    red.mac_limit = 10;
    let mut p0 = PortConfig::access("p0", "red");
    p0.mac_limit = 4;
    h.apply(SwitchConfig {
        bridges: vec![red],
        ports: vec![p0, PortConfig::access("p1", "red")],
        vtep: None,
    })
    .unwrap();
    for i in 0..8 {
        h.send("p0", &frames::udp4(mac(500), mac(i + 1), ip(1), ip(2), 1, 2, 64));
    }
    for i in 0..8 {
        h.send("p1", &frames::udp4(mac(500), mac(i + 100), ip(1), ip(2), 1, 2, 64));
    }
    h.step();
    assert_eq!(h.switch.fdb().port_len(0), 4);
    assert_eq!(h.switch.fdb().bd_len(0), 10);
    let s = h.stats();
    assert_eq!(s.event(Event::LearnLimit), 6);
    // Frames are still forwarded (flooded) when learning is refused.
    assert_eq!(h.recv("p1").len(), 8);
}

#[test]
fn static_macs_do_not_move_and_need_membership() {
    let mut h = three_ports();
    let mut cfg = h.switch.snapshot().config.clone();
    cfg.bridges[0].static_macs.push(StaticMac {
        mac: mac(7),
        port: Some("p2".into()),
        remote: None,
    });
    h.apply(cfg.clone()).unwrap();
    h.send("p0", &frames::udp4(mac(9), mac(7), ip(7), ip(9), 1, 2, 64));
    h.step();
    h.recv_all();
    assert_eq!(h.stats().event(Event::StaticMoveRefused), 1);
    h.send("p1", &frames::udp4(mac(7), mac(8), ip(8), ip(7), 1, 2, 64));
    h.step();
    assert_eq!(h.recv("p2").len(), 1);
    cfg.bridges[0].static_macs[0].port = Some("nope".into());
    let e = h.apply(cfg).unwrap_err();
    assert!(e.to_string().contains("not in this bridge"), "{e}");
}

#[test]
fn port_security_allows_own_addresses_and_pairs_only() {
    let mut h = Harness::new();
    h.ring("pod").ring("net");
    let mut pod = PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]);
    pod.security
        .as_mut()
        .unwrap()
        .allowed_address_pairs
        .push(AddressPair { mac: "00:00:5e:00:01:07".parse().unwrap(), ip: Some(ip(100).into()) });
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![pod, PortConfig::access("net", "red")],
        vtep: None,
    })
    .unwrap();
    let vrrp = "00:00:5e:00:01:07".parse().unwrap();
    let good = [
        frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64),
        frames::udp4(mac(2), mac(1), Ipv4Addr::UNSPECIFIED, ip(2), 68, 67, 64),
        frames::arp_request(mac(1), ip(1), ip(2)),
        frames::udp4(mac(2), vrrp, ip(100), ip(2), 1, 2, 64),
        frames::eth(mac(2), mac(1), 0x88cc, &[0; 46]),
    ];
    let bad = [
        (frames::udp4(mac(2), mac(3), ip(1), ip(2), 1, 2, 64), DropReason::SecurityMac),
        (frames::udp4(mac(2), mac(1), ip(3), ip(2), 1, 2, 64), DropReason::SecurityIp),
        (frames::arp_request(mac(1), ip(3), ip(2)), DropReason::SecurityArp),
        (frames::udp4(mac(2), vrrp, ip(101), ip(2), 1, 2, 64), DropReason::SecurityIp),
    ];
    for f in &good {
        h.send("pod", f);
    }
    for (f, _) in &bad {
        h.send("pod", f);
    }
    // ARP whose sender hardware address differs from the Ethernet source.
    let mut spoof = frames::arp_request(mac(1), ip(1), ip(2));
    spoof[22..28].copy_from_slice(&mac(3).0);
    h.send("pod", &spoof);
    h.step();
    assert_eq!(h.recv("net").len(), good.len());
    let s = h.stats();
    for (_, r) in &bad {
        assert!(s.drop(*r) >= 1, "{r:?}");
    }
    assert_eq!(s.drop(DropReason::SecurityArp), 2);
    // Security applies to the pod port only.
    h.send("net", &frames::udp4(mac(1), mac(3), ip(3), ip(1), 1, 2, 64));
    h.step();
    assert_eq!(h.recv("pod").len(), 1);
}

/// A pod port's flows go through the exact-match cache, and nothing spoofed rides them: with
/// the pod's flow cached, frames with its MACs but another source IP, a non-IPv4 version, a
/// header too short for the check, or ARP from a foreign sender address are still dropped
/// for the reason the slow path gives, in the same bursts as cached good frames.
#[test]
fn spoofed_sources_never_ride_a_cached_flow() {
    let mut h = Harness::new();
    h.ring("pod").ring("net");
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]),
            PortConfig::access("net", "red"),
        ],
        vtep: None,
    })
    .unwrap();
    h.send("net", &frames::udp4(mac(1), mac(2), ip(2), ip(1), 1, 2, 64));
    h.step();
    h.recv("pod");
    let good = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64);
    for _ in 0..3 {
        h.send("pod", &good);
        h.step();
    }
    assert!(h.stats().event(Event::CacheHits) >= 1, "a pod port's flow is cached");
    let spoofed_ip = frames::udp4(mac(2), mac(1), ip(3), ip(2), 1, 2, 64);
    let mut not_v4 = good.clone();
    not_v4[14] = 0x65;
    let short = good[..30].to_vec();
    let mut arp = frames::arp_request(mac(1), ip(1), ip(2));
    arp[28..32].copy_from_slice(&ip(3).octets());
    for _ in 0..2 {
        for f in [&good, &spoofed_ip, &good, &not_v4, &short, &good, &arp] {
            h.send("pod", f);
        }
        h.step();
    }
    assert_eq!(h.recv("net").len(), 3 + 6, "the good frames, all of them");
    let s = h.stats();
    assert_eq!(
        s.drop(DropReason::SecurityIp),
        6,
        "spoofed source, IPv6 version, short header: {:?}",
        s.nonzero_drops()
    );
    assert_eq!(s.drop(DropReason::SecurityArp), 2);
    assert!(s.event(Event::CacheHits) >= 7, "good frames kept hitting");
}

#[test]
fn nd_guard_refuses_foreign_targets() {
    let mut h = Harness::new();
    h.ring("pod").ring("net");
    let me: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![
            PortConfig::pod("pod", "red", mac(1), &[me.into()]),
            PortConfig::access("net", "red"),
        ],
        vtep: None,
    })
    .unwrap();
    let other: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
    h.send("pod", &frames::na(mac(1), me, me, mac(2), other));
    h.send("pod", &frames::na(mac(1), me, "fd00::99".parse().unwrap(), mac(2), other));
    h.send(
        "pod",
        &frames::na(
            mac(1),
            "fd00::99".parse().unwrap(),
            "fd00::99".parse().unwrap(),
            mac(2),
            other,
        ),
    );
    h.step();
    assert_eq!(h.recv("net").len(), 1);
    assert_eq!(h.stats().drop(DropReason::SecurityNd), 1);
    assert_eq!(h.stats().drop(DropReason::SecurityIp), 1);
}

#[test]
fn arp_and_nd_suppression_answer_known_addresses() {
    let mut h = three_ports();
    let mut cfg = h.switch.snapshot().config.clone();
    cfg.bridges[0].arp_suppression = true;
    cfg.bridges[0].neighbors = vec![
        Neighbor { ip: ip(2).into(), mac: mac(2) },
        Neighbor { ip: "fd00::2".parse().unwrap(), mac: mac(2) },
    ];
    h.apply(cfg).unwrap();
    h.send("p0", &frames::arp_request(mac(1), ip(1), ip(2)));
    h.step();
    let out = h.recv_all();
    assert!(out["p1"].is_empty() && out["p2"].is_empty(), "answered, not flooded");
    assert_eq!(out["p0"], vec![frames::arp_reply(mac(1), mac(2), ip(2), ip(1))]);
    // Unknown target and gratuitous ARP flood.
    h.send("p0", &frames::arp_request(mac(1), ip(1), ip(3)));
    h.send("p0", &frames::arp_request(mac(1), ip(1), ip(1)));
    h.step();
    assert_eq!(h.recv("p1").len(), 2);
    let (me, peer): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
        ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    h.send("p0", &frames::ns(mac(1), me, peer));
    h.step();
    let out = h.recv_all();
    assert_eq!(out["p0"], vec![frames::na(mac(2), peer, peer, mac(1), me)]);
    assert!(out["p1"].is_empty());
    let s = h.stats();
    assert_eq!((s.event(Event::ArpSuppressed), s.event(Event::NdSuppressed)), (1, 1));
}

/// ARP to the gateway's MAC that suppression does not answer (a reply) is forwarded to the
/// gateway's port, but never cached: the next frame with the same key may be a request,
/// which the switch answers, from whichever cache — the exact-match cache or the second
/// level — would otherwise have replayed the reply's decision.
#[test]
fn unanswered_arp_to_the_gateway_is_never_cached() {
    for (emc_entries, megaflow_entries) in [(1 << 10, 0), (0, 1 << 10), (1 << 10, 1 << 10)] {
        let host = mac(0xfe);
        let mut h = Harness::with_pool(
            vswitch::Pool::new(2048, false).unwrap(),
            vswitch::SwitchOptions { emc_entries, megaflow_entries, ..Default::default() },
        );
        h.ring("p0").ring("p1").ring_with_mac("host", Some(host));
        let gw = GatewayConfig { ips: vec![ip(1).into()], mac: None, port: "host".into() };
        h.apply(SwitchConfig {
            bridges: vec![BridgeConfig { gateway: Some(gw), ..BridgeConfig::new("red") }],
            ports: vec![
                PortConfig::access("p0", "red"),
                PortConfig::access("p1", "red"),
                PortConfig::access("host", "red"),
            ],
            vtep: None,
        })
        .unwrap();
        let gw_mac = vswitch::wire::MacAddr([0x0a, 0x58, 192, 0, 2, 1]);
        let outside = Ipv4Addr::new(203, 0, 113, 2);
        // mac(2) behind p1; from p0, mac(1) and mac(3) send IPv4 to the gateway (known
        // unicast, cached) and ARP replies to it and to mac(2): every half a request from
        // mac(1) to the gateway could combine is known.
        h.send("p1", &frames::udp4(mac(1), mac(2), ip(11), ip(10), 1, 2, 64));
        h.step();
        for _ in 0..3 {
            h.send("p0", &frames::udp4(gw_mac, mac(1), ip(10), outside, 1, 2, 64));
            h.send("p0", &frames::udp4(gw_mac, mac(3), ip(12), outside, 1, 2, 64));
            h.send("p0", &frames::arp_reply(gw_mac, mac(3), ip(12), ip(1)));
            h.send("p0", &frames::arp_reply(gw_mac, mac(1), ip(10), ip(1)));
            h.send("p0", &frames::arp_reply(mac(2), mac(1), ip(10), ip(11)));
            h.step();
        }
        h.recv_all();
        let mut probe = frames::arp_request(mac(1), ip(10), ip(1));
        probe[..6].copy_from_slice(&gw_mac.0);
        h.send("p0", &probe);
        h.step();
        let out = h.recv_all();
        assert_eq!(
            out["p0"],
            vec![frames::arp_reply(mac(1), gw_mac, ip(1), ip(10))],
            "caches ({emc_entries}, {megaflow_entries}): answered, not replayed"
        );
        assert!(out["host"].is_empty(), "not handed to the host");
    }
}

/// A distributed gateway: the switch answers ARP for it with its MAC; frames to that MAC go
/// to the gateway's port addressed to the port's own MAC, every time (the cache's hits
/// too); pod-to-pod frames stay switched; a port without a MAC, or not in the bridge, is
/// refused as the gateway's port.
#[test]
fn a_gateway_is_answered_and_its_frames_reach_its_port_addressed_to_the_port() {
    let host = mac(0xfe);
    let mut h = Harness::new();
    h.ring("p0").ring("p1").ring_with_mac("host", Some(host)).ring("nomac");
    let gw = GatewayConfig { ips: vec![ip(1).into()], mac: None, port: "host".into() };
    let mut cfg = SwitchConfig {
        bridges: vec![
            BridgeConfig { gateway: Some(gw.clone()), ..BridgeConfig::new("red") },
            BridgeConfig::new("blue"),
        ],
        ports: vec![
            PortConfig::access("p0", "red"),
            PortConfig::access("p1", "red"),
            PortConfig::access("host", "red"),
            PortConfig::access("nomac", "blue"),
        ],
        vtep: None,
    };
    h.apply(cfg.clone()).unwrap();
    let gw_mac = vswitch::wire::MacAddr([0x0a, 0x58, 192, 0, 2, 1]);
    assert_eq!(
        gw.mac(),
        Some(gw_mac),
        "derived from the address, as the manager derives pods' MACs"
    );

    h.send("p0", &frames::arp_request(mac(1), ip(10), ip(1)));
    h.step();
    let out = h.recv_all();
    assert_eq!(
        out["p0"],
        vec![frames::arp_reply(mac(1), gw_mac, ip(1), ip(10))],
        "answered by the switch"
    );
    assert!(out["p1"].is_empty() && out["host"].is_empty(), "not flooded");
    // A pod confirming its entry asks the gateway's MAC itself: answered the same, not
    // handed to the host (which does not hold the gateway's address).
    let mut probe = frames::arp_request(mac(1), ip(10), ip(1));
    probe[..6].copy_from_slice(&gw_mac.0);
    h.send("p0", &probe);
    h.step();
    let out = h.recv_all();
    assert_eq!(
        out["p0"],
        vec![frames::arp_reply(mac(1), gw_mac, ip(1), ip(10))],
        "a unicast probe is answered"
    );
    assert!(out["host"].is_empty(), "and not handed to the host");

    // The pod behind p1 is known before p0 talks to it (else its frame floods, to the host too).
    h.send("p1", &frames::udp4(mac(1), mac(2), ip(11), ip(10), 1000, 53, 100));
    h.step();
    h.recv_all();
    for _ in 0..3 {
        h.send(
            "p0",
            &frames::udp4(gw_mac, mac(1), ip(10), Ipv4Addr::new(203, 0, 113, 2), 1000, 53, 100),
        );
        h.send("p0", &frames::udp4(mac(2), mac(1), ip(10), ip(11), 1000, 53, 100));
        h.step();
        let out = h.recv_all();
        let to_host =
            frames::udp4(host, mac(1), ip(10), Ipv4Addr::new(203, 0, 113, 2), 1000, 53, 100);
        assert_eq!(out["host"], vec![to_host], "addressed to the port's own MAC");
        assert!(
            out["p1"].iter().all(|f| f[..6] != gw_mac.0),
            "the gateway's frames go nowhere else"
        );
    }
    let reply = frames::udp4(mac(1), host, Ipv4Addr::new(203, 0, 113, 2), ip(10), 53, 1000, 100);
    h.send("host", &reply);
    h.step();
    assert_eq!(h.recv("p0"), vec![reply], "the host's replies are switched to the pod");

    // An IPv6 gateway has a link-local address, as a router does (derived from its MAC:
    // the same on every node), answered like its global one; none without IPv6.
    assert_eq!(gw.link_local(), None, "no IPv6, no link-local address");
    let gw6 = GatewayConfig { ips: vec![ip(1).into(), "fd00::1".parse().unwrap()], ..gw.clone() };
    let ll: std::net::Ipv6Addr = "fe80::858:c0ff:fe00:201".parse().unwrap();
    assert_eq!(gw6.link_local(), Some(ll), "modified EUI-64 of {gw_mac}");
    assert_eq!(
        GatewayConfig {
            ips: vec!["fd00::1".parse().unwrap(), "fe80::1".parse().unwrap()],
            ..gw.clone()
        }
        .link_local(),
        None,
        "one given"
    );
    cfg.bridges[0].gateway = Some(gw6);
    h.apply(cfg.clone()).unwrap();
    let pod6: std::net::Ipv6Addr = "fd00::10".parse().unwrap();
    for target in [ll, "fd00::1".parse().unwrap()] {
        h.send("p0", &frames::ns(mac(1), pod6, target));
        h.step();
        let out = h.recv_all();
        assert_eq!(
            out["p0"],
            vec![frames::router_na(gw_mac, target, target, mac(1), pod6)],
            "{target} answered, as a router"
        );
        assert!(out["host"].is_empty() && out["p1"].is_empty(), "{target}: not flooded");
    }
    cfg.bridges[0].gateway = Some(gw.clone());
    h.apply(cfg.clone()).unwrap();

    cfg.bridges[0].gateway = Some(GatewayConfig { port: "nomac".into(), ..gw.clone() });
    let e = h.apply(cfg.clone()).unwrap_err().to_string();
    assert!(e.contains("not an access port of this bridge"), "{e}");
    cfg.ports[3] = PortConfig::access("nomac", "red");
    let e = h.apply(cfg.clone()).unwrap_err().to_string();
    assert!(e.contains("no MAC of its own"), "{e}");
    cfg.bridges[0].gateway = Some(GatewayConfig { ips: vec![], mac: None, port: "host".into() });
    let e = h.apply(cfg).unwrap_err().to_string();
    assert!(e.contains("needs at least one address"), "{e}");
}

#[test]
fn buffers_return_to_the_pool() {
    let mut h = three_ports();
    let before = h.pool.free_count();
    for i in 0..200u32 {
        h.send("p0", &frames::udp4(mac(1000 + i % 7), mac(1), ip(1), ip(2), 1, 2, 64 + i as usize));
        h.send("p1", &frames::udp4(mac(1), mac(1000 + i % 7), ip(2), ip(1), 1, 2, 1400));
    }
    h.step();
    h.recv_all();
    h.flush_caches();
    assert_eq!(h.pool.free_count(), before);
}

#[test]
fn flush_per_bridge_and_per_port() {
    let mut h = Harness::new();
    for p in ["p0", "p1", "p2"] {
        h.ring(p);
    }
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red"), BridgeConfig::new("blue")],
        ports: vec![
            PortConfig::access("p0", "red"),
            PortConfig::access("p1", "red"),
            PortConfig::access("p2", "blue"),
        ],
        vtep: None,
    })
    .unwrap();
    for (p, m) in [("p0", 1), ("p0", 2), ("p1", 3), ("p2", 4)] {
        h.send(p, &frames::udp4(mac(99), mac(m), ip(1), ip(2), 1, 2, 64));
    }
    h.step();
    assert_eq!(h.switch.fdb().len(), 4);
    assert_eq!(h.switch.flush_port("p0"), Some(2));
    assert_eq!(h.switch.flush_bridge("blue"), Some(1));
    assert_eq!(h.switch.flush_bridge("nope"), None);
    let left = h.switch.fdb().dump();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].mac, mac(3));
}

#[test]
fn port_security_can_be_switched_off() {
    let mut h = Harness::new();
    h.ring("pod").ring("net");
    let mut pod = PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]);
    pod.security.as_mut().unwrap().enabled = false;
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![pod, PortConfig::access("net", "red")],
        vtep: None,
    })
    .unwrap();
    h.send("pod", &frames::udp4(mac(2), mac(5), ip(5), ip(2), 1, 2, 64));
    h.step();
    assert_eq!(h.recv("net").len(), 1);
}

#[test]
fn pool_exhaustion_during_flooding_is_counted_not_fatal() {
    // 64 buffers, 16 ports: a burst of broadcasts needs far more copies than the pool holds.
    let pool = vswitch::Pool::new(64, false).unwrap();
    let mut h = Harness::with_pool(pool, vswitch::SwitchOptions::default());
    let names: Vec<String> = (0..16).map(|i| format!("p{i}")).collect();
    for n in &names {
        h.ring(n);
    }
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: names.iter().map(|n| PortConfig::access(n, "red")).collect(),
        vtep: None,
    })
    .unwrap();
    for i in 0..8 {
        h.send(
            "p0",
            &frames::udp4(vswitch::wire::MacAddr::BROADCAST, mac(i + 1), ip(1), ip(255), 1, 2, 64),
        );
    }
    h.step();
    let delivered: usize = h.recv_all().values().map(Vec::len).sum();
    let s = h.stats();
    assert!(s.event(Event::FloodCopyFailed) > 0, "the pool ran dry");
    assert_eq!(
        delivered as u64 + s.drop(DropReason::NoBuffer),
        8 * 15,
        "every copy delivered or counted"
    );
    h.flush_caches();
    assert_eq!(h.pool.free_count(), h.pool.capacity() as usize, "nothing leaked");
}
