//! The kernel ports' test kit: a trunk port toward Linux's own 802.1Q handling, for the
//! kernel-port tests (AF_XDP and AF_PACKET alike), the raw endpoints that drive it, and the
//! offload settings the CNI gives a pod's veth.
//!
//! This machine's kernel has no 802.1Q devices (CONFIG_VLAN_8021Q is off), but its receive
//! path and its bridge treat tags as a VLAN subinterface's traffic would be treated: a tagged
//! frame arriving on a veth has its tag moved out of the frame (`skb_vlan_untag`), the bridge
//! forwards it so, and the veth it leaves by either writes the tag back into the frame (tx
//! VLAN offload off) or hands it to its peer out of band (on) — where a port that reads only
//! the frame's bytes would take it for untagged.

use crate::afpacket::AfPacketPort;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vswitch::batch::Batch;
use vswitch::buf::{Pool, PoolCache};
use vswitch::config::{BridgeConfig, PortConfig, SwitchConfig};
use vswitch::counters::DropReason;
use vswitch::port::Port;
use vswitch::testkit::frames;
use vswitch::testkit::mac;
use vswitch::testkit::netns::{self, Netns, SwitchNode};

pub use vswitch::testkit::netns::exclusive;

/// What the CNI does to a pod's veth: no tx checksum offload and no TSO/GSO, so frames leave
/// the pod whole and with complete checksums.
pub fn cni_offloads(ns: &Netns, dev: &str) -> io::Result<()> {
    ns.enter(|| plumbing::ethtool::pod_offloads_off(dev))?.map(drop)
}

/// A raw endpoint in a namespace: an AF_PACKET port a test drives by hand (tags arrive in
/// the frame, whatever the kernel did with them on the way).
pub struct Raw {
    port: AfPacketPort,
    cache: PoolCache,
}

impl Raw {
    pub fn open(ns: &Netns, ifname: &str, pool: &Arc<Pool>) -> io::Result<Raw> {
        let port = ns.enter(|| AfPacketPort::open(ifname, ifname))??;
        Ok(Raw { port, cache: PoolCache::new(pool.clone()) })
    }

    pub fn send(&mut self, frame: &[u8]) {
        let mut b = Batch::new();
        let buf = self.cache.alloc_frame(frame).expect("a buffer for a test frame");
        b.push(buf).expect("room in an empty batch");
        assert_eq!(
            self.port.tx_burst(0, &mut self.cache, &mut b),
            1,
            "the raw endpoint sent its frame"
        );
    }

    /// Frames received within `wait` (the kernel's own multicast chatter left out).
    pub fn recv(&mut self, wait: Duration) -> Vec<Vec<u8>> {
        let end = Instant::now() + wait;
        let mut out = Vec::new();
        let mut b = Batch::new();
        while Instant::now() < end {
            if self.port.rx_burst(0, &mut self.cache, &mut b) == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            for x in b.drain() {
                let mut f = Vec::new();
                self.cache.pool().read_frame(&x, &mut f);
                self.cache.free(x);
                let chatter = f.starts_with(&[0x33, 0x33]) || f.starts_with(&[0x01, 0x00, 0x5e]);
                if !chatter {
                    out.push(f);
                }
            }
        }
        out
    }
}

