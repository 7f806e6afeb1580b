//! The local VXLAN tunnel endpoint (RFC 7348): outer-header templates per remote peer,
//! encapsulation and decapsulation of packets in place.
//!
//! Encapsulation copies a precomputed outer header (Ethernet [+ tag] + IPv4/IPv6 + UDP +
//! VXLAN) into the packet's headroom and patches five fields: IP length, IPv4 checksum
//! (incrementally from a precomputed sum), UDP length, UDP source port (from the inner flow
//! hash) and the VNI. IPv4 goes out with DF set and a zero UDP checksum; IPv6 with the UDP
//! checksum computed over the whole frame unless the zero-checksum option is on.
//!
//! Decapsulation accepts a frame only if it is IPv4/IPv6 to our VTEP address, UDP to our
//! port, unfragmented, with valid lengths, IPv4 checksum, the I flag, a known VNI, and a
//! source VTEP in that VNI's flood list.

use crate::buf::{BufId, Pool, PoolView};
use crate::config::ConfigError;
use crate::config::{PeerConfig, VtepConfig};
use crate::counters::DropReason;
use crate::wire::{MacAddr, checksum, ethernet, ipv4, ipv6, udp, vxlan};
use std::net::IpAddr;

/// The outer header [`VtepEntry::classify_plain`] reads: Ethernet + IPv4 + UDP + VXLAN.
pub const PLAIN_OUTER: usize =
    ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + vxlan::HEADER_LEN;

/// Maximum outer header: Ethernet + tag + IPv6 + UDP + VXLAN.
pub const MAX_OUTER: usize = ethernet::HEADER_LEN
    + ethernet::TAG_LEN
    + ipv6::HEADER_LEN
    + udp::HEADER_LEN
    + vxlan::HEADER_LEN;

/// How a bridge domain's encapsulated frames are marked for the underlay (its network's
/// plane): the outer header's DSCP, and the 802.1p priority on a tagged underlay. The
/// outer ECN field is the inner frame's (RFC 6040's normal mode).
/// Unmarked (neither set), the outer headers are the template's, ECN field 0 — as Linux's
/// and OVS's VXLAN by default (`tos 0`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marking {
    pub dscp: u8,
    pub pcp: u8,
    /// Either was configured: mark, and copy the inner ECN field.
    pub set: bool,
    /// The domain's frames leave the underlay port first (`BridgeConfig::priority`).
    pub priority: bool,
}

impl Marking {
    pub const UNMARKED: Marking = Marking { dscp: 0, pcp: 0, set: false, priority: false };

    /// A bridge domain's marking, refused when out of range.
    pub fn of(b: &crate::config::BridgeConfig) -> Result<Marking, ConfigError> {
        let check = |what, v: Option<u8>, max: u8| match v {
            Some(value) if value > max => {
                Err(ConfigError::BadMarking { bridge: b.name.clone(), what, value, max })
            }
            v => Ok(v.unwrap_or(0)),
        };
        let set = b.dscp.is_some() || b.pcp.is_some();
        Ok(Marking {
            dscp: check("DSCP", b.dscp, 63)?,
            pcp: check("802.1p priority", b.pcp, 7)?,
            set,
            priority: b.priority,
        })
    }
}

/// ECN codepoints (RFC 3168).
mod ecn {
    pub const NOT_ECT: u8 = 0;
    pub const ECT1: u8 = 1;
    pub const ECT0: u8 = 2;
    pub const CE: u8 = 3;
}

/// The ECN field of an inner frame's IP header, from its EtherType and its 16th byte
/// (untagged IPv4 or IPv6; anything else is not ECN-capable).
#[inline(always)]
fn ecn_of(ethertype: u16, byte15: u8) -> u8 {
    match ethertype {
        0x0800 => byte15 & 3,
        0x86dd => (byte15 >> 4) & 3,
        _ => ecn::NOT_ECT,
    }
}

/// [`ecn_of`] a frame's head (too short: not ECN-capable).
fn inner_ecn(f: &[u8]) -> u8 {
    match f.first_chunk::<16>() {
        Some(h) => ecn_of(u16::from_be_bytes([h[12], h[13]]), h[15]),
        None => ecn::NOT_ECT,
    }
}

/// The inner ECN field after decapsulation (RFC 6040 section 4.2); `None`: drop (congestion
/// the inner transport cannot be told of).
fn decapsulated_ecn(inner: u8, outer: u8) -> Option<u8> {
    match (inner, outer) {
        (ecn::NOT_ECT, ecn::CE) => None,
        (_, ecn::CE) => Some(ecn::CE),
        (ecn::ECT0, ecn::ECT1) => Some(ecn::ECT1),
        (i, _) => Some(i),
    }
}

