//! VXLAN: encapsulation and decapsulation byte-exact over IPv4 and IPv6 underlays, decap
//! admission (VNI, flood list, flags, checksum), split horizon, remote learning, MTU, two
//! switches back to back with VNI isolation, and flooding to access, trunk and VXLAN at once.

use std::net::{IpAddr, Ipv4Addr};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::port::ring::RingPort;
use vswitch::testkit::{Harness, assert_frames, frames, frames::Outer, mac};
use vswitch::wire::MacAddr;
use vswitch::{DropReason, Event, Pool, SwitchOptions};

const UP_MAC: u32 = 0xa0;
const PEER_MAC: u32 = 0xb0;

fn local4() -> IpAddr {
    "198.51.100.1".parse().unwrap()
}
fn peer4(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 51, 100, n))
}
fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

/// Pods a1, a2 in red (VNI 5001, peers .2 and .3), b1 in blue (VNI 5002, peer .3 only),
/// trunk t carrying red as VLAN 100; underlay ring "up".
fn setup(local: IpAddr, peers: [IpAddr; 2], mtu: u16) -> Harness {
    setup_with(local, peers, mtu, SwitchOptions::default())
}

fn setup_with(local: IpAddr, peers: [IpAddr; 2], mtu: u16, opts: SwitchOptions) -> Harness {
    let mut h = Harness::with_pool(Pool::new(16384, false).expect("buffer pool"), opts);
    h.ring("a1").ring("a2").ring("b1").ring("t").ring_with_mac("up", Some(mac(UP_MAC)));
    let mut up = PortConfig::underlay("up");
    up.mtu = mtu;
    let mut a1 = PortConfig::access("a1", "red");
    a1.mtu = 9000;
    let mut a2 = PortConfig::access("a2", "red");
    a2.mtu = 9000;
    let mut t = PortConfig::trunk("t", &[100], None);
    t.mtu = 9000;
    let vtep = VtepConfig::new(local, "up")
        .peer(peers[0], mac(PEER_MAC))
        .peer(peers[1], mac(PEER_MAC + 1));
    h.apply(SwitchConfig {
        bridges: vec![
            BridgeConfig::new("red").vlan(100).vni(5001).flood(&peers),
            BridgeConfig::new("blue").vni(5002).flood(&peers[1..]),
        ],
        ports: vec![a1, a2, PortConfig::access("b1", "blue"), t, up],
        vtep: Some(vtep),
    })
    .unwrap();
    h
}

fn outer(local: IpAddr, peer: IpAddr, next_hop: MacAddr, sport: u16) -> Outer {
    Outer {
        dst_mac: next_hop,
        src_mac: mac(UP_MAC),
        src: local,
        dst: peer,
        sport,
        dport: 4789,
        vlan: None,
    }
}

fn sport_of(frame: &[u8], v4: bool) -> u16 {
    let l4 = 14 + if v4 { 20 } else { 40 };
    u16::from_be_bytes([frame[l4], frame[l4 + 1]])
}

fn encap_byte_exact(local: IpAddr, peers: [IpAddr; 2]) {
    let mut h = setup(local, peers, 1500);
    let inner = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 100);
    h.send("a1", &inner);
    h.step();
    let out = h.recv("up");
    assert_eq!(out.len(), 2, "head-end replication to both peers of red");
    for (i, f) in out.iter().enumerate() {
        let sport = sport_of(f, local.is_ipv4());
        assert!(sport >= 49152, "source port {sport} in the dynamic range");
        let want = frames::vxlan(
            &outer(local, peers[i], mac(PEER_MAC + i as u32), sport),
            5001,
            &inner,
            false,
        );
        assert_eq!(f, &want, "copy {i} byte-exact");
    }
    assert_eq!(
        sport_of(&out[0], local.is_ipv4()),
        sport_of(&out[1], local.is_ipv4()),
        "one flow, one port"
    );
}

#[test]
fn encap_ipv4_byte_exact() {
    encap_byte_exact(local4(), [peer4(2), peer4(3)]);
}

