//! Ethernet II frames and 802.1Q / 802.1ad VLAN tags.

use super::{Field, Result, WireError, be16, put16};

/// A MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// The I/G bit of the first byte: set in group (multicast and broadcast) addresses.
    pub const GROUP_BIT: u8 = 0x01;
    /// The I/G bit in [`MacAddr::to_u64`]'s form (and in FDB keys, whose low 48 bits are
    /// the MAC).
    pub const GROUP_BIT_U64: u64 = (Self::GROUP_BIT as u64) << 40;

    pub fn from_bytes(b: &[u8]) -> MacAddr {
        let mut m = [0; 6];
        m.copy_from_slice(&b[..6]);
        MacAddr(m)
    }

    /// The IPv6 link-local address an interface with this MAC takes (`fe80::` and the
    /// modified EUI-64 of the MAC, RFC 4291 appendix A).
    pub fn link_local(&self) -> std::net::Ipv6Addr {
        let [a, b, c, d, e, f] = self.0;
        let word = |hi: u8, lo: u8| u16::from_be_bytes([hi, lo]);
        std::net::Ipv6Addr::new(
            0xfe80,
            0,
            0,
            0,
            word(a ^ 0x02, b),
            word(c, 0xff),
            word(0xfe, d),
            word(e, f),
        )
    }

    /// Group (multicast or broadcast) address: the I/G bit.
    #[inline(always)]
    pub fn is_group(&self) -> bool {
        self.0[0] & Self::GROUP_BIT != 0
    }

    /// The address as the low 48 bits of a `u64`.
    #[inline(always)]
    pub fn to_u64(self) -> u64 {
        let b = self.0;
        u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    pub fn from_u64(v: u64) -> MacAddr {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

impl std::fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl std::str::FromStr for MacAddr {
    type Err = WireError;
    fn from_str(s: &str) -> Result<MacAddr> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut m {
            let p = parts.next().ok_or(WireError::Truncated)?;
            if p.len() != 2 {
                return Err(WireError::BadLength);
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| WireError::BadLength)?;
        }
        if parts.next().is_some() {
            return Err(WireError::BadLength);
        }
        Ok(MacAddr(m))
    }
}

macro_rules! enum_with_unknown {
    ($(#[$m:meta])* pub enum $name:ident($ty:ty) { $($var:ident = $val:expr),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($var,)+ Unknown($ty) }
        impl From<$ty> for $name {
            fn from(v: $ty) -> Self { match v { $($val => $name::$var,)+ other => $name::Unknown(other) } }
        }
        impl From<$name> for $ty {
            fn from(v: $name) -> Self { match v { $($name::$var => $val,)+ $name::Unknown(o) => o } }
        }
    };
}

enum_with_unknown! {
    /// EtherType values the switch cares about; every other value round-trips as `Unknown`.
    pub enum EtherType(u16) {
        Ipv4 = 0x0800,
        Arp = 0x0806,
        Vlan = 0x8100,
        QinQ = 0x88a8,
        Ipv6 = 0x86dd,
    }
}

pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const VLAN: u16 = 0x8100;
    pub const QINQ: u16 = 0x88a8;
    /// Pre-standard 802.1ad TPID still seen on some equipment.
    pub const QINQ_OLD: u16 = 0x9100;
    pub const IPV6: u16 = 0x86dd;
}

/// Where the header's fields sit in a frame (the tag's, `TCI` and `INNER_TYPE`, in a tagged
/// one).
pub mod field {
    use super::Field;
    pub const DST: Field = 0..6;
    pub const SRC: Field = 6..12;
    pub const ETHERTYPE: usize = 12;
    pub const TCI: usize = 14;
    pub const INNER_TYPE: usize = 16;
}

/// Untagged Ethernet header length.
pub const HEADER_LEN: usize = 14;
/// Length of one VLAN tag.
pub const TAG_LEN: usize = 4;

/// The Ethernet header's length with one 802.1Q tag or none.
#[inline(always)]
pub const fn header_len(tagged: bool) -> usize {
    HEADER_LEN + if tagged { TAG_LEN } else { 0 }
}

/// Whether an EtherType value is a VLAN TPID (802.1Q, 802.1ad or the old 0x9100).
#[inline(always)]
pub fn is_tpid(t: u16) -> bool {
    t == ethertype::VLAN || t == ethertype::QINQ || t == ethertype::QINQ_OLD
}

/// A view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    pub fn new_unchecked(b: T) -> Frame<T> {
        Frame { b }
    }

    /// Checks the untagged header, and the tag when the outer EtherType is a TPID.
    pub fn new_checked(b: T) -> Result<Frame<T>> {
        let f = Frame { b };
        let len = f.b.as_ref().len();
        if len < HEADER_LEN || (f.is_tagged_raw() && len < HEADER_LEN + TAG_LEN) {
            return Err(WireError::Truncated);
        }
        Ok(f)
    }

    fn is_tagged_raw(&self) -> bool {
        let b = self.b.as_ref();
        b.len() >= HEADER_LEN && is_tpid(be16(b, field::ETHERTYPE))
    }

    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.b.as_ref()[field::DST])
    }

    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.b.as_ref()[field::SRC])
    }

    /// The outer EtherType (a TPID for tagged frames).
    pub fn ethertype(&self) -> u16 {
        be16(self.b.as_ref(), field::ETHERTYPE)
    }

    /// The outer tag as (TPID, TCI), if any.
    pub fn tag(&self) -> Option<(u16, u16)> {
        self.is_tagged_raw().then(|| (self.ethertype(), be16(self.b.as_ref(), field::TCI)))
    }

    /// The EtherType after the outer tag (if any).
    pub fn inner_ethertype(&self) -> u16 {
        if self.is_tagged_raw() {
            be16(self.b.as_ref(), field::INNER_TYPE)
        } else {
            self.ethertype()
        }
    }

    /// Length of the L2 header including the outer tag.
    pub fn header_len(&self) -> usize {
        if self.is_tagged_raw() { HEADER_LEN + TAG_LEN } else { HEADER_LEN }
    }

    pub fn payload(&self) -> &[u8] {
        &self.b.as_ref()[self.header_len()..]
    }

    /// The outer tag (if any), the EtherType after it and the payload, the tag looked at
    /// once (what a parser of the whole header wants).
    pub fn parts(&self) -> (Option<(u16, u16)>, u16, &[u8]) {
        let b = self.b.as_ref();
        let et = be16(b, field::ETHERTYPE);
        if is_tpid(et) {
            (
                Some((et, be16(b, field::TCI))),
                be16(b, field::INNER_TYPE),
                &b[HEADER_LEN + TAG_LEN..],
            )
        } else {
            (None, et, &b[HEADER_LEN..])
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    pub fn set_dst(&mut self, m: MacAddr) {
        self.b.as_mut()[field::DST].copy_from_slice(&m.0);
    }
    pub fn set_src(&mut self, m: MacAddr) {
        self.b.as_mut()[field::SRC].copy_from_slice(&m.0);
    }
    pub fn set_ethertype(&mut self, t: u16) {
        put16(self.b.as_mut(), field::ETHERTYPE, t);
    }
}

/// The fields of an Ethernet header with at most one tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub dst: MacAddr,
    pub src: MacAddr,
    /// (TPID, TCI) of the outer tag.
    pub tag: Option<(u16, u16)>,
    pub ethertype: u16,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Repr {
        Repr { dst: f.dst(), src: f.src(), tag: f.tag(), ethertype: f.inner_ethertype() }
    }

    pub fn header_len(&self) -> usize {
        if self.tag.is_some() { HEADER_LEN + TAG_LEN } else { HEADER_LEN }
    }

    /// Writes the header into the front of `b` (at least `header_len()` bytes).
    pub fn emit(&self, b: &mut [u8]) {
        b[field::DST].copy_from_slice(&self.dst.0);
        b[field::SRC].copy_from_slice(&self.src.0);
        match self.tag {
            Some((tpid, tci)) => {
                put16(b, field::ETHERTYPE, tpid);
                put16(b, field::TCI, tci);
                put16(b, field::INNER_TYPE, self.ethertype);
            }
            None => put16(b, field::ETHERTYPE, self.ethertype),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    static TAGGED: [u8; 22] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x81, 0x00, 0x20, 0x64, 0x08,
        0x06, 1, 2, 3, 4,
    ];

    #[test]
    fn deconstruct_tagged() {
        let f = Frame::new_checked(&TAGGED[..]).unwrap();
        assert!(f.dst().is_group());
        assert_eq!(f.src(), "02:00:00:00:00:01".parse().unwrap());
        assert_eq!(f.tag(), Some((0x8100, 0x2064)));
        assert_eq!(f.inner_ethertype(), ethertype::ARP);
        assert_eq!(f.payload(), &[1, 2, 3, 4]);
        assert_eq!(EtherType::from(f.inner_ethertype()), EtherType::Arp);
        assert_eq!(u16::from(EtherType::Unknown(0x1234)), 0x1234);
    }

    #[test]
    fn construct_round_trip() {
        let r = Repr::parse(&Frame::new_checked(&TAGGED[..]).unwrap());
        let mut out = [0u8; 18];
        r.emit(&mut out);
        assert_eq!(&out[..], &TAGGED[..18]);
    }

    #[test]
    fn truncated() {
        assert_eq!(Frame::new_checked(&TAGGED[..13]).unwrap_err(), WireError::Truncated);
        assert_eq!(Frame::new_checked(&TAGGED[..17]).unwrap_err(), WireError::Truncated);
    }

    #[test]
    fn mac_parse_errors() {
        assert!("02:00:00:00:00".parse::<MacAddr>().is_err());
        assert!("02:00:00:00:00:01:03".parse::<MacAddr>().is_err());
        assert!("zz:00:00:00:00:01".parse::<MacAddr>().is_err());
        assert_eq!(
            MacAddr::from_u64(MacAddr([1, 2, 3, 4, 5, 6]).to_u64()),
            MacAddr([1, 2, 3, 4, 5, 6])
        );
    }
}
