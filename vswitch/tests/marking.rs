//! Underlay marking: a bridge domain's DSCP on its VXLAN frames' outer header (IPv4 and
//! IPv6) and its 802.1p priority on a tagged underlay, the inner ECN field copied outward
//! (RFC 6040 normal mode) — on the slow path and from the exact-match cache alike — and
//! an outer ECT(1) or CE told to the inner header on decapsulation (or the frame dropped
//! when the inner transport is not ECN-capable). Unmarked domains keep the plain template.

use std::net::{IpAddr, Ipv4Addr};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::testkit::{Harness, frames, frames::Outer, mac};
use vswitch::{DropReason, Pool, SwitchOptions};

const UP_MAC: u32 = 0xa0;
const PEER_MAC: u32 = 0xb0;
const EF: u8 = 46;

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

/// The one's complement checksum of an IPv4 header whose checksum field is zero.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Sets the TOS (IPv4) or traffic class (IPv6) of the IP header at `l3`, checksum fixed.
fn set_tos(f: &mut [u8], l3: usize, tos: u8) {
    if f[l3] >> 4 == 4 {
        f[l3 + 1] = tos;
        f[l3 + 10..l3 + 12].fill(0);
        let c = ipv4_checksum(&f[l3..l3 + 20]);
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        f[l3] = 0x60 | tos >> 4;
        f[l3 + 1] = (f[l3 + 1] & 0x0f) | tos << 4;
    }
}

/// `red` (VNI 5001) marked EF / priority 5, `blue` (VNI 5002) unmarked; pods a1 (red) and
/// b1 (blue); one peer; underlay "up", tagged with VLAN 7 when `tagged`.
fn setup(local: IpAddr, peer: IpAddr, tagged: bool) -> Harness {
    let mut h = Harness::with_pool(Pool::new(16384, false).unwrap(), SwitchOptions::default());
    h.ring("a1").ring("b1").ring_with_mac("up", Some(mac(UP_MAC)));
    let mut vtep = VtepConfig::new(local, "up").peer(peer, mac(PEER_MAC));
    vtep.underlay_vlan = tagged.then_some(7);
    let mut red = BridgeConfig::new("red").vni(5001).flood(&[peer]);
    (red.dscp, red.pcp) = (Some(EF), Some(5));
    h.apply(SwitchConfig {
        bridges: vec![red, BridgeConfig::new("blue").vni(5002).flood(&[peer])],
        ports: vec![
            PortConfig::access("a1", "red"),
            PortConfig::access("b1", "blue"),
            PortConfig::underlay("up"),
        ],
        vtep: Some(vtep),
    })
    .unwrap();
    h
}

/// The encapsulation of `inner` as an unmarked domain's (the template), then marked.
fn expected(
    (local, peer, vlan): (IpAddr, IpAddr, Option<u16>),
    sport: u16,
    vni: u32,
    inner: &[u8],
    tos: u8,
    pcp: u8,
) -> Vec<u8> {
    let o = Outer {
        dst_mac: mac(PEER_MAC),
        src_mac: mac(UP_MAC),
        src: local,
        dst: peer,
        sport,
        dport: 4789,
        vlan,
    };
    let mut f = frames::vxlan(&o, vni, inner, false);
    let l3 = if vlan.is_some() { 18 } else { 14 };
    if tos != 0 {
        set_tos(&mut f, l3, tos);
    }
    if vlan.is_some() {
        f[14] |= pcp << 5;
    }
    f
}

fn vni_of(f: &[u8], l3: usize) -> u32 {
    let vx = l3 + if f[l3] >> 4 == 4 { 20 } else { 40 } + 8;
    u32::from_be_bytes([0, f[vx + 4], f[vx + 5], f[vx + 6]])
}

fn sport_of(f: &[u8], l3: usize) -> u16 {
    let l4 = l3 + if f[l3] >> 4 == 4 { 20 } else { 40 };
    u16::from_be_bytes([f[l4], f[l4 + 1]])
}