#[test]
fn encap_ipv6_byte_exact_with_udp_checksum() {
    encap_byte_exact(
        "2001:db8::1".parse().unwrap(),
        ["2001:db8::2".parse().unwrap(), "2001:db8::3".parse().unwrap()],
    );
}

#[test]
fn flows_spread_over_source_ports() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    for i in 0..64u16 {
        h.send("a1", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000 + i, 2000, 100));
    }
    h.step();
    let ports: std::collections::BTreeSet<u16> =
        h.recv("up").iter().map(|f| sport_of(f, true)).collect();
    assert!(ports.len() > 32, "64 flows use many source ports, got {}", ports.len());
}

fn decap(local: IpAddr, peers: [IpAddr; 2]) {
    let mut h = setup(local, peers, 1500);
    let inner = frames::udp4(mac(1), mac(7), ip(7), ip(1), 1, 2, 80);
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peers[0],
        dst: local,
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    h.send("up", &frames::vxlan(&o, 5001, &inner, false));
    h.step();
    let out = h.recv_all();
    assert_eq!(out["a1"], vec![inner.clone()]);
    assert_eq!(out["a2"], vec![inner.clone()]);
    assert_eq!(out["t"], vec![frames::add_tag(&inner, 0x8100, 100)]);
    assert!(out["up"].is_empty(), "split horizon: never tunnel to tunnel");
    assert!(out["b1"].is_empty());
    // mac(7) was learned behind peer 0: the answer goes only there.
    h.send("a1", &frames::udp4(mac(7), mac(1), ip(1), ip(7), 2, 1, 80));
    h.step();
    let up = h.recv("up");
    assert_eq!(up.len(), 1);
    let dst_ip_at = 14 + if local.is_ipv4() { 16 } else { 24 };
    let want: Vec<u8> = match peers[0] {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    assert_eq!(&up[0][dst_ip_at..dst_ip_at + want.len()], &want[..]);
    assert_eq!(h.stats().event(Event::Decapsulated), 1);
}

#[test]
fn decap_ipv4_learns_and_obeys_split_horizon() {
    decap(local4(), [peer4(2), peer4(3)]);
}

#[test]
fn decap_ipv6() {
    decap(
        "2001:db8::1".parse().unwrap(),
        ["2001:db8::2".parse().unwrap(), "2001:db8::3".parse().unwrap()],
    );
}

#[test]
fn decap_refuses_what_it_must() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    let inner = frames::udp4(mac(1), mac(7), ip(7), ip(1), 1, 2, 80);
    let o = |src: IpAddr, dst: IpAddr, dport: u16| Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src,
        dst,
        sport: 50000,
        dport,
        vlan: None,
    };
    let cases: Vec<(Vec<u8>, DropReason)> = vec![
        (
            frames::vxlan(&o(peer4(9), local4(), 4789), 5001, &inner, false),
            DropReason::VxlanUnknownVtep,
        ),
        // .2 is a peer, but not in blue's flood list.
        (
            frames::vxlan(&o(peer4(2), local4(), 4789), 5002, &inner, false),
            DropReason::VxlanUnknownVtep,
        ),
        (
            frames::vxlan(&o(peer4(2), local4(), 4789), 7777, &inner, false),
            DropReason::VxlanUnknownVni,
        ),
        (
            frames::vxlan(&o(peer4(2), peer4(50), 4789), 5001, &inner, false),
            DropReason::UnderlayNotVxlan,
        ),
        (
            frames::vxlan(&o(peer4(2), local4(), 4790), 5001, &inner, false),
            DropReason::UnderlayNotVxlan,
        ),
        (
            {
                let mut f = frames::vxlan(&o(peer4(2), local4(), 4789), 5001, &inner, false);
                f[14 + 28] = 0; // VXLAN flags without I
                f
            },
            DropReason::VxlanBadFlags,
        ),
        (
            {
                let mut f = frames::vxlan(&o(peer4(2), local4(), 4789), 5001, &inner, false);
                f[14 + 8] ^= 1; // TTL changed, checksum not
                f
            },
            DropReason::VxlanBadChecksum,
        ),
        (
            {
                let f = frames::vxlan(&o(peer4(2), local4(), 4789), 5001, &inner, false);
                f[..60].to_vec()
            },
            DropReason::VxlanMalformed,
        ),
        (
            frames::udp4(mac(UP_MAC), mac(PEER_MAC), ip(1), ip(2), 1, 2, 64),
            DropReason::UnderlayNotVxlan,
        ),
    ];
    for (f, _) in &cases {
        h.send("up", f);
    }
    h.step();
    assert!(h.recv_all().values().all(Vec::is_empty));
    let s = h.stats();
    let mut want = std::collections::BTreeMap::new();
    for (_, r) in &cases {
        *want.entry(r.name()).or_insert(0u64) += 1;
    }
    let got: std::collections::BTreeMap<_, _> = s.nonzero_drops().into_iter().collect();
    assert_eq!(got, want);
}