/// Applies an outer ECN field of ECT(1) or CE to the inner IP header (IPv4's checksum
/// updated as RFC 1624 says); inner frames that are not IP pass unchanged.
fn propagate_ecn(f: &mut [u8], outer: u8) -> Result<(), DropReason> {
    let inner = inner_ecn(f);
    let is_ip = matches!(f.get(12..14), Some([0x08, 0x00] | [0x86, 0xdd]));
    if !is_ip || f.len() < 14 + 20 {
        return Ok(());
    }
    let new = decapsulated_ecn(inner, outer).ok_or(DropReason::VxlanCeNotEct)?;
    if new == inner {
        return Ok(());
    }
    if f[12] == 0x08 {
        let old_word = u16::from_be_bytes([f[14], f[15]]);
        f[15] = (f[15] & !3) | new;
        let new_word = u16::from_be_bytes([f[14], f[15]]);
        let hc = u16::from_be_bytes([f[24], f[25]]);
        // HC' = ~(~HC + ~m + m')
        let sum = (!hc) as u64 + (!old_word) as u64 + new_word as u64;
        f[24..26].copy_from_slice(&(!checksum::fold(sum)).to_be_bytes());
    } else {
        f[15] = (f[15] & !0x30) | new << 4;
    }
    Ok(())
}

/// What admitting a decapsulated frame asks of the configuration (the snapshot answers):
/// which bridge domain a VNI is, which peer an outer source is, and whether that domain
/// floods to that peer (frames are taken only from peers in the domain's flood list).
pub trait Admission {
    fn bd_of_vni(&self, vni: u32) -> Option<u16>;
    fn peer_of(&self, ip: &IpAddr) -> Option<u16>;
    fn floods_to(&self, bd: u16, peer: u16) -> bool;
}

/// Outer header layouts: IPv4 or IPv6, with or without an underlay VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    V4,
    V4Tagged,
    V6,
    V6Tagged,
}

/// The local VTEP as the fast path sees it.
#[derive(Debug, Clone)]
pub struct VtepEntry {
    pub local: IpAddr,
    local_v4: u32,
    pub udp_port: u16,
    pub underlay_port: u16,
    pub mac: MacAddr,
    pub underlay_vlan: Option<u16>,
    src_lo: u16,
    src_span: u32,
    ttl: u8,
    v6_zero_csum: bool,
    /// Outer L2 header length (14 or 18).
    l2_len: usize,
    /// Whole outer header length.
    pub outer_len: usize,
    /// Underlay L3 MTU.
    pub mtu: u16,
    /// The node's kernel owns the address (see `VtepConfig::shared_address`).
    pub shared: bool,
}

/// A remote VTEP with its outer-header template.
#[derive(Debug, Clone)]
pub struct PeerEntry {
    pub id: u16,
    pub ip: IpAddr,
    /// The next-hop address to resolve, when no next-hop MAC is configured (the template's
    /// destination MAC is then written per frame).
    pub resolve: Option<IpAddr>,
    template: [u8; MAX_OUTER],
    /// One's-complement sum of the IPv4 header template without length (IPv4) or of the
    /// pseudo-header addresses and next header (IPv6).
    base_sum: u64,
}

