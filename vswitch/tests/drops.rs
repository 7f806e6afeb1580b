//! Every drop reason is counted: each is made to happen once through the pipeline (a frame
//! that earns it, on a port that gives it), and the counter of that reason — and only that
//! one — moves by one, at the node `trace::Node::dropping` names for it (its trace shows the
//! drop there). Reasons one frame cannot earn are named with the test that makes them
//! happen; a reason added later fails this test until it is in one list or the other.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use vswitch::config::{BridgeConfig, PortConfig, StaticMac, SwitchConfig, VtepConfig};
use vswitch::port::ring::{RingPeer, RingPort};
use vswitch::testkit::frames::{self, Outer};
use vswitch::testkit::{Harness, mac};
use vswitch::trace::Node;
use vswitch::wire::MacAddr;
use vswitch::{DropReason, Pool, SwitchOptions};

const UP_MAC: u32 = 0xa0;
const PEER_MAC: u32 = 0xb0;
/// Static MACs: behind `b`, behind `small`, behind the peer.
const ON_B: u32 = 0x10;
const ON_SMALL: u32 = 0x11;
const REMOTE: u32 = 0x12;

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, n)
}

fn local() -> IpAddr {
    "198.51.100.1".parse().unwrap()
}

fn peer() -> IpAddr {
    "198.51.100.2".parse().unwrap()
}

/// The switch, the port `down` (to set its link down) and the far ends of `down` and `tiny`
/// (kept, never drained).
fn setup() -> (Harness, Arc<RingPort>, [RingPeer; 2]) {
    let mut h = Harness::with_pool(Pool::new(16384, false).unwrap(), SwitchOptions::default());
    h.ring("pod")
        .ring("b")
        .ring("small")
        .ring("t")
        .ring("solo")
        .ring_with_mac("up", Some(mac(UP_MAC)));
    let (tiny, tiny_wire) = RingPort::new("tiny", 1, 2).unwrap();
    let (down, down_wire) = RingPort::new("down", 1, 64).unwrap();
    h.register("tiny", tiny);
    h.register("down", down.clone());
    let mut red = BridgeConfig::new("red").vlan(100).vni(5001).flood(&[peer()]);
    red.static_macs = vec![
        StaticMac { mac: mac(ON_B), port: Some("b".into()), remote: None },
        StaticMac { mac: mac(ON_SMALL), port: Some("small".into()), remote: None },
        StaticMac { mac: mac(REMOTE), port: None, remote: Some(peer()) },
        StaticMac { mac: mac(0x13), port: Some("tiny".into()), remote: None },
        StaticMac { mac: mac(0x14), port: Some("down".into()), remote: None },
    ];
    let mut small = PortConfig::access("small", "red");
    small.mtu = 100;
    h.apply(SwitchConfig {
        bridges: vec![red, BridgeConfig::new("lonely")],
        ports: vec![
            PortConfig::pod("pod", "red", mac(1), &[ip(1).into()]),
            PortConfig::access("b", "red"),
            small,
            PortConfig::trunk("t", &[100, 300], None),
            PortConfig::access("solo", "lonely"),
            PortConfig::access("tiny", "red"),
            PortConfig::access("down", "red"),
            PortConfig::underlay("up"),
        ],
        vtep: Some(VtepConfig::new(local(), "up").peer(peer(), mac(PEER_MAC))),
    })
    .unwrap();
    (h, down, [tiny_wire, down_wire])
}

fn udp(dst: MacAddr, src: MacAddr, size: usize) -> Vec<u8> {
    frames::udp4(dst, src, ip(2), ip(3), 1000, 2000, size)
}

/// A VXLAN frame from the peer to this VTEP (VNI 5001, inner from a remote host to `b`'s).
fn vxlan_in() -> Vec<u8> {
    let o = Outer {
        dst_mac: mac(UP_MAC),
        src_mac: mac(PEER_MAC),
        src: peer(),
        dst: local(),
        sport: 49152,
        dport: 4789,
        vlan: None,
    };
    frames::vxlan(&o, 5001, &udp(mac(ON_B), mac(0x20), 80), false)
}