#[test]
fn encap_too_big_is_dropped_and_overhead_reported() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    // 1464-byte inner frame + 36 bytes of IP/UDP/VXLAN = 1500: fits; one more byte does not.
    h.send("a1", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 1464));
    h.send("a1", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 1465));
    h.step();
    assert_eq!(h.recv("up").len(), 2, "first frame to both peers");
    assert_eq!(h.stats().drop(DropReason::EncapTooBig), 2);
    let v = VtepConfig::new(local4(), "up");
    assert_eq!(v.overhead(), 50);
    let mut v6 = VtepConfig::new("2001:db8::1".parse().unwrap(), "up");
    v6.underlay_vlan = Some(7);
    assert_eq!(v6.overhead(), 74);
}

#[test]
fn jumbo_frame_is_encapsulated_and_decapsulated_byte_exact() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 9198);
    let inner = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 9000);
    h.send("a1", &inner);
    h.step();
    let out = h.recv_all();
    assert_frames(&out["a2"], std::slice::from_ref(&inner));
    assert_frames(&out["t"], &[frames::add_tag(&inner, 0x8100, 100)]);
    let up = &out["up"];
    assert_eq!(up.len(), 2);
    let want = frames::vxlan(
        &outer(local4(), peer4(2), mac(PEER_MAC), sport_of(&up[0], true)),
        5001,
        &inner,
        false,
    );
    assert_frames(&up[..1], &[want]);
    // And back in.
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peer4(2),
        dst: local4(),
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let back = frames::udp4(mac(1), mac(9), ip(9), ip(1), 1, 2, 9000);
    h.send("up", &frames::vxlan(&o, 5001, &back, false));
    h.step();
    assert_frames(&h.recv("a1"), &[back]);
    h.flush_caches();
}

#[test]
fn two_switches_carry_two_vnis_in_isolation() {
    let pool = Pool::new(16384, false).unwrap();
    let (ua, ub) = RingPort::patch("up", "up", 1024).unwrap();
    let mut sw = Vec::new();
    for (i, up) in [(1u8, ua), (2u8, ub)] {
        let mut h = Harness::with_pool(pool.clone(), SwitchOptions::default());
        h.register("up", up.with_mac(mac(0xa0 + i as u32)));
        h.ring("red").ring("blue");
        let other = if i == 1 { 2 } else { 1 };
        h.apply(SwitchConfig {
            bridges: vec![
                BridgeConfig::new("red").vni(1).flood(&[peer4(other)]),
                BridgeConfig::new("blue").vni(2).flood(&[peer4(other)]),
            ],
            ports: vec![
                PortConfig::access("red", "red"),
                PortConfig::access("blue", "blue"),
                PortConfig::underlay("up"),
            ],
            vtep: Some(
                VtepConfig::new(peer4(i), "up").peer(peer4(other), mac(0xa0 + other as u32)),
            ),
        })
        .unwrap();
        sw.push(h);
    }
    let (mut a, mut b) = (sw.remove(0), sw.remove(0));
    let red = frames::udp4(mac(0x2), mac(0x1), ip(1), ip(2), 1, 2, 64);
    let blue = frames::udp4(mac(0x4), mac(0x3), ip(3), ip(4), 1, 2, 64);
    a.send("red", &red);
    a.send("blue", &blue);
    a.step();
    b.step();
    assert_eq!(b.recv("red"), vec![red.clone()]);
    assert_eq!(b.recv("blue"), vec![blue.clone()]);
    // Replies are unicast back over the tunnel, each in its own VNI.
    let red_back = frames::udp4(mac(0x1), mac(0x2), ip(2), ip(1), 2, 1, 64);
    b.send("red", &red_back);
    b.step();
    a.step();
    assert_eq!(a.recv("red"), vec![red_back]);
    assert!(a.recv("blue").is_empty(), "a red frame never appears in blue");
    assert_eq!(a.stats().event(Event::Encapsulated), 2);
    assert_eq!(b.stats().event(Event::Decapsulated), 2);
}