/// A trunk (VLANs 100 and 200) toward namespace "h", where a Linux bridge joins it with a
/// veth to a tagging endpoint; access ports for VLAN 100 and 200 toward two raw pods. Tagged
/// frames cross both ways with both veths of "h" set to `txvlan` (tx VLAN offload on or off):
/// each reaches only its VLAN's pod, untagged; each pod's reply comes back with its own tag;
/// the switch never counts a tagged frame as untagged.
pub fn trunk_through_a_linux_bridge(
    open: impl Fn(&str, &Arc<Pool>) -> io::Result<Arc<dyn Port>>,
    txvlan: bool,
) -> io::Result<()> {
    // The namespaces' own stacks keep quiet (no IPv6; no IGMP from the bridge, whose
    // multicast snooping joins a group): their chatter would be untagged frames on the trunk.
    let sw = Netns::quiet("sw")?;
    let (host, tagger) = (Netns::quiet("h")?, Netns::quiet("t")?);
    let (p100, p200) = (Netns::quiet("p1")?, Netns::quiet("p2")?);
    netns::veth(&host, "eth0", &sw, "swt")?;
    netns::veth(&tagger, "eth0", &host, "tg")?;
    netns::veth(&p100, "eth0", &sw, "sw1")?;
    netns::veth(&p200, "eth0", &sw, "sw2")?;
    host.run(&["ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"])?;
    let onoff = if txvlan { "on" } else { "off" };
    for dev in ["eth0", "tg"] {
        host.run(&["ip", "link", "set", dev, "master", "br0"])?;
        host.run(&["ethtool", "-K", dev, "txvlan", onoff])?;
    }
    host.run(&["ip", "link", "set", "br0", "up"])?;
    let pool = Pool::new(4096, false).map_err(io::Error::other)?;
    let mut t = Raw::open(&tagger, "eth0", &pool)?;
    let mut a = Raw::open(&p100, "eth0", &pool)?;
    let mut b = Raw::open(&p200, "eth0", &pool)?;
    let node = SwitchNode::start(
        sw,
        &["swt", "sw1", "sw2"],
        open,
        SwitchConfig {
            bridges: vec![BridgeConfig::new("v100").vlan(100), BridgeConfig::new("v200").vlan(200)],
            ports: vec![
                PortConfig::trunk("swt", &[100, 200], None),
                PortConfig::access("sw1", "v100"),
                PortConfig::access("sw2", "v200"),
            ],
            vtep: None,
        },
    )?;
    let ip = |n: u8| std::net::Ipv4Addr::new(192, 0, 2, n);
    let plain =
        |dst: u32, src: u32| frames::udp4(mac(dst), mac(src), ip(1), ip(2), 1000, 2000, 100);
    // Tagged from the far side of the bridge → untagged out of the right access port only.
    t.send(&frames::add_tag(&plain(0xa1, 0x11), 0x8100, 100));
    t.send(&frames::add_tag(&plain(0xb1, 0x12), 0x8100, 200));
    let (got_a, got_b) = (a.recv(Duration::from_millis(500)), b.recv(Duration::from_millis(200)));
    let untagged_drops = node.switch.stats().drop(DropReason::UntaggedNotAllowed);
    assert_eq!(untagged_drops, 0, "a tagged frame was taken for untagged (txvlan {onoff})");
    assert_eq!(
        got_a,
        vec![plain(0xa1, 0x11)],
        "VLAN 100 frame, untagged, at the VLAN 100 pod only"
    );
    assert_eq!(
        got_b,
        vec![plain(0xb1, 0x12)],
        "VLAN 200 frame, untagged, at the VLAN 200 pod only"
    );
    // Untagged in on the access ports → tagged out of the trunk, across the bridge.
    a.send(&plain(0x11, 0xa1));
    b.send(&plain(0x12, 0xb1));
    let mut got_t = t.recv(Duration::from_millis(500));
    got_t.sort();
    let mut want = vec![
        frames::add_tag(&plain(0x11, 0xa1), 0x8100, 100),
        frames::add_tag(&plain(0x12, 0xb1), 0x8100, 200),
    ];
    want.sort();
    assert_eq!(got_t, want, "each tagged with its own VLAN");
    Ok(())
}

/// The two trunk tests ([`trunk_through_a_linux_bridge`] with tx VLAN offload on and off) for
/// a kernel-port test file whose ports `$open` makes; each takes the namespace lock.
#[macro_export]
macro_rules! trunk_tests {
    ($open:path) => {
        #[test]
        fn trunk_keeps_tags_through_a_linux_bridge_with_tx_vlan_offload() {
            let Some(_g) = $crate::testkit::exclusive() else { return };
            $crate::testkit::trunk_through_a_linux_bridge($open, true).unwrap();
        }

        #[test]
        fn trunk_keeps_tags_through_a_linux_bridge_without_tx_vlan_offload() {
            let Some(_g) = $crate::testkit::exclusive() else { return };
            $crate::testkit::trunk_through_a_linux_bridge($open, false).unwrap();
        }
    };
}
