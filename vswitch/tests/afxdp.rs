//! AF_XDP ports against the kernel: veth pairs between namespaces the test creates (and
//! removes), Knitter's XDP program attached in generic mode, the buffer pool as UMEM.
//! Needs root; runs in the `serial` nextest group.

use std::sync::{Arc, Mutex};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::port::Port;
use vswitch::port::afxdp::AfXdpPort;
use vswitch::testkit::netns::{self, Netns, SwitchNode};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn skip() -> bool {
    if !netns::available() {
        eprintln!("skipped: needs root and iproute2 to create network namespaces");
        return true;
    }
    false
}

fn open(name: &str, pool: &Arc<vswitch::Pool>) -> std::io::Result<Arc<dyn Port>> {
    Ok(Arc::new(AfXdpPort::open(name, name, pool.clone())?))
}

fn pods() -> (SwitchNode, Netns, Netns) {
    let sw = Netns::new("sw").unwrap();
    let (pa, pb) = (Netns::new("pa").unwrap(), Netns::new("pb").unwrap());
    netns::veth(&pa, "eth0", &sw, "swa").unwrap();
    netns::veth(&pb, "eth0", &sw, "swb").unwrap();
    pa.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"]).unwrap();
    pb.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"]).unwrap();
    let node = SwitchNode::start(
        sw,
        &["swa", "swb"],
        open,
        SwitchConfig {
            bridges: vec![BridgeConfig::new("red")],
            ports: vec![PortConfig::access("swa", "red"), PortConfig::access("swb", "red")],
            vtep: None,
        },
    )
    .unwrap();
    (node, pa, pb)
}

#[test]
fn pods_ping_through_af_xdp_ports() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if skip() {
        return;
    }
    let (node, pa, pb) = pods();
    pa.run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", "192.0.2.2"]).expect("pa reaches pb");
    pb.run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", "192.0.2.1"]).expect("pb reaches pa");
    assert!(node.switch.stats().event(vswitch::Event::KnownUnicast) >= 6);
    // Every buffer comes back once the ports are gone.
    let (pool, cap) = (node.pool.clone(), node.pool.capacity() as usize);
    let snap = node.switch.snapshot();
    drop(node);
    drop(snap);
    assert_eq!(pool.free_count(), cap, "buffers lent to the kernel all returned");
}

#[test]
fn tcp_through_af_xdp_ports() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if skip() {
        return;
    }
    let (node, pa, pb) = pods();
    for ns in [&pa, &pb] {
        ns.run(&["ethtool", "-K", "eth0", "tx", "off", "tso", "off", "gso", "off"]).expect("ethtool");
    }
    let server = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("192.0.2.2", 5003))
s.listen(1)
s.settimeout(20)
c, _ = s.accept()
c.settimeout(20)
n = 0
while True:
    d = c.recv(65536)
    if not d:
        break
    n += len(d)
print(n)
"#;
    let client = r#"
import socket, time
for i in range(50):
    try:
        c = socket.create_connection(("192.0.2.2", 5003), timeout=5)
        break
    except OSError:
        time.sleep(0.1)
c.sendall(bytes(range(256)) * 4096)
c.close()
"#;
    let name = pb.name.clone();
    let srv = std::thread::spawn(move || {
        std::process::Command::new("ip").args(["netns", "exec", &name, "timeout", "30", "python3", "-c", server]).output()
    });
    pa.run(&["timeout", "30", "python3", "-c", client]).expect("client sent");
    let out = srv.join().unwrap().expect("server ran");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (256 * 4096).to_string(), "every byte arrived");
    let snap = node.switch.snapshot();
    let q = snap.port(snap.port_id("swb").unwrap()).unwrap().port.queue_stats()[0];
    assert!(q.tx_packets > 700 && q.rx_packets > 300, "{q:?}");
}

