//! ARP for Ethernet and IPv4 (RFC 826): what ARP suppression and the ARP guard read.

use super::{Result, WireError, be16, ethernet::MacAddr, put16};
use std::net::Ipv4Addr;

mod field {
    pub const HTYPE: usize = 0;
    pub const PTYPE: usize = 2;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: usize = 6;
    pub const SHA: usize = 8;
    pub const SPA: usize = 14;
    pub const THA: usize = 18;
    pub const TPA: usize = 24;
}

pub const PACKET_LEN: usize = 28;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;

/// A view of an Ethernet/IPv4 ARP packet.
pub struct Packet<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks the length and that this is Ethernet/IPv4 ARP (other kinds are not parsed).
    pub fn new_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        let s = p.b.as_ref();
        if s.len() < PACKET_LEN {
            return Err(WireError::Truncated);
        }
        if be16(s, field::HTYPE) != 1
            || be16(s, field::PTYPE) != 0x0800
            || s[field::HLEN] != 6
            || s[field::PLEN] != 4
        {
            return Err(WireError::BadLength);
        }
        Ok(p)
    }

    pub fn op(&self) -> u16 {
        be16(self.b.as_ref(), field::OPER)
    }
    pub fn sha(&self) -> MacAddr {
        MacAddr::from_bytes(&self.b.as_ref()[field::SHA..])
    }
    pub fn spa(&self) -> Ipv4Addr {
        ip(&self.b.as_ref()[field::SPA..])
    }
    pub fn tha(&self) -> MacAddr {
        MacAddr::from_bytes(&self.b.as_ref()[field::THA..])
    }
    pub fn tpa(&self) -> Ipv4Addr {
        ip(&self.b.as_ref()[field::TPA..])
    }
}

fn ip(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Turns a request for `tpa` into the reply "tpa is at `mac`", in place.
    pub fn make_reply(&mut self, mac: MacAddr) {
        let (sha, spa, tpa) = (self.sha(), self.spa(), self.tpa());
        let b = self.b.as_mut();
        put16(b, field::OPER, OP_REPLY);
        b[field::SHA..field::SHA + 6].copy_from_slice(&mac.0);
        b[field::SPA..field::SPA + 4].copy_from_slice(&tpa.octets());
        b[field::THA..field::THA + 6].copy_from_slice(&sha.0);
        b[field::TPA..field::TPA + 4].copy_from_slice(&spa.octets());
    }
}

/// The fields of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub op: u16,
    pub sha: MacAddr,
    pub spa: Ipv4Addr,
    pub tha: MacAddr,
    pub tpa: Ipv4Addr,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr { op: p.op(), sha: p.sha(), spa: p.spa(), tha: p.tha(), tpa: p.tpa() }
    }

    pub fn emit(&self, b: &mut [u8]) {
        put16(b, field::HTYPE, 1);
        put16(b, field::PTYPE, 0x0800);
        b[field::HLEN] = 6;
        b[field::PLEN] = 4;
        put16(b, field::OPER, self.op);
        b[field::SHA..field::SHA + 6].copy_from_slice(&self.sha.0);
        b[field::SPA..field::SPA + 4].copy_from_slice(&self.spa.octets());
        b[field::THA..field::THA + 6].copy_from_slice(&self.tha.0);
        b[field::TPA..field::TPA + 4].copy_from_slice(&self.tpa.octets());
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn request() -> [u8; 28] {
        let mut b = [0u8; 28];
        Repr {
            op: OP_REQUEST,
            sha: MacAddr([2, 0, 0, 0, 0, 1]),
            spa: Ipv4Addr::new(10, 0, 0, 1),
            tha: MacAddr::default(),
            tpa: Ipv4Addr::new(10, 0, 0, 2),
        }
        .emit(&mut b);
        b
    }

    #[test]
    fn parse_emit_round_trip() {
        let b = request();
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap());
        assert_eq!(r.op, OP_REQUEST);
        assert_eq!(r.tpa, Ipv4Addr::new(10, 0, 0, 2));
    }

    #[test]
    fn reply_in_place() {
        let mut b = request();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.make_reply(MacAddr([2, 0, 0, 0, 0, 2]));
        let r = Repr::parse(&p);
        assert_eq!(r.op, OP_REPLY);
        assert_eq!(r.sha, MacAddr([2, 0, 0, 0, 0, 2]));
        assert_eq!(r.spa, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(r.tha, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(r.tpa, Ipv4Addr::new(10, 0, 0, 1));
    }

    #[test]
    fn bad_kinds() {
        let b = request();
        assert_eq!(Packet::new_checked(&b[..27]).err(), Some(WireError::Truncated));
        let mut c = b;
        c[5] = 16;
        assert_eq!(Packet::new_checked(&c[..]).err(), Some(WireError::BadLength));
    }
}
