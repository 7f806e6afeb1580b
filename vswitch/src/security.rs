//! Port security for pod ports: allowed source MACs and IPs, with an ARP guard (sender
//! addresses must match), an ND guard (advertised targets and link-layer options must belong
//! to the pod; no ND behind a fragment header, RFC 6980), an RA guard (router advertisements
//! and redirects dropped, RFC 6105) and a DHCP guard (no DHCP server or relay messages),
//! the last two switched off per port for router and DHCP VNFs. Allowed-address pairs let a
//! VNF use extra (MAC, IP) pairs, such as VRRP's 00:00:5e:00:01:xx.
//!
//! Sources that every host uses before it has an address pass: 0.0.0.0 (DHCP, ARP probes)
//! and :: (duplicate address detection). An IPv6 link-local source or ND target must be the
//! pod's own (made from one of its MACs, or allowed outright): a pod cannot claim its
//! router's `fe80::` address. IPv6 extension headers are walked to the upper-layer header; a
//! first fragment whose chain does not reach it is dropped (RFC 7112).
//!
//! The DHCPv4 guard drops UDP from port 67, which servers and relays send from. The
//! exact-match cache decides for a pod's IPv4 frames without this check, so its key for them
//! holds whether bytes 34..36 (the source port, for the only header length it fills from)
//! are 67: no frame the guard drops can hit an entry (`emc::Key::lookup_from_secured_port`).

use crate::counters::DropReason;
use crate::snapshot::Security;
use crate::wire::ethernet::{self, ethertype, field};
use crate::wire::{arp, icmpv6, ipv4, ipv6};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// UDP source ports of DHCP servers and relays.
pub const DHCPV4_SERVER_PORT: u16 = 67;
pub const DHCPV6_SERVER_PORT: u16 = 547;
const UDP: u8 = 17;
/// The bytes of an upper-layer header a first fragment must hold for the guards: ICMPv6's
/// and UDP's 8 (TCP's is longer, and nothing here reads it).
const UPPER_HEADER: usize = 8;
const ICMPV6_RA: u8 = 134;
const ICMPV6_REDIRECT: u8 = 137;

/// Checks a frame's sources; `l2` is the length of its Ethernet header (with tag; the head
/// holds at least that), `mac` its source MAC as [`mac_u64`] reads it (the classifier has it).
#[inline(always)]
pub fn check(sec: &Security, frame: &[u8], l2: usize, mac: u64) -> Result<(), DropReason> {
    if let Some((own_mac, own_ip)) = sec.one_v4
        && l2 == ethernet::HEADER_LEN
        && let Some((eth, l3)) = frame.split_first_chunk::<{ ethernet::HEADER_LEN }>()
        && let Some(ip) = l3.first_chunk::<{ ipv4::HEADER_LEN }>()
        && eth[field::ETHERTYPE..field::ETHERTYPE + 2] == ethertype::IPV4.to_be_bytes()
    {
        check_one_v4(own_mac, own_ip, mac, ip)?;
        return dhcp_guard_v4(sec, l3);
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
            if l3.len() < ipv4::HEADER_LEN || l3[0] >> 4 != 4 {
                return Err(DropReason::SecurityIp);
            }
            let src = Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15]);
            if !(src.is_unspecified() || sec.ip_allowed(mac, IpAddr::V4(src))) {
                return Err(DropReason::SecurityIp);
            }
            dhcp_guard_v4(sec, l3)
        }
        ethertype::ARP => {
            let p = arp::Packet::new_checked(l3).map_err(|_| DropReason::SecurityArp)?;
            if mac_u64(&p.sha().0) != mac {
                return Err(DropReason::SecurityArp);
            }
            let spa = p.spa();
            if spa.is_unspecified() || sec.ip_allowed(mac, IpAddr::V4(spa)) {
                Ok(())
            } else {
                Err(DropReason::SecurityArp)
            }
        }
        ethertype::IPV6 => check_v6(sec, mac, l3),
        _ => Ok(()),
    }
}

/// Whether `a` may be an IPv6 source (or advertised target) of the port: its own link-local
/// addresses, its allowed addresses.
fn own_v6(sec: &Security, mac: u64, a: &Ipv6Addr) -> bool {
    if is_link_local(a) { sec.own_link_local(mac, a) } else { sec.ip_allowed(mac, IpAddr::V6(*a)) }
}

