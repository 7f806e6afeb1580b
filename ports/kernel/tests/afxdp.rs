//! AF_XDP ports against the kernel: veth pairs between namespaces the test creates (and
//! removes), Knitter's XDP programs attached in generic mode, the buffer pool as UMEM.
//! Needs root (skipped without, failed under CI); runs in the `serial` nextest group.

use kernel_ports::afpacket::AfPacketPort;
use kernel_ports::afxdp::{AfXdpPort, Binding};
use kernel_ports::bpf::UnderlayFilter;
use kernel_ports::kernel_neigh::KernelNeighbors;
use std::sync::Arc;
use std::time::Duration;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::port::Port;
use vswitch::testkit::eventually;
use vswitch::testkit::netns::{self, Netns, SwitchNode, ping};
use vswitch::wire::MacAddr;
use vswitch::{DropReason, Event, Pool};

fn open(name: &str, pool: &Arc<Pool>) -> std::io::Result<Arc<dyn Port>> {
    Ok(Arc::new(AfXdpPort::open(name, name, pool.clone())?))
}

fn pods() -> (SwitchNode, Netns, Netns) {
    netns::two_pods(open).unwrap()
}

#[test]
fn pods_ping_through_af_xdp_ports() {
    let Some(_g) = netns::exclusive() else { return };
    let (node, pa, pb) = pods();
    // veth has native XDP: the program is attached there, not in the generic hook.
    let link = node.ns.run(&["ip", "link", "show", "dev", "swa"]).unwrap();
    assert!(link.contains(" xdp ") && !link.contains("xdpgeneric"), "{link}");
    ping(&pa, "192.0.2.2").expect("pa reaches pb");
    ping(&pb, "192.0.2.1").expect("pb reaches pa");
    assert!(node.switch.stats().event(Event::KnownUnicast) >= 6);
    // Every buffer comes back once the ports are gone.
    let (pool, cap) = (node.pool.clone(), node.pool.capacity() as usize);
    let snap = node.switch.snapshot();
    drop(node);
    drop(snap);
    assert_eq!(pool.free_count(), cap, "buffers lent to the kernel all returned");
}

/// 1 MiB over TCP, pod veths set as the CNI will.
#[test]
fn tcp_through_af_xdp_ports() {
    let Some(_g) = netns::exclusive() else { return };
    let (node, pa, pb) = pods();
    kernel_ports::testkit::cni_offloads(&pa, "eth0").unwrap();
    kernel_ports::testkit::cni_offloads(&pb, "eth0").unwrap();
    assert_eq!(netns::tcp_transfer(&pb, &pa, "192.0.2.2", 5003, 1024).unwrap(), 1024 * 1024);
    let snap = node.switch.snapshot();
    let q = snap.port(snap.port_id("swb").unwrap()).unwrap().port.queue_stats()[0];
    // 1 MiB in ~1448-byte segments toward pod B, and its acknowledgements back (how many
    // depends on delayed ACKs).
    assert!(q.tx_packets > 700 && q.rx_packets > 10, "{q:?}");
}

// A trunk toward Linux's 802.1Q handling (a bridge in another namespace) with tx VLAN
// offload on: the tag reaches the switch's veth out of band, where XDP sees only the
// frame's bytes; the program puts it back from the rx VLAN hint.
kernel_ports::trunk_tests!(open);

/// Node A's switch in `sw`: pod port `pa0` and underlay `ul0` (AF_XDP) in one VNI-5001
/// bridge flooding to `peer`, its VTEP at `vtep` (the node's own address when `shared`,
/// whose next hops then come from the kernel's tables: the follower is returned too).
fn vtep_node(
    sw: Netns,
    vtep: std::net::IpAddr,
    peer: std::net::IpAddr,
    shared: bool,
    resync: Duration,
) -> (SwitchNode, Option<KernelNeighbors>) {
    let node = SwitchNode::start(
        sw,
        &["pa0", "ul0"],
        |name, pool| -> std::io::Result<Arc<dyn Port>> {
            Ok(if name == "ul0" {
                Arc::new(AfXdpPort::open_underlay(
                    name,
                    name,
                    pool.clone(),
                    UnderlayFilter { vtep, udp_port: 4789, vlan: None, shared },
                )?)
            } else {
                Arc::new(AfXdpPort::open(name, name, pool.clone())?)
            })
        },
        SwitchConfig {
            bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[peer])],
            ports: vec![PortConfig::access("pa0", "red"), PortConfig::underlay("ul0")],
            vtep: Some(VtepConfig {
                shared_address: shared,
                ..VtepConfig::new(vtep, "ul0").peer_resolved(peer, None)
            }),
        },
    )
    .unwrap();
    let follower = shared.then(|| {
        node.ns.enter(|| KernelNeighbors::start(node.switch.clone(), resync)).unwrap().unwrap()
    });
    (node, follower)
}