/// Three frames of one flow (the first takes the slow path, the others the cache) from a
/// marked and an unmarked domain, an ECN-capable inner header (ECT(0)) and a CE one.
fn marks_each_frame(local: IpAddr, peer: IpAddr, tagged: bool) {
    let mut h = setup(local, peer, tagged);
    let vlan = tagged.then_some(7);
    let l3 = if tagged { 18 } else { 14 };
    for inner_ecn in [2u8, 3] {
        let mut red = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 100);
        set_tos(&mut red, 14, 0x20 | inner_ecn); // a DSCP of the pod's own (CS1), not copied
        let mut blue = frames::udp4(mac(4), mac(3), ip(3), ip(4), 1000, 2000, 100);
        set_tos(&mut blue, 14, inner_ecn);
        for round in 0..3 {
            h.send("a1", &red);
            h.send("b1", &blue);
            h.step();
            let out = h.recv("up");
            assert_eq!(out.len(), 2, "round {round}");
            let (r, b) =
                if vni_of(&out[0], l3) == 5001 { (&out[0], &out[1]) } else { (&out[1], &out[0]) };
            let want_r =
                expected((local, peer, vlan), sport_of(r, l3), 5001, &red, EF << 2 | inner_ecn, 5);
            let want_b = expected((local, peer, vlan), sport_of(b, l3), 5002, &blue, 0, 0);
            assert_eq!(
                r, &want_r,
                "round {round}, inner ECN {inner_ecn}: red carries EF, priority 5 and the inner ECN"
            );
            assert_eq!(
                b, &want_b,
                "round {round}, inner ECN {inner_ecn}: blue is unmarked (the template)"
            );
        }
    }
    assert_eq!(h.stats().total_drops(), 0);
}

