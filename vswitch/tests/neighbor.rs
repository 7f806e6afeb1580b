//! Next-hop resolution for VTEP peers without a configured next-hop MAC: ARP and neighbor
//! discovery from the VTEP's address, frames waiting for the answer and leaving in order
//! after it, one request per second, unanswered requests, a bounded waiting queue, a gateway
//! as next hop, and re-confirmation.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::neigh::{MAX_PROBES, PARKED_MAX, REACHABLE_SECS};
use vswitch::testkit::{Harness, frames, frames::Outer, mac};
use vswitch::{DropReason, Event};

const UP: u32 = 0xa0;
const HOP: u32 = 0xb0;

fn v4(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 51, 100, n))
}

fn v6(n: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n))
}

/// Pod port a1 in red (VNI 5001) flooding to `peer`, whose next hop (itself or `via`) the
/// switch resolves.
fn setup(local: IpAddr, peer: IpAddr, via: Option<IpAddr>) -> Harness {
    let mut h = Harness::new();
    h.ring("a1").ring_with_mac("up", Some(mac(UP)));
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[peer])],
        ports: vec![PortConfig::access("a1", "red"), PortConfig::underlay("up")],
        vtep: Some(VtepConfig::new(local, "up").peer_resolved(peer, via)),
    })
    .unwrap();
    h.set_now(1);
    h
}

fn pod_frame(n: u16) -> Vec<u8> {
    frames::udp4(
        mac(7),
        mac(1),
        Ipv4Addr::new(192, 0, 2, 1),
        Ipv4Addr::new(192, 0, 2, 7),
        1000 + n,
        2000,
        80,
    )
}

fn sport_of(frame: &[u8], v4: bool) -> u16 {
    let at = 14 + if v4 { 20 } else { 40 };
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

/// The request the switch must send for `target`, as a peer sees it.
fn request_for(local: IpAddr, target: IpAddr) -> Vec<u8> {
    match (local, target) {
        (IpAddr::V4(l), IpAddr::V4(t)) => {
            let mut f = frames::arp_request(mac(UP), l, t);
            f.resize(60, 0);
            f
        }
        (IpAddr::V6(l), IpAddr::V6(t)) => frames::ns(mac(UP), l, t),
        _ => unreachable!(),
    }
}

/// The answer of `from` (at `hop_mac`) to the switch's request.
fn answer_from(local: IpAddr, from: IpAddr, hop_mac: u32) -> Vec<u8> {
    match (local, from) {
        (IpAddr::V4(l), IpAddr::V4(f)) => frames::arp_reply(mac(UP), mac(hop_mac), f, l),
        (IpAddr::V6(l), IpAddr::V6(f)) => frames::na(mac(hop_mac), f, f, mac(UP), l),
        _ => unreachable!(),
    }
}

fn resolves_then_sends_in_order(local: IpAddr, peer: IpAddr, via: Option<IpAddr>) {
    let mut h = setup(local, peer, via);
    let hop = via.unwrap_or(peer);
    for n in 0..3 {
        h.send("a1", &pod_frame(n));
    }
    h.step();
    assert_eq!(h.recv("up"), vec![request_for(local, hop)], "one request, frames waiting");
    h.send("up", &answer_from(local, hop, HOP));
    h.step();
    let out = h.recv("up");
    assert_eq!(out.len(), 3, "the waiting frames leave once the answer is in");
    for (n, f) in out.iter().enumerate() {
        let sport = sport_of(f, local.is_ipv4());
        let o = Outer {
            dst_mac: mac(HOP),
            src_mac: mac(UP),
            src: local,
            dst: peer,
            sport,
            dport: 4789,
            vlan: None,
        };
        assert_eq!(
            f,
            &frames::vxlan(&o, 5001, &pod_frame(n as u16), false),
            "frame {n} in order, byte-exact"
        );
    }
    h.send("a1", &pod_frame(9));
    h.step();
    assert_eq!(h.recv("up").len(), 1, "later frames go straight out");
    let s = h.stats();
    assert_eq!((s.event(Event::NeighborRequests), s.event(Event::NeighborLearned)), (1, 1));
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
    let n = h.switch.neighbors();
    assert_eq!(n.len(), 1);
    assert_eq!(
        (n[0].0, n[0].1, n[0].2.mac, n[0].2.confirmed),
        (peer, hop, Some(mac(HOP)), Some(1))
    );
}

#[test]
fn arp_resolves_a_peer_on_the_underlay_subnet() {
    resolves_then_sends_in_order(v4(1), v4(2), None);
}

#[test]
fn arp_resolves_a_gateway_for_a_peer_elsewhere() {
    resolves_then_sends_in_order(v4(1), "203.0.113.9".parse().unwrap(), Some(v4(254)));
}

#[test]
fn neighbor_discovery_resolves_an_ipv6_peer() {
    resolves_then_sends_in_order(v6(1), v6(2), None);
}

#[test]
fn a_next_hops_own_request_teaches_its_mac_and_is_answered() {
    let (local, peer) = (v4(1), v4(2));
    let mut h = setup(local, peer, None);
    let IpAddr::V4(p) = peer else { unreachable!() };
    let IpAddr::V4(l) = local else { unreachable!() };
    h.send("up", &frames::arp_request(mac(HOP), p, l));
    h.step();
    let out = h.recv("up");
    assert_eq!(out, vec![frames::arp_reply(mac(HOP), mac(UP), l, p)]);
    h.send("a1", &pod_frame(0));
    h.step();
    let out = h.recv("up");
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0][..6], &mac(HOP).0, "no request needed: the MAC came with its request");
    assert_eq!(h.stats().event(Event::NeighborRequests), 0);
}

