//! The frames a scenario offers, written as pcap files for the generator to replay: UDP over
//! IPv4 between two MACs, a given size on the wire (the 4-byte FCS counted, as RFC 2544 and
//! FD.io CSIT count it) or the IMIX mix of sizes, spread over a number of flows (UDP source
//! ports).

use std::io::{self, Write};
use std::path::Path;

/// Bytes on the wire that are not in the buffer: the FCS.
const FCS: usize = 4;
/// The smallest frame on the wire.
pub const MIN_SIZE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
}

impl Endpoint {
    /// The MAC as `02:00:00:00:00:0a`.
    pub fn mac_text(&self) -> String {
        self.mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
    }

    pub fn ip_addr(&self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::from(self.ip)
    }
}

/// The generator's two ends: A offers frames to B through the switch.
pub const A: Endpoint = Endpoint { mac: [0x02, 0, 0, 0, 0, 0x0a], ip: [10, 99, 0, 1] };
pub const B: Endpoint = Endpoint { mac: [0x02, 0, 0, 0, 0, 0x0b], ip: [10, 99, 0, 2] };

/// A UDP frame of `size` bytes on the wire from `src` to `dst`, source port `sport`.
pub fn udp(src: Endpoint, dst: Endpoint, size: usize, sport: u16) -> Vec<u8> {
    let n = size.max(MIN_SIZE) - FCS;
    let mut f = Vec::with_capacity(n);
    push_udp_headers(&mut f, src, dst, sport, 1024, n - 14 - 28);
    f.resize(n, 0);
    f
}

/// The VXLAN port (IANA).
pub const VXLAN_PORT: u16 = 4789;

/// `inner` (a frame without its FCS) in VXLAN from VTEP `src` to VTEP `dst` in segment
/// `vni`, outer UDP source port `sport`: 50 bytes more on the wire (RFC 7348).
pub fn vxlan(src: Endpoint, dst: Endpoint, vni: u32, sport: u16, inner: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(50 + inner.len());
    push_udp_headers(&mut f, src, dst, sport, VXLAN_PORT, 8 + inner.len());
    f.extend_from_slice(&[0x08, 0, 0, 0]);
    f.extend_from_slice(&(vni << 8).to_be_bytes());
    f.extend_from_slice(inner);
    f
}

/// `frame` with an 802.1Q tag for `vid` after its MACs: 4 bytes more on the wire.
pub fn tagged(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(frame.len() + 4);
    f.extend_from_slice(&frame[..12]);
    f.extend_from_slice(&[0x81, 0x00]);
    f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// Ethernet, IPv4 (don't fragment, TTL 64, checksum) and UDP (no checksum) headers for
/// `payload` bytes after them.
fn push_udp_headers(
    f: &mut Vec<u8>,
    src: Endpoint,
    dst: Endpoint,
    sport: u16,
    dport: u16,
    payload: usize,
) {
    let ip_len = (20 + 8 + payload) as u16;
    f.extend_from_slice(&dst.mac);
    f.extend_from_slice(&src.mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.ip);
    ip[16..20].copy_from_slice(&dst.ip);
    let sum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&(ip_len - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no UDP checksum
}

fn ipv4_checksum(h: &[u8; 20]) -> u16 {
    let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// What a trial offers: frames of one size on the wire (FCS counted), or IMIX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameSize {
    Bytes(usize),
    /// The simple IMIX of FD.io CSIT and most labs: 64, 570 and 1518 bytes in 7 : 4 : 1
    /// (353.83 bytes on average), interleaved.
    Imix,
}

/// One IMIX period: 7 × 64, 4 × 570, 1 × 1518, spread out.
const IMIX: [usize; 12] = [64, 570, 64, 64, 570, 64, 1518, 64, 570, 64, 64, 570];

impl FrameSize {
    /// The sizes frames take in turn.
    pub fn pattern(self) -> Vec<usize> {
        match self {
            FrameSize::Bytes(n) => vec![n],
            FrameSize::Imix => IMIX.to_vec(),
        }
    }

    /// The mean size on the wire, bytes (where a plot puts it).
    pub fn mean(self) -> f64 {
        let p = self.pattern();
        p.iter().sum::<usize>() as f64 / p.len() as f64
    }

    /// The same sizes `n` bytes larger (the yardstick forwards what a switch's encapsulation
    /// would make of them).
    pub fn grown(self, n: usize) -> Vec<usize> {
        self.pattern().iter().map(|s| s + n).collect()
    }
}

impl std::fmt::Display for FrameSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameSize::Bytes(n) => write!(f, "{n}"),
            FrameSize::Imix => f.write_str("imix"),
        }
    }
}

impl std::str::FromStr for FrameSize {
    type Err = String;