/// The outer IPv4 header's checksum made right again after a change.
fn fix_checksum(f: &mut [u8]) {
    f[24..26].fill(0);
    let mut sum: u32 = f[14..34].chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// What earns each reason a single frame can earn: the port it comes in on and the frame.
fn one_frame_cases() -> Vec<(DropReason, &'static str, Vec<u8>)> {
    let vx = vxlan_in();
    let changed = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = vx.clone();
        f(&mut v);
        v
    };
    let other_vni = {
        let o = Outer {
            dst_mac: mac(UP_MAC),
            src_mac: mac(PEER_MAC),
            src: peer(),
            dst: local(),
            sport: 49152,
            dport: 4789,
            vlan: None,
        };
        frames::vxlan(&o, 9999, &udp(mac(ON_B), mac(0x20), 80), false)
    };
    let stranger = {
        let o = Outer {
            dst_mac: mac(UP_MAC),
            src_mac: mac(PEER_MAC),
            src: "198.51.100.9".parse().unwrap(),
            dst: local(),
            sport: 49152,
            dport: 4789,
            vlan: None,
        };
        frames::vxlan(&o, 5001, &udp(mac(ON_B), mac(0x20), 80), false)
    };
    vec![
        (DropReason::Runt, "b", vec![0; 10]),
        (DropReason::Oversize, "small", udp(mac(ON_B), mac(2), 200)),
        (
            DropReason::TaggedOnAccess,
            "b",
            frames::add_tag(&udp(mac(ON_SMALL), mac(2), 80), 0x8100, 100),
        ),
        (DropReason::WrongTpid, "t", frames::add_tag(&udp(mac(ON_B), mac(2), 80), 0x88a8, 100)),
        (
            DropReason::VlanNotAllowed,
            "t",
            frames::add_tag(&udp(mac(ON_B), mac(2), 80), 0x8100, 200),
        ),
        (DropReason::UntaggedNotAllowed, "t", udp(mac(ON_B), mac(2), 80)),
        (
            DropReason::NoBridgeDomain,
            "t",
            frames::add_tag(&udp(mac(ON_B), mac(2), 80), 0x8100, 300),
        ),
        (DropReason::SrcMacGroup, "b", udp(mac(ON_SMALL), MacAddr([1, 0, 0x5e, 0, 0, 1]), 80)),
        (DropReason::SecurityMac, "pod", frames::udp4(mac(ON_B), mac(3), ip(1), ip(3), 1, 2, 80)),
        (DropReason::SecurityIp, "pod", frames::udp4(mac(ON_B), mac(1), ip(99), ip(3), 1, 2, 80)),
        (DropReason::SecurityArp, "pod", frames::arp_request(mac(1), ip(99), ip(3))),
        (DropReason::SecurityRa, "pod", frames::ra(mac(1), frames::link_local(mac(1)))),
        (
            DropReason::SecurityDhcp,
            "pod",
            frames::udp4(MacAddr([0xff; 6]), mac(1), ip(1), Ipv4Addr::BROADCAST, 67, 68, 300),
        ),
        (DropReason::Reflect, "b", udp(mac(ON_B), mac(4), 80)),
        (DropReason::EgressMtu, "b", udp(mac(ON_SMALL), mac(5), 300)),
        (DropReason::EncapTooBig, "b", udp(mac(REMOTE), mac(6), 1514)),
        (DropReason::NoEgress, "solo", udp(MacAddr([0xff; 6]), mac(7), 80)),
        (DropReason::UnderlayForeignMac, "up", changed(&|f| f[..6].copy_from_slice(&mac(0x77).0))),
        (
            DropReason::UnderlayNotVxlan,
            "up",
            changed(&|f| f[36..38].copy_from_slice(&53u16.to_be_bytes())),
        ),
        (DropReason::VxlanBadChecksum, "up", changed(&|f| f[24] ^= 0xff)),
        (
            DropReason::VxlanMalformed,
            "up",
            changed(&|f| {
                f[21] = 1; // a fragment offset
                fix_checksum(f);
            }),
        ),
        (DropReason::VxlanBadFlags, "up", changed(&|f| f[42] = 0)),
        (DropReason::VxlanUnknownVni, "up", other_vni),
        (DropReason::VxlanUnknownVtep, "up", stranger),
        (
            DropReason::VxlanCeNotEct,
            "up",
            changed(&|f| {
                f[15] = 3; // outer CE over an inner header that is not ECN-capable
                fix_checksum(f);
            }),
        ),
    ]
}

