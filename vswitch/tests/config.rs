//! Configuration: whole-or-nothing validation with precise reasons, stable ids, learned
//! state kept across unrelated changes, and a swap under traffic that loses nothing.

use std::net::IpAddr;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::port::ring::RingPort;
use vswitch::testkit::{Harness, frames, mac};
use vswitch::{Batch, Pool, PoolCache, Switch, SwitchOptions};

fn base() -> SwitchConfig {
    SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vlan(10), BridgeConfig::new("blue").vlan(20)],
        ports: vec![
            PortConfig::access("p0", "red"),
            PortConfig::access("p1", "red"),
            PortConfig::access("p2", "blue"),
        ],
        vtep: None,
    }
}

fn harness() -> Harness {
    let mut h = Harness::new();
    for p in ["p0", "p1", "p2", "p3", "up"] {
        h.ring(p);
    }
    h.apply(base()).unwrap();
    h
}

#[test]
fn invalid_configurations_are_refused_whole_with_a_reason() {
    let mut h = harness();
    let before = h.switch.generation();
    let peer: IpAddr = "198.51.100.2".parse().unwrap();
    type Mutation = Box<dyn Fn(&mut SwitchConfig)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|c| c.bridges[1].vlan = Some(10)), "VLAN 10 is already used by bridge \"red\""),
        (Box::new(|c| c.bridges[1].vlan = Some(4095)), "out of range 1..=4094"),
        (Box::new(|c| c.bridges.push(BridgeConfig::new("red"))), "bridge \"red\" is defined twice"),
        (Box::new(|c| c.bridges[0].vni = Some(1 << 24)), "VNI 16777216 is out of range"),
        (
            Box::new(|c| {
                c.bridges[0].vni = Some(7);
                c.bridges[1].vni = Some(7);
            }),
            "VNI 7 is already used",
        ),
        (
            Box::new(|c| c.ports.push(PortConfig::access("ghost", "red"))),
            "port \"ghost\" is not registered",
        ),
        (
            Box::new(|c| c.ports.push(PortConfig::access("p3", "green"))),
            "bridge \"green\" does not exist",
        ),
        (Box::new(|c| c.ports.push(PortConfig::trunk("p3", &[0], None))), "VLAN 0 is out of range"),
        (Box::new(|c| c.ports[0].mtu = 10), "MTU 10 is out of range"),
        (Box::new(|c| c.ports[0].tpid = 0x1234), "TPID 0x1234"),
        (
            Box::new(|c| c.bridges[0].flood = vec!["198.51.100.2".parse().unwrap()]),
            "needs a VNI and a configured VTEP",
        ),
        (
            Box::new(|c| {
                c.ports.push(PortConfig::underlay("up"));
                c.ports.push(PortConfig::underlay("p3"));
                c.vtep = Some(VtepConfig {
                    mac: Some(mac(8)),
                    ..VtepConfig::new("198.51.100.1".parse().unwrap(), "up")
                });
            }),
            "port \"p3\" has mode underlay but the VTEP's underlay port is \"up\"",
        ),
        (
            Box::new(move |c| {
                c.ports.push(PortConfig::underlay("up"));
                let mut v =
                    VtepConfig::new("198.51.100.1".parse().unwrap(), "up").peer(peer, mac(9));
                v.mac = Some(mac(8));
                c.vtep = Some(v);
                c.bridges[0].vni = Some(5);
                c.bridges[0].flood = vec!["198.51.100.3".parse().unwrap()];
            }),
            "198.51.100.3 is not a peer",
        ),
        (
            Box::new(move |c| {
                c.ports.push(PortConfig::underlay("up"));
                c.vtep =
                    Some(VtepConfig::new("198.51.100.1".parse().unwrap(), "up").peer(peer, mac(9)));
            }),
            "no source MAC",
        ),
        (
            Box::new(move |c| {
                c.ports.push(PortConfig::underlay("up"));
                let mut v = VtepConfig::new("198.51.100.1".parse().unwrap(), "up")
                    .peer("2001:db8::2".parse().unwrap(), mac(9));
                v.mac = Some(mac(8));
                c.vtep = Some(v);
            }),
            "not of the local address's family",
        ),
        (
            Box::new(|c| {
                c.ports[0] = PortConfig::pod("p0", "red", vswitch::wire::MacAddr::BROADCAST, &[])
            }),
            "port security needs",
        ),
    ];
    for (i, (mutate, want)) in cases.iter().enumerate() {
        let mut c = base();
        mutate(&mut c);
        let e = h.apply(c).expect_err(&format!("case {i} must be refused"));
        assert!(e.to_string().contains(want), "case {i}: {e} (wanted {want:?})");
    }
    assert_eq!(h.switch.generation(), before, "nothing was published");
    assert_eq!(h.switch.snapshot().config, base());
}