    fn from_str(s: &str) -> Result<FrameSize, String> {
        match s.trim() {
            t if t.eq_ignore_ascii_case("imix") => Ok(FrameSize::Imix),
            t => match t.parse::<usize>() {
                Ok(n) if (MIN_SIZE..=9018).contains(&n) => Ok(FrameSize::Bytes(n)),
                _ => Err(format!("{t:?}: a frame size from {MIN_SIZE} to 9018 bytes, or imix")),
            },
        }
    }
}

/// A size as a number, IMIX as `"imix"`.
impl serde::Serialize for FrameSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FrameSize::Bytes(n) => s.serialize_u64(*n as u64),
            FrameSize::Imix => s.serialize_str("imix"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for FrameSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FrameSize, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(usize),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(FrameSize::Bytes(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Frames from `src` to `dst`: frame `j` is `sizes[j % len]` bytes on the wire, in flow
/// (UDP source port) `j % flows`, so every size meets every flow; one period of both.
pub fn flows(src: Endpoint, dst: Endpoint, sizes: &[usize], flows: u16) -> Vec<Vec<u8>> {
    let k = sizes.len().max(1);
    let n = distinct(k, flows, 1);
    let flows = flows.max(1) as usize;
    (0..n)
        .map(|j| {
            udp(src, dst, sizes.get(j % k).copied().unwrap_or(MIN_SIZE), 1024 + (j % flows) as u16)
        })
        .collect()
}

/// How many distinct frames a side offers with `sizes` sizes in turn, `flows` flows and
/// `hosts` hosts a side: one a host ([`host_pairs`]), else lcm(sizes, flows), the period
/// after which size and flow repeat together ([`flows`]).
pub fn distinct(sizes: usize, flows: u16, hosts: u32) -> usize {
    if hosts > 1 {
        return hosts as usize;
    }
    let (k, flows) = (sizes.max(1), flows.max(1) as usize);
    let (mut a, mut b) = (k, flows);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    k / a * flows
}

/// Host `i` behind `side` (`i` < 2^20): a locally administered unicast MAC of its own, spread
/// as real NICs' addresses are (not counted up: a switch's hash would see an easier set), and
/// an IPv4 address of its own: `10.a.b.c` with `a` = 16 × side's last octet + the high 4 of
/// the 20 bits of `i + 1`, `b.c` its low 16. The L2 path reads no address, but a switch may
/// hash one: OVS's exact-match and signature caches are indexed by a hash of the 5-tuple,
/// so hosts sharing one address all fall into one slot.
pub fn host(side: Endpoint, i: u32) -> Endpoint {
    let mut z = (u64::from(side.mac[5]) << 32 | u64::from(i)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let b = (z ^ (z >> 31)).to_be_bytes();
    let n = (i + 1).to_be_bytes();
    let ip = [10, side.ip[3].wrapping_mul(16).wrapping_add(n[1] & 0x0f), n[2], n[3]];
    Endpoint { mac: [b[0] & 0xfc | 0x02, b[1], b[2], b[3], b[4], b[5]], ip }
}

/// `hosts` hosts behind `src` talking to as many behind `dst`, host `j` to host `j`: the
/// frames offered (frame `j` of `sizes[j % len]` bytes on the wire, UDP source port
/// `j % flows`; one frame a pair, met in turn) and the frames each host behind `dst` sends
/// first, so a learning switch knows where every destination is.
pub fn host_pairs(
    src: Endpoint,
    dst: Endpoint,
    sizes: &[usize],
    flows: u16,
    hosts: u32,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (k, flows) = (sizes.len().max(1), flows.max(1) as usize);
    let offered = (0..hosts as usize)
        .map(|j| {
            let size = sizes.get(j % k).copied().unwrap_or(MIN_SIZE);
            udp(host(src, j as u32), host(dst, j as u32), size, 1024 + (j % flows) as u16)
        })
        .collect();
    let back = (0..hosts).map(|j| udp(host(dst, j), host(src, j), MIN_SIZE, 1024)).collect();
    (offered, back)
}

/// Writes `frames` as a classic pcap file (microsecond timestamps, Ethernet).
pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) -> io::Result<()> {
    let mut o = io::BufWriter::new(std::fs::File::create(path)?);
    for v in [
        0xa1b2_c3d4u32.to_le_bytes().as_slice(),
        &2u16.to_le_bytes(),
        &4u16.to_le_bytes(),
        &0i32.to_le_bytes(),
        &0u32.to_le_bytes(),
        &65535u32.to_le_bytes(),
        &1u32.to_le_bytes(),
    ] {
        o.write_all(v)?;
    }
    for f in frames {
        let len = f.len() as u32;
        for v in [0u32, 0, len, len] {
            o.write_all(&v.to_le_bytes())?;
        }
        o.write_all(f)?;
    }
    o.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imix_is_seven_four_one_and_meets_every_flow() {
        assert_eq!("IMIX".parse(), Ok(FrameSize::Imix));
        assert_eq!("512".parse(), Ok(FrameSize::Bytes(512)));
        assert!("12".parse::<FrameSize>().is_err() && "big".parse::<FrameSize>().is_err());
        assert!((FrameSize::Imix.mean() - 353.83).abs() < 0.01);
        let f = flows(A, B, &FrameSize::Imix.pattern(), 3);
        assert_eq!(f.len(), 12, "lcm(12, 3)");
        let count = |n: usize| f.iter().filter(|f| f.len() + 4 == n).count();
        assert_eq!((count(64), count(570), count(1518)), (7, 4, 1));
        assert_eq!(flows(A, B, &[64], 5).len(), 5);
        assert_eq!(flows(A, B, &FrameSize::Imix.pattern(), 8).len(), 24);
        assert_eq!(distinct(12, 8, 1), 24, "what flows() makes, for the memory sum");
        assert_eq!(distinct(12, 65535, 0), 262_140);
        assert_eq!(distinct(1, 1, 8000), 8000, "one a host");
        for s in [FrameSize::Imix, FrameSize::Bytes(64)] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<FrameSize>(&json).unwrap(), s);
        }
        assert_eq!(FrameSize::Bytes(64).grown(50), vec![114]);
    }

    const A: Endpoint = Endpoint { mac: [2, 0, 0, 0, 0, 1], ip: [10, 0, 0, 1] };
    const B: Endpoint = Endpoint { mac: [2, 0, 0, 0, 0, 2], ip: [10, 0, 0, 2] };

    #[test]
    fn frames_have_their_size_and_a_valid_header() {
        for size in [64, 114, 512, 1518] {
            let f = udp(A, B, size, 7);
            assert_eq!(f.len(), size - 4);
            assert_eq!(&f[0..6], &B.mac);
            let ip: [u8; 20] = f[14..34].try_into().unwrap();
            assert_eq!(ipv4_checksum(&ip), 0, "a header with its checksum sums to zero");
            assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, size - 4 - 14);
            assert_eq!(u16::from_be_bytes([f[34], f[35]]), 7);
        }
        assert_eq!(udp(A, B, 10, 1).len(), 60, "never below the minimum");
        assert_eq!(flows(A, B, &[64], 4).len(), 4);
        let (offered, back) = host_pairs(A, B, &[64, 1518], 3, 1000);
        assert_eq!((offered.len(), back.len()), (1000, 1000));
        let macs = |fs: &[Vec<u8>], at: usize| {
            fs.iter().map(|f| f[at..at + 6].to_vec()).collect::<std::collections::HashSet<_>>()
        };
        assert_eq!(macs(&offered, 6).len(), 1000, "a source MAC each");
        assert_eq!(macs(&offered, 0), macs(&back, 6), "every destination speaks first");
        assert!(macs(&offered, 6).is_disjoint(&macs(&offered, 0)));
        assert!(offered.iter().all(|f| f[0] & 3 == 2 && f[6] & 3 == 2), "local unicast");
        let ips = |fs: &[Vec<u8>], at: usize| {
            fs.iter().map(|f| f[at..at + 4].to_vec()).collect::<std::collections::HashSet<_>>()
        };
        assert_eq!(ips(&offered, 26).len(), 1000, "an IP address each");
        assert!(ips(&offered, 26).is_disjoint(&ips(&offered, 30)));
        assert_eq!(ips(&offered, 30), ips(&back, 26));
        assert_ne!(host(A, 0x1_0000).ip, host(A, 0).ip);
        assert_eq!((offered[1].len(), offered[2][34..36].to_vec()), (1514, vec![4, 2]));
    }

    #[test]
    fn vxlan_wraps_a_frame_in_50_bytes() {
        let inner = udp(A, B, 64, 7);
        let f = vxlan(B, A, 100, 49152, &inner);
        assert_eq!(f.len(), 114 - 4, "64 bytes inner are 114 on the wire");
        assert_eq!(&f[0..6], &A.mac);
        let ip: [u8; 20] = f[14..34].try_into().unwrap();
        assert_eq!(ipv4_checksum(&ip), 0);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), VXLAN_PORT);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]) as usize, f.len() - 34, "UDP length");
        assert_eq!(&f[42..50], &[0x08, 0, 0, 0, 0, 0, 100, 0], "flags and VNI 100");
        assert_eq!(&f[50..], &inner[..]);
    }

    #[test]
    fn a_tag_goes_after_the_macs() {
        let f = udp(A, B, 64, 7);
        let t = tagged(&f, 100);
        assert_eq!(t.len(), f.len() + 4);
        assert_eq!(&t[..12], &f[..12]);
        assert_eq!(&t[12..16], &[0x81, 0x00, 0, 100]);
        assert_eq!(&t[16..], &f[12..]);
    }

    #[test]
    fn pcap_layout() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.pcap");
        write_pcap(&p, &flows(A, B, &[64], 2)).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), 24 + 2 * (16 + 60));
        assert_eq!(&b[0..4], &0xa1b2_c3d4u32.to_le_bytes());
    }
}