#[test]
fn remote_learning_can_be_switched_off() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    let mut cfg = h.switch.snapshot().config.clone();
    cfg.bridges[0].remote_learning = false;
    h.apply(cfg).unwrap();
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peer4(2),
        dst: local4(),
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    h.send(
        "up",
        &frames::vxlan(&o, 5001, &frames::udp4(mac(1), mac(7), ip(7), ip(1), 1, 2, 80), false),
    );
    h.step();
    h.recv_all();
    assert!(h.switch.fdb().dump().is_empty());
}

#[test]
fn flood_reaches_access_trunk_and_vxlan_at_once_byte_exact() {
    for size in [60usize, 300, 1400] {
        let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
        let f = frames::udp4(MacAddr::BROADCAST, mac(1), ip(1), ip(255), 67, 68, size);
        h.send("a1", &f);
        h.step();
        let out = h.recv_all();
        assert_frames(&out["a2"], std::slice::from_ref(&f));
        assert_frames(&out["t"], &[frames::add_tag(&f, 0x8100, 100)]);
        let up = &out["up"];
        let sport = sport_of(&up[0], true);
        let want: Vec<Vec<u8>> = (0..2)
            .map(|i| {
                frames::vxlan(
                    &outer(local4(), peer4(2 + i as u8), mac(PEER_MAC + i), sport),
                    5001,
                    &f,
                    false,
                )
            })
            .collect();
        assert_frames(up, &want);
        assert!(out["a1"].is_empty() && out["b1"].is_empty());
        h.flush_caches();
    }
}

#[test]
fn ipv6_zero_checksum_and_tagged_underlay() {
    let local: IpAddr = "2001:db8::1".parse().unwrap();
    let peers: [IpAddr; 2] = ["2001:db8::2".parse().unwrap(), "2001:db8::3".parse().unwrap()];
    let mut h = setup(local, peers, 1500);
    let mut cfg = h.switch.snapshot().config.clone();
    let vtep = cfg.vtep.as_mut().unwrap();
    vtep.ipv6_zero_checksum = true;
    vtep.underlay_vlan = Some(7);
    h.apply(cfg).unwrap();
    let inner = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 100);
    h.send("a1", &inner);
    h.step();
    let out = h.recv("up");
    assert_eq!(out.len(), 2);
    let l4 = 18 + 40;
    let sport = u16::from_be_bytes([out[0][l4], out[0][l4 + 1]]);
    let mut o = outer(local, peers[0], mac(PEER_MAC), sport);
    o.vlan = Some(7);
    assert_frames(&out[..1], &[frames::vxlan(&o, 5001, &inner, true)]);
    // And a tagged underlay frame with a zero checksum decapsulates.
    let back = frames::udp4(mac(1), mac(9), ip(9), ip(1), 1, 2, 80);
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peers[0],
        dst: local,
        sport: 50000,
        dport: 4789,
        vlan: Some(7),
    };
    h.send("up", &frames::vxlan(&o, 5001, &back, true));
    // A frame tagged for another underlay VLAN is not ours.
    let wrong = Outer { vlan: Some(8), ..o };
    h.send("up", &frames::vxlan(&wrong, 5001, &back, true));
    h.step();
    assert_frames(&h.recv("a1"), &[back]);
    assert_eq!(h.stats().drop(DropReason::UnderlayNotVxlan), 1);
}

