//! Port security for pod ports: allowed source MACs and IPs, with an ARP guard (sender
//! addresses must match) and an ND guard (advertised targets and link-layer options must
//! belong to the pod). Allowed-address pairs let a VNF use extra (MAC, IP) pairs, such as
//! VRRP's 00:00:5e:00:01:xx.
//!
//! Sources that every host uses before it has an address pass: 0.0.0.0 (DHCP, ARP probes),
//! :: (duplicate address detection) and IPv6 link-local addresses from allowed MACs.

use crate::counters::DropReason;
use crate::snapshot::Security;
use crate::wire::{arp, ethernet::ethertype, icmpv6, ipv6};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Checks a frame's sources; `l2` is the length of its Ethernet header (with tag).
#[inline]
pub fn check(sec: &Security, frame: &[u8], l2: usize, ethertype: u16) -> Result<(), DropReason> {
    let mac = mac_u64(&frame[6..12]);
    if !sec.mac_allowed(mac) {
        return Err(DropReason::SecurityMac);
    }
    let l3 = &frame[l2..];
    match ethertype {
        ethertype::IPV4 => {
            if l3.len() < 20 || l3[0] >> 4 != 4 {
                return Err(DropReason::SecurityIp);
            }
            let src = Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15]);
            if src.is_unspecified() || sec.ip_allowed(mac, IpAddr::V4(src)) { Ok(()) } else { Err(DropReason::SecurityIp) }
        }
        ethertype::ARP => {
            let p = arp::Packet::new_checked(l3).map_err(|_| DropReason::SecurityArp)?;
            if mac_u64(&p.sha().0) != mac {
                return Err(DropReason::SecurityArp);
            }
            let spa = p.spa();
            if spa.is_unspecified() || sec.ip_allowed(mac, IpAddr::V4(spa)) { Ok(()) } else { Err(DropReason::SecurityArp) }
        }
        ethertype::IPV6 => {
            let p = ipv6::Packet::new_checked(l3).map_err(|_| DropReason::SecurityIp)?;
            let src = p.src();
            if !(src.is_unspecified() || is_link_local(&src) || sec.ip_allowed(mac, IpAddr::V6(src))) {
                return Err(DropReason::SecurityIp);
            }
            if p.next_header() == ipv6::NEXT_ICMPV6 {
                nd_guard(sec, mac, p.payload())?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn nd_guard(sec: &Security, mac: u64, icmp: &[u8]) -> Result<(), DropReason> {
    let Some(&t) = icmp.first() else { return Ok(()) };
    if t != icmpv6::TYPE_NS && t != icmpv6::TYPE_NA {
        return Ok(());
    }
    let n = icmpv6::Ndp::new_checked(icmp).map_err(|_| DropReason::SecurityNd)?;
    if n.link_layer_option().is_some_and(|m| m.to_u64() != mac) {
        return Err(DropReason::SecurityNd);
    }
    if t == icmpv6::TYPE_NA {
        let target = n.target();
        if !(is_link_local(&target) || sec.ip_allowed(mac, IpAddr::V6(target))) {
            return Err(DropReason::SecurityNd);
        }
    }
    Ok(())
}

fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

#[inline(always)]
pub(crate) fn mac_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]])
}
