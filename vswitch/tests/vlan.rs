//! VLAN planes: access and trunk ports, native VLAN, TPIDs, priority tags, isolation.

use std::net::Ipv4Addr;
use vswitch::DropReason;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::testkit::{Harness, frames, mac};

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

/// a100 (access, VLAN 100), a200 (access, VLAN 200), t (trunk 100,200; native `native`).
fn setup(native: Option<u16>, tpid: u16) -> Harness {
    let mut h = Harness::new();
    h.ring("a100").ring("a200").ring("t").ring("t2");
    let mut t = PortConfig::trunk("t", &[100, 200], native);
    t.tpid = tpid;
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("v100").vlan(100), BridgeConfig::new("v200").vlan(200)],
        ports: vec![
            PortConfig::access("a100", "v100"),
            PortConfig::access("a200", "v200"),
            t,
            PortConfig::trunk("t2", &[100, 200], None),
        ],
        vtep: None,
    })
    .unwrap();
    h
}

#[test]
fn access_to_trunk_pushes_and_trunk_to_access_pops() {
    let mut h = setup(None, 0x8100);
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64);
    h.send("a100", &f);
    h.step();
    let out = h.recv_all();
    assert_eq!(out["t"], vec![frames::add_tag(&f, 0x8100, 100)]);
    assert_eq!(out["t2"], vec![frames::add_tag(&f, 0x8100, 100)]);
    assert!(out["a200"].is_empty(), "VLANs are isolated");

    let g = frames::udp4(mac(1), mac(3), ip(3), ip(1), 1, 2, 64);
    h.send("t", &frames::add_tag(&g, 0x8100, 100));
    h.step();
    let out = h.recv_all();
    assert_eq!(out["a100"], vec![g], "learned mac(1) on a100: unicast, untagged");
    assert!(out["t2"].is_empty() && out["a200"].is_empty());
}

#[test]
fn trunk_to_trunk_keeps_tag_and_priority() {
    let mut h = setup(None, 0x8100);
    let f = frames::add_tag(
        &frames::udp4(mac(9), mac(3), ip(3), ip(9), 1, 2, 64),
        0x8100,
        0xa000 | 200,
    );
    h.send("t", &f);
    h.step();
    let out = h.recv_all();
    assert_eq!(out["t2"], vec![f.clone()], "same tag, PCP 5 kept");
    let untagged = frames::udp4(mac(9), mac(3), ip(3), ip(9), 1, 2, 64);
    assert_eq!(out["a200"], vec![untagged]);
    assert!(out["a100"].is_empty());
}

#[test]
fn native_vlan_is_untagged_both_ways() {
    let mut h = setup(Some(100), 0x8100);
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64);
    h.send("a100", &f);
    h.step();
    assert_eq!(h.recv("t"), vec![f.clone()], "native VLAN leaves untagged");
    let g = frames::udp4(mac(1), mac(4), ip(4), ip(1), 1, 2, 64);
    h.send("t", &g);
    h.step();
    assert_eq!(h.recv("a100"), vec![g]);
}

#[test]
fn refused_tags_are_counted() {
    let mut h = setup(None, 0x8100);
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64);
    h.send("t", &frames::add_tag(&f, 0x8100, 300)); // not allowed
    h.send("t", &f); // untagged, no native VLAN
    h.send("a100", &frames::add_tag(&f, 0x8100, 100)); // tagged on access
    h.send("t", &frames::add_tag(&f, 0x88a8, 100)); // wrong TPID
    h.step();
    assert!(h.recv_all().values().all(Vec::is_empty));
    let s = h.stats();
    for r in [
        DropReason::VlanNotAllowed,
        DropReason::UntaggedNotAllowed,
        DropReason::TaggedOnAccess,
        DropReason::WrongTpid,
    ] {
        assert_eq!(s.drop(r), 1, "{r:?}");
    }
}

#[test]
fn priority_tagged_frames_count_as_untagged() {
    let mut h = setup(None, 0x8100);
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64);
    h.send("a100", &frames::add_tag(&f, 0x8100, 0x6000));
    h.step();
    let out = h.recv_all();
    assert_eq!(
        out["t"],
        vec![frames::add_tag(&f, 0x8100, 0x6000 | 100)],
        "PCP carried into the new tag"
    );
}

#[test]
fn qinq_trunk_rewrites_tpid() {
    let mut h = setup(None, 0x88a8);
    let f = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 64);
    h.send("t2", &frames::add_tag(&f, 0x8100, 200));
    h.step();
    let out = h.recv_all();
    assert_eq!(out["t"], vec![frames::add_tag(&f, 0x88a8, 200)]);
    assert_eq!(out["a200"], vec![f]);
}

#[test]
fn egress_mtu_is_enforced() {
    let mut h = Harness::new();
    h.ring("big").ring("small");
    let mut small = PortConfig::access("small", "red");
    small.mtu = 1000;
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red")],
        ports: vec![PortConfig::access("big", "red"), small],
        vtep: None,
    })
    .unwrap();
    h.send("big", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 1014));
    h.send("big", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 1015));
    h.step();
    assert_eq!(h.recv("small").len(), 1);
    assert_eq!(h.stats().drop(DropReason::EgressMtu), 1);
}
