//! Keeps the fuzz corpus seeds in `fuzz/corpus/` in step with the frame builders: each seed
//! is a valid input (one record per frame) for the `pipeline` target, and its frames seed
//! `wire`. Run with `KNITTER_WRITE_SEEDS=1` to rewrite them.

use vswitch::testkit::{frames, mac};

fn seeds() -> Vec<(&'static str, u8, Vec<u8>)> {
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
        ("udp4", 0, frames::udp4(mac(2), mac(1), "192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap(), 1, 2, 64)),
        ("tagged", 2, frames::add_tag(&inner, 0x8100, 100)),
        ("qinq", 3, frames::add_tag(&inner, 0x88a8, 100)),
        ("arp", 0, frames::arp_request(mac(1), "192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap())),
        ("ns", 1, frames::ns(mac(1), "fe80::1".parse().unwrap(), "fd00::2".parse().unwrap())),
        ("vxlan4", 4, frames::vxlan(&o, 5001, &inner, false)),
    ]
}

#[test]
fn fuzz_seeds_are_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let write = std::env::var_os("KNITTER_WRITE_SEEDS").is_some();
    for (name, port, f) in seeds() {
        let mut rec = vec![port, (f.len() >> 8) as u8, f.len() as u8];
        rec.extend_from_slice(&f);
        for (target, bytes) in [("pipeline", &rec), ("wire", &f)] {
            let path = dir.join(target).join(format!("{name}.bin"));
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, bytes).unwrap();
            } else {
                let have = std::fs::read(&path).unwrap_or_default();
                assert_eq!(&have, bytes, "{} is stale: run with KNITTER_WRITE_SEEDS=1", path.display());
            }
        }
    }
}
