//! AF_PACKET ports against the kernel's own stack: veth pairs between network namespaces the
//! test creates (and removes, even on failure): pods pinging and transferring through the
//! switch, a trunk keeping its tags through the kernel's tag stripping, VXLAN against Linux's
//! own `vxlan` device, and two Knitter switches as VTEPs.
//!
//! Needs root (namespaces); without it each test says so and passes vacuously (under CI it
//! fails instead). Starts PMD threads, so it runs in the `serial` nextest group, one test at a
//! time.

use kernel_ports::afpacket::AfPacketPort;
use std::sync::Arc;
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig, VtepConfig};
use vswitch::port::Port;
use vswitch::testkit::netns::{self, Netns, SwitchNode, ping};
use vswitch::{DropReason, Event, Pool};

fn open(name: &str, _pool: &Arc<Pool>) -> std::io::Result<Arc<dyn Port>> {
    Ok(Arc::new(AfPacketPort::open(name, name)?))
}

fn pods() -> (SwitchNode, Netns, Netns) {
    netns::two_pods(open).unwrap()
}

#[test]
fn pods_ping_through_the_switch() {
    let Some(_g) = netns::exclusive() else { return };
    let (node, pa, pb) = pods();
    ping(&pa, "192.0.2.2").expect("pa reaches pb");
    ping(&pb, "192.0.2.1").expect("pb reaches pa");
    let s = node.switch.stats();
    assert!(s.event(Event::Learned) >= 2);
    assert!(s.event(Event::KnownUnicast) >= 6);
}

/// 1 MiB over TCP, pod veths set as the CNI will.
#[test]
fn tcp_transfer_through_the_switch() {
    let Some(_g) = netns::exclusive() else { return };
    let (_node, pa, pb) = pods();
    kernel_ports::testkit::cni_offloads(&pa, "eth0").unwrap();
    kernel_ports::testkit::cni_offloads(&pb, "eth0").unwrap();
    assert_eq!(netns::tcp_transfer(&pb, &pa, "192.0.2.2", 5001, 1024).unwrap(), 1024 * 1024);
}

/// 1 MiB over TCP between pods whose veths keep the kernel's default offloads (TSO, tx
/// checksumming): the port cuts their super-frames and finishes their checksums.
#[test]
fn tcp_with_default_pod_offloads() {
    let Some(_g) = netns::exclusive() else { return };
    let (_node, pa, pb) = pods();
    assert_eq!(netns::tcp_transfer(&pb, &pa, "192.0.2.2", 5005, 1024).unwrap(), 1024 * 1024);
}

/// UDP between pods whose veths keep the kernel's default offloads: the sender leaves the UDP
/// checksum to "hardware" (CHECKSUM_PARTIAL); the port finishes it, so the receiver accepts
/// every datagram.
#[test]
fn udp_with_default_pod_offloads() {
    let Some(_g) = netns::exclusive() else { return };
    let (_node, pa, pb) = pods();
    assert_eq!(netns::udp_burst(&pb, &pa, "192.0.2.2", 5002, 20).unwrap(), 20);
}

// A trunk toward Linux's 802.1Q handling (a bridge in another namespace): the receive path
// moves tags out of band whatever the offloads say; the port puts them back.
kernel_ports::trunk_tests!(open);

/// Node A's switch in `sw`: `pod` (on `pa0`) and the underlay `ul0` in one VNI-5001 bridge
/// flooding to node B's VTEP at `remote`, its own at `local`.
fn vtep_node(sw: Netns, node_b: &Netns, local: &str, remote: &str, pod: PortConfig) -> SwitchNode {
    marked_vtep_node(sw, node_b, local, remote, pod, None)
}

/// [`vtep_node`] with the bridge marked with DSCP `dscp` (and so the inner ECN copied).
fn marked_vtep_node(
    sw: Netns,
    node_b: &Netns,
    local: &str,
    remote: &str,
    pod: PortConfig,
    dscp: Option<u8>,
) -> SwitchNode {
    let peer: std::net::IpAddr = remote.parse().unwrap();
    let mut red = BridgeConfig::new("red").vni(5001).flood(&[peer]);
    red.dscp = dscp;
    SwitchNode::start(
        sw,
        &["pa0", "ul0"],
        open,
        SwitchConfig {
            bridges: vec![red],
            ports: vec![pod, PortConfig::underlay("ul0")],
            // The switch's own next hop toward node B is configuration (resolution comes with
            // the rest of the underlay host stack).
            vtep: Some(
                VtepConfig::new(local.parse().unwrap(), "ul0")
                    .peer(peer, netns::mac_of(node_b, "ul1").unwrap()),
            ),
        },
    )
    .unwrap()
}

