//! What a sender's offloads leave for "the device" to do, done in software for ports that
//! take frames from the kernel (AF_PACKET): finishing a checksum left partial, and cutting a
//! GSO super-frame (up to 64 KiB of TCP or UDP, plain or inside VXLAN) into frames the wire
//! can carry.
//!
//! The kernel describes both in the virtio-net header it writes before each frame when the
//! socket asks for one (`PACKET_VNET_HDR`): [`VnetHdr`]. A partial checksum is finished where
//! the header says (`csum_start`/`csum_offset`: the inner L4 header of a tunnelled frame, not
//! the outer UDP one). A super-frame is cut by [`Segmenter`], which walks the headers itself
//! (Ethernet, 802.1Q, IPv4/IPv6, and for a tunnel UDP + VXLAN + inner Ethernet) and accepts
//! the frame only if the walk lands exactly on `csum_start`; each segment gets its own IP
//! lengths, IPv4 IDs and header checksums, outer UDP length and checksum, TCP sequence
//! number and flags, and a whole L4 checksum, as the kernel's own software GSO makes them.
//!
//! All offsets are checked against the frame before use: a header that lies is refused with
//! a [`GsoError`], never a panic.

use std::ops::Range;
use vswitch::wire::checksum::{accumulate, fold};
use vswitch::wire::{be16, be32, put16};

/// Bytes of the virtio-net header (`struct virtio_net_hdr`, no `num_buffers`).
pub const VNET_HDR_LEN: usize = 10;
/// Room for the headers of one segment: outer Ethernet + two tags + IPv6 + UDP + VXLAN +
/// inner Ethernet + tag + IPv6 + the largest TCP header is 196 bytes.
pub const MAX_HEADERS: usize = 256;

const NEEDS_CSUM: u8 = 1;
const GSO_TCPV4: u8 = 1;
const GSO_UDP_L4: u8 = 5;
const GSO_TCPV6: u8 = 4;
const GSO_ECN: u8 = 0x80;

/// What the sender left undone, as the virtio-net header says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// The L4 checksum at `csum_start + csum_offset` holds only the pseudo-header sum.
    pub needs_csum: bool,
    /// The raw GSO type (0: not a super-frame); the ECN bit is ignored.
    pub gso_type: u8,
    /// Payload bytes per segment.
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header the kernel wrote in the host's byte order (legacy virtio, as packet
    /// sockets use).
    pub fn parse(b: &[u8; VNET_HDR_LEN]) -> VnetHdr {
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        VnetHdr {
            needs_csum: b[0] & NEEDS_CSUM != 0,
            gso_type: b[1] & !GSO_ECN,
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
    }

    /// Whether the frame is a super-frame to be cut.
    pub fn is_gso(&self) -> bool {
        self.gso_type != 0
    }

    /// The same header for the frame with `n` bytes inserted before `csum_start` (a VLAN tag
    /// the kernel reported out of band and the port put back).
    pub fn shifted(self, n: u16) -> VnetHdr {
        VnetHdr { csum_start: self.csum_start.saturating_add(n), ..self }
    }
}

/// Finishes a checksum the sender left partial: the field at `start + offset` holds the
/// pseudo-header sum; the one's-complement sum of `frame[start..]` is stored there (a UDP
/// result of 0 sent as 0xffff, as the kernel does). `false` if the field lies outside.
pub fn finish_checksum(frame: &mut [u8], start: usize, offset: usize) -> bool {
    let Some(field) = start.checked_add(offset).filter(|f| f + 2 <= frame.len()) else {
        return false;
    };
    let c = !fold(accumulate(0, &frame[start..], &mut false));
    put16(frame, field, if c == 0 { 0xffff } else { c });
    true
}