#[test]
fn unanswered_requests_give_up_on_waiting_frames() {
    let (local, peer) = (v4(1), v4(2));
    let mut h = setup(local, peer, None);
    for now in 1..=MAX_PROBES {
        h.set_now(now);
        h.send("a1", &pod_frame(now as u16));
        h.send("a1", &pod_frame(100 + now as u16));
        h.step();
        assert_eq!(h.recv("up"), vec![request_for(local, peer)], "one request in second {now}");
    }
    assert_eq!(h.stats().total_drops(), 0, "waiting, not dropped yet");
    h.set_now(1 + MAX_PROBES);
    h.send("a1", &pod_frame(50));
    h.step();
    let s = h.stats();
    assert_eq!(s.drop(DropReason::NeighborUnresolved), 2, "the two frames of the first second");
    assert_eq!(
        s.event(Event::NeighborRequests),
        MAX_PROBES as u64 + 1,
        "requests go on while traffic comes"
    );
    // An answer, however late, sends what still waits.
    h.recv("up");
    h.send("up", &answer_from(local, peer, HOP));
    h.step();
    assert_eq!(h.recv("up").len(), 2 * MAX_PROBES as usize + 1 - 2);
}

#[test]
fn the_waiting_queue_is_bounded() {
    let (local, peer) = (v4(1), v4(2));
    let mut h = setup(local, peer, None);
    for n in 0..(PARKED_MAX + 40) as u16 {
        h.send("a1", &pod_frame(n));
        if n % 200 == 199 {
            h.step();
        }
    }
    h.step();
    assert_eq!(h.stats().drop(DropReason::NeighborQueueFull), 40);
    h.recv("up");
    h.send("up", &answer_from(local, peer, HOP));
    h.step();
    assert_eq!(h.recv("up").len(), PARKED_MAX);
    h.flush_caches();
}

#[test]
fn a_quiet_next_hop_is_reconfirmed_then_forgotten() {
    let (local, peer) = (v4(1), v4(2));
    let mut h = setup(local, peer, None);
    h.send("up", &answer_from(local, peer, HOP));
    h.step();
    let start = 1 + REACHABLE_SECS;
    for k in 0..MAX_PROBES {
        h.set_now(start + k);
        h.send("a1", &pod_frame(k as u16));
        h.step();
        let out = h.recv("up");
        assert_eq!(out.len(), 2, "a request and the frame, still to the old MAC");
        assert_eq!(out[0], request_for(local, peer));
        assert_eq!(&out[1][..6], &mac(HOP).0);
    }
    h.set_now(start + MAX_PROBES);
    h.send("a1", &pod_frame(9));
    h.step();
    assert_eq!(h.recv("up"), vec![request_for(local, peer)], "forgotten: the frame waits");
    // A new answer (the next hop moved to another MAC) is taken at once.
    h.send("up", &answer_from(local, peer, HOP + 1));
    h.step();
    let out = h.recv("up");
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0][..6], &mac(HOP + 1).0);
}

#[test]
fn changing_the_next_hop_starts_over() {
    let (local, peer) = (v4(1), v4(2));
    let mut h = setup(local, peer, None);
    h.send("up", &answer_from(local, peer, HOP));
    h.step();
    h.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[peer])],
        ports: vec![PortConfig::access("a1", "red"), PortConfig::underlay("up")],
        vtep: Some(VtepConfig::new(local, "up").peer_resolved(peer, Some(v4(254)))),
    })
    .unwrap();
    h.send("a1", &pod_frame(0));
    h.step();
    assert_eq!(
        h.recv("up"),
        vec![request_for(local, v4(254))],
        "the old next hop's MAC is not used"
    );
}