#[test]
fn custom_udp_port_and_source_range() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    let mut cfg = h.switch.snapshot().config.clone();
    let vtep = cfg.vtep.as_mut().unwrap();
    vtep.udp_port = 8472;
    vtep.src_port_min = 40000;
    vtep.src_port_max = 40009;
    h.apply(cfg).unwrap();
    for i in 0..50u16 {
        h.send("a1", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000 + i, 2000, 100));
    }
    h.step();
    for f in h.recv("up") {
        let sport = sport_of(&f, true);
        assert!((40000..=40009).contains(&sport), "{sport}");
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 8472);
    }
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peer4(2),
        dst: local4(),
        sport: 1,
        dport: 4789,
        vlan: None,
    };
    h.send(
        "up",
        &frames::vxlan(&o, 5001, &frames::udp4(mac(1), mac(9), ip(9), ip(1), 1, 2, 80), false),
    );
    h.step();
    assert!(h.recv("a1").is_empty(), "4789 is no longer ours");
}

#[test]
fn vtep_answers_arp_and_nd_for_its_own_address() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    let req = frames::arp_request(
        mac(PEER_MAC),
        Ipv4Addr::new(198, 51, 100, 2),
        Ipv4Addr::new(198, 51, 100, 1),
    );
    h.send("up", &req);
    let other = frames::arp_request(
        mac(PEER_MAC),
        Ipv4Addr::new(198, 51, 100, 2),
        Ipv4Addr::new(198, 51, 100, 9),
    );
    h.send("up", &other);
    h.step();
    let want = frames::arp_reply(
        mac(PEER_MAC),
        mac(UP_MAC),
        Ipv4Addr::new(198, 51, 100, 1),
        Ipv4Addr::new(198, 51, 100, 2),
    );
    assert_frames(&h.recv("up"), &[want]);
    assert_eq!(h.stats().event(Event::VtepAnswered), 1);
    assert_eq!(
        h.stats().drop(DropReason::UnderlayNotVxlan),
        1,
        "someone else's address: not ours to answer"
    );
    // ICMP echo to the VTEP address is answered too.
    let (vt, pe) = (Ipv4Addr::new(198, 51, 100, 1), Ipv4Addr::new(198, 51, 100, 2));
    h.send("up", &frames::icmp_echo(mac(UP_MAC), mac(PEER_MAC), pe, vt, false, 61));
    h.step();
    assert_frames(
        &h.recv("up"),
        &[frames::icmp_echo(mac(PEER_MAC), mac(UP_MAC), vt, pe, true, 64)],
    );

    let local6: IpAddr = "2001:db8::1".parse().unwrap();
    let mut h =
        setup(local6, ["2001:db8::2".parse().unwrap(), "2001:db8::3".parse().unwrap()], 1500);
    let (me, them): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
        ("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap());
    h.send("up", &frames::ns(mac(PEER_MAC), them, me));
    h.step();
    assert_frames(&h.recv("up"), &[frames::na(mac(UP_MAC), me, me, mac(PEER_MAC), them)]);
}