#[test]
fn a_marked_domains_frames_carry_its_dscp_and_the_inner_ecn_over_ipv4() {
    marks_each_frame("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap(), false);
}

#[test]
fn a_marked_domains_frames_carry_its_dscp_and_the_inner_ecn_over_ipv6() {
    marks_each_frame("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap(), false);
}

#[test]
fn a_tagged_underlay_carries_the_domains_priority() {
    marks_each_frame("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap(), true);
    marks_each_frame("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap(), true);
}

/// RFC 6040 section 4.2, over an IPv4 and an IPv6 underlay: (inner, outer) → inner after.
#[test]
fn decapsulation_tells_the_inner_header_of_congestion() {
    for (local, peer) in [("198.51.100.1", "198.51.100.2"), ("2001:db8::1", "2001:db8::2")] {
        let (local, peer): (IpAddr, IpAddr) = (local.parse().unwrap(), peer.parse().unwrap());
        let mut h = setup(local, peer, false);
        // mac(1) learnt on a1, so frames to it are known unicast (cached from the second on).
        h.send("a1", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 1, 2, 80));
        h.step();
        h.recv_all();
        let cases: [(u8, u8, Option<u8>); 9] = [
            (2, 3, Some(3)), // ECT(0) + CE → CE
            (1, 3, Some(3)), // ECT(1) + CE → CE
            (3, 3, Some(3)),
            (0, 3, None),    // Not-ECT + CE → drop
            (2, 1, Some(1)), // ECT(0) + ECT(1) → ECT(1)
            (0, 1, Some(0)),
            (2, 2, Some(2)), // ECT(0) outer: nothing to tell (the fast path)
            (0, 2, Some(0)),
            (1, 0, Some(1)),
        ];
        let mut drops = 0;
        for (i, (inner_ecn, outer_ecn, after)) in cases.into_iter().enumerate() {
            let mut inner = frames::udp4(mac(1), mac(0x70 + i as u32), ip(7), ip(1), 1, 2, 80);
            set_tos(&mut inner, 14, 0x28 | inner_ecn);
            let o = Outer {
                dst_mac: mac(UP_MAC),
                src_mac: mac(PEER_MAC),
                src: peer,
                dst: local,
                sport: 50000,
                dport: 4789,
                vlan: None,
            };
            let mut f = frames::vxlan(&o, 5001, &inner, false);
            set_tos(&mut f, 14, 0x10 << 2 | outer_ecn);
            // Three times: the later frames of a flow the cache knows take the fast path.
            for _ in 0..3 {
                h.send("up", &f);
                h.step();
                let got = h.recv("a1");
                match after {
                    Some(e) => {
                        let mut want = inner.clone();
                        set_tos(&mut want, 14, 0x28 | e);
                        assert_eq!(
                            got,
                            vec![want],
                            "inner ECN {inner_ecn}, outer {outer_ecn} over {local}"
                        );
                    }
                    None => {
                        assert!(got.is_empty(), "inner Not-ECT, outer CE: dropped");
                        drops += 1;
                    }
                }
            }
        }
        if local.is_ipv4() {
            // The last three cases' later frames took the fast path; outer ECT(1) and CE never
            // do (the slow path tells the inner header).
            assert_eq!(
                h.stats().event(vswitch::Event::CacheHits),
                6,
                "the fast path ran where it may"
            );
        }
        assert_eq!(h.stats().drop(DropReason::VxlanCeNotEct), drops);
        assert_eq!(h.stats().total_drops(), drops);
    }
}

#[test]
fn a_marking_out_of_range_is_refused_with_the_range() {
    let mut h = setup("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap(), false);
    let mut cfg = h.switch.snapshot().config.clone();
    cfg.bridges[1].dscp = Some(64);
    assert_eq!(
        h.apply(cfg.clone()).unwrap_err().to_string(),
        "bridge \"blue\": DSCP 64 is out of range 0..=63"
    );
    cfg.bridges[1].dscp = None;
    cfg.bridges[1].pcp = Some(8);
    assert_eq!(
        h.apply(cfg).unwrap_err().to_string(),
        "bridge \"blue\": 802.1p priority 8 is out of range 0..=7"
    );
}

/// A priority domain (a control plane) keeps every frame when another (a media plane)
/// floods the underlay port faster than it drains: a ring of 64 emptied every fourth round
/// while 32 media frames and one control frame arrive each round. The control frames wait
/// for room, first in line (`priority_held`, then `priority_first`); without priority, most
/// of them are lost with the media frames.
#[test]
fn a_priority_trickle_loses_nothing_to_a_flood_through_a_slow_underlay() {
    fn run(priority: bool) -> (usize, usize, vswitch::counters::Totals) {
        use vswitch::port::ring::RingPort;
        let mut h = Harness::with_pool(Pool::new(16384, false).unwrap(), SwitchOptions::default());
        h.ring("b1").ring("a1");
        let (up, mut wire) = RingPort::new("up", 1, 64).unwrap();
        h.register("up", up.with_mac(mac(UP_MAC)));
        let (local, peer): (IpAddr, IpAddr) =
            ("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap());
        let mut red = BridgeConfig::new("red").vni(5001).flood(&[peer]);
        red.priority = priority;
        let mut blue = BridgeConfig::new("blue").vni(5002).flood(&[peer]);
        blue.dscp = Some(34); // some domain marked either way: the same path
        h.apply(SwitchConfig {
            bridges: vec![red, blue],
            ports: vec![
                PortConfig::access("b1", "blue"),
                PortConfig::access("a1", "red"),
                PortConfig::underlay("up"),
            ],
            vtep: Some(VtepConfig::new(local, "up").peer(peer, mac(PEER_MAC))),
        })
        .unwrap();
        let mut cache = vswitch::PoolCache::new(h.pool.clone());
        let (mut control, mut media) = (0, 0);
        let mut take = |h: &Harness, wire: &mut vswitch::port::ring::RingPeer| {
            let mut batch = vswitch::Batch::new();
            while wire.recv(0, &mut batch) > 0 {
                for b in batch.drain() {
                    let mut f = Vec::new();
                    h.pool.read_frame(&b, &mut f);
                    cache.free(b);
                    if vni_of(&f, 14) == 5001 { control += 1 } else { media += 1 }
                }
            }
        };
        for round in 0..100u16 {
            for i in 0..32u16 {
                h.send("b1", &frames::udp4(mac(4), mac(3), ip(3), ip(4), i, round, 200));
            }
            h.send("a1", &frames::udp4(mac(2), mac(1), ip(1), ip(2), 7, round, 80));
            h.step();
            if round % 4 == 3 {
                take(&h, &mut wire);
            }
        }
        // The rounds are over: the consumer catches up, and held frames leave with the next
        // flush (a burst of anything).
        take(&h, &mut wire);
        h.send("b1", &frames::udp4(mac(4), mac(3), ip(3), ip(4), 1, 1, 60));
        h.step();
        take(&h, &mut wire);
        let stats = h.stats();
        (control, media, stats)
    }
    let (control, media, s) = run(true);
    assert_eq!(control, 100, "every control frame arrived");
    assert!(media < 100 * 32 / 2, "the media flood was cut to what the ring drains: {media}");
    assert_eq!(s.event(vswitch::Event::PriorityFirst), 100);
    assert!(s.event(vswitch::Event::PriorityHeld) > 0, "control frames waited for room");
    let (control, _, s) = run(false);
    assert!(
        control < 60,
        "without priority the flood takes most control frames: {control} arrived"
    );
    assert_eq!(s.event(vswitch::Event::PriorityFirst), 0);
}
