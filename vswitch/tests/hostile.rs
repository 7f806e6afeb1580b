//! Hostile input on every port kind: random bytes, random mutations of valid frames (tagged,
//! ARP, ND, VXLAN). The switch never panics, counts what it drops, and never loses a buffer.

use proptest::prelude::*;
use vswitch::testkit::{frames, fuzz, mac};

fn valid_frames() -> Vec<Vec<u8>> {
    let o = frames::Outer {
        dst_mac: mac(0xa0),
        src_mac: mac(0xb0),
        src: "198.51.100.2".parse().unwrap(),
        dst: "198.51.100.1".parse().unwrap(),
        sport: 50000,
        dport: 4789,
        vlan: None,
    };
    let inner = frames::udp4(mac(1), mac(9), "192.0.2.9".parse().unwrap(), "192.0.2.1".parse().unwrap(), 1, 2, 80);
    vec![
        frames::udp4(mac(2), mac(1), "192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap(), 1, 2, 64),
        frames::add_tag(&inner, 0x8100, 100),
        frames::add_tag(&inner, 0x88a8, 200),
        frames::arp_request(mac(1), "192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()),
        frames::ns(mac(1), "fe80::1".parse().unwrap(), "fd00::2".parse().unwrap()),
        frames::vxlan(&o, 5001, &inner, false),
        frames::vxlan(&o, 5002, &frames::udp4(mac(1), mac(9), "192.0.2.9".parse().unwrap(), "192.0.2.1".parse().unwrap(), 1, 2, 1400), false),
    ]
}

fn record(port: u8, f: &[u8]) -> Vec<u8> {
    let mut r = vec![port, (f.len() >> 8) as u8, f.len() as u8];
    r.extend_from_slice(f);
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_or_leak(data in proptest::collection::vec(any::<u8>(), 0..4000)) {
        let mut h = fuzz::harness();
        fuzz::run(&mut h, &data);
    }

    #[test]
    fn mutated_valid_frames_never_panic_or_leak(
        picks in proptest::collection::vec((0..7usize, 0..5u8, proptest::collection::vec((any::<u16>(), any::<u8>()), 0..6), any::<u16>()), 1..12)
    ) {
        let valid = valid_frames();
        let mut data = Vec::new();
        for (which, port, flips, cut) in picks {
            let mut f = valid[which].clone();
            for (at, val) in flips {
                let i = at as usize % f.len();
                f[i] = val;
            }
            let keep = (cut as usize % (f.len() + 1)).max(f.len() / 2);
            f.truncate(keep);
            data.extend(record(port, &f));
        }
        let mut h = fuzz::harness();
        fuzz::run(&mut h, &data);
    }
}

#[test]
fn unmutated_valid_frames_are_forwarded() {
    let mut h = fuzz::harness();
    let mut data = Vec::new();
    for (i, f) in valid_frames().iter().enumerate() {
        data.extend(record(if i >= 5 { 4 } else if i == 2 { 3 } else if i == 1 { 2 } else { 0 }, f));
    }
    fuzz::run(&mut h, &data);
    let s = h.stats();
    assert_eq!(s.total_drops(), 0, "{:?}", s.nonzero_drops());
    assert_eq!(s.event(vswitch::Event::Decapsulated), 2);
}