/// Known-unicast VXLAN flows are forwarded from the exact-match cache in both directions,
/// byte-exact (decapsulated to an access port and to a trunk, encapsulated with the flow's
/// source port), and the cache never answers for a frame the slow path would treat
/// differently (a bad checksum after a cached flow is still dropped).
#[test]
fn cached_vxlan_flows_both_ways() {
    let (local, peers) = (local4(), [peer4(2), peer4(3)]);
    let mut h = setup(local, peers, 1500);
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peers[0],
        dst: local,
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let to_a1 = frames::udp4(mac(1), mac(7), ip(7), ip(1), 1, 2, 80);
    let to_t = frames::udp4(mac(9), mac(7), ip(7), ip(9), 1, 2, 80);
    let from_a1 = frames::udp4(mac(7), mac(1), ip(1), ip(7), 2, 1, 80);
    // Learn mac(1) on a1, mac(9) on t and mac(7) behind peer 0.
    h.send("a1", &from_a1);
    h.send(
        "t",
        &frames::add_tag(&frames::udp4(mac(7), mac(9), ip(9), ip(7), 2, 1, 80), 0x8100, 100),
    );
    h.send("up", &frames::vxlan(&o, 5001, &to_a1, false));
    h.step();
    h.recv_all();
    let before = h.stats().event(Event::CacheHits);
    for _ in 0..3 {
        h.send("up", &frames::vxlan(&o, 5001, &to_a1, false));
        h.send("up", &frames::vxlan(&o, 5001, &to_t, false));
        h.send("a1", &from_a1);
        h.step();
    }
    let out = h.recv_all();
    assert_eq!(out["a1"], vec![to_a1.clone(); 3]);
    assert_eq!(out["t"], vec![frames::add_tag(&to_t, 0x8100, 100); 3]);
    assert_eq!(out["up"].len(), 3);
    let sport = sport_of(&out["up"][0], true);
    let want = frames::vxlan(&outer(local, peers[0], mac(PEER_MAC), sport), 5001, &from_a1, false);
    for f in &out["up"] {
        assert_eq!(f, &want);
    }
    assert!(
        h.stats().event(Event::CacheHits) - before >= 6,
        "both directions hit after the first round"
    );
    // A corrupted outer checksum on a cached flow is still dropped.
    let mut bad = frames::vxlan(&o, 5001, &to_a1, false);
    bad[24] ^= 0xff;
    h.send("up", &bad);
    h.step();
    assert!(h.recv("a1").is_empty());
    assert_eq!(h.stats().drop(DropReason::VxlanBadChecksum), 1);
}

/// An IPv4 VTEP ([`setup_with`]) where mac(1) was learned on a1 and mac(7), behind peer .2,
/// sent it `warmup` frames, one burst each (the flow cached from the second on): the
/// harness, peer .2's outer header towards the VTEP, and the inner frame.
fn flow_from_peer_to_a1(opts: SwitchOptions, warmup: usize) -> (Harness, Outer, Vec<u8>) {
    let (local, peers) = (local4(), [peer4(2), peer4(3)]);
    let mut h = setup_with(local, peers, 1500, opts);
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peers[0],
        dst: local,
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let to_a1 = frames::udp4(mac(1), mac(7), ip(7), ip(1), 1, 2, 80);
    h.send("a1", &frames::udp4(mac(7), mac(1), ip(1), ip(7), 2, 1, 80));
    for _ in 0..warmup {
        h.send("up", &frames::vxlan(&o, 5001, &to_a1, false));
        h.step();
    }
    h.recv_all();
    (h, o, to_a1)
}

/// A burst from the underlay is looked up before any of its frames is forwarded: an inner
/// frame that moves a MAC behind the peer must still decide for the cached frames after it.
#[test]
fn a_mac_move_inside_an_underlay_burst_applies_to_the_frames_after_it() {
    let (mut h, o, to_a1) = flow_from_peer_to_a1(SwitchOptions::default(), 2);
    let hits = h.stats().event(Event::CacheHits);
    assert_eq!(hits, 1, "the flow from peer .2 to a1 is cached");
    // mac(1) now speaks from behind peer .2, between two frames of the cached flow.
    let moved = frames::udp4(MacAddr::BROADCAST, mac(1), ip(1), ip(9), 2, 3, 80);
    for inner in [&to_a1, &moved, &to_a1] {
        h.send("up", &frames::vxlan(&o, 5001, inner, false));
    }
    h.step();
    assert_eq!(h.recv("a1"), vec![to_a1, moved]);
    let s = h.stats();
    assert_eq!((s.event(Event::MacMoved), s.drop(DropReason::Reflect)), (1, 1));
    assert_eq!(s.event(Event::CacheHits), hits + 1, "the frame after the move counts as no hit");
    assert_eq!(s.event(Event::Decapsulated), 5);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// The cached decapsulation (its outer header checks folded into a few word compares)
    /// decides as the full parser does: a frame of a cached flow with any bytes of its outer
    /// headers or the inner key changed, or cut short, or padded, is forwarded or dropped
    /// (for the same reason) by a switch with the cache exactly as by one without.
    #[test]
    fn cached_decapsulation_decides_as_the_parser(
        // Mostly the outer IPv4, UDP and VXLAN headers (bytes 12..50), which the checks cover.
        changes in proptest::collection::vec((proptest::prop_oneof![1 => 0..68usize, 3 => 12..50usize], 1..=255u8), 0..3),
        cut in proptest::option::of(0..120usize),
        pad in 0..8usize,
    ) {
        let run = |emc_entries: usize| {
            let (mut h, o, to_a1) = flow_from_peer_to_a1(SwitchOptions { emc_entries, megaflow_entries: emc_entries, ..SwitchOptions::default() }, 3);
            let mut f = frames::vxlan(&o, 5001, &to_a1, false);
            for (at, x) in &changes {
                f[*at] ^= x;
            }
            if let Some(n) = cut {
                f.truncate(n);
            }
            f.extend(std::iter::repeat_n(0, pad));
            // The changed frame, then the original: a refused frame must not disturb its flow.
            h.send("up", &f);
            h.send("up", &frames::vxlan(&o, 5001, &to_a1, false));
            h.step();
            let s = h.stats();
            let events: Vec<(&str, u64)> = Event::ALL.iter().filter(|e| !matches!(e, Event::CacheHits | Event::MegaflowHits)).map(|e| (e.name(), s.event(*e))).collect();
            (h.recv_all(), s.nonzero_drops(), events)
        };
        let (without, with) = (run(0), run(1 << 10));
        proptest::prop_assert_eq!(without, with);
    }
}

