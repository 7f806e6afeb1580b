//! Wire formats the switch reads and writes: Ethernet with 802.1Q/802.1ad tags, ARP, IPv4,
//! IPv6, UDP, VXLAN and the ICMPv6 neighbor discovery messages.
//!
//! Each protocol has a zero-copy view (`Frame<T>` / `Packet<T>`) over any `T: AsRef<[u8]>`
//! whose offsets live in a `field` module. `new_checked` checks every length the accessors
//! rely on, once, so accessors then index without further checks and never panic; it is the
//! constructor for untrusted input. `new_unchecked` is for emitting into a buffer sized by the
//! caller. Lengths that follow header fields (IPv4 total length, UDP length) bound
//! `payload()`, so Ethernet padding never leaks into a payload or a checksum.
//! Small `Repr` structs carry the fields logic and tests compare.

pub mod arp;
pub mod ethernet;
pub mod icmpv6;
pub mod ipv4;
pub mod ipv6;
pub mod spec;
pub mod udp;
pub mod vxlan;

pub use ethernet::{EtherType, MacAddr};

/// Why a view could not be built over some bytes; each maps to a counted drop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated")]
    Truncated,
    #[error("bad header length")]
    BadLength,
    #[error("bad version")]
    BadVersion,
    #[error("bad checksum")]
    BadChecksum,
    #[error("bad flags")]
    BadFlags,
}

pub type Result<T> = core::result::Result<T, WireError>;

pub(crate) type Field = core::ops::Range<usize>;

/// The big-endian u16 at `at` (the caller has checked the bounds).
#[inline(always)]
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The big-endian u32 at `at` (the caller has checked the bounds).
#[inline(always)]
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes `v` big-endian at `at` (the caller has checked the bounds).
#[inline(always)]
pub fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Internet checksum arithmetic (RFC 1071), usable across buffer segments.
pub mod checksum {
    /// Adds `data` to a running one's-complement sum. `odd` carries whether an odd number of
    /// bytes came before, so a sum can continue across segments of any length.
    #[inline]
    pub fn accumulate(mut sum: u64, data: &[u8], odd: &mut bool) -> u64 {
        let mut d = data;
        if *odd && !d.is_empty() {
            sum += d[0] as u64;
            d = &d[1..];
            *odd = false;
        }
        let mut chunks = d.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            sum += (w >> 32) + (w & 0xffff_ffff);
        }
        let mut rest = chunks.remainder().chunks_exact(2);
        for c in &mut rest {
            sum += u16::from_be_bytes([c[0], c[1]]) as u64;
        }
        if let [b] = rest.remainder() {
            sum += (*b as u64) << 8;
            *odd = true;
        }
        sum
    }

    /// Folds a running sum to 16 bits (not complemented).
    #[inline]
    pub fn fold(mut sum: u64) -> u16 {
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// The checksum of one contiguous buffer.
    pub fn of(data: &[u8]) -> u16 {
        !fold(accumulate(0, data, &mut false))
    }
}

#[cfg(test)]
mod test {
    use super::checksum;

    #[test]
    fn checksum_known_ipv4_header() {
        // RFC 1071 style example: a valid IPv4 header sums to 0xffff.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum::of(&h), 0);
    }

    #[test]
    fn checksum_split_anywhere_equals_whole() {
        let data: Vec<u8> = (0..101u32).map(|i| (i * 31 + 7) as u8).collect();
        let whole = checksum::of(&data);
        for cut in 0..data.len() {
            let mut odd = false;
            let s = checksum::accumulate(0, &data[..cut], &mut odd);
            let s = checksum::accumulate(s, &data[cut..], &mut odd);
            assert_eq!(!checksum::fold(s), whole, "cut at {cut}");
        }
    }
}