/// Finishes the L4 checksum of `frame` when it holds only the pseudo-header sum: what a
/// sender on this host with tx checksum offload leaves when nothing tells the receiver so
/// (AF_XDP has no checksum metadata). Looks at the frame's own TCP or UDP packet or, for UDP
/// to port `vxlan`, at the packet inside the VXLAN frame (whose outer checksum Linux already
/// computed for the finished inner one). Returns whether it finished one.
///
/// A right checksum is never changed: if its value happens to equal the pseudo-header sum,
/// finishing gives that same value back. A corrupted frame whose field happens to hold the
/// pseudo-header sum is "repaired" (one in 65,536 of corrupted frames): the price of not
/// being told.
pub fn finish_if_partial(frame: &mut [u8], vxlan: Option<u16>) -> bool {
    let Some((mut ip, mut proto, mut l4)) = walk_ip(frame, 0) else { return false };
    if proto == 17
        && vxlan.is_some()
        && frame.get(l4 + 3).is_some()
        && vxlan == Some(be16(frame, l4 + 2))
    {
        let Some(inner) = walk_ip(frame, l4 + 16) else { return false };
        (ip, proto, l4) = inner;
    }
    let field = match proto {
        6 => 16,
        17 => 6,
        _ => return false,
    };
    // The L4 length from the IP header (Ethernet may pad the frame); fragments never
    // carry a partial checksum.
    let end = if ip.v4 {
        if be16(frame, ip.at + 6) & 0x3fff != 0 {
            return false;
        }
        ip.at + be16(frame, ip.at + 2) as usize
    } else {
        ip.at + 40 + be16(frame, ip.at + 4) as usize
    };
    if end > frame.len() || l4 + field + 2 > end {
        return false;
    }
    let got = be16(frame, l4 + field);
    if proto == 17 && got == 0 {
        return false; // no checksum
    }
    let addrs = if ip.v4 { &frame[ip.at + 12..ip.at + 20] } else { &frame[ip.at + 8..ip.at + 40] };
    let pseudo = fold(accumulate(proto as u64 + (end - l4) as u64, addrs, &mut false));
    got == pseudo && finish_checksum(&mut frame[..end], l4, field)
}

/// Why a super-frame cannot be cut.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GsoError {
    #[error("GSO type {0} is not TCPv4, TCPv6 or UDP")]
    Type(u8),
    #[error("the headers do not lead to the checksum start the kernel gave")]
    Headers,
    #[error("segment size {0} does not fit a frame")]
    Size(u16),
}

/// One IP header in the chain of a super-frame.
#[derive(Clone, Copy, Debug, Default)]
struct Ip {
    at: usize,
    v4: bool,
    /// The IPv4 ID of the super-frame; segment `i` gets `id + i`.
    id: u16,
}

/// Cuts one super-frame into segments, one call of [`Segmenter::next`] each.
#[derive(Debug)]
pub struct Segmenter {
    /// The outer IP header, and the inner one for a tunnel (the L4 header follows the last).
    ips: [Ip; 2],
    n_ips: usize,
    /// The tunnel's UDP header, and whether its checksum is to be filled.
    tunnel_udp: Option<(usize, bool)>,
    l4: usize,
    tcp: bool,
    hdr_len: usize,
    mss: usize,
    seq: u32,
    /// Payload bytes of the frame already cut.
    done: usize,
    index: u16,
}

