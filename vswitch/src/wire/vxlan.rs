//! VXLAN headers (RFC 7348 §5): 8 bytes, the I flag and a 24-bit VNI.

use super::{Result, WireError, be32};

pub const HEADER_LEN: usize = 8;
/// The "valid VNI" flag.
pub const FLAG_I: u8 = 0x08;
/// IANA's UDP port for VXLAN.
pub const DEFAULT_PORT: u16 = 4789;

pub struct Header<T: AsRef<[u8]>> {
    b: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Checks the length and the I flag (other flag bits are reserved and ignored on receipt).
    pub fn new_checked(b: T) -> Result<Header<T>> {
        let h = Header { b };
        if h.b.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if h.b.as_ref()[0] & FLAG_I == 0 {
            return Err(WireError::BadFlags);
        }
        Ok(h)
    }
    pub fn vni(&self) -> u32 {
        be32(self.b.as_ref(), 4) >> 8
    }
}

/// Writes a VXLAN header with the I flag and `vni`.
pub fn emit(b: &mut [u8], vni: u32) {
    b[..8].copy_from_slice(&[FLAG_I, 0, 0, 0, (vni >> 16) as u8, (vni >> 8) as u8, vni as u8, 0]);
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn round_trip_and_flags() {
        let mut b = [0u8; 8];
        emit(&mut b, 0xabcdef);
        assert_eq!(Header::new_checked(&b[..]).unwrap().vni(), 0xabcdef);
        b[0] = 0;
        assert_eq!(Header::new_checked(&b[..]).err(), Some(WireError::BadFlags));
        assert_eq!(Header::new_checked(&b[..7]).err(), Some(WireError::Truncated));
    }
}
