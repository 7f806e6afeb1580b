//! Packet trace: a live trace names every logical node a frame passed (and the frame is
//! still forwarded as usual); drops are traced at the node that dropped; the cache's
//! decision is reported for frames it knows; synthetic frames (an encapsulation, a
//! decapsulation, a trunk's tagged frame, ARP suppression, the VTEP's own neighbor
//! traffic, a frame waiting for a next hop) run through the configuration without learning
//! or sending anything; and together the traces cover every node and take every edge of
//! the node graph ([`vswitch::graph`]), and no edge it does not list.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use vswitch::config::{BridgeConfig, Neighbor, PortConfig, StaticMac, SwitchConfig, VtepConfig};
use vswitch::fdb::Dest;
use vswitch::graph::{self, Next};
use vswitch::testkit::{Harness, frames, mac};
use vswitch::trace::{FrameTrace, Learned, Node, Step};
use vswitch::wire::spec;

const UP_MAC: u32 = 0xa0;
const PEER_MAC: u32 = 0xb0;
const LOCAL: &str = "192.0.2.1";
const PEER: &str = "192.0.2.2";
/// Behind the peer (a static entry).
const REMOTE_POD: u32 = 7;

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, n)
}

/// `red` (VLAN 10 on trunks, VNI 5001, flooding to the peer, ARP suppression for 10.1.0.9):
/// pod port p1 (mac(1), 10.1.0.1, port security), access port a2, trunk t1, underlay up.
fn setup(resolved_peer: bool) -> Harness {
    let mut h = Harness::new();
    h.ring("p1").ring("a2").ring("t1").ring_with_mac("up", Some(mac(UP_MAC)));
    let peer: IpAddr = PEER.parse().unwrap();
    let vtep = VtepConfig::new(LOCAL.parse().unwrap(), "up");
    let vtep =
        if resolved_peer { vtep.peer_resolved(peer, None) } else { vtep.peer(peer, mac(PEER_MAC)) };
    let mut red = BridgeConfig::new("red").vlan(10).vni(5001).flood(&[peer]);
    red.arp_suppression = true;
    red.neighbors = vec![Neighbor { ip: ip(9).into(), mac: mac(9) }];
    red.static_macs = vec![StaticMac { mac: mac(REMOTE_POD), port: None, remote: Some(peer) }];
    h.apply(SwitchConfig {
        bridges: vec![red],
        ports: vec![
            PortConfig::pod("p1", "red", mac(1), &[ip(1).into()]),
            PortConfig::access("a2", "red"),
            PortConfig::trunk("t1", &[10], None),
            PortConfig::underlay("up"),
        ],
        vtep: Some(vtep),
    })
    .unwrap();
    h
}

fn pid(h: &Harness, name: &str) -> u16 {
    h.switch.snapshot().port_id(name).unwrap()
}

fn nodes(t: &FrameTrace) -> Vec<Node> {
    t.nodes()
}

fn has(t: &FrameTrace, want: &[Node]) {
    let got = nodes(t);
    for n in want {
        assert!(got.contains(n), "{n:?} missing from {:?}", t.steps());
    }
}

fn udp(dst: u32, src: u32, sip: Ipv4Addr, dip: Ipv4Addr) -> Vec<u8> {
    frames::udp4(mac(dst), mac(src), sip, dip, 1000, 2000, 100)
}