#[test]
fn learned_state_of_untouched_bridges_survives_changes() {
    let mut h = harness();
    h.send(
        "p0",
        &frames::udp4(
            mac(9),
            mac(1),
            "192.0.2.1".parse().unwrap(),
            "192.0.2.9".parse().unwrap(),
            1,
            2,
            64,
        ),
    );
    h.send(
        "p2",
        &frames::udp4(
            mac(9),
            mac(2),
            "192.0.2.2".parse().unwrap(),
            "192.0.2.9".parse().unwrap(),
            1,
            2,
            64,
        ),
    );
    h.step();
    assert_eq!(h.switch.fdb().len(), 2);
    let red = h.switch.snapshot().bd_id("red").unwrap();
    // Add a port and a bridge: nothing is forgotten, ids stay.
    let mut c = base();
    c.bridges.push(BridgeConfig::new("green"));
    c.ports.push(PortConfig::access("p3", "green"));
    h.apply(c.clone()).unwrap();
    assert_eq!(h.switch.fdb().len(), 2);
    assert_eq!(h.switch.snapshot().bd_id("red"), Some(red));
    // Change blue's VLAN: blue's entries go, red's stay.
    c.bridges[1].vlan = Some(21);
    h.apply(c.clone()).unwrap();
    let left = h.switch.fdb().dump();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].bd, red);
    // Remove p0: its entries go.
    c.ports.remove(0);
    h.apply(c).unwrap();
    assert!(h.switch.fdb().is_empty());
    assert!(h.switch.unregister_port("p1").is_err(), "p1 is still configured");
    assert!(h.switch.unregister_port("p0").is_ok());
}

#[test]
fn config_from_yaml_like_json() {
    let json = r#"{
        "bridges": [{"name": "red", "vlan": 100, "vni": 5001, "flood": ["198.51.100.2"]}],
        "ports": [
            {"name": "pod1", "mode": {"kind": "access", "bridge": "red"},
             "security": {"macs": ["02:00:00:00:00:01"], "ips": ["192.0.2.1"]}},
            {"name": "uplink", "mode": {"kind": "trunk", "allowed": [100], "native": null}},
            {"name": "up", "mode": {"kind": "underlay"}, "mtu": 9000}
        ],
        "vtep": {"local_ip": "198.51.100.1", "underlay_port": "up", "mac": "02:00:00:00:00:aa",
                 "peers": [{"ip": "198.51.100.2", "next_hop_mac": "02:00:00:00:00:bb"}]}
    }"#;
    let c: SwitchConfig = serde_json::from_str(json).unwrap();
    assert_eq!(c.bridges[0].mac_age_secs, 300);
    assert!(c.ports[0].security.as_ref().unwrap().enabled);
    let mut h = Harness::new();
    h.ring("pod1").ring("uplink").ring("up");
    h.apply(c).unwrap();
    let bad = r#"{"bridges": [{"name": "red", "colour": "red"}]}"#;
    let e = serde_json::from_str::<SwitchConfig>(bad).unwrap_err();
    assert!(e.to_string().contains("unknown field `colour`"), "{e}");
}

