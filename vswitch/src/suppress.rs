//! ARP and ND answers made by the switch itself, in place in the request's buffer: for
//! addresses the control plane knows in a bridge domain (suppression, instead of flooding),
//! and for the local VTEP's own address on the underlay.
//!
//! Not answered: gratuitous ARP, duplicate address detection (NS from ::), and requests for
//! addresses not known.

use crate::buf::{BufId, Pool};
use crate::snapshot::BdEntry;
use crate::wire::{MacAddr, arp, ethernet::ethertype, icmpv6, ipv6};

/// What was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Arp,
    Nd,
    /// ICMP echo reply (for the VTEP's own IPv4 address).
    Echo,
}

/// Turns an ARP request or neighbor solicitation in `b` into the reply, when `bd` knows the
/// address. `l2` is the Ethernet header length (with tag).
pub fn answer(pool: &Pool, bd: &BdEntry, b: &mut BufId, l2: usize, et: u16) -> Option<Answer> {
    match et {
        ethertype::ARP if !bd.arp.is_empty() => {
            arp_reply(pool, b, l2, |ip| bd.arp.get(&ip).copied()).then_some(Answer::Arp)
        }
        ethertype::IPV6 if !bd.nd.is_empty() => {
            // The gateway's addresses are a router's: its answers carry the Router flag.
            let known = |ip| {
                let mac = *bd.nd.get(&ip)?;
                Some((mac, crate::fdb::key(bd.id, mac.to_u64()) == bd.gateway_key))
            };
            nd_reply(pool, b, l2, known).then_some(Answer::Nd)
        }
        _ => None,
    }
}

/// Answers an ARP request, neighbor solicitation or ICMP echo request for `ip` itself, from
/// `mac` (the VTEP's own address on the underlay): untagged, or tagged in `vlan` (the
/// underlay's VLAN; the reply keeps the tag).
pub fn answer_for(
    pool: &Pool,
    b: &mut BufId,
    ip: std::net::IpAddr,
    mac: MacAddr,
    vlan: Option<u16>,
) -> Option<Answer> {
    let h = pool.head(b);
    let mut et = u16::from_be_bytes([*h.get(12)?, *h.get(13)?]);
    let mut l2 = 14;
    // On a tagged underlay the neighbors ask in its VLAN; the reply keeps the tag.
    if crate::wire::ethernet::is_tpid(et) {
        let vid = u16::from_be_bytes([*h.get(14)?, *h.get(15)?]) & 0xfff;
        if vlan != Some(vid) {
            return None;
        }
        et = u16::from_be_bytes([*h.get(16)?, *h.get(17)?]);
        l2 = 18;
    }
    match (et, ip) {
        (ethertype::ARP, std::net::IpAddr::V4(a)) => {
            arp_reply(pool, b, l2, |q| (q == a).then_some(mac)).then_some(Answer::Arp)
        }
        (ethertype::IPV6, std::net::IpAddr::V6(a)) => {
            nd_reply(pool, b, l2, |q| (q == a).then_some((mac, false))).then_some(Answer::Nd)
        }
        (ethertype::IPV4, std::net::IpAddr::V4(a)) => {
            echo_reply(pool, b, l2, a, mac).then_some(Answer::Echo)
        }
        _ => None,
    }
}

/// Turns an ICMP echo request to `ip` (its IPv4 header at `l2`) into the reply, in place.
fn echo_reply(pool: &Pool, b: &mut BufId, l2: usize, ip: std::net::Ipv4Addr, mac: MacAddr) -> bool {
    use crate::wire::{checksum, ipv4};
    let h = pool.head_mut(b);
    let Some(l3) = h.get(l2..) else { return false };
    let Ok(p) = ipv4::Packet::new_checked(l3) else { return false };
    let (ihl, total) = (p.header_len(), p.total_len() as usize);
    if p.dst() != ip || p.protocol() != 1 || p.flags_frag() & 0x3fff != 0 || total < ihl + 8 {
        return false;
    }
    let src = p.src();
    let icmp = &l3[ihl..total];
    if icmp[0] != 8 || icmp[1] != 0 || checksum::of(icmp) != 0 {
        return false;
    }
    let payload_len = (total - ihl) as u16;
    // Options are not echoed: the ICMP message moves up behind a fresh 20-byte header.
    ipv4::Repr { src: ip, dst: src, protocol: 1, ttl: 64, payload_len, dont_fragment: false }
        .emit(&mut h[l2..]);
    if ihl != ipv4::HEADER_LEN {
        h.copy_within(l2 + ihl..l2 + total, l2 + ipv4::HEADER_LEN);
    }
    let l3 = &mut h[l2..];
    let icmp = &mut l3[ipv4::HEADER_LEN..ipv4::HEADER_LEN + payload_len as usize];
    icmp[0] = 0;
    icmp[2..4].fill(0);
    let c = checksum::of(icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    swap_to_reply(h, mac);
    pool.truncate(b, l2 + ipv4::HEADER_LEN + payload_len as usize);
    true
}

fn arp_reply(
    pool: &Pool,
    b: &mut BufId,
    l2: usize,
    known: impl Fn(std::net::Ipv4Addr) -> Option<MacAddr>,
) -> bool {
    let h = pool.head_mut(b);
    let Some(body) = h.get_mut(l2..) else { return false };
    let Ok(mut p) = arp::Packet::new_checked(body) else { return false };
    if p.op() != arp::OP_REQUEST || p.spa() == p.tpa() {
        return false;
    }
    let Some(mac) = known(p.tpa()) else { return false };
    p.make_reply(mac);
    swap_to_reply(h, mac);
    true
}

fn nd_reply(
    pool: &Pool,
    b: &mut BufId,
    l2: usize,
    known: impl Fn(std::net::Ipv6Addr) -> Option<(MacAddr, bool)>,
) -> bool {
    let h = pool.head_mut(b);
    let Some(l3) = h.get(l2..) else { return false };
    let Ok(ip) = ipv6::Packet::new_checked(l3) else { return false };
    if ip.next_header() != ipv6::NEXT_ICMPV6 || ip.hop_limit() != 255 || ip.src().is_unspecified() {
        return false;
    }
    let Ok(ns) = icmpv6::Ndp::new_checked(ip.payload()) else { return false };
    if ns.msg_type() != icmpv6::TYPE_NS || ns.link_layer_option().is_none() {
        return false;
    }
    let target = ns.target();
    let Some((mac, router)) = known(target) else { return false };
    let requester = ip.src();
    if l3.len() < ipv6::HEADER_LEN + icmpv6::NA_LEN {
        return false;
    }
    let l3 = &mut h[l2..];
    ipv6::Repr {
        src: target,
        dst: requester,
        next_header: ipv6::NEXT_ICMPV6,
        hop_limit: 255,
        payload_len: icmpv6::NA_LEN as u16,
    }
    .emit(l3);
    icmpv6::emit_na(&mut l3[ipv6::HEADER_LEN..], &target, &requester, &target, mac, router);
    swap_to_reply(h, mac);
    pool.truncate(b, l2 + ipv6::HEADER_LEN + icmpv6::NA_LEN);
    true
}

/// The reply goes back to the requester, from the answered address's MAC.
fn swap_to_reply(h: &mut [u8], from: MacAddr) {
    h.copy_within(6..12, 0);
    h[6..12].copy_from_slice(&from.0);
}