/// On a tagged underlay the VTEP answers ARP, neighbor solicitations and pings asked in
/// the underlay's VLAN, with the tag kept; asked in another VLAN, it does not.
#[test]
fn vtep_answers_on_a_tagged_underlay() {
    let tagged = |vlan: u16, f: &[u8]| frames::add_tag(f, 0x8100, vlan);
    for local in [local4(), "2001:db8::1".parse().unwrap()] {
        let peers: [IpAddr; 2] = if local.is_ipv4() {
            [peer4(2), peer4(3)]
        } else {
            ["2001:db8::2".parse().unwrap(), "2001:db8::3".parse().unwrap()]
        };
        let mut h = setup(local, peers, 1500);
        let mut cfg = h.switch.snapshot().config.clone();
        cfg.vtep.as_mut().unwrap().underlay_vlan = Some(7);
        h.apply(cfg).unwrap();
        let (asks, answer): (Vec<Vec<u8>>, Vec<Vec<u8>>) = match local {
            IpAddr::V4(me) => {
                let them = Ipv4Addr::new(198, 51, 100, 2);
                (
                    vec![
                        frames::arp_request(mac(PEER_MAC), them, me),
                        frames::icmp_echo(mac(UP_MAC), mac(PEER_MAC), them, me, false, 61),
                    ],
                    vec![
                        frames::arp_reply(mac(PEER_MAC), mac(UP_MAC), me, them),
                        frames::icmp_echo(mac(PEER_MAC), mac(UP_MAC), me, them, true, 64),
                    ],
                )
            }
            IpAddr::V6(me) => {
                let them: std::net::Ipv6Addr = "2001:db8::2".parse().unwrap();
                (
                    vec![frames::ns(mac(PEER_MAC), them, me)],
                    vec![frames::na(mac(UP_MAC), me, me, mac(PEER_MAC), them)],
                )
            }
        };
        for (ask, want) in asks.iter().zip(&answer) {
            h.send("up", &tagged(7, ask));
            h.send("up", &tagged(8, ask));
            h.step();
            assert_frames(&h.recv("up"), &[tagged(7, want)]);
        }
        assert_eq!(h.stats().event(Event::VtepAnswered), asks.len() as u64);
    }
}