/// Continuous traffic between two ports while 100 others are added and removed, with the
/// swaps published between the traffic's bursts, as PMD threads adopt them: zero loss.
#[test]
fn config_swap_under_traffic_loses_nothing_on_untouched_ports() {
    let pool = Pool::new(32768, false).unwrap();
    let switch = Switch::new(pool.clone(), SwitchOptions::default());
    let (a, mut pa) = RingPort::new("a", 1, 1024).unwrap();
    let (b, mut pb) = RingPort::new("b", 1, 1024).unwrap();
    switch.register_port("a", a).unwrap();
    switch.register_port("b", b).unwrap();
    let mut extra = Vec::new();
    for i in 0..100 {
        let name = format!("x{i}");
        let (p, peer) = RingPort::new(&name, 1, 64).unwrap();
        switch.register_port(&name, p).unwrap();
        extra.push((name, peer));
    }
    let cfg = |n: usize| SwitchConfig {
        bridges: vec![BridgeConfig::new("red"), BridgeConfig::new("other")],
        ports: [PortConfig::access("a", "red"), PortConfig::access("b", "red")]
            .into_iter()
            .chain(extra.iter().take(n).map(|(name, _)| PortConfig::access(name, "other")))
            .collect(),
        vtep: None,
    };
    switch.apply(cfg(0)).unwrap();
    let mut pipe = switch.pipeline(0);
    let mut cache = PoolCache::new(pool.clone());
    let (mut sent, mut got) = (0u64, 0u64);
    // Learn both MACs first so traffic is unicast.
    let fwd = frames::udp4(
        mac(2),
        mac(1),
        "192.0.2.1".parse().unwrap(),
        "192.0.2.2".parse().unwrap(),
        1,
        2,
        64,
    );
    let rev = frames::udp4(
        mac(1),
        mac(2),
        "192.0.2.2".parse().unwrap(),
        "192.0.2.1".parse().unwrap(),
        2,
        1,
        64,
    );
    let mut rx = Batch::new();
    for round in 0..400usize {
        for _ in 0..8 {
            pa.send_one(0, cache.alloc_frame(&fwd).unwrap()).unwrap();
            pb.send_one(0, cache.alloc_frame(&rev).unwrap()).unwrap();
            sent += 2;
        }
        if round % 2 == 0 {
            let n = (round / 2) % 101;
            switch.apply(cfg(n)).unwrap();
        }
        let snap = switch.snapshot();
        for &(p, q) in &snap.rxqs {
            while pipe.poll(&snap, p, q, &mut rx) > 0 {}
        }
        for peer in [&mut pa, &mut pb] {
            while peer.recv(0, &mut rx) > 0 {
                for x in rx.drain() {
                    got += 1;
                    cache.free(x);
                }
            }
        }
    }
    for (_, p) in &mut extra {
        p.drain(&mut cache);
    }
    assert_eq!(got, sent, "every frame between a and b arrived");
    let s = switch.stats();
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
}

/// The node API adds one object at a time, so an underlay port may come before its VTEP:
/// accepted, and what it receives until then is dropped and counted.
#[test]
fn an_underlay_port_may_come_before_its_vtep() {
    let mut h = harness();
    let mut cfg = base();
    cfg.ports.push(PortConfig::underlay("up"));
    h.apply(cfg).expect("an underlay port without a VTEP yet");
    h.send(
        "up",
        &frames::arp_request(
            mac(1),
            "198.51.100.2".parse().unwrap(),
            "198.51.100.1".parse().unwrap(),
        ),
    );
    h.step();
    assert_eq!(h.stats().drop(vswitch::DropReason::UnderlayNotVxlan), 1);
}

/// Ids are reused: a port added where another was removed counts from zero, and so does a
/// bridge domain.
#[test]
fn a_reused_id_counts_from_zero() {
    let mut h = harness();
    let f = frames::eth(mac(1), mac(2), 0x0800, &[0u8; 46]);
    h.send("p0", &f);
    h.step();
    let snap = h.switch.snapshot();
    let (p0, red) = (snap.port_id("p0").unwrap(), snap.bd_id("red").unwrap());
    assert_eq!(h.stats().ports[p0 as usize].rx_packets, 1);
    let mut cfg = base();
    cfg.ports.remove(0);
    cfg.bridges[0].name = "green".into();
    for p in &mut cfg.ports {
        if p.mode == (vswitch::config::PortMode::Access { bridge: "red".into() }) {
            p.mode = vswitch::config::PortMode::Access { bridge: "green".into() };
        }
    }
    cfg.ports.push(PortConfig::access("p3", "green"));
    h.apply(cfg).unwrap();
    let snap = h.switch.snapshot();
    assert_eq!(
        (snap.port_id("p3"), snap.bd_id("green")),
        (Some(p0), Some(red)),
        "the ids were reused"
    );
    let s = h.stats();
    assert_eq!((s.ports[p0 as usize].rx_packets, s.bds[red as usize].packets), (0, 0));
}