impl VtepEntry {
    pub fn new(
        v: &VtepConfig,
        underlay_port: u16,
        mac: MacAddr,
        mtu: u16,
    ) -> Result<VtepEntry, ConfigError> {
        let err = |what: String| ConfigError::Vtep { what };
        if v.udp_port == 0 {
            return Err(err("UDP port 0 is not valid".into()));
        }
        if v.src_port_min > v.src_port_max || v.src_port_min == 0 {
            return Err(err(format!(
                "UDP source port range {}..={} is empty",
                v.src_port_min, v.src_port_max
            )));
        }
        if let Some(t) = v.underlay_vlan
            && !(1..=4094).contains(&t)
        {
            return Err(err(format!("underlay VLAN {t} is out of range 1..=4094")));
        }
        if v.local_ip.is_unspecified() || v.local_ip.is_multicast() {
            return Err(err(format!("local address {} is not a unicast address", v.local_ip)));
        }
        let l2_len = ethernet::header_len(v.underlay_vlan.is_some());
        let l3 = if v.local_ip.is_ipv4() { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        Ok(VtepEntry {
            local: v.local_ip,
            local_v4: match v.local_ip {
                IpAddr::V4(a) => u32::from(a),
                IpAddr::V6(_) => 0,
            },
            udp_port: v.udp_port,
            underlay_port,
            mac,
            underlay_vlan: v.underlay_vlan,
            src_lo: v.src_port_min,
            src_span: (v.src_port_max - v.src_port_min) as u32 + 1,
            ttl: v.ttl,
            v6_zero_csum: v.ipv6_zero_checksum,
            l2_len,
            outer_len: l2_len + l3 + udp::HEADER_LEN + vxlan::HEADER_LEN,
            mtu,
            shared: v.shared_address,
        })
    }

    /// Builds a peer's outer-header template.
    pub fn peer(&self, id: u16, p: &PeerConfig) -> Result<PeerEntry, ConfigError> {
        if p.ip.is_ipv4() != self.local.is_ipv4() {
            return Err(ConfigError::Vtep {
                what: format!("peer {} is not of the local address's family", p.ip),
            });
        }
        if p.next_hop_mac.is_some_and(|m| m.is_group()) {
            return Err(ConfigError::Vtep {
                what: format!("peer {}: next-hop MAC is a group address", p.ip),
            });
        }
        if let Some(nh) = p.next_hop {
            if nh.is_ipv4() != self.local.is_ipv4() || nh.is_unspecified() || nh.is_multicast() {
                return Err(ConfigError::Vtep {
                    what: format!(
                        "peer {}: next hop {nh} is not a unicast address of the local family",
                        p.ip
                    ),
                });
            }
            if p.next_hop_mac.is_some() {
                return Err(ConfigError::Vtep {
                    what: format!(
                        "peer {}: give a next-hop address or a next-hop MAC, not both",
                        p.ip
                    ),
                });
            }
        }
        let resolve = p.next_hop_mac.is_none().then(|| p.next_hop.unwrap_or(p.ip));
        let mut t = [0u8; MAX_OUTER];
        let eth = ethernet::Repr {
            dst: p.next_hop_mac.unwrap_or(MacAddr([0; 6])),
            src: self.mac,
            tag: self.underlay_vlan.map(|v| (ethernet::ethertype::VLAN, v)),
            ethertype: if p.ip.is_ipv4() {
                ethernet::ethertype::IPV4
            } else {
                ethernet::ethertype::IPV6
            },
        };
        eth.emit(&mut t);
        let l3 = &mut t[self.l2_len..];
        let base_sum = match (self.local, p.ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                ipv4::Repr {
                    src,
                    dst,
                    protocol: ipv4::PROTO_UDP,
                    ttl: self.ttl,
                    payload_len: 0,
                    dont_fragment: true,
                }
                .emit(l3);
                // Sum of the header with total length and checksum zeroed.
                l3[ipv4::offsets::TOTAL_LEN..ipv4::offsets::TOTAL_LEN + 2].fill(0);
                l3[ipv4::offsets::CHECKSUM..ipv4::offsets::CHECKSUM + 2].fill(0);
                checksum::accumulate(0, &l3[..ipv4::HEADER_LEN], &mut false)
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                ipv6::Repr {
                    src,
                    dst,
                    next_header: ipv6::NEXT_UDP,
                    hop_limit: self.ttl,
                    payload_len: 0,
                }
                .emit(l3);
                ipv6::pseudo_header_sum(&src, &dst, ipv6::NEXT_UDP, 0)
            }
            _ => unreachable!("families checked above"),
        };
        let l4 = self.l2_len + if p.ip.is_ipv4() { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        udp::emit(&mut t[l4..], 0, self.udp_port, 0, 0);
        vxlan::emit(&mut t[l4 + udp::HEADER_LEN..], 0);
        let base_sum = checksum::fold(base_sum) as u64;
        Ok(PeerEntry { id, ip: p.ip, resolve, template: t, base_sum })
    }

    /// The outer header's layout; [`VtepEntry::encap_as`] has one body per layout.
    pub fn layout(&self) -> Layout {
        match (self.local_v4 != 0, self.l2_len) {
            (true, 14) => Layout::V4,
            (true, _) => Layout::V4Tagged,
            (false, 14) => Layout::V6,
            (false, _) => Layout::V6Tagged,
        }
    }

    /// Encapsulates the (untagged) inner frame `b` toward `peer` in VNI `vni`.
    #[inline]
    pub fn encap(
        &self,
        pool: &Pool,
        b: &mut BufId,
        peer: &PeerEntry,
        vni: u32,
        mark: Marking,
    ) -> Result<(), DropReason> {
        match self.layout() {
            Layout::V4 => self.encap_as::<true, 14, 50, true>(pool, b, peer, vni, mark),
            Layout::V4Tagged => self.encap_as::<true, 18, 54, true>(pool, b, peer, vni, mark),
            Layout::V6 => self.encap_as::<false, 14, 70, true>(pool, b, peer, vni, mark),
            Layout::V6Tagged => self.encap_as::<false, 18, 74, true>(pool, b, peer, vni, mark),
        }
    }

    /// [`VtepEntry::encap`] for one layout (`V4`, outer L2 length, whole outer length), which
    /// must be this VTEP's: every offset is a constant and the template copy a fixed-size
    /// move. A caller encapsulating a burst picks the layout once.
    #[inline(always)]
    pub fn encap_as<const V4: bool, const L2: usize, const OUTER: usize, const MARK: bool>(
        &self,
        pool: &Pool,
        b: &mut BufId,
        peer: &PeerEntry,
        vni: u32,
        mark: Marking,
    ) -> Result<(), DropReason> {
        debug_assert_eq!(OUTER, self.outer_len);
        // Grow into the headroom first: one metadata read gives the room, the inner length
        // and the inner bytes to hash; a frame refused below is shrunk back.
        let Some((h, inner)) = pool.prepend_counted(b, OUTER) else {
            return Err(DropReason::NoBuffer);
        };
        if inner + OUTER - L2 > self.mtu as usize {
            pool.strip(b, OUTER);
            return Err(DropReason::EncapTooBig);
        }
        let Some(hashed) = h.get(OUTER..).and_then(|f| f.first_chunk::<HASHED>()) else {
            return self.encap_short::<V4, L2, OUTER>(pool, b, peer, vni, mark, inner);
        };
        let hash = flow_hash_of(hashed);
        if MARK && mark.set {
            let ecn = ecn_of(u16::from_be_bytes([hashed[12], hashed[13]]), hashed[15]);
            self.write_outer::<V4, L2, OUTER, true>(
                h,
                peer,
                vni,
                (mark.dscp << 2 | ecn, mark.pcp),
                inner,
                hash,
            );
        } else {
            self.write_outer::<V4, L2, OUTER, false>(h, peer, vni, (0, 0), inner, hash);
        }
        self.finish_v6::<V4, L2>(pool, b, peer, inner);
        Ok(())
    }

    /// `encap_as` for a frame whose head holds less than the hashed bytes: a short frame, or
    /// a chained one (hashed over its segments).
    #[cold]
    #[inline(never)]
    fn encap_short<const V4: bool, const L2: usize, const OUTER: usize>(
        &self,
        pool: &Pool,
        b: &mut BufId,
        peer: &PeerEntry,
        vni: u32,
        mark: Marking,
        inner: usize,
    ) -> Result<(), DropReason> {
        pool.strip(b, OUTER);
        let hash = gathered_flow_hash(pool, b);
        let ecn = if mark.set { inner_ecn(pool.head(b)) } else { 0 };
        let Some(h) = pool.prepend(b, OUTER) else { return Err(DropReason::NoBuffer) };
        self.write_outer::<V4, L2, OUTER, true>(
            h,
            peer,
            vni,
            (mark.dscp << 2 | ecn, mark.pcp),
            inner,
            hash,
        );
        self.finish_v6::<V4, L2>(pool, b, peer, inner);
        Ok(())
    }

    /// Writes the outer headers from the peer's template into the first `OUTER` bytes of `h`.
    #[inline(always)]
    fn write_outer<const V4: bool, const L2: usize, const OUTER: usize, const MARK: bool>(
        &self,
        h: &mut [u8],
        peer: &PeerEntry,
        vni: u32,
        (tos, pcp): (u8, u8),
        inner: usize,
        flow_hash: u32,
    ) {
        let (Some(h), Some(t)) =
            (h.first_chunk_mut::<OUTER>(), peer.template.first_chunk::<OUTER>())
        else {
            return;
        };
        *h = *t;
        // `tos`: the DSCP and the inner ECN field (unmarked: zero, which the template and
        // its checksum already have); `pcp`: the priority on a tagged underlay.
        let tos = if MARK { tos } else { 0 };
        if MARK && L2 == 18 {
            h[14] |= pcp << 5;
        }
        let l4 = L2 + if V4 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        let udp_len = (inner + udp::HEADER_LEN + vxlan::HEADER_LEN) as u16;
        // The hash's top half: the multiply mixed every input bit into it.
        let sport = self.src_lo + (((flow_hash >> 16) * self.src_span) >> 16) as u16;
        put(h, l4, sport);
        put(h, l4 + udp::offsets::LENGTH, udp_len);
        let vx = l4 + udp::HEADER_LEN;
        // VNI and the reserved byte after it, in one store.
        h[vx + 4..vx + 8].copy_from_slice(&(vni << 8).to_be_bytes());
        if V4 {
            let total = (inner + OUTER - L2) as u16;
            put(h, L2 + ipv4::offsets::TOTAL_LEN, total);
            h[L2 + 1] = tos; // the template's is 0
            // `base_sum` is folded to 16 bits and `total` is at most the MTU (checked by the
            // callers, 9 198), so the sum stays below 0x124ff and one fold finishes it.
            let sum = peer.base_sum + total as u64 + tos as u64;
            put(h, L2 + ipv4::offsets::CHECKSUM, !(((sum & 0xffff) + (sum >> 16)) as u16));
        } else {
            put(h, L2 + ipv6::offsets::PAYLOAD_LEN, udp_len);
            if MARK {
                // The traffic class straddles the first two bytes (the template's is 0).
                h[L2] |= tos >> 4;
                h[L2 + 1] |= tos << 4;
            }
        }
    }

    /// The UDP checksum an IPv6 outer header needs (unless zero checksums are configured).
    #[inline(always)]
    fn finish_v6<const V4: bool, const L2: usize>(
        &self,
        pool: &Pool,
        b: &mut BufId,
        peer: &PeerEntry,
        inner: usize,
    ) {
        if !V4 && !self.v6_zero_csum {
            let l4 = L2 + ipv6::HEADER_LEN;
            let udp_len = (inner + udp::HEADER_LEN + vxlan::HEADER_LEN) as u16;
            let c = udp6_checksum(pool, b, peer.base_sum, l4, udp_len);
            put(pool.head_mut(b), l4 + udp::offsets::CHECKSUM, c);
        }
    }

    /// Validates an underlay frame and strips its outer headers, leaving the inner frame.
    /// Returns (bridge domain, peer id). The one-entry `cache` remembers the last
    /// (source, VNI) → (bridge domain, peer) resolution of this batch.
    #[inline(always)]
    pub fn decap(
        &self,
        snap: &impl Admission,
        pool: &Pool,
        b: &mut BufId,
        cache: &mut DecapCache,
    ) -> Result<(u16, u16), DropReason> {
        let (h, total) = pool.head_and_len(b);
        let d = self.classify(snap, h, total, cache)?;
        d.strip(pool.view(), b)?;
        Ok((d.bd, d.peer))
    }

    /// [`VtepEntry::decap`] without touching the frame: what its outer headers say. The
    /// caller strips them with [`Decap::strip`] (after reading the inner frame in place).
    #[inline(always)]
    pub fn classify(
        &self,
        snap: &impl Admission,
        h: &[u8],
        total: usize,
        cache: &mut DecapCache,
    ) -> Result<Decap, DropReason> {
        let o = self.outer(h, total)?;
        let (bd, peer) = match cache.get(o.src, o.vni) {
            Some(hit) => hit,
            None => self.admit_cached(snap, cache, o.src, o.vni)?,
        };
        let padded = total - o.outer_len > o.inner_len;
        let outer_ecn = if o.ecn & 1 != 0 { o.ecn } else { 0 };
        Ok(Decap {
            bd,
            peer,
            outer_len: o.outer_len as u8,
            padded,
            inner_len: o.inner_len as u32,
            outer_ecn,
        })
    }

    /// The common case of [`VtepEntry::classify`] alone: an untagged IPv4 outer header
    /// without options from the (source, VNI) in `cache`. `None` means "take `classify`",
    /// not "drop": every test is folded into a few masked word compares against what the
    /// cache expects (see [`DecapCache::put`]), the lengths and the checksum.
    #[inline(always)]
    pub fn classify_plain(
        &self,
        f: &[u8; PLAIN_OUTER],
        total: usize,
        cache: &DecapCache,
    ) -> Option<Decap> {
        const L2: usize = 14;
        const OUTER: usize = PLAIN_OUTER;
        let w = |i: usize| {
            u64::from_le_bytes([
                f[i],
                f[i + 1],
                f[i + 2],
                f[i + 3],
                f[i + 4],
                f[i + 5],
                f[i + 6],
                f[i + 7],
            ])
        };
        // The destination MAC is the word's low six bytes: shifted out of the top rather than
        // masked, no 64-bit constant to hold (the burst loop is short of registers).
        let odd = ((w(0) ^ cache.e0) << 16)
            | ((w(12) ^ plain::E12) & plain::M12)
            | ((w(20) ^ plain::E20) & plain::M20)
            | (w(26) ^ cache.e26)
            | ((w(34) ^ cache.e34) & plain::M34)
            | ((w(42) ^ cache.e42) & plain::M42);
        let be16 = |i: usize| u16::from_be_bytes([f[i], f[i + 1]]) as usize;
        let (tl, udp_len) = (be16(16), be16(38));
        if odd != 0
            || !cache.plain
            || tl < OUTER - L2 + 14
            || L2 + tl > total
            || udp_len + ipv4::HEADER_LEN != tl
        {
            return None;
        }
        // The header checksum: the addresses were compared above, so their part of the sum
        // is the cache's; the rest is three 32-bit words. The header is valid when its one's
        // complement sum is 0xffff, that is when the plain sum (not zero: the addresses are
        // not) is a multiple of 0xffff — whatever the byte order of the words, since swapping
        // a 16-bit word's bytes multiplies it by 256 modulo 0xffff.
        let a = w(L2);
        let c = u32::from_le_bytes([f[L2 + 8], f[L2 + 9], f[L2 + 10], f[L2 + 11]]) as u64;
        if !((a & 0xffff_ffff) + (a >> 32) + c + cache.addr_sum).is_multiple_of(0xffff) {
            return None;
        }
        let inner_len = L2 + tl - OUTER;
        let (bd, peer) = cache.val;
        // The mask let only ECN fields the inner header needs not hear of (Not-ECT, ECT(0)).
        Some(Decap {
            bd,
            peer,
            outer_len: OUTER as u8,
            padded: total - OUTER > inner_len,
            inner_len: inner_len as u32,
            outer_ecn: 0,
        })
    }

    /// [`VtepEntry::admit`], remembered in the burst's cache.
    #[cold]
    #[inline(never)]
    fn admit_cached(
        &self,
        snap: &impl Admission,
        cache: &mut DecapCache,
        src: u128,
        vni: u32,
    ) -> Result<(u16, u16), DropReason> {
        let r = self.admit(snap, src, vni)?;
        cache.put(self, src, vni, r.0, r.1);
        Ok(r)
    }

    /// VNI → bridge domain, source → peer, and the peer must be in that domain's flood list.
    fn admit(&self, snap: &impl Admission, src: u128, vni: u32) -> Result<(u16, u16), DropReason> {
        let bd = snap.bd_of_vni(vni).ok_or(DropReason::VxlanUnknownVni)?;
        let src_ip = match self.local {
            IpAddr::V4(_) => IpAddr::V4((src as u32).into()),
            IpAddr::V6(_) => IpAddr::V6(src.into()),
        };
        let peer = snap.peer_of(&src_ip).ok_or(DropReason::VxlanUnknownVtep)?;
        if !snap.floods_to(bd, peer) {
            return Err(DropReason::VxlanUnknownVtep);
        }
        Ok((bd, peer))
    }

    /// Any underlay frame: to the VTEP's MAC (or a group address), optional tag, IPv4 with
    /// options or IPv6. A frame to another host's MAC (a promiscuous underlay, a bridge
    /// flooding an unknown unicast) is not this VTEP's, whatever its addresses say.
    #[inline(never)]
    fn outer(&self, h: &[u8], total: usize) -> Result<Outer, DropReason> {
        let f = ethernet::Frame::new_checked(h).map_err(|_| DropReason::Runt)?;
        let dst = f.dst();
        if dst != self.mac && !dst.is_group() {
            return Err(DropReason::UnderlayForeignMac);
        }
        let (tag, et, l3) = f.parts();
        if let Some((_, tci)) = tag
            && self.underlay_vlan.is_some_and(|v| v != tci & 0xfff)
        {
            return Err(DropReason::UnderlayNotVxlan);
        }
        let l2 = h.len() - l3.len();
        // UDP and VXLAN headers after the IP header.
        const UDP_VXLAN: usize = udp::HEADER_LEN + vxlan::HEADER_LEN;
        let (src_key, l4, l3_total, outer_ecn) = match et {
            ethernet::ethertype::IPV4 if self.local_v4 != 0 => {
                let ip =
                    ipv4::Packet::header_checked(l3).map_err(|_| DropReason::VxlanMalformed)?;
                if ip.rest().len() < UDP_VXLAN {
                    return Err(DropReason::VxlanMalformed);
                }
                if u32::from(ip.dst()) != self.local_v4 || ip.protocol() != ipv4::PROTO_UDP {
                    return Err(DropReason::UnderlayNotVxlan);
                }
                let (ihl, tl) = (ip.header_len(), ip.total_len() as usize);
                if tl < ihl + UDP_VXLAN + ethernet::HEADER_LEN
                    || l2 + tl > total
                    || ip.flags_frag() & 0x3fff != 0
                {
                    return Err(DropReason::VxlanMalformed);
                }
                if checksum::fold(checksum::accumulate(0, &l3[..ihl], &mut false)) != 0xffff {
                    return Err(DropReason::VxlanBadChecksum);
                }
                (u32::from(ip.src()) as u128, l2 + ihl, tl, ip.tos() & 3)
            }
            ethernet::ethertype::IPV6 if self.local_v4 == 0 => {
                let ip =
                    ipv6::Packet::header_checked(l3).map_err(|_| DropReason::VxlanMalformed)?;
                if ip.rest().len() < UDP_VXLAN {
                    return Err(DropReason::VxlanMalformed);
                }
                let IpAddr::V6(local) = self.local else {
                    return Err(DropReason::UnderlayNotVxlan);
                };
                if ip.dst() != local || ip.next_header() != ipv6::NEXT_UDP {
                    return Err(DropReason::UnderlayNotVxlan);
                }
                let tl = ip.payload_len() as usize + ipv6::HEADER_LEN;
                if tl < ipv6::HEADER_LEN + UDP_VXLAN + ethernet::HEADER_LEN || l2 + tl > total {
                    return Err(DropReason::VxlanMalformed);
                }
                (u128::from(ip.src()), l2 + ipv6::HEADER_LEN, tl, ip.traffic_class() & 3)
            }
            _ => return Err(DropReason::UnderlayNotVxlan),
        };
        // Both are there: the IP header's checks above.
        let u = udp::Packet::header_checked(&h[l4..]).map_err(|_| DropReason::VxlanMalformed)?;
        if u.dst_port() != self.udp_port {
            return Err(DropReason::UnderlayNotVxlan);
        }
        if u.len() as usize != l2 + l3_total - l4 {
            return Err(DropReason::VxlanMalformed);
        }
        let vx = vxlan::Header::new_checked(u.rest()).map_err(|_| DropReason::VxlanBadFlags)?;
        let outer_len = l4 + UDP_VXLAN;
        Ok(Outer {
            src: src_key,
            vni: vx.vni(),
            ecn: outer_ecn,
            outer_len,
            inner_len: l2 + l3_total - outer_len,
        })
    }
}

#[inline(always)]
fn put(h: &mut [u8], at: usize, v: u16) {
    h[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// What the outer headers said.
struct Outer {
    src: u128,
    vni: u32,
    /// The outer IP header's ECN field.
    ecn: u8,
    outer_len: usize,
    inner_len: usize,
}

/// What [`VtepEntry::classify`] found: the inner frame's bridge domain and peer, and where
/// it lies in the underlay frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decap {
    pub bd: u16,
    pub peer: u16,
    /// Outer header bytes (at most [`MAX_OUTER`] + IPv4 options).
    pub outer_len: u8,
    /// Ethernet padding follows the inner frame.
    padded: bool,
    pub inner_len: u32,
    /// The outer ECN field when the inner header must hear of it (ECT(1) or CE); else 0.
    outer_ecn: u8,
}

impl Decap {
    /// Removes the outer headers (and any padding after the inner frame).
    #[inline(always)]
    pub fn strip(&self, pool: PoolView, b: &mut BufId) -> Result<(), DropReason> {
        if !pool.strip(b, self.outer_len as usize) {
            return Err(DropReason::VxlanMalformed);
        }
        if self.padded {
            pool.truncate(b, self.inner_len as usize);
        }
        if self.outer_ecn != 0 {
            propagate_ecn(pool.head_mut(b), self.outer_ecn)?;
        }
        Ok(())
    }
}

/// A one-entry cache of the last decapsulation lookup, valid for one configuration snapshot
/// (see [`DecapCache::sync`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct DecapCache {
    src: u128,
    /// The VNI with bit 32 set; 0 when empty (one compare covers both).
    vni: u64,
    val: (u16, u16),
    generation: u64,
    /// [`VtepEntry::classify_plain`] may use the words below (an untagged IPv4 VTEP).
    plain: bool,
    /// Bytes 0..8: the VTEP's MAC (the destination) in the low six bytes.
    e0: u64,
    /// Frame bytes 26..34 (source and destination address) as a little-endian word.
    e26: u64,
    /// Bytes 34..42 (UDP header): the destination port under [`plain::M34`].
    e34: u64,
    /// The 32-bit words of `e26` added (the addresses' part of the IPv4 header checksum).
    addr_sum: u64,
    /// Bytes 42..50 (VXLAN header): the I flag and the VNI under [`plain::M42`].
    e42: u64,
}

/// The fixed fields of an untagged IPv4 outer header as masked little-endian words of the
/// frame (bytes 12..20 and 20..28; see [`DecapCache`] for the others).
mod plain {
    /// EtherType IPv4, version 4 with a 20-byte header, and an ECN field whose low bit is
    /// clear (Not-ECT or ECT(0): nothing for the inner header to hear; ECT(1) and CE take
    /// the slow path, which tells it).
    pub const M12: u64 = 0x01ff_ffff;
    pub const E12: u64 = 0x45_0008;
    /// Not a fragment (MF and offset zero; DF free) and protocol UDP.
    pub const M20: u64 = 0xff00_ff3f;
    pub const E20: u64 = 0x1100_0000;
    /// The UDP destination port.
    pub const M34: u64 = 0xffff_0000;
    /// The I flag and the VNI (the reserved bits are ignored on receipt).
    pub const M42: u64 = 0x00ff_ffff_0000_0008;
}

const CACHED: u64 = 1 << 32;

impl DecapCache {
    #[inline(always)]
    fn get(&self, src: u128, vni: u32) -> Option<(u16, u16)> {
        ((self.src ^ src) as u64
            | ((self.src ^ src) >> 64) as u64
            | (self.vni ^ (CACHED | vni as u64))
            == 0)
            .then_some(self.val)
    }
    #[inline(always)]
    fn put(&mut self, vtep: &VtepEntry, src: u128, vni: u32, bd: u16, peer: u16) {
        (self.src, self.vni, self.val) = (src, CACHED | vni as u64, (bd, peer));
        self.plain = vtep.local_v4 != 0 && vtep.underlay_vlan.is_none();
        let m = vtep.mac.0;
        self.e0 = u64::from_le_bytes([m[0], m[1], m[2], m[3], m[4], m[5], 0, 0]);
        self.e26 = (src as u32).swap_bytes() as u64 | ((vtep.local_v4.swap_bytes() as u64) << 32);
        self.e34 = (vtep.udp_port.swap_bytes() as u64) << 16;
        self.addr_sum = (self.e26 & 0xffff_ffff) + (self.e26 >> 32);
        self.e42 = 0x08 | ((vni.swap_bytes() >> 8) as u64) << 32;
    }
    /// The (bridge domain, peer) of the entry: of every frame [`VtepEntry::classify_plain`]
    /// admitted with this cache.
    #[inline(always)]
    pub fn admitted(&self) -> (u16, u16) {
        self.val
    }
    /// Forgets the entry when the snapshot it came from is not `generation`'s.
    #[inline(always)]
    pub fn sync(&mut self, generation: u64) {
        if self.generation != generation {
            (self.vni, self.plain, self.generation) = (0, false, generation);
        }
    }
}

/// UDP checksum over IPv6: pseudo-header base + UDP header + VXLAN + inner frame (all segments).
fn udp6_checksum(pool: &Pool, b: &BufId, base: u64, l4: usize, udp_len: u16) -> u16 {
    let mut odd = false;
    let mut sum = base + udp_len as u64;
    let mut first = true;
    pool.each_piece(b, |seg| {
        let data = if first { seg.get(l4..).unwrap_or_default() } else { seg };
        first = false;
        sum = checksum::accumulate(sum, data, &mut odd);
    });
    match !checksum::fold(sum) {
        0 => 0xffff,
        c => c,
    }
}

/// Bytes of the inner frame the flow hash reads (Ethernet + IPv4 addresses and ports).
const HASHED: usize = 14 + 24;

/// The flow hash of a packet whose head is too short to hash in place: packets of one flow
/// get the same UDP source port however they are segmented (ECMP must not reorder a flow).
#[cold]
fn gathered_flow_hash(pool: &Pool, b: &BufId) -> u32 {
    let mut buf = [0u8; HASHED];
    let mut n = 0;
    pool.each_piece(b, |seg| {
        let take = seg.len().min(HASHED - n);
        buf[n..n + take].copy_from_slice(&seg[..take]);
        n += take;
    });
    flow_hash(&buf[..n])
}

/// A flow hash of an inner frame: MACs, and IPv4 addresses and ports when present. The words
/// are XORed (each at its own rotation) and mixed by one multiply, whose top half depends on
/// every input bit.
#[inline(always)]
pub fn flow_hash(frame: &[u8]) -> u32 {
    if let Some(f) = frame.first_chunk::<HASHED>() {
        return flow_hash_of(f);
    }
    let Some(f) = frame.first_chunk::<14>() else { return 0 };
    mix(mac_words(f))
}

/// [`flow_hash`] of a frame at least [`HASHED`] bytes long: no bounds to check.
#[inline(always)]
fn flow_hash_of(f: &[u8; HASHED]) -> u32 {
    let (w8, w4) = (|b: [u8; 8]| u64::from_le_bytes(b), |b: [u8; 4]| u32::from_le_bytes(b) as u64);
    let mut h = mac_words(&[
        f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13],
    ]);
    if f[12] == 0x08 && f[13] == 0x00 {
        let addrs = [f[26], f[27], f[28], f[29], f[30], f[31], f[32], f[33]];
        h ^= w8(addrs).rotate_left(16) ^ w4([f[34], f[35], f[36], f[37]]).rotate_left(48);
    }
    mix(h)
}

#[inline(always)]
fn mac_words(f: &[u8; 14]) -> u64 {
    let a = u64::from_le_bytes([f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]]);
    a ^ (u32::from_le_bytes([f[8], f[9], f[10], f[11]]) as u64).rotate_left(32)
}

#[inline(always)]
fn mix(h: u64) -> u32 {
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}