#[test]
fn a_traced_frame_names_every_node_it_passed_and_is_still_forwarded() {
    let mut h = setup(false);
    h.switch.trace("p1", 2).unwrap();
    // To an unknown MAC: flooded to a2, t1 (tagged) and the peer (encapsulated).
    h.send("p1", &udp(30, 1, ip(1), ip(30)));
    h.step();
    let out = h.recv_all();
    assert_eq!(
        (out["a2"].len(), out["t1"].len(), out["up"].len()),
        (1, 1, 1),
        "the traced frame is forwarded as usual"
    );
    let t = h.switch.traces();
    assert_eq!(t.len(), 1);
    let t = &t[0];
    assert_eq!(
        nodes(t),
        vec![
            Node::Cache,
            Node::Classify,
            Node::PortSecurity,
            Node::Learn,
            Node::Forward,
            Node::Flood,
            Node::VlanRewrite,
            Node::Tx,
            Node::Encap
        ],
        "{:?}",
        t.steps()
    );
    assert!(
        t.steps().contains(&Step::Learn { bd: 0, mac: mac(1), outcome: Learned::New }),
        "{:?}",
        t.steps()
    );
    assert!(t.steps().contains(&Step::Forward { mac: mac(30), found: None }));
    // The rendering names ports, bridges and peers.
    let (frame, steps) = t.render(&h.switch.snapshot());
    assert!(frame.contains("ipv4 10.1.0.1 > 10.1.0.30"), "{frame}");
    let text: Vec<String> = steps.iter().map(|(n, d)| format!("{n}: {d}")).collect();
    let text = text.join("\n");
    for want in [
        "classify: untagged → bridge red",
        "to port t1: push tag 0x8100 vlan 10",
        "vxlan-encap: vni 5001 to vtep 192.0.2.2",
        "queued on port up",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
    // One frame of the two asked for was traced: the request stays armed for the next.
    assert_eq!(h.switch.tracing().remaining(), 1);
    h.send("a2", &udp(1, 2, ip(2), ip(1)));
    h.step();
    assert!(h.switch.traces().is_empty(), "only p1 is traced");
    h.send("p1", &udp(2, 1, ip(1), ip(2)));
    h.step();
    let t = h.switch.traces();
    assert_eq!(t.len(), 1);
    assert!(
        t[0].steps()
            .contains(&Step::Forward { mac: mac(2), found: Some(Dest::Port(pid(&h, "a2"))) }),
        "{:?}",
        t[0].steps()
    );
    assert_eq!(h.switch.tracing().remaining(), 0);
    assert_eq!(h.recv("a2").len(), 1);
}

#[test]
fn the_cache_decision_is_reported_and_not_filled_by_traced_frames() {
    let mut h = setup(false);
    h.send("a2", &udp(1, 2, ip(2), ip(1)));
    h.step();
    for _ in 0..3 {
        h.send("p1", &udp(2, 1, ip(1), ip(2)));
    }
    h.step();
    h.recv_all();
    h.switch.trace("p1", 1).unwrap();
    h.send("p1", &udp(2, 1, ip(1), ip(2)));
    h.step();
    assert_eq!(h.recv("a2").len(), 1);
    let t = h.switch.traces();
    assert_eq!(
        t[0].steps()[0],
        Step::Cache { hit: Some((0, Dest::Port(pid(&h, "a2")))) },
        "{:?}",
        t[0].steps()
    );
    assert!(t[0].steps().contains(&Step::Learn { bd: 0, mac: mac(1), outcome: Learned::Fresh }));
    // A new flow, traced: a miss, and the cache stays without it.
    h.switch.trace("p1", 1).unwrap();
    let f = udp(REMOTE_POD, 1, ip(1), ip(7));
    h.send("p1", &f);
    h.step();
    assert_eq!(h.switch.traces()[0].steps()[0], Step::Cache { hit: None });
    h.switch.trace("p1", 1).unwrap();
    h.send("p1", &f);
    h.step();
    assert_eq!(
        h.switch.traces()[0].steps()[0],
        Step::Cache { hit: None },
        "a traced frame fills no cache entry"
    );
}

#[test]
fn drops_are_traced_at_the_node_that_dropped() {
    let mut h = setup(false);
    h.switch.trace("p1", 2).unwrap();
    h.send("p1", &udp(2, 1, ip(66), ip(2))); // a source address the pod does not own
    h.send("p1", &frames::tagged(mac(2), mac(1), 0x8100, 10, 0x0800, &[0; 46])); // tagged on an access port
    h.step();
    let t = h.switch.traces();
    assert_eq!(t.len(), 2);
    assert_eq!(nodes(&t[0]), vec![Node::Cache, Node::Classify, Node::PortSecurity]);
    assert_eq!(
        t[0].steps().last(),
        Some(&Step::Drop { reason: vswitch::DropReason::SecurityIp, port: pid(&h, "p1") })
    );
    assert_eq!(
        t[1].steps().last(),
        Some(&Step::Drop { reason: vswitch::DropReason::TaggedOnAccess, port: pid(&h, "p1") })
    );
    assert_eq!(Node::dropping(vswitch::DropReason::TaggedOnAccess), Node::Classify);
    assert!(h.recv_all().values().all(Vec::is_empty));
}

fn synthetic(h: &Harness, port: &str, s: &str) -> FrameTrace {
    let f = spec::build(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    h.switch.trace_synthetic(port, &f).unwrap()
}

fn eth(dst: u32, src: u32) -> String {
    format!("eth(src={},dst={})", mac(src), mac(dst))
}

#[test]
fn a_synthetic_encapsulation_learns_nothing_and_sends_nothing() {
    let mut h = setup(false);
    let fdb_before = h.switch.fdb().len();
    let t = synthetic(
        &h,
        "p1",
        &format!("{} ipv4(src=10.1.0.1,dst=10.1.0.7) udp(src=5000,dst=53)", eth(REMOTE_POD, 1)),
    );
    assert!(t.dry);
    assert_eq!(
        nodes(&t),
        vec![Node::Classify, Node::PortSecurity, Node::Learn, Node::Forward, Node::Encap, Node::Tx],
        "{:?}",
        t.steps()
    );
    assert!(t.steps().contains(&Step::Learn { bd: 0, mac: mac(1), outcome: Learned::WouldLearn }));
    assert!(t.steps().contains(&Step::Tx { port: pid(&h, "up"), first: false, sent: false }));
    h.step();
    assert!(h.recv_all().values().all(Vec::is_empty), "nothing is sent");
    assert_eq!(h.switch.fdb().len(), fdb_before, "nothing is learned");
    assert_eq!(
        h.stats().ports.iter().map(|p| p.rx_packets + p.tx_packets).sum::<u64>(),
        0,
        "the switch's counters do not count it"
    );
}

#[test]
fn a_synthetic_decapsulation_and_a_trunk_frame() {
    let mut h = setup(false);
    // mac(1) known behind p1.
    h.send("p1", &udp(2, 1, ip(1), ip(2)));
    h.step();
    h.recv_all();
    let outer = format!(
        "{} ipv4(src={PEER},dst={LOCAL}) udp(src=50000,dst=4789) vxlan(vni=5001)",
        eth(UP_MAC, PEER_MAC)
    );
    let t = synthetic(
        &h,
        "up",
        &format!("{outer} {} ipv4(src=10.1.0.7,dst=10.1.0.1) icmp()", eth(1, REMOTE_POD)),
    );
    assert_eq!(
        nodes(&t),
        vec![Node::Decap, Node::Learn, Node::Forward, Node::VlanRewrite, Node::Tx],
        "{:?}",
        t.steps()
    );
    let (frame, steps) = t.render(&h.switch.snapshot());
    assert!(frame.contains("vxlan vni 5001 ["), "{frame}");
    assert!(steps.iter().any(|(n, d)| *n == "vxlan-decap" && d.contains("vtep 192.0.2.2 vni 5001 → bridge red")), "{steps:?}");
    // An unknown VNI is dropped by the decapsulation.
    let outer_bad = outer.replace("vni=5001", "vni=77");
    let t = synthetic(
        &h,
        "up",
        &format!("{outer_bad} {} ipv4(src=10.1.0.7,dst=10.1.0.1) icmp()", eth(1, REMOTE_POD)),
    );
    assert_eq!(
        t.steps(),
        &[Step::Drop { reason: vswitch::DropReason::VxlanUnknownVni, port: pid(&h, "up") }]
    );
    // A trunk's tagged frame to p1: the tag is popped on the way out.
    let t = synthetic(
        &h,
        "t1",
        &format!("{} vlan(vid=10,pcp=3) ipv4(src=10.1.0.5,dst=10.1.0.1) tcp(dst=22)", eth(1, 5)),
    );
    assert!(t.steps().contains(&Step::Classify { bd: 0, vid: 10, pcp: 3 }), "{:?}", t.steps());
    assert!(
        t.steps()
            .contains(&Step::VlanRewrite { port: pid(&h, "p1"), op: vswitch::trace::Retag::Pop }),
        "{:?}",
        t.steps()
    );
    h.step();
    assert!(h.recv_all().values().all(Vec::is_empty));
}

#[test]
fn traces_together_cover_every_node() {
    let mut seen: BTreeSet<&'static str> = BTreeSet::new();
    let mut note = |t: &FrameTrace| seen.extend(nodes(t).into_iter().map(Node::name));
    let mut h = setup(false);
    // Live: cache, classify, port security, learn, forward, flood, rewrite, tx, encap.
    h.switch.trace("p1", 1).unwrap();
    h.send("p1", &udp(30, 1, ip(1), ip(30)));
    h.step();
    note(&h.switch.traces()[0]);
    // ARP suppression.
    let t = synthetic(
        &h,
        "p1",
        &format!(
            "eth(src={},dst=ff:ff:ff:ff:ff:ff) arp(op=request,sha={},spa=10.1.0.1,tpa=10.1.0.9)",
            mac(1),
            mac(1)
        ),
    );
    assert!(nodes(&t).contains(&Node::Suppress), "{:?}", t.steps());
    note(&t);
    // The VTEP's address asked for on the underlay: answered.
    let t = synthetic(
        &h,
        "up",
        &format!(
            "eth(src={},dst=ff:ff:ff:ff:ff:ff) arp(op=request,sha={},spa={PEER},tpa={LOCAL})",
            mac(PEER_MAC),
            mac(PEER_MAC)
        ),
    );
    assert_eq!(nodes(&t), vec![Node::Vtep, Node::Tx], "{:?}", t.steps());
    note(&t);
    // Decapsulation.
    let outer = format!(
        "{} ipv4(src={PEER},dst={LOCAL}) udp(dst=4789) vxlan(vni=5001)",
        eth(UP_MAC, PEER_MAC)
    );
    note(&synthetic(
        &h,
        "up",
        &format!("{outer} {} ipv4(src=10.1.0.7,dst=10.1.0.1) icmp()", eth(1, REMOTE_POD)),
    ));
    // A peer whose next hop is not resolved yet: the frame would wait.
    let h = setup(true);
    let t = synthetic(
        &h,
        "p1",
        &format!("{} ipv4(src=10.1.0.1,dst=10.1.0.7) udp()", eth(REMOTE_POD, 1)),
    );
    has(&t, &[Node::Forward, Node::NeighborHold]);
    note(&t);
    let all: BTreeSet<&str> = Node::ALL.iter().map(|n| n.name()).collect();
    assert_eq!(seen, all);
}

/// Edges no trace here takes, and where they are taken instead.
const TAKEN_ELSEWHERE: &[(Node, Next, &str)] = &[
    // The answer's port left the snapshot between the table lookup and egress.
    (Node::Suppress, Next::Drop, "a race: counted as no_egress"),
    // A parked frame goes back to encapsulation, or is dropped, on a later burst.
    (Node::NeighborHold, Next::Node(Node::Encap), "tests/neighbor.rs"),
    (
        Node::NeighborHold,
        Next::Drop,
        "tests/neighbor.rs (neighbor_queue_full, neighbor_unresolved)",
    ),
    // No buffer left for a copy.
    (Node::Flood, Next::Drop, "tests/l2.rs pool_exhaustion_during_flooding_is_counted_not_fatal"),
    // Every port here has one MTU.
    (Node::VlanRewrite, Next::Drop, "tests/drops.rs (egress_mtu)"),
    // A full ring or a link down is found when the burst's batches are sent, after its trace.
    (Node::Tx, Next::Drop, "tests/drops.rs (tx_full, port_down)"),
];

#[test]
fn traces_take_every_edge_of_the_node_graph_and_no_other() {
    let order = graph::check().expect("the node graph checks");
    assert_eq!(order.len(), Node::ALL.len());
    let mut traces: Vec<FrameTrace> = Vec::new();
    let mut h = setup(false);
    let live = |h: &mut Harness, port: &str, frames: &[Vec<u8>]| {
        h.switch.trace(port, frames.len() as u32).unwrap();
        for f in frames {
            h.send(port, f);
        }
        h.step();
        h.recv_all();
        h.switch.traces()
    };
    // A flood (p1 first seen), then cache hits to a local port and to the peer, a drop at
    // classification and at port security, a frame back to where its destination is.
    traces.extend(live(&mut h, "p1", &[udp(30, 1, ip(1), ip(30))]));
    h.send("a2", &udp(1, 2, ip(2), ip(1)));
    for _ in 0..3 {
        h.send("p1", &udp(2, 1, ip(1), ip(2)));
        h.send("p1", &udp(REMOTE_POD, 1, ip(1), ip(7)));
        h.send("t1", &frames::tagged(mac(1), mac(5), 0x8100, 10, 0x0800, &[0; 46]));
    }
    h.step();
    h.recv_all();
    traces.extend(live(
        &mut h,
        "p1",
        &[udp(2, 1, ip(1), ip(2)), udp(REMOTE_POD, 1, ip(1), ip(7)), udp(2, 1, ip(66), ip(2))],
    ));
    traces.extend(live(
        &mut h,
        "t1",
        &[
            frames::tagged(mac(1), mac(5), 0x8100, 10, 0x0800, &[0; 46]),
            frames::tagged(mac(1), mac(5), 0x8100, 99, 0x0800, &[0; 46]),
        ],
    ));
    traces.extend(live(&mut h, "a2", &[udp(2, 2, ip(2), ip(2))]));
    // The underlay: a decapsulated frame, one dropped there, the VTEP's address asked for.
    let outer = format!(
        "{} ipv4(src={PEER},dst={LOCAL}) udp(dst=4789) vxlan(vni=5001)",
        eth(UP_MAC, PEER_MAC)
    );
    let arp_for_vtep = format!(
        "eth(src={},dst=ff:ff:ff:ff:ff:ff) arp(op=request,sha={},spa={PEER},tpa={LOCAL})",
        mac(PEER_MAC),
        mac(PEER_MAC)
    );
    let underlay: Vec<Vec<u8>> = [
        format!("{outer} {} ipv4(src=10.1.0.7,dst=10.1.0.1) icmp()", eth(1, REMOTE_POD)),
        format!(
            "{} {} ipv4(src=10.1.0.7,dst=10.1.0.1) icmp()",
            outer.replace("vni=5001", "vni=77"),
            eth(1, REMOTE_POD)
        ),
        arp_for_vtep.clone(),
    ]
    .iter()
    .map(|s| spec::build(s).unwrap())
    .collect();
    traces.extend(live(&mut h, "up", &underlay));
    traces.push(synthetic(&h, "up", &arp_for_vtep));
    // ARP suppression: answered to a local port and to the peer; not in the table.
    let arp = |sha: u32, tpa: &str| {
        format!(
            "eth(src={},dst=ff:ff:ff:ff:ff:ff) arp(op=request,sha={},spa=10.1.0.1,tpa={tpa})",
            mac(sha),
            mac(sha)
        )
    };
    traces.push(synthetic(&h, "p1", &arp(1, "10.1.0.9")));
    traces.push(synthetic(&h, "p1", &arp(1, "10.1.0.99")));
    traces.push(synthetic(
        &h,
        "up",
        &format!("{outer} {}", arp(REMOTE_POD, "10.1.0.9").replace("spa=10.1.0.1", "spa=10.1.0.7")),
    ));
    // Too big for the underlay once encapsulated.
    traces.push(synthetic(
        &h,
        "t1",
        &format!(
            "{} vlan(vid=10) ipv4(src=10.1.0.5,dst=10.1.0.7) udp() payload(len=1444)",
            eth(REMOTE_POD, 5)
        ),
    ));
    // A bridge domain with one member: a flood with nowhere to go.
    let mut lone = Harness::new();
    lone.ring("x");
    lone.apply(SwitchConfig {
        bridges: vec![BridgeConfig::new("lone")],
        ports: vec![PortConfig::access("x", "lone")],
        vtep: None,
    })
    .unwrap();
    traces.push(lone.switch.trace_synthetic("x", &udp(30, 1, ip(1), ip(30))).unwrap());
    // A peer whose next hop is not resolved yet: the frame would wait.
    let h = setup(true);
    traces.push(synthetic(
        &h,
        "p1",
        &format!("{} ipv4(src=10.1.0.1,dst=10.1.0.7) udp()", eth(REMOTE_POD, 1)),
    ));

    let mut taken: BTreeSet<(Option<Node>, Next)> = BTreeSet::new();
    for t in &traces {
        for e in graph::edges_of(t) {
            match e {
                (None, Next::Node(n)) => assert!(
                    graph::ENTRIES.contains(&n),
                    "{} entered at, not an entry: {:?}",
                    n.name(),
                    t.steps()
                ),
                (None, Next::Drop) => panic!("a drop before any node: {:?}", t.steps()),
                (Some(from), to) => assert!(
                    from.next_index(to).is_some(),
                    "{} → {to:?} is not in the graph: {:?}",
                    from.name(),
                    t.steps()
                ),
            }
            taken.insert(e);
        }
    }
    let mut missing = Vec::new();
    for n in Node::ALL {
        for x in n.nexts() {
            if !taken.contains(&(Some(*n), *x))
                && !TAKEN_ELSEWHERE.iter().any(|(a, b, _)| a == n && b == x)
            {
                missing.push(format!("{} → {x:?}", n.name()));
            }
        }
    }
    assert!(missing.is_empty(), "edges no trace took: {missing:?}");
    for n in graph::ENTRIES {
        assert!(taken.contains(&(None, Next::Node(*n))), "no frame entered at {}", n.name());
    }
}

#[test]
fn bad_trace_requests_are_refused_with_a_reason() {
    let h = setup(false);
    assert!(h.switch.trace("nope", 1).unwrap_err().to_string().contains("nope"));
    let e = h.switch.trace_synthetic("p1", &[0; 10]).unwrap_err().to_string();
    assert!(e.contains("10 bytes"), "{e}");
    let e = h.switch.trace_synthetic("p1", &vec![0; 4000]).unwrap_err().to_string();
    assert!(e.contains("4000 bytes"), "{e}");
}