/// A change rebuilds only what it touches: the compiled bridge domains it leaves alone, and
/// the VTEP's peers while the VTEP stays the same, are the previous snapshot's own (shared,
/// not copied); what a change touches is compiled again, and static MACs are reinstalled
/// only when theirs change (an unrelated apply leaves the FDB's generation alone).
#[test]
fn a_change_rebuilds_only_what_it_touches() {
    use std::sync::Arc;
    use vswitch::config::StaticMac;
    let mut h = harness();
    let peer = |n: u8| -> IpAddr { format!("198.51.100.{n}").parse().unwrap() };
    let mut c = base();
    c.bridges[0] = c.bridges[0].clone().vni(5001).flood(&[peer(1)]);
    c.bridges[1].static_macs.push(StaticMac { mac: mac(7), port: Some("p2".into()), remote: None });
    c.ports.push(PortConfig::underlay("up"));
    let mut vtep = VtepConfig::new("192.0.2.1".parse().unwrap(), "up")
        .peer(peer(1), mac(51))
        .peer(peer(2), mac(52));
    vtep.mac = Some(mac(50));
    c.vtep = Some(vtep);
    h.apply(c.clone()).unwrap();
    let (red, blue) = {
        let s = h.switch.snapshot();
        (s.bd_id("red").unwrap() as usize, s.bd_id("blue").unwrap() as usize)
    };
    let shared = |a: &vswitch::snapshot::Snapshot, b: &vswitch::snapshot::Snapshot, bd: usize| {
        Arc::ptr_eq(a.bds[bd].as_ref().unwrap(), b.bds[bd].as_ref().unwrap())
    };

    // A port joins blue: red and the peers are shared, blue is rebuilt with its new member.
    let before = h.switch.snapshot();
    let fdb_generation = h.switch.fdb().generation();
    c.ports.push(PortConfig::access("p3", "blue"));
    h.apply(c.clone()).unwrap();
    let after = h.switch.snapshot();
    assert!(shared(&before, &after, red), "red untouched: shared");
    assert!(!shared(&before, &after, blue), "blue has a new member: rebuilt");
    assert_eq!(after.bd(blue as u16).unwrap().ports.len(), 2);
    assert!(
        Arc::ptr_eq(&before.peers, &after.peers)
            && Arc::ptr_eq(&before.peer_by_ip, &after.peer_by_ip)
    );
    assert_eq!(
        h.switch.fdb().generation(),
        fdb_generation,
        "static MACs left alone: the caches stay"
    );
    assert_eq!(h.switch.fdb().dump().iter().filter(|e| e.is_static).count(), 1);

    // A new peer: the peers are compiled again, and so is every bridge with a flood list.
    let before = after;
    let mut v = c.vtep.clone().unwrap();
    v = v.peer(peer(3), mac(53));
    c.vtep = Some(v);
    h.apply(c.clone()).unwrap();
    let after = h.switch.snapshot();
    assert!(!Arc::ptr_eq(&before.peers, &after.peers));
    assert!(!shared(&before, &after, red) && !shared(&before, &after, blue));
    assert_eq!(after.peer_by_ip.len(), 3);

    // Blue's VLAN changes: blue is rebuilt (its learned entries flushed), red is shared.
    let before = after;
    c.bridges[1].vlan = Some(21);
    h.apply(c.clone()).unwrap();
    let after = h.switch.snapshot();
    assert!(shared(&before, &after, red) && !shared(&before, &after, blue));
    assert_eq!(after.bd(blue as u16).unwrap().vlan, 21);
    assert_eq!(
        h.switch.fdb().dump().iter().filter(|e| e.is_static).count(),
        1,
        "blue's static MAC reinstalled after its flush"
    );

    // The same configuration again shares everything.
    let before = after;
    h.apply(c).unwrap();
    let after = h.switch.snapshot();
    assert!(
        shared(&before, &after, red)
            && shared(&before, &after, blue)
            && Arc::ptr_eq(&before.peers, &after.peers)
    );
}
