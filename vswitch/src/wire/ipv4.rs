//! IPv4 headers: the source address for port security and flow hashing, and the VXLAN outer
//! header.

use super::{Result, WireError, be16, checksum, put16};
use std::net::Ipv4Addr;

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

pub const HEADER_LEN: usize = 20;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_TCP: u8 = 6;
/// Don't-fragment flag in the flags/fragment-offset field.
pub const DF: u16 = 0x4000;

/// A view of an IPv4 packet.
pub struct Packet<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_unchecked(b: T) -> Packet<T> {
        Packet { b }
    }

    /// Checks version, IHL and total length against each other and the buffer.
    pub fn new_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        let s = p.b.as_ref();
        if s.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if s[field::VER_IHL] >> 4 != 4 {
            return Err(WireError::BadVersion);
        }
        let ihl = p.header_len();
        let total = p.total_len() as usize;
        if ihl < HEADER_LEN || total < ihl {
            return Err(WireError::BadLength);
        }
        if s.len() < total {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }

    /// Checks only that the header is there (version, IHL, the bytes it spans): a view of a
    /// frame's first bytes, whose payload may be cut off (a packet trace's).
    pub fn header_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        let s = p.b.as_ref();
        if s.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if s[field::VER_IHL] >> 4 != 4 {
            return Err(WireError::BadVersion);
        }
        if p.header_len() < HEADER_LEN || s.len() < p.header_len() {
            return Err(WireError::BadLength);
        }
        Ok(p)
    }

    pub fn header_len(&self) -> usize {
        ((self.b.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }
    /// The type-of-service byte: DSCP and ECN.
    pub fn tos(&self) -> u8 {
        self.b.as_ref()[field::TOS]
    }
    /// What follows the header in the buffer (the payload, or its first bytes).
    pub fn rest(&self) -> &[u8] {
        &self.b.as_ref()[self.header_len()..]
    }
    pub fn total_len(&self) -> u16 {
        be16(self.b.as_ref(), field::TOTAL_LEN)
    }
    pub fn protocol(&self) -> u8 {
        self.b.as_ref()[field::PROTOCOL]
    }
    pub fn ttl(&self) -> u8 {
        self.b.as_ref()[field::TTL]
    }
    pub fn flags_frag(&self) -> u16 {
        be16(self.b.as_ref(), field::FLAGS_FRAG)
    }
    pub fn src(&self) -> Ipv4Addr {
        addr(self.b.as_ref(), field::SRC)
    }
    pub fn dst(&self) -> Ipv4Addr {
        addr(self.b.as_ref(), field::DST)
    }
    /// Whether the header checksum verifies.
    pub fn checksum_ok(&self) -> bool {
        checksum::of(&self.b.as_ref()[..self.header_len()]) == 0
    }
    /// The payload, bounded by the total length (never Ethernet padding).
    pub fn payload(&self) -> &[u8] {
        &self.b.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

#[inline(always)]
pub(crate) fn addr(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

/// The fields of a 20-byte IPv4 header the switch emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub ttl: u8,
    pub payload_len: u16,
    pub dont_fragment: bool,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            ttl: p.ttl(),
            payload_len: p.total_len() - p.header_len() as u16,
            dont_fragment: p.flags_frag() & DF != 0,
        }
    }

    /// Writes a 20-byte header with identification 0 and a correct checksum.
    pub fn emit(&self, b: &mut [u8]) {
        b[field::VER_IHL] = 0x45;
        b[1] = 0;
        put16(b, field::TOTAL_LEN, self.payload_len + HEADER_LEN as u16);
        put16(b, field::IDENT, 0);
        put16(b, field::FLAGS_FRAG, if self.dont_fragment { DF } else { 0 });
        b[field::TTL] = self.ttl;
        b[field::PROTOCOL] = self.protocol;
        put16(b, field::CHECKSUM, 0);
        b[field::SRC..field::SRC + 4].copy_from_slice(&self.src.octets());
        b[field::DST..field::DST + 4].copy_from_slice(&self.dst.octets());
        let c = checksum::of(&b[..HEADER_LEN]);
        put16(b, field::CHECKSUM, c);
    }
}

/// Offsets used by the encapsulation fast path to patch a template.
pub(crate) mod offsets {
    pub const TOTAL_LEN: usize = super::field::TOTAL_LEN;
    pub const CHECKSUM: usize = super::field::CHECKSUM;
}

#[cfg(test)]
mod test {
    use super::*;

    fn repr() -> Repr {
        Repr {
            src: Ipv4Addr::new(192, 0, 2, 1),
            dst: Ipv4Addr::new(192, 0, 2, 2),
            protocol: PROTO_UDP,
            ttl: 64,
            payload_len: 8,
            dont_fragment: true,
        }
    }

    #[test]
    fn emit_parse_round_trip() {
        let mut b = [0u8; 30]; // 28 bytes + 2 of Ethernet padding
        repr().emit(&mut b);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.checksum_ok());
        assert_eq!(Repr::parse(&p), repr());
        assert_eq!(p.payload().len(), 8, "padding excluded");
    }

    #[test]
    fn malformed() {
        let mut b = [0u8; 28];
        repr().emit(&mut b);
        assert_eq!(Packet::new_checked(&b[..19]).err(), Some(WireError::Truncated));
        let mut v = b;
        v[0] = 0x65;
        assert_eq!(Packet::new_checked(&v[..]).err(), Some(WireError::BadVersion));
        let mut s = b;
        s[0] = 0x44;
        assert_eq!(Packet::new_checked(&s[..]).err(), Some(WireError::BadLength));
        let mut t = b;
        put16(&mut t, 2, 100);
        assert_eq!(Packet::new_checked(&t[..]).err(), Some(WireError::Truncated));
        let mut c = b;
        c[12] ^= 1;
        assert!(!Packet::new_checked(&c[..]).unwrap().checksum_ok());
    }
}
