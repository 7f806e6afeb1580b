//! IPv6 fixed headers (extension headers are not walked: the switch needs only addresses,
//! the next header for ND and UDP, and the payload length).

use super::{Result, WireError, be16, checksum, put16};
use std::net::Ipv6Addr;

mod field {
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

pub const HEADER_LEN: usize = 40;
pub const NEXT_UDP: u8 = 17;
pub const NEXT_ICMPV6: u8 = 58;
pub const NEXT_FRAGMENT: u8 = 44;
pub const NEXT_HOP_BY_HOP: u8 = 0;

/// A view of an IPv6 packet.
pub struct Packet<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        let s = p.b.as_ref();
        if s.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if s[field::VER_TC_FLOW] >> 4 != 6 {
            return Err(WireError::BadVersion);
        }
        if s.len() < HEADER_LEN + p.payload_len() as usize {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }
    /// Checks only that the fixed header is there (a view of a frame's first bytes).
    pub fn header_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        let s = p.b.as_ref();
        if s.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if s[field::VER_TC_FLOW] >> 4 != 6 {
            return Err(WireError::BadVersion);
        }
        Ok(p)
    }

    pub fn payload_len(&self) -> u16 {
        be16(self.b.as_ref(), field::PAYLOAD_LEN)
    }
    /// The traffic class: DSCP and ECN.
    pub fn traffic_class(&self) -> u8 {
        (be16(self.b.as_ref(), field::VER_TC_FLOW) >> 4) as u8
    }
    /// What follows the fixed header in the buffer.
    pub fn rest(&self) -> &[u8] {
        &self.b.as_ref()[HEADER_LEN..]
    }
    pub fn next_header(&self) -> u8 {
        self.b.as_ref()[field::NEXT_HEADER]
    }
    pub fn hop_limit(&self) -> u8 {
        self.b.as_ref()[field::HOP_LIMIT]
    }
    pub fn src(&self) -> Ipv6Addr {
        addr(self.b.as_ref(), field::SRC)
    }
    pub fn dst(&self) -> Ipv6Addr {
        addr(self.b.as_ref(), field::DST)
    }
    /// The payload, bounded by the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.b.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }
}

/// Extension headers [`upper_layer`] walks through (RFC 8200 §4), and the two that end a
/// walk without an upper-layer header.
const HOP_BY_HOP: u8 = NEXT_HOP_BY_HOP;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = NEXT_FRAGMENT;
const ESP: u8 = 50;
const AH: u8 = 51;
const NO_NEXT: u8 = 59;
const DEST_OPTIONS: u8 = 60;
/// Extension headers walked before giving up (RFC 8200 allows each kind once, but one).
const MAX_EXTENSIONS: usize = 8;

/// Where an IPv6 packet's upper-layer header is, after its extension headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpperLayer {
    /// Protocol `proto` at `offset` in the payload (never past its end); `fragmented` when a
    /// fragment header came before it (the packet is a first fragment).
    At { proto: u8, offset: usize, fragmented: bool },
    /// A fragment after the first: its upper-layer header is in another packet.
    LaterFragment,
    /// ESP or no next header: nothing to look at.
    Opaque,
    /// The chain runs past the bytes there are (or past [`MAX_EXTENSIONS`]): a first
    /// fragment without its whole header chain, which RFC 7112 lets a device drop.
    Unknown,
}

/// Walks the extension headers of a payload whose first header is `next` (the IPv6
/// header's next header) to its upper-layer header.
pub fn upper_layer(payload: &[u8], mut next: u8) -> UpperLayer {
    let (mut at, mut fragmented) = (0usize, false);
    for _ in 0..MAX_EXTENSIONS {
        let len = match next {
            HOP_BY_HOP | ROUTING | DEST_OPTIONS => match payload.get(at + 1) {
                Some(l) => (*l as usize + 1) * 8,
                None => return UpperLayer::Unknown,
            },
            FRAGMENT => {
                let Some(f) = payload.get(at..at + 8) else { return UpperLayer::Unknown };
                if u16::from_be_bytes([f[2], f[3]]) & 0xfff8 != 0 {
                    return UpperLayer::LaterFragment;
                }
                fragmented = true;
                8
            }
            AH => match payload.get(at + 1) {
                Some(l) => (*l as usize + 2) * 4,
                None => return UpperLayer::Unknown,
            },
            ESP | NO_NEXT => return UpperLayer::Opaque,
            proto => return UpperLayer::At { proto, offset: at, fragmented },
        };
        let Some(&n) = payload.get(at) else { return UpperLayer::Unknown };
        (next, at) = (n, at + len);
        if at > payload.len() {
            return UpperLayer::Unknown;
        }
    }
    UpperLayer::Unknown
}