impl Segmenter {
    /// Reads the headers of `frame` as `h` describes it; the frame is kept by the caller and
    /// passed to each [`Segmenter::next`].
    pub fn new(frame: &[u8], h: &VnetHdr) -> Result<Segmenter, GsoError> {
        let (tcp, want_v4) = match h.gso_type {
            GSO_TCPV4 => (true, Some(true)),
            GSO_TCPV6 => (true, Some(false)),
            GSO_UDP_L4 => (false, None),
            t => return Err(GsoError::Type(t)),
        };
        let l4 = h.csum_start as usize;
        let mut s = Segmenter {
            ips: [Ip::default(); 2],
            n_ips: 0,
            tunnel_udp: None,
            l4,
            tcp,
            hdr_len: 0,
            mss: h.gso_size as usize,
            seq: 0,
            done: 0,
            index: 0,
        };
        let mut eth = 0;
        loop {
            let (ip, proto, next) = walk_ip(frame, eth).ok_or(GsoError::Headers)?;
            s.ips[s.n_ips] = ip;
            s.n_ips += 1;
            if next == l4 {
                if want_v4.is_some_and(|v4| v4 != ip.v4) || proto != if tcp { 6 } else { 17 } {
                    return Err(GsoError::Headers);
                }
                break;
            }
            // Not there yet: only a VXLAN tunnel (UDP, 8 bytes of VXLAN, inner Ethernet) may
            // lie between, once.
            if proto != 17 || s.n_ips == 2 || next > l4 {
                return Err(GsoError::Headers);
            }
            let csum =
                be16(frame.get(..next + 8).ok_or(GsoError::Headers)?, next + 6) != 0 || !ip.v4;
            s.tunnel_udp = Some((next, csum));
            eth = next + 16;
        }
        let l4_len = if tcp {
            let off = frame.get(l4 + 12).ok_or(GsoError::Headers)?;
            ((off >> 4) as usize) * 4
        } else {
            8
        };
        s.hdr_len = l4 + l4_len;
        if l4_len < 8 || s.hdr_len > MAX_HEADERS || s.hdr_len >= frame.len() {
            return Err(GsoError::Headers);
        }
        if s.mss == 0 || s.hdr_len + s.mss > vswitch::buf::MAX_FRAME {
            return Err(GsoError::Size(h.gso_size));
        }
        if tcp {
            s.seq = be32(frame, l4 + 4);
        }
        Ok(s)
    }

    /// How many segments the frame makes.
    pub fn count(&self, frame: &[u8]) -> usize {
        (frame.len() - self.hdr_len).div_ceil(self.mss)
    }

    /// Whether every segment of `frame` has been cut.
    pub fn is_done(&self, frame: &[u8]) -> bool {
        self.done >= frame.len().saturating_sub(self.hdr_len)
    }

    /// Writes the headers of the next segment into `hdr` and returns their length and the
    /// range of `frame` that is its payload; `None` once the frame is all cut.
    pub fn next(
        &mut self,
        frame: &[u8],
        hdr: &mut [u8; MAX_HEADERS],
    ) -> Option<(usize, Range<usize>)> {
        if self.is_done(frame) {
            return None;
        }
        let total = frame.len() - self.hdr_len;
        let (first, n) = (self.done == 0, self.mss.min(total - self.done));
        let payload = self.hdr_len + self.done..self.hdr_len + self.done + n;
        let last = payload.end == frame.len();
        let h = &mut hdr[..self.hdr_len];
        h.copy_from_slice(&frame[..self.hdr_len]);
        for ip in &self.ips[..self.n_ips] {
            let len = (self.hdr_len - ip.at + n) as u16;
            if ip.v4 {
                put16(h, ip.at + 2, len);
                put16(h, ip.at + 4, ip.id.wrapping_add(self.index));
                put16(h, ip.at + 10, 0);
                let ihl = ((h[ip.at] & 0x0f) as usize) * 4;
                let c = !fold(accumulate(0, &h[ip.at..ip.at + ihl], &mut false));
                put16(h, ip.at + 10, c);
            } else {
                put16(h, ip.at + 4, len - 40);
            }
        }
        let data = &frame[payload.clone()];
        let (l4, inner) = (self.l4, self.ips[self.n_ips - 1]);
        if self.tcp {
            h[l4 + 4..l4 + 8]
                .copy_from_slice(&self.seq.wrapping_add(self.done as u32).to_be_bytes());
            const FIN: u8 = 0x01;
            const PSH: u8 = 0x08;
            const CWR: u8 = 0x80;
            if !last {
                h[l4 + 13] &= !(FIN | PSH);
            }
            if !first {
                h[l4 + 13] &= !CWR;
            }
            put16(h, l4 + 16, 0);
            let c = l4_checksum(h, inner, l4, data);
            put16(h, l4 + 16, c);
        } else {
            put16(h, l4 + 4, (8 + n) as u16);
            put16(h, l4 + 6, 0);
            let c = l4_checksum(h, inner, l4, data);
            put16(h, l4 + 6, if c == 0 { 0xffff } else { c });
        }
        // The tunnel's checksum covers the inner headers: filled after them.
        if let Some((udp, csum)) = self.tunnel_udp {
            put16(h, udp + 4, (self.hdr_len - udp + n) as u16);
            put16(h, udp + 6, 0);
            if csum {
                let c = l4_checksum(h, self.ips[0], udp, data);
                put16(h, udp + 6, if c == 0 { 0xffff } else { c });
            }
        }
        self.done += n;
        self.index = self.index.wrapping_add(1);
        Some((self.hdr_len, payload))
    }
}