/// VXLAN against Linux's own `vxlan` device: the switch's VTEP on an AF_PACKET underlay in
/// one namespace; in another, a kernel VXLAN device (VNI 5001, port 4789) bridged with a pod.
/// Pods on both sides ping each other; Linux resolves the VTEP by ARP/ND, which the switch
/// answers, and learns the switch's inner MACs.
fn vxlan_with_linux(v6: bool) {
    let (local, remote, plen) = if v6 {
        ("2001:db8::1", "2001:db8::2", "64")
    } else {
        ("198.51.100.1", "198.51.100.2", "24")
    };
    let netns::LinuxVxlanPeer { sw, pod_a, node_b, pod_b } =
        netns::linux_vxlan_peer(remote, plen, local).unwrap();
    let node = vtep_node(sw, &node_b, local, remote, PortConfig::access("pa0", "red"));
    ping(&pod_a, "192.0.2.2").expect("pod A reaches pod B through the switch and Linux VXLAN");
    ping(&pod_b, "192.0.2.1").expect("pod B reaches pod A");
    let s = node.switch.stats();
    assert!(s.event(Event::Encapsulated) >= 6 && s.event(Event::Decapsulated) >= 6);
    assert_eq!(s.drop(DropReason::VxlanBadChecksum), 0);
    assert!(s.event(Event::VtepAnswered) >= 1, "node B asked for the VTEP address");
    let fdb = node_b.run(&["bridge", "fdb", "show", "dev", "vxlan0"]).unwrap();
    assert!(fdb.contains(local), "Linux learned pod A behind the switch's VTEP: {fdb}");
}

#[test]
fn vxlan_interop_with_linux_ipv4() {
    let Some(_g) = netns::exclusive() else { return };
    vxlan_with_linux(false);
}

#[test]
fn vxlan_interop_with_linux_ipv6() {
    let Some(_g) = netns::exclusive() else { return };
    vxlan_with_linux(true);
}

