//! Port security for pod ports: allowed source MACs and IPs, with an ARP guard (sender
//! addresses must match) and an ND guard (advertised targets and link-layer options must
//! belong to the pod). Allowed-address pairs let a VNF use extra (MAC, IP) pairs, such as
//! VRRP's 00:00:5e:00:01:xx.
//!
//! Sources that every host uses before it has an address pass: 0.0.0.0 (DHCP, ARP probes),
//! :: (duplicate address detection) and IPv6 link-local addresses from allowed MACs.

use crate::counters::DropReason;
use crate::snapshot::Security;
use crate::wire::ethernet::{self, ethertype};
use crate::wire::{arp, icmpv6, ipv6};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Checks a frame's sources; `l2` is the length of its Ethernet header (with tag; the head
/// holds at least that), `mac` its source MAC as [`mac_u64`] reads it (the classifier has it).
#[inline(always)]
pub fn check(sec: &Security, frame: &[u8], l2: usize, mac: u64) -> Result<(), DropReason> {
    if let Some((own_mac, own_ip)) = sec.one_v4
        && l2 == ethernet::HEADER_LEN
        && let Some((eth, l3)) = frame.split_first_chunk::<{ ethernet::HEADER_LEN }>()
        && let Some(ip) = l3.first_chunk::<20>()
        && eth[12..14] == ethertype::IPV4.to_be_bytes()
    {
        return check_one_v4(own_mac, own_ip, mac, ip);
    }
    check_general(sec, frame, l2, mac)
}

/// [`check`] for every other configuration and frame.
#[inline(never)]
fn check_general(sec: &Security, frame: &[u8], l2: usize, mac: u64) -> Result<(), DropReason> {
    if !sec.mac_allowed(mac) {
        return Err(DropReason::SecurityMac);
    }
    let Some((et, l3)) = frame.get(l2 - 2..).and_then(|t| t.split_first_chunk::<2>()) else {
        return Err(DropReason::SecurityIp);
    };
    match u16::from_be_bytes(*et) {
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

/// [`check`] of an untagged IPv4 frame (`ip`: its first 20 bytes after the Ethernet header)
/// from a port allowing one MAC and one IPv4 address: the same verdicts as the general path
/// for that configuration.
#[inline(always)]
fn check_one_v4(own_mac: u64, own_ip: u32, mac: u64, ip: &[u8; 20]) -> Result<(), DropReason> {
    if mac != own_mac {
        return Err(DropReason::SecurityMac);
    }
    if ip[0] >> 4 != 4 {
        return Err(DropReason::SecurityIp);
    }
    // `own_ip` is in the order the bytes sit in the frame (see `Security::one_v4`).
    let src = u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]);
    if src == own_ip || src == 0 { Ok(()) } else { Err(DropReason::SecurityIp) }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 frame from `mac`, `ip`, `len` bytes long, IP version `version`.
    fn v4(mac: [u8; 6], ip: [u8; 4], version: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len.max(14)];
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&ethertype::IPV4.to_be_bytes());
        if len >= 34 {
            f[14] = version << 4 | 5;
            f[26..30].copy_from_slice(&ip);
        }
        f
    }

    /// The one-MAC-one-IPv4 shortcut gives the general path's verdict on every frame.
    #[test]
    fn a_pods_shortcut_agrees_with_the_general_check() {
        let (mac, ip) = ([2, 0, 0, 0, 0, 1], [10, 0, 0, 1]);
        let fast = Security::new(vec![mac_u64(&mac)], vec![IpAddr::V4(ip.into())], vec![]);
        assert_eq!(fast.one_v4, Some((mac_u64(&mac), u32::from_ne_bytes(ip))));
        let slow = Security { one_v4: None, ..Security::new(fast.macs.clone(), fast.ips.clone(), vec![]) };
        let frames = [
            v4(mac, ip, 4, 60),
            v4(mac, [0, 0, 0, 0], 4, 60),
            v4(mac, [10, 0, 0, 2], 4, 60),
            v4([2, 0, 0, 0, 0, 9], ip, 4, 60),
            v4(mac, ip, 6, 60),
            v4(mac, ip, 4, 20),
        ];
        let verdicts: Vec<_> = frames.iter().map(|f| check(&fast, f, 14, mac_u64(&f[6..12]))).collect();
        assert_eq!(verdicts, frames.iter().map(|f| check(&slow, f, 14, mac_u64(&f[6..12]))).collect::<Vec<_>>());
        assert_eq!(
            verdicts,
            vec![Ok(()), Ok(()), Err(DropReason::SecurityIp), Err(DropReason::SecurityMac), Err(DropReason::SecurityIp), Err(DropReason::SecurityIp)]
        );
        let pairs = Security::new(fast.macs.clone(), fast.ips.clone(), vec![(mac_u64(&[0, 0, 0x5e, 0, 1, 1]), None)]);
        assert_eq!(pairs.one_v4, None, "allowed-address pairs take the general path");
    }
}