/// The underlay on AF_XDP with Knitter's filter program: the node keeps its own address on
/// the same interface (a TCP session to it works while VXLAN runs), the switch's dedicated
/// VTEP address carries VXLAN to Linux's own `vxlan` device, ARP/ND for it is answered by
/// the switch, and the switch resolves the peer's MAC itself (Linux answers its ARP/NS).
/// With `shared`, the VTEP's address is node A's own: its kernel answers ARP/ND, and the
/// switch takes the peer's MAC from the kernel's neighbor table.
fn underlay_shared_with_the_node(v6: bool, shared: bool) {
    let (own, vtep, remote, plen) = if v6 {
        ("2001:db8::10", "2001:db8::1", "2001:db8::2", "64")
    } else {
        ("198.51.100.10", "198.51.100.1", "198.51.100.2", "24")
    };
    let vtep = if shared { own } else { vtep };
    let netns::LinuxVxlanPeer { sw, pod_a, node_b, pod_b } =
        netns::linux_vxlan_peer(remote, plen, vtep).unwrap();
    // Node A's own address on the underlay, owned by its kernel; the VTEP's is separate.
    sw.run(&["ip", "addr", "add", &format!("{own}/{plen}"), "dev", "ul0", "nodad"]).unwrap();
    let vtep: std::net::IpAddr = vtep.parse().unwrap();
    let peer: std::net::IpAddr = remote.parse().unwrap();
    let (node, _follower) = vtep_node(sw, vtep, peer, shared, Duration::from_millis(100));
    // The node's own address answers through its kernel while the port is attached.
    ping(&node_b, own).expect("node A's own address");
    ping(&pod_a, "192.0.2.2").expect("pods across VXLAN");
    if !v6 && !shared {
        ping(&node_b, &vtep.to_string())
            .expect("the switch answers ICMP echo for its VTEP address");
    }
    // A TCP session to node A's own address while pods keep pinging across VXLAN.
    let pinger = {
        let name = pod_b.name.clone();
        std::thread::spawn(move || {
            std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &name,
                    "ping",
                    "-c",
                    "5",
                    "-i",
                    "0.2",
                    "-W",
                    "2",
                    "-q",
                    "192.0.2.1",
                ])
                .status()
        })
    };
    assert_eq!(netns::tcp_transfer(&node.ns, &node_b, own, 5004, 256).unwrap(), 256 * 1024);
    assert!(pinger.join().unwrap().unwrap().success(), "VXLAN kept working");
    // Node B learned the VTEP's MAC from the switch's own request; make it ask.
    node_b.run(&["ip", "neigh", "flush", "dev", "ul1"]).unwrap();
    ping(&pod_b, "192.0.2.1").expect("pods across VXLAN after node B forgot the VTEP's MAC");
    let s = node.switch.stats();
    assert!(s.event(Event::Decapsulated) >= 5);
    if shared {
        // The kernel answered for the address and resolved the peer; the switch only read.
        assert_eq!((s.event(Event::VtepAnswered), s.event(Event::NeighborRequests)), (0, 0));
    } else {
        assert!(s.event(Event::VtepAnswered) >= 1);
        assert!(s.event(Event::NeighborRequests) >= 1 && s.event(Event::NeighborLearned) >= 1);
    }
    let n = node.switch.neighbors();
    assert_eq!(
        n[0].2.mac,
        Some(netns::mac_of(&node_b, "ul1").unwrap()),
        "resolved to node B's MAC"
    );
    assert_eq!(s.drop(DropReason::UnderlayNotVxlan), 0, "the filter let only VTEP traffic through");
}