/// The underlay on AF_XDP with Knitter's filter program: the node keeps its own address on
/// the same interface (a TCP session to it works while VXLAN runs), the switch's dedicated
/// VTEP address carries VXLAN to Linux's own `vxlan` device, and ARP for it is answered by the
/// switch.
#[test]
fn underlay_shared_with_the_node_and_vxlan_with_linux() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if skip() {
        return;
    }
    let sw = Netns::new("na").unwrap();
    let (pod_a, node_b, pod_b) = (Netns::new("pa").unwrap(), Netns::new("nb").unwrap(), Netns::new("pb").unwrap());
    netns::veth(&pod_a, "eth0", &sw, "pa0").unwrap();
    netns::veth(&node_b, "ul1", &sw, "ul0").unwrap();
    netns::veth(&pod_b, "eth0", &node_b, "vb0").unwrap();
    pod_a.run(&["ip", "addr", "add", "192.0.2.1/24", "dev", "eth0"]).unwrap();
    pod_b.run(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"]).unwrap();
    // Node A's own address on the underlay, owned by its kernel; the VTEP's is .1.
    sw.run(&["ip", "addr", "add", "198.51.100.10/24", "dev", "ul0"]).unwrap();
    node_b.run(&["ip", "addr", "add", "198.51.100.2/24", "dev", "ul1"]).unwrap();
    node_b
        .run(&[
            "ip", "link", "add", "vxlan0", "type", "vxlan", "id", "5001", "local", "198.51.100.2", "remote",
            "198.51.100.1", "dstport", "4789", "dev", "ul1",
        ])
        .unwrap();
    node_b.run(&["ip", "link", "add", "br0", "type", "bridge"]).unwrap();
    for dev in ["vxlan0", "vb0"] {
        node_b.run(&["ip", "link", "set", "dev", dev, "master", "br0"]).unwrap();
    }
    node_b.run(&["ip", "link", "set", "dev", "vxlan0", "up"]).unwrap();
    node_b.run(&["ip", "link", "set", "dev", "br0", "up"]).unwrap();
    let ul1_mac: vswitch::wire::MacAddr =
        node_b.run(&["cat", "/sys/class/net/ul1/address"]).unwrap().trim().parse().unwrap();
    let vtep: std::net::Ipv4Addr = "198.51.100.1".parse().unwrap();
    let peer: std::net::IpAddr = "198.51.100.2".parse().unwrap();
    let node = SwitchNode::start(
        sw,
        &["pa0", "ul0"],
        |name, pool| -> std::io::Result<Arc<dyn Port>> {
            Ok(if name == "ul0" {
                Arc::new(AfXdpPort::open_underlay(name, name, pool.clone(), vtep, 4789)?)
            } else {
                Arc::new(AfXdpPort::open(name, name, pool.clone())?)
            })
        },
        SwitchConfig {
            bridges: vec![BridgeConfig::new("red").vni(5001).flood(&[peer])],
            ports: vec![PortConfig::access("pa0", "red"), PortConfig::underlay("ul0")],
            vtep: Some(vswitch::VtepConfig::new(vtep.into(), "ul0").peer(peer, ul1_mac)),
        },
    )
    .unwrap();
    // The node's own address answers through its kernel while the port is attached.
    node_b.run(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "-q", "198.51.100.10"]).expect("node A's own address");
    pod_a.run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "-q", "192.0.2.2"]).expect("pods across VXLAN");
    // A TCP session to node A's own address, during VXLAN traffic.
    let server = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.51.100.10", 5004))
s.listen(1)
s.settimeout(20)
c, _ = s.accept()
c.settimeout(20)
n = 0
while True:
    d = c.recv(65536)
    if not d:
        break
    n += len(d)
print(n)
"#;
    let client = r#"
import socket, time
for i in range(50):
    try:
        c = socket.create_connection(("198.51.100.10", 5004), timeout=5)
        break
    except OSError:
        time.sleep(0.1)
c.sendall(bytes(range(256)) * 1024)
c.close()
"#;
    let name = node.ns.name.clone();
    let srv = std::thread::spawn(move || {
        std::process::Command::new("ip").args(["netns", "exec", &name, "timeout", "30", "python3", "-c", server]).output()
    });
    let pinger = pod_b.run(&["ping", "-c", "5", "-i", "0.2", "-W", "2", "-q", "192.0.2.1"]);
    node_b.run(&["timeout", "30", "python3", "-c", client]).expect("TCP to node A's own address");
    let out = srv.join().unwrap().expect("server ran");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (256 * 1024).to_string());
    pinger.expect("VXLAN kept working");
    let s = node.switch.stats();
    assert!(s.event(vswitch::Event::VtepNeighborAnswered) >= 1);
    assert!(s.event(vswitch::Event::Decapsulated) >= 5);
    assert_eq!(s.drop(vswitch::DropReason::UnderlayNotVxlan), 0, "the filter let only VTEP traffic through");
}