/// The IP header at the Ethernet header `eth` (after any 802.1Q/802.1ad tags): the header,
/// its protocol and where its payload starts. IPv6 extension headers are not followed.
fn walk_ip(frame: &[u8], eth: usize) -> Option<(Ip, u8, usize)> {
    let mut at = eth + 12;
    let mut et = be16(frame.get(..at + 2)?, at);
    while vswitch::wire::ethernet::is_tpid(et) {
        at += 4;
        et = be16(frame.get(..at + 2)?, at);
    }
    let ip = at + 2;
    match et {
        0x0800 => {
            let h = frame.get(ip..ip + 20)?;
            let ihl = ((h[0] & 0x0f) as usize) * 4;
            (h[0] >> 4 == 4 && ihl >= 20).then_some((
                Ip { at: ip, v4: true, id: be16(h, 4) },
                h[9],
                ip + ihl,
            ))
        }
        0x86dd => {
            let h = frame.get(ip..ip + 40)?;
            (h[0] >> 4 == 6).then_some((Ip { at: ip, v4: false, id: 0 }, h[6], ip + 40))
        }
        _ => None,
    }
}

/// The whole checksum of the L4 header at `l4` in `h` (its checksum field zeroed) with the
/// pseudo-header of `ip` and the payload `data`.
fn l4_checksum(h: &[u8], ip: Ip, l4: usize, data: &[u8]) -> u16 {
    let len = (h.len() - l4 + data.len()) as u64;
    let (proto, addrs) = if ip.v4 {
        (h[ip.at + 9], &h[ip.at + 12..ip.at + 20])
    } else {
        (h[ip.at + 6], &h[ip.at + 8..ip.at + 40])
    };
    let mut odd = false;
    let mut sum = accumulate(proto as u64 + len, addrs, &mut odd);
    sum = accumulate(sum, &h[l4..], &mut odd);
    !fold(accumulate(sum, data, &mut odd))
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;
    use std::net::IpAddr;
    use vswitch::testkit::frames::{self as frame, Outer};
    use vswitch::testkit::mac;
    use vswitch::wire::{ipv4, ipv6};

    /// A TCP super-frame as Linux hands it over: lengths of the whole, the checksum field
    /// holding the pseudo-header sum (without the length: GSO frames are summed per segment).
    fn tcp_super(src: IpAddr, dst: IpAddr, payload: &[u8], flags: u8) -> Vec<u8> {
        let mut tcp = vec![0u8; 20];
        put16(&mut tcp, 0, 40000);
        put16(&mut tcp, 2, 5201);
        tcp[4..8].copy_from_slice(&0xfffff000u32.to_be_bytes()); // wraps within the frame
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        put16(&mut tcp, 14, 512);
        put16(&mut tcp, 16, 0x1234); // a partial sum: whatever it is, segments are summed whole
        tcp.extend_from_slice(payload);
        let len = tcp.len() as u16;
        let (et, l3) = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = vec![0u8; 20];
                ipv4::Repr {
                    src: s,
                    dst: d,
                    protocol: ipv4::PROTO_TCP,
                    ttl: 64,
                    payload_len: len,
                    dont_fragment: true,
                }
                .emit(&mut h);
                put16(&mut h, 4, 0x7ffe);
                h[10..12].fill(0);
                let c = vswitch::wire::checksum::of(&h);
                put16(&mut h, 10, c);
                (0x0800, h)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut h = vec![0u8; 40];
                ipv6::Repr { src: s, dst: d, next_header: 6, hop_limit: 64, payload_len: len }
                    .emit(&mut h);
                (0x86dd, h)
            }
            _ => unreachable!(),
        };
        let mut f = l3;
        f.extend_from_slice(&tcp);
        frame::eth(mac(2), mac(1), et, &f)
    }

    fn v4(n: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, n])
    }

    fn v6(n: u8) -> IpAddr {
        IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, n as u16])
    }

    /// Checks every header of one segment as a receiver would: IPv4 header checksums and
    /// lengths, UDP lengths, the L4 checksum of the innermost packet and, where present, the
    /// tunnel's; returns the innermost L4 header offset.
    fn check_segment(seg: &[u8]) -> usize {
        let mut eth = 0;
        loop {
            let (ip, proto, next) = walk_ip(seg, eth).expect("a valid IP header");
            let end = if ip.v4 {
                assert_eq!(
                    vswitch::wire::checksum::of(&seg[ip.at..next]),
                    0,
                    "IPv4 header checksum"
                );
                ip.at + be16(seg, ip.at + 2) as usize
            } else {
                next + be16(seg, ip.at + 4) as usize
            };
            assert_eq!(end, seg.len(), "IP length covers the segment exactly");
            let zero_udp = proto == 17 && be16(seg, next + 6) == 0;
            if !zero_udp {
                assert_eq!(l4_checksum(&seg[..next], ip, next, &seg[next..]), 0, "L4 checksum");
            }
            if proto == 17 {
                assert_eq!(be16(seg, next + 4) as usize, seg.len() - next, "UDP length");
            }
            if proto == 17 && be16(seg, next + 2) == 4789 {
                eth = next + 16;
                continue;
            }
            return next;
        }
    }

    fn cut(f: &[u8], h: &VnetHdr) -> Vec<Vec<u8>> {
        let mut s = Segmenter::new(f, h).expect("a valid super-frame");
        let mut hdr = [0u8; MAX_HEADERS];
        let mut out = Vec::new();
        while let Some((n, p)) = s.next(f, &mut hdr) {
            let mut seg = hdr[..n].to_vec();
            seg.extend_from_slice(&f[p]);
            out.push(seg);
        }
        assert_eq!(out.len(), s.count(f));
        out
    }

    fn tcp_hdr(gso_type: u8, mss: u16, csum_start: usize) -> VnetHdr {
        VnetHdr {
            needs_csum: true,
            gso_type,
            gso_size: mss,
            csum_start: csum_start as u16,
            csum_offset: 16,
        }
    }

    #[test]
    fn parses_the_kernels_header() {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = 1;
        b[1] = GSO_TCPV4 | GSO_ECN;
        b[2..4].copy_from_slice(&66u16.to_ne_bytes());
        b[4..6].copy_from_slice(&1448u16.to_ne_bytes());
        b[6..8].copy_from_slice(&34u16.to_ne_bytes());
        b[8..10].copy_from_slice(&16u16.to_ne_bytes());
        let h = VnetHdr::parse(&b);
        assert_eq!(h, tcp_hdr(GSO_TCPV4, 1448, 34));
        assert!(h.is_gso());
        assert_eq!(h.shifted(4).csum_start, 38);
    }

    #[test]
    fn finishes_a_partial_checksum_where_the_header_says() {
        let payload: Vec<u8> = (0..1001u32).map(|i| i as u8).collect();
        let mut f = tcp_super(v4(1), v4(2), &payload, 0x18);
        // As Linux leaves it: the pseudo-header sum, not complemented, in the field.
        let len = (f.len() - 34) as u64;
        let mut odd = false;
        let pseudo = fold(accumulate(6 + len, &f[26..34], &mut odd));
        put16(&mut f, 34 + 16, pseudo);
        assert!(finish_checksum(&mut f, 34, 16));
        check_segment(&f);
        assert!(!finish_checksum(&mut f, 34, 5000), "a field outside the frame is refused");
        assert!(!finish_checksum(&mut f, usize::MAX, 16));
    }

    #[test]
    fn cuts_tcp_over_ipv4_and_ipv6() {
        let payload: Vec<u8> = (0..64000u32).map(|i| (i * 7) as u8).collect();
        for (src, dst, l4) in [(v4(1), v4(2), 34), (v6(1), v6(2), 54)] {
            let f = tcp_super(src, dst, &payload, 0x80 | 0x18 | 0x01); // CWR, PSH|ACK, FIN
            let gso = if src.is_ipv4() { GSO_TCPV4 } else { GSO_TCPV6 };
            let segs = cut(&f, &tcp_hdr(gso, 1448, l4));
            assert_eq!(segs.len(), 64000usize.div_ceil(1448));
            let mut got = Vec::new();
            for (i, s) in segs.iter().enumerate() {
                let l4 = check_segment(s);
                assert_eq!(l4, if src.is_ipv4() { 34 } else { 54 });
                let seq = be32(s, l4 + 4);
                assert_eq!(seq, 0xfffff000u32.wrapping_add((i * 1448) as u32));
                let last = i == segs.len() - 1;
                assert_eq!(s[l4 + 13] & 0x09 != 0, last, "FIN and PSH on the last segment only");
                assert_eq!(s[l4 + 13] & 0x80 != 0, i == 0, "CWR on the first only");
                assert_eq!(s[l4 + 13] & 0x10, 0x10, "ACK on all");
                if src.is_ipv4() {
                    assert_eq!(be16(s, 14 + 4), 0x7ffeu16.wrapping_add(i as u16));
                }
                got.extend_from_slice(&s[l4 + 20..]);
            }
            assert_eq!(got, payload);
        }
    }

    #[test]
    fn cuts_tcp_inside_vxlan_with_and_without_an_outer_checksum() {
        let payload: Vec<u8> = (0..30000u32).map(|i| (i * 13) as u8).collect();
        let inner = tcp_super(v4(1), v4(2), &payload, 0x18);
        for (src, dst, vlan) in
            [(v4(10), v4(20), None), (v6(10), v6(20), Some(7)), (v4(10), v4(20), Some(7))]
        {
            let o = Outer {
                dst_mac: mac(9),
                src_mac: mac(8),
                src,
                dst,
                sport: 49152,
                dport: 4789,
                vlan,
            };
            let f = frame::vxlan(&o, 5001, &inner, false);
            let l4 = f.len() - inner.len() + 34;
            let segs = cut(&f, &tcp_hdr(GSO_TCPV4, 1398, l4));
            assert_eq!(segs.len(), 30000usize.div_ceil(1398));
            let mut got = Vec::new();
            for s in &segs {
                assert_eq!(check_segment(s), l4);
                let outer_udp = l4 - 34 - 16;
                assert_eq!(
                    be16(s, outer_udp + 6) != 0,
                    src.is_ipv6(),
                    "outer checksum kept as the sender chose"
                );
                got.extend_from_slice(&s[l4 + 20..]);
            }
            assert_eq!(got, payload);
        }
    }

    #[test]
    fn cuts_udp_datagrams() {
        let payload = vec![0x5au8; 5000];
        let o = Outer {
            dst_mac: mac(9),
            src_mac: mac(8),
            src: v4(1),
            dst: v4(2),
            sport: 1000,
            dport: 2000,
            vlan: None,
        };
        let f = frame::vxlan(&o, 0, &[], false); // an IPv4/UDP header chain; cut its tail
        let mut f = f[..42].to_vec();
        f.extend_from_slice(&payload);
        let h = VnetHdr {
            needs_csum: true,
            gso_type: GSO_UDP_L4,
            gso_size: 1200,
            csum_start: 34,
            csum_offset: 6,
        };
        let segs = cut(&f, &h);
        assert_eq!(
            segs.iter().map(|s| s.len() - 42).collect::<Vec<_>>(),
            [1200, 1200, 1200, 1200, 200]
        );
        for s in &segs {
            check_segment(s);
        }
    }

    #[test]
    fn refuses_headers_that_lie() {
        let f = tcp_super(v4(1), v4(2), &[0u8; 3000], 0x10);
        assert_eq!(Segmenter::new(&f, &tcp_hdr(3, 1448, 34)).unwrap_err(), GsoError::Type(3));
        assert_eq!(
            Segmenter::new(&f, &tcp_hdr(GSO_TCPV4, 1448, 30)).unwrap_err(),
            GsoError::Headers
        );
        assert_eq!(
            Segmenter::new(&f, &tcp_hdr(GSO_TCPV6, 1448, 34)).unwrap_err(),
            GsoError::Headers
        );
        assert_eq!(Segmenter::new(&f, &tcp_hdr(GSO_TCPV4, 0, 34)).unwrap_err(), GsoError::Size(0));
        assert_eq!(
            Segmenter::new(&f, &tcp_hdr(GSO_TCPV4, 9200, 34)).unwrap_err(),
            GsoError::Size(9200)
        );
        assert_eq!(
            Segmenter::new(&f[..40], &tcp_hdr(GSO_TCPV4, 1448, 34)).unwrap_err(),
            GsoError::Headers
        );
    }

    #[test]
    fn finishes_only_what_is_partial_and_looks_inside_vxlan() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 3) as u8).collect();
        let mut whole = tcp_super(v4(1), v4(2), &payload, 0x18);
        put16(&mut whole, 34 + 16, 0);
        let c = l4_checksum(&whole[..54], walk_ip(&whole, 0).unwrap().0, 34, &whole[54..]);
        put16(&mut whole, 34 + 16, c);
        check_segment(&whole);
        // As Linux leaves it: the pseudo-header sum in the field.
        let mut partial = whole.clone();
        let pseudo = fold(accumulate(6 + (whole.len() - 34) as u64, &whole[26..34], &mut false));
        put16(&mut partial, 34 + 16, pseudo);
        let mut f = whole.clone();
        assert!(!finish_if_partial(&mut f, None), "a whole checksum is left alone");
        assert_eq!(f, whole);
        let mut f = partial.clone();
        assert!(finish_if_partial(&mut f, None));
        assert_eq!(f, whole);
        // Inside VXLAN over IPv4 and IPv6, padded.
        for src in [v4(10), v6(10)] {
            let dst = if src.is_ipv4() { v4(20) } else { v6(20) };
            let o = Outer {
                dst_mac: mac(9),
                src_mac: mac(8),
                src,
                dst,
                sport: 49152,
                dport: 4789,
                vlan: None,
            };
            let mut f = frame::vxlan(&o, 5001, &partial, true);
            let want = frame::vxlan(&o, 5001, &whole, true);
            f.extend_from_slice(&[0; 4]);
            assert!(!finish_if_partial(&mut f, Some(8472)), "another port: not VXLAN");
            assert!(finish_if_partial(&mut f, Some(4789)));
            assert_eq!(&f[..want.len()], &want[..]);
        }
    }

    proptest! {
        /// Whatever the kernel (or a bug) writes, cutting never panics, and a frame that is
        /// cut gives back its payload exactly.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), gso_type in 0u8..8,
                        mss in 0u16..2000, start in 0u16..300) {
            let h = VnetHdr { needs_csum: true, gso_type, gso_size: mss, csum_start: start, csum_offset: 16 };
            let mut f = bytes.clone();
            let _ = finish_checksum(&mut f, start as usize, 16);
            let _ = finish_if_partial(&mut f, Some(4789));
            if let Ok(mut s) = Segmenter::new(&bytes, &h) {
                let mut hdr = [0u8; MAX_HEADERS];
                let mut payload = Vec::new();
                let mut hl = 0;
                while let Some((n, p)) = s.next(&bytes, &mut hdr) {
                    hl = n;
                    payload.extend_from_slice(&bytes[p]);
                }
                prop_assert_eq!(&payload[..], &bytes[hl..]);
            }
        }

        #[test]
        fn any_mss_gives_the_payload_back(mss in 1u16..3000, len in 1usize..9000) {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let f = tcp_super(v4(1), v4(2), &payload, 0x18);
            let segs = cut(&f, &tcp_hdr(GSO_TCPV4, mss, 34));
            let mut got = Vec::new();
            for s in &segs {
                check_segment(s);
                prop_assert!(s.len() - 54 <= mss as usize);
                got.extend_from_slice(&s[54..]);
            }
            prop_assert_eq!(got, payload);
        }
    }
}