/// Marked VXLAN frames against Linux's own device: the switch's bridge marked DSCP 40 (CS5),
/// Linux's `vxlan0` set to `tos inherit`. Pod A's pings carry ECT(0): on node B's wire their
/// outer header has TOS 0xa2 (CS5 and the inner ECN copied, RFC 6040), and Linux delivers
/// them; pod B's replies come back with an outer TOS Linux inherited from the inner header,
/// which the switch decapsulates and delivers.
#[test]
fn marked_vxlan_interop_with_linux() {
    let Some(_g) = netns::exclusive() else { return };
    let netns::LinuxVxlanPeer { sw, pod_a, node_b, pod_b: _pod_b } =
        netns::linux_vxlan_peer("198.51.100.2", "24", "198.51.100.1").unwrap();
    node_b.run(&["ip", "link", "set", "dev", "vxlan0", "type", "vxlan", "tos", "inherit"]).unwrap();
    let node = marked_vtep_node(
        sw,
        &node_b,
        "198.51.100.1",
        "198.51.100.2",
        PortConfig::access("pa0", "red"),
        Some(40),
    );
    ping(&pod_a, "192.0.2.2").expect("pods across marked VXLAN");
    // The outer and inner TOS of the first ICMP echo from pod A seen on node B's underlay.
    let capture = r#"
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.bind(("ul1", 0))
s.settimeout(8)
while True:
    f = s.recv(4096)
    if len(f) > 84 and f[23] == 17 and f[36:38] == b"\x12\xb5" and f[26:30] == bytes([198, 51, 100, 1]) and f[73] == 1 and f[84] == 8:
        print(f[15], f[65])
        sys.exit(0)
"#;
    let name = node_b.name.clone();
    let cap = std::thread::spawn(move || {
        netns::run(&["ip", "netns", "exec", &name, "timeout", "10", "python3", "-c", capture])
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    pod_a
        .run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", "-Q", "2", "192.0.2.2"])
        .expect("ECN-capable pings across");
    let seen = cap.join().unwrap().expect("an echo request seen on node B's underlay");
    assert_eq!(seen.trim(), "162 2", "outer TOS CS5 + ECT(0) (0xa2) over the inner ECT(0)");
    let s = node.switch.stats();
    assert!(s.event(Event::Decapsulated) >= 6, "the replies came back through the switch");
    assert_eq!(s.drop(DropReason::VxlanCeNotEct), 0);
}

/// Two Knitter switches as VTEPs over a veth underlay (AF_PACKET), carrying two VNIs: pods in
/// the same VNI talk, a frame in one VNI never reaches the other's pods.
#[test]
fn two_switches_as_vteps_keep_vnis_apart() {
    let Some(_g) = netns::exclusive() else { return };
    let (sw1, sw2) = (Netns::new("s1").unwrap(), Netns::new("s2").unwrap());
    netns::veth(&sw1, "ul", &sw2, "ul").unwrap();
    let mut pods = Vec::new();
    for (sw, side) in [(&sw1, 1u8), (&sw2, 2u8)] {
        for (vni_i, name) in [(0u8, "red"), (1u8, "blue")] {
            let pod = Netns::new("p").unwrap();
            let dev = format!("{name}{side}");
            netns::veth(&pod, "eth0", sw, &dev).unwrap();
            // Both VNIs use the same subnet: only the VNI keeps them apart.
            let addr = format!("192.0.2.{}/24", side * 10 + vni_i);
            pod.run(&["ip", "addr", "add", &addr, "dev", "eth0"]).unwrap();
            pods.push((side, name, pod));
        }
    }
    let (mac1, mac2) = (netns::mac_of(&sw1, "ul").unwrap(), netns::mac_of(&sw2, "ul").unwrap());
    let ip = |n: u8| -> std::net::IpAddr { std::net::Ipv4Addr::new(198, 51, 100, n).into() };
    let start = |ns: Netns, side: u8, peer_mac| {
        let other = 3 - side;
        let (red, blue) = (format!("red{side}"), format!("blue{side}"));
        SwitchNode::start(
            ns,
            &["ul", &red, &blue],
            open,
            SwitchConfig {
                bridges: vec![
                    BridgeConfig::new("red").vni(1001).flood(&[ip(other)]),
                    BridgeConfig::new("blue").vni(1002).flood(&[ip(other)]),
                ],
                ports: vec![
                    PortConfig::underlay("ul"),
                    PortConfig::access(&red, "red"),
                    PortConfig::access(&blue, "blue"),
                ],
                vtep: Some(VtepConfig::new(ip(side), "ul").peer(ip(other), peer_mac)),
            },
        )
        .unwrap()
    };
    let n1 = start(sw1, 1, mac2);
    let n2 = start(sw2, 2, mac1);
    let pod =
        |side: u8, name: &str| &pods.iter().find(|(s, n, _)| *s == side && *n == name).unwrap().2;
    ping(pod(1, "red"), "192.0.2.20").expect("red 1 reaches red 2");
    ping(pod(1, "blue"), "192.0.2.21").expect("blue 1 reaches blue 2");
    // red 1 looking for blue 2's address: the ARP request floods in VNI 1001 only.
    assert!(
        pod(1, "red")
            .run(&["ping", "-c", "2", "-i", "0.2", "-W", "1", "-q", "192.0.2.21"])
            .is_err()
    );
    for n in [&n1, &n2] {
        let s = n.switch.stats();
        assert!(s.event(Event::Decapsulated) > 0);
        assert_eq!(s.drop(DropReason::VxlanUnknownVtep), 0);
    }
}

/// Offload control over ethtool netlink, checked with the `ethtool` program: the pod-side
/// offloads go off and come back on, one by one, on a veth in a namespace of its own.
#[test]
fn ethtool_netlink_turns_pod_offloads_off() {
    let Some(_g) = netns::exclusive() else { return };
    use plumbing::ethtool::{Ethtool, POD_OFFLOADS, pod_offloads_off};
    let ns = Netns::new("et").unwrap();
    ns.run(&["ip", "link", "add", "ea", "type", "veth", "peer", "name", "eb"]).unwrap();
    let shown = |name: &str| -> String {
        let out = ns.run(&["ethtool", "-k", "ea"]).unwrap();
        out.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .unwrap_or("absent")
            .to_string()
    };
    assert!(
        shown("tx-checksum-ip-generic").starts_with("on"),
        "veth starts with tx checksum offload"
    );
    let kept = ns.enter(|| pod_offloads_off("ea")).unwrap().unwrap();
    assert!(kept.is_empty(), "veth lets every pod offload go: {kept:?}");
    // `ethtool -k` shows some features under their legacy names.
    for name in [
        "tx-checksum-ip-generic",
        "tx-tcp-segmentation",
        "generic-segmentation-offload",
        "tx-vlan-offload",
    ] {
        assert!(shown(name).starts_with("off"), "{name} is {}", shown(name));
    }
    let f = ns.enter(|| Ethtool::open().and_then(|mut e| e.features("ea"))).unwrap().unwrap();
    assert!(POD_OFFLOADS.iter().all(|n| !f.is_on(n)));
    assert!(f.is_on("tx-scatter-gather"), "other features untouched");
    // And back on, as `ethtool -K ea tx on` would.
    let still = ns
        .enter(|| {
            Ethtool::open().and_then(|mut e| e.set("ea", &[("tx-checksum-ip-generic", true)]))
        })
        .unwrap()
        .unwrap();
    assert!(still.is_empty());
    assert!(shown("tx-checksum-ip-generic").starts_with("on"));
    assert!(
        ns.enter(|| Ethtool::open().and_then(|mut e| e.features("no-such-dev"))).unwrap().is_err()
    );
}

/// TCP between a pod and a pod behind Linux's own VXLAN device with the kernel's default
/// offloads on node B (its `vxlan0`, bridge, pod and underlay veths keep tx checksumming, TSO
/// and GSO): Linux hands the underlay checksum-partial frames and 64 KB VXLAN super-frames;
/// the port finishes the inner checksum and cuts them (over IPv6 with the outer UDP checksum
/// Linux asks for). 1 MiB each way.
fn tcp_with_a_linux_vxlan_peer_keeping_default_offloads(v6: bool) {
    let (local, remote, plen) = if v6 {
        ("2001:db8::1", "2001:db8::2", "64")
    } else {
        ("198.51.100.1", "198.51.100.2", "24")
    };
    let netns::LinuxVxlanPeer { sw, pod_a, node_b, pod_b } =
        netns::linux_vxlan_peer(remote, plen, local).unwrap();
    kernel_ports::testkit::cni_offloads(&pod_a, "eth0").unwrap();
    let pod = PortConfig::pod(
        "pa0",
        "red",
        netns::mac_of(&pod_a, "eth0").unwrap(),
        &["192.0.2.1".parse().unwrap()],
    );
    let node = vtep_node(sw, &node_b, local, remote, pod);
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
    assert!(q.rx_gso > 0, "Linux sent super-frames and the port cut them: {q:?}");
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

fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Pod ports cost what a pod needs: rings sized from the veth's MTU (2 KiB slots for 1500),
/// so 32 ports add well under 1 MiB each to the process (they used to map 12 MiB each).
/// A frame longer than the send slots (the MTU raised after the port opened) is dropped and
/// counted, not sent cut short; a frame that fits goes out whole.
#[test]
fn pod_ports_rings_fit_the_mtu() {
    use vswitch::testkit::{frames, mac};
    let Some(_g) = netns::exclusive() else { return };
    let (a, b) = (Netns::quiet("ra").unwrap(), Netns::quiet("rb").unwrap());
    const PORTS: usize = 32;
    for i in 0..PORTS {
        netns::veth(&a, &format!("p{i}"), &b, &format!("p{i}")).unwrap();
    }
    let pool = Pool::new(4096, false).unwrap();
    let mut cache = vswitch::PoolCache::new(pool.clone());
    let mut batch = vswitch::Batch::new();
    let before = vm_rss_kib();
    let ports: Vec<AfPacketPort> = (0..PORTS)
        .map(|i| {
            a.enter(|| AfPacketPort::open(&format!("p{i}"), &format!("p{i}"))).unwrap().unwrap()
        })
        .collect();
    // Touch every ring page the kernel maps (RSS counts mapped pages once used).
    for p in &ports {
        p.rx_burst(0, &mut cache, &mut batch);
        for b in batch.drain() {
            cache.free(b);
        }
    }
    let per_port = (vm_rss_kib().saturating_sub(before)) / PORTS as u64;
    eprintln!("{per_port} KiB of RSS per AF_PACKET pod port");
    assert!(per_port < 1024, "{per_port} KiB per AF_PACKET pod port");

    let port = &ports[0];
    let sent = || -> u64 {
        a.run(&["cat", "/sys/class/net/p0/statistics/tx_packets"]).unwrap().trim().parse().unwrap()
    };
    let ip = |n: u8| std::net::Ipv4Addr::new(192, 0, 2, n);
    let (fits, too_long) = (
        frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 1400),
        frames::udp4(mac(2), mac(1), ip(1), ip(2), 1000, 2000, 3000),
    );
    let before = sent();
    batch.push(cache.alloc_frame(&too_long).unwrap()).unwrap();
    batch.push(cache.alloc_frame(&fits).unwrap()).unwrap();
    assert_eq!(port.tx_burst(0, &mut cache, &mut batch), 2, "both taken off the batch");
    let q = port.queue_stats()[0];
    assert_eq!((q.tx_dropped, q.tx_packets), (1, 1), "{q:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while sent() - before < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(sent() - before, 1, "the frame that fits went out");
}