/// The shared-address VTEP follows the kernel's notifications, not a clock: with the full
/// read once a minute only, a neighbor the kernel learns, then one an operator replaces, is
/// in the switch's next-hop slot at once (the time it took is printed).
#[test]
fn a_changed_neighbor_is_followed_at_once() {
    let Some(_g) = netns::exclusive() else { return };
    let (own, remote, plen) = ("198.51.100.10", "198.51.100.2", "24");
    let netns::LinuxVxlanPeer { sw, node_b, pod_a: _pod_a, pod_b: _pod_b } =
        netns::linux_vxlan_peer(remote, plen, own).unwrap();
    sw.run(&["ip", "addr", "add", &format!("{own}/{plen}"), "dev", "ul0", "nodad"]).unwrap();
    let (node, _follower) =
        vtep_node(sw, own.parse().unwrap(), remote.parse().unwrap(), true, Duration::from_secs(60));
    let mac = || node.switch.neighbors().first().and_then(|n| n.2.mac);
    let followed = |want: MacAddr| {
        let t0 = std::time::Instant::now();
        while mac() != Some(want) {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "the switch still has {:?}, not {want}",
                mac()
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        t0.elapsed()
    };
    // The kernel resolves node B (the switch asked it to at its first read).
    node.ns.run(&["ping", "-c", "1", "-W", "1", remote]).unwrap();
    let learned = followed(netns::mac_of(&node_b, "ul1").unwrap());
    let moved: MacAddr = "02:00:00:00:99:01".parse().unwrap();
    node.ns
        .run(&[
            "ip",
            "neigh",
            "replace",
            remote,
            "lladdr",
            &moved.to_string(),
            "dev",
            "ul0",
            "nud",
            "permanent",
        ])
        .unwrap();
    let replaced = followed(moved);
    eprintln!(
        "next hop followed {learned:?} after the ping, {replaced:?} after `ip neigh replace`"
    );
}

#[test]
fn underlay_shared_with_the_node_ipv4() {
    let Some(_g) = netns::exclusive() else { return };
    underlay_shared_with_the_node(false, false);
}

#[test]
fn underlay_shared_with_the_node_ipv6() {
    let Some(_g) = netns::exclusive() else { return };
    underlay_shared_with_the_node(true, false);
}

#[test]
fn vtep_on_the_nodes_own_address_ipv4() {
    let Some(_g) = netns::exclusive() else { return };
    underlay_shared_with_the_node(false, true);
}

#[test]
fn vtep_on_the_nodes_own_address_ipv6() {
    let Some(_g) = netns::exclusive() else { return };
    underlay_shared_with_the_node(true, true);
}

/// Shared-address mode with the peer VTEP in another subnet: node A's kernel routes it via
/// a gateway, so the next hop whose MAC VXLAN frames need is the gateway's, found by
/// following the kernel's route (as `ip route get` does), not the peer's own neighbor
/// entry (which never exists). Node B plays the router: it owns the gateway address on the
/// underlay and its VTEP address on its loopback (this kernel has no dummy devices).
#[test]
fn shared_address_follows_the_route_to_a_peer_behind_a_router() {
    let Some(_g) = netns::exclusive() else { return };
    // Nothing reaches node A from node B before node A asks (quiet: no IPv6 solicitations or
    // MLD reports flooded over VXLAN), and node B, as a router does, asks for node A's MAC
    // from its underlay address (arp_announce 2): node A's kernel never learns the peer's
    // own address as a neighbor, only the gateway.
    let sw = Netns::quiet("ra").unwrap();
    let (pod_a, node_b, pod_b) =
        (Netns::quiet("rp").unwrap(), Netns::quiet("rb").unwrap(), Netns::quiet("rq").unwrap());
    node_b.run(&["sysctl", "-qw", "net.ipv4.conf.all.arp_announce=2"]).unwrap();
    netns::veth(&pod_a, "eth0", &sw, "pa0").unwrap();
    netns::veth(&node_b, "ul1", &sw, "ul0").unwrap();
    netns::veth(&pod_b, "eth0", &node_b, "vb0").unwrap();
    pod_a.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"]).unwrap();
    pod_b.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"]).unwrap();
    let (own, gateway, remote) = ("198.51.100.10", "198.51.100.20", "203.0.113.2");
    sw.run(&["ip", "addr", "add", &format!("{own}/24"), "dev", "ul0"]).unwrap();
    sw.run(&["ip", "route", "add", &format!("{remote}/32"), "via", gateway]).unwrap();
    node_b.run(&["ip", "addr", "add", &format!("{gateway}/24"), "dev", "ul1"]).unwrap();
    node_b.run(&["ip", "addr", "add", &format!("{remote}/32"), "dev", "lo"]).unwrap();
    netns::linux_vtep(&node_b, "ul1", remote, own, 5001, "vb0").unwrap();
    assert_eq!(
        sw.enter(|| kernel_ports::kernel_neigh::kernel_route_gateway(remote.parse().unwrap()))
            .unwrap()
            .unwrap(),
        Some(gateway.parse().unwrap()),
        "the route lookup finds the gateway"
    );
    assert_eq!(
        sw.enter(|| kernel_ports::kernel_neigh::kernel_route_gateway(gateway.parse().unwrap()))
            .unwrap()
            .unwrap(),
        None,
        "on-link"
    );
    let (vtep, peer): (std::net::IpAddr, std::net::IpAddr) =
        (own.parse().unwrap(), remote.parse().unwrap());
    let (node, _follower) = vtep_node(sw, vtep, peer, true, Duration::from_millis(100));
    ping(&pod_a, "192.0.2.2").expect("pods across VXLAN through the gateway");
    ping(&pod_b, "192.0.2.1").expect("and back");
    let n = node.switch.neighbors();
    assert_eq!(
        n[0].2.mac,
        Some(netns::mac_of(&node_b, "ul1").unwrap()),
        "resolved to the gateway's MAC"
    );
    assert!(node.switch.stats().event(Event::Decapsulated) >= 5);
    let neigh = node.ns.run(&["ip", "neigh"]).unwrap();
    assert!(!neigh.contains(remote), "the kernel never held the peer itself: {neigh}");
}

/// VXLAN in VLAN 100 on an interface whose untagged traffic is the node's own. This kernel has
/// no 802.1Q devices, so node B is a second Knitter switch (AF_PACKET ports) with the same
/// tagged underlay; node A's AF_XDP filter takes only tagged VXLAN, ARP and ICMP for its VTEP,
/// swapped in while the port runs. `through_bridge`: a Linux bridge between the nodes hands
/// node A's veth every tag out of band (tx VLAN offload on), so its filter sees them only
/// because the program puts them back first.
fn underlay_in_a_vlan(through_bridge: bool) {
    let (na, nb) = (Netns::new("na").unwrap(), Netns::new("nb").unwrap());
    let (pod_a, pod_b) = (Netns::new("pa").unwrap(), Netns::new("pb").unwrap());
    netns::veth(&pod_a, "eth0", &na, "pa0").unwrap();
    netns::veth(&pod_b, "eth0", &nb, "pb0").unwrap();
    let _mid = if through_bridge {
        let mid = Netns::quiet("mid").unwrap();
        netns::veth(&na, "ul0", &mid, "x0").unwrap();
        netns::veth(&nb, "ul1", &mid, "x1").unwrap();
        mid.run(&["ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]).unwrap();
        for x in ["x0", "x1"] {
            mid.run(&["ip", "link", "set", x, "master", "br0"]).unwrap();
            mid.run(&["ethtool", "-K", x, "txvlan", "on"]).unwrap();
        }
        mid.run(&["ip", "link", "set", "br0", "up"]).unwrap();
        Some(mid)
    } else {
        netns::veth(&na, "ul0", &nb, "ul1").unwrap();
        None
    };
    pod_a.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"]).unwrap();
    pod_b.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"]).unwrap();
    // The nodes' own (untagged) addresses on the shared interface.
    na.run(&["ip", "addr", "add", "198.51.100.10/24", "dev", "ul0"]).unwrap();
    nb.run(&["ip", "addr", "add", "198.51.100.20/24", "dev", "ul1"]).unwrap();
    let (va, vb): (std::net::IpAddr, std::net::IpAddr) =
        ("203.0.113.1".parse().unwrap(), "203.0.113.2".parse().unwrap());
    let cfg = |pod: &str, ul: &str, me, peer| SwitchConfig {
        bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[peer])],
        ports: vec![PortConfig::access(pod, "red"), PortConfig::underlay(ul)],
        vtep: Some(VtepConfig {
            underlay_vlan: Some(100),
            ..VtepConfig::new(me, ul).peer_resolved(peer, None)
        }),
    };
    // The underlay opens taking every frame (as when its VTEP is not known yet); the filter
    // is swapped in once the switch runs, with the socket bound throughout.
    let underlay = std::sync::OnceLock::new();
    let a = SwitchNode::start(
        na,
        &["pa0", "ul0"],
        |name, pool| -> std::io::Result<Arc<dyn Port>> {
            let port = Arc::new(AfXdpPort::open(name, name, pool.clone())?);
            if name == "ul0" {
                let _ = underlay.set(port.clone());
            }
            Ok(port)
        },
        cfg("pa0", "ul0", va, vb),
    )
    .unwrap();
    let f = UnderlayFilter { vtep: va, udp_port: 4789, vlan: Some(100), shared: false };
    underlay.get().unwrap().set_underlay_filter(Some(f)).unwrap();
    // Until the swap the port took every frame, the nodes' own IPv6 chatter too (counted as
    // not VXLAN); what the filter let through is counted from a moment after it, once the
    // PMD has drained frames the old program had already taken.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let before_filter = a.switch.stats().drop(DropReason::UnderlayNotVxlan);
    let b = SwitchNode::start(
        nb,
        &["pb0", "ul1"],
        |name, _pool| -> std::io::Result<Arc<dyn Port>> {
            Ok(Arc::new(AfPacketPort::open(name, name)?))
        },
        cfg("pb0", "ul1", vb, va),
    )
    .unwrap();
    ping(&pod_a, "192.0.2.2").expect("pods across VXLAN in VLAN 100");
    ping(&b.ns, "198.51.100.10").expect("node A's own untagged address, through its kernel");
    let s = a.switch.stats();
    assert!(s.event(Event::Decapsulated) >= 3, "tagged VXLAN reached node A's switch");
    // Whichever node asked first (pods' IPv6 chatter can make node B flood first), tagged ARP
    // reached node A's switch through its filter: A answered B's request or learned from
    // B's answer.
    assert!(s.event(Event::VtepAnswered) + s.event(Event::NeighborLearned) >= 1);
    assert_eq!(
        s.drop(DropReason::UnderlayNotVxlan),
        before_filter,
        "the filter let only the VTEP's frames through"
    );
}

#[test]
fn underlay_in_a_vlan_tags_in_the_frame() {
    let Some(_g) = netns::exclusive() else { return };
    underlay_in_a_vlan(false);
}

#[test]
fn underlay_in_a_vlan_tags_out_of_band() {
    let Some(_g) = netns::exclusive() else { return };
    underlay_in_a_vlan(true);
}

/// Jumbo frames cross AF_XDP ports in pieces (multi-buffer AF_XDP: the kernel hands a 8 028-
/// byte frame over in five buffers, the port chains them, and a chained packet leaves as
/// five descriptors): unfragmented 8 000-byte pings both ways at MTU 9000 everywhere. Above
/// what a port carries (9 216 bytes with a tag) a configuration is refused with the limit.
#[test]
fn jumbo_frames_cross_af_xdp_ports_in_pieces() {
    let Some(_g) = netns::exclusive() else { return };
    let (node, pa, pb) = pods();
    let snap = node.switch.snapshot();
    let port = snap.port(snap.port_id("swa").unwrap()).unwrap().port.clone();
    assert_eq!(port.max_frame(), vswitch::buf::MAX_FRAME, "multi-buffer AF_XDP (Linux ≥ 6.6)");
    for (ns, dev) in [(&pa, "eth0"), (&pb, "eth0"), (&node.ns, "swa"), (&node.ns, "swb")] {
        ns.run(&["ip", "link", "set", "dev", dev, "mtu", "9000"]).unwrap();
    }
    let mut cfg = snap.config.clone();
    drop(snap);
    for p in &mut cfg.ports {
        p.mtu = 9000;
    }
    node.switch.apply(cfg.clone()).expect("MTU 9000 on AF_XDP ports");
    let jumbo = |from: &Netns, to: &str| {
        from.run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", "-M", "do", "-s", "8000", to])
    };
    jumbo(&pa, "192.0.2.2").expect("8 000-byte pings from pa");
    jumbo(&pb, "192.0.2.1").expect("and from pb");
    assert!(port.queue_stats()[0].rx_packets >= 3 && port.queue_stats()[0].tx_packets >= 3);
    cfg.ports[0].mtu = 9300;
    let err = node.switch.apply(cfg).unwrap_err().to_string();
    assert!(err.contains("MTU 9300") && err.contains("9198"), "{err}");
    // Every piece lent to the kernel, received or sent, comes back once the ports are gone.
    let (pool, cap) = (node.pool.clone(), node.pool.capacity() as usize);
    drop(port);
    drop(node);
    assert_eq!(pool.free_count(), cap);
}

/// A burst of jumbo frames is more descriptors than copy mode sends per `sendto` (32): one
/// `tx_burst` still puts every frame on the wire, with no later burst to push the rest (the
/// port kicks again while the kernel stops at its budget with descriptors left).
#[test]
fn a_burst_of_jumbo_frames_leaves_in_one_tx_burst() {
    use vswitch::testkit::{frames, mac};
    let Some(_g) = netns::exclusive() else { return };
    // The count is the receiving veth's: the namespaces' own chatter must not add to it.
    let (a, b) = (Netns::quiet("ja").unwrap(), Netns::quiet("jb").unwrap());
    netns::veth(&a, "eth0", &b, "eth0").unwrap();
    for ns in [&a, &b] {
        ns.run(&["ip", "link", "set", "eth0", "mtu", "9000"]).unwrap();
    }
    let pool = Pool::new(4096, false).unwrap();
    let port = a.enter(|| AfXdpPort::open("ja", "eth0", pool.clone())).unwrap().unwrap();
    assert!(port.binding().multi_buffer, "this kernel has multi-buffer AF_XDP");
    let received = || -> u64 {
        b.run(&["cat", "/sys/class/net/eth0/statistics/rx_packets"])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = received();
    let ip = |n: u8| std::net::Ipv4Addr::new(192, 0, 2, n);
    let frame = frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 8000);
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    for _ in 0..vswitch::BATCH {
        batch.push(cache.alloc_frame(&frame).unwrap()).unwrap();
    }
    assert_eq!(port.tx_burst(0, &mut cache, &mut batch), vswitch::BATCH, "the ring took the burst");
    eventually(Duration::from_secs(2), || received() - before >= vswitch::BATCH as u64);
    assert_eq!(received() - before, vswitch::BATCH as u64, "every frame of the burst on the wire");
}

/// Idle pods keep what their fill rings hold (the kernel owns those buffers until frames
/// arrive), so a pod port lends 128 while the pool stays more than half free after lending
/// them and 32 after that: 200 pods fit the default pool. A port that finds the pool empty
/// is reported (`rx_starved`, once per time it runs dry) and takes buffers again once they
/// come back. The fill ring is filled at open, before frames are redirected to the socket.
#[test]
fn idle_ports_lend_a_share_of_the_pool_and_a_starved_port_is_reported() {
    let Some(_g) = netns::exclusive() else { return };
    let ns = Netns::new("fl").unwrap();
    const PORTS: usize = 14;
    for i in 0..PORTS {
        ns.run(&[
            "ip",
            "link",
            "add",
            &format!("fa{i}"),
            "type",
            "veth",
            "peer",
            "name",
            &format!("fb{i}"),
        ])
        .unwrap();
        ns.run(&["ip", "link", "set", &format!("fa{i}"), "up"]).unwrap();
        ns.run(&["ip", "link", "set", &format!("fb{i}"), "up"]).unwrap();
    }
    let pool = Pool::new(512, false).unwrap();
    let mut ports: Vec<AfXdpPort> = (0..PORTS)
        .map(|i| {
            let (name, p) = (format!("fa{i}"), pool.clone());
            ns.enter(move || AfXdpPort::open(&name, &name, p)).unwrap().unwrap()
        })
        .collect();
    assert_eq!(ports[0].fill_target(0), 128, "the first port: the pool stays more than half free");
    assert!(ports[1..].iter().all(|p| p.fill_target(0) == 32), "the others a burst's worth");
    assert_eq!(
        pool.free_count(),
        0,
        "511 = 128 + 11 × 32 + 31: the 13th got what was left, the 14th none"
    );
    let starved = |p: &AfXdpPort| p.queue_stats()[0].rx_starved;
    assert_eq!(ports[..PORTS - 1].iter().map(starved).sum::<u64>(), 0);
    assert_eq!(starved(&ports[PORTS - 1]), 1, "the port that got no buffer is reported");
    assert_eq!(ports[0].device_rx_queues(), Some(1));
    // veth has no zero-copy: the unforced bind falls back to copy mode, with need_wakeup
    // (Linux ≥ 5.4), whose transmit flag copy mode keeps set (so every burst still kicks:
    // the ping and TCP tests above fail otherwise).
    assert_eq!(
        ports[0].binding(),
        Binding { zero_copy: false, need_wakeup: true, multi_buffer: true }
    );
    // The first port goes: its buffers come back, and the starved port takes its share at
    // its next poll; once, not again.
    drop(ports.remove(0));
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    let last = ports.last().unwrap();
    for _ in 0..3 {
        assert_eq!(last.rx_burst(0, &mut cache, &mut batch), 0);
    }
    cache.flush();
    assert_eq!(pool.free_count(), 128 - 32, "the starved port took 32");
    assert_eq!(starved(last), 1);
    drop(ports);
    assert_eq!(
        pool.free_count(),
        pool.capacity() as usize,
        "and every buffer comes back when the ports close"
    );
}

/// A pod port whose traffic empties its fill ring between two polls (its PMD missed a few
/// turns) grows the ring, doubling up to the ring size while the pool has half its buffers
/// free; an idle port keeps its 128.
#[test]
fn a_busy_pod_port_grows_its_fill_ring() {
    let Some(_g) = netns::exclusive() else { return };
    // Quiet: the kernel's own chatter arriving while the test polls would be one frame more.
    let ns = Netns::quiet("fg").unwrap();
    ns.run(&["ip", "link", "add", "ga", "type", "veth", "peer", "name", "gb"]).unwrap();
    for dev in ["ga", "gb"] {
        ns.run(&["ip", "link", "set", dev, "up"]).unwrap();
    }
    let pool = Pool::new(8192, false).unwrap();
    let open = |name: &'static str| {
        let p = pool.clone();
        ns.enter(move || AfXdpPort::open(name, name, p)).unwrap().unwrap()
    };
    let (rx, tx) = (open("ga"), open("gb"));
    assert_eq!(rx.fill_target(0), 128);
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    // Nobody polls `ga` while 8 bursts arrive: the kernel takes all 128 fill buffers.
    let frame = [[0xffu8; 6].as_slice(), &[2, 0, 0, 0, 0, 1], &[0x88, 0xb5], &[0u8; 46]].concat();
    for _ in 0..8 {
        for _ in 0..32 {
            batch.push(cache.alloc_frame(&frame).unwrap()).unwrap();
        }
        tx.tx_burst(0, &mut cache, &mut batch);
        for b in batch.drain() {
            cache.free(b);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    let mut got = 0;
    for _ in 0..20 {
        got += rx.rx_burst(0, &mut cache, &mut batch);
        for b in batch.drain() {
            cache.free(b);
        }
    }
    assert_eq!(got, 128, "the kernel filled every fill buffer and dropped the rest");
    assert!(rx.fill_target(0) >= 256, "the ring grew: {}", rx.fill_target(0));
    assert_eq!(tx.fill_target(0), 128, "the idle port did not");
}

/// A device with several receive queues gets a socket on each: frames the device spreads
/// over its queues (16 UDP flows over 4) all arrive, on more than one queue, and each
/// queue transmits.
#[test]
fn a_multi_queue_device_is_read_on_every_queue() {
    let Some(_g) = netns::exclusive() else { return };
    // Quiet: the kernel's own router solicitations and MLD reports would be counted too.
    let ns = Netns::quiet("mq").unwrap();
    ns.run(&[
        "ip",
        "link",
        "add",
        "mqa",
        "numrxqueues",
        "4",
        "numtxqueues",
        "4",
        "type",
        "veth",
        "peer",
        "name",
        "mqb",
        "numrxqueues",
        "4",
        "numtxqueues",
        "4",
    ])
    .unwrap();
    for dev in ["mqa", "mqb"] {
        ns.run(&["ip", "link", "set", dev, "up"]).unwrap();
    }
    ns.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "mqb"]).unwrap();
    ns.run(&["ip", "neigh", "add", "192.0.2.1", "lladdr", "02:00:00:00:00:01", "dev", "mqb"])
        .unwrap();
    let pool = Pool::new(2048, false).unwrap();
    let p = pool.clone();
    let port = ns.enter(move || AfXdpPort::open("mqa", "mqa", p)).unwrap().unwrap();
    assert_eq!((port.device_rx_queues(), port.rx_queues(), port.tx_queues()), (Some(4), 4, 4));
    ns.enter(|| {
        for i in 0..16u16 {
            let s = std::net::UdpSocket::bind(("192.0.2.2", 20000 + i)).unwrap();
            for _ in 0..4 {
                s.send_to(&[0u8; 100], "192.0.2.1:9").unwrap();
            }
        }
    })
    .unwrap();
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    let mut per_queue = [0usize; 4];
    eventually(Duration::from_secs(2), || {
        for (q, n) in per_queue.iter_mut().enumerate() {
            *n += port.rx_burst(q as u16, &mut cache, &mut batch);
            for b in batch.drain() {
                cache.free(b);
            }
        }
        per_queue.iter().sum::<usize>() >= 64
    });
    assert_eq!(per_queue.iter().sum::<usize>(), 64, "every datagram arrived: {per_queue:?}");
    assert!(
        per_queue.iter().filter(|n| **n > 0).count() >= 2,
        "spread over the queues: {per_queue:?}"
    );
    let stats = port.queue_stats();
    assert_eq!(stats.iter().map(|s| s.rx_packets as usize).collect::<Vec<_>>(), per_queue.to_vec());
    // Queue 2 transmits (the frames reach the peer).
    let rx_before: u64 = ns
        .run(&["cat", "/sys/class/net/mqb/statistics/rx_packets"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let frame = [[0xffu8; 6].as_slice(), &[2, 0, 0, 0, 0, 1], &[0x88, 0xb5], &[0u8; 46]].concat();
    for _ in 0..8 {
        batch.push(cache.alloc_frame(&frame).unwrap()).unwrap();
    }
    assert_eq!(port.tx_burst(2, &mut cache, &mut batch), 8);
    let peer_received = || -> u64 {
        ns.run(&["cat", "/sys/class/net/mqb/statistics/rx_packets"])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    eventually(Duration::from_secs(2), || peer_received() - rx_before >= 8);
    assert_eq!(peer_received() - rx_before, 8);
    assert_eq!(port.queue_stats()[2].tx_packets, 8);
    drop(port);
    drop(cache);
    assert_eq!(pool.free_count(), pool.capacity() as usize, "every buffer came back");
}

/// TCP between a pod and a pod behind Linux's own VXLAN device keeping the kernel's default
/// offloads, over an AF_XDP underlay: XDP on the switch's veth makes the kernel stop sending
/// super-frames to it (veth drops GSO toward a peer running XDP), and checksums Linux leaves
/// partial are recognised and finished by the underlay port (a software device: it looks
/// inside VXLAN frames; see `kernel_ports::offload::finish_if_partial`).
fn tcp_with_a_linux_vxlan_peer_keeping_default_offloads(v6: bool) {
    let (vtep, remote, plen) = if v6 {
        ("2001:db8::1", "2001:db8::2", "64")
    } else {
        ("198.51.100.1", "198.51.100.2", "24")
    };
    let netns::LinuxVxlanPeer { sw, pod_a, node_b: _node_b, pod_b } =
        netns::linux_vxlan_peer(remote, plen, vtep).unwrap();
    kernel_ports::testkit::cni_offloads(&pod_a, "eth0").unwrap();
    let (node, _) = vtep_node(
        sw,
        vtep.parse().unwrap(),
        remote.parse().unwrap(),
        false,
        Duration::from_millis(100),
    );
    ping(&pod_a, "192.0.2.2").expect("pods across VXLAN");
    assert_eq!(
        netns::tcp_transfer(&pod_a, &pod_b, "192.0.2.1", 5011, 1024).unwrap(),
        1024 * 1024,
        "Linux side sends"
    );
    assert_eq!(
        netns::tcp_transfer(&pod_b, &pod_a, "192.0.2.2", 5012, 1024).unwrap(),
        1024 * 1024,
        "pod A sends"
    );
    let snap = node.switch.snapshot();
    let q = snap.port(snap.port_id("ul0").unwrap()).unwrap().port.queue_stats()[0];
    assert!(q.rx_csum > 0, "Linux left checksums partial and the port finished them: {q:?}");
    assert_eq!(q.rx_dropped, 0, "{q:?}");
}

#[test]
fn tcp_with_a_linux_vxlan_peer_keeping_default_offloads_ipv4() {
    let Some(_g) = netns::exclusive() else { return };
    tcp_with_a_linux_vxlan_peer_keeping_default_offloads(false);
}

#[test]
fn tcp_with_a_linux_vxlan_peer_keeping_default_offloads_ipv6() {
    let Some(_g) = netns::exclusive() else { return };
    tcp_with_a_linux_vxlan_peer_keeping_default_offloads(true);
}

/// 1 MiB over TCP between pods whose veths keep the kernel's default offloads: no
/// super-frames reach a veth running XDP, and the pod's partial checksums are finished.
#[test]
fn tcp_with_default_pod_offloads() {
    let Some(_g) = netns::exclusive() else { return };
    let (node, pa, pb) = pods();
    assert_eq!(netns::tcp_transfer(&pb, &pa, "192.0.2.2", 5013, 1024).unwrap(), 1024 * 1024);
    let snap = node.switch.snapshot();
    let q = snap.port(snap.port_id("swa").unwrap()).unwrap().port.queue_stats()[0];
    assert!(q.rx_csum > 0, "{q:?}");
}