pub(crate) fn addr(b: &[u8], at: usize) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(a)
}

/// The fields of an IPv6 header the switch emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    pub hop_limit: u8,
    pub payload_len: u16,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src: p.src(),
            dst: p.dst(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            payload_len: p.payload_len(),
        }
    }
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
        put16(b, field::PAYLOAD_LEN, self.payload_len);
        b[field::NEXT_HEADER] = self.next_header;
        b[field::HOP_LIMIT] = self.hop_limit;
        b[field::SRC..field::SRC + 16].copy_from_slice(&self.src.octets());
        b[field::DST..field::DST + 16].copy_from_slice(&self.dst.octets());
    }
}

/// Running sum of the IPv6 pseudo-header (RFC 8200 §8.1) for an upper-layer checksum.
pub fn pseudo_header_sum(src: &Ipv6Addr, dst: &Ipv6Addr, next_header: u8, len: u32) -> u64 {
    let mut odd = false;
    let mut s = checksum::accumulate(0, &src.octets(), &mut odd);
    s = checksum::accumulate(s, &dst.octets(), &mut odd);
    s + (len >> 16) as u64 + (len & 0xffff) as u64 + next_header as u64
}

pub(crate) mod offsets {
    pub const PAYLOAD_LEN: usize = super::field::PAYLOAD_LEN;
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn extension_headers_are_walked_to_the_upper_layer() {
        // Hop-by-hop (8 bytes), destination options (16), then ICMPv6.
        let mut p = vec![60, 0, 0, 0, 0, 0, 0, 0, 58, 1];
        p.resize(24, 0);
        p.extend_from_slice(&[134, 0, 0, 0]);
        assert_eq!(
            upper_layer(&p, NEXT_HOP_BY_HOP),
            UpperLayer::At { proto: 58, offset: 24, fragmented: false }
        );
        // A first fragment (offset 0, more fragments), then UDP.
        let frag = [17, 0, 0, 1, 0, 0, 0, 7];
        assert_eq!(
            upper_layer(&frag, NEXT_FRAGMENT),
            UpperLayer::At { proto: 17, offset: 8, fragmented: true }
        );
        // A later fragment.
        assert_eq!(
            upper_layer(&[17, 0, 0, 8, 0, 0, 0, 7], NEXT_FRAGMENT),
            UpperLayer::LaterFragment
        );
        // A chain that runs out, one that never ends, ESP.
        assert_eq!(upper_layer(&p[..9], NEXT_HOP_BY_HOP), UpperLayer::Unknown);
        let endless: Vec<u8> = (0..16).flat_map(|_| [60u8, 0, 0, 0, 0, 0, 0, 0]).collect();
        assert_eq!(upper_layer(&endless, DEST_OPTIONS), UpperLayer::Unknown);
        assert_eq!(upper_layer(&p, ESP), UpperLayer::Opaque);
        assert_eq!(
            upper_layer(&p, NEXT_ICMPV6),
            UpperLayer::At { proto: 58, offset: 0, fragmented: false }
        );
    }

    #[test]
    fn round_trip_and_malformed() {
        let r = Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            next_header: NEXT_UDP,
            hop_limit: 64,
            payload_len: 4,
        };
        let mut b = [0u8; 44];
        r.emit(&mut b);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p), r);
        assert_eq!(p.payload().len(), 4);
        assert_eq!(Packet::new_checked(&b[..43]).err(), Some(WireError::Truncated));
        b[0] = 0x40;
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::BadVersion));
    }
}
