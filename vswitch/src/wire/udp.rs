//! UDP headers (RFC 768): the VXLAN transport and flow-hash ports.

use super::{Result, WireError, be16, put16};

pub const HEADER_LEN: usize = 8;

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

pub struct Packet<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the length field lies between 8 and the buffer length.
    pub fn new_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        let s = p.b.as_ref();
        if s.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let len = p.len() as usize;
        if len < HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if len > s.len() {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }
    /// Checks only that the header is there (a view of a frame's first bytes).
    pub fn header_checked(b: T) -> Result<Packet<T>> {
        let p = Packet { b };
        if p.b.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }
    /// What follows the header in the buffer.
    pub fn rest(&self) -> &[u8] {
        &self.b.as_ref()[HEADER_LEN..]
    }
    pub fn src_port(&self) -> u16 {
        be16(self.b.as_ref(), field::SRC_PORT)
    }
    pub fn dst_port(&self) -> u16 {
        be16(self.b.as_ref(), field::DST_PORT)
    }
    pub fn len(&self) -> u16 {
        be16(self.b.as_ref(), field::LENGTH)
    }
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }
    pub fn checksum(&self) -> u16 {
        be16(self.b.as_ref(), field::CHECKSUM)
    }
    pub fn payload(&self) -> &[u8] {
        &self.b.as_ref()[HEADER_LEN..self.len() as usize]
    }
}

/// Writes a UDP header with the given checksum field.
pub fn emit(b: &mut [u8], src_port: u16, dst_port: u16, len: u16, checksum: u16) {
    put16(b, field::SRC_PORT, src_port);
    put16(b, field::DST_PORT, dst_port);
    put16(b, field::LENGTH, len);
    put16(b, field::CHECKSUM, checksum);
}

pub(crate) mod offsets {
    pub const LENGTH: usize = super::field::LENGTH;
    pub const CHECKSUM: usize = super::field::CHECKSUM;
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn bounds() {
        let mut b = [0u8; 12];
        emit(&mut b, 1, 4789, 10, 0);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.payload().len()), (1, 4789, 2));
        emit(&mut b, 1, 4789, 7, 0);
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::BadLength));
        emit(&mut b, 1, 4789, 13, 0);
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::Truncated));
    }
}