fn check_v6(sec: &Security, mac: u64, l3: &[u8]) -> Result<(), DropReason> {
    let p = ipv6::Packet::new_checked(l3).map_err(|_| DropReason::SecurityIp)?;
    let src = p.src();
    if !(src.is_unspecified() || own_v6(sec, mac, &src)) {
        return Err(DropReason::SecurityIp);
    }
    let payload = p.payload();
    // A first fragment must hold its upper-layer header whole (RFC 7112): without it the
    // guards below would have nothing to look at, and the rest comes in later fragments.
    let upper = match ipv6::upper_layer(payload, p.next_header()) {
        ipv6::UpperLayer::At { offset, fragmented: true, .. }
            if payload.len() - offset < UPPER_HEADER =>
        {
            ipv6::UpperLayer::Unknown
        }
        u => u,
    };
    match upper {
        ipv6::UpperLayer::At { proto: ipv6::NEXT_ICMPV6, offset, fragmented } => {
            icmpv6_guard(sec, mac, payload.get(offset..).unwrap_or_default(), fragmented)
        }
        ipv6::UpperLayer::At { proto: UDP, offset, .. } => {
            let sport = payload.get(offset..offset + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
            if !sec.allow_dhcp_server && sport == Some(DHCPV6_SERVER_PORT) {
                Err(DropReason::SecurityDhcp)
            } else {
                Ok(())
            }
        }
        ipv6::UpperLayer::At { .. }
        | ipv6::UpperLayer::LaterFragment
        | ipv6::UpperLayer::Opaque => Ok(()),
        ipv6::UpperLayer::Unknown => Err(DropReason::SecurityIp),
    }
}

/// The RA guard and the ND guard, on an ICMPv6 message from the port.
fn icmpv6_guard(sec: &Security, mac: u64, icmp: &[u8], fragmented: bool) -> Result<(), DropReason> {
    let Some(&t) = icmp.first() else { return Ok(()) };
    match t {
        ICMPV6_RA | ICMPV6_REDIRECT if !sec.allow_router => Err(DropReason::SecurityRa),
        icmpv6::TYPE_NS | icmpv6::TYPE_NA if fragmented => Err(DropReason::SecurityNd),
        icmpv6::TYPE_NS | icmpv6::TYPE_NA => nd_guard(sec, mac, icmp),
        _ => Ok(()),
    }
}

/// The DHCP guard on an IPv4 packet `l3` whose header the caller checked: UDP from port 67
/// in an unfragmented packet or a first fragment.
#[inline(always)]
fn dhcp_guard_v4(sec: &Security, l3: &[u8]) -> Result<(), DropReason> {
    if sec.allow_dhcp_server
        || l3.get(9) != Some(&UDP)
        || u16::from_be_bytes([l3[6], l3[7]]) & 0x1fff != 0
    {
        return Ok(());
    }
    let at = (l3[0] & 0xf) as usize * 4;
    match l3.get(at..at + 2) {
        Some(p) if u16::from_be_bytes([p[0], p[1]]) == DHCPV4_SERVER_PORT => {
            Err(DropReason::SecurityDhcp)
        }
        _ => Ok(()),
    }
}

/// [`check`] of an untagged IPv4 frame (`ip`: its first 20 bytes after the Ethernet header)
/// from a port allowing one MAC and one IPv4 address: the same verdicts as the general path
/// for that configuration (the DHCP guard aside, which the caller runs).
#[inline(always)]
fn check_one_v4(
    own_mac: u64,
    own_ip: u32,
    mac: u64,
    ip: &[u8; ipv4::HEADER_LEN],
) -> Result<(), DropReason> {
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
    let n = icmpv6::Ndp::new_checked(icmp).map_err(|_| DropReason::SecurityNd)?;
    if n.link_layer_option().is_some_and(|m| m.to_u64() != mac) {
        return Err(DropReason::SecurityNd);
    }
    if n.msg_type() == icmpv6::TYPE_NA && !own_v6(sec, mac, &n.target()) {
        return Err(DropReason::SecurityNd);
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

    fn v6_pod() -> (Security, crate::wire::MacAddr) {
        let m = crate::testkit::mac(1);
        (Security::new(vec![m.to_u64()], vec!["fd00::1".parse().unwrap()], vec![]), m)
    }

    fn verdict(sec: &Security, f: &[u8]) -> Result<(), DropReason> {
        check(sec, f, 14, mac_u64(&f[6..12]))
    }

    /// IPv6 sources and advertised targets must be the pod's own: its global addresses and
    /// the link-local address its MAC makes; a router's `fe80::1` is neither.
    #[test]
    fn link_local_addresses_must_be_the_pods_own() {
        use crate::testkit::frames;
        let (sec, m) = v6_pod();
        let (own, router) = (frames::link_local(m), "fe80::1".parse().unwrap());
        let peer = (crate::testkit::mac(9), "fd00::9".parse().unwrap());
        assert_eq!(verdict(&sec, &frames::na(m, own, own, peer.0, peer.1)), Ok(()));
        assert_eq!(
            verdict(
                &sec,
                &frames::na(
                    m,
                    "fd00::1".parse().unwrap(),
                    "fd00::1".parse().unwrap(),
                    peer.0,
                    peer.1
                )
            ),
            Ok(())
        );
        assert_eq!(
            verdict(&sec, &frames::na(m, own, router, peer.0, peer.1)),
            Err(DropReason::SecurityNd),
            "claiming the router"
        );
        assert_eq!(
            verdict(&sec, &frames::na(m, router, router, peer.0, peer.1)),
            Err(DropReason::SecurityIp),
            "from the router's address"
        );
        assert_eq!(
            verdict(&sec, &frames::ns(m, "::".parse().unwrap(), own)),
            Ok(()),
            "duplicate address detection"
        );
    }

    /// ND behind extension headers is checked as ND (an NA behind a hop-by-hop header once
    /// passed unchecked); ND in a fragment is dropped (RFC 6980); a first fragment whose
    /// header chain ends before its upper-layer header is dropped (RFC 7112).
    #[test]
    fn nd_behind_extension_headers_is_guarded() {
        use crate::testkit::frames;
        let (sec, m) = v6_pod();
        let own = frames::link_local(m);
        let na = frames::na(
            m,
            own,
            "fe80::1".parse().unwrap(),
            crate::testkit::mac(9),
            "fd00::9".parse().unwrap(),
        );
        let icmp = &na[14 + 40..];
        let hbh = (0u8, vec![0, 0, 1, 4, 0, 0, 0, 0]);
        let frag = (44u8, vec![0, 0, 0, 1, 0, 0, 0, 9]);
        let behind = |ext: &[(u8, Vec<u8>)]| {
            frames::ipv6(m, own, crate::testkit::mac(9), "fd00::9".parse().unwrap(), ext, 58, icmp)
        };
        assert_eq!(
            verdict(&sec, &behind(std::slice::from_ref(&hbh))),
            Err(DropReason::SecurityNd),
            "a foreign target behind a hop-by-hop header"
        );
        let good = frames::na(m, own, own, crate::testkit::mac(9), "fd00::9".parse().unwrap());
        let good_behind = frames::ipv6(
            m,
            own,
            crate::testkit::mac(9),
            "fd00::9".parse().unwrap(),
            std::slice::from_ref(&hbh),
            58,
            &good[14 + 40..],
        );
        assert_eq!(verdict(&sec, &good_behind), Ok(()));
        let in_fragment = frames::ipv6(
            m,
            own,
            crate::testkit::mac(9),
            "fd00::9".parse().unwrap(),
            std::slice::from_ref(&frag),
            58,
            &good[14 + 40..],
        );
        assert_eq!(verdict(&sec, &in_fragment), Err(DropReason::SecurityNd), "ND in a fragment");
        // Destination options that claim 2 KiB: the chain runs out.
        let long = (60u8, vec![0, 255, 0, 0, 0, 0, 0, 0]);
        assert_eq!(verdict(&sec, &behind(&[long])), Err(DropReason::SecurityIp));
        // A first fragment whose chain ends where the packet does (its ICMPv6 or UDP header
        // in the next fragment): dropped, not waved through with nothing to check.
        let empty_first = frames::ipv6(
            m,
            own,
            crate::testkit::mac(9),
            "fd00::9".parse().unwrap(),
            std::slice::from_ref(&frag),
            58,
            &[],
        );
        assert_eq!(verdict(&sec, &empty_first), Err(DropReason::SecurityIp));
        let udp_first = frames::ipv6(
            m,
            own,
            crate::testkit::mac(9),
            "fd00::9".parse().unwrap(),
            std::slice::from_ref(&frag),
            17,
            &[2, 35],
        );
        assert_eq!(verdict(&sec, &udp_first), Err(DropReason::SecurityIp));
        // A port with MACs only may use any address, but not its router's link-local one.
        let mac_only = Security::new(vec![m.to_u64()], vec![], vec![]);
        assert_eq!(
            verdict(
                &mac_only,
                &frames::na(
                    m,
                    own,
                    "fe80::1".parse().unwrap(),
                    crate::testkit::mac(9),
                    "fd00::9".parse().unwrap()
                )
            ),
            Err(DropReason::SecurityNd)
        );
        assert_eq!(
            verdict(
                &mac_only,
                &frames::na(
                    m,
                    "fd00::77".parse().unwrap(),
                    "fd00::77".parse().unwrap(),
                    crate::testkit::mac(9),
                    "fd00::9".parse().unwrap()
                )
            ),
            Ok(())
        );
    }

    /// Router advertisements and redirects are dropped unless the port is a router's; DHCP
    /// server and relay messages unless it is a DHCP server's (DHCPv6 behind an extension
    /// header too); clients pass.
    #[test]
    fn ra_and_dhcp_guards_and_their_switches() {
        use crate::testkit::frames;
        let (mut sec, m) = v6_pod();
        sec.ips.push("192.0.2.1".parse().unwrap());
        let own = frames::link_local(m);
        let ra = frames::ra(m, own);
        let mut redirect = ra.clone();
        redirect[14 + 40] = 137;
        let dhcp4 = frames::udp4(
            crate::wire::MacAddr::BROADCAST,
            m,
            "192.0.2.1".parse().unwrap(),
            Ipv4Addr::BROADCAST,
            67,
            68,
            300,
        );
        let client4 = frames::udp4(
            crate::wire::MacAddr::BROADCAST,
            m,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            68,
            67,
            300,
        );
        let udp6 = |sport: u16, ext: &[(u8, Vec<u8>)]| {
            let mut u = vec![0u8; 16];
            u[..2].copy_from_slice(&sport.to_be_bytes());
            u[2..4].copy_from_slice(&546u16.to_be_bytes());
            frames::ipv6(
                m,
                own,
                crate::wire::MacAddr([0x33, 0x33, 0, 1, 0, 2]),
                "ff02::1:2".parse().unwrap(),
                ext,
                17,
                &u,
            )
        };
        let dstopt = (60u8, vec![0, 0, 1, 4, 0, 0, 0, 0]);
        let dhcp6 = udp6(547, std::slice::from_ref(&dstopt));
        for (f, want) in [
            (&ra, DropReason::SecurityRa),
            (&redirect, DropReason::SecurityRa),
            (&dhcp4, DropReason::SecurityDhcp),
            (&dhcp6, DropReason::SecurityDhcp),
        ] {
            assert_eq!(verdict(&sec, f), Err(want));
        }
        assert_eq!(verdict(&sec, &client4), Ok(()));
        assert_eq!(verdict(&sec, &udp6(546, &[])), Ok(()));
        (sec.allow_router, sec.allow_dhcp_server) = (true, true);
        for f in [&ra, &redirect, &dhcp4, &dhcp6] {
            assert_eq!(verdict(&sec, f), Ok(()));
        }
        // The one-MAC-one-IPv4 shortcut has the DHCP guard too.
        let one = Security::new(vec![m.to_u64()], vec!["192.0.2.1".parse().unwrap()], vec![]);
        assert!(one.one_v4.is_some());
        assert_eq!(verdict(&one, &dhcp4), Err(DropReason::SecurityDhcp));
    }

    /// The one-MAC-one-IPv4 shortcut gives the general path's verdict on every frame.
    #[test]
    fn a_pods_shortcut_agrees_with_the_general_check() {
        let (mac, ip) = ([2, 0, 0, 0, 0, 1], [10, 0, 0, 1]);
        let fast = Security::new(vec![mac_u64(&mac)], vec![IpAddr::V4(ip.into())], vec![]);
        assert_eq!(fast.one_v4, Some((mac_u64(&mac), u32::from_ne_bytes(ip))));
        let slow =
            Security { one_v4: None, ..Security::new(fast.macs.clone(), fast.ips.clone(), vec![]) };
        let frames = [
            v4(mac, ip, 4, 60),
            v4(mac, [0, 0, 0, 0], 4, 60),
            v4(mac, [10, 0, 0, 2], 4, 60),
            v4([2, 0, 0, 0, 0, 9], ip, 4, 60),
            v4(mac, ip, 6, 60),
            v4(mac, ip, 4, 20),
        ];
        let verdicts: Vec<_> =
            frames.iter().map(|f| check(&fast, f, 14, mac_u64(&f[6..12]))).collect();
        assert_eq!(
            verdicts,
            frames.iter().map(|f| check(&slow, f, 14, mac_u64(&f[6..12]))).collect::<Vec<_>>()
        );
        assert_eq!(
            verdicts,
            vec![
                Ok(()),
                Ok(()),
                Err(DropReason::SecurityIp),
                Err(DropReason::SecurityMac),
                Err(DropReason::SecurityIp),
                Err(DropReason::SecurityIp)
            ]
        );
        let pairs = Security::new(
            fast.macs.clone(),
            fast.ips.clone(),
            vec![(mac_u64(&[0, 0, 0x5e, 0, 1, 1]), None)],
        );
        assert_eq!(pairs.one_v4, None, "allowed-address pairs take the general path");
    }
}
