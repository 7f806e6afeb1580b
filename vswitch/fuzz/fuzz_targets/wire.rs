//! Every wire view on arbitrary bytes: `new_checked` either refuses or yields accessors
//! that never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vswitch::wire::{arp, ethernet, icmpv6, ipv4, ipv6, udp, vxlan};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = ethernet::Frame::new_checked(data) {
        let _ = ethernet::Repr::parse(&f);
        let p = f.payload();
        if let Ok(a) = arp::Packet::new_checked(p) {
            let _ = arp::Repr::parse(&a);
        }
        if let Ok(ip) = ipv4::Packet::new_checked(p) {
            let _ = (ipv4::Repr::parse(&ip), ip.checksum_ok());
            if let Ok(u) = udp::Packet::new_checked(ip.payload()) {
                if let Ok(v) = vxlan::Header::new_checked(u.payload()) {
                    let _ = v.vni();
                }
            }
        }
        if let Ok(ip) = ipv6::Packet::new_checked(p) {
            let _ = ipv6::Repr::parse(&ip);
            if let Ok(n) = icmpv6::Ndp::new_checked(ip.payload()) {
                let _ = (n.target(), n.link_layer_option());
                let _ = icmpv6::checksum_ok(&ip.src(), &ip.dst(), ip.payload());
            }
        }
    }
});
