//! A fixed switch with every kind of port and feature, driven by arbitrary bytes: shared by
//! the libFuzzer target (`fuzz/`) and the stable property test (`tests/hostile.rs`).
//!
//! Input format: a sequence of records `[port selector][length hi][length lo][bytes...]`;
//! each record is one frame offered on one port. A selector with its top bit set takes one
//! more byte, the size of the first segment: the frame then arrives as a two-segment chain, as
//! from a guest's descriptors. After every frame the switch runs; at the end every buffer must
//! be back in the pool.

use super::{Harness, frames, mac};
use crate::config::{AddressPair, BridgeConfig, Neighbor, PortConfig, SwitchConfig, VtepConfig};
use std::net::IpAddr;

/// Ports the input can address.
pub const PORTS: [&str; 5] = ["pod", "access", "trunk", "qinq", "up"];

pub fn harness() -> Harness {
    harness_with(crate::pipeline::Dispatch::Fused)
}

/// [`harness`] whose pipeline runs its nodes as `dispatch` says.
pub fn harness_with(dispatch: crate::pipeline::Dispatch) -> Harness {
    let pool = crate::buf::Pool::new(2048, false).expect("buffer pool");
    let mut h = Harness::with_pool(
        pool,
        crate::switch::SwitchOptions {
            fdb_entries: 4096,
            emc_entries: 64,
            megaflow_entries: 64,
            dispatch,
        },
    );
    for p in PORTS {
        h.ring_with_mac(p, Some(mac(0xa0)));
    }
    let local: IpAddr = "198.51.100.1".parse().expect("literal");
    let peer: IpAddr = "198.51.100.2".parse().expect("literal");
    let mut red = BridgeConfig::new("red").vlan(100).vni(5001).flood(&[peer]);
    red.arp_suppression = true;
    red.neighbors = vec![
        Neighbor { ip: "192.0.2.2".parse().expect("literal"), mac: mac(2) },
        Neighbor { ip: "fd00::2".parse().expect("literal"), mac: mac(2) },
    ];
    red.mac_limit = 64;
    let mut pod = PortConfig::pod("pod", "red", mac(1), &["192.0.2.1".parse().expect("literal")]);
    if let Some(s) = pod.security.as_mut() {
        s.allowed_address_pairs.push(AddressPair { mac: mac(7), ip: None });
    }
    pod.mtu = 9000;
    let mut up = PortConfig::underlay("up");
    up.mtu = 9198;
    let mut qinq = PortConfig::trunk("qinq", &[100, 200], Some(200));
    qinq.tpid = 0x88a8;
    let cfg = SwitchConfig {
        bridges: vec![red, BridgeConfig::new("blue").vlan(200).vni(5002).flood(&[peer])],
        ports: vec![
            pod,
            PortConfig::access("access", "blue"),
            PortConfig::trunk("trunk", &[100, 200], None),
            qinq,
            up,
        ],
        vtep: Some(VtepConfig::new(local, "up").peer(peer, mac(0xb0))),
    };
    h.apply(cfg).expect("fuzz configuration is valid");
    h
}

/// Runs one input; panics (the fuzzer's finding) if a buffer leaks.
pub fn run(h: &mut Harness, mut data: &[u8]) {
    let before = {
        h.flush_caches();
        h.pool.free_count()
    };
    while data.len() >= 3 {
        let port = PORTS[(data[0] & 0x7f) as usize % PORTS.len()];
        let cut = if data[0] & 0x80 != 0 {
            let c = data.get(3).copied().unwrap_or(0) as usize;
            data = &data[1..];
            Some(c.max(1))
        } else {
            None
        };
        if data.len() < 3 {
            break;
        }
        let len = (u16::from_be_bytes([data[1], data[2]]) as usize).min(data.len() - 3);
        let frame = &data[3..3 + len];
        data = &data[3 + len..];
        if frame.len() > crate::buf::MAX_FRAME || frame.is_empty() {
            continue;
        }
        match cut {
            Some(c) => h.send_chain(port, frame, &[c]),
            None => h.send(port, frame),
        }
        h.step();
        h.recv_all();
    }
    h.flush_caches();
    assert_eq!(h.pool.free_count(), before, "buffers leaked");
}

/// Valid frames for each port kind, named, as (name, port selector, frame): the seed corpus
/// and the starting points of the mutation tests.
pub fn samples() -> Vec<(&'static str, u8, Vec<u8>)> {
    let o = frames::Outer {
        dst_mac: mac(0xa0),
        src_mac: mac(0xb0),
        src: "198.51.100.2".parse().expect("literal"),
        dst: "198.51.100.1".parse().expect("literal"),
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let (a, b) = ("192.0.2.9".parse().expect("literal"), "192.0.2.1".parse().expect("literal"));
    let inner = frames::udp4(mac(1), mac(9), a, b, 1, 2, 80);
    vec![
        (
            "udp4",
            0,
            frames::udp4(mac(2), mac(1), b, "192.0.2.2".parse().expect("literal"), 1, 2, 64),
        ),
        ("tagged", 2, frames::add_tag(&inner, 0x8100, 100)),
        ("qinq", 3, frames::add_tag(&inner, 0x88a8, 200)),
        ("arp", 0, frames::arp_request(mac(1), b, "192.0.2.2".parse().expect("literal"))),
        (
            "ns",
            0,
            frames::ns(mac(1), frames::link_local(mac(1)), "fd00::2".parse().expect("literal")),
        ),
        ("vxlan4", 4, frames::vxlan(&o, 5001, &inner, false)),
        (
            "vxlan4-blue",
            4,
            frames::vxlan(&o, 5002, &frames::udp4(mac(1), mac(9), a, b, 1, 2, 1400), false),
        ),
    ]
}

/// One input record for [`run`].
pub fn record(port: u8, frame: &[u8]) -> Vec<u8> {
    let mut r = vec![port, (frame.len() >> 8) as u8, frame.len() as u8];
    r.extend_from_slice(frame);
    r
}