/// Reasons one frame on a fresh switch cannot earn, and where each is made to happen.
const ELSEWHERE: &[(DropReason, &str)] = &[
    (DropReason::TxFull, "below (a ring that never drains); ports/vhost/tests/port.rs"),
    (DropReason::PortDown, "below (a link set down); cni/tests/cni.rs port_down"),
    (DropReason::NoBuffer, "vswitch/tests/l2.rs (an exhausted pool)"),
    (DropReason::SecurityNd, "vswitch/tests/l2.rs (ND from a pod with IPv6 addresses)"),
    (DropReason::NeighborQueueFull, "vswitch/tests/neighbor.rs"),
    (DropReason::NeighborUnresolved, "vswitch/tests/neighbor.rs"),
    (DropReason::Policed, "vswitch/tests/policing.rs"),
    (
        DropReason::VxlanNoRoute,
        "not made to happen: a snapshot without the peer (or VTEP) frames of a domain still name, which a consistent configuration never has (a peer removed while frames waited for its next hop)",
    ),
];

#[test]
fn every_drop_reason_is_counted_at_its_node() {
    let (mut h, down, mut wires) = setup();
    let mut seen = Vec::new();
    for (reason, port, frame) in one_frame_cases() {
        let before = h.stats();
        h.send(port, &frame);
        h.step();
        h.recv_all();
        let after = h.stats();
        let moved: Vec<_> = DropReason::ALL
            .iter()
            .filter(|r| after.drop(**r) != before.drop(**r))
            .map(|r| (*r, after.drop(*r) - before.drop(*r)))
            .collect();
        assert_eq!(moved, vec![(reason, 1)], "{reason:?} from {port}");
        // The trace of the same frame ends at the node that owns the reason (a synthetic
        // frame has an Ethernet header at least).
        if frame.len() >= 14 {
            let t = h.switch.trace_synthetic(port, &frame).unwrap();
            assert_eq!(
                t.nodes().last().copied(),
                Some(Node::dropping(reason)),
                "{reason:?}: {:?}",
                t.nodes()
            );
        }
        seen.push(reason);
    }

    // A ring that never drains: the third frame finds it full.
    let before = h.stats().drop(DropReason::TxFull);
    for i in 0..3 {
        h.send("b", &udp(mac(0x13), mac(0x30 + i), 80));
    }
    h.step();
    assert_eq!(h.stats().drop(DropReason::TxFull) - before, 1);
    seen.push(DropReason::TxFull);

    // A port whose link is down.
    down.set_link(false);
    let before = h.stats().drop(DropReason::PortDown);
    h.send("b", &udp(mac(0x14), mac(8), 80));
    h.step();
    assert_eq!(h.stats().drop(DropReason::PortDown) - before, 1);
    seen.push(DropReason::PortDown);

    let mut cache = vswitch::PoolCache::new(h.pool.clone());
    for w in &mut wires {
        w.drain(&mut cache);
    }
    let elsewhere: Vec<_> = ELSEWHERE.iter().map(|(r, _)| *r).collect();
    for r in DropReason::ALL {
        assert!(
            seen.contains(r) || elsewhere.contains(r),
            "{r:?} is made to happen nowhere: add it here"
        );
    }
}
