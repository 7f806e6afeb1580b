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