/// Decapsulation only takes frames sent to the VTEP's MAC (or to a group address): a
/// VXLAN frame for this VTEP's address but to another host's MAC (a promiscuous underlay,
/// a bridge flooding an unknown unicast) is dropped as `underlay_foreign_mac`, off the
/// cached path and on it (a flow the exact-match cache knows, from a peer and VNI the
/// burst's decapsulation cache holds).
#[test]
fn decap_refuses_a_foreign_destination_mac() {
    let mut h = setup(local4(), [peer4(2), peer4(3)], 1500);
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peer4(2),
        dst: local4(),
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let foreign = Outer { dst_mac: mac(0x77), ..o };
    // a1 is known (mac 1); the remote pod's flow to it is one inner frame, again and again.
    h.send("a1", &frames::udp4(mac(9), mac(1), ip(1), ip(9), 2, 1, 64));
    h.step();
    h.recv_all();
    let inner = frames::udp4(mac(1), mac(9), ip(9), ip(1), 1, 2, 64);
    let good = frames::vxlan(&o, 5001, &inner, false);
    let bad = frames::vxlan(&foreign, 5001, &inner, false);
    // Cold: the foreign frame before and after a good one, in one burst.
    for f in [&bad, &good, &bad] {
        h.send("up", f);
    }
    h.step();
    assert_eq!(h.recv("a1").len(), 1);
    // Warm: the flow is cached; the foreign frame takes the cached path with the good ones.
    for f in [&good, &bad, &good, &bad] {
        h.send("up", f);
    }
    h.step();
    assert!(h.stats().event(Event::CacheHits) >= 2, "the warm burst hit the cache");
    assert_eq!(h.recv("a1").len(), 2);
    // A group destination is taken (an underlay that floods, a multicast group).
    h.send("up", &frames::vxlan(&Outer { dst_mac: MacAddr::BROADCAST, ..o }, 5001, &inner, false));
    h.step();
    assert_eq!(h.recv("a1"), vec![inner]);
    assert_eq!(
        h.stats().drop(DropReason::UnderlayForeignMac),
        4,
        "{:?}",
        h.stats().nonzero_drops()
    );
    h.flush_caches();
}

/// A VTEP with 10 000 peers (a VXLAN network across a large cluster): accepted; frames to and
/// from the 10 000th (an id the exact-match cache cannot name) are encapsulated and
/// decapsulated byte-exact, burst after burst, by the slow path; one peer more than
/// `MAX_PEERS` is refused with the number.
#[test]
fn ten_thousand_peers_are_served_and_one_too_many_refused() {
    let peer = |n: u32| IpAddr::V4(Ipv4Addr::from(0xc633_0000 + n)); // 198.51.0.0/16
    let local = local4();
    let config = |count: u32| {
        let mut vtep = VtepConfig::new(local, "up");
        for n in 1..=count {
            vtep = vtep.peer(peer(n), mac(PEER_MAC));
        }
        let far = peer(count);
        SwitchConfig {
            bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[far])],
            ports: vec![PortConfig::access("a1", "red"), PortConfig::underlay("up")],
            vtep: Some(vtep),
        }
    };
    let mut h =
        Harness::with_pool(Pool::new(16384, false).expect("buffer pool"), SwitchOptions::default());
    h.ring("a1").ring_with_mac("up", Some(mac(UP_MAC)));
    let too_many = vswitch::snapshot::MAX_PEERS as u32 + 1;
    assert_eq!(
        h.apply(config(too_many)).unwrap_err().to_string(),
        format!("too many VTEP peers (at most {})", too_many - 1)
    );
    h.apply(config(10_000)).unwrap();
    let far = peer(10_000);
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: far,
        dst: local,
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let to_a1 = frames::udp4(mac(1), mac(7), ip(7), ip(1), 1, 2, 80);
    let from_a1 = frames::udp4(mac(7), mac(1), ip(1), ip(7), 2, 1, 80);
    for round in 0..4 {
        h.send("up", &frames::vxlan(&o, 5001, &to_a1, false));
        h.send("a1", &from_a1);
        h.step();
        let out = h.recv_all();
        assert_eq!(
            out["a1"],
            vec![to_a1.clone()],
            "round {round}: decapsulated from the 10 000th peer"
        );
        assert_eq!(out["up"].len(), 1, "round {round}");
        let sport = sport_of(&out["up"][0], true);
        assert_eq!(
            out["up"][0],
            frames::vxlan(&outer(local, far, mac(PEER_MAC), sport), 5001, &from_a1, false),
            "round {round}"
        );
    }
}
